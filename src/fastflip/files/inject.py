"""Inject faults into HDF5 checkpoints, and replay or revert an injection from its log.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

This is the Python API behind ``fastflip inject | replay | revert``::

    from fastflip import Sampling, Selection, inject_file
    res = inject_file("model.h5", "model.faulty.h5", seed=1, sampling=Sampling(bits="exponent-msb", count=10),
                      selection=Selection(include=["model_weights/**"]))
    res.log.manifest["counts"]        # sites, flips, nan_created, inf_created, ...
    revert(res.log_path, "model.faulty.h5")   # byte-for-byte the original again

The input is never modified unless ``in_place=True``; outputs are atomic (temporary
file beside the target, fsync, rename). The log (:mod:`fastflip.files.log`) is written
beside the output as ``<output>.fflog`` unless another path (or ``False``) is given.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> d = tempfile.mkdtemp(); src = os.path.join(d, "in.h5"); out = os.path.join(d, "out.h5")
>>> with h5py.File(src, "w") as f:
...     _ = f.create_dataset("w", data=np.ones((8, 8), "f4"))
>>> res = inject_file(src, out, seed=3, sampling=Sampling(count=4, bits="sign"))
>>> with h5py.File(out) as f:
...     int((f["w"][()] == -1).sum())
4
>>> revert(res.log_path, out).digest == res.log.manifest["input"]["hash"]
True
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .. import __version__
from ..core.bits import BitSpec
from ..errors import InputFileError, LogMismatchError, OptionError
from .locks import WriterLock
from .paths import resolve_output
from ..core.faults import FaultModel
from .fileio import Staging, atomic_output, byte_diff, check_input, copy_with_hash, hash_file, sha256_file, staged
from . import hashcache, hashing
from .inplace import write_in_place, write_unlogged
from .fingerprint import revert_regions
from .h5apply import (apply_plan_to_file, copy_apply, read_words, route_sites,
                       write_words_to_file)
from .formats.hfdir import is_checkpoint_dir
from .layout import Layout, Tensor, read_layout
from .log import InjectionLog
from .h5chunks import chunk_patches
from .keras_archive import WEIGHTS_ENTRY, ArchiveLimits, edit_archive, is_keras_archive
from .zipmembers import member_patches
from .patches import (crc_patches, expected_new, is_zip_container, patch_undo, without_positions, word_patches,
                      write_patches)
from .fileio import deferred_signals, fsync_path, hash_with_patches
from .patches import delta_patches, revert_patches
from ..core.plan import Plan
from ..core.spec import Sampling
from .select import Selection
from .sites import PLAN_FIELDS, injection_counts, nonfinite_created, site_space, sampling_of

__all__ = ["InjectionResult", "RevertResult", "inject_file", "replay", "revert", "default_log_path", "nonfinite_created",
           "inject_checkpoint_file"]


@dataclass
class InjectionResult:
    """What :func:`inject_file` and :func:`replay` did."""

    output: str
    log: InjectionLog
    log_path: str | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def nan_count(self) -> int:
        return int(self.counts.get("nan_created", 0))

    @property
    def inf_count(self) -> int:
        return int(self.counts.get("inf_created", 0))


@dataclass
class RevertResult:
    """What :func:`revert` restored.

    ``verified`` is True when the restored file's hash (``algorithm``, the one the log names) was compared
    with the logged input's
    (and the reverted file's with the logged output's); False when the log holds no hashes and
    ``verify=False`` allowed the revert anyway (only the words at the logged sites were checked).
    """

    output: str
    digest: str
    sites: int
    verified: bool = True
    algorithm: str = "sha256"
    evidence: str = "file"  # "regions": a direct in-place log's touched ranges, size and fingerprint were checked

    @property
    def sha256(self) -> str | None:
        """The digest when the log's algorithm is sha256 (None otherwise)."""
        return self.digest if self.algorithm == "sha256" else None


def default_log_path(output: str, keep_existing: bool = False) -> str:
    """``<output>.fflog``; with ``keep_existing`` the first free ``<output>.<k>.fflog`` (k = 2, 3, ...)
    when that exists, so that repeated in-place injections never overwrite the log that reverts an earlier one.
    """
    base = os.fspath(output)
    path = base + ".fflog"
    k = 2
    while keep_existing and os.path.exists(path):
        path = f"{base}.{k}.fflog"
        k += 1
    return path


