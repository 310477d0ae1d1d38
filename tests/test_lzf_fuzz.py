"""The native LZF codec (ext/_lzf.pyx) against a pure-Python decoder written from the format.

Every stream the codec writes (compress, reencode, grow) decodes, with the decoder below, to exactly the data it
was given; on arbitrary bytes the native decoder and the one below agree (same output, or both refuse).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def lzf():
    return require("fastflip.kernels._lzf")


def py_decompress(stream: bytes, size: int) -> bytes | None:
    """LZF from the format: literal runs (control < 32: that many + 1 bytes follow) and back-references
    (length ``c >> 5``, 7 meaning one more length byte, plus 2; distance ``(c & 31) << 8 | next byte``, plus 1),
    copied byte by byte; None when the stream is not one of exactly ``size`` bytes."""
    out = bytearray()
    i = 0
    while i < len(stream):
        c = stream[i]
        i += 1
        if c < 32:
            n = c + 1
            if i + n > len(stream):
                return None
            out += stream[i:i + n]
            i += n
        else:
            n = c >> 5
            if n == 7:
                if i >= len(stream):
                    return None
                n += stream[i]
                i += 1
            if i >= len(stream):
                return None
            d = ((c & 31) << 8 | stream[i]) + 1
            i += 1
            n += 2
            if d > len(out):
                return None
            for _ in range(n):
                out.append(out[-d])
        if len(out) > size:
            return None
    return bytes(out) if len(out) == size else None


def _native(lzf, stream: bytes, size: int) -> bytes | None:
    try:
        return lzf.decompress(stream, size)
    except ValueError:
        return None


# data with repeats (so that references occur), or plain noise
DATA = st.one_of(
    st.binary(max_size=600),
    st.lists(st.sampled_from([b"ab", b"abc", b"\x00" * 7, b"xyzxyz", bytes(range(40))]), max_size=60).map(b"".join),
)


@FUZZ
@given(DATA)
def test_compress_decodes_to_the_data(lzf, data):
    for depth in (1, 4, 32):
        z = lzf.compress(data, depth)
        assert py_decompress(z, len(data)) == data
        assert lzf.decompress(z, len(data)) == data


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 700))
def test_native_and_python_decoders_agree_on_any_bytes(lzf, stream, size):
    assert _native(lzf, stream, size) == py_decompress(stream, size)


@FUZZ
@given(DATA, st.data())
def test_mutated_streams_decode_the_same_in_both(lzf, data, draw):
    z = bytearray(lzf.compress(data))
    if z:
        for _ in range(draw.draw(st.integers(1, 4))):
            z[draw.draw(st.integers(0, len(z) - 1))] = draw.draw(st.integers(0, 255))
    cut = draw.draw(st.integers(0, len(z)))
    for stream in (bytes(z), bytes(z[:cut])):
        for size in (len(data), len(data) + 1, max(len(data) - 1, 0)):
            assert _native(lzf, stream, size) == py_decompress(stream, size)


@FUZZ
@given(DATA, st.data())
def test_reencode_and_grow_give_streams_of_the_new_data(lzf, data, draw):
    z = lzf.compress(data)
    new = bytearray(data)
    for _ in range(draw.draw(st.integers(0, 5)) if data else 0):
        new[draw.draw(st.integers(0, len(data) - 1))] ^= 1 << draw.draw(st.integers(0, 7))
    new = bytes(new)
    r = lzf.reencode(z, new)
    assert py_decompress(r, len(new)) == new
    extra = draw.draw(st.integers(0, 40))
    g = lzf.grow(r, new, extra)
    if g is not None:
        assert len(g) == len(r) + extra and py_decompress(g, len(new)) == new
