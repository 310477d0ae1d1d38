# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""LZF streams (the format of HDF5's lzf filter, id 32000, as h5py registers it), written from the format.

An LZF stream is a sequence of tokens, each led by a control byte ``c``:

* ``c < 32``: a literal run — the next ``c + 1`` bytes are copied to the output;
* ``c >= 32``: a back-reference — length ``L = c >> 5`` (when ``L == 7``, the next byte is
  added), distance ``d = ((c & 31) << 8 | next byte) + 1``; ``L + 2`` bytes are copied from
  ``d`` bytes back in the output, byte by byte (a reference may overlap what it writes).

There is no header and no end marker: the stream ends with the input. Distances reach 8192
bytes back and references copy 3 to 264 bytes (a control byte below 32 is a literal run).

Functions (all take and return ``bytes``):

``decompress(stream, size)``
    The decoded bytes, which must be exactly ``size`` long (ValueError otherwise or on a bad stream).
``compress(data)``
    A greedy encoding (hash of the next three bytes → their last position).
``reencode(stream, data)``
    ``data`` (the decoded ``stream`` with some bytes changed) encoded along the old stream's tokens:
    literals take the new bytes, references keep the runs (3 bytes or more) that still copy the right
    bytes and spell out the rest as literals. Unchanged regions keep their encoding, so the size barely moves.
``grow(stream, extra)``
    The same data in exactly ``extra`` (0 or more) more bytes (literal runs split, references spelled out
    as literals), or None when the stream has too little to split; ValueError for a negative ``extra``.
"""

from libc.stdint cimport uint8_t, uint32_t
from libc.stdlib cimport free, malloc

cdef enum:
    MAX_LIT = 32
    MAX_OFF = 8192
    MAX_REF = 264
    HLOG = 14


cdef inline Py_ssize_t _token(const uint8_t[::1] s, Py_ssize_t n, Py_ssize_t ip, Py_ssize_t* length,
                              Py_ssize_t* dist) noexcept nogil:
    """Read the token at ``ip``: a literal run (``dist`` 0; its ``length`` bytes follow) or a reference.
    Return the position after the token's control bytes, or -1 when the stream ends inside them."""
    cdef uint32_t c = s[ip]
    ip += 1
    if c < 32:
        length[0] = c + 1
        dist[0] = 0
        return ip
    length[0] = c >> 5
    if length[0] == 7:
        if ip >= n:
            return -1
        length[0] += s[ip]
        ip += 1
    if ip >= n:
        return -1
    dist[0] = (((c & 31) << 8) | s[ip]) + 1
    length[0] += 2
    return ip + 1


def decompress(const uint8_t[::1] src, Py_ssize_t size):
    """Decode an LZF stream that must give exactly ``size`` bytes."""
    out = bytearray(size)
    cdef uint8_t[::1] o = out
    cdef Py_ssize_t ip = 0, op = 0, n = src.shape[0], length = 0, dist = 0, k
    cdef int bad = 0
    with nogil:
        while ip < n:
            ip = _token(src, n, ip, &length, &dist)
            if ip < 0 or op + length > size or (dist == 0 and ip + length > n) or dist > op:
                bad = 1
                break
            if dist == 0:
                for k in range(length):
                    o[op + k] = src[ip + k]
                ip += length
            else:
                for k in range(length):  # byte by byte: a reference may overlap what it writes
                    o[op + k] = o[op - dist + k]
            op += length
    if bad or op != size:
        raise ValueError(f"not an LZF stream of {size} bytes")
    return bytes(out)


cdef inline Py_ssize_t _literals(const uint8_t[::1] data, Py_ssize_t start, Py_ssize_t n, uint8_t[::1] o,
                                 Py_ssize_t op) noexcept nogil:
    """Write ``data[start:start+n]`` as literal runs of at most 32 bytes; return the new output position."""
    cdef Py_ssize_t run, k
    while n > 0:
        run = n if n < MAX_LIT else MAX_LIT
        o[op] = <uint8_t>(run - 1)
        op += 1
        for k in range(run):
            o[op + k] = data[start + k]
        op += run
        start += run
        n -= run
    return op