_LAYOUTS: "dict[tuple[str, int, int, int], Layout]" = {}
_CACHE_LOCK = threading.Lock()  # the layout cache below is shared by the threads of a host harness


def cached_layout(path: str) -> Layout:
    """``read_layout(path)``, remembered per (path, inode, size, mtime) so that repeated calls skip the walk.

    The layout depends only on the file's metadata; any rewrite of the file (new inode,
    size or mtime) makes a fresh walk. At most 16 layouts are kept.
    """
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _CACHE_LOCK:
        lay = _LAYOUTS.get(key)
    if lay is None:
        lay = read_layout(path)  # outside the lock: two threads may both walk a new file, never wrongly
        with _CACHE_LOCK:
            while len(_LAYOUTS) >= 16:
                _LAYOUTS.pop(next(iter(_LAYOUTS)))
            lay = _LAYOUTS.setdefault(key, lay)
    return lay


def _refuse_dir(path: Any, lg: InjectionLog | None = None) -> None:
    """A checkpoint directory (or a log of one) is the business of :mod:`fastflip.files.sharded`: say so."""
    if is_checkpoint_dir(path) or (lg is not None and lg.manifest.get("checkpoint_dir")):
        raise InputFileError(f"{os.fspath(path)}: a checkpoint directory (or its log); use fastflip.inject_dir, "
                             "replay_dir and revert_dir for it (the fastflip command does)")


def keep_layout(path: str, before: os.stat_result) -> None:
    """After tensor bytes (never metadata) of ``path`` were patched in place, file it under its new mtime too.

    The layout's key (:func:`cached_layout`) holds the mtime, which the write changed; the layout did not
    change, so a campaign flipping the same file again does not walk it again (for a dataset of a million
    chunks, a walk of its whole chunk index). Nothing happens when the file was not cached or was replaced.
    """
    st = os.stat(path)
    real = os.path.realpath(path)
    if (st.st_ino, st.st_size) != (before.st_ino, before.st_size):
        return
    with _CACHE_LOCK:
        lay = _LAYOUTS.pop((real, before.st_ino, before.st_size, before.st_mtime_ns), None)
        if lay is not None:
            _LAYOUTS[(real, st.st_ino, st.st_size, st.st_mtime_ns)] = lay


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _targets(src: str, dst: str | os.PathLike[str] | None, in_place: bool, overwrite: bool = True,
             inputs: Sequence[str] = (), same: str = "use --in-place to change the input") -> str:
    """The real path to write: ``src`` itself (symlinks resolved) in place, else the checked output
    (``same``: the fix named when the output is the input)."""
    if in_place:
        if dst is not None and not _same_file(src, os.fspath(dst)):
            raise OptionError("give either an output path or in_place=True (--in-place), not both")
        return resolve_output(src, inputs=inputs, in_place_of=src)
    if dst is None:
        raise OptionError("give an output path (-o OUT); the input is only changed with --in-place")
    dst = os.fspath(dst)
    if os.path.exists(dst) and _same_file(src, dst):
        raise OptionError(f"{dst}: the output is the input; {same}")
    return resolve_output(dst, inputs=[src, *inputs], overwrite=overwrite, hint=same)


_REVERT_SAME = "leave out -o to restore the file itself"


def _log_target(lp: str, src: str, target: str, inputs: Sequence[str] = ()) -> str:
    """The checked real path of a log: never an input, never the output."""
    return resolve_output(lp, inputs=[src, *inputs], others={"output": target}, what="log")


def _lock(path: str, what: str, on: bool) -> Any:
    """A :class:`WriterLock` on ``path`` when ``on`` (an existing file being rewritten), else nothing."""
    return WriterLock(path, what) if on and os.path.exists(path) else contextlib.nullcontext()


