"""``fastflip revert`` / ``replay`` / ``diff`` / ``log`` handed edited logs, changed targets and kills.

The rule each case checks: fastflip agrees with the framework's own reading of the result (every tensor of a
reverted file equal, word for word, to the original's as h5py / ``torch.load(weights_only=True)`` / safetensors /
``np.load`` read it), or refuses in one line (``fastflip CMD: error: ...``, exit 2) with nothing written and the
target unchanged.
"""

from __future__ import annotations

import io
import json
import os
import signal
import zipfile
from typing import Callable

import numpy as np
import pytest

from fastflip.cli import main
from conftest import assert_refused, require, snapshot
from format_builders import write_checkpoint
from framework_judge import compare_readings

pytestmark = pytest.mark.framework

_EXT = {"hdf5": ".h5", "safetensors": ".safetensors", "npz": ".npz", "torch": ".pt"}


def _view(fmt: str) -> Callable[[str], dict[str, np.ndarray]]:
    """The framework's own reader of ``fmt`` (:mod:`framework_views`)."""
    import framework_views as fv

    return {"hdf5": fv.h5_view, "safetensors": fv.st_numpy_view, "npz": fv.np_view, "torch": fv.torch_view}[fmt]


def _tensors(rows: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((rows, 8)).astype("f4"), "b": rng.standard_normal(40).astype("f8")}


def _build(fmt: str, d: os.PathLike[str], name: str = "m", rows: int = 16, **options: object) -> str:
    if fmt in ("safetensors", "torch"):
        require(fmt)
    return write_checkpoint(fmt, os.path.join(d, name + _EXT[fmt]), _tensors(rows), **options)


def _run(capsys: pytest.CaptureFixture, *args: object) -> int:
    capsys.readouterr()
    return main([os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args])


def _inject(capsys: pytest.CaptureFixture, src: str, mode: str, tmp: os.PathLike[str], count: int = 6
            ) -> tuple[str, str]:
    """(injected file, its log): ``file`` (-o, whole-file hashes), ``regions`` (-o --evidence regions) or
    ``direct`` (--in-place --direct on a copy)."""
    out, lp = os.path.join(tmp, "out" + os.path.splitext(src)[1]), os.path.join(tmp, "out.fflog")
    if mode == "direct":
        with open(src, "rb") as a, open(out, "wb") as b:
            b.write(a.read())
        args = [out, "--in-place", "--direct"]
    else:
        args = [src, "-o", out] + (["--evidence", "regions"] if mode == "regions" else [])
    assert _run(capsys, "inject", *args, "--seed", 5, "--count", count, "--log", lp, "-q") == 0
    return out, lp


def _edit_log(lp: str, bad: str, edit: Callable[[dict[str, bytes]], None]) -> str:
    """A copy of the log ``lp`` at ``bad`` with its members (name -> bytes) changed by ``edit``."""
    with zipfile.ZipFile(lp) as z:
        members = {n: z.read(n) for n in z.namelist()}
    edit(members)
    with zipfile.ZipFile(bad, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    return bad


def _flip_byte(member: str) -> Callable[[dict[str, bytes]], None]:
    def edit(m: dict[str, bytes]) -> None:
        b = bytearray(m[member])
        b[len(b) // 2] ^= 0x40
        m[member] = bytes(b)
    return edit


def _input_fingerprint(m: dict[str, bytes]) -> None:
    j = json.loads(m["manifest.json"])
    h = j["fingerprint"]["input"]["head"]
    j["fingerprint"]["input"]["head"] = ("1" if h[0] == "0" else "0") + h[1:]
    m["manifest.json"] = json.dumps(j).encode()


def _counting(counts: dict[str, int], real: Callable, key: str) -> Callable:
    """``real``, each call counted in ``counts[key]``."""
    def wrapped(*a: object, **kw: object) -> object:
        counts[key] += 1
        return real(*a, **kw)
    return wrapped


def _assert_reads_as(fmt: str, path: str, original: str) -> None:
    """The framework reads ``path`` as it reads ``original``: every tensor, word for word."""
    assert compare_readings(_view(fmt)(original), _view(fmt)(path)) == []


# ------------------------------------------------------------------ 1. a region-evidence log edited by hand


@pytest.mark.parametrize("fmt", ["hdf5", "safetensors", "npz", "torch"])
@pytest.mark.parametrize("mode", ["regions", "direct"])
@pytest.mark.parametrize("edit", [_flip_byte("undo_data.bin"), _input_fingerprint], ids=["old-bytes", "input-fp"])
def test_region_log_with_edited_old_bytes_is_refused_before_the_revert_writes(fmt, mode, edit, tmp_path, capsys):
    """A revert by region evidence checks the file is the logged output, then wrote the log's old bytes and only
    then found the result was not the logged input: the file was left changed (old bytes edited) or restored
    behind a refusal (the input fingerprint edited). The result's fingerprint is known before the write."""
    src = _build(fmt, tmp_path)
    out, lp = _inject(capsys, src, mode, tmp_path)
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), edit)
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "the log was changed after the injection" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0  # the true log still reverts it
    _assert_reads_as(fmt, out, src)
    with open(out, "rb") as a, open(src, "rb") as b:
        assert a.read() == b.read()