cdef inline Py_ssize_t _reference(Py_ssize_t dist, Py_ssize_t length, uint8_t[::1] o, Py_ssize_t op) noexcept nogil:
    """Write a reference copying ``length`` (3..264) bytes from ``dist`` (1..8192) back."""
    cdef Py_ssize_t l2 = length - 2, off = dist - 1
    if l2 < 7:
        o[op] = <uint8_t>((l2 << 5) | (off >> 8))
        op += 1
    else:
        o[op] = <uint8_t>((7 << 5) | (off >> 8))
        o[op + 1] = <uint8_t>(l2 - 7)
        op += 2
    o[op] = <uint8_t>(off & 255)
    return op + 1


def compress(const uint8_t[::1] data, int depth=32):
    """An LZF encoding of ``data``: at each position the longest match among the last ``depth`` positions
    with the same next three bytes (hash chains), with one step of lazy matching."""
    cdef Py_ssize_t n = data.shape[0]
    out = bytearray(n + n // 32 + 16)
    cdef uint8_t[::1] o = out
    cdef Py_ssize_t* head = <Py_ssize_t*>malloc((1 << HLOG) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* prev = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t op = 0
    if head == NULL or prev == NULL:
        free(head)
        free(prev)
        raise MemoryError()
    try:
        with nogil:
            op = _chained(data, n, o, head, prev, depth)
    finally:
        free(head)
        free(prev)
    return bytes(out[:op])


cdef inline uint32_t _hash(const uint8_t[::1] data, Py_ssize_t ip) noexcept nogil:
    cdef uint32_t h = (<uint32_t>data[ip] << 16) | (<uint32_t>data[ip + 1] << 8) | data[ip + 2]
    return (h * 2654435761u) >> (32 - HLOG)


cdef inline Py_ssize_t _longest(const uint8_t[::1] data, Py_ssize_t n, Py_ssize_t ip, Py_ssize_t* head,
                                Py_ssize_t* prev, int depth, Py_ssize_t* at) noexcept nogil:
    """Length (0 below 3) and position of the longest match for ``ip`` among the chained candidates."""
    cdef Py_ssize_t cand = head[_hash(data, ip)], best = 0, length, maxlen = n - ip
    if maxlen > MAX_REF:
        maxlen = MAX_REF
    while cand >= 0 and ip - cand <= MAX_OFF and depth > 0:
        if best >= maxlen:
            break
        if data[cand + best] == data[ip + best]:
            length = 0
            while length < maxlen and data[cand + length] == data[ip + length]:
                length += 1
            if length > best:
                best = length
                at[0] = cand
        cand = prev[cand]
        depth -= 1
    return best if best >= 3 else 0


cdef inline void _insert(const uint8_t[::1] data, Py_ssize_t ip, Py_ssize_t* head, Py_ssize_t* prev) noexcept nogil:
    cdef uint32_t h = _hash(data, ip)
    prev[ip] = head[h]
    head[h] = ip


cdef Py_ssize_t _chained(const uint8_t[::1] data, Py_ssize_t n, uint8_t[::1] o, Py_ssize_t* head, Py_ssize_t* prev,
                         int depth) noexcept nogil:
    cdef Py_ssize_t ip = 0, op = 0, lit = 0, length, nxt, at = 0, at2 = 0, k
    for k in range(1 << HLOG):
        head[k] = -1
    while ip + 2 < n:
        length = _longest(data, n, ip, head, prev, depth, &at)
        _insert(data, ip, head, prev)
        if length and ip + 3 < n:  # lazy: a longer match one byte on wins
            nxt = _longest(data, n, ip + 1, head, prev, depth, &at2)
            if nxt > length:
                lit += 1
                ip += 1
                continue
        if length:
            op = _literals(data, ip - lit, lit, o, op)
            lit = 0
            op = _reference(ip - at, length, o, op)
            for k in range(ip + 1, ip + length):
                if k + 2 < n:
                    _insert(data, k, head, prev)
            ip += length
        else:
            lit += 1
            ip += 1
    lit += n - ip
    return _literals(data, n - lit, lit, o, op)


def reencode(const uint8_t[::1] stream, const uint8_t[::1] data):
    """``data`` encoded along the tokens of ``stream`` (which decodes to data of the same length)."""
    cdef Py_ssize_t n = stream.shape[0], size = data.shape[0]
    out = bytearray(size + size // 32 + 16 + n)
    cdef uint8_t[::1] o = out
    cdef Py_ssize_t ip = 0, op = 0, pos = 0, lit = 0, length = 0, dist = 0, k, run
    cdef int bad = 0
    with nogil:
        while ip < n:
            ip = _token(stream, n, ip, &length, &dist)
            if ip < 0 or pos + length > size or dist > pos:
                bad = 1
                break
            if dist == 0:
                ip += length
                lit += length
            else:
                # the runs of the reference that still copy the right bytes stay references (3 bytes or more);
                # the bytes between them become literals
                k = 0
                while k < length:
                    run = 0
                    while k + run < length and data[pos + k + run] == data[pos + k + run - dist]:
                        run += 1
                    if run >= 3:
                        op = _literals(data, pos + k - lit, lit, o, op)
                        lit = 0
                        op = _reference(dist, run, o, op)
                        k += run
                    else:
                        lit += run + (1 if k + run < length else 0)
                        k += run + 1
            pos += length
        if ip > n or pos != size:
            bad = 1
        if not bad:
            op = _literals(data, pos - lit, lit, o, op)
    if bad:
        raise ValueError("the stream does not decode to data of this length")
    return bytes(out[:op])


cdef inline Py_ssize_t _enc(Py_ssize_t length) noexcept nogil:
    """Bytes a reference of ``length`` takes."""
    return 2 if length - 2 < 7 else 3


def grow(const uint8_t[::1] stream, const uint8_t[::1] data, Py_ssize_t extra):
    """``data`` (what ``stream`` decodes to) in exactly ``extra`` more stream bytes, or None when this pass
    cannot: literal runs are split (one byte each split), references lose their first bytes to literals."""
    cdef Py_ssize_t n = stream.shape[0], size = data.shape[0]
    if extra < 0:  # the loops below write up to n + extra bytes: a negative count would write out of bounds
        raise ValueError(f"grow: extra must be 0 or more bytes, got {extra}")
    out = bytearray(n + extra + 64)
    cdef uint8_t[::1] o = out
    cdef Py_ssize_t ip = 0, op = 0, pos = 0, length = 0, dist = 0, k, cut, left = extra, g
    with nogil:
        while ip < n:
            ip = _token(stream, n, ip, &length, &dist)
            if ip < 0 or pos + length > size or (dist == 0 and ip + length > n) or dist > pos:
                break
            if dist == 0:
                cut = length - 1 if length - 1 < left else left  # split into cut + 1 runs: cut more bytes
                left -= cut
                for k in range(cut):  # runs of one byte for the first ``cut`` bytes, then the rest in one run
                    op = _literals(data, pos + k, 1, o, op)
                op = _literals(data, pos + cut, length - cut, o, op)
                ip += length
            else:
                # the first k bytes as one literal run, the rest a reference: 1 + k + _enc(length - k) - _enc(length)
                k = length - 3 if length - 3 < MAX_LIT else MAX_LIT
                while k > 0 and 1 + k + _enc(length - k) - _enc(length) > left:
                    k -= 1
                if k > 0:
                    left -= 1 + k + _enc(length - k) - _enc(length)
                    op = _literals(data, pos, k, o, op)
                op = _reference(dist, length - k, o, op)
            pos += length
    if left or pos != size:
        return None
    return bytes(out[:op])