def _write(src: str, target: str, in_place: bool, atomic: bool, plan: Plan, by_name: Mapping[str, Tensor],
           backend: str, hash_files: bool | str, finish: Any, stage: Staging, evidence: bool = True,
           cached_input: bool = True, algorithm: str = "sha256"
           ) -> tuple[str | None, str | None, np.ndarray, np.ndarray, Any]:
    """Apply ``plan`` to a copy of ``src`` staged (in ``stage``) to become ``target``; ``finish(...)`` writes the
    evidence (the log) before anything is committed.

    Non-atomic in place, the log (with the predicted output hash and the undo data) is committed first,
    then the file is changed with SIGINT/SIGTERM deferred; without ``evidence`` (no log file: a campaign
    trial's fast path) there is nothing to commit first, and the words are simply written.
    """
    routes = route_sites(src, plan, by_name)
    zipped = is_zip_container(src)  # torch.save / .npz: entry CRCs follow the words
    # filtered HDF5 chunks and deflated .npz members fastflip can re-encode: byte patches worked out from the input
    cp = member_patches(src, plan, routes) if zipped else chunk_patches(src, plan, routes)
    h5_rest = without_positions(routes, cp.handled)  # left for h5py read-modify-write
    if in_place and not atomic:
        if h5_rest or cp.resized:
            raise OptionError("non-atomic in-place injection needs raw storage (contiguous or unfiltered chunks) or "
                              "chunks/members fastflip re-encodes at their size (gzip/lzf/shuffle/fletcher32, deflated "
                              ".npz members); this plan touches other filtered/compact data or a member that "
                              "changes size: use atomic=True (the CLI: drop --direct)")
        st_before = os.stat(src)
        if not evidence:
            res = write_unlogged(src, plan, by_name, routes, cp, zipped, backend, hash_files, finish, algorithm)
        else:
            res = write_in_place(src, plan, by_name, routes, cp, zipped, backend, hash_files, finish, stage,
                                 algorithm)
        keep_layout(src, st_before)  # only tensor bytes changed: the next run needs no walk of the file
        return res
    patches = list(cp.patches)
    crcs: list[tuple[int, bytes, bytes]] = []
    if zipped:  # CRC fields precede and follow the data: work them out before streaming
        old0 = read_words(src, plan, by_name, [r for r in routes if (r.offsets >= 0).any()])
        crcs = crc_patches(src, routes, old0, expected_new(plan, routes, old0))
        patches += crcs
    tmp = stage.add(target)
    in_hash, out_hash, old, new = copy_apply(src, tmp, plan, routes, backend, patches=sorted(patches),
                                             cached_input=cached_input and not in_place, algorithm=algorithm,
                                             writeback=stage.durable)
    if zipped and not np.array_equal(old, old0):
        raise LogMismatchError(f"{src} changed while it was being read; nothing was written")
    undo = None
    if len(cp.handled):
        old[cp.handled], new[cp.handled] = cp.old, cp.new
    if h5_rest:  # other filters / compact / unallocated data: HDF5 read-modify-write on the copy
        o, w, _ = apply_plan_to_file(tmp, plan, by_name, h5_rest, backend)
        for r in h5_rest:
            old[r.positions], new[r.positions] = o[r.positions], w[r.positions]
        undo = byte_diff(src, tmp)
        out_hash = hash_file(tmp, algorithm, cache=False)
    elif cp.resized:  # a member changed size: every byte after it moved
        undo = byte_diff(src, tmp)
    elif cp.patches:
        undo = patch_undo(cp.patches + crcs + word_patches(routes, old, new), os.path.getsize(src))
    result = finish(in_hash, out_hash, old, new, undo)  # stages the log: committed before the output
    return in_hash, out_hash, old, new, result