def _flip_old_byte_of_middle_range(m: dict[str, bytes]) -> None:
    """The old bytes of a touched range between the head and tail windows (neither fingerprint sees them)."""
    offs, lens = (np.load(io.BytesIO(m[n])) for n in ("undo_offsets.npy", "undo_lengths.npy"))
    i = next(k for k, o in enumerate(offs.tolist()) if (1 << 20) + 64 < o < 2 << 20)
    b = bytearray(m["undo_data.bin"])
    b[int(lens[:i].sum())] ^= 0x07
    m["undo_data.bin"] = bytes(b)


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_region_log_edited_between_the_fingerprint_windows_is_refused(fmt, tmp_path, capsys):
    """Old bytes edited in a range between the first and last MiB: the fingerprints cannot see it, so the revert
    wrote them and said it restored the file. The log's own old and new words, at the sites' offsets in the file,
    must be what its ranges hold."""
    src = _build(fmt, tmp_path, rows=(3 << 20) // 32)
    out, lp = _inject(capsys, src, "regions", tmp_path, count=60)  # some of them between the windows
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), _flip_old_byte_of_middle_range)
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "do not hold its recorded old and new words" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0
    _assert_reads_as(fmt, out, src)


def _stray_range(file: str, at: int) -> Callable[[dict[str, bytes]], None]:
    """One more touched range, 4 bytes at offset ``at``: its altered bytes those ``file`` holds, its original
    bytes other ones."""
    def edit(m: dict[str, bytes]) -> None:
        with open(file, "rb") as fh:
            fh.seek(at)
            now = fh.read(4)
        j = json.loads(m["manifest.json"])
        j["undo"]["ranges"] += 1
        m["manifest.json"] = json.dumps(j).encode()
        for name, value in (("undo_offsets", at), ("undo_lengths", 4)):
            a = np.load(io.BytesIO(m[name + ".npy"]))
            buf = io.BytesIO()
            np.save(buf, np.append(a, np.array(value, a.dtype)))
            m[name + ".npy"] = buf.getvalue()
        m["undo_data.bin"] += bytes(b ^ 0x55 for b in now)
        m["redo_data.bin"] += now
    return edit


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "torch", "hdf5-gzip"])
def test_region_log_with_an_added_range_between_the_windows_is_refused(fmt, tmp_path, capsys):
    """A range added to the log where no site lies, its altered bytes those the file holds (so the file passes as
    the logged output) and its original bytes junk: the revert wrote the junk into the middle of a tensor and said
    it restored the file. Every byte the ranges change must be a recorded word, a zip CRC field or a chunk the
    injection re-encodes (checked in the reverted copy)."""
    gzip = fmt == "hdf5-gzip"
    fmt = "hdf5" if gzip else fmt
    src = _build(fmt, tmp_path, rows=(3 << 20) // 32, **({"chunks": True, "compression": "gzip"} if gzip else {}))
    out, lp = _inject(capsys, src, "regions", tmp_path)
    with zipfile.ZipFile(lp) as z:
        taken = [(o, o + n) for o, n in zip(np.load(io.BytesIO(z.read("undo_offsets.npy"))).tolist(),
                                            np.load(io.BytesIO(z.read("undo_lengths.npy"))).tolist())]
    at = next(a for a in range((3 << 19), 2 << 20, 4) if all(b <= a or a + 4 <= lo for lo, b in taken))
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), _stray_range(out, at))
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "that are none of its recorded words" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0
    _assert_reads_as(fmt, out, src)


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "hdf5-gzip"])
def test_replay_of_a_region_log_with_edited_new_bytes_between_the_windows_is_refused(fmt, tmp_path, capsys):
    """The altered bytes of a range between the first and last MiB edited: replay wrote them and said the output
    was the logged one (its fingerprint cannot see them); nothing is written now (raw words: checked against the
    records before the copy; gzip chunks: re-encoded from the input before the copy and compared)."""
    gzip = fmt == "hdf5-gzip"
    fmt = "hdf5" if gzip else fmt
    src = _build(fmt, tmp_path, rows=(3 << 20) // 32, **({"chunks": True, "compression": "gzip"} if gzip else {}))
    out, lp = _inject(capsys, src, "regions", tmp_path, count=60)

    def edit(m: dict[str, bytes]) -> None:
        m["undo_data.bin"], m["redo_data.bin"] = m["redo_data.bin"], m["undo_data.bin"]
        _flip_old_byte_of_middle_range(m)
        m["undo_data.bin"], m["redo_data.bin"] = m["redo_data.bin"], m["undo_data.bin"]
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), edit)
    new = tmp_path / ("new" + _EXT[fmt])
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "replay", bad, src, "-o", new), tmp_path, before, "replay")
    assert ("do not hold the chunks (members) its recorded words re-encode to" if gzip
            else "do not hold its recorded old and new words") \
        in err and "nothing was written" in err
    assert _run(capsys, "replay", lp, src, "-o", new, "-q") == 0
    assert snapshot(new) == snapshot(out)


