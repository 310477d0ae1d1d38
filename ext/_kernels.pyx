# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Typed word kernels over a raw byte buffer (no policy).

The caller (fastflip.kernels.dispatch) validates every argument once, with messages: offsets lie
inside the buffer, itemsize is 1, 2, 4 or 8, all columns have the same length. The kernels still
trust nothing they are handed: one cheap pass (:func:`_check_words`, :func:`_check_ptrs`) proves the
same before any word is touched, and a wrong call raises ValueError instead of writing out of bounds.
Each word is read from ``buf[off:off+itemsize]`` (unaligned access is fine), byte-swapped when
``swap`` is true (storage order differs from this machine's), turned into the new
word by the word rule ``ff_rule`` of ``ff_word.h`` and written back the same way.

:func:`write_ranges` writes byte ranges into an open file (pwrite), checking their previous bytes first when
asked; its caller is :mod:`fastflip.files.rangeio`, which falls back to Python where this module is not built.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t
from libc.errno cimport EINTR, EIO, errno
from libc.stdint cimport INT64_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset
from posix.types cimport off_t
from posix.unistd cimport pread, pwrite

import os


cdef extern from *:
    uint32_t __builtin_bswap32(uint32_t) nogil
    uint64_t __builtin_bswap64(uint64_t) nogil


# The word rule and word width, written once for every C dialect (Cython here, CUDA C and host C in
# fastflip.kernels.gpu): src/fastflip/kernels/ff_word.h.
cdef extern from "ff_word.h":
    uint64_t ff_rule(uint64_t old, uint64_t a, uint64_t o, uint64_t x, int size) nogil



cdef inline uint64_t _load(const uint8_t* p, int itemsize, bint swap) noexcept nogil:
    cdef uint8_t b1
    cdef uint16_t b2
    cdef uint32_t b4
    cdef uint64_t b8
    if itemsize == 1:
        return p[0]
    elif itemsize == 2:
        memcpy(&b2, p, 2)
        if swap:
            b2 = <uint16_t>((b2 >> 8) | (b2 << 8))
        return b2
    elif itemsize == 4:
        memcpy(&b4, p, 4)
        if swap:
            b4 = __builtin_bswap32(b4)
        return b4
    else:
        memcpy(&b8, p, 8)
        if swap:
            b8 = __builtin_bswap64(b8)
        return b8


cdef inline void _store(uint8_t* p, uint64_t w, int itemsize, bint swap) noexcept nogil:
    cdef uint16_t b2
    cdef uint32_t b4
    cdef uint64_t b8
    if itemsize == 1:
        p[0] = <uint8_t>w
    elif itemsize == 2:
        b2 = <uint16_t>w
        if swap:
            b2 = <uint16_t>((b2 >> 8) | (b2 << 8))
        memcpy(p, &b2, 2)
    elif itemsize == 4:
        b4 = <uint32_t>w
        if swap:
            b4 = __builtin_bswap32(b4)
        memcpy(p, &b4, 4)
    else:
        b8 = w
        if swap:
            b8 = __builtin_bswap64(b8)
        memcpy(p, &b8, 8)


cdef inline bint _bad_width(Py_ssize_t size) noexcept nogil:
    return size != 1 and size != 2 and size != 4 and size != 8


cdef int _check_words(str fn, Py_ssize_t nbuf, const int64_t[::1] offsets, int itemsize, Py_ssize_t ncol) except -1:
    """Raise unless ``itemsize`` is a word width, every other column has ``len(offsets)`` entries and
    every word lies inside the buffer of ``nbuf`` bytes."""
    cdef Py_ssize_t i, n = offsets.shape[0], bad = -1
    if _bad_width(itemsize):
        raise ValueError(f"{fn}: itemsize must be 1, 2, 4 or 8, got {itemsize}")
    if ncol != n:
        raise ValueError(f"{fn}: every column needs one entry per offset ({ncol} for {n} offsets)")
    with nogil:
        for i in range(n):
            if offsets[i] < 0 or offsets[i] > nbuf - itemsize:
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"{fn}: byte offset {offsets[bad]} lies outside the buffer of {nbuf} bytes")
    return 0