def inject_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    in_place: bool = False,
    atomic: bool = True,
    selection: Selection | Mapping[str, Any] | None = None,
    sampling: Sampling | Mapping[str, Any] | None = None,
    seed: int | None = None,
    stream: Sequence[int] = (),
    log_path: str | os.PathLike[str] | bool | None = None,
    plan: Plan | None = None,
    layout: Layout | None = None,
    backend: str = "auto",
    hash_files: bool | str = True,
    hash_algorithm: str | None = None,
    durable: bool = True,
    extra_manifest: Mapping[str, Any] | None = None,
    overwrite: bool = True,
    lock: bool = True,
    cached_input: bool = True,
    **shorthand: Any,
) -> InjectionResult:
    """Flip bits in an HDF5 file; return the result with its log.

    Parameters
    ----------
    src : path
        The checkpoint. Never modified unless ``in_place``.
    dst : path, optional
        The output file (required unless ``in_place``).
    in_place, atomic : bool
        ``in_place`` changes ``src`` itself (still atomically, through a temporary copy,
        unless ``atomic=False``: then words are rewritten directly — raw storage only —
        which is what fast campaign trials with exact revert want).
    selection : Selection or mapping
        Which tensors (path globs/regex, dtypes, roles, layers).
    sampling : Sampling or mapping
        What to flip and how many sites: bits, fault model, count/rate/ber, distribution, NaN policy,
        replacement (:class:`fastflip.core.spec.Sampling`, or its table as a mapping).
    **shorthand
        The fields of ``sampling`` as keywords (``count=``, ``rate=``, ``ber=``, ``bits=``, ``sign_first=``,
        ``model=``, ``distribution=``, ``nan_policy=``, ``replace=``), made into one Sampling by
        :meth:`fastflip.core.spec.Sampling.of`; give either ``sampling`` or these.
    seed : int, optional
        Seed (a random one is drawn and recorded when omitted). ``stream`` adds counters.
    log_path : path, False or None
        Where to write the log (default ``<output>.fflog``; in place, an existing log is kept and the new
        one is ``<file>.<k>.fflog``; False: keep it in memory only).
    plan : Plan, optional
        Apply this plan instead of sampling one (selection/bits/mode are then ignored).
    hash_files : bool or "regions"
        Hash the input and output files for the log (default). ``"regions"`` (direct in place only:
        ``in_place=True, atomic=False``): no whole-file pass; the log holds every byte range written (old and
        new bytes), the file's size and a head/tail fingerprint (:mod:`fastflip.files.fingerprint`), and revert
        checks those. ``False``: no hashes (revert then needs ``verify=False``).
    hash_algorithm : str, optional
        The log's integrity hash (:mod:`fastflip.files.hashing`: ``blake3``, ``xxh3-128``, ``sha256``); default
        the fastest available (or ``FASTFLIP_HASH``). The log names it; replay and revert verify with it.
    durable : bool
        fsync the output and the log (default). ``False`` keeps the atomic rename but skips
        the fsyncs: for scratch copies (an experiment's per-run checkpoints).
    overwrite : bool
        Replace an existing output (default True in the API; the CLI asks for ``--force``).
        Outputs and logs are checked by :func:`fastflip.files.paths.resolve_output`: never the input,
        never each other, never a directory, device, FIFO or socket; symlinks are written through.
    lock : bool
        In place, hold a :class:`fastflip.files.locks.WriterLock` on the file while it is changed (default):
        a second writer of the same file is refused instead of losing one injection.
    cached_input : bool
        Copy mode may take the input's sha256 from :mod:`fastflip.files.hashcache` (default); ``False`` hashes
        its bytes, for an input that the caller is about to replace with the output (a shard of a checkpoint
        directory injected in place). In place the bytes are always hashed.

    Notes
    -----
    Evidence before change: the log is written to a temporary and fsynced, then renamed into place just
    before the output, both renames in one section with SIGINT/SIGTERM deferred
    (:func:`fastflip.files.fileio.staged`); with ``atomic=False`` the log is committed before the first
    word is written. A kill at any moment leaves the old file, or the new one with the log that reverts
    it; a run that fails leaves an existing output and its log as they were.
    """
    if hash_files not in (True, False, "regions"):
        raise OptionError(f"hash_files must be True, False or 'regions' (got {hash_files!r:.40})")
    _refuse_dir(src)
    src = check_input(src)
    with _lock(src, "inject --in-place", in_place and lock):
        return _inject_locked(src, dst, in_place, atomic, selection, sampling, shorthand, seed, stream, log_path, plan,
                              layout, backend, hash_files, durable, extra_manifest, overwrite, cached_input,
                              hashing.algorithm(hash_algorithm or hashing.default_algorithm()).name)


