"""A new file with region evidence (``inject -o OUT --evidence regions``, ``inject_file(src, dst,
hash_files="regions")``): the input copied in the kernel, the touched bytes written, no whole-file hash pass.

Judged by the frameworks that wrote the files (safetensors with bf16, h5py contiguous/chunked/gzip, np.savez,
torch.save): exactly the logged sites change; the output equals the whole-file-hash mode's byte for byte; revert
restores the original bytes; replay reproduces the output; tampering inside a window or a touched range is refused
(a change elsewhere is not seen: docs/log-format.md); and the bytes this process reads in user space are the
windows and touched pages, not the file. A kill at any moment of ``inject -o --evidence regions``: mode
``regions`` of test_crash_kill.py.
"""

from __future__ import annotations

import os
import zipfile
from typing import Callable

import h5py
import numpy as np
import pytest

from conftest import require
from format_builders import write_checkpoint
from framework_judge import assert_judged, changed_sites
from framework_views import h5_view, np_view, st_numpy_view, torch_view
from fastflip.cli import main
from fastflip.errors import LogMismatchError, OptionError
from fastflip.files.copyregions import refuse_moving_bytes
from fastflip.files import hashing
from fastflip.files.fingerprint import WINDOW, head_length
from fastflip.files.inject import inject_checkpoint_file, inject_file
from fastflip.files.log import InjectionLog
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.routes import ChunkPatches

N = 3 << 19  # elements per tensor: the files are a few MiB, so most sites lie outside the 1 MiB windows
FORMATS = ["safetensors-bf16", "hdf5", "hdf5-chunked", "hdf5-gzip", "npz", "npz-deflated", "torch"]


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.05).astype("<f4")


def _make(fmt: str, d) -> tuple[str, Callable[[str], dict[str, np.ndarray]]]:
    """(a file the framework wrote, the framework's reading of it: :mod:`framework_views`)."""
    w, b = _noise(N), _noise(64, 1)
    if fmt == "safetensors-bf16":
        ml = require("ml_dtypes")
        return write_checkpoint("safetensors", d / "m.safetensors",
                                {"layer.0.weight": w.astype(ml.bfloat16), "layer.0.bias": b}), st_numpy_view
    if fmt == "hdf5":
        return write_checkpoint("hdf5", d / "m.h5", {"g.w": w, "g.b": b}), h5_view
    if fmt == "hdf5-chunked":
        return write_checkpoint("hdf5", d / "m.h5", {"c": w.reshape(-1, 512)}, chunks=(64, 512)), h5_view
    if fmt == "hdf5-gzip":
        p = write_checkpoint("hdf5", d / "m.h5", {"z": _noise(256 * 256).reshape(256, 256)}, chunks=(64, 64),
                             compression="gzip")
        with h5py.File(p, "a") as f:  # and a contiguous dataset beside the chunks
            f["w"] = _noise(N, 2)
        return p, h5_view
    if fmt.startswith("npz"):
        return write_checkpoint("npz", d / "m.npz", {"w": w, "b": b}, compressed=fmt == "npz-deflated"), np_view
    return write_checkpoint("torch", d / "m.pt", {"w": w, "b": b}), torch_view


def _bytes(p: str) -> bytes:
    with open(p, "rb") as fh:
        return fh.read()


def _windows(data: bytes, src: str, fp: dict) -> dict:
    """The fingerprint record of ``data`` (the input ``src``, or an output of its size and header) as the log
    describes one: its size, the window lengths (the head: ``head_length`` of ``src``; the tail: :data:`WINDOW`, or
    the whole file if smaller) and the windows' hashes (the log's algorithm)."""
    def digest(b: bytes) -> str:
        h = hashing.new(fp["algorithm"])
        h.update(b)
        return h.hexdigest()

    head, tail = head_length(src, len(data)), min(WINDOW, len(data))
    return {"size": len(data), "head_len": head, "tail_len": tail, "head": digest(data[:head]),
            "tail": digest(data[len(data) - tail:])}


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.framework) if f == "torch" else f for f in FORMATS])
def test_new_file_by_regions_is_judged_by_the_framework(fmt, tmp_path):
    src, view = _make(fmt, tmp_path)
    orig = _bytes(src)
    expect = view(src)
    out, ref, again = (str(tmp_path / n) for n in ("out", "ref", "again"))
    res = inject_file(src, out, hash_files="regions", seed=4, count=12)
    assert _bytes(src) == orig  # the input is untouched
    log = InjectionLog.load(res.log_path)  # the log as written
    m = log.manifest
    assert m["evidence"] == "regions" and m["input"]["hash"] is None and m["output"]["hash"] is None
    assert m["fingerprint"]["input"]["size"] == m["fingerprint"]["output"]["size"] == len(orig)
    fp = m["fingerprint"]
    assert fp["input"] == _windows(orig, src, fp) and fp["output"] == _windows(_bytes(out), src, fp)
    assert fp["input"] != fp["output"]  # some site lies in a window: the output's fingerprint is its own
    assert changed_sites(log) >= 10
    assert_judged(expect, view(out), log)
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
    src, _ = _make("hdf5", tmp_path)
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
    p = write_checkpoint("keras", tmp_path / "m.keras", {"w": _noise(64)})
    with pytest.raises(OptionError, match="region evidence"):
        inject_checkpoint_file(p, str(tmp_path / "o.keras"), hash_files="regions", count=1)
    assert main(["inject", p, "-o", str(tmp_path / "o.keras"), "--evidence", "regions", "--count", "1"]) == 2
    assert "drop --evidence regions" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o.keras")


