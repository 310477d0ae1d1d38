"""Compressed .npz (np.savez_compressed) members: inflated, patched, re-deflated; read back by np.load;
revert bit for bit; damaged and unsupported archives refused in one line with nothing written."""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib

import numpy as np
import pytest

from conftest import assert_refused, snapshot
from fastflip.core import reference
from fastflip.cli import main
from fastflip.errors import OptionError
from fastflip.files.filebytes import hash_file, sha256_file
from fastflip.files.formats.deflatefit import deflate_exact
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout
from format_contract import check_format
from framework_views import assert_valid_zip


def np_load(path):
    with np.load(path) as z:
        return {"/" + k: z[k] for k in z.files}


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {"conv1.weight": rng.standard_normal((64, 3, 7, 7)).astype("<f4"),
            "fc.weight": rng.standard_normal((10, 64)).astype(">f8"),
            "fc.bias": rng.standard_normal(10).astype("<f2"),
            "bn1.running_var": np.ones(16, "<f4"), "bn1.num_batches_tracked": np.int64(7),
            "zeros": np.zeros(200, "<i4")}


def _same_members_except(a, b, changed):
    """Every member other than ``changed`` keeps its stored (compressed) bytes and CRC."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        assert list(ia) == list(ib)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            for name in ia:
                if name in changed:
                    continue
                x, y = ia[name], ib[name]
                assert (x.CRC, x.compress_size) == (y.CRC, y.compress_size)
                fa.seek(x.header_offset + 26)
                fb.seek(y.header_offset + 26)
                (na, xa), (nb, xb) = struct.unpack("<HH", fa.read(4)), struct.unpack("<HH", fb.read(4))
                fa.seek(x.header_offset + 30 + na + xa)
                fb.seek(y.header_offset + 30 + nb + xb)
                assert fa.read(x.compress_size) == fb.read(y.compress_size), name


def test_compressed_npz_contract(tmp_path):
    p = str(tmp_path / "w.npz")
    np.savez_compressed(p, **_arrays())
    lay = read_layout(p)
    assert lay.format == "npz" and len(lay.tensors) == 6 and not lay.skipped
    assert all(t.storage == "filtered" and t.filters == ("deflate",) for t in lay.tensors)
    assert {t.path: t.role for t in lay.tensors}["/bn1.running_var"] == "bn-statistic"
    # every member may be hit: some keep their size (padded streams), small ones grow (spliced archive)
    check_format(p, np_load, str(tmp_path), fmt="npz", count=40, non_atomic=False, direct=True)


def _inject_member(tmp_path, data_seed, member, **kw):
    """A compressed .npz of _arrays(data_seed), and an injection into one member: (input, arrays, its digest, output, result)."""
    p = str(tmp_path / "w.npz")
    arrays = _arrays(data_seed)
    np.savez_compressed(p, **arrays)
    out = str(tmp_path / "o.npz")
    return p, arrays, hash_file(p), out, inject_file(p, out, selection={"include": [member]}, **kw)


def test_member_keeps_its_size_and_others_their_bytes(tmp_path):
    p, arrays, before, out, res = _inject_member(tmp_path, 1, "/conv1.weight", seed=5, count=30)
    assert os.path.getsize(out) == os.path.getsize(p)  # random-looking data: the re-deflated stream fits
    assert res.log.manifest["undo"]["ranges"] <= 3 + 1  # the member's bytes and its CRC fields
    _same_members_except(p, out, {"conv1.weight.npy"})
    want = {"/" + k: np.array(v) for k, v in arrays.items()}
    _, new = reference.apply_plan(want, res.log.plan)
    assert np.array_equal(new, res.log.new_words)
    assert np.load(out)["conv1.weight"].tobytes() == want["/conv1.weight"].tobytes()
    # in place without a temporary copy (the campaign path): same bytes as the copy
    work = str(tmp_path / "work.npz")
    open(work, "wb").write(open(p, "rb").read())
    inject_file(work, in_place=True, atomic=False, plan=res.log.plan, log_path=str(tmp_path / "w.fflog"))
    assert sha256_file(work) == sha256_file(out)
    assert revert(str(tmp_path / "w.fflog"), work).digest == before


def test_member_that_grows_moves_the_rest(tmp_path):
    p, arrays, before, out, res = _inject_member(tmp_path, 2, "/bn1.running_var", seed=1, count=5, bits="exponent")
    assert os.path.getsize(out) > os.path.getsize(p)  # nine bytes of ones do not hold five random exponents
    assert_valid_zip(out)
    _same_members_except(p, out, {"bn1.running_var.npy"})
    got = np_load(out)
    want = {"/" + k: np.array(v) for k, v in arrays.items()}
    reference.apply_plan(want, res.log.plan)
    for k, v in want.items():
        assert got[k].tobytes() == v.tobytes(), k
    rep = replay(res.log_path, p, str(tmp_path / "rep.npz"))
    assert sha256_file(rep.output) == sha256_file(out)
    work = str(tmp_path / "work.npz")
    open(work, "wb").write(open(p, "rb").read())
    with pytest.raises(OptionError, match="atomic=True"):  # no in-place rewrite of a member that moves the rest
        inject_file(work, in_place=True, atomic=False, plan=res.log.plan, log_path=False)
    assert hash_file(work) == before  # refused before anything was written
    assert revert(res.log_path, out).digest == before
    assert hash_file(out) == before


class Unseekable(io.RawIOBase):
    """A file zipfile cannot seek in: it writes data descriptors (flag bit 3) after each member."""

    def __init__(self, fh):
        self.fh = fh

    def writable(self):
        return True

    def write(self, b):
        return self.fh.write(b)


def _archive(path, members, *, stream=False, methods=None):
    """A zip written by zipfile itself: ``stream`` writes to an unseekable file (data descriptors, flag bit 3)."""
    with open(path, "wb") as raw:
        target = Unseekable(raw) if stream else raw
        with zipfile.ZipFile(target, "w") as z:
            for name, arr in members.items():
                buf = io.BytesIO()
                np.save(buf, arr)
                method = (methods or {}).get(name, zipfile.ZIP_DEFLATED)
                z.writestr(name + ".npy", buf.getvalue(),
                           compress_type=method)


@pytest.mark.parametrize("stream", [False, True])
def test_mixed_stored_and_deflated_members(tmp_path, stream):
    arrays = _arrays(3)
    p = str(tmp_path / "m.npz")
    _archive(p, arrays, stream=stream, methods={"fc.weight": zipfile.ZIP_STORED, "zeros": zipfile.ZIP_STORED})
    with zipfile.ZipFile(p) as z:
        assert all(bool(i.flag_bits & 8) == stream for i in z.infolist())
    lay = read_layout(p)
    kinds = {t.path: t.storage for t in lay.tensors}
    assert kinds["/fc.weight"] == "contiguous" and kinds["/conv1.weight"] == "filtered"
    before = hash_file(p)
    # a member that grows and stored members hit in one injection
    out = str(tmp_path / "o.npz")
    res = inject_file(p, out, seed=4, count=12, bits="exponent",
                      selection={"include": ["/bn1.running_var", "/fc.weight", "/zeros"]})
    assert_valid_zip(out)
    got, want = np_load(out), {"/" + k: np.array(v) for k, v in arrays.items()}
    reference.apply_plan(want, res.log.plan)
    for k, v in want.items():
        assert got[k].tobytes() == v.tobytes(), k
    assert revert(res.log_path, out).digest == before
    check_format(p, np_load, str(tmp_path), fmt="npz", count=20, non_atomic=False, direct=True)


def test_savez_compressed_to_a_stream_grows(tmp_path):
    """np.savez_compressed into an unseekable file: zip64 local fields holding zeros and zip64 data descriptors
    (flag bit 3) hold the sizes; a member that grows gets its descriptor fixed, the local fields left alone."""
    p = str(tmp_path / "s.npz")
    with open(p, "wb") as raw:
        np.savez_compressed(Unseekable(raw), a=np.ones(300, "<f4"), b=np.arange(50.0))
    with zipfile.ZipFile(p) as z:
        assert all(i.flag_bits & 8 for i in z.infolist())
    before = hash_file(p)
    out = str(tmp_path / "o.npz")
    res = inject_file(p, out, seed=1, count=3, bits="exponent", selection={"include": ["/a"]})
    assert os.path.getsize(out) > os.path.getsize(p)
    assert_valid_zip(out)
    with zipfile.ZipFile(out) as z:
        info = z.getinfo("a.npy")
    raw = open(out, "rb").read()
    nlen, xlen = struct.unpack("<HH", raw[26:30])
    assert raw[30 + nlen:30 + nlen + xlen] == open(p, "rb").read()[30 + nlen:30 + nlen + xlen]  # local zip64 field
    end = 30 + nlen + xlen + info.compress_size
    assert raw[end:end + 4] == b"PK\x07\x08"
    assert struct.unpack("<IQQ", raw[end + 4:end + 24]) == (info.CRC, info.compress_size, info.file_size)
    want = {"/a": np.ones(300, "<f4"), "/b": np.arange(50.0)}
    reference.apply_plan(want, res.log.plan)
    got = np_load(out)
    assert all(got[k].tobytes() == v.tobytes() for k, v in want.items())
    assert revert(res.log_path, out).digest == before


def test_object_member_copied_never_unpickled(tmp_path, capsys):
    p = str(tmp_path / "o.npz")
    np.savez_compressed(p, w=np.arange(50, dtype="<f4"), meta=np.array([{"epoch": 3}], dtype=object))
    lay = read_layout(p)
    assert [t.path for t in lay.tensors] == ["/w"] and lay.skipped[0].reason.startswith("object array")
    out = tmp_path / "x.npz"
    assert main(["inject", p, "-o", str(out), "--include", "/meta"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "object array" in err and not out.exists()
    res = inject_file(p, str(out), seed=1, count=3)
    _same_members_except(p, str(out), {"w.npy"})
    assert np.load(str(out), allow_pickle=True)["meta"][0] == {"epoch": 3}
    assert revert(res.log_path, str(out)).digest == hash_file(p)


def _member_spots(path, name):
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
        cd = z.start_dir
    return info, cd


def _refused(tmp_path, capsys, p, msg):
    before = snapshot(tmp_path)
    rc = main(["inject", str(p), "-o", str(tmp_path / "refused.npz"), "--count", "5", "--seed", "1"])
    err = assert_refused(capsys, rc, tmp_path, before)
    assert msg in err, err


def test_refusals(tmp_path, capsys, monkeypatch):
    good = str(tmp_path / "good.npz")
    np.savez_compressed(good, a=np.random.default_rng(0).standard_normal(300).astype("f4"), b=np.ones(4, "f8"))
    data = open(good, "rb").read()
    info, _ = _member_spots(good, "a.npy")
    # truncated anywhere: one line, nothing written
    for keep in (len(data) - 10, len(data) // 2, 40):
        p = tmp_path / f"trunc{keep}.npz"
        p.write_bytes(data[:keep])
        _refused(tmp_path, capsys, p, "")
    # the recorded CRC-32 does not match the member (local header and directory agree with each other)
    bad = bytearray(data)
    crc = struct.pack("<I", info.CRC)
    wrong = struct.pack("<I", info.CRC ^ 0x1)
    assert bad.count(crc) == 2
    bad = bytearray(bytes(bad).replace(crc, wrong))
    p = tmp_path / "crc.npz"
    p.write_bytes(bad)
    _refused(tmp_path, capsys, p, "CRC-32")
    # a damaged deflate stream
    bad = bytearray(data)
    nlen, xlen = struct.unpack("<HH", bad[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + nlen + xlen
    bad[start:start + 8] = b"\xff" * 8
    p = tmp_path / "deflate.npz"
    p.write_bytes(bad)
    _refused(tmp_path, capsys, p, "a.npy")
    # an encrypted member (flag bit 0 in the local header and the directory)
    bad = bytearray(data)
    bad[info.header_offset + 6] |= 1
    k = bytes(bad).find(b"PK\x01\x02")
    bad[k + 8] |= 1
    p = tmp_path / "enc.npz"
    p.write_bytes(bad)
    _refused(tmp_path, capsys, p, "encrypted")
    # a member that is not a .npy file, and a .npy member that holds something else
    p = tmp_path / "txt.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", open(good, "rb").read()[:0] + b"\x93NUMPY" + b"junk" * 20)
    _refused(tmp_path, capsys, p, "npy header")
    p = tmp_path / "other.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", data[:0] + np.lib.format.magic(1, 0))
        z.writestr("notes.txt", b"hello")
    _refused(tmp_path, capsys, p, "other.npz")
    # a zip64 directory (written by zipfile when its limit is passed; here a small limit)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)
    p = tmp_path / "z64.npz"
    np.savez_compressed(p, a=np.random.default_rng(1).standard_normal(300).astype("f4"))
    monkeypatch.undo()
    assert_valid_zip(p)
    _refused(tmp_path, capsys, p, "zip64")


def test_one_deflate_to_size_routine_for_npz_members_and_hdf5_chunks():
    from fastflip.files import h5chunks, zipmembers
    from fastflip.files.formats import deflatefit, npz_members

    assert zipmembers.deflate_exact is h5chunks.deflate_exact is deflatefit.deflate_exact
    assert not hasattr(npz_members, "deflate_exact")  # no second name for it


def test_deflate_exact_sizes():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, 5000, dtype=np.uint8).tobytes()
    smallest = min(len(zlib.compress(data, 9)) - 6, len(zlib.compress(data, 6)) - 6)
    for size in range(smallest + 5, smallest + 40):
        z = deflate_exact(data, size)
        assert z is not None and len(z) == size
        d = zlib.decompressobj(-15)
        assert d.decompress(z) == data and d.eof and not d.unused_data
    assert deflate_exact(data, smallest // 2) is None


def test_cli_on_compressed_npz(tmp_path, capsys):
    p = str(tmp_path / "w.npz")
    np.savez_compressed(p, **_arrays(4))
    out = str(tmp_path / "o.npz")
    assert main(["inject", p, "-o", out, "--count", "9", "--seed", "3", "--bits", "sign"]) == 0
    assert main(["diff", p, out]) == 1
    assert "/" in capsys.readouterr().out
    assert main(["log", out + ".fflog"]) == 0
    assert main(["replay", out + ".fflog", p, "-o", str(tmp_path / "r.npz")]) == 0
    assert sha256_file(str(tmp_path / "r.npz")) == sha256_file(out)
    assert main(["revert", out + ".fflog", out]) == 0
    assert sha256_file(out) == sha256_file(p)
    assert main(["inspect", p]) == 0
    assert "deflate" in capsys.readouterr().out


def test_touched_member_bytes_read_once(tmp_path, monkeypatch):
    """The stored bytes of a member that holds sites are read from the file once (patched, then checked
    against the file from that one read), not a second time by the zip-field check."""
    from fastflip.files import zipmembers
    from fastflip.files.formats.zipraw import stored_entries

    p = str(tmp_path / "w.npz")
    rng = np.random.default_rng(3)
    # "tail" keeps the archive's end-record search (its last 64 KiB) away from "big"
    np.savez_compressed(p, big=rng.standard_normal(40_000).astype("<f8"), tail=rng.standard_normal(10_000))
    e = stored_entries(p)["big.npy"]
    lo, hi = e.offset, e.offset + e.info.compress_size
    spans = []  # (first byte, end) of every read through the files member_patches opens

    class Counting(io.FileIO):
        def read(self, n=-1):
            at = self.tell()
            b = super().read(n)
            spans.append((at, at + len(b)))
            return b

    monkeypatch.setattr(zipmembers, "open", lambda path, mode="rb": Counting(path, "r"), raising=False)
    inject_file(p, str(tmp_path / "o.npz"), selection={"include": ["/big"]}, seed=1, count=3)
    changed = np_load(p)["/big"].view("<u8") != np_load(str(tmp_path / "o.npz"))["/big"].view("<u8")
    assert 1 <= changed.sum() <= 3
    member_bytes_read = sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans)
    assert member_bytes_read == hi - lo
