"""A deflate stream of an exact size: one compression, then valid empty blocks as padding.

Layer: ``files`` (imports only the standard library).

Patching a compressed member or chunk in place needs the new stream to take exactly the old one's
bytes. :func:`deflate_exact` compresses the data once, completes its last block without aligning
(``Z_BLOCK``), and ends the stream by hand with empty deflate blocks worth exactly the bytes left —
empty fixed-Huffman blocks (10 bits; the last one final), and where more room is left an empty stored
block and empty stored blocks of 5 bytes — so the result is a complete, valid stream that every
inflater reads to the same data and that ends exactly at ``size`` (in the zlib wrapper the Adler-32
follows). Any room from that of the plain stream up fits, but for a few rooms of 1-5 bytes. Only when the first setting's stream is too long are other zlib settings tried
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


def _ending(pending: int, p: int, room: int) -> bytes | None:
    """Exactly ``room`` bytes that carry the ``p`` (0..7) bits a ``Z_BLOCK`` flush left pending and end the stream.

    Empty fixed-Huffman blocks (10 bits each, the last one final) when their bits round up to ``room``
    bytes; else, after some of them, an empty stored block (3 bits, aligned, LEN/NLEN) and the aligned
    :func:`empty_blocks` ending. None when no such ending has ``room`` bytes (a few small rooms).
    """
    for k in range(8):  # k empty fixed blocks, then the final one
        n = p + 10 * k + 10
        if -(-n // 8) == room:
            acc = pending | sum(2 << (p + 10 * i) for i in range(k)) | (3 << (p + 10 * k))
            return acc.to_bytes(room, "little")
    for k in range(4):  # k empty fixed blocks, then an empty stored block (aligned), then the aligned ending
        n = p + 10 * k + 3
        head = -(-n // 8)
        tail = empty_blocks(room - head - 4)
        if tail is not None:
            acc = pending | sum(2 << (p + 10 * i) for i in range(k))  # (the stored block's 3 header bits are 0)
            return acc.to_bytes(head, "little") + b"\x00\x00\xff\xff" + tail
    return None


def _one_pass(data: bytes, size: int, lv: int, mem: int, st: int, wbits: int, zero_pad: bool) -> bytes | None:
    """One compression of ``data`` ended in exactly ``size`` bytes, or None (verified by inflating it)."""
    c = zlib.compressobj(lv, zlib.DEFLATED, wbits, mem, st)
    body = c.compress(data)
    plain = c.copy() if zero_pad else None  # the same compression, finished as zlib does (no extra block)
    head = body + c.flush(zlib.Z_BLOCK)  # every block complete; up to 7 bits held back
    fin = c.flush()  # those bits, an empty final fixed block (10 bits), the Adler-32 in the zlib wrapper
    trailer = fin[-4:] if wbits > 0 else b""
    last = fin[:len(fin) - len(trailer)]
    v = int.from_bytes(last, "little")
    p = v.bit_length() - 2
    ending = _ending(v & ((1 << p) - 1), p, size - len(head) - len(trailer)) if 0 <= p <= 7 and v >> p == 3 else None
    if ending is not None:
        z = head + ending + trailer
        d = zlib.decompressobj(wbits)
        if d.decompress(z) == data and d.eof and not d.unused_data:
            return z
    if plain is not None:
        whole = body + plain.flush()
        if len(whole) <= size:
            return whole + bytes(size - len(whole))
    return None


def deflate_exact(data: bytes, size: int, level: int = 6, *, wbits: int = -15, mem_level: int = 9,
                  zero_pad: bool = False) -> bytes | None:
    """A deflate stream of exactly ``size`` bytes that inflates to ``data``, or None when none fits.

    The data are compressed once with the given settings and every block completed without aligning
    (``Z_BLOCK``); the stream is then ended by hand with empty blocks worth exactly the bytes left (see
    :func:`_ending`), so the result is one complete, valid stream — checked by inflating it. Other zlib
    settings are tried only when that ending cannot fit.

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
        when no empty-block ending has the size, the complete stream of the same compression is padded
        with zero bytes before other settings are tried.
    """
    for lv, mem, st in _settings(level, mem_level):
        z = _one_pass(data, size, lv, mem, st, wbits, zero_pad)
        if z is not None:
            return z
    return None


def deflate_smallest(data: bytes, level: int = 6) -> bytes:
    """The data deflated at ``level`` (a complete raw deflate stream, as zipfile writes it)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()
