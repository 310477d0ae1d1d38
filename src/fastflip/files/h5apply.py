"""Apply plans to HDF5 files: raw byte I/O where storage allows it, HDF5 read-modify-write elsewhere.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Two paths, chosen per site, giving identical words (tested):

* **raw** — contiguous data and allocated chunks of unfiltered chunked data have a
  fixed byte offset per element (:func:`fastflip.files.h5offsets.element_byte_offsets`). The
  file is memory-mapped and the native kernel (:mod:`fastflip.kernels.dispatch`) rewrites the
  words at the computed offsets in one call per tensor: no HDF5 call and no Python
  loop per flip.
  When the output is a new file (the default), the raw sites are applied while the
  file is copied (:func:`fastflip.files.copyapply.copy_apply`).
* **hdf5** — filtered chunks (gzip, shuffle, lzf, fletcher32, ...), compact data and
  never-written chunks are changed by reading each touched chunk (or the whole
  compact dataset) through h5py, rewriting the words in NumPy and writing the chunk back.

External raw storage and virtual datasets are refused before anything is written:
fastflip never writes outside the checkpoint file.
"""

from __future__ import annotations

import mmap
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.dtypes import from_words, to_words, word_type
from ..core.plan import Plan
from ..core.records import SiteArrays, TensorTable
from ..core.wordrule import new_words_for
from ..errors import InputFileError, LogMismatchError, UnsupportedStorageError
from ..kernels import dispatch as native
from .encoded import member_words
from .formats import detect_format
from .h5index import tensor_element_offsets
from .h5offsets import chunk_address_base
from .h5open import open_read_only
from .keras_dtypes import stored_words
from .layout import Tensor, open_dataset
from .routes import SiteRoute

__all__ = ["SiteRoute", "RawSites", "route_sites", "read_words", "apply_plan_to_file", "write_words_to_file",
           "check_storage", "copy_apply"]


def check_storage(tensors: Sequence[Tensor]) -> None:
    """Refuse tensors whose storage fastflip must not or cannot write."""
    for t in tensors:
        if t.storage == "external":
            raise UnsupportedStorageError(
                f"{t.path}: raw data is stored in an external file (fastflip never writes outside the checkpoint); "
                f"exclude it (--exclude '{t.path}')")
        if t.storage == "virtual":
            raise UnsupportedStorageError(
                f"{t.path}: virtual dataset (its data lives in other datasets); exclude it (--exclude '{t.path}')")


def route_sites(path: str, plan: Plan, tensors: Mapping[str, Tensor]) -> list[SiteRoute]:
    """Work out, per tensor of the plan, which sites go the raw way (with their byte offsets)."""
    routes: list[SiteRoute] = []
    groups = plan.per_tensor()
    opened: list[Any] = []  # the file in HDF5, opened only when a chunked tensor needs it

    def dataset(t: Tensor) -> Any:
        import h5py

        if not opened:
            opened.append(open_read_only(path))
        return h5py.Dataset(open_dataset(opened[0], t.path))

    fsize = os.path.getsize(path)
    try:
        for tid, pos in groups:
            ref = plan.tensors[tid]
            t = tensors.get(ref.name)
            if t is None:
                raise LogMismatchError(f"tensor {ref.name} is not in {path}")
            if t.dtype.str != ref.dtype or tuple(t.shape) != tuple(ref.shape):
                raise LogMismatchError(
                    f"tensor {ref.name}: file has {t.dtype.str} {t.shape}, plan expects {ref.dtype} {tuple(ref.shape)}")
            check_storage([t])
            idx = plan.index[pos]
            if t.storage == "contiguous":
                assert t.offset is not None
                offs = t.offset + idx * t.itemsize
            elif t.storage == "chunked":
                # only the touched chunks are looked up, where it can without opening the file in HDF5 (h5index.py)
                offs = tensor_element_offsets(path, t, idx, lambda t=t: dataset(t), chunk_address_base)
            else:
                offs = np.full(len(idx), -1, np.int64)
            if len(offs) and int(offs.max()) + t.itemsize > fsize:
                raise InputFileError(f"{path}: damaged HDF5 file: data of {t.path} lies past the end of the file")
            routes.append(SiteRoute(t, pos, offs))
    finally:
        for fid in opened:
            fid.close()
    return routes


