"""Byte patches that ride along the raw word writes: fields whose value follows the words.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A zip container (``torch.save`` files, ``.npz``) records a CRC-32 per entry; when words
inside an entry change, its CRC fields (local header, data descriptor, central directory)
are patched from the words' old and new values alone (:mod:`fastflip.files.formats.zipcrc`),
so the output is a valid archive that ``zipfile``/``np.load`` accept, and revert restores
the original bytes exactly. Patches are ``(file offset, old bytes, new bytes)``; the copy
path applies them while streaming (:func:`fastflip.files.copyapply.copy_apply`), the in-place
paths write them after the words.

Imports :mod:`fastflip.files.h5apply`, :mod:`fastflip.files.formats` and the word rule of :mod:`fastflip.core.wordrule`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Mapping, Sequence

import numpy as np

from ..core.dtypes import from_words, word_type
from ..core.plan import Plan
from ..core.wordrule import new_words_for
from .filebytes import ByteUndo
from .formats import FormatError, detect_format
from .encoded import member_crcs, zip_crc_patches
from .h5apply import route_sites, write_words_to_file
from .routes import SiteRoute
from .layout import Tensor

if TYPE_CHECKING:
    from .formats.zipcrc import MemberCrcs, ZipIndex

__all__ = ["zip_format", "is_zip_container", "member_check", "refuse_damaged_tensors", "restore_words", "crc_patches",
           "expected_new", "write_patches", "word_patches", "patch_undo", "word_undo", "without_positions",
           "delta_patches", "revert_patches"]

Patch = tuple[int, bytes, bytes]


def zip_format(path: str) -> str | None:
    """``"torch"`` or ``"npz"`` for a torch.save file or an .npz archive (zip containers of raw tensor data), else
    None."""
    try:
        fmt = detect_format(path)
    except FormatError:
        return None
    return fmt if fmt in ("torch", "npz") else None


def is_zip_container(path: str) -> bool:
    """True for torch.save files and .npz archives (:func:`zip_format`)."""
    return zip_format(path) is not None


def _by_type(routes: Sequence[SiteRoute], key: Callable[[SiteRoute], Hashable], raw_only: bool
             ) -> list[tuple[SiteRoute, np.ndarray, np.ndarray]]:
    """The sites of ``routes`` (only those with a file offset: ``raw_only``) grouped by ``key(route)``: one
    ``(first route of the group, plan positions, offsets)`` per group, so that the word rule and the byte
    conversions run once per word type rather than once per tensor."""
    groups: dict[Hashable, list[tuple[SiteRoute, np.ndarray, np.ndarray]]] = {}
    for r in routes:
        if raw_only:
            keep = r.offsets >= 0
            if not keep.all():
                if not keep.any():
                    continue
                r = SiteRoute(r.tensor, r.positions[keep], r.offsets[keep])
        groups.setdefault(key(r), []).append((r, r.positions, r.offsets))
    return [(g[0][0], np.concatenate([p for _, p, _ in g]) if len(g) > 1 else g[0][1],
             np.concatenate([o for _, _, o in g]) if len(g) > 1 else g[0][2]) for g in groups.values()]


def member_check(path: str, routes: Sequence[SiteRoute], index: ZipIndex | None = None) -> MemberCrcs:
    """The CRC-32 check of the stored members of the ``.npz`` at ``path`` (the caller knows it is one:
    :func:`zip_format`) that hold a raw site of ``routes``, as ``np.load`` checks them (deflated members are checked
    where they are inflated): fed by a copy's one pass over the file, or read by itself (``.check()``);
    ``index``: the caller's :func:`fastflip.files.encoded.zip_index` of ``path``. A ``torch.save`` archive is not
    checked: ``torch.load`` reads its entries without their CRC-32, and so does fastflip."""
    offs = [r.offsets[r.offsets >= 0] for r in routes]
    return member_crcs(path, np.concatenate(offs) if offs else np.zeros(0, np.int64), index)


def refuse_damaged_tensors(path: str, tensors: Sequence[Tensor], label: str | None = None) -> None:
    """Refuse the ``.npz`` at ``path`` when a stored member holding one of ``tensors`` does not match its CRC-32, as
    ``np.load`` refuses such a member (as :func:`member_check`, each member read once): the one check of a working
    copy whose later injects into these tensors skip it (``inject_file(members_checked=True)``: a campaign's
    trials), named in the refusal as ``label`` (default ``path``: the file the copy was made of). Tensors without
    raw storage (deflated members) are left to the inflating reader, as there."""
    offs = [t.offset for t in tensors if t.raw_writable and t.offset is not None and t.nbytes]
    check = member_crcs(path, np.array(offs, np.int64))
    check.label = label or path
    check.check()


def expected_new(plan: Plan, routes: Sequence[SiteRoute], old: np.ndarray) -> np.ndarray:
    """The words the plan's rule makes from ``old`` (plan order)."""
    new = np.zeros(len(plan), np.uint64)
    for r, pos, _ in _by_type(routes, lambda r: (r.tensor.dtype, r.tensor.format), raw_only=False):
        new[pos] = new_words_for(old[pos], plan, pos, word_type(r.tensor.dtype, r.tensor.format))
    return new


