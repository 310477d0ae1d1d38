"""A new file written while its input is copied: the raw sites and byte patches applied on the way, both files hashed.

Layer: ``files`` (may import core, kernels and files; imported by live and above). Used by
:func:`fastflip.files.inject.write_plan` for the default output (a new file, whole-file hashes).

:func:`copy_apply`: the blocks no site or patch touches are copied file to file in the kernel
(``os.copy_file_range``) by a background thread, while the input is read once, block by block, and hashed;
the touched blocks are patched in memory by the native kernel (:class:`fastflip.files.h5apply.RawSites`) and
written at their offsets. The output's hash is a copy of the input's state at the first touched block,
continued over the output's bytes: the bytes before it are hashed once (on a helper thread where the hash does
not use every core itself and the machine has more than two). Where the kernel refuses to copy (another file
system), the blocks already read are written: the input is still read once (where it refuses only part-way,
the clean bytes after that point are read a second time).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

import numpy as np

from ..core.plan import Plan
from ..errors import LogMismatchError
from . import hashcache, hashing
from .filebytes import SpanCopier
from .h5apply import RawSites
from .routes import SiteRoute

__all__ = ["copy_apply"]

_BLOCK = 4 << 20  # the copy's read buffer (larger ones cost page faults, not speed)


def _patch_block(view: memoryview, base: int, end: int, patches: Sequence[tuple[int, bytes, bytes]],
                 pstart: np.ndarray, pend: np.ndarray, splice: np.ndarray) -> list[Any]:
    """Write the patches that meet the file bytes ``[base, end)`` (held in ``view``) over them; return the
    pieces of output (a spliced patch's new bytes replace its old range)."""
    pieces: list[Any] = [view[: end - base]]
    if not len(pstart):
        return pieces
    hit = np.flatnonzero((pstart < end) & (pend > base))
    for k in hit[~splice[hit]].tolist():
        off, _, data = patches[k]
        a, b = max(off, base), min(off + len(data), end)
        view[a - base : b - base] = data[a - off : b - off]
    if splice[hit].any():
        pieces, cur = [], base
        for k in hit[splice[hit]].tolist():
            off, ob, data = patches[k]
            if off >= base:
                pieces += [view[cur - base : off - base], data]
            cur = min(off + len(ob), end)
        pieces.append(view[cur - base : end - base])
    return pieces


def copy_apply(src: str, dst: str, plan: Plan, routes: list[SiteRoute], backend: str = "auto",
               block: int = _BLOCK, patches: Sequence[tuple[int, bytes, bytes]] = (), cached_input: bool = True,
               algorithm: str = "sha256", writeback: bool = False, member_crcs: Any = None
               ) -> tuple[str, str, np.ndarray, np.ndarray]:
    """Copy ``src`` to ``dst`` applying the plan's raw sites on the way; return
    (input digest, output digest before any hdf5-path edit, old words, new words), hashed with
    ``algorithm`` (:mod:`fastflip.files.hashing`).

    Sites that need the hdf5 path are left untouched here (their old/new stay 0).
    ``patches`` — sorted, non-overlapping ``(offset, old bytes, new bytes)`` — are written
    over the streamed bytes too (zip CRC fields, re-encoded HDF5 chunks); a patch whose new
    bytes have another length than its old ones replaces that input range in the output
    (a re-deflated zip member), so the output's length may differ from the input's.

    One read of the file, block by block, beside a kernel copy of its untouched spans (see
    :func:`_copy_buffered`). ``cached_input=False``
    hashes the input's bytes even when :mod:`fastflip.files.hashcache` knows them (in place: the log is the
    only way back to them). ``writeback=True`` (an output that will be fsynced) starts each written block's
    writeback to disk at once (:func:`fastflip.files.fileio.start_writeback`), so the fsync waits for little.
    ``member_crcs`` (a :class:`fastflip.files.formats.zipcrc.MemberCrcs`) is fed the input's bytes as they are read,
    before any is changed: the caller verifies the zip members' CRC-32 without reading them again.
    """
    pstart = np.array([p[0] for p in patches], np.int64)
    pend = np.array([p[0] + len(p[1]) for p in patches], np.int64)
    splice = np.array([len(p[1]) != len(p[2]) for p in patches], bool)
    n = len(plan)
    raw = RawSites.from_routes(routes, plan)
    old = np.zeros(len(raw), np.uint64)
    new = np.zeros(len(raw), np.uint64)
    st0, t0 = os.stat(src), time.time()
    # an input injected before, unchanged since: its hash is not redone (never for an input about to be replaced)
    known = hashcache.lookup(src, st0, algorithm) if cached_input else None
    h_in, h_out = _copy_buffered(src, dst, raw, patches, pstart, pend, splice, backend, old, new,
                                 block=max(1, min(block, st0.st_size)),  # small files: small buffers
                                 hash_input=known is None, algorithm=algorithm, writeback=writeback,
                                 member_crcs=member_crcs)
    if not hashcache.same_state(st0, os.stat(src)):
        raise LogMismatchError(f"{src} changed while it was being read; nothing was written")
    if known is None:
        hashcache.remember(src, st0, h_in, t0, algorithm)
    else:
        h_in = known
    old_out = np.zeros(n, np.uint64)
    new_out = np.zeros(n, np.uint64)
    raw.scatter(old, new, old_out, new_out)
    return h_in, h_out, old_out, new_out


def _dirty_spans(raw: RawSites, pstart: np.ndarray, pend: np.ndarray, size: int,
                 block: int) -> list[tuple[int, int, bool]]:
    """``[(start, end, dirty)]`` tiling the file ``[0, size)`` in order: dirty spans are the runs of ``block``-aligned
    blocks that hold a byte of a raw site's word or of a patch (a word is never split between spans)."""
    s = raw.sites
    wend = s.offsets + raw.table.itemsizes[s.tensor] if len(raw) else np.zeros(0, np.int64)
    first = np.concatenate([s.offsets, pstart]) // block
    last = (np.concatenate([wend, np.maximum(pend, pstart + 1)]) - 1) // block
    many = np.flatnonzero(last - first > 1)  # a long patch (a re-encoded chunk): every block it covers
    # a set, not np.unique (which imports numpy.ma: 20 ms of a one-flip command)
    ks = sorted({*first.tolist(), *last.tolist(), *[k for i in many.tolist() for k in range(first[i], last[i] + 1)]})
    spans: list[tuple[int, int, bool]] = []
    at = 0
    for k in ks:
        a, b = k * block, min((k + 1) * block, size)
        if a >= size:
            break
        if spans and spans[-1][2] and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b, True)
            at = b
            continue
        if a > at:
            spans.append((at, a, False))
        spans.append((a, b, True))
        at = b
    if at < size:
        spans.append((at, size, False))
    return spans