@pytest.mark.parametrize("where", ["word", "crc"])
def test_a_copy_changed_before_its_touched_bytes_are_written_is_refused(where, tmp_path, monkeypatch):
    """A touched range of the copy (a word, or a zip CRC field) changed between the kernel copy and the write: the
    one pass that checks and writes the touched ranges refuses it; neither the output nor its log is left, and
    the copy's touched ranges are read once (no second check of the words or the encoded bytes)."""
    from fastflip.files import fingerprint

    src, _ = _make("npz", tmp_path)
    probe = inject_file(src, str(tmp_path / "probe.npz"), hash_files="regions", seed=3, count=8)
    undo = probe.log.undo
    with zipfile.ZipFile(src) as z:  # a local header's CRC-32 field: 14 bytes into the header
        crcs = {z.getinfo(n).header_offset + 14 for n in z.namelist()} & set(undo.offsets.tolist())
    at = min(crcs) if where == "crc" else int(undo.offsets[-1])
    real_copy, real_write, passes = fingerprint.kernel_copy, fingerprint.write_ranges, []

    def meddle(a, b, **kw):
        real_copy(a, b, **kw)
        with open(b, "r+b") as fh:
            fh.seek(at)
            v = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([v ^ 0x10]))

    def spy(fd, offsets, lengths, new, old=None, **kw):
        passes.append(old is not None and new is not None)
        return real_write(fd, offsets, lengths, new, old, **kw)

    monkeypatch.setattr(fingerprint, "write_ranges", spy)
    monkeypatch.setattr(fingerprint, "ranges_hold", lambda *a: pytest.fail("the copy's ranges checked twice"))
    out = tmp_path / "again.npz"
    inject_file(src, str(out), hash_files="regions", seed=3, count=8)  # untouched copy: one pass that checks
    assert passes == [True] and _bytes(str(out)) == _bytes(str(tmp_path / "probe.npz"))
    monkeypatch.setattr(fingerprint, "kernel_copy", meddle)
    out = tmp_path / "out.npz"
    with pytest.raises(LogMismatchError, match="changed while it was being copied") as exc:
        inject_file(src, str(out), hash_files="regions", seed=3, count=8)
    assert "\n" not in str(exc.value) and passes == [True, True]
    assert not out.exists() and not os.path.exists(str(out) + ".fflog")
    assert sorted(os.listdir(tmp_path)) == sorted(["m.npz", "probe.npz", "probe.npz.fflog", "again.npz",
                                                   "again.npz.fflog"])  # no temporary left


@pytest.mark.parametrize("fmt", ["npz", "hdf5-gzip"])
def test_the_numpy_pass_writes_what_the_native_one_does(fmt, tmp_path, monkeypatch):
    """Without the native module (an installation without a C compiler) the same output and log, byte for
    byte, and revert and replay work the same."""
    require("fastflip.kernels._cython")
    from fastflip.files import rangeio

    src, _ = _make(fmt, tmp_path)
    got, built = {}, rangeio._NATIVE
    for native in (True, False):
        monkeypatch.setattr(rangeio, "_NATIVE", built if native else None)
        assert rangeio.native_available() == native
        out = str(tmp_path / f"out-{native}")
        res = inject_file(src, out, hash_files="regions", seed=5, count=3000)
        u = InjectionLog.load(res.log_path).undo
        again = str(tmp_path / f"again-{native}")
        replay(res.log_path, src, again)
        got[native] = (_bytes(out), u.offsets.tolist(), u.lengths.tolist(), u.data, u.new_data, _bytes(again))
        revert(res.log_path, out)
        assert _bytes(out) == _bytes(src)
    assert got[True] == got[False]
    assert got[True][0] != _bytes(src) and got[True][0] == got[True][5]
