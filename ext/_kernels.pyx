# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Typed word kernels over a raw byte buffer (no validation, no policy).

The caller (fastflip.kernels.dispatch) validates every argument once: offsets lie inside the
buffer, itemsize is 1, 2, 4 or 8, all columns have the same length. Each word is
read from ``buf[off:off+itemsize]`` (unaligned access is fine), byte-swapped when
``swap`` is true (storage order differs from this machine's), turned into the new
word by the word rule ``ff_rule`` of ``ff_word.h`` and written back the same way.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t
from libc.string cimport memcpy


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


def apply_words(uint8_t[::1] buf, const int64_t[::1] offsets, int itemsize, bint swap,
                const uint64_t[::1] and_mask, const uint64_t[::1] or_mask, const uint64_t[::1] xor_mask,
                uint64_t[::1] old_out, uint64_t[::1] new_out):
    """Apply the word rule at every byte offset; store old and new words (native order)."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef uint64_t old, new
    cdef uint8_t* base = &buf[0] if buf.shape[0] else NULL
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
    with nogil:
        for i in range(n):
            out[i] = _load(base + offsets[i], itemsize, swap)


def write_words(uint8_t[::1] buf, const int64_t[::1] offsets, int itemsize, bint swap, const uint64_t[::1] words):
    """Write ``words`` (native order) at every byte offset."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef uint8_t* base = &buf[0] if buf.shape[0] else NULL
    with nogil:
        for i in range(n):
            _store(base + offsets[i], words[i], itemsize, swap)


# ---------------------------------------------------------------------------------------------
# Multi-tensor kernels: one call over several tensors given their base addresses. Site ``i``
# touches the word at ``ptrs[tensor[i]] + offsets[i]`` whose width and byte order are those of
# its tensor. The caller guarantees that every address lies inside a live, writable buffer.
# ---------------------------------------------------------------------------------------------

def apply_ptrs(const uint64_t[::1] ptrs, const int32_t[::1] itemsizes, const uint8_t[::1] swaps,
               const int32_t[::1] tensor, const int64_t[::1] offsets,
               const uint64_t[::1] and_mask, const uint64_t[::1] or_mask, const uint64_t[::1] xor_mask,
               uint64_t[::1] old_out, uint64_t[::1] new_out):
    """Apply the word rule at ``ptrs[tensor[i]] + offsets[i]`` for every site; store old and new words."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    cdef int size
    cdef uint64_t old, new
    cdef uint8_t* p
    if (tensor.shape[0] < n or and_mask.shape[0] < n or or_mask.shape[0] < n or xor_mask.shape[0] < n
            or old_out.shape[0] < n or new_out.shape[0] < n):
        raise ValueError("apply_ptrs: every column needs one entry per offset")
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
              const int32_t[::1] tensor, const int64_t[::1] offsets, uint64_t[::1] out):
    """Read the word of every site (native order) into ``out``."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    if tensor.shape[0] < n or out.shape[0] < n:
        raise ValueError("read_ptrs: every column needs one entry per offset")
    with nogil:
        for i in range(n):
            t = tensor[i]
            out[i] = _load(<uint8_t*><size_t>ptrs[t] + offsets[i], itemsizes[t], swaps[t])


def write_ptrs(const uint64_t[::1] ptrs, const int32_t[::1] itemsizes, const uint8_t[::1] swaps,
               const int32_t[::1] tensor, const int64_t[::1] offsets, const uint64_t[::1] words):
    """Write ``words`` (native order) at every site."""
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef int32_t t
    if tensor.shape[0] < n or words.shape[0] < n:
        raise ValueError("write_ptrs: every column needs one entry per offset")
    with nogil:
        for i in range(n):
            t = tensor[i]
            _store(<uint8_t*><size_t>ptrs[t] + offsets[i], words[i], itemsizes[t], swaps[t])