cdef int _check_ptrs(str fn, const int32_t[::1] itemsizes, const uint8_t[::1] swaps, const int64_t[::1] extents,
                     Py_ssize_t ntab, const int32_t[::1] tensor, const int64_t[::1] offsets, Py_ssize_t ncol) except -1:
    """Raise unless the table's columns agree, every site column has ``len(offsets)`` entries, every
    tensor id is in the table, its word width is 1, 2, 4 or 8 and every word lies inside its tensor's extent."""
    cdef Py_ssize_t i, n = offsets.shape[0], bad = -1
    cdef int32_t t
    if itemsizes.shape[0] != ntab or swaps.shape[0] != ntab or extents.shape[0] != ntab:
        raise ValueError(f"{fn}: the table's columns have different lengths")
    if tensor.shape[0] != n or ncol != n:
        raise ValueError(f"{fn}: every column needs one entry per offset")
    with nogil:
        for i in range(n):
            t = tensor[i]
            if (t < 0 or t >= ntab or _bad_width(itemsizes[t]) or offsets[i] < 0
                    or offsets[i] > extents[t] - itemsizes[t]):
                bad = i
                break
    if bad >= 0:
        t = tensor[bad]
        if 0 <= t < ntab and _bad_width(itemsizes[t]):
            raise ValueError(f"{fn}: itemsize of tensor {t} must be 1, 2, 4 or 8, got {itemsizes[t]}")
        raise ValueError(f"{fn}: site {bad} (tensor {t}, byte offset {offsets[bad]}) lies outside the table")
    return 0


def apply_words(uint8_t[::1] buf, const int64_t[::1] offsets, int itemsize, bint swap,
                const uint64_t[::1] and_mask, const uint64_t[::1] or_mask, const uint64_t[::1] xor_mask,
                uint64_t[::1] old_out, uint64_t[::1] new_out):
    """Apply the word rule at every byte offset; store old and new words (native order)."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef uint64_t old, new
    cdef uint8_t* base = &buf[0] if buf.shape[0] else NULL
    _check_words("apply_words", buf.shape[0], offsets, itemsize,
                 min(and_mask.shape[0], or_mask.shape[0], xor_mask.shape[0], old_out.shape[0], new_out.shape[0]))
    with nogil:
        for i in range(n):
            old = _load(base + offsets[i], itemsize, swap)
            new = ff_rule(old, and_mask[i], or_mask[i], xor_mask[i], itemsize)
            _store(base + offsets[i], new, itemsize, swap)
            old_out[i] = old
            new_out[i] = new


def read_words(const uint8_t[::1] buf, const int64_t[::1] offsets, int itemsize, bint swap, uint64_t[::1] out):
    """Read the word at every byte offset (native order) into ``out``."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef const uint8_t* base = &buf[0] if buf.shape[0] else NULL
    _check_words("read_words", buf.shape[0], offsets, itemsize, out.shape[0])
    with nogil:
        for i in range(n):
            out[i] = _load(base + offsets[i], itemsize, swap)


def write_words(uint8_t[::1] buf, const int64_t[::1] offsets, int itemsize, bint swap, const uint64_t[::1] words):
    """Write ``words`` (native order) at every byte offset."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef uint8_t* base = &buf[0] if buf.shape[0] else NULL
    _check_words("write_words", buf.shape[0], offsets, itemsize, words.shape[0])
    with nogil:
        for i in range(n):
            _store(base + offsets[i], words[i], itemsize, swap)


# ---------------------------------------------------------------------------------------------
# Multi-tensor kernels: one call over several tensors given their base addresses. Site ``i``
# touches the word at ``ptrs[tensor[i]] + offsets[i]`` whose width and byte order are those of
# its tensor; ``extents[t]`` bytes from ``ptrs[t]`` belong to tensor ``t`` (checked for every site).
# The caller guarantees that every base address is that of a live, writable buffer of its extent.
# ---------------------------------------------------------------------------------------------

def apply_ptrs(const uint64_t[::1] ptrs, const int32_t[::1] itemsizes, const uint8_t[::1] swaps,
               const int64_t[::1] extents, const int32_t[::1] tensor, const int64_t[::1] offsets,
               const uint64_t[::1] and_mask, const uint64_t[::1] or_mask, const uint64_t[::1] xor_mask,
               uint64_t[::1] old_out, uint64_t[::1] new_out):
    """Apply the word rule at ``ptrs[tensor[i]] + offsets[i]`` for every site; store old and new words."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    cdef int size
    cdef uint64_t old, new
    cdef uint8_t* p
    _check_ptrs("apply_ptrs", itemsizes, swaps, extents, ptrs.shape[0], tensor, offsets,
                min(and_mask.shape[0], or_mask.shape[0], xor_mask.shape[0], old_out.shape[0], new_out.shape[0]))
    with nogil:
        for i in range(n):
            t = tensor[i]
            size = itemsizes[t]
            p = <uint8_t*><size_t>ptrs[t] + offsets[i]
            old = _load(p, size, swaps[t])
            new = ff_rule(old, and_mask[i], or_mask[i], xor_mask[i], size)
            _store(p, new, size, swaps[t])
            old_out[i] = old
            new_out[i] = new