def _chunk_groups(t: Tensor, idx: np.ndarray) -> list[tuple[tuple[slice, ...], np.ndarray, np.ndarray]]:
    """[(region slices, positions into idx, flat index within the region)] per touched chunk."""
    shape = tuple(t.shape)
    if not shape:
        return [((), np.arange(len(idx)), np.zeros(len(idx), np.int64))]
    chunks = t.chunks or shape
    coords = np.stack(np.unravel_index(idx, shape), axis=1)
    cid = coords // np.asarray(chunks, np.int64)
    grid = tuple(-(-s // c) for s, c in zip(shape, chunks))
    key = np.ravel_multi_index(tuple(cid.T), grid)
    order = np.argsort(key, kind="stable")
    uniq, starts = np.unique(key[order], return_index=True)
    bounds = list(starts[1:]) + [len(order)]
    out = []
    for u, s, e in zip(uniq.tolist(), starts.tolist(), bounds):
        at = order[s:e]
        c0 = np.array(np.unravel_index(u, grid)) * np.asarray(chunks)
        c1 = np.minimum(c0 + np.asarray(chunks), np.asarray(shape))
        region = tuple(slice(int(a), int(b)) for a, b in zip(c0, c1))
        local = np.ravel_multi_index(tuple((coords[at] - c0).T), tuple((c1 - c0).tolist()))
        out.append((region, at, local.astype(np.int64)))
    return out


def _h5_sites(f: "object", route: SiteRoute, plan: Plan, mode: str, words: np.ndarray | None,
              old_out: np.ndarray, new_out: np.ndarray) -> None:
    """Read (mode 'read'), apply the plan ('apply') or store given words ('write') through h5py."""
    sel = np.flatnonzero(route.offsets < 0)
    if not len(sel):
        return
    t = route.tensor
    ds = f[t.path]  # type: ignore[index]
    pos = route.positions[sel]
    for region, at, local in _chunk_groups(t, plan.index[pos]):
        block = np.array(stored_words(ds[region] if region else ds[()], t.dtype), dtype=t.dtype, copy=True)
        flat = block.reshape(-1)
        old = to_words(flat[local]).astype(np.uint64)
        site = pos[at]
        old_out[site] = old
        if mode == "read":
            continue
        new = (new_words_for(old, plan, site, word_type(t.dtype, t.format)) if mode == "apply"
               else words[site])  # type: ignore[index]
        new_out[site] = new
        flat[local] = from_words(new.astype(word_type(t.dtype).uint), t.dtype)
        stored = block.view(ds.dtype) if ds.dtype.kind == "V" else block
        if region:
            ds[region] = stored
        else:
            ds[()] = stored.reshape(())


@dataclass
class RawSites:
    """The raw-path sites of a plan in file-offset order (the order every block walk uses).

    The plan's columns are gathered into that order once, so each block works on slices; results
    are collected in that order and scattered back once. ``sites`` is the one site type
    (:class:`fastflip.core.records.SiteArrays`: ``positions`` in the plan, absolute and increasing
    ``offsets``); its ``tensor`` column indexes ``table``, a :class:`fastflip.core.records.TensorTable`
    with one row per stored word type (dtype and float format: every tensor of one type shares a row,
    so a block's sites take one kernel call per type; ``bases`` are 0, offsets being absolute).
    """

    sites: SiteArrays
    table: TensorTable

    @classmethod
    def from_routes(cls, routes: list[SiteRoute], plan: Plan, words: np.ndarray | None = None) -> "RawSites":
        routes = [r for r in routes if len(r.offsets)]
        z = np.zeros(0, np.int64)
        site = np.concatenate([r.positions for r in routes]) if routes else z
        offs = np.concatenate([r.offsets for r in routes]) if routes else z
        counts = np.array([len(r.offsets) for r in routes], np.int64)
        keep = offs >= 0
        with_raw = np.logical_or.reduceat(keep, np.cumsum(counts) - counts) if routes else np.zeros(0, bool)
        # sites are grouped by word type (bfloat16 is not uint16), not by tensor
        keys: dict[tuple[Any, Any], int] = {}
        per = [keys.setdefault((r.tensor.dtype, r.tensor.format), len(keys)) if w else -1
               for r, w in zip(routes, with_raw.tolist())]
        code = np.repeat(np.array(per, np.int64), counts)
        if not keep.all():
            site, offs, code = site[keep], offs[keep], code[keep]
        if len(offs) > 1 and not bool((offs[1:] > offs[:-1]).all()):
            order = np.argsort(offs, kind="stable")
            site, offs, code = site[order], offs[order], code[order]
        sites = SiteArrays(positions=site, tensor=code, offsets=offs, and_mask=plan.and_mask[site],
                           or_mask=plan.or_mask[site], xor_mask=plan.xor_mask[site],
                           scale=None if plan.scale is None else plan.scale[site],
                           words=None if words is None else np.asarray(words, np.uint64)[site])
        return cls(sites, TensorTable.of_words([word_type(*k) for k in keys]))

    def __len__(self) -> int:
        return len(self.sites)

    def stop(self, lo: int, end: int) -> int:
        """Index one past the last site (from ``lo``) that starts before byte ``end``."""
        return lo + int(np.searchsorted(self.sites.offsets[lo:], end, side="left"))

    def spill(self, hi: int, end: int) -> int:
        """Bytes the last site before ``hi`` reaches past ``end`` (0 when none does)."""
        if not hi:
            return 0
        s = self.sites
        return max(0, int(s.offsets[hi - 1]) + int(self.table.itemsizes[int(s.tensor[hi - 1])]) - end)

    def run_block(self, arr: np.ndarray, base: int, lo: int, hi: int, mode: str, old: np.ndarray,
                  new: np.ndarray, backend: str) -> None:
        """Read / apply / write the sites ``lo:hi`` that lie in ``arr`` (the file's bytes from ``base``);
        old and new words go to ``old[lo:hi]``, ``new[lo:hi]`` (this object's order)."""
        s = self.sites
        codes = s.tensor[lo:hi]
        if codes[0] == codes[-1] and bool((codes == codes[0]).all()):
            groups = [(int(codes[0]), slice(lo, hi))]
        else:
            groups = [(c, np.flatnonzero(codes == c) + lo) for c in np.unique(codes).tolist()]
        for code, at in groups:
            wt = self.table.dtypes[code]
            offs = s.offsets[at] - base
            if mode == "apply":
                old[at], new[at] = native.apply_at_offsets(
                    arr, offs, wt.itemsize, wt.swapped, s.and_mask[at], s.or_mask[at], s.xor_mask[at],
                    backend=backend, scale=None if s.scale is None else s.scale[at], dtype=wt)
                continue
            old[at] = native.read_at_offsets(arr, offs, wt.itemsize, wt.swapped, backend=backend)
            if mode == "write":
                assert s.words is not None
                native.write_at_offsets(arr, offs, wt.itemsize, wt.swapped, s.words[at], backend=backend)
                new[at] = s.words[at]

    def scatter(self, old: np.ndarray, new: np.ndarray, old_out: np.ndarray, new_out: np.ndarray) -> None:
        """Move results from this object's order to plan order."""
        old_out[self.sites.positions] = old
        new_out[self.sites.positions] = new


_WINDOW = 32 << 20  # bytes of the file mapped at a time: memory stays bounded whatever the file size
# madvise(MADV_POPULATE_WRITE) (Linux 5.14+; None once the kernel refused it, or elsewhere)
_POPULATE_WRITE: int | None = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform == "linux" else None)


def prefault_writable(mm: mmap.mmap, offsets: np.ndarray) -> None:
    """Fault the pages of the shared mapping ``mm`` that hold ``offsets`` (byte offsets into it) in writable,
    one ``madvise`` call per run of consecutive pages, before the kernels read and then write each word there.

    Without it, a page's first access (the word's read) maps it read-only and the write that follows faults
    again to make it writable: two faults a page, which for thousands of scattered words cost more than the
    words themselves. No byte changes (every page with a word is about to be written anyway). Only a hint:
    where the kernel refuses it (before Linux 5.14), nothing is done.
    """
    global _POPULATE_WRITE
    if _POPULATE_WRITE is None or len(offsets) < 2:
        return
    page = mmap.PAGESIZE
    pages = offsets // page
    if not bool((pages[1:] >= pages[:-1]).all()):
        pages = np.sort(pages)
    brk = np.flatnonzero(np.diff(pages) > 1)  # where a run of pages ends (a page twice stays in its run)
    first = pages[np.r_[0, brk + 1]] * page
    last = (pages[np.r_[brk, len(pages) - 1]] + 1) * page
    size = len(mm)
    try:
        for lo, hi in zip(first.tolist(), np.minimum(last, size).tolist()):
            mm.madvise(_POPULATE_WRITE, lo, hi - lo)
    except OSError:  # EINVAL: an older kernel; later calls skip it
        _POPULATE_WRITE = None


def _run_raw_mapped(path: str, raw: RawSites, mode: str, old_out: np.ndarray, new_out: np.ndarray,
                    backend: str) -> None:
    """Visit the raw sites through shared mappings of bounded windows of the file.

    Writes reach the page cache (the caller fsyncs when it needs durability). Only
    windows that hold sites are mapped, one at a time, so the resident set stays
    bounded by the window size even for multi-GB files.
    """
    write = mode != "read"
    old = np.zeros(len(raw), np.uint64)
    new = np.zeros(len(raw), np.uint64)
    fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
    try:
        fsize = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
        lo = 0
        while lo < len(raw):
            base = int(raw.sites.offsets[lo]) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
            end = min(base + _WINDOW, fsize)
            hi = raw.stop(lo, end)
            end = min(end + raw.spill(hi, end), fsize)
            mm = mmap.mmap(fd, end - base, flags=mmap.MAP_SHARED, prot=prot, offset=base)
            try:
                if write:
                    prefault_writable(mm, raw.sites.offsets[lo:hi] - base)
                arr = np.frombuffer(mm, dtype=np.uint8)
                raw.run_block(arr, base, lo, hi, mode, old, new, backend)
                del arr
            finally:
                mm.close()
            lo = hi
    finally:
        os.close(fd)
    raw.scatter(old, new, old_out, new_out)


def _run(path: str, plan: Plan, routes: list[SiteRoute], mode: str, words: np.ndarray | None = None,
         backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    n = len(plan)
    old = np.zeros(n, np.uint64)
    new = np.zeros(n, np.uint64)
    write = mode != "read"
    raw = RawSites.from_routes(routes, plan, words)
    if len(raw):
        _run_raw_mapped(path, raw, mode, old, new, backend)
    h5 = [r for r in routes if (r.offsets < 0).any()]
    if h5 and mode == "read" and not _is_hdf5(path):  # deflated .npz members: inflated and read
        member_words(path, plan, h5, old)
    elif h5:
        import h5py

        with h5py.File(path, "r+" if write else "r") as f:
            for r in h5:
                _h5_sites(f, r, plan, mode, words, old, new)
    return old, new


def _is_hdf5(path: str) -> bool:
    return detect_format(path) == "hdf5"


def read_words(path: str, plan: Plan, tensors: Mapping[str, Tensor], routes: list[SiteRoute] | None = None) -> np.ndarray:
    """Current words (native order, uint64) of every plan site in the file at ``path``."""
    routes = routes if routes is not None else route_sites(path, plan, tensors)
    return _run(path, plan, routes, "read")[0]


def apply_plan_to_file(path: str, plan: Plan, tensors: Mapping[str, Tensor], routes: list[SiteRoute] | None = None,
                       backend: str = "auto") -> tuple[np.ndarray, np.ndarray, bool]:
    """Apply ``plan`` to the file at ``path`` in place; return (old words, new words, used the hdf5 path)."""
    routes = routes if routes is not None else route_sites(path, plan, tensors)
    old, new = _run(path, plan, routes, "apply", backend=backend)
    return old, new, any((r.offsets < 0).any() for r in routes)


def write_words_to_file(path: str, plan: Plan, tensors: Mapping[str, Tensor], words: np.ndarray,
                        routes: list[SiteRoute] | None = None) -> tuple[np.ndarray, bool]:
    """Store ``words`` at the plan's sites; return (previous words, used the hdf5 path)."""
    routes = routes if routes is not None else route_sites(path, plan, tensors)
    old, _ = _run(path, plan, routes, "write", words=np.asarray(words, np.uint64))
    return old, any((r.offsets < 0).any() for r in routes)
