"""Region evidence and the copy paths at their edges: a kernel that refuses ``copy_file_range`` (another file
system), ``--no-verify`` on a region log, the h5py notes, and what replay reads.

Outputs are judged against the log and against the whole-file-hash mode's output byte for byte.
"""

from __future__ import annotations

import errno
import warnings
import os
import struct
import zipfile

import h5py
import numpy as np
import pytest

from fastflip import Sampling
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay

needs_kernel_copy = pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no os.copy_file_range here")


def _h5(path, n: int = 1 << 18) -> str:
    with h5py.File(path, "w") as f:
        f["w"] = (np.random.default_rng(0).standard_normal(n) * 0.05).astype("f4")
        f["b"] = np.linspace(-1, 1, 64, dtype="f4")
    return str(path)


def _refusing(monkeypatch, after: int | None) -> list[int]:
    """``os.copy_file_range`` that raises EXDEV at once (``after`` None) or after copying ``after`` bytes of its
    first call; returns the byte counts asked for."""
    real = os.copy_file_range
    asked: list[int] = []

    def fake(fd_in, fd_out, count, offset_src=None, offset_dst=None):
        asked.append(count)
        if after is not None and len(asked) == 1:
            return real(fd_in, fd_out, min(after, count), offset_src, offset_dst)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", fake)
    return asked


def _spy(monkeypatch, module, name: str) -> list[str]:
    """Replace ``module.name`` by a wrapper that records the (absolute) path each call is given first."""
    real = getattr(module, name)
    seen: list[str] = []

    def spy(path, *a, **k):
        seen.append(os.path.abspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(module, name, spy)
    return seen


@needs_kernel_copy
@pytest.mark.parametrize("after", [None, 12345])
def test_regions_across_file_systems(tmp_path, monkeypatch, after):
    """copy_file_range refused (EXDEV, at once or part way): inject --evidence regions and its replay still write
    exactly the output the whole-file-hash mode writes."""
    src = _h5(tmp_path / "in.h5")
    ref = inject_file(src, str(tmp_path / "ref.h5"), sampling=Sampling(count=6), seed=4, log_path=False)
    asked = _refusing(monkeypatch, after)
    out = str(tmp_path / "out.h5")
    res = inject_file(src, out, sampling=Sampling(count=6), seed=4, hash_files="regions")
    assert asked  # the kernel was asked, and refused
    want = open(tmp_path / "ref.h5", "rb").read()
    assert open(out, "rb").read() == want
    assert np.array_equal(res.log.new_words, ref.log.new_words)
    again = replay(res.log_path, src, str(tmp_path / "again.h5"), log_path=False)
    assert open(again.output, "rb").read() == want


def test_new_file_regions_reads_the_input_windows_once(tmp_path, monkeypatch):
    """Copy mode with region evidence takes the input's fingerprint once (with the prediction) and does not read
    its windows again to check them; the output is still checked."""
    from fastflip.files import fingerprint as fpmod

    src = _h5(tmp_path / "in.h5")
    seen = _spy(monkeypatch, fpmod, "_windows")  # every reading of a file's head and tail windows
    out = str(tmp_path / "out.h5")
    inject_file(src, out, sampling=Sampling(count=6), seed=4, hash_files="regions")
    assert seen.count(os.path.abspath(src)) == 1  # the prediction's reading, not a second one to check it
    assert len(seen) == 2  # the output was checked (its temporary copy, before the rename)


def test_replay_of_a_regions_log_walks_no_layout_of_its_output(tmp_path, monkeypatch):
    """The replayed copy is checked by its touched ranges (replay_regions): the output's layout is not walked
    again to read the words back; the output is still exactly the logged one."""
    from fastflip.files import replay as replay_mod

    src = _h5(tmp_path / "in.h5")
    res = inject_file(src, str(tmp_path / "out.h5"), sampling=Sampling(count=6), seed=4, hash_files="regions")
    walked = _spy(monkeypatch, replay_mod, "read_layout")
    again = replay(res.log_path, src, str(tmp_path / "again.h5"), log_path=False)
    assert [p for p in walked if p != os.path.abspath(src)] == []
    assert open(again.output, "rb").read() == open(tmp_path / "out.h5", "rb").read()
    assert np.array_equal(again.log.new_words, res.log.new_words)


def _flip_byte(path: str, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ 0xFF]))


