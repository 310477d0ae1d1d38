"""Kill an injection at any moment: the user keeps the old state, or the new state with a log that reverts it.

Evidence before change. A subprocess (tests/crash_worker.py) forks one child per trial and kills it with
SIGKILL, SIGTERM or SIGINT: just before or after each of its renames (os.replace / os.rename) and fsyncs,
part-way through the bytes it writes into the file where they lie (the words, then zip CRC fields and
re-encoded chunks: a ``kill -9`` in the middle of a direct in-place injection), or at seeded random moments
(scaled by the duration of one uninterrupted injection). Five modes: a new file (``inject -o``; and with region
evidence, ``inject -o --evidence regions``), in place
through a copy (``inject --in-place``), direct in place with region evidence (``inject --in-place --direct``)
and the API's non-atomic in-place mode with whole-file hashes; and ``revert LOG FILE`` of a direct injection,
killed the same way (its byte ranges, fsyncs, random moments): the file is the original again, or its log
still takes it back (a log with sites in re-encoded chunks or members is reverted in a copy: killed while its
ranges are written, the file is still the injected one).

Each trial is judged by bytes: the file is the original (``old``), or it changed and its log reverts it to
exactly the original bytes (``new``; a direct log both into a new file and in place, as ``fastflip revert LOG
FILE`` does, which must accept a file killed part-way through its writes). A revert that succeeds must give
exactly the original bytes (so every framework reads it as the original; how the frameworks read an injected
file is judged in test_framework_differential.py and test_new_file_regions.py). Only the non-atomic mode with
whole-file hashes may be left ``refused`` (its log may refuse a half-written file; the refusal changes nothing),
and only by a ``kill -9`` while it writes. Per mode, both ``old`` and ``new`` must be
seen, each kill point must give the state its moment implies (before the first rename: old; after the last
rename of a copy: new; a deferred signal while the file is written: new), and along the renames and fsyncs
the state never goes back from new to old.

Checked for HDF5 (contiguous, and gzip chunks re-encoded at their size), torch.save, safetensors, .npz (stored
and deflated), a real Keras ``model.save`` archive and a real sharded ``save_pretrained`` directory (framework
tests; rewritten through a copy only: test_framework_differential.py checks that --direct refuses them). The
default tier runs every rename with ``kill -9`` and a few other points per format and mode, ``slow`` every point
with every signal and more random moments.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest

from conftest import log_hash, require
from format_builders import write_checkpoint
from fastflip.errors import FastflipError
from fastflip.files.filebytes import hash_file
from fastflip.files.revert import revert
from fastflip.files.sharded import revert_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SIGS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
# single files: every mode, --direct included (raw words; gzip chunks and deflated members re-encoded at their size)
FILES = ["h5", "pt", "safetensors", "npz", "h5-gzip", "npz-deflated"]
FRAMEWORK = ["keras", "sharded"]  # real framework output: rewritten through a copy only


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"layer1.weight": rng.standard_normal((128, 256)).astype("f4"),
            "layer1.bias": rng.standard_normal(256).astype("f4")}


def _save(fmt: str, d: str) -> str:
    """Write the original checkpoint of ``fmt`` into ``d``; its path."""
    if fmt in FILES:
        kind = fmt.split("-")[0]
        gz = dict(chunks=True, compression="gzip") if fmt == "h5-gzip" else {}  # re-encoded at their size
        return write_checkpoint({"h5": "hdf5", "pt": "torch"}.get(kind, kind), os.path.join(d, "orig." + kind),
                                _weights(), compressed=fmt == "npz-deflated", **gz)
    if fmt == "keras":
        require("tensorflow")
        require("keras")
        from user_models import keras_subclassed

        p = os.path.join(d, "orig.keras")
        keras_subclassed().save(p)
        return p
    require("torch")
    require("transformers")
    require("safetensors")
    import hf_helpers

    p = os.path.join(d, "orig")
    assert len(hf_helpers.save_sharded(hf_helpers.build("gpt2"), p, max_shard_size="50KB")) == 3
    return p


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> Callable[[str], str]:
    """``originals(fmt)``: the path of the original checkpoint of ``fmt`` (saved once per module)."""
    made: dict[str, str] = {}

    def get(fmt: str) -> str:
        if fmt not in made:
            made[fmt] = _save(fmt, str(tmp_path_factory.mktemp(fmt)))
        return made[fmt]

    return get


def _modes(fmt: str) -> list[str]:
    # a directory's non-atomic path keeps its log in memory only (campaign trials): nothing to kill it against;
    # --direct works on a single file (test_framework_differential.py: its refusals)
    return ["copy", "inplace"] + ([] if fmt in FRAMEWORK else ["regions", "direct", "nonatomic", "revert"])


def _in_default_tier(fmt: str, mode: str) -> bool:
    """The formats and modes the default tier kills (``slow``: all): the re-encoded formats in the modes that write
    in place without a copy; a direct revert on a zip (words and CRC fields), and the revert of a direct log on
    gzip chunks (made in a copy: its words are read back before the rename); a new file with region evidence on
    torch.save."""
    if mode == "regions":
        return fmt == "pt"
    if mode in ("copy", "inplace"):
        return fmt not in ("h5-gzip", "npz-deflated")
    return mode != "revert" or fmt in ("pt", "h5-gzip")


def _plan(fmt: str, rng: np.random.Generator, slow: bool) -> list[dict]:
    """The kill points, per mode (the worker resolves ``all`` / ``ends`` against an uninterrupted run)."""
    trials = []
    for mode in _modes(fmt):
        if not (slow or _in_default_tier(fmt, mode)):
            continue
        writes = mode in ("direct", "nonatomic", "revert")  # written where they lie: killed part-way through
        other = SIGS[int(rng.integers(1, 3))]  # a deferred signal, drawn per mode
        if slow:  # every rename and fsync with kill -9, every rename with a deferred signal, every point of the writes
            plan = [("replace", "all", sig) for sig in (signal.SIGKILL, other)] + [("fsync", "all", signal.SIGKILL)]
            plan += [("writes", "all", sig) for sig in (signal.SIGKILL, other) if writes]
            delays = 8
        else:  # every rename with kill -9, one other point with a deferred signal, some points of the writes
            plan = [("replace", "all", signal.SIGKILL), ("replace", int(rng.choice([1, 2, -1, -2])), other)]
            plan += [("writes", "some", signal.SIGKILL), ("writes", 1, other)] if writes else []
            delays = 2
        if mode == "revert" and fmt not in ("h5-gzip", "npz-deflated"):
            # a direct revert renames nothing: killed at its fsyncs instead (re-encoded sites: reverted in a copy,
            # killed at its rename too)
            plan = [p for p in plan if p[0] != "replace"] + ([] if slow else [("fsync", "ends", signal.SIGKILL)])
        plan += [("delay", float(rng.uniform(0.0, 1.3)), SIGS[k % 3]) for k in range(delays)]
        trials += [{"mode": mode, "how": how, "at": at, "sig": int(sig)} for how, at, sig in plan]
    return trials


def _read(p: str) -> bytes | dict[str, bytes]:
    """A file's bytes, or a directory's files (fastflip's hidden temporaries and lock records left out)."""
    if os.path.isdir(p):
        return {n: _read(os.path.join(p, n)) for n in sorted(os.listdir(p)) if not n.startswith(".")}
    with open(p, "rb") as fh:
        return fh.read()


def _judge(trial: dict, original: Any, ext: str) -> str:
    """The state a killed trial left: 'old' | 'new' | 'refused'.

    Asserts what every mode owes: a copy's input untouched and no output without its log; a changed file has a
    log; a revert that succeeds gives exactly the original bytes; a refused one changes nothing."""
    d = trial["dir"]
    src, out = os.path.join(d, "in" + ext), os.path.join(d, "out" + ext)
    now = _read(src)
    what = f"{trial} left"
    if trial["mode"] in ("copy", "regions"):
        assert now == original, f"{what} its input changed"
        if not os.path.exists(out):
            return "old"
        assert os.path.exists(out + ".fflog"), f"{what} an output without its log"
        target = out
    else:
        if now == original:
            return "old"
        target = src
    assert _read(target) != original, f"{what} an output equal to its input"
    logs = sorted(glob.glob(os.path.join(d, "*.fflog")))
    assert logs, f"{what} a changed file and no log"
    back = os.path.join(d, "back" + ext)
    for lp in logs:
        before = _read(target)
        try:
            if os.path.isdir(target):
                revert_dir(lp, target, back, overwrite=True)
            else:
                revert(lp, target, back, overwrite=True)  # a new file
            assert _read(back) == original, f"{what} a file that {lp} 'reverted' to bytes other than the original"
            if trial["mode"] == "direct":  # in place and directly too, as `fastflip revert LOG FILE` does
                revert(lp, target)
                assert _read(target) == original, f"{what} a file that {lp} 'reverted' in place to other bytes"
        except FastflipError as exc:  # a refusal: one line, nothing changed (a torn zip's CRCs: FormatError)
            assert "\n" not in str(exc), f"{what} a refusal of more than one line: {exc}"
            assert _read(target) == before, f"{what} a file that a refused revert ({lp}) changed"
            continue
        return "new"
    return "refused"


RE_ENCODED = ("h5-gzip", "npz-deflated")  # a direct log's sites in re-encoded chunks/members: reverted in a copy


def _allowed(trial: dict, fmt: str = "") -> set[str]:
    """The states a trial may leave, given where it was killed (of a ``fmt`` file)."""
    mode, how, at, n, sig = trial["mode"], trial["how"], trial["at"], trial["points"], trial["sig"]
    torn = {"old", "new"} | ({"refused"} if mode == "nonatomic" and sig == signal.SIGKILL else set())
    if how == "delay":
        return torn
    if mode == "revert":  # the original again once every range is written back; until then the log takes it back
        if how != "writes":
            return {"old", "new"}
        if fmt in RE_ENCODED:  # the ranges are written into a copy, renamed over the file after them
            return {"new"}
        return {"old"} if sig != signal.SIGKILL or at == n else {"new"}
    if how == "writes":
        if sig != signal.SIGKILL:
            return {"new"}  # deferred while the file is written: all of it is
        if at == 0:
            return {"old"}
        if mode == "direct":
            return {"new"}  # region evidence takes back a file killed part-way through its writes
        # whole-file hashes may refuse a half-written file, never the file the log describes
        return {"new", "refused"} if at < n else {"new"}
    if sig == signal.SIGKILL and at == 1:
        return {"old"}  # before the first rename / fsync
    if sig == signal.SIGKILL and at == -n:  # after the last: a copy is committed; in place, the log only
        return {"new"} if mode in ("copy", "regions", "inplace") else {"old"}
    return {"old", "new"}


def _moment(trial: dict) -> int:
    """The order of a rename/fsync kill point in time: before the k-th call, after it, before the next..."""
    return 2 * trial["at"] - 1 if trial["at"] > 0 else -2 * trial["at"]


def _run(fmt: str, originals, tmp_path, seed: int, slow: bool = False) -> dict[str, dict[str, int]]:
    orig = originals(fmt)
    plan = _plan(fmt, np.random.default_rng(seed), slow)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"file": orig, "root": str(tmp_path / "trials"), "trials": plan}))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "crash_worker.py"), str(spec)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, FASTFLIP_HASH_CACHE="off"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = [json.loads(x)["trial"] for x in proc.stdout.splitlines() if x.startswith('{"trial"')]
    assert len(done) >= len(plan) and {t["mode"] for t in done} == {t["mode"] for t in plan}
    unseen = [t for t in done if t["how"] != "delay" and not t["points"]]
    assert not unseen, f"kill points an uninterrupted run never reaches (a hook that misses the calls): {unseen}"
    original, ext = _read(orig), os.path.splitext(orig)[1]
    seen: dict[str, dict[str, int]] = {t["mode"]: {"old": 0, "new": 0, "refused": 0} for t in plan}
    along: dict[tuple, list[tuple[int, str]]] = {}
    for t in done:
        state = _judge(t, original, ext)
        assert state in _allowed(t, fmt), f"{t} left {state!r}, expected one of {sorted(_allowed(t, fmt))}"
        seen[t["mode"]][state] += 1
        if t["how"] in ("replace", "fsync"):
            along.setdefault((t["mode"], t["how"], t["sig"]), []).append((_moment(t), state))
    for key, states in along.items():  # once new, never old again (a revert: once old, never new again)
        order = [s for _, s in sorted(states)]
        course = ("new", "old") if key[0] == "revert" else ("old", "new")
        assert order == sorted(order, key=course.index), f"{key}: states along the calls {order}"
    for mode, counts in seen.items():
        assert counts["old"] and counts["new"], f"{fmt} {mode}: the kills landed on one side only {counts}"
    return seen


@pytest.mark.parametrize("fmt", FILES + [pytest.param(f, marks=pytest.mark.framework) for f in FRAMEWORK])
def test_kill_at_any_moment_keeps_a_way_back(fmt, originals, tmp_path):
    _run(fmt, originals, tmp_path, seed=(FILES + FRAMEWORK).index(fmt))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FILES + [pytest.param(f, marks=pytest.mark.framework) for f in FRAMEWORK])
def test_kill_at_any_moment_many(fmt, originals, tmp_path):
    _run(fmt, originals, tmp_path, seed=100 + (FILES + FRAMEWORK).index(fmt), slow=True)


@pytest.mark.parametrize("fmt,mode", [(f, m) for f in ("h5", "npz") for m in _modes(f) if m != "revert"]
                         + [pytest.param("keras", m, marks=pytest.mark.framework) for m in _modes("keras")])
def test_the_log_is_in_place_before_the_file_changes(fmt, mode, originals, tmp_path, monkeypatch):
    """At the moment the log is renamed into place, the file it describes is still the old one (in place) or
    not there yet (copy); afterwards both are there. Deterministic, in process."""
    from fastflip.files.inject import inject_checkpoint_file

    orig = originals(fmt)
    original = _read(orig)
    src, out = str(tmp_path / ("in" + os.path.splitext(orig)[1])), str(tmp_path / "out.bin")
    shutil.copyfile(orig, src)
    real, seen = os.replace, []

    def replace(a, b):
        if str(b).endswith(".fflog"):
            seen.append(_read(src) == original and not os.path.exists(out))
        real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    kw: dict[str, Any] = {"dst": out, **({"hash_files": "regions"} if mode == "regions" else {})}
    if mode not in ("copy", "regions"):
        kw = {"in_place": True, "atomic": mode == "inplace", "hash_files": "regions" if mode == "direct" else True}
    res = inject_checkpoint_file(src, count=10, seed=1, **kw)
    assert seen == [True]
    assert os.path.exists(res.log_path) and _read(res.output) != original
    m = res.log.manifest
    if mode in ("direct", "regions"):  # no whole-file hash: the log holds the touched bytes, old and new
        assert m["evidence"] == "regions"
        res.log.undo.apply(res.output)
        assert _read(res.output) == original
        return
    logged = m["container"]["output_sha256"] if fmt == "keras" else log_hash(m["output"])
    algorithm = "sha256" if fmt == "keras" else m["output"]["hash_algorithm"]
    assert logged == hash_file(res.output, algorithm, cache=False)  # non-atomic: the predicted hash is the file's