def crc_patches(path: str, routes: Sequence[SiteRoute], old: np.ndarray, new: np.ndarray,
                index: ZipIndex | None = None) -> list[Patch]:
    """CRC-field patches of the zip container at ``path`` for words changing from ``old`` to ``new``; ``index``: the
    caller's :func:`fastflip.files.encoded.zip_index` of ``path`` (else it is read here)."""
    live = [(r, r.offsets >= 0) for r in routes if (r.offsets >= 0).any()]  # stored entries (raw path) only
    if not live:
        return []
    pos = np.concatenate([r.positions[k] for r, k in live])
    offs = np.concatenate([r.offsets[k] for r, k in live])
    size = np.concatenate([np.full(int(k.sum()), r.tensor.itemsize, np.int64) for r, k in live])
    big = np.concatenate([np.full(int(k.sum()), r.tensor.dtype.byteorder == ">", bool) for r, k in live])
    return zip_crc_patches(path, offs, size, big, old[pos], new[pos], index)


def restore_words(path: str, plan: Plan, by_name: Mapping[str, Tensor], old: np.ndarray, new: np.ndarray,
                  routes: Sequence[SiteRoute] | None = None, zipped: bool | None = None) -> None:
    """Write the words ``old`` back at the plan's sites of ``path``, which now hold ``new``, with the zip CRC fields
    that follow them (``zipped``: a torch.save file or ``.npz``; None: detected): the undo, checking nothing, of an
    in-place inject without byte undo data, into a file that is the caller's own (a revert, a campaign trial)."""
    routes = list(routes) if routes is not None else route_sites(path, plan, by_name)
    write_words_to_file(path, plan, by_name, old, routes)
    if is_zip_container(path) if zipped is None else zipped:
        write_patches(path, crc_patches(path, routes, new, old))


def write_patches(path: str, patches: Sequence[Patch], *, new: bool = True) -> None:
    """Write each patch's new (or, with ``new=False``, old) bytes into the file at ``path``."""
    if not patches:
        return
    with open(path, "r+b") as fh:
        for off, ob, nb in patches:
            fh.seek(off)
            fh.write(nb if new else ob)


def word_patches(routes: Sequence[SiteRoute], old: np.ndarray, new: np.ndarray) -> list[Patch]:
    """The raw-path sites of ``routes`` as patches (stored bytes of their old and new words)."""
    out: list[Patch] = []
    for r in routes:
        keep = r.offsets >= 0
        if not keep.any():
            continue
        pos, offs = r.positions[keep], r.offsets[keep]
        u = word_type(r.tensor.dtype).uint
        each = f"V{r.tensor.itemsize}"  # one bytes object per element, cut by numpy
        ob = np.frombuffer(from_words(old[pos].astype(u), r.tensor.dtype).tobytes(), each).tolist()
        nb = np.frombuffer(from_words(new[pos].astype(u), r.tensor.dtype).tobytes(), each).tolist()
        out.extend(zip(offs.tolist(), ob, nb))
    return out


def patch_undo(patches: Sequence[Patch], size: int) -> ByteUndo:
    """A :class:`~fastflip.files.filebytes.ByteUndo` of non-overlapping same-size patches (file size unchanged)."""
    ps = sorted(patches)
    return ByteUndo(np.array([p[0] for p in ps], np.int64), np.array([len(p[1]) for p in ps], np.int64),
                    b"".join(p[1] for p in ps), size, b"".join(p[2] for p in ps), size)


