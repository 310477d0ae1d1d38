"""Subprocess worker of tests/test_crash_kill.py: run injections in forked children and kill them.

``python crash_worker.py SPEC.json`` — SPEC holds ``file`` (the original checkpoint), ``root`` (a folder the
worker fills with one sub-folder per trial) and ``trials``, each ``{"mode", "sig", "how", "at"}``:

- ``mode``: ``copy`` (``inject -o``), ``regions`` (``inject -o --evidence regions``), ``inplace`` (``inject --in-place``), ``direct`` (``inject --in-place
  --direct``: region evidence, the CLI's default for --direct) or ``nonatomic`` (``inject_file(...,
  in_place=True, atomic=False)`` with whole-file hashes); ``revert`` (``revert LOG FILE`` of a direct
  injection the worker makes, uninterrupted, before the fork);
- ``how`` and ``at``: ``delay`` (the child is killed ``at`` seconds after it starts, drawn by the test from a
  seeded generator and scaled here by the duration of one uninterrupted injection of that mode); ``replace``
  (the child sends ``sig`` to itself just before its ``at``-th ``os.replace``/``os.rename``, or just after the
  ``-at``-th when ``at`` is negative); ``fsync`` (the same around its ``at``-th ``os.fsync``); ``writes`` (just
  after the first ``at`` writes into the file: the words the native kernel writes, then the byte patches such as
  zip CRC fields and re-encoded chunks, or a revert's byte ranges; a deferred signal lets the rest be written).
  ``at`` may be ``"all"``: one trial per point of that kind (``replace``/``fsync``: before and after each call;
  ``writes``: after 0, 1, half, all but one and all of the writes), ``"ends"`` (before the first call, after the
  last) or ``"some"`` (writes: after none, half and all), counted in an uninterrupted run of the mode.

The original may be a checkpoint directory (copied as a tree; ``os.rename``, which commits a directory, counts
as a rename too). fastflip is imported once (every mode run once before the forks); every trial forks, so a
trial costs one injection, not an interpreter start. Prints one JSON line per trial: the trial as run (its
``dir``, ``at`` resolved, ``points``: how many points of its kind the mode has) and how the child ended.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import sys
import time

import numpy as np

from format_builders import copy_checkpoint

COUNT = 40  # flips per injection
_DEFERRED = {signal.SIGINT, signal.SIGTERM}


def _inject(mode: str, src: str, out: str) -> int:
    from fastflip.cli import main

    if mode == "revert":  # of the direct injection the parent made before the fork (warm: made here)
        if not glob.glob(src + "*.fflog"):
            _inject("direct", src, out)
        return main(["revert", *glob.glob(src + "*.fflog"), src, "-q"])
    if mode == "nonatomic":
        from fastflip import Sampling
        from fastflip.files.inject import inject_file

        inject_file(src, in_place=True, atomic=False, sampling=Sampling(count=COUNT), seed=7)
        return 0
    where = {"inplace": ["--in-place"], "direct": ["--in-place", "--direct"],
             "regions": ["-o", out, "--evidence", "regions"]}.get(mode, ["-o", out])
    return main(["inject", src, *where, "--count", str(COUNT), "--seed", "7", "-q"])


def _around(real, at: int, sig: int, calls: list[int]):  # noqa: ANN001, ANN202
    """``real`` wrapped: ``sig`` sent to this process just before its ``at``-th call (after the ``-at``-th)."""

    def wrapped(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), sig)
        res = real(*a, **kw)
        if calls[0] == -at:
            os.kill(os.getpid(), sig)
        return res

    return wrapped


def _split(real, at: int, sig: int, calls: list[int], count, cut):  # noqa: ANN001, ANN202
    """``real`` (a writer of ``count(args)`` units) wrapped: ``sig`` sent just after the ``at``-th unit of all
    the wrapped writers together; ``cut(args, kwargs, s)`` gives the arguments that write the units ``s``."""

    def wrapped(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        n, start = count(a), calls[0]
        calls[0] += n
        if not (start < at <= start + n or at == start == 0):  # the point is not in this call
            return real(*a, **kw)
        a1, kw1 = cut(a, kw, slice(0, at - start))
        first = real(*a1, **kw1)
        os.kill(os.getpid(), sig)  # SIGKILL: the first units are in the file, no more
        a2, kw2 = cut(a, kw, slice(at - start, n))
        rest = real(*a2, **kw2)
        return first if rest is None else tuple(np.concatenate([x, y]) for x, y in zip(first, rest))

    return wrapped


def _writes_hook(at: int, sig: int, calls: list[int]) -> None:
    """Send ``sig`` just after the first ``at`` writes into the file: the words the native kernel writes (through
    a shared mapping), then the byte patches (zip CRC fields, re-encoded chunks) written with ``write_patches``;
    in a revert, the byte ranges its undo writes back."""
    from fastflip.files import inplace
    from fastflip.files.filebytes import ByteUndo
    from fastflip.kernels import dispatch

    def words(a: tuple, kw: dict, s: slice) -> tuple[tuple, dict]:  # buf, offsets, itemsize, swap, and, or, xor
        scale = kw.get("scale")
        return (a[0], a[1][s], a[2], a[3], a[4][s], a[5][s], a[6][s], *a[7:]), {
            **kw, "scale": None if scale is None else scale[s]}

    dispatch.apply_at_offsets = _split(dispatch.apply_at_offsets, at, sig, calls, lambda a: len(a[1]), words)
    inplace.write_patches = _split(inplace.write_patches, at, sig, calls, lambda a: len(a[1]),
                                   lambda a, kw, s: ((a[0], a[1][s]), kw))

    def ranges(a: tuple, kw: dict, s: slice) -> tuple[tuple, dict]:  # a revert's ranges: undo, path, data, ...
        u, took = a[0], np.minimum(a[0].lengths, np.maximum(a[3] - a[0].offsets, 0))
        part = dataclasses.replace(u, offsets=u.offsets[s], lengths=u.lengths[s])
        return (part, a[1], a[2][int(took[: s.start].sum()) : int(took[: s.stop].sum())], *a[3:]), kw

    ByteUndo._write = _split(ByteUndo._write, at, sig, calls, lambda a: len(a[0].offsets), ranges)


def _hook(how: str, at: int, sig: int) -> list[int]:
    """Install the trial's kill point (``sig`` 0: only count the calls); return the counter."""
    calls = [0]
    if how == "replace":
        os.replace, os.rename = _around(os.replace, at, sig, calls), _around(os.rename, at, sig, calls)
    elif how == "fsync":
        os.fsync = _around(os.fsync, at, sig, calls)
    elif how == "writes":
        _writes_hook(at, sig, calls)
    return calls


