"""Kill an injection at any moment: the user keeps the old state, or the new state with a log that reverts it.

Evidence before change. A subprocess (tests/crash_worker.py) forks one child per trial and
kills it with SIGKILL, SIGTERM or SIGINT, either at seeded random moments (scaled by the duration of one
uninterrupted injection) or exactly before/after one of its renames (os.replace). Copy-mode injections must
leave the input untouched and never an output without its log; in-place ones must leave the original bytes,
or changed bytes with a ``.fflog`` whose revert gives the original bytes back. Checked for HDF5, .keras,
torch.save, safetensors, .npz and a sharded safetensors checkpoint directory (index + three shards,
killed also between the renames of its shards); the default tier runs a few kills per format and mode,
``slow`` many more.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import log_hash, require
from format_builders import write_checkpoint
from fastflip.files.filebytes import hash_file
from fastflip.files.revert import revert
from fastflip.files.sharded import revert_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SIGS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"layer1.weight": rng.standard_normal((128, 256)).astype("f4"),
            "layer1.bias": rng.standard_normal(256).astype("f4")}


def _make(fmt: str, d: str) -> str:
    w = _weights()
    if fmt != "sharded":
        kind = {"h5": "hdf5", "pt": "torch"}.get(fmt, fmt)
        return write_checkpoint(kind, os.path.join(d, f"orig.{fmt}"), w)
    require("safetensors")
    from safetensors.numpy import save_file

    p = os.path.join(d, "orig")
    os.makedirs(p)
    weight_map = {}
    for k in range(1, 4):
        shard = f"model-{k:05d}-of-00003.safetensors"
        part = {f"layer{k}.{n}": v for n, v in (("weight", w["layer1.weight"] * k), ("bias", w["layer1.bias"]))}
        save_file(part, os.path.join(p, shard))
        weight_map.update(dict.fromkeys(part, shard))
    with open(os.path.join(p, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    with open(os.path.join(p, "config.json"), "w") as fh:
        fh.write("{}")
    return p


def _modes(fmt: str) -> list[str]:
    # a directory's non-atomic path keeps its log in memory only (campaign trials): nothing to kill it against
    return ["copy", "inplace"] + ([] if fmt in ("keras", "sharded") else ["nonatomic"])


# a directory commits in several renames (in place: the log, then each of three shards, after three staged
# shards; copy: the log, then the folder): kill -9 right after the log and between the shards' renames too
MID_COMMIT = {"sharded": [-4, -5, -6]}


def _trials(fmt: str, root: str, rng: np.random.Generator, slow: bool) -> list[dict]:
    trials = []
    for mode in _modes(fmt):
        at_renames = [1, 2, 3, 4, -1, -2, -3] if slow else [2, 3, -2]
        kills = [(at, sig) for at in at_renames for sig in (SIGS if slow else [SIGS[int(rng.integers(3))]])]
        plan = [("replace", at, sig) for at, sig in kills]
        plan += [("replace", at, signal.SIGKILL) for at in MID_COMMIT.get(fmt, [])]
        plan += [("delay", float(rng.uniform(0.0, 1.3)), SIGS[k % 3]) for k in range(30 if slow else 4)]
        for how, at, sig in plan:
            if mode == "nonatomic" and how == "delay" and sig == signal.SIGKILL:
                sig = signal.SIGTERM  # a kill -9 while the words are written leaves them half done: see docs
            d = os.path.join(root, f"t{len(trials)}")
            os.makedirs(d)
            trials.append({"dir": d, "mode": mode, "how": how, "at": at, "sig": int(sig)})
    return trials


def _read(p: str) -> bytes | dict[str, bytes]:
    """A file's bytes, or a directory's files (fastflip's hidden temporaries and lock records left out)."""
    if os.path.isdir(p):
        return {n: _read(os.path.join(p, n)) for n in sorted(os.listdir(p)) if not n.startswith(".")}
    with open(p, "rb") as fh:
        return fh.read()


def _check(trial: dict, original: bytes, ext: str) -> str:
    """The state a killed trial left: 'old' or 'new' (asserting it is one of the two allowed)."""
    d = trial["dir"]
    src, out = os.path.join(d, "in" + ext), os.path.join(d, "out" + ext)
    now = _read(src)
    what = f"{trial} left"
    if trial["mode"] == "copy":
        assert now == original, f"{what} its input changed"
        if not os.path.exists(out):
            return "old"
        assert os.path.exists(out + ".fflog"), f"{what} an output without its log"
        target = out
    else:
        if now == original:
            return "old"
        target = src
    logs = sorted(glob.glob(os.path.join(d, "*.fflog")))
    assert logs, f"{what} a changed file and no log"
    back = os.path.join(d, "back" + ext)
    for lp in logs:
        try:
            (revert_dir if os.path.isdir(target) else revert)(lp, target, back, overwrite=True)
        except Exception:  # noqa: BLE001 - another log (of a run that did not commit) may not fit
            continue
        if _read(back) == original:
            return "new"
    raise AssertionError(f"{what} a changed file whose logs ({logs}) do not revert it to the original")


def _run(fmt: str, tmp_path, seed: int, slow: bool = False) -> dict[str, int]:
    orig = _make(fmt, str(tmp_path))
    trials = _trials(fmt, str(tmp_path / "trials"), np.random.default_rng(seed), slow)
    spec = tmp_path / "spec.json"
    warm = [m for m in _modes(fmt) if m != "inplace"]
    spec.write_text(json.dumps({"file": orig, "trials": trials, "warm": warm}))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "crash_worker.py"), str(spec)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, FASTFLIP_HASH_CACHE="off"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"trial"')]
    assert len(done) == len(trials)
    original = _read(orig)
    seen = {"old": 0, "new": 0}
    for t in trials:
        seen[_check(t, original, os.path.splitext(orig)[1])] += 1
    return seen