def word_undo(routes: Sequence[SiteRoute], old: np.ndarray, new: np.ndarray, extra: Sequence[Patch],
              size: int) -> ByteUndo:
    """``patch_undo(extra + word_patches(routes, old, new), size)``, built from arrays (no Python object per
    site): the raw-path sites' stored old and new bytes and the same-size ``extra`` patches (zip CRC fields,
    re-encoded chunks), in offset order."""
    offs, lens, ob, nb = [], [], [], []
    for r, pos, at in _by_type(routes, lambda r: r.tensor.dtype, raw_only=True):
        dt, u = r.tensor.dtype, word_type(r.tensor.dtype).uint
        offs.append(at.astype(np.int64, copy=False))
        lens.append(np.full(len(at), dt.itemsize, np.int64))
        ob.append(from_words(old[pos].astype(u), dt).view(np.uint8))
        nb.append(from_words(new[pos].astype(u), dt).view(np.uint8))
    if extra:
        offs.append(np.array([p[0] for p in extra], np.int64))
        lens.append(np.array([len(p[1]) for p in extra], np.int64))
        ob.append(np.frombuffer(b"".join(p[1] for p in extra), np.uint8))
        nb.append(np.frombuffer(b"".join(p[2] for p in extra), np.uint8))
    if not offs:
        return patch_undo([], size)
    off, ln = np.concatenate(offs), np.concatenate(lens)
    old_b, new_b = np.concatenate(ob), np.concatenate(nb)
    if len(off) > 1 and not bool((off[1:] > off[:-1]).all()):
        order = np.argsort(off, kind="stable")
        start = np.cumsum(ln) - ln  # each range's first byte in old_b / new_b
        off, ln = off[order], ln[order]
        # byte k of the sorted data comes from start[order[i]] + (k - first byte of range i in the sorted data)
        at = np.repeat(start[order] - (np.cumsum(ln) - ln), ln) + np.arange(int(ln.sum()))
        old_b, new_b = old_b[at], new_b[at]
    return ByteUndo(off, ln, old_b.tobytes(), size, new_b.tobytes(), size)


def delta_patches(undo: ByteUndo, *, forward: bool) -> list[Patch] | None:
    """A byte delta that keeps the file's size as patches: old to new bytes (``forward``, a replay) or new to old
    (a revert); None when the sizes differ (bytes move: the delta is applied by :class:`ByteUndo` itself)."""
    if undo.new_size != undo.size:
        return None
    out: list[Patch] = []
    pos = 0
    for off, ln in zip(undo.offsets.tolist(), undo.lengths.tolist()):
        ob, nb = undo.data[pos : pos + ln], undo.new_data[pos : pos + ln]
        out.append((int(off), ob, nb) if forward else (int(off), nb, ob))
        pos += ln
    return out


def revert_patches(path: str, undo: ByteUndo | None, routes: Sequence[SiteRoute], new: np.ndarray,
                   old: np.ndarray) -> list[Patch] | None:
    """Every byte a revert of the logged output at ``path`` writes, as non-overlapping same-size patches (new to
    old bytes: the logged delta, or the sites' words and the zip CRCs that follow them); None where a revert is
    not that (a delta that changes the size, sites only the HDF5 library can write, one element twice)."""
    if undo is not None:
        return delta_patches(undo, forward=False)
    if any((r.offsets < 0).any() for r in routes):
        return None
    ps = word_patches(routes, new, old)
    if len({p[0] for p in ps}) != len(ps):
        return None
    return ps + (crc_patches(path, routes, new, old) if is_zip_container(path) else [])


def without_positions(routes: Sequence[SiteRoute], done: np.ndarray, *, only_h5: bool = True) -> list[SiteRoute]:
    """``routes`` restricted to hdf5-path sites (offset -1) whose plan positions are not in ``done``."""
    out = []
    for r in routes:
        keep = (r.offsets < 0) if only_h5 else np.ones(len(r.offsets), bool)
        keep &= ~np.isin(r.positions, done)
        if keep.any():
            out.append(SiteRoute(r.tensor, r.positions[keep], r.offsets[keep]))
    return out


def tensors_of(routes: Sequence[SiteRoute]) -> Mapping[str, Tensor]:
    return {r.tensor.path: r.tensor for r in routes}