@pytest.mark.parametrize("tamper", [False, True])
def test_no_verify_on_a_regions_log_still_checks_the_result(tmp_path, capsys, tamper):
    """``revert --no-verify`` of a region log writes the logged original bytes and still checks the result:
    the logged output gives the original back (verified); a file of the logged size that differs in its head
    window is written all the same, and reported as not verified."""
    from fastflip.cli import main
    from fastflip.files.revert import revert

    src = _h5(tmp_path / "in.h5")
    orig = open(src, "rb").read()
    out = str(tmp_path / "out.h5")
    res = inject_file(src, out, sampling=Sampling(count=6), seed=4, hash_files="regions")
    if tamper:
        _flip_byte(out, 200)  # in the head window, in no touched range
    r = revert(res.log_path, out, str(tmp_path / "api.h5"), verify=False)
    assert r.verified is (not tamper) and r.evidence == "regions"
    assert main(["revert", res.log_path, out, "--no-verify"]) == 0
    said = capsys.readouterr().out
    got = open(out, "rb").read()
    assert got == open(tmp_path / "api.h5", "rb").read()
    differ = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(orig, np.uint8)).tolist()
    assert differ == ([200] if tamper else [])  # the touched ranges were written either way
    assert ("NOT verified" in said) is tamper and ("match the log" in said) is (not tamper), said


def _notes(caught) -> list[str]:
    return [str(w.message) for w in caught if "go through h5py" in str(w.message)]


