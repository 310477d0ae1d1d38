"""Byte ranges written into an open file (files/rangeio.py): the native pass (``write_ranges`` of
ext/_kernels.pyx) against the Python one, byte for byte, and both against the ranges written one by one.

Random batches: ranges that follow each other, ranges a few bytes or pages apart, empty ranges, ranges past the
end of the file, previous bytes that hold or differ at a random range; spans larger than the native buffer.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import require
from fastflip.files import rangeio
from fastflip.files.rangeio import write_ranges


def _batch(rng: np.random.Generator, size: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Ranges in file order, none overlapping: adjacent, near and far apart, some empty, some past ``size``."""
    gaps = rng.choice([0, 0, 1, 7, 300, 5000], n)
    lens = rng.choice([0, 1, 2, 4, 8, 64, 3000], n)
    offs = np.cumsum(gaps) + np.concatenate(([0], np.cumsum(lens)[:-1]))
    return (offs + int(rng.integers(0, 64))).astype(np.int64), lens.astype(np.int64)


def _expected(base: bytes, offs, lens, new: bytes, old: bytes | None) -> tuple[bytes, int]:
    """The file and the answer when the ranges are checked and written one at a time."""
    buf, pos = bytearray(base), 0
    for i, (o, n) in enumerate(zip(offs.tolist(), lens.tolist())):
        if old is not None and bytes(buf[o : o + n]) != old[pos : pos + n]:
            return bytes(buf), i
        if n:
            buf[len(buf) : o] = bytes(max(0, o - len(buf)))  # a write past the end: zeros before it
            buf[o : o + n] = new[pos : pos + n]
        pos += n
    return bytes(buf), -1


def _run(path: str, base: bytes, offs, lens, new, old, **kw) -> tuple[bytes, int]:
    with open(path, "wb") as fh:
        fh.write(base)
    fd = os.open(path, os.O_RDWR)
    try:
        bad = write_ranges(fd, offs, lens, new, old, **kw)
    finally:
        os.close(fd)
    with open(path, "rb") as fh:
        return fh.read(), bad


@pytest.mark.parametrize("seed", range(12))
def test_native_and_python_passes_agree_byte_for_byte(seed, tmp_path, monkeypatch):
    require("fastflip.kernels._cython")
    rng = np.random.default_rng(seed)
    size = 1 << 16
    base = rng.integers(0, 256, size, np.uint8).tobytes()
    offs, lens = _batch(rng, size, int(rng.integers(1, 80)))
    total = int(lens.sum())
    new = rng.integers(0, 256, total, np.uint8).tobytes()
    held = bytearray()
    for o, n in zip(offs.tolist(), lens.tolist()):
        held += base[o : o + n] + bytes(max(0, o + n - max(o, size)))  # what the file holds (zeros past its end)
    kind = seed % 4  # 0: the old bytes hold; 1: one range differs; 2: no check; 3: check only
    if kind == 1 and total:
        at = int(rng.integers(0, total))
        held[at] ^= 0x5A
    old = None if kind == 2 else bytes(held)
    new_or_none = None if kind == 3 else new
    want = _expected(base, offs, lens, new, old)
    if kind == 3:  # checked, not written: the file as it was, the answer of the check
        want = (base, want[1])
    p = str(tmp_path / "f")
    got = {}
    for native in (False, True):
        for gap in (0, 16, 4096):
            for span in (1 << 20, 4096):  # spans cut at smaller blocks; the native pass reads in pieces
                monkeypatch.setattr(rangeio, "SPAN", span)
                got[native, gap, span] = _run(p, base, offs, lens, new_or_none, old, native=native, gap=gap)
    for k, v in got.items():
        assert v[1] == want[1], k
        assert v[0] == want[0], k


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_past_the_end_of_the_file_is_missing_bytes_for_a_check(native, tmp_path):
    if native:
        require("fastflip.kernels._cython")
    p = str(tmp_path / "f")
    got, bad = _run(p, b"abcdef", np.array([2, 5]), np.array([2, 3]), b"XYZZY", b"cdf\0\0", native=native)
    assert (got, bad) == (b"abXYef", 1)  # the range reaching past the end is refused; the one before written
    got, bad = _run(p, b"abcdef", np.array([2, 8]), np.array([2, 2]), b"XYZW", None, native=native, gap=4)
    assert (got, bad) == (b"abXYef\0\0ZW", -1)  # unchecked: written past the end, zeros between


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_a_malformed_batch_is_refused_before_anything_is_written(native, tmp_path):
    if native:
        require("fastflip.kernels._cython")
    p = str(tmp_path / "f")
    for offs, lens, new in (([0, 4], [2], b"ab"), ([0], [3], b"ab"), ([-1], [1], b"a"), ([0], [-1], b"")):
        with pytest.raises(ValueError, match="write_ranges"):
            _run(p, b"abcdef", np.array(offs), np.array(lens), new, None, native=native)
        with open(p, "rb") as fh:
            assert fh.read() == b"abcdef"


def test_an_empty_range_past_the_end_in_a_gapped_span_holds(tmp_path):
    """An empty range past the end of the file holds its (no) old bytes in both passes, also read in one span with
    the range before it (gap > 0), and the file keeps its length whatever the gap."""
    require("fastflip.kernels._cython")
    p = str(tmp_path / "f")
    base = bytes(range(100))
    offs, lens = np.array([10, 200]), np.array([2, 0])
    for new in (None, b"XY"):
        got = {(native, gap): _run(p, base, offs, lens, new, base[10:12], native=native, gap=gap)
               for native in (False, True) for gap in (0, 4096)}
        want = (base if new is None else base[:10] + new + base[12:], -1)  # the file no longer whatever the gap
        assert all(v == want for v in got.values()), (new, got)
    fd = os.open(p, os.O_RDONLY)  # the native pass called as it is, the empty range given to it
    try:
        assert rangeio._NATIVE(fd, offs, lens, b"", b"XY", False, True, 4096, 1 << 20) == -1
    finally:
        os.close(fd)
