"""Subprocess worker of tests/test_crash_kill.py: run injections in forked children and kill them.

``python crash_worker.py SPEC.json`` — SPEC holds ``file`` (the original checkpoint) and ``trials``, each
``{"dir", "mode", "sig", "how", "at"}``: ``mode`` is ``copy``, ``inplace`` or ``nonatomic``; ``how`` is
``delay`` (the child is killed ``at`` seconds after it starts, drawn by the test from a seeded generator
and scaled here by the duration of one uninterrupted injection) or ``replace`` (the child sends ``sig`` to
itself just before its ``at``-th ``os.replace``, or just after the ``-at``-th when ``at`` is negative).
The original may be a checkpoint directory (copied as a tree; ``os.rename``, which commits a directory, counts
as a rename too). SPEC's optional ``warm`` lists the modes run once before the forks (default: copy and
nonatomic). fastflip is imported once; every trial forks, so a trial costs one injection, not an interpreter
start.
Prints one JSON line per trial: its index and how the child ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time


def _inject(mode: str, src: str, out: str) -> int:
    if mode == "nonatomic":
        from fastflip import Sampling
        from fastflip.files.inject import inject_file

        inject_file(src, in_place=True, atomic=False, sampling=Sampling(count=40), seed=7)
        return 0
    from fastflip.cli import main

    where = ["--in-place"] if mode == "inplace" else ["-o", out]
    return main(["inject", src, *where, "--count", "40", "--seed", "7"])


def _hook(sig: int, at: int) -> None:
    """Send ``sig`` to this process just before the ``at``-th os.replace / os.rename (just after the ``-at``-th
    if negative)."""
    calls = [0]

    def wrap(real):  # noqa: ANN001, ANN202
        def renamed(a, b, **kw):  # noqa: ANN001
            calls[0] += 1
            if calls[0] == at:
                os.kill(os.getpid(), sig)
            real(a, b, **kw)
            if calls[0] == -at:
                os.kill(os.getpid(), sig)

        return renamed

    os.replace, os.rename = wrap(os.replace), wrap(os.rename)


def _copy(src: str, dst: str) -> None:
    """A fresh copy of the original checkpoint: a file, or a directory tree."""
    if os.path.isdir(src):
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)


def _child(trial: dict, src: str, out: str) -> None:
    code = 1
    null = os.open(os.devnull, os.O_WRONLY)  # the parent's stdout carries the trial results only
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if trial["how"] == "replace":
            _hook(trial["sig"], trial["at"])
        code = _inject(trial["mode"], src, out) or 0
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - reported through the exit status
        code = 3
    finally:
        os._exit(code)


def _run(trial: dict, original: str, ext: str, unit: float) -> tuple[int, float]:
    src = os.path.join(trial["dir"], "in" + ext)
    _copy(original, src)
    sys.stdout.flush()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(trial, src, os.path.join(trial["dir"], "out" + ext))
    if trial["how"] == "delay":
        time.sleep(trial["at"] * unit)
        try:
            os.kill(pid, trial["sig"])
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return status, time.perf_counter() - t0


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    ext = os.path.splitext(spec["file"])[1]
    root = os.path.dirname(spec["trials"][0]["dir"])
    warm = os.path.join(root, "warm")
    os.makedirs(warm)
    # everything an injection imports, imported here once, before the forks
    for mode in spec.get("warm", ("copy", "nonatomic")):
        _copy(spec["file"], os.path.join(warm, mode + ext))
        _inject(mode, os.path.join(warm, mode + ext), os.path.join(warm, "out" + ext))
    unit = 0.0
    for k in range(2):  # the duration of one uninterrupted injection, in a child like the trials
        calib = os.path.join(root, f"calibrate{k}")
        os.makedirs(calib)
        unit = max(unit, _run({"dir": calib, "mode": "copy", "how": "none"}, spec["file"], ext, 0)[1])
    for i, trial in enumerate(spec["trials"]):
        status, _ = _run(trial, spec["file"], ext, unit)
        print(json.dumps({"trial": i, "status": status, "unit": unit}), flush=True)


if __name__ == "__main__":
    main()