FORMATS = ["h5", "keras", "pt", "safetensors", "npz", "sharded"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_at_any_moment_keeps_a_way_back(fmt, tmp_path):
    seen = _run(fmt, tmp_path, seed=FORMATS.index(fmt))
    assert seen["old"] and seen["new"]  # the kills landed on both sides of the commit


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_at_any_moment_many(fmt, tmp_path):
    seen = _run(fmt, tmp_path, seed=100 + FORMATS.index(fmt), slow=True)
    assert seen["old"] and seen["new"]


@pytest.mark.parametrize("fmt,mode", [(f, m) for f in ("h5", "keras", "npz") for m in _modes(f)])
def test_the_log_is_in_place_before_the_file_changes(fmt, mode, tmp_path, monkeypatch):
    """At the moment the log is renamed into place, the file it describes is still the old one (in place) or
    not there yet (copy); afterwards both are there. Deterministic, in process."""
    from fastflip.files.inject import inject_checkpoint_file

    orig = _make(fmt, str(tmp_path))
    original = _read(orig)
    src, out = str(tmp_path / ("in" + os.path.splitext(orig)[1])), str(tmp_path / "out.bin")
    with open(src, "wb") as fh:
        fh.write(original)
    real, seen = os.replace, []

    def replace(a, b):
        if str(b).endswith(".fflog"):
            seen.append(_read(src) == original and not os.path.exists(out))
        real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    kw = {"in_place": True, "atomic": mode != "nonatomic"} if mode != "copy" else {"dst": out}
    res = inject_checkpoint_file(src, count=10, seed=1, **kw)
    assert seen == [True]
    assert os.path.exists(res.log_path) and _read(res.output) != original
    m = res.log.manifest
    logged = m["container"]["output_sha256"] if fmt == "keras" else log_hash(m["output"])
    algorithm = "sha256" if fmt == "keras" else m["output"]["hash_algorithm"]
    assert logged == hash_file(res.output, algorithm, cache=False)  # non-atomic: the predicted hash is the file's