@pytest.mark.parametrize("mode", ["regions", "direct"])
def test_region_log_with_an_edited_gzip_chunk_between_the_windows_is_refused(mode, tmp_path, capsys):
    """A gzip-chunked HDF5 dataset: the log's ranges are re-encoded chunks, not words. Old bytes edited in one
    between the first and last MiB were written and the revert said it restored the file (h5py then failed to
    read the chunk). Such a revert is now made in a copy whose words are read back before it replaces the file."""
    rng = np.random.default_rng(0)
    src = write_checkpoint("hdf5", tmp_path / "m.h5", {"w": rng.standard_normal((3 << 20) // 4).astype("f4")},
                           chunks=(16384,), compression="gzip")
    out, lp = _inject(capsys, src, mode, tmp_path, count=40)
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), _flip_old_byte_of_middle_range)
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "gives other words than its recorded old words" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0
    _assert_reads_as("hdf5", out, src)


def _set_old_bytes(at: int, data: bytes) -> Callable[[dict[str, bytes]], None]:
    """The log's original bytes at file offsets ``at`` .. ``at + len(data) - 1`` (inside its ranges) set to
    ``data``."""
    def edit(m: dict[str, bytes]) -> None:
        offs, lens = (np.load(io.BytesIO(m[n])) for n in ("undo_offsets.npy", "undo_lengths.npy"))
        i = next(k for k, (o, n) in enumerate(zip(offs.tolist(), lens.tolist())) if o <= at and at + len(data) <= o + n)
        b = bytearray(m["undo_data.bin"])
        first = int(lens[:i].sum()) + at - int(offs[i])
        b[first:first + len(data)] = data
        m["undo_data.bin"] = bytes(b)
    return edit