def _inject_locked(src: str, dst: Any, in_place: bool, atomic: bool, selection: Any, sampling: Any,
                   shorthand: Mapping[str, Any], seed: int | None, stream: Sequence[int], log_path: Any,
                   plan: Plan | None, layout: Layout | None, backend: str, hash_files: bool | str, durable: bool,
                   extra_manifest: Mapping[str, Any] | None, overwrite: bool, cached_input: bool = True,
                   algo: str = "sha256") -> InjectionResult:
    target = _targets(src, dst, in_place, overwrite)
    if cached_input and not in_place:  # the copy's input-hash lookup, answered while the layout and plan are made
        hashcache.prefetch(src, algo)
    if isinstance(selection, Mapping):
        selection = Selection.from_dict(selection)
    layout = layout or cached_layout(src)  # the file is read (and refused) before the options are judged
    by_name = {t.path: t for t in layout.tensors}
    smp = sampling_of(sampling, plan, shorthand)
    if smp is not None:
        fields = smp.as_dict()
        model_obj, spec = smp.fault_model, smp.bit_spec
    else:  # a given plan: the keywords that describe it are recorded as they came
        fields = {**PLAN_FIELDS, **{k: v for k, v in shorthand.items() if v is not None}}
        model_obj = FaultModel.parse(fields["model"])
        spec = BitSpec.parse(fields["bits"], sign_first=fields["sign_first"])
    if seed is None:
        seed = secrets.randbits(63)
    if plan is None:
        assert smp is not None
        space = site_space(layout, selection, spec, smp.distribution_arg)
        plan = smp.plan(space, seed=seed, stream=stream, read_words=lambda p: read_words(src, p, by_name))
    options = {
        "selection": (selection or Selection()).as_dict(), "bits": list(spec.items), "sign_first": fields["sign_first"],
        "model": model_obj.as_dict(), **{k: fields[k] for k in ("count", "rate", "ber", "distribution", "replace",
                                                                 "nan_policy")},
        "in_place": in_place, "atomic": atomic, "stream": list(stream), "durable": durable,
    }
    lp: str | None
    if log_path is False:
        lp = None
    else:
        lp = (os.fspath(log_path) if log_path not in (None, True)  # type: ignore[arg-type]
              else default_log_path(target, keep_existing=in_place))
        lp = _log_target(lp, src, target)

    in_size = os.path.getsize(src)

    def finish(in_hash: str | None, out_hash: str | None, old: np.ndarray, new: np.ndarray, undo: Any,
               fingerprint: Mapping[str, Any] | None = None) -> InjectionLog:
        evidence = ({"evidence": "regions", "fingerprint": {"algorithm": algo, "input": fingerprint[0],
                                                            "output": fingerprint[1]}}
                    if fingerprint is not None else {})
        manifest = {
            "fastflip_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "seed": int(seed), "stream": [int(s) for s in stream], "options": options,
            "input": hashing.file_entry(os.path.abspath(src), in_hash, algo, size=in_size),
            "output": hashing.file_entry(os.path.abspath(target), out_hash, algo),
            "in_place": in_place, **evidence, "counts": injection_counts(plan, old, new), "plan": plan.meta,
            "_storage": {t.name: {"storage": by_name[t.name].storage} for t in plan.tensors if t.name in by_name}
            if lp is not None else {},
            **dict(extra_manifest or {}),
        }
        log = InjectionLog.from_plan(plan, old, new, manifest, undo)
        if lp is not None:  # staged as evidence: renamed into place (durable) before the output
            log.write(stage.add(lp, evidence=True))
        return log

    with staged(durable) as stage:
        _, _, _, _, log = _write(src, target, in_place, atomic, plan, by_name, backend, hash_files, finish, stage,
                                 evidence=lp is not None, cached_input=cached_input, algorithm=algo)
    return InjectionResult(target, log, lp, dict(log.manifest["counts"]))


def _load(log: InjectionLog | str | os.PathLike[str]) -> InjectionLog:
    return log if isinstance(log, InjectionLog) else InjectionLog.load(log)


def _container(lg: InjectionLog) -> bool:
    """True when the log describes the weights file inside a container (a ``.keras`` archive)."""
    return lg.manifest.get("container") is not None


def _log_inputs(log: InjectionLog | str | os.PathLike[str]) -> list[str]:
    return [] if isinstance(log, InjectionLog) else [os.fspath(log)]


def replay(log: InjectionLog | str | os.PathLike[str], file: str | os.PathLike[str],
           out: str | os.PathLike[str] | None = None, *, in_place: bool = False,
           log_path: str | os.PathLike[str] | bool | None = False, overwrite: bool = True) -> InjectionResult:
    """Re-apply a logged injection to ``file`` (the logged input); the output equals the logged one bit for bit.

    ``overwrite`` (default True; the CLI's ``--force``) allows replacing an existing output.
    In place, the file is locked (:class:`fastflip.files.locks.WriterLock`) while it is rewritten.

    Raises
    ------
    LogMismatchError
        When ``file`` is not the logged input, or the result differs from the logged output.
    """
    lg = _load(log)
    _refuse_dir(file, lg)
    src = check_input(file)
    if _container(lg):

        return replay_archive(lg, src, None if out is None else os.fspath(out), in_place=in_place,
                              overwrite=overwrite, log_inputs=_log_inputs(log))
    with _lock(src, "replay --in-place", in_place):
        return _replay_locked(lg, src, out, in_place, log_path, overwrite, _log_inputs(log))


