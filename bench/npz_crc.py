"""The cost of checking the CRC-32 of the ``.npz`` members an inject flips: 10 flips into a 100 MB ``np.savez`` file.

For each write path (copy, atomic in place, direct in place, each with region evidence where it applies) the same
10-flip injects run with the check and with it switched off (``fastflip.files.inject.member_check``
replaced by a no-op), interleaved round by round in one process; the medians of wall and CPU time (user + sys,
``time.process_time``) are printed side by side, with the bytes the check reads (the touched members) and the time of
the check alone. Two files: one member of 100 MB (every flip lands in it: the check reads the whole file) and ten
members of 10 MB::

    python bench/npz_crc.py --rounds 7 --dir /tmp/npzcrc
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import fastflip.files.inject as inject_mod
from fastflip.files.formats.zipcrc import MemberCrcs
from fastflip.files.h5apply import route_sites
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from fastflip.files.formats.zipraw import stored_entries

MODES = {
    "copy": dict(in_place=False),
    "copy, region evidence": dict(in_place=False, hash_files="regions"),
    "in place (atomic)": dict(in_place=True),
    "in place, direct": dict(in_place=True, atomic=False),
    "in place, direct, region evidence": dict(in_place=True, atomic=False, hash_files="regions"),
}


def _make(path: str, members: int) -> None:
    n = 25_000_000 // members  # float32: 100 MB in all
    rng = np.random.default_rng(0)
    np.savez(path, **{f"w{i}": rng.standard_normal(n, dtype=np.float32) for i in range(members)})


def _touched_bytes(path: str, seed: int) -> tuple[int, float]:
    """(bytes of the members a 10-flip plan touches, seconds of MemberCrcs.holding(...).check() on them)."""
    res = inject_file(path, path + ".probe", count=10, seed=seed, log_path=False, hash_files=False)
    os.remove(path + ".probe")
    lay = read_layout(path)
    by_name = {t.path: t for t in lay.tensors}
    offs = np.concatenate([r.offsets for r in route_sites(path, res.log.plan, by_name)])
    entries = sorted((e for e in stored_entries(path).values()), key=lambda e: e.offset)
    starts = np.array([e.offset for e in entries])
    which = np.unique(np.searchsorted(starts, offs, side="right") - 1)
    t0 = time.perf_counter()
    MemberCrcs.holding(path, offs).check()
    return sum(entries[i].size for i in which), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default="/tmp/npzcrc")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    checked = inject_mod.member_check
    for members in (1, 10):
        src = os.path.join(a.dir, f"m{members}.npz")
        if not os.path.exists(src):
            _make(src, members)
        nbytes, alone = _touched_bytes(src, 1)
        print(f"\n{members} member(s), {os.path.getsize(src) / 1e6:.0f} MB; 10 flips touch {nbytes / 1e6:.0f} MB of "
              f"members; the check alone {alone * 1e3:.0f} ms")
        for mode, kw in MODES.items():
            times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for r in range(a.rounds):
                for on in (True, False):
                    inject_mod.member_check = checked if on else (lambda path, *args: MemberCrcs(path, []))
                    out = None if kw.get("in_place") else os.path.join(a.dir, "out.npz")
                    c0, w0 = time.process_time(), time.perf_counter()
                    inject_file(src, out, count=10, seed=100 + r, log_path=os.path.join(a.dir, "run.fflog"),
                                durable=False, **kw)
                    times[on].append((time.perf_counter() - w0, time.process_time() - c0))
            inject_mod.member_check = checked
            med = {on: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
                   for on, v in times.items()}
            print(f"  {mode:36s} wall {med[False][0] * 1e3:7.0f} -> {med[True][0] * 1e3:7.0f} ms   "
                  f"cpu {med[False][1] * 1e3:7.0f} -> {med[True][1] * 1e3:7.0f} ms  (unchecked -> checked)")


if __name__ == "__main__":
    main()