def test_region_log_with_an_edited_zip_crc_field_between_the_windows_is_refused(tmp_path, capsys):
    """An .npz of three 1.2 MB members injected in place: one original byte of the middle member's local-header
    CRC-32 edited in the log (between the fingerprint windows). Only the field's place was checked: the revert
    wrote it and said the file matched the log (np.load reads the central directory's CRC and agreed). The log's
    CRC fields must change, every copy alike, by what its recorded words change the CRC by."""
    rng = np.random.default_rng(1)
    src = write_checkpoint("npz", tmp_path / "m.npz", {k: rng.standard_normal(300_000).astype("f4") for k in "abc"})
    out, lp = _inject(capsys, src, "direct", tmp_path, count=60)
    with zipfile.ZipFile(out) as z:
        field = z.getinfo("b.npy").header_offset + 14
    assert (1 << 20) < field < os.path.getsize(out) - (1 << 20)
    with open(src, "rb") as fh:
        fh.seek(field)
        was = fh.read(4)
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), _set_old_bytes(field, bytes([was[0] ^ 0x10]) + was[1:]))
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "do not change the CRC-32 fields of zip member b.npy" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0
    assert snapshot(out) == snapshot(src)


@pytest.mark.parametrize("mode", ["regions", "direct"])
def test_region_log_of_an_npz_whose_local_header_crc_is_zero_reverts_and_replays(mode, tmp_path, capsys):
    """An np.savez archive whose local header's CRC-32 field was zeroed (flag bit 3 clear; zipfile, and so np.load,
    reads only the central directory's). The injection leaves that field as it is, and the log's check wanted it
    changed like the directory's: revert and replay of the genuine log were refused. They give the input and the
    output back, byte for byte."""
    src = str(tmp_path / "m.npz")
    np.savez(src, **_tensors())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("w.npy")
    assert not info.flag_bits & 0x08
    with open(src, "r+b") as fh:
        fh.seek(info.header_offset + 14)
        fh.write(bytes(4))
    assert np.array_equal(np.load(src)["w"], _tensors()["w"])
    pristine = str(tmp_path / "pristine.npz")
    with open(src, "rb") as a, open(pristine, "wb") as b:
        b.write(a.read())
    out, lp = _inject(capsys, src, mode, tmp_path)
    injected = snapshot(out)
    assert injected != snapshot(pristine)
    new = tmp_path / "new.npz"
    assert _run(capsys, "replay", lp, pristine, "-o", new, "-q") == 0
    assert snapshot(new) == injected
    assert _run(capsys, "revert", lp, out, "-q") == 0
    assert snapshot(out) == snapshot(pristine)


def _gzip_checkpoint(d: os.PathLike[str]) -> str:
    """A 3 MiB gzip-chunked HDF5 dataset (64 KiB chunks, so most lie between the fingerprint windows)."""
    rng = np.random.default_rng(0)
    return write_checkpoint("hdf5", os.path.join(d, "m.h5"), {"w": rng.standard_normal((3 << 20) // 4).astype("f4")},
                            chunks=(16384,), compression="gzip")


def test_region_log_with_another_element_of_a_gzip_chunk_changed_is_refused(tmp_path, capsys):
    """The log's original bytes of a re-encoded gzip chunk replaced by that chunk re-encoded with another element
    (not a site) changed: the sites still read as the recorded old words and the bytes stay inside the chunk, so the
    revert wrote it and said it restored the file. The log's chunks must be what fastflip re-encodes from the
    reverted copy."""
    from fastflip.core.plan import Plan
    from fastflip.files.encoded import encoded_patches
    from fastflip.files.h5apply import route_sites
    from fastflip.files.layout import read_layout
    from fastflip.files.outputs import load_log

    src = _gzip_checkpoint(tmp_path)
    out, lp = _inject(capsys, src, "direct", tmp_path, count=40)
    plan = load_log(lp).plan
    sites = set(plan.index.tolist())
    for i in sorted(sites):
        other = Plan.from_sites([plan.tensors[0]], [0], [i + 1 if i + 1 not in sites else i - 1], xor_mask=[1 << 30])
        routes = route_sites(src, other, {t.path: t for t in read_layout(src).tensors})
        (at, _, crafted), = encoded_patches(src, other, routes, False).patches
        if (1 << 20) < at and at + len(crafted) < os.path.getsize(src) - (1 << 20):
            break
    else:
        pytest.fail("no site's chunk lies between the fingerprint windows")
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), _set_old_bytes(at, crafted))
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", bad, out), tmp_path, before, "revert")
    assert "do not hold the chunks (members) its recorded words re-encode to" in err
    assert _run(capsys, "revert", lp, out, "-q") == 0
    _assert_reads_as("hdf5", out, src)