class _CleanCopy(threading.Thread):
    """Copies the clean spans (no site, no patch) of the input to the output in the kernel, in the background.

    The first piece tells whether the kernel copies at all (``verdict``; ``ok``): where it refuses, this thread
    stops and the reader writes the clean spans from the blocks it reads anyway (the input read once). Where the
    kernel refuses later, part-way, this thread reads the rest of the clean spans through its own buffer
    (:class:`~fastflip.files.filebytes.SpanCopier`): those bytes are read twice."""

    def __init__(self, copier: SpanCopier, spans: list[tuple[int, int, bool]], piece: int) -> None:
        super().__init__(name="fastflip-copy", daemon=True)
        self.copier, self.piece = copier, piece
        self.spans = [(a, b) for a, b, dirty in spans if not dirty]
        self.verdict, self.stop, self.ok = threading.Event(), threading.Event(), False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            first = True
            for a, b in self.spans:
                for at in range(a, b, self.piece):
                    if self.stop.is_set():
                        return
                    n = min(self.piece, b - at)
                    if first:
                        first = False
                        self.ok = self.copier.copy(at, n, fall_back=False)
                        self.verdict.set()
                        if not self.ok:
                            return
                    else:
                        self.copier.copy(at, n)
        except BaseException as exc:  # handed to the reader, raised there
            self.error = exc
        finally:
            self.verdict.set()

    def finish(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def _copy_buffered(src: str, dst: str, raw: RawSites, patches: Sequence[tuple[int, bytes, bytes]],
                   pstart: np.ndarray, pend: np.ndarray, splice: np.ndarray, backend: str, old: np.ndarray,
                   new: np.ndarray, *, block: int, hash_input: bool = True, algorithm: str = "sha256",
                   writeback: bool = False, member_crcs: Any = None) -> tuple[str, str]:
    """Copy ``src`` to ``dst`` with the sites applied and the patches written; return (input digest, output
    digest); the input digest is '' when ``hash_input`` is False.

    The file is cut into clean spans (no site, no patch) and dirty ones (:func:`_dirty_spans`). A background
    thread copies the clean spans file to file in the kernel (:class:`_CleanCopy`) while this thread reads the
    input once, block by block, hashes it, patches the dirty blocks in memory and writes them at their offsets.
    The output's hash is the input's up to the first dirty block (a copy of the hasher's state there: the bytes
    before it are the same), then follows the output's bytes, on a helper thread beside the input's hash where
    the machine has more than two cores (:func:`_hash_aside`). Where the kernel refuses to copy, or a patch changes
    a length (a re-deflated zip member: every later byte moves), every block is written from the buffer read.
    """
    hin: Any = hashing.new(algorithm)
    share = hash_input and hasattr(hin, "copy")  # the output's hash starts as a copy of the input's
    hout: Any = None if share else hashing.new(algorithm)
    if not hash_input:
        hin = None
    in_kernel = _kernel_copy_ok(splice)
    aside = _hash_aside(algorithm)  # the output's hash on a helper thread beside the input's: two buffers in turn
    bufs = [bytearray(block + 8) for _ in range(2 if aside else 1)]
    busy: list[Any] = [None] * len(bufs)  # the helper's pending update of each buffer's bytes
    helper: hashing.HashThread | None = None
    k = 0
    lo = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        spans = _dirty_spans(raw, pstart, pend, size, block)
        copier = SpanCopier(fin.fileno(), fout.fileno(), writeback=writeback)
        clean = _CleanCopy(copier, spans, max(block, 16 << 20)) if in_kernel else None
        if clean is not None:
            clean.start()
        try:
            for a, b, dirty in spans:
                base = a
                while base < b:
                    k = (k + 1) % len(bufs)
                    if busy[k] is not None:  # a buffer is read into only once its bytes are hashed
                        helper.wait(busy[k])  # type: ignore[union-attr]
                        busy[k] = None
                    buf = bufs[k]
                    view = memoryview(buf)
                    got = fin.readinto(view[: min(block, b - base)])
                    if not got:
                        raise LogMismatchError(f"{src} changed while it was being read; nothing was written")
                    end = base + got
                    if dirty:
                        hi = raw.stop(lo, end)
                        extra = raw.spill(hi, end)  # a word that starts in this block but ends after it
                        if extra:
                            more = fin.readinto(view[got : got + extra])
                            got += more
                            end += more
                    if member_crcs is not None:  # the input's bytes, before the sites change them
                        member_crcs.feed(base, view[:got])
                    if dirty and hout is None:  # the first dirty block: the bytes before it are the input's
                        hout = hin.copy()
                    if aside and helper is None and hout is not None:
                        helper = hashing.HashThread(hout)
                        helper.start()
                    if hin is not None:
                        hin.update(view[:got])
                    if dirty:
                        if hi > lo:
                            raw.run_block(np.frombuffer(buf, np.uint8, got), base, lo, hi, "apply", old, new,
                                          backend)
                            lo = hi
                        pieces = _patch_block(view, base, end, patches, pstart, pend, splice)
                    else:
                        pieces = [view[:got]]
                    if helper is not None:
                        busy[k] = helper.hand(pieces)
                    elif hout is not None:
                        for chunk in pieces:
                            hout.update(chunk)
                    if not in_kernel:
                        for chunk in pieces:
                            fout.write(chunk)
                    elif dirty:
                        copier.write(base, pieces)
                    else:
                        assert clean is not None
                        clean.verdict.wait()
                        if clean.error is not None:  # EIO, ENOSPC in the background copy: raised here, at once
                            clean.finish()
                        if not clean.ok:  # the kernel refused: this block is written from the buffer
                            copier.copy(base, got, view[:got])
                    base = end
            if helper is not None:
                helper.close()
        except BaseException:
            if clean is not None:
                clean.stop.set()
                clean.join()
            if helper is not None:
                helper.close(check=False)
            raise
        if clean is not None:
            clean.finish()
        fout.flush()
    if hout is None:  # no byte changed: the output is the input
        hout = hin
    return (hin.hexdigest() if hin is not None else ""), hout.hexdigest()


def _hash_aside(algorithm: str) -> bool:
    """Whether the output's hash runs on a helper thread beside the input's: on more than two cores, for a hash on
    one core (sha256, xxh3; blake3 spreads each update over every core already)."""
    return algorithm != "blake3" and (os.cpu_count() or 1) > 2


def _kernel_copy_ok(splice: np.ndarray) -> bool:
    """Whether blocks may be copied file to file in the kernel: no patch changes a length, and the OS has it."""
    return hasattr(os, "copy_file_range") and not splice.any()