def _replay_locked(lg: InjectionLog, src: str, out: Any, in_place: bool, log_path: Any, overwrite: bool,
                   inputs: list[str]) -> InjectionResult:
    algo, want_in = hashing.logged_hash(lg.manifest.get("input"))
    target = _targets(src, out, in_place, overwrite, inputs)
    want_out = hashing.logged_hash(lg.manifest.get("output"))[1]
    hashing.algorithm(algo)  # a log naming an algorithm this installation lacks: one line before anything is read
    new_lp = None if log_path in (None, False) else _log_target(
        default_log_path(target) if log_path is True else os.fspath(log_path), src, target, inputs)

    def check_input_hash(in_hash: str | None) -> None:  # hashed while copied: the input is read once
        if want_in and in_hash != want_in:
            raise LogMismatchError(f"{src} is not the input this log was made from ({algo} differs); give the original file")

    def check(old: np.ndarray, new: np.ndarray, out_hash: str | None) -> None:
        if not np.array_equal(new, lg.new_words) or not np.array_equal(old, lg.old_words):
            raise LogMismatchError(f"replaying onto {src} gave other words than the log records; the file is not the logged input")
        if want_out and out_hash != want_out:
            raise LogMismatchError(f"the replayed output differs from the logged output ({algo}); nothing was written")

    def finish(in_hash: str | None, out_hash: str | None, old: np.ndarray, new: np.ndarray, undo: Any) -> InjectionLog:
        check_input_hash(in_hash)
        check(old, new, out_hash)
        manifest = dict(lg.manifest, output=hashing.file_entry(os.path.abspath(target), out_hash, algo),
                        replayed_from=lg.manifest.get("created"))
        new_log = InjectionLog(manifest, lg.plan, old, new, undo)
        if new_lp is not None:
            new_log.save(new_lp)
        return new_log

    if lg.undo is not None and lg.undo.new_size >= 0:
        # the HDF5 path was used: replay the logged byte delta (HDF5 need not write the same bytes twice)
        forward = delta_patches(lg.undo, forward=True)
        with atomic_output(target) as tmp:
            if forward is None:  # bytes move: the delta applied, then the result read again
                in_hash = copy_with_hash(src, tmp, algo)
                check_input_hash(in_hash)
                lg.undo.redo(tmp)
                out_hash = hash_file(tmp, algo, cache=False)
            else:  # one read: the input's hash and the hash the copy has once the delta is written
                in_hash, out_hash = hash_with_patches(src, forward, algo, copy_to=tmp)
                check_input_hash(in_hash)
                write_patches(tmp, forward)
            after = {t.path: t for t in read_layout(tmp).tensors}  # chunks may have moved
            new = read_words(tmp, lg.plan, after)
            new_log = finish(in_hash, out_hash, lg.old_words, new, lg.undo)
        return InjectionResult(target, new_log, None, dict(lg.manifest.get("counts", {})))
    by_name = {t.path: t for t in read_layout(src).tensors}
    with staged() as stage:
        _, _, _, _, new_log = _write(src, target, in_place, True, lg.plan, by_name, "auto", True, finish, stage,
                                     algorithm=algo)
    return InjectionResult(target, new_log, None, dict(lg.manifest.get("counts", {})))