def test_revert_without_verify_of_a_gzip_log_is_made_in_a_copy(tmp_path, capsys):
    """``revert --no-verify`` of a direct log with gzip chunks rewrote the file in place (the choice of a copy was
    made by the log check, which --no-verify skips); such a log is reverted in a copy renamed over the file, as the
    docs say, with or without verification."""
    src = _gzip_checkpoint(tmp_path)
    out, lp = _inject(capsys, src, "direct", tmp_path, count=40)
    inode = os.stat(out).st_ino
    assert _run(capsys, "revert", lp, out, "--no-verify", "-q") == 0
    assert os.stat(out).st_ino != inode
    _assert_reads_as("hdf5", out, src)


@pytest.mark.parametrize("fmt", ["hdf5-gzip", "npz"])
def test_region_revert_and_replay_read_the_layout_once(fmt, tmp_path, capsys, monkeypatch):
    """The log checks of a region revert and replay read the file's layout once and the words back only where
    some site is re-encoded (a gzip log's revert read the layout four times: src and copy, before and after)."""
    import fastflip.files.logwords as lw

    gzip = fmt == "hdf5-gzip"
    src = _gzip_checkpoint(tmp_path) if gzip else _build(fmt, tmp_path)
    out, lp = _inject(capsys, src, "direct", tmp_path, count=20)
    calls = {"layout": 0, "words": 0}
    monkeypatch.setattr(lw, "read_layout", _counting(calls, lw.read_layout, "layout"))
    monkeypatch.setattr(lw, "read_words", _counting(calls, lw.read_words, "words"))
    new = str(tmp_path / ("new" + os.path.splitext(src)[1]))
    assert _run(capsys, "replay", lp, src, "-o", new, "-q") == 0
    assert calls == {"layout": 1, "words": int(gzip)}
    calls.update(layout=0, words=0)
    assert _run(capsys, "revert", lp, out, "-q") == 0
    assert calls == {"layout": 1, "words": int(gzip)}
    assert snapshot(out) == snapshot(src)


# ------------------------------------------------------------------ 2. `fastflip log` of a log without file entries


@pytest.mark.parametrize("entry", [None, {"size": 5}], ids=["null", "no-path"])
def test_log_shows_a_log_whose_input_entry_is_null_or_has_no_path(entry, tmp_path, capsys):
    """``input`` may be null (the format allows it): ``fastflip log`` ended in an internal error."""
    src = _build("npz", tmp_path)
    _, lp = _inject(capsys, src, "file", tmp_path)

    def edit(m: dict[str, bytes]) -> None:
        j = json.loads(m["manifest.json"])
        j["input"] = entry
        m["manifest.json"] = json.dumps(j).encode()
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), edit)
    assert _run(capsys, "log", bad) == 0
    shown = capsys.readouterr().out
    assert "input  None sha256 None" in shown and "output " in shown


# ------------------------------------------------------------------ 3. revert twice, revert after replay