def test_h5py_note_only_where_h5py_writes(tmp_path, monkeypatch):
    """Chunks fastflip cannot re-encode (lossless scale-offset integers): a direct run and a region-evidence run refuse them with
    their one-line error and no note that h5py would write them; a later copy in the same process that does send
    them through h5py says so."""
    from fastflip.errors import OptionError
    from fastflip.files import h5chunks

    monkeypatch.setattr(h5chunks, "_SAID", set())
    src = str(tmp_path / "so.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.arange(-2048, 2048, dtype="i4"), chunks=(512,), scaleoffset=0)
    before = open(src, "rb").read()
    tries = [dict(dst=None, in_place=True, atomic=False), dict(dst=str(tmp_path / "r.h5"), hash_files="regions")]
    for kw in tries:
        dst = kw.pop("dst")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(OptionError) as exc:
                inject_file(src, dst, sampling=Sampling(count=4), seed=1, log_path=False, **kw)
        assert "\n" not in str(exc.value) and _notes(caught) == [], _notes(caught)
    assert open(src, "rb").read() == before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inject_file(src, str(tmp_path / "out.h5"), sampling=Sampling(count=4), seed=1, log_path=False)
    said = [w for w in caught if "go through h5py" in str(w.message)]
    assert len(said) == 1 and "scaleoffset" in str(said[0].message)
    assert said[0].filename == __file__  # points at the caller, not at fastflip's insides


@pytest.mark.parametrize("in_place", [False, True])
def test_cli_refuses_regions_for_a_directory_in_the_library_s_line(tmp_path, capsys, in_place):
    """``inject DIR --evidence regions``: the library's refusal is the CLI's one line, naming the fix; nothing is
    written."""
    from fastflip.cli import main
    from format_builders import write_checkpoint_dir
    from test_sharded_commit import shards

    src = write_checkpoint_dir(str(tmp_path / "model"), n_shards=2, rows=8)
    before = shards(src)
    where = ["--in-place"] if in_place else ["-o", str(tmp_path / "out")]
    assert main(["inject", src, *where, "--evidence", "regions", "--count", "2", "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and src in err and "drop --evidence regions" in err, err
    assert shards(src) == before and not os.path.exists(tmp_path / "out")


def _samples(d) -> dict[str, str]:
    """Files of every kind the .keras gate must tell apart, and paths that are no file."""
    import zipfile

    import torch

    from safetensors.numpy import save_file

    out = {"h5": _h5(d / "a.h5", 64), "npy": str(d / "a.npy"), "npz": str(d / "a.npz"), "st": str(d / "a.st"),
           "pt": str(d / "a.pt"), "keras": str(d / "m.keras"), "foreign": str(d / "f.zip"), "torn": str(d / "t.zip"),
           "empty": str(d / "e.bin"), "text": str(d / "t.txt"), "missing": str(d / "nope"), "dir": str(d),
           "disks": str(d / "s.zip")}
    np.save(out["npy"], np.zeros(3))
    np.savez(out["npz"], a=np.zeros(3))
    save_file({"w": np.zeros(3, "f4")}, out["st"])
    torch.save({"w": torch.zeros(3)}, out["pt"])
    with zipfile.ZipFile(out["keras"], "w") as z:
        z.writestr("metadata.json", "{}")
        z.writestr("model.weights.h5", open(out["h5"], "rb").read())
    with zipfile.ZipFile(out["foreign"], "w") as z:
        z.writestr("readme.txt", "hi")
    with open(out["keras"], "rb") as fh:
        torn = fh.read()[:-30]
    # a ZIP64 locator naming two disks before the end record: zipfile.is_zipfile raises BadZipFile on it
    disks = b"PK\x06\x07" + struct.pack("<IQI", 0, 0, 2) + b"PK\x05\x06" + bytes(18)
    for key, data in (("torn", torn), ("empty", b""), ("text", b"just some text\n"), ("disks", disks)):
        with open(out[key], "wb") as fh:
            fh.write(data)
    return out


def test_keras_gate_agrees_with_the_archive_code_and_lists_once(tmp_path, monkeypatch):
    """archives.is_keras_archive gives keras_archive.is_keras_archive's answer for every kind of file and path,
    and lists a real archive's zip directory once."""
    from conftest import require

    require("torch")
    require("safetensors")
    from fastflip.files import archives, keras_archive
    from fastflip.files.formats import zipraw

    d = tmp_path / "s"
    d.mkdir()
    paths = _samples(d)
    got = {k: archives.is_keras_archive(p) for k, p in paths.items()}
    assert got == {k: keras_archive.is_keras_archive(p) for k, p in paths.items()}
    assert got["keras"] and not got["npz"] and not got["pt"] and not got["h5"]
    listed = _spy(monkeypatch, zipraw, "directory")
    assert archives.is_keras_archive(paths["keras"]) and len(listed) == 1


@pytest.mark.parametrize("exc", [OSError, zipfile.BadZipFile, ValueError, EOFError])
def test_one_zip_pre_check_for_the_gate_and_the_archive_code(exc, tmp_path, monkeypatch):
    """The gate and the archive code ask one zip pre-check (formats.is_zip): a zip that zipfile cannot tell
    (it raises) is no archive for either, and the archive code refuses it in one line."""
    from fastflip.errors import InputFileError
    from fastflip.files import archives, keras_archive

    p = str(tmp_path / "m.keras")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("model.weights.h5", b"")
    asked = []

    def raises(path):
        asked.append(path)
        raise exc("an end record zipfile cannot read")

    monkeypatch.setattr(zipfile, "is_zipfile", raises)
    assert not archives.is_keras_archive(p) and not keras_archive.is_keras_archive(p)
    with pytest.raises(InputFileError, match="not a .keras archive") as err:
        keras_archive.check_archive(p)
    assert "\n" not in str(err.value) and asked
    assert keras_archive.is_zip is archives.is_zip  # the archive code's pre-check is the gate's


def test_new_file_regions_refuses_an_input_changed_before_the_copy(tmp_path, monkeypatch):
    """A word of the input rewritten after the prediction, before the kernel copy: refused in one line, and
    neither the output nor its log is left."""
    from fastflip.errors import LogMismatchError
    from fastflip.files import fingerprint

    src = _h5(tmp_path / "in.h5")
    probe = inject_file(src, str(tmp_path / "probe.h5"), sampling=Sampling(count=6), seed=4, hash_files="regions")
    at = int(probe.log.undo.offsets[0])
    real = fingerprint.kernel_copy  # the copy of copyregions.write_copy_regions (fingerprint.copy_over_ranges)

    def meddle(a, b, **kw):
        _flip_byte(a, at)
        return real(a, b, **kw)

    monkeypatch.setattr(fingerprint, "kernel_copy", meddle)
    out = tmp_path / "out.h5"
    with pytest.raises(LogMismatchError, match="changed while it was being copied") as exc:
        inject_file(src, str(out), sampling=Sampling(count=6), seed=4, hash_files="regions")
    assert "\n" not in str(exc.value)
    assert not out.exists() and not os.path.exists(str(out) + ".fflog")


@needs_kernel_copy
def test_short_reads_are_read_on(tmp_path, monkeypatch):
    """A read that returns fewer bytes than asked (a signal, a network file system) is read on, not taken for the
    end of the file: the buffered copy behind a refused kernel copy, and a checked range write."""
    import numpy as np

    from fastflip.files.filebytes import kernel_copy
    from fastflip.files.rangeio import write_ranges

    data = np.random.default_rng(3).integers(0, 256, 300_000, np.uint8).tobytes()
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    real = os.preadv
    calls: list[int] = []

    def short(fd, buffers, offset):
        calls.append(offset)
        return real(fd, [memoryview(buffers[0])[:1000]], offset)

    monkeypatch.setattr(os, "preadv", short)
    _refusing(monkeypatch, None)
    kernel_copy(str(src), str(dst))
    assert dst.read_bytes() == data and len(calls) > 1
    with open(dst, "r+b", buffering=0) as fh:  # 5000 bytes checked against what they hold, then rewritten
        bad = write_ranges(fh.fileno(), [10], [5000], bytes(5000), data[10:5010], native=False)
    assert bad == -1 and dst.read_bytes() == data[:10] + bytes(5000) + data[5010:]


def test_replay_of_a_regions_log_passes_over_the_touched_ranges_once(tmp_path, monkeypatch):
    """replay of a region log writes its copy's touched ranges in the one pass that checks them (one range pass,
    no fsync of its own before the commit's); a source whose touched byte differs is refused, nothing written."""
    from fastflip.errors import LogMismatchError
    from fastflip.files import filebytes, fingerprint, rangeio

    src = _h5(tmp_path / "in.h5", n=1 << 20)  # touched bytes between the 1 MiB windows
    res = inject_file(src, str(tmp_path / "out.h5"), sampling=Sampling(count=6), seed=4, hash_files="regions")
    passes: list[bool] = []  # one per pass: whether it wrote
    real = rangeio.write_ranges

    def counted(fd, offsets, lengths, new, old=None, **kw):
        passes.append(new is not None)
        return real(fd, offsets, lengths, new, old, **kw)

    for module in (fingerprint, filebytes):
        monkeypatch.setattr(module, "write_ranges", counted)
    syncs = _spy_fsync(monkeypatch)
    again = replay(res.log_path, src, str(tmp_path / "again.h5"), log_path=False)
    assert passes == [True] and open(again.output, "rb").read() == open(tmp_path / "out.h5", "rb").read()
    assert syncs and len(syncs) == len(set(syncs))  # the output fsynced once, at the commit
    lg = res.log
    k = next(i for i, o in enumerate(lg.undo.offsets.tolist()) if 1 << 20 < o < os.path.getsize(src) - (1 << 20))
    at = int(lg.undo.offsets[k])
    with open(src, "r+b") as fh:  # a touched byte outside the head and tail windows
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ 0xFF]))
    with pytest.raises(LogMismatchError, match="is not the logged input .*touched range differ"):
        replay(res.log_path, src, str(tmp_path / "bad.h5"), log_path=False)
    assert not os.path.exists(tmp_path / "bad.h5")


def _spy_fsync(monkeypatch) -> list[int]:
    """The inodes ``os.fsync`` is called on from now on."""
    real = os.fsync
    seen: list[int] = []

    def spy(fd):
        seen.append(os.fstat(fd).st_ino)
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen
