"""A new file with region evidence (``inject -o OUT --evidence regions``, ``inject_file(src, dst,
hash_files="regions")``): the input copied in the kernel, the touched bytes written, no whole-file hash pass.

Judged by the frameworks that wrote the files (safetensors with bf16, h5py contiguous/chunked/gzip, np.savez,
torch.save): exactly the logged sites change; the output equals the whole-file-hash mode's byte for byte; revert
restores the original bytes; replay reproduces the output; tampering inside a window or a touched range is refused
(a change elsewhere is not seen: docs/log-format.md); a kill before the commit leaves no output without its log;
and the bytes this process reads in user space are the windows and touched pages, not the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import require
from fastflip.cli import main
from fastflip.errors import LogMismatchError, OptionError
from fastflip.files.copyregions import refuse_moving_bytes
from fastflip.files.fingerprint import WINDOW
from fastflip.files.inject import inject_checkpoint_file, inject_file
from fastflip.files.log import InjectionLog
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.routes import ChunkPatches

N = 3 << 19  # elements per tensor: the files are a few MiB, so most sites lie outside the 1 MiB windows
FORMATS = ["safetensors-bf16", "hdf5", "hdf5-chunked", "hdf5-gzip", "npz", "npz-deflated", "torch"]


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.05).astype("<f4")


def _make(fmt: str, d) -> tuple[str, callable]:
    """(a file the framework wrote, its loader: path -> {fastflip tensor path: unsigned words})."""
    if fmt == "safetensors-bf16":
        ml = require("ml_dtypes")
        require("safetensors")
        from safetensors.numpy import load_file, save_file

        p = str(d / "m.safetensors")
        save_file({"layer.0.weight": _noise(N).astype(ml.bfloat16), "layer.0.bias": _noise(64, 1)}, p)
        return p, lambda q: {"/" + k: v.view(f"u{v.itemsize}") for k, v in load_file(q).items()}
    if fmt.startswith("hdf5"):
        p = str(d / "m.h5")
        with h5py.File(p, "w") as f:
            if fmt == "hdf5":
                f["g/w"], f["g/b"] = _noise(N), _noise(64, 1)
            elif fmt == "hdf5-chunked":
                f.create_dataset("c", data=_noise(N).reshape(-1, 512), chunks=(64, 512))
            else:
                f.create_dataset("z", data=_noise(256 * 256).reshape(256, 256), chunks=(64, 64), compression="gzip")
                f["w"] = _noise(N, 2)

        def load(q):
            out = {}

            def keep(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out["/" + name] = obj[()].view("u4")

            with h5py.File(q, "r") as f:
                f.visititems(keep)
            return out

        return p, load
    if fmt.startswith("npz"):
        p = str(d / "m.npz")
        (np.savez if fmt == "npz" else np.savez_compressed)(p, w=_noise(N), b=_noise(64, 1))
        return p, lambda q: {"/" + k: v.view("u4") for k, v in np.load(q).items()}
    torch = require("torch")
    p = str(d / "m.pt")
    torch.save({"w": torch.from_numpy(_noise(N)), "b": torch.from_numpy(_noise(64, 1))}, p)
    return p, lambda q: {"/" + k: v.numpy().view("u4") for k, v in torch.load(q, weights_only=True).items()}


def _bytes(p: str) -> bytes:
    with open(p, "rb") as fh:
        return fh.read()


def _changed(load, a: str, b: str) -> set[tuple[str, int, int]]:
    """{(tensor, flat index, new word)} where the framework reads other words in ``b`` than in ``a``."""
    x, y = load(a), load(b)
    assert x.keys() == y.keys()
    out = set()
    for k in x:
        for i in np.flatnonzero(x[k].reshape(-1) != y[k].reshape(-1)).tolist():
            out.add((k, i, int(y[k].reshape(-1)[i])))
    return out


def _logged(log: InjectionLog) -> set[tuple[str, int, int]]:
    names = [t.name for t in log.plan.tensors]
    c = log.columns()
    ch = c["old_word"] != c["new_word"]
    return {(names[t], int(i), int(w)) for t, i, w in zip(c["tensor"][ch], c["index"][ch], c["new_word"][ch])}


@pytest.mark.framework
@pytest.mark.parametrize("fmt", FORMATS)
def test_new_file_by_regions_is_judged_by_the_framework(fmt, tmp_path):
    src, load = _make(fmt, tmp_path)
    orig = _bytes(src)
    out, ref, again = (str(tmp_path / n) for n in ("out", "ref", "again"))
    res = inject_file(src, out, hash_files="regions", seed=4, count=12)
    assert _bytes(src) == orig  # the input is untouched
    m = InjectionLog.load(res.log_path).manifest
    assert m["evidence"] == "regions" and m["input"]["hash"] is None and m["output"]["hash"] is None
    assert m["fingerprint"]["input"]["size"] == m["fingerprint"]["output"]["size"] == len(orig)
    assert m["fingerprint"]["input"] != m["fingerprint"]["output"] or m["counts"]["changed"] == 0
    log = InjectionLog.load(res.log_path)
    assert _changed(load, src, out) == _logged(log) and len(_logged(log)) >= 10
    inject_file(src, ref, seed=4, count=12)  # the same plan with whole-file hashes: the same bytes
    assert _bytes(out) == _bytes(ref)
    rp = replay(res.log_path, src, again)
    assert _bytes(again) == _bytes(out) and rp.log.manifest["evidence"] == "regions"
    r = revert(res.log_path, out)
    assert r.evidence == "regions" and r.verified and _bytes(out) == orig


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar"))


@pytest.mark.skipif(not (os.path.exists("/proc/self/io") and hasattr(os, "copy_file_range")),
                    reason="counts reads through Linux's /proc/self/io")
def test_no_pass_over_the_file_in_user_space(tmp_path, monkeypatch):
    """rchar counts every byte read(), pread() and copy_file_range() moved; less what the kernel copied file to
    file, it is what this process read into its own memory."""
    require("safetensors")
    from safetensors.numpy import save_file

    src = str(tmp_path / "big.safetensors")
    save_file({f"t{i}": _noise(2 << 20, i) for i in range(4)}, src)  # 32 MiB
    size = os.path.getsize(src)
    copied = [0]
    real = os.copy_file_range

    def spy(*a, **kw):
        n = real(*a, **kw)
        copied[0] += n
        return n

    monkeypatch.setattr(os, "copy_file_range", spy)
    read = {}
    for evidence in ("regions", True):
        copied[0], before = 0, _rchar()
        inject_file(src, str(tmp_path / f"out-{evidence}"), hash_files=evidence, seed=2, count=10, cached_input=False)
        read[evidence] = (_rchar() - before - copied[0], copied[0])
    user, kernel = read["regions"]
    assert kernel == size and user < 4 * WINDOW + size // 8, read  # the windows (read thrice) and the header
    assert read[True][0] >= size, read  # whole-file hashes read every byte into this process


def _tampered(tmp_path, edit):
    src, _ = _make("safetensors-bf16", tmp_path)
    out = str(tmp_path / "out.safetensors")
    res = inject_file(src, out, hash_files="regions", seed=9, count=10)
    undo = InjectionLog.load(res.log_path).undo
    edit(out, undo)
    return src, out, res


def _write(path: str, at: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(data)


def _outside(undo, lo: int, hi: int) -> int:
    """An offset in [lo, hi) that no touched range covers."""
    for at in range(lo, hi):
        if not ((undo.offsets <= at) & (at < undo.offsets + undo.lengths)).any():
            return at
    raise AssertionError("no untouched byte")


@pytest.mark.parametrize("where", ["head", "tail", "range"])
def test_tampering_in_a_window_or_touched_range_is_refused(where, tmp_path, capsys):
    def edit(out, undo):
        size = os.path.getsize(out)
        at = {"head": _outside(undo, 100, WINDOW), "tail": _outside(undo, size - WINDOW, size),
              "range": int(undo.offsets[len(undo.offsets) // 2])}[where]
        with open(out, "rb") as fh:
            fh.seek(at)
            b = fh.read(1)[0]
        # in a touched range: a byte neither the old nor the new value (a half-written run is still reverted)
        pos = int(undo.lengths[: len(undo.offsets) // 2].sum())
        avoid = {b, undo.data[pos], undo.new_data[pos]} if where == "range" else {b}
        _write(out, at, bytes([next(v for v in range(256) if v not in avoid)]))

    src, out, res = _tampered(tmp_path, edit)
    before = _bytes(out)
    why = "touched range" if where == "range" else "head/tail fingerprint"
    with pytest.raises(LogMismatchError, match=why) as exc:
        revert(res.log_path, out)
    msg = str(exc.value)
    assert "\n" not in msg and out in msg and "--no-verify" in msg and _bytes(out) == before
    assert main(["revert", res.log_path, out]) == 2 and _bytes(out) == before
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--no-verify" in err and "Traceback" not in err
    r = revert(res.log_path, out, verify=False)  # the touched ranges get their original bytes anyway
    assert r.verified == (where == "range") and r.evidence == "regions"  # proven where every changed byte was in a range
    got, orig = _bytes(out), _bytes(src)
    differ = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(orig, np.uint8))
    assert len(differ) == (0 if where == "range" else 1)  # a tampered byte outside the ranges stays


def test_a_change_outside_windows_and_ranges_is_not_seen(tmp_path):
    """What region evidence does not detect (documented): such a file is reverted, the change kept."""
    at = []

    def edit(out, undo):
        at.append(_outside(undo, WINDOW + 4096, os.path.getsize(out) - WINDOW))
        _write(out, at[0], b"\x7f")

    src, out, res = _tampered(tmp_path, edit)
    assert revert(res.log_path, out).verified
    got, orig = np.frombuffer(_bytes(out), np.uint8), np.frombuffer(_bytes(src), np.uint8)
    assert np.flatnonzero(got != orig).tolist() == ([at[0]] if orig[at[0]] != 0x7F else [])


def test_replay_refuses_another_input(tmp_path):
    src, out, res = _tampered(tmp_path, lambda out, undo: None)
    _write(src, 200, b"\x00\x01")
    with pytest.raises(LogMismatchError, match="is not the logged input .*fingerprint"):
        replay(res.log_path, src, str(tmp_path / "again"))
    assert not os.path.exists(tmp_path / "again")


def test_in_place_through_a_copy(tmp_path):
    src, load = _make("hdf5", tmp_path)
    orig = _bytes(src)
    res = inject_file(src, in_place=True, hash_files="regions", seed=1, count=10)
    assert InjectionLog.load(res.log_path).manifest["evidence"] == "regions" and _bytes(src) != orig
    assert revert(res.log_path, src).evidence == "regions" and _bytes(src) == orig


@pytest.mark.filterwarnings("ignore:fastflip. scaleoffset chunks")
def test_refused_where_bytes_would_move(tmp_path):
    p = str(tmp_path / "so.h5")
    with h5py.File(p, "w") as f:  # scale-offset: a filter fastflip leaves to the HDF5 library (read-modify-write)
        f.create_dataset("s", data=np.arange(4096, dtype="i4").reshape(64, 64), chunks=(16, 16), scaleoffset=0)
    out = str(tmp_path / "out.h5")
    with pytest.raises(OptionError, match="region evidence needs every changed byte to stay where it is") as exc:
        inject_file(p, out, hash_files="regions", seed=1, count=3)
    assert "\n" not in str(exc.value) and p in str(exc.value)
    assert not os.path.exists(out) and not os.path.exists(out + ".fflog")
    assert [n for n in os.listdir(tmp_path) if n != "so.h5"] == []  # no temporary left
    inject_file(p, out, seed=1, count=3)  # whole-file hashes: the HDF5 library's path


def test_a_member_that_changes_size_is_refused():
    with pytest.raises(OptionError, match="m.npz: .* a member whose re-encoded size differs: drop it"):
        refuse_moving_bytes("m.npz", [], ChunkPatches(resized=True), "drop it")
    refuse_moving_bytes("m.npz", [], ChunkPatches(), "drop it")  # same-size patches: region evidence works


def test_cli_evidence(tmp_path, capsys):
    src, _ = _make("npz", tmp_path)
    out = str(tmp_path / "out.npz")
    assert main(["inject", src, "-o", out, "--evidence", "regions", "--count", "5", "--seed", "1", "-q"]) == 0
    assert InjectionLog.load(out + ".fflog").manifest["evidence"] == "regions"
    assert main(["revert", out + ".fflog", out, "-q"]) == 0 and _bytes(out) == _bytes(src)
    assert capsys.readouterr().out == ""  # -q: silent
    assert main(["replay", out + ".fflog", src, "-o", str(tmp_path / "again.npz")]) == 0
    assert "the touched byte ranges, size and head/tail fingerprint" in capsys.readouterr().out
    # --evidence file with --direct is --verify-file: whole-file hashes
    assert main(["inject", out, "--in-place", "--direct", "--evidence", "file", "--count", "5", "-q"]) == 0
    m = InjectionLog.load(out + ".2.fflog").manifest
    assert "evidence" not in m and m["input"]["hash"] and m["output"]["hash"]
    capsys.readouterr()
    for argv in (["--in-place", "--direct", "--verify-file", "--evidence", "regions"], ["-o", out, "--verify-file"]):
        assert main(["inject", src, *argv, "--count", "1", "--force"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_keras_archive_refuses_regions(tmp_path, capsys):
    import zipfile

    inner, p = str(tmp_path / "inner.h5"), str(tmp_path / "m.keras")
    with h5py.File(inner, "w") as f:
        f["layers/dense/vars/0"] = _noise(64)
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("metadata.json", '{"keras_version": "3"}')
        z.writestr("config.json", '{"class_name": "Sequential"}')
        z.write(inner, "model.weights.h5")
    with pytest.raises(OptionError, match="region evidence"):
        inject_checkpoint_file(p, str(tmp_path / "o.keras"), hash_files="regions", count=1)
    assert main(["inject", p, "-o", str(tmp_path / "o.keras"), "--evidence", "regions", "--count", "1"]) == 2
    assert "drop --evidence regions" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o.keras")


_WORKER = """
import sys
sys.path.insert(0, sys.argv[5])
from crash_worker import _hook  # a signal just before the at-th rename (just after the -at-th)
from fastflip.cli import main
if int(sys.argv[4]):
    _hook("replace", int(sys.argv[4]), int(sys.argv[3]))
sys.exit(main(["inject", sys.argv[1], "-o", sys.argv[2], "--evidence", "regions", "--count", "20", "--seed", "3",
               "-q"]))
"""


def _check_kill(src: str, out: str, orig: bytes) -> None:
    """The input is untouched; an output exists only with the log that reverts it."""
    assert _bytes(src) == orig
    if os.path.exists(out):
        assert os.path.exists(out + ".fflog")
        assert revert(out + ".fflog", out).evidence == "regions" and _bytes(out) == orig


@pytest.mark.parametrize("at", [1, 2, -2])
def test_a_kill_at_a_rename_leaves_no_output_without_its_log(at, tmp_path):
    """SIGKILL just before the log's rename (1), before the output's (2), or after it (-2)."""
    src, _ = _make("torch", tmp_path)
    orig = _bytes(src)
    out = str(tmp_path / "out.pt")
    r = subprocess.run([sys.executable, "-c", _WORKER, src, out, str(int(signal.SIGKILL)), str(at),
                        os.path.dirname(__file__)], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    _check_kill(src, out, orig)
    if at == 1:
        assert not os.path.exists(out) and not os.path.exists(out + ".fflog")
    if at == 2:  # the log is durable before the output: it describes a change that did not happen
        assert not os.path.exists(out) and json.loads(_manifest(out + ".fflog"))["evidence"] == "regions"
    if at == -2:
        assert os.path.exists(out)


def test_a_kill_at_any_moment_leaves_no_output_without_its_log(tmp_path):
    """SIGKILL at seeded moments of one uninterrupted run (interpreter start, imports, plan, copy, commit)."""
    src, _ = _make("torch", tmp_path)
    orig = _bytes(src)
    out = str(tmp_path / "out.pt")
    cmd = [sys.executable, "-c", _WORKER, src, out, "0", "0", os.path.dirname(__file__)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    unit = time.perf_counter() - t0
    for p in (out, out + ".fflog"):
        os.unlink(p)
    for frac in np.random.default_rng(5).uniform(0.5, 1.0, 3).tolist():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=frac * unit)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _check_kill(src, out, orig)
        for p in (out, out + ".fflog"):
            if os.path.exists(p):
                os.unlink(p)


def _manifest(log: str) -> str:
    import zipfile

    with zipfile.ZipFile(log) as z:
        return z.read("manifest.json").decode()