@pytest.mark.parametrize("fmt", ["hdf5", "torch"])
def test_a_second_revert_says_the_file_is_already_the_input(fmt, tmp_path, capsys):
    """Reverting a file twice (whole-file hashes) is refused in one line that says what happened (it used to say
    only that the file is not the logged output); a replay of the log is reverted by it again."""
    src = _build(fmt, tmp_path, compression="gzip", chunks=True) if fmt == "hdf5" else _build(fmt, tmp_path)
    out, lp = _inject(capsys, src, "file", tmp_path)
    assert _run(capsys, "revert", lp, out, "-q") == 0
    _assert_reads_as(fmt, out, src)
    before = snapshot(tmp_path)
    err = assert_refused(capsys, _run(capsys, "revert", lp, out), tmp_path, before, "revert")
    assert "is already the logged input" in err
    again = str(tmp_path / ("again" + _EXT[fmt]))
    assert _run(capsys, "replay", lp, out, "-o", again, "-q") == 0  # ``out`` holds the original bytes again
    assert _run(capsys, "revert", lp, again, "-q") == 0
    _assert_reads_as(fmt, again, src)


# ------------------------------------------------------------------ 4. kills during revert and replay


def _killed(argv: list[str], how: str, at: int) -> None:
    """Run ``fastflip ARGV`` in a forked child that SIGKILLs itself just before its ``at``-th ``os.replace`` /
    ``os.rename`` (``how`` "replace") or ``os.fsync`` ("fsync"), or just after the ``-at``-th (``at`` < 0)."""
    from crash_worker import _around

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            calls = [0]
            if how == "replace":
                os.replace, os.rename = (_around(os.replace, at, signal.SIGKILL, calls),
                                         _around(os.rename, at, signal.SIGKILL, calls))
            else:
                os.fsync = _around(os.fsync, at, signal.SIGKILL, calls)
            code = main(argv) or 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def _points(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> dict[str, int]:
    """How many renames and fsyncs an uninterrupted ``run()`` makes."""
    counts = {"replace": 0, "fsync": 0}
    with monkeypatch.context() as m:
        m.setattr(os, "replace", _counting(counts, os.replace, "replace"))
        m.setattr(os, "rename", _counting(counts, os.rename, "replace"))
        m.setattr(os, "fsync", _counting(counts, os.fsync, "fsync"))
        run()
    return counts


@pytest.mark.parametrize("fmt,mode", [("npz", "file"), ("hdf5", "file"), ("npz", "regions"), ("safetensors", "direct")])
def test_revert_and_replay_killed_at_every_rename_and_fsync(fmt, mode, tmp_path, capsys, monkeypatch):
    """SIGKILL before and after each rename and fsync of ``revert LOG FILE`` (in place) and ``replay LOG IN -o
    NEW``: the file is the injected one or the original, bit for bit; a second revert completes it or says in
    one line that it already is the original; the new file of a killed replay is absent or the logged output."""
    src = _build(fmt, tmp_path)
    out, lp = _inject(capsys, src, mode, tmp_path)
    original, injected = snapshot(src), snapshot(out)  # (direct: ``out`` is a copy injected in place)
    new = str(tmp_path / ("new" + _EXT[fmt]))

    def reset(path: str, data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
    pristine = str(tmp_path / ("pristine" + _EXT[fmt]))
    reset(pristine, original)
    reset(out, injected)
    revert_points = _points(monkeypatch, lambda: main(["revert", lp, out, "-q"]))
    replay_points = _points(monkeypatch, lambda: main(["replay", lp, pristine, "-o", new, "-q"]))
    assert snapshot(out) == original and snapshot(new) == injected
    assert sum(revert_points.values()) and sum(replay_points.values())  # points to kill at
    for how in ("replace", "fsync"):
        for at in [k for n in range(1, revert_points[how] + 1) for k in (n, -n)]:
            reset(out, injected)
            _killed(["revert", lp, out, "-q"], how, at)
            now = snapshot(out)
            assert now in (injected, original), (how, at, "revert left a third state")
            rc = _run(capsys, "revert", lp, out)
            err = capsys.readouterr().err.strip()
            if now == injected or mode != "file":  # a region log also takes back a file already reverted
                assert rc == 0, (how, at, err)
            else:
                assert rc == 2 and len(err.splitlines()) == 1 and "is already the logged input" in err, (how, at, err)
            assert snapshot(out) == original
            _assert_reads_as(fmt, out, pristine)
        for at in [k for n in range(1, replay_points[how] + 1) for k in (n, -n)]:
            os.unlink(new)
            _killed(["replay", lp, pristine, "-o", new, "-q"], how, at)
            assert not os.path.exists(new) or snapshot(new) == injected, (how, at, "replay left a third state")
            assert _run(capsys, "replay", lp, pristine, "-o", new, "--force", "-q") == 0
            assert snapshot(new) == injected and snapshot(pristine) == original


# ------------------------------------------------------------------ 5. a log that inflates to more than a log holds


def test_a_manifest_that_declares_more_than_a_log_holds_is_refused_unread(tmp_path, capsys, monkeypatch):
    """A small .fflog whose manifest.json inflates past the manifest limit (a deflate bomb: here the limit is
    lowered so the test stays small) is refused in one line; ``json.loads`` read the whole of it before."""
    from fastflip.files import log as logmod

    src = _build("npz", tmp_path)
    out, lp = _inject(capsys, src, "file", tmp_path)

    def pad(m: dict[str, bytes]) -> None:
        j = json.loads(m["manifest.json"])
        j["padding"] = " " * 5000
        m["manifest.json"] = json.dumps(j).encode()
    bad = _edit_log(lp, str(tmp_path / "bad.fflog"), pad)
    monkeypatch.setattr(logmod, "_MAX_MANIFEST_BYTES", 4096)
    before = snapshot(tmp_path)
    for cmd in (["log", bad], ["revert", bad, out], ["replay", bad, src, "-o", tmp_path / "new.npz"]):
        err = assert_refused(capsys, _run(capsys, *cmd), tmp_path, before, cmd[0])
        assert "manifest.json declares" in err


@pytest.mark.parametrize("member", ["undo_data.bin", "redo_data.bin"])
def test_undo_bytes_beyond_what_the_ranges_need_are_refused_unread(member, tmp_path, capsys):
    """A log whose undo_data.bin / redo_data.bin declares more bytes than its ranges hold (a deflate bomb inflates a
    small .fflog to gigabytes) is refused in one line before the member is inflated; it was read whole."""
    src = _build("npz", tmp_path)
    out, lp = _inject(capsys, src, "regions", tmp_path)
    with zipfile.ZipFile(lp) as z:
        members = {n: z.read(n) for n in z.namelist()}
    bad = str(tmp_path / "bad.fflog")
    with zipfile.ZipFile(bad, "w") as z:
        for n, b in members.items():
            z.writestr(n, b + bytes(1 << 20) if n == member else b, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(bad) < os.path.getsize(lp) + (64 << 10)
    before = snapshot(tmp_path)
    for cmd in (["log", bad], ["revert", bad, out], ["replay", bad, src, "-o", tmp_path / "new.npz"]):
        err = assert_refused(capsys, _run(capsys, *cmd), tmp_path, before, cmd[0])
        assert f"{member} declares" in err, err


@pytest.mark.parametrize("member", ["manifest.json", "old_word.npy", "undo_data.bin"])
def test_a_log_holding_two_members_of_one_name_is_refused(member, tmp_path, capsys):
    """A log archive with a second member of one name (zipfile reads the last, another reader may take the first)
    is refused in one line by log, revert and replay; nothing is written."""
    src = _build("npz", tmp_path)
    out, lp = _inject(capsys, src, "regions", tmp_path)
    bad = str(tmp_path / "bad.fflog")
    with zipfile.ZipFile(lp) as z:
        members = [(n, z.read(n)) for n in z.namelist()]
    assert member in dict(members)
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(bad, "w") as z:
        for n, b in members + [(member, dict(members)[member])]:
            z.writestr(n, b)
    before = snapshot(tmp_path)
    for cmd in (["log", bad], ["revert", bad, out], ["replay", bad, src, "-o", tmp_path / "new.npz"]):
        err = assert_refused(capsys, _run(capsys, *cmd), tmp_path, before, cmd[0])
        assert f"two members named {member}" in err, err