def read_ptrs(const uint64_t[::1] ptrs, const int32_t[::1] itemsizes, const uint8_t[::1] swaps,
              const int64_t[::1] extents, const int32_t[::1] tensor, const int64_t[::1] offsets, uint64_t[::1] out):
    """Read the word of every site (native order) into ``out``."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    _check_ptrs("read_ptrs", itemsizes, swaps, extents, ptrs.shape[0], tensor, offsets, out.shape[0])
    with nogil:
        for i in range(n):
            t = tensor[i]
            out[i] = _load(<uint8_t*><size_t>ptrs[t] + offsets[i], itemsizes[t], swaps[t])


def write_ptrs(const uint64_t[::1] ptrs, const int32_t[::1] itemsizes, const uint8_t[::1] swaps,
               const int64_t[::1] extents, const int32_t[::1] tensor, const int64_t[::1] offsets,
               const uint64_t[::1] words):
    """Write ``words`` (native order) at every site."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    _check_ptrs("write_ptrs", itemsizes, swaps, extents, ptrs.shape[0], tensor, offsets, words.shape[0])
    with nogil:
        for i in range(n):
            t = tensor[i]
            _store(<uint8_t*><size_t>ptrs[t] + offsets[i], words[i], itemsizes[t], swaps[t])


# ---------------------------------------------------------------------------------------------
# Byte ranges of an open file: ``write_ranges`` writes a batch of (offset, bytes) ranges with
# pwrite, checking the bytes each range holds first when asked (pread), in one pass and one call.
# ---------------------------------------------------------------------------------------------

cdef Py_ssize_t _pread_full(int fd, uint8_t* buf, int64_t n, int64_t at) noexcept nogil:
    """Read ``n`` bytes at ``at`` into ``buf`` (fewer only at the end of the file); -1 (errno set) on an error."""
    cdef Py_ssize_t got = 0, r
    while got < n:
        r = pread(fd, buf + got, <size_t>(n - got), <off_t>(at + got))
        if r < 0:
            if errno == EINTR:
                continue
            return -1
        if r == 0:
            break
        got += r
    return got


cdef int _pwrite_full(int fd, const uint8_t* buf, int64_t n, int64_t at) noexcept nogil:
    """Write ``n`` bytes at ``at`` (again after a short write); 0, or the error number."""
    cdef int64_t done = 0
    cdef Py_ssize_t r
    while done < n:
        r = pwrite(fd, buf + done, <size_t>(n - done), <off_t>(at + done))
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return EIO
        done += r
    return 0


