"""Direct in-place injection with region evidence: the cost follows the flips, revert still refuses another file.

What a region-evidence log verifies at revert (docs/log-format.md): the file's size, the hash of its head and tail
windows, and the bytes of every touched range (old and new). What it does not: a change elsewhere in the file;
``--verify-file`` (whole-file hashes) covers that, and both sides are tested here.

The injected and reverted files are judged by the frameworks' own loaders (h5py, safetensors, ``np.load``,
``torch.load``), against changes worked out from the log alone (:mod:`framework_judge`).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from format_builders import EXTENSION, write_checkpoint
from framework_judge import apply_logged, assert_judged, copy_reading, logical_words
from framework_views import h5_view, np_view, st_numpy_view, torch_view
from fastflip import Sampling
from fastflip.cli import main
from fastflip.errors import LogMismatchError
from fastflip.files import hashing
from fastflip.files.fingerprint import WINDOW
from fastflip.files.inject import inject_file
from fastflip.files.revert import revert
from fastflip.files.log import InjectionLog

SMP = Sampling(count=10)
N = 1 << 20  # 4 MiB of float32: the middle lies outside both 1 MiB windows


def _noise():
    return (np.random.default_rng(0).standard_normal((256, 256)) * 0.05).astype("<f4")


def _h5(path, chunked=False):
    with h5py.File(path, "w") as f:
        f.create_dataset("w", data=np.linspace(-3, 3, N, dtype="f4"))
        if chunked:
            f.create_dataset("g", data=_noise(), chunks=(64, 64), compression="gzip")
    return str(path)


def _make(fmt, d):
    if fmt == "hdf5":
        return _h5(d / "m.h5")
    if fmt == "hdf5-gzip":
        return write_checkpoint("hdf5", d / "m.h5", {"g": _noise()}, chunks=(64, 64), compression="gzip")
    w = {"w": np.linspace(-3, 3, 4096, dtype="f4")}
    return write_checkpoint(fmt, d / f"m.{EXTENSION[fmt]}", w, compressed=True)


VIEWS = {"hdf5": h5_view, "hdf5-gzip": h5_view, "safetensors": st_numpy_view, "npz": np_view, "torch": torch_view}


def _bytes(p):
    with open(p, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("fmt", ["hdf5", "hdf5-gzip", "safetensors", "npz", "torch"])
def test_direct_inject_and_revert_by_regions(fmt, tmp_path):
    src = _make(fmt, tmp_path)
    orig = _bytes(src)
    view = VIEWS[fmt]
    expect = view(src)  # read into memory before the file changes
    res = inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=3, sampling=SMP)
    log = InjectionLog.load(res.log_path)  # the log as written
    m = log.manifest
    assert m["evidence"] == "regions" and m["input"]["hash"] is None and m["output"]["hash"] is None
    assert m["fingerprint"]["input"]["size"] == len(orig) and m["undo"]["ranges"] >= 1
    assert_judged(expect, view(src), log)
    r = revert(res.log_path, src)
    assert r.evidence == "regions" and r.verified and _bytes(src) == orig


def _write_ranges(path, undo, which):
    """Write, for each touched range whose position is in ``which``, its logged old bytes back (a run killed part
    way through its writes)."""
    pos = 0
    with open(path, "r+b") as fh:
        for i, (off, ln) in enumerate(zip(undo.offsets.tolist(), undo.lengths.tolist())):
            if i in which:
                fh.seek(off)
                fh.write(undo.data[pos : pos + ln])
            pos += ln


@pytest.mark.parametrize("fmt", ["hdf5", "safetensors", "npz"])
def test_revert_of_a_run_killed_while_it_wrote(fmt, tmp_path):
    """A ``kill -9`` during a direct run's writes leaves some touched ranges new and some old: the log still reverts
    the file to its original bytes; a byte that is neither the logged old nor new value is refused, unchanged."""
    src = _make(fmt, tmp_path)
    orig = _bytes(src)
    view = VIEWS[fmt]
    reading = view(src)
    res = inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=3,
                      sampling=Sampling(count=12, bits="mantissa"))
    undo = InjectionLog.load(res.log_path).undo
    assert len(undo.offsets) >= 2
    _write_ranges(src, undo, set(range(0, len(undo.offsets), 2)))  # every other range back to its old bytes
    torn = _bytes(src)
    assert torn != orig
    if fmt != "npz":  # a torn archive's entry CRCs match neither state: np.load refuses it (checked data)
        _each_site_old_or_new(reading, view(src), res.log)
    bad = bytearray(torn)
    off = int(undo.offsets[0])
    bad[off] = next(v for v in range(256) if v not in (undo.data[0], undo.new_data[0]))  # neither old nor new
    Path(src).write_bytes(bytes(bad))
    with pytest.raises(LogMismatchError):
        revert(res.log_path, src)
    assert _bytes(src) == bytes(bad)
    Path(src).write_bytes(torn)
    r = revert(res.log_path, src)
    assert r.evidence == "regions" and _bytes(src) == orig


def _each_site_old_or_new(reading, torn, log):
    """The framework reads every element of a torn file as its original word, or (a logged site) its logged new
    word; some sites each way."""
    new = copy_reading(reading)
    assert not apply_logged(new, log)
    was_old = was_new = 0
    for name in reading:
        o, n, t = logical_words(reading[name]), logical_words(new[name]), logical_words(torn[name])
        assert np.all((t == o) | (t == n)), name
        moved = o != n
        was_old += int(np.count_nonzero(moved & (t == o)))
        was_new += int(np.count_nonzero(moved & (t == n)))
    assert was_old and was_new


def test_direct_inject_hashes_only_the_windows(tmp_path, monkeypatch):
    """No whole-file pass: the bytes hashed are the two windows (twice each: before and after), not the file."""
    src = _h5(tmp_path / "m.h5")
    seen = []
    real = hashing.new

    class Counting:
        def __init__(self, h):
            self.h = h

        def update(self, b):
            seen.append(len(b))
            self.h.update(b)

        def hexdigest(self):
            return self.h.hexdigest()

    monkeypatch.setattr(hashing, "new", lambda name=None: Counting(real(name)))
    inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=1, sampling=SMP)
    assert 0 < sum(seen) <= 4 * WINDOW < os.path.getsize(src)
    seen.clear()
    inject_file(src, in_place=True, atomic=False, hash_files=True, seed=2, sampling=SMP)
    assert sum(seen) >= 2 * os.path.getsize(src)  # --verify-file: the whole file, before and after


def test_revert_refuses_another_file(tmp_path):
    src = _h5(tmp_path / "m.h5")
    res = inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=5, sampling=SMP)
    lg = res.log
    injected = _bytes(src)

    def tampered(edit, why):
        with open(src, "r+b") as fh:
            edit(fh)
        changed = _bytes(src)
        with pytest.raises(LogMismatchError, match=why):
            revert(res.log_path, src)
        assert _bytes(src) == changed  # nothing was changed
        with open(src, "wb") as fh:
            fh.write(injected)

    starts = np.concatenate([[0], np.cumsum(lg.undo.lengths)])  # each range's place in the old bytes
    k = next(i for i, o in enumerate(lg.undo.offsets.tolist()) if WINDOW < o < len(injected) - WINDOW)
    old, new = lg.undo.data[int(starts[k])], lg.undo.new_data[int(starts[k])]
    other = bytes([next(v for v in range(256) if v not in (old, new))])  # neither its old nor its new value
    tampered(lambda fh: (fh.seek(int(lg.undo.offsets[k])), fh.write(other)), "bytes of a touched range differ")
    tampered(lambda fh: (fh.seek(0, 2), fh.write(b"\0")), "size")
    tampered(lambda fh: (fh.seek(3), fh.write(b"\x99")), "head/tail fingerprint differs")
    size = len(injected)
    tampered(lambda fh: (fh.seek(size - 5), fh.write(b"\x99")), "head/tail fingerprint differs")


def test_what_region_evidence_does_not_see_and_verify_file_does(tmp_path):
    src = _h5(tmp_path / "m.h5")
    res = inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=7, sampling=SMP)
    mid = os.path.getsize(src) // 2
    touched = [(int(o), int(o + n)) for o, n in zip(res.log.undo.offsets, res.log.undo.lengths)]
    mid = next(x for x in range(mid, mid + 4096) if not any(a <= x < b for a, b in touched))
    with open(src, "r+b") as fh:  # a byte in the middle, outside both windows and every touched range
        fh.seek(mid)
        b = fh.read(1)
        fh.seek(mid)
        fh.write(bytes([b[0] ^ 1]))
    revert(res.log_path, src)  # documented: not seen by region evidence
    with open(src, "rb") as fh:
        fh.seek(mid)
        assert fh.read(1) != b
    res2 = inject_file(src, in_place=True, atomic=False, hash_files=True, seed=7, sampling=SMP)
    with open(src, "r+b") as fh:
        fh.seek(mid)
        fh.write(b)
    with pytest.raises(LogMismatchError, match="differs"):
        revert(res2.log_path, src)


def test_hash_files_values(tmp_path):
    from fastflip.errors import OptionError

    with pytest.raises(OptionError, match="hash_files must be True, False or 'regions'"):
        inject_file(_h5(tmp_path / "m.h5"), in_place=True, atomic=False, hash_files="region", seed=1, sampling=SMP)


def test_damaged_fingerprint_is_one_line(tmp_path):
    from fastflip.files.logcheck import validate_log

    src = _h5(tmp_path / "m.h5")
    res = inject_file(src, in_place=True, atomic=False, hash_files="regions", seed=1, sampling=SMP)
    m = dict(res.log.manifest, fingerprint={"algorithm": "sha256", "input": {"size": 1}, "output": {}})
    with pytest.raises(LogMismatchError, match="damaged log: fingerprint.input.head_len"):
        validate_log("x.fflog", m, res.log.columns())


def test_cli_direct(tmp_path, capsys):
    src = _h5(tmp_path / "m.h5", chunked=True)
    orig = _bytes(src)
    expect = h5_view(src)
    assert main(["inject", src, "--in-place", "--direct", "--count", "10", "--seed", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert_judged(expect, h5_view(src), InjectionLog.load(src + ".fflog"))
    assert main(["revert", src + ".fflog", src]) == 0
    assert "touched byte ranges, size and head/tail fingerprint" in capsys.readouterr().out and _bytes(src) == orig
    assert main(["inject", src, "--in-place", "--direct", "--verify-file", "--count", "10", "--seed", "2"]) == 0
    m = InjectionLog.load(src + ".2.fflog").manifest
    assert m["input"]["hash"] and "fingerprint" not in m
    assert main(["revert", src + ".2.fflog", src]) == 0 and _bytes(src) == orig
    capsys.readouterr()
    assert main(["inject", src, "--direct", "-o", str(tmp_path / "o.h5"), "--count", "1"]) == 2
    assert "add --in-place" in capsys.readouterr().err
    assert main(["inject", src, "-o", str(tmp_path / "o.h5"), "--verify-file", "--count", "1"]) == 2
    cfg = tmp_path / "c.yaml"
    cfg.write_text("injection_type: count\ninjection_tries: 1\n")
    capsys.readouterr()
    assert main(["inject", src, "--in-place", "--direct", "--config", str(cfg)]) == 2
    assert "do not go with --config" in capsys.readouterr().err