def revert(log: InjectionLog | str | os.PathLike[str], file: str | os.PathLike[str],
           out: str | os.PathLike[str] | None = None, *, atomic: bool | None = None, verify: bool = True,
           overwrite: bool = True) -> RevertResult:
    """Restore the original bytes of ``file`` (the logged output) and verify them against the logged input sha256.

    ``file`` is changed in place (atomically, under a :class:`fastflip.files.locks.WriterLock`) unless
    ``out`` is given (``overwrite``, default True, allows replacing an existing ``out``). With
    ``atomic=False`` the file is rewritten directly, but only after its bytes — read now, never a cached
    hash — are checked to be the logged output.

    A log of a direct in-place injection with region evidence (``hash_files="regions"``; see
    :mod:`fastflip.files.fingerprint`) is checked by its touched byte ranges, size and head/tail fingerprint
    instead of whole-file hashes, and (``atomic`` not True, no ``out``) reverted directly: only the touched
    ranges are rewritten. The result says ``evidence="regions"``.

    A log without hashes (``hash_files=False``) cannot prove the restored file is the original:
    it is refused unless ``verify=False``; then only the words at the logged sites are checked
    and the result says ``verified=False``.

    Raises
    ------
    LogMismatchError
        When ``file`` is not the logged output (its sha256 or its words differ), or the log holds no
        hashes and ``verify`` is True; nothing is changed.
    """
    lg = _load(log)
    _refuse_dir(file, lg)
    src = check_input(file)
    algo, want_in = hashing.logged_hash(lg.manifest.get("input"))
    want_out = hashing.logged_hash(lg.manifest.get("output"))[1]
    hashing.algorithm(algo)  # a log naming an algorithm this installation lacks: one line, nothing changed
    regions = lg.manifest.get("evidence") == "regions" and not (want_in and want_out)
    if regions and not _container(lg):  # a direct in-place injection: its touched ranges and fingerprint
        with _lock(src, "revert", out is None):
            target = (_targets(src, None, True) if out is None
                      else _targets(src, out, False, overwrite, _log_inputs(log), _REVERT_SAME))
            revert_regions(lg, src, target, direct=out is None and atomic is not True)
        return RevertResult(target, "", len(lg.plan), True, algo, evidence="regions")
    if verify and not (want_in and want_out):
        raise LogMismatchError(f"{src}: the log holds no hash of the original, so a revert cannot be verified; "
                               "give --no-verify (verify=False) to revert without that check")
    if _container(lg):

        res = revert_archive(lg, src, None if out is None else os.fspath(out), overwrite=overwrite,
                             log_inputs=_log_inputs(log), want_in=want_in, want_out=want_out, algorithm=algo)
        res.verified = bool(want_in and want_out)
        return res
    with _lock(src, "revert", out is None):
        res = _revert_locked(lg, src, out, atomic is not False, overwrite, _log_inputs(log), want_in, want_out, algo)
    res.verified = bool(want_in and want_out)
    return res


def _revert_locked(lg: InjectionLog, src: str, out: Any, atomic: bool, overwrite: bool, inputs: list[str],
                   want_in: str | None, want_out: str | None, algo: str = "sha256") -> RevertResult:
    target = _targets(src, None, True) if out is None else _targets(src, out, False, overwrite, inputs, _REVERT_SAME)
    layout = read_layout(src)
    by_name = {t.path: t for t in layout.tensors}
    routes = route_sites(src, lg.plan, by_name)  # valid for a byte-identical copy too

    def check(path: str, digest: str) -> None:
        if want_out and digest != want_out:
            raise LogMismatchError(f"{src} is not the output this log describes ({algo} differs); nothing was changed")
        if not np.array_equal(read_words(path, lg.plan, by_name, routes), lg.new_words):
            raise LogMismatchError(f"{src}: the words at the logged sites are not the logged new words; nothing was changed")

    def restore(path: str) -> str:
        if lg.undo is not None:
            lg.undo.apply(path)
        else:
            write_words_to_file(path, lg.plan, by_name, lg.old_words, routes)
            if is_zip_container(path):
                write_patches(path, crc_patches(path, routes, lg.new_words, lg.old_words))
        digest = hash_file(path, algo, cache=False)  # the bytes produced, never a remembered hash
        if want_in and digest != want_in:
            raise LogMismatchError(f"reverting {src} did not give the logged input back ({algo} differs); nothing was changed")
        return digest

    patches = revert_patches(src, lg.undo, routes, lg.new_words, lg.old_words) if want_in and want_out else None
    if patches is not None:  # one read of the file: its hash now and the hash it will have once restored
        def predicted(after: str) -> None:
            if after != want_in:
                raise LogMismatchError(f"reverting {src} did not give the logged input back ({algo} differs); "
                                       "nothing was changed")

        if not atomic and out is None:
            now, after = hash_with_patches(src, patches, algo)  # its bytes, read now, never a remembered hash
            check(src, now)
            predicted(after)
            with deferred_signals():
                write_patches(src, patches)
                fsync_path(src)
        else:
            with atomic_output(target) as tmp:
                now, after = hash_with_patches(src, patches, algo, copy_to=tmp)
                check(tmp, now)
                predicted(after)
                write_patches(tmp, patches)
        return RevertResult(target, after, len(lg.plan), algorithm=algo)
    if not atomic and out is None:
        check(src, hash_file(src, algo, cache=False))  # the file about to be rewritten: its bytes, read now
        digest = restore(src)
    else:
        with atomic_output(target) as tmp:
            check(tmp, copy_with_hash(src, tmp, algo))  # the file is read once: hashed while copied
            digest = restore(tmp)
    return RevertResult(target, digest, len(lg.plan), algorithm=algo)