def write_ranges(int fd, const int64_t[::1] offsets, const int64_t[::1] lengths, const uint8_t[::1] new,
                 const uint8_t[::1] old, bint write, bint verify, int64_t gap, int64_t cap):
    """Write range ``i``'s bytes (``new``, every range's concatenated) at ``offsets[i]`` of the open file ``fd``
    (``write``), after checking that it holds ``old``'s (``verify``); return -1, or the first range that did not
    hold its old bytes (it and the ranges after it are not written; those before it are).

    Ranges that follow each other without a gap are one pread/pwrite; ranges at most ``gap`` bytes apart are
    read as one span of at most ``cap`` bytes, their new bytes laid over it and the span written back (the gap
    bytes as read: only for a file no other process writes). Bytes past the end of the file read as missing
    (``verify``) or zeros.
    """
    cdef Py_ssize_t n = offsets.shape[0], i, j, r, bad = -1
    cdef int64_t total = 0, start, end, o, p = 0, q, rel, got, k, piece
    cdef int err = 0
    cdef bint gaps
    cdef uint8_t* buf = NULL
    cdef const uint8_t* nd = &new[0] if new.shape[0] else NULL
    cdef const uint8_t* od = &old[0] if old.shape[0] else NULL
    if lengths.shape[0] != n:
        raise ValueError(f"write_ranges: {lengths.shape[0]} lengths for {n} offsets")
    if gap < 0 or cap < 1:
        raise ValueError(f"write_ranges: gap must be >= 0 and cap >= 1, got {gap} and {cap}")
    for i in range(n):
        if offsets[i] < 0 or lengths[i] < 0 or lengths[i] > INT64_MAX - offsets[i] or lengths[i] > INT64_MAX - total:
            raise ValueError(f"write_ranges: range {i} (offset {offsets[i]}, length {lengths[i]}) is not a byte range")
        total += lengths[i]
    if write and new.shape[0] != total:
        raise ValueError(f"write_ranges: {new.shape[0]} new bytes for ranges of {total}")
    if verify and old.shape[0] != total:
        raise ValueError(f"write_ranges: {old.shape[0]} old bytes for ranges of {total}")
    if verify or gap:
        buf = <uint8_t*>malloc(<size_t>cap)
        if buf == NULL:
            raise MemoryError()
    try:
        with nogil:
            i = 0
            while i < n:
                start = offsets[i]
                end = start + lengths[i]
                gaps = False
                j = i + 1
                while j < n:  # the span: ranges in order, none overlapping, at most gap bytes apart
                    o = offsets[j]
                    if o < end or o - end > gap:
                        break
                    if (o != end or gaps) and o + lengths[j] - start > cap:
                        break
                    gaps = gaps or o != end
                    end = o + lengths[j]
                    j += 1
                if gaps:  # one read of the span; each range checked and laid over it; one write
                    got = _pread_full(fd, buf, end - start, start)
                    if got < 0:
                        err = errno
                        break
                    if got < end - start:
                        memset(buf + got, 0, <size_t>(end - start - got))
                    q = p
                    for r in range(i, j):
                        rel = offsets[r] - start
                        if verify and ((lengths[r] and rel + lengths[r] > got) or
                                       memcmp(buf + rel, od + q, <size_t>lengths[r]) != 0):
                            bad = r
                            break
                        if write:
                            memcpy(buf + rel, nd + q, <size_t>lengths[r])
                        q += lengths[r]
                    k = offsets[bad] - start if bad >= 0 else end - start
                    if write and k > 0:
                        err = _pwrite_full(fd, buf, k, start)
                        if err:
                            break
                else:  # adjacent ranges: their bytes follow each other in new and old too
                    if verify:
                        rel = 0
                        while rel < end - start:
                            piece = min(cap, end - start - rel)
                            got = _pread_full(fd, buf, piece, start + rel)
                            if got < 0:
                                err = errno
                                break
                            if got < piece or memcmp(buf, od + p + rel, <size_t>piece) != 0:
                                k = 0
                                while k < got and buf[k] == od[p + rel + k]:
                                    k += 1
                                r = i
                                while offsets[r] + lengths[r] <= start + rel + k:
                                    r += 1
                                bad = r
                                break
                            rel += piece
                        if err:
                            break
                    k = offsets[bad] - start if bad >= 0 else end - start
                    if write and k > 0:
                        err = _pwrite_full(fd, nd + p, k, start)
                        if err:
                            break
                if bad >= 0:
                    break
                for r in range(i, j):
                    p += lengths[r]
                i = j
    finally:
        free(buf)
    if err:
        raise OSError(err, os.strerror(err))
    return bad
