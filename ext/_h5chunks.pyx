# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""HDF5 chunk-index access in C, through the HDF5 library h5py already loaded (no Python call per chunk).

This module links against nothing: :func:`bind` receives the addresses of the HDF5 functions it
calls (``fastflip.files.h5index`` resolves them with ctypes from the libhdf5 that h5py loaded), so
it always calls the very library h5py uses, whatever its build. The caller holds h5py's global lock
(``h5py._objects.phil``) around every call, as h5py does around its own HDF5 calls.

Functions
---------
``bind(by_coord, chunk_iter, oinfo, token_to_addr)``
    Install the function addresses (0 for one this HDF5 lacks).
``lookup(dset, corners)``
    ``H5Dget_chunk_info_by_coord`` for each row of ``corners`` (chunk corner coordinates, int64
    (n, ndim)): (address, stored size, filter mask) arrays; address -1 for an unallocated chunk.
``walk(dset, ndim, n)``
    ``H5Dchunk_iter`` over the dataset's chunk index (its ``n`` allocated chunks, from
    ``H5Dget_num_chunks``): (corners (n, ndim), address, size, filter mask).
``object_info(loc, name)``
    (address, object type) of the object ``name`` below ``loc``, from ``H5Oget_info_by_name3``
    with ``H5O_INFO_BASIC`` only (h5py's ``h5o.get_info`` also asks for the header's metadata
    sizes, which makes HDF5 walk a chunked dataset's whole index).

Addresses are what HDF5 reports (``H5Dget_chunk_info`` and ``H5Dchunk_iter`` give the same), so
before HDF5 1.14.4 they are relative to the base address (without the user block), as h5py's are.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.time cimport time_t

cnp.import_array()

ctypedef int64_t hid_t
ctypedef int herr_t
ctypedef unsigned long long hsize_t
ctypedef uint64_t haddr_t

cdef struct H5O_token_t:
    uint8_t data[16]

cdef struct H5O_info2_t:
    unsigned long fileno
    H5O_token_t token
    int type
    unsigned rc
    time_t atime
    time_t mtime
    time_t ctime
    time_t btime
    hsize_t num_attrs

ctypedef int (*iter_op_t)(const hsize_t* offset, unsigned filter_mask, haddr_t addr, hsize_t size,
                          void* op_data) noexcept nogil
ctypedef herr_t (*by_coord_t)(hid_t, const hsize_t*, unsigned*, haddr_t*, hsize_t*) noexcept nogil
ctypedef herr_t (*chunk_iter_t)(hid_t, hid_t, iter_op_t, void*) noexcept nogil
ctypedef herr_t (*oinfo_t)(hid_t, const char*, H5O_info2_t*, unsigned, hid_t) noexcept nogil
ctypedef herr_t (*token_to_addr_t)(hid_t, H5O_token_t, haddr_t*) noexcept nogil

cdef enum:
    MAX_RANK = 32  # H5S_MAX_RANK
    H5O_INFO_BASIC = 1

cdef haddr_t HADDR_UNDEF = <haddr_t>(-1)
cdef hid_t H5P_DEFAULT = 0

cdef by_coord_t _by_coord = NULL
cdef chunk_iter_t _chunk_iter = NULL
cdef oinfo_t _oinfo = NULL
cdef token_to_addr_t _token_to_addr = NULL


def bind(uintptr_t by_coord, uintptr_t chunk_iter, uintptr_t oinfo, uintptr_t token_to_addr):
    """Install the HDF5 function addresses (0 where this HDF5 lacks one)."""
    global _by_coord, _chunk_iter, _oinfo, _token_to_addr
    _by_coord = <by_coord_t>by_coord
    _chunk_iter = <chunk_iter_t>chunk_iter
    _oinfo = <oinfo_t>oinfo
    _token_to_addr = <token_to_addr_t>token_to_addr


def bound():
    """(lookup, walk, object_info) available."""
    return _by_coord != NULL, _chunk_iter != NULL, _oinfo != NULL and _token_to_addr != NULL


def lookup(hid_t dset, const int64_t[:, ::1] corners):
    """(address int64 (-1: unallocated), size int64, filter mask uint32) of the chunks at ``corners``."""
    if _by_coord == NULL:
        raise RuntimeError("H5Dget_chunk_info_by_coord is not bound")
    cdef Py_ssize_t n = corners.shape[0], nd = corners.shape[1], i, k
    if nd > MAX_RANK:
        raise ValueError(f"rank {nd} above HDF5's {MAX_RANK}")
    addr = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    mask = np.empty(n, np.uint32)
    cdef int64_t[::1] a = addr, s = size
    cdef uint32_t[::1] m = mask
    cdef hsize_t off[MAX_RANK]
    cdef haddr_t ad
    cdef hsize_t sz
    cdef unsigned fm
    cdef herr_t rc = 0
    with nogil:
        for i in range(n):
            for k in range(nd):
                off[k] = <hsize_t>corners[i, k]
            ad = HADDR_UNDEF
            sz = 0
            fm = 0
            rc = _by_coord(dset, off, &fm, &ad, &sz)
            if rc < 0:
                break
            a[i] = -1 if ad == HADDR_UNDEF else <int64_t>ad
            s[i] = <int64_t>sz
            m[i] = fm
    if rc < 0:
        raise RuntimeError(f"H5Dget_chunk_info_by_coord failed for the chunk at {tuple(corners[i])}")
    return addr, size, mask


cdef struct _Walk:
    int64_t* coords
    int64_t* addr
    int64_t* size
    uint32_t* mask
    Py_ssize_t n
    Py_ssize_t cap
    int nd


cdef int _visit(const hsize_t* offset, unsigned filter_mask, haddr_t addr, hsize_t size, void* op_data) noexcept nogil:
    cdef _Walk* w = <_Walk*>op_data
    cdef int k
    if w.n >= w.cap:
        return 1  # more chunks than H5Dget_num_chunks said: stop (the caller refuses the index)
    for k in range(w.nd):
        w.coords[w.n * w.nd + k] = <int64_t>offset[k]
    w.addr[w.n] = -1 if addr == HADDR_UNDEF else <int64_t>addr
    w.size[w.n] = <int64_t>size
    w.mask[w.n] = filter_mask
    w.n += 1
    return 0


def walk(hid_t dset, int nd, Py_ssize_t n):
    """(corners int64 (m, nd), address int64, size int64, filter mask uint32) of every allocated chunk.

    ``m`` is the number of chunks HDF5 visited; it is ``n + 1`` when the index holds more than ``n``
    (the walk stops there), so a caller can tell an index that disagrees with ``H5Dget_num_chunks``.
    """
    if _chunk_iter == NULL:
        raise RuntimeError("H5Dchunk_iter is not bound")
    coords = np.empty((n + 1, max(nd, 1)), np.int64)
    addr = np.empty(n + 1, np.int64)
    size = np.empty(n + 1, np.int64)
    mask = np.empty(n + 1, np.uint32)
    cdef int64_t[:, ::1] c = coords
    cdef int64_t[::1] a = addr, s = size
    cdef uint32_t[::1] m = mask
    cdef _Walk w
    w.coords = &c[0, 0]
    w.addr = &a[0]
    w.size = &s[0]
    w.mask = &m[0]
    w.n = 0
    w.cap = n + 1
    w.nd = nd
    cdef herr_t rc
    with nogil:
        rc = _chunk_iter(dset, H5P_DEFAULT, _visit, &w)
    if rc < 0:
        raise RuntimeError("H5Dchunk_iter failed")
    return coords[:w.n, :nd], addr[:w.n], size[:w.n], mask[:w.n]


def object_info(hid_t loc, bytes name):
    """(address, H5O_type_t) of the object ``name`` (a link name below ``loc``; ``b"."`` for ``loc``)."""
    if _oinfo == NULL or _token_to_addr == NULL:
        raise RuntimeError("H5Oget_info_by_name3 is not bound")
    cdef H5O_info2_t info
    cdef haddr_t ad = HADDR_UNDEF
    cdef const char* cname = name
    cdef herr_t rc
    with nogil:
        rc = _oinfo(loc, cname, &info, H5O_INFO_BASIC, H5P_DEFAULT)
        if rc >= 0:
            rc = _token_to_addr(loc, info.token, &ad)
    if rc < 0:
        raise KeyError(name)
    return <int64_t>ad, info.type


# ------------------------------------------------------------------------------------------------
# A native reader of two chunk indexes (files/h5index.py parses the superblock and the layout message):
# the version-1 B-tree (what HDF5 writes with the earliest format, h5py's default) and the fixed array
# (the latest format, fixed-size datasets). Each lookup descends from the root with pread: a few reads a
# chunk, whatever the number of chunks (H5Dget_chunk_info_by_coord visits the index up to the chunk).

from posix.unistd cimport pread
from libc.stdlib cimport malloc, free, realloc
from libc.string cimport memcmp


cdef inline uint64_t _le(const uint8_t* p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(n - 1, -1, -1):
        v = (v << 8) | p[k]
    return v


cdef int _read(int fd, uint8_t* buf, Py_ssize_t n, int64_t at) noexcept nogil:
    cdef Py_ssize_t got = 0, r
    while got < n:
        r = pread(fd, buf + got, n - got, at + got)
        if r <= 0:
            return -1
        got += r
    return 0


def btree1_lookup(int fd, int64_t base, int64_t root, int sa, const int64_t[:, ::1] corners, int max_entries):
    """(address, size, filter mask) per corner from a version-1 B-tree of chunks (type 1) rooted at ``root``.

    Addresses are relative to ``base`` (as HDF5 keeps them); -1 for a chunk not in the tree. ``max_entries``
    bounds a node's entries (2K of the file's indexed-storage K). ValueError on a malformed node.
    """
    cdef Py_ssize_t n = corners.shape[0], nd = corners.shape[1], i, k, e
    cdef int key = 8 + 8 * (nd + 1)
    cdef Py_ssize_t cap = 4096  # grown (realloc) for a larger node
    addr = np.full(n, -1, np.int64)
    size = np.zeros(n, np.int64)
    mask = np.zeros(n, np.uint32)
    cdef int64_t[::1] a = addr, s = size
    cdef uint32_t[::1] m = mask
    cdef uint8_t* buf = <uint8_t*>malloc(cap)
    cdef const uint8_t* kp
    cdef int64_t node, lo, hi, mid, c
    cdef int level, used, depth, bad = 0, inside
    cdef Py_ssize_t got, need
    cdef uint8_t* grown
    if buf == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in range(n):
                node = root
                depth = 0
                while True:
                    depth += 1
                    if depth > 64 or node < 0:
                        bad = 1
                        break
                    # one read a node in the usual case: a page, then the rest of a larger node
                    got = pread(fd, buf, 4096, base + node)
                    if got < 8 + 2 * sa or memcmp(buf, b"TREE", 4) != 0 or buf[4] != 1:
                        bad = 1
                        break
                    used = <int>_le(buf + 6, 2)
                    need = 8 + 2 * sa + (used + 1) * key + used * sa
                    if used < 1 or used > max_entries:
                        bad = 1
                        break
                    if need > cap:
                        grown = <uint8_t*>realloc(buf, need)
                        if grown == NULL:
                            bad = 2
                            break
                        buf = grown
                        cap = need
                    if need > got and _read(fd, buf + got, need - got, base + node + got) < 0:
                        bad = 1
                        break
                    level = buf[5]
                    used = <int>_le(buf + 6, 2)
                    # the last child whose left key is <= the corner (keys: size, mask, offsets; children between)
                    lo = 0
                    hi = used - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        kp = buf + 8 + 2 * sa + mid * (key + sa) + 8
                        c = 0
                        for k in range(nd):
                            if <int64_t>_le(kp + 8 * k, 8) != corners[i, k]:
                                c = 1 if <int64_t>_le(kp + 8 * k, 8) < corners[i, k] else -1
                                break
                        if c >= 0:
                            lo = mid
                        else:
                            hi = mid - 1
                    kp = buf + 8 + 2 * sa + lo * (key + sa)
                    node = <int64_t>_le(kp + key, sa)
                    if level == 0:
                        inside = 1
                        for k in range(nd):
                            if <int64_t>_le(kp + 8 + 8 * k, 8) != corners[i, k]:
                                inside = 0
                        if inside:
                            a[i] = node
                            s[i] = <int64_t>_le(kp, 4)
                            m[i] = <uint32_t>_le(kp + 4, 4)
                        break
        if bad == 2:
            raise MemoryError()
        if bad:
            raise ValueError("malformed version-1 B-tree node in the chunk index")
    finally:
        free(buf)
    return addr, size, mask


def farray_lookup(int fd, int64_t base, int64_t header, int sa, int ss, const int64_t[::1] linear, bint filtered,
                  int64_t chunk_bytes):
    """(address, size, filter mask) per linear chunk index from a fixed-array chunk index (header at ``header``).

    Elements are an address (unfiltered: the size is ``chunk_bytes``), or address, size (the rest of the entry) and filter mask (filtered).
    Paged data blocks hold pages of ``2**page_bits`` elements, each followed by its checksum.
    """
    cdef Py_ssize_t n = linear.shape[0], i
    cdef uint8_t hdr[64]
    cdef uint8_t el[32]
    addr = np.full(n, -1, np.int64)
    size = np.zeros(n, np.int64)
    mask = np.zeros(n, np.uint32)
    cdef int64_t[::1] a = addr, s = size
    cdef uint32_t[::1] m = mask
    if _read(fd, hdr, 4 + 1 + 1 + 1 + 1 + ss + sa, base + header) < 0 or memcmp(hdr, b"FAHD", 4) != 0:
        raise ValueError("malformed fixed-array header in the chunk index")
    cdef int esize = hdr[6], page_bits = hdr[7]
    cdef int64_t nmax = <int64_t>_le(hdr + 8, ss)
    cdef int64_t dblock = <int64_t>_le(hdr + 8 + ss, sa)
    cdef uint64_t undef = (<uint64_t>1 << (8 * sa)) - 1 if sa < 8 else <uint64_t>(-1)
    cdef int size_len = esize - sa - 4
    if esize > 32 or esize < sa or (filtered and size_len < 1):
        raise ValueError("malformed fixed-array header in the chunk index")
    if <uint64_t>dblock == undef:
        return addr, size, mask
    cdef int64_t page = <int64_t>1 << page_bits
    cdef int paged = nmax > page
    cdef int64_t npages = (nmax + page - 1) // page
    cdef int64_t prefix = 4 + 1 + 1 + sa + ((npages + 7) // 8 if paged else 0) + (4 if paged else 0)
    cdef int64_t at, li
    cdef uint64_t ad
    with nogil:
        for i in range(n):
            li = linear[i]
            if li < 0 or li >= nmax:
                continue
            if paged:  # a page never written is not initialised (its bit in the bitmap, most significant first)
                if _read(fd, el, 1, base + dblock + 4 + 1 + 1 + sa + (li // page) // 8) < 0:
                    break
                if not (el[0] & (0x80 >> ((li // page) % 8))):
                    continue
                at = prefix + (li // page) * (page * esize + 4) + (li % page) * esize
            else:
                at = prefix + li * esize
            if _read(fd, el, esize, base + dblock + at) < 0:
                break
            ad = _le(el, sa)
            if ad == undef:
                continue
            a[i] = <int64_t>ad
            s[i] = chunk_bytes
            if filtered:
                s[i] = <int64_t>_le(el + sa, size_len)
                m[i] = <uint32_t>_le(el + sa + size_len, 4)
    return addr, size, mask