def _child(trial: dict, src: str, out: str, report: str | None) -> None:
    code = 1
    null = os.open(os.devnull, os.O_WRONLY)  # the parent's stdout carries the trial results only
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED)  # a signal sent meanwhile arrives now
        counters = {}
        if trial["how"] in ("replace", "fsync", "writes"):
            counters[trial["how"]] = _hook(trial["how"], trial["at"], trial["sig"])
        elif report:  # an uninterrupted run that counts its points
            counters = {how: _hook(how, 0, 0) for how in ("replace", "fsync", "writes")}
        code = _inject(trial["mode"], src, out) or 0
        if report:
            with open(report, "w") as fh:
                json.dump({k: v[0] for k, v in counters.items()}, fh)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - reported through the exit status
        code = 3
    finally:
        os._exit(code)


def _run(trial: dict, original: str, ext: str, unit: float, report: str | None = None) -> tuple[int, float]:
    src = os.path.join(trial["dir"], "in" + ext)
    copy_checkpoint(original, src)
    if trial["mode"] == "revert":
        assert _inject("direct", src, "") == 0
    sys.stdout.flush()
    t0 = time.perf_counter()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)  # held in the child until its handlers are set
    pid = os.fork()
    if pid == 0:
        _child(trial, src, os.path.join(trial["dir"], "out" + ext), report)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if trial["how"] == "delay":
        time.sleep(trial["at"] * unit)
        try:
            os.kill(pid, trial["sig"])
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return status, time.perf_counter() - t0


def _points(how: str, n: int, which: str) -> list[int]:
    """The kill points ``which`` (``all``, ``ends``: the first and the last, ``some``) of a kind whose
    uninterrupted run makes ``n`` calls (``writes``: ``n`` writes)."""
    if how == "writes":
        return sorted({0, n // 2, n} | ({1, n - 1} if which == "all" else set()))
    return [1, -n] if which == "ends" else [k for i in range(1, n + 1) for k in (i, -i)]


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    ext = os.path.splitext(spec["file"])[1]
    root = spec["root"]
    os.makedirs(root)
    modes = sorted({t["mode"] for t in spec["trials"]})
    for mode in modes:  # everything an injection imports, imported here once, before the forks
        warm = os.path.join(root, "warm-" + mode)
        os.makedirs(warm)
        copy_checkpoint(spec["file"], os.path.join(warm, "in" + ext))
        _inject(mode, os.path.join(warm, "in" + ext), os.path.join(warm, "out" + ext))
    unit, counts = {}, {}
    for mode in modes:  # per mode: the duration of one uninterrupted injection, in a child like the trials
        for k in range(2):
            calib = os.path.join(root, f"calibrate-{mode}{k}")
            os.makedirs(calib)
            report = os.path.join(calib, "counts.json")
            status, took = _run({"dir": calib, "mode": mode, "how": "none"}, spec["file"], ext, 0, report)
            assert status == 0, f"an uninterrupted {mode} injection failed (status {status})"
            unit[mode] = max(unit.get(mode, 0.0), took)
            with open(report) as fh:
                counts[mode] = json.load(fh)
    trials = []
    for t in spec["trials"]:
        n = counts[t["mode"]].get(t["how"], 0)
        for at in _points(t["how"], n, t["at"]) if isinstance(t["at"], str) else [t["at"]]:
            trials.append({**t, "at": at, "points": n})
    for i, trial in enumerate(trials):
        trial["dir"] = os.path.join(root, f"t{i}")
        os.makedirs(trial["dir"])
        status, _ = _run(trial, spec["file"], ext, unit[trial["mode"]])
        print(json.dumps({"trial": trial, "status": status, "unit": unit[trial["mode"]]}), flush=True)


if __name__ == "__main__":
    main()