# .keras archives: the inner weights file is injected, replayed or reverted, the archive rewritten.

def inject_checkpoint_file(src: str | os.PathLike, dst: str | os.PathLike | None = None, *, in_place: bool = False,
                           log_path: str | os.PathLike | bool | None = None, overwrite: bool = True,
                           limits: ArchiveLimits | None = None, **inject_kwargs: Any) -> Any:
    """:func:`fastflip.files.inject.inject_file` for an HDF5 checkpoint or a ``.keras`` archive.

    A ``.keras`` archive is altered through its inner ``model.weights.h5`` and written
    to ``dst`` (or, ``in_place``, to ``src`` under a writer lock) as a new archive. The log
    (default ``<dst>.fflog``; in place, an existing log is kept and the new one is
    ``<src>.<k>.fflog``) names the archives and records the inner file's hashes, so
    :func:`fastflip.files.inject.replay` and :func:`fastflip.files.inject.revert` accept the archive.
    The log is renamed into place (durable) just before the archive, in one section with
    SIGINT/SIGTERM deferred: a failed run leaves an existing output and its log unchanged.
    """
    if not is_keras_archive(src):
        return inject_file(src, dst, in_place=in_place, log_path=log_path, overwrite=overwrite, **inject_kwargs)
    src = os.fspath(src)
    durable = inject_kwargs.get("durable", True)
    with _lock(src, "inject --in-place", in_place):
        target = _targets(src, dst, in_place, overwrite)
        lp = None
        if log_path is not False:
            lp = _log_target(os.fspath(log_path) if log_path not in (None, True) else  # type: ignore[arg-type]
                             default_log_path(target, keep_existing=in_place), src, target)
        in_sha = sha256_file(src, cache=not in_place)
        with staged(durable) as stage:
            with edit_archive(src, target, limits=limits, stage=stage) as inner:
                res = inject_file(inner, in_place=True, log_path=False, lock=False, **inject_kwargs)
                m = res.log.manifest
                m["input"]["path"] = os.path.abspath(src)
                m["output"]["path"] = os.path.abspath(target)
                m["container"] = {"format": "keras", "entry": WEIGHTS_ENTRY, "input_sha256": in_sha}
            m["container"]["output_sha256"] = sha256_file(stage.temp(target), cache=False)
            if lp is not None:  # evidence: renamed into place before the archive when the stage commits
                res.log.write(stage.add(lp, evidence=True))
        res.output, res.log_path = target, lp
    return res


def replay_archive(log: Any, file: str, out: str | None, *, in_place: bool = False, overwrite: bool = True,
                   log_inputs: list[str] | None = None) -> Any:
    """Replay a ``.keras`` log onto the archive ``file``: the inner weights file is checked against
    the logged hashes and the new archive is written to ``out`` (or ``file`` in place)."""
    with _lock(file, "replay --in-place", in_place):
        target = _targets(file, out, in_place, overwrite, log_inputs or [])
        with edit_archive(file, target) as inner:
            res = _replay_locked(log, str(inner), None, True, False, True, [])
        res.output = target
        res.log.manifest["output"]["path"] = os.path.abspath(target)
    return res


def revert_archive(log: Any, file: str, out: str | None, *, overwrite: bool = True, log_inputs: list[str] | None = None,
                   want_in: str | None = None, want_out: str | None = None, algorithm: str = "sha256") -> Any:
    """Revert a ``.keras`` log on the archive ``file`` (in place unless ``out``): the inner weights file
    gets its original bytes back (checked by sha256); other entries are kept as they are."""
    with _lock(file, "revert", out is None):
        target = (_targets(file, None, True) if out is None else
                  _targets(file, out, False, overwrite, log_inputs or [], _REVERT_SAME))
        with edit_archive(file, target) as inner:
            res = _revert_locked(log, str(inner), None, True, True, [], want_in, want_out, algorithm)
        res.output = target
    return res
