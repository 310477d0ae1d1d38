"""A deflate stream of an exact size: one compression, then valid empty blocks as padding.

Layer: ``files`` (imports only the standard library).

Patching a compressed member or chunk in place needs the new stream to take exactly the old one's
bytes. :func:`deflate_exact` compresses the data once, ends it with a sync flush (byte-aligned, not
final), and fills the bytes left with empty deflate blocks — empty stored blocks (5 bytes each), and
empty fixed-Huffman blocks (10 bits; the last one final) — so the result is a complete, valid stream
that every inflater reads to the same data and that ends exactly at ``size`` (in the zlib wrapper the
Adler-32 follows). Only when the first setting's stream is too long are other zlib settings tried
(a handful, the densest first). Both the ``.npz`` member rewrite
(:mod:`fastflip.files.zipmembers`, raw deflate) and the HDF5 gzip chunk patcher
(:mod:`fastflip.files.h5chunks`, zlib wrapper) call it.

Examples
--------
>>> import zlib
>>> data = bytes(range(256)) * 8
>>> z = deflate_exact(data, 700)
>>> len(z), zlib.decompress(z, -15) == data
(700, True)
>>> z = deflate_exact(data, 700, wbits=15)          # the zlib wrapper (HDF5's deflate filter)
>>> len(z), zlib.decompress(z) == data
(700, True)
>>> deflate_exact(data, 10) is None      # no stream of 10 bytes holds it
True
"""

from __future__ import annotations

import zlib

__all__ = ["deflate_exact", "deflate_smallest", "empty_blocks"]

# empty deflate blocks, as bit strings written LSB first:
_FIXED_EMPTY = "010" + "0000000"  # BFINAL=0, BTYPE=01 (fixed), end-of-block (code 256 = 7 zero bits)
_FIXED_FINAL = "110" + "0000000"  # the same block with BFINAL=1
_STORED_FINAL = "100"  # BFINAL=1, BTYPE=00; then pad to a byte and LEN=0, NLEN=0xFFFF


def empty_blocks(room: int) -> bytes | None:
    """Bytes of exactly ``room`` that end a byte-aligned, not yet final deflate stream (None below 2).

    Examples
    --------
    >>> [len(empty_blocks(n)) for n in range(2, 9)]
    [2, 3, 4, 5, 6, 7, 8]
    >>> empty_blocks(1) is None
    True
    """
    if room < 2:
        return None
    k = max(0, (room - 2) // 5)  # empty stored blocks (non-final, aligned): 5 bytes each, leaving 2..6 bytes
    pre = b"\x00\x00\x00\xff\xff" * k
    room -= 5 * k
    stored = room == 6  # an empty fixed block (10 bits), a final stored block: 2 bytes + LEN/NLEN
    bits = _FIXED_EMPTY + _STORED_FINAL if stored else _FIXED_EMPTY * (room - 2) + _FIXED_FINAL
    bits += "0" * (-len(bits) % 8)
    out = bytes(int(bits[i:i + 8][::-1], 2) for i in range(0, len(bits), 8))
    return pre + out + (b"\x00\x00\xff\xff" if stored else b"")


def _settings(level: int, mem_level: int) -> list[tuple[int, int, int]]:
    """zlib settings: the caller's first (one compression in the usual case), then denser ones."""
    first = [(level, mem_level, zlib.Z_DEFAULT_STRATEGY)]
    rest = [(lv, mem, st) for st in (zlib.Z_DEFAULT_STRATEGY, zlib.Z_FILTERED) for mem in (9, 8) for lv in (9, 6, 4, 1)]
    return first + [t for t in rest if t not in first]


def deflate_exact(data: bytes, size: int, level: int = 6, *, wbits: int = -15, mem_level: int = 9,
                  zero_pad: bool = False) -> bytes | None:
    """A deflate stream of exactly ``size`` bytes that inflates to ``data``, or None when none fits.

    Parameters
    ----------
    data : bytes
    size : int
        The stream's length (with the zlib header and Adler-32 when ``wbits`` > 0).
    level, mem_level : int
        The zlib settings tried first (the ones the stream was written with, when known).
    wbits : int
        -15 for a raw stream (zip members), 15 for the zlib wrapper (HDF5's deflate filter).
    zero_pad : bool
        Where the container ignores bytes after the stream (HDF5 inflates a chunk to its end marker):
        when the empty-block ending does not fit, a complete stream of the same compression padded
        with zero bytes is taken before other settings are tried.
    """
    for lv, mem, st in _settings(level, mem_level):
        c = zlib.compressobj(lv, zlib.DEFLATED, wbits, mem, st)
        head = c.compress(data)
        whole = c.copy() if zero_pad else None
        body = head + c.flush(zlib.Z_SYNC_FLUSH)
        trailer = zlib.adler32(data).to_bytes(4, "big") if wbits > 0 else b""
        tail = empty_blocks(size - len(body) - len(trailer))
        if tail is not None:
            return body + tail + trailer
        if whole is not None:
            z = head + whole.flush()
            if len(z) <= size:
                return z + bytes(size - len(z))
    return None


def deflate_smallest(data: bytes, level: int = 6) -> bytes:
    """The data deflated at ``level`` (a complete raw deflate stream, as zipfile writes it)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()
