"""Inject faults into checkpoint files (HDF5, the other formats of :mod:`fastflip.files.formats`, ``.keras``).

Layer: ``files`` (may import core, kernels and files; imported by live and above).

This is the Python API behind ``fastflip inject``; :mod:`fastflip.files.replay` and :mod:`fastflip.files.revert`
replay or revert an injection from its log::

    from fastflip import Sampling, Selection, inject_file, revert
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
>>> from fastflip.files.revert import revert
>>> revert(res.log_path, out).digest == res.log.manifest["input"]["hash"]
True
"""

from __future__ import annotations

import datetime as _dt
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .. import __version__
from ..core.bits import BitSpec
from ..core.faults import FaultModel
from ..core.plan import Plan
from ..core.spec import Sampling
from ..errors import LogMismatchError, OptionError
from . import hashcache, hashing
from .archives import edit_archive, is_keras_archive
from .encoded import encoded_patches, say_h5py_notes, zip_index
from .filebytes import byte_diff, hash_file, sha256_file
from .fileio import Staging, check_input, staged
from .copyapply import copy_apply
from .h5apply import apply_plan_to_file, read_words, route_sites
from .layout import Layout, Tensor, read_layout
from .log import InjectionLog
from .outputs import default_log_path, log_target, output_target, refuse_dir, writer_lock
from .patches import crc_patches, expected_new, member_check, without_positions, word_undo, zip_format
from .select import Selection
from .sites import PLAN_FIELDS, injection_counts, random_seed, sampling_of, site_space

if TYPE_CHECKING:
    from .keras_archive import ArchiveLimits

__all__ = ["InjectionResult", "inject_file", "inject_checkpoint_file", "write_plan", "cached_layout", "keep_layout"]


@dataclass
class InjectionResult:
    """What :func:`inject_file` and :func:`fastflip.files.replay.replay` did."""

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


def write_plan(src: str, target: str, in_place: bool, atomic: bool, plan: Plan, by_name: Mapping[str, Tensor],
               backend: str, hash_files: bool | str, finish: Any, stage: Staging, evidence: bool = True,
               cached_input: bool = True, algorithm: str = "sha256", members_checked: bool = False
           ) -> tuple[str | None, str | None, np.ndarray, np.ndarray, Any]:
    """Apply ``plan`` to a copy of ``src`` staged (in ``stage``) to become ``target``; ``finish(...)`` writes the
    evidence (the log) before anything is committed.

    Non-atomic in place, the log (with the predicted output hash and the undo data) is committed first,
    then the file is changed with SIGINT/SIGTERM deferred; without ``evidence`` (no log file: a campaign
    trial's fast path) there is nothing to commit first, and the words are simply written.

    A zip container's directory and local headers are read once here (:func:`~fastflip.files.encoded.zip_index`)
    and serve the member check and every CRC-field patch below. ``members_checked``: the caller has checked the
    stored ``.npz`` members these sites lie in against their CRC-32 since they last changed other than through
    fastflip's words and CRC fields (a campaign's own working copy, when it was made:
    :func:`fastflip.files.patches.refuse_damaged_tensors`), so they are not read again here.
    """
    routes = route_sites(src, plan, by_name)
    fmt = zip_format(src)
    zipped = fmt is not None  # torch.save / .npz: entry CRCs follow the words
    # the raw sites' members and CRC fields, read once for every use below (None: no zip, or no raw site in it)
    zindex = zip_index(src) if zipped and any((r.offsets >= 0).any() for r in routes) else None
    # a member np.load refuses is refused before the output (or the log) is written; a pass that reads every byte
    # anyway checks the members on the way: a new file's copy (a temporary, removed when refused), a direct
    # in-place inject's whole-file hash
    check = member_check(src, routes, zindex) if fmt == "npz" and zindex is not None and not members_checked else None
    streamed = hash_files is True if in_place and not atomic else hash_files != "regions"
    if check is not None and not streamed:
        check.check()
        check = None  # done
    # filtered HDF5 chunks and deflated .npz members fastflip can re-encode: byte patches worked out from the input
    cp = encoded_patches(src, plan, routes, zipped)
    h5_rest = without_positions(routes, cp.handled)  # left for h5py read-modify-write
    if in_place and not atomic:
        from .copyregions import refuse_moving_bytes  # in place and region evidence only: not on a new file's path
        from .inplace import write_in_place, write_unlogged

        refuse_moving_bytes(src, h5_rest, cp, "use atomic=True (the CLI: drop --direct)",
                            "non-atomic in-place injection")
        st_before = os.stat(src)
        if not evidence:
            res = write_unlogged(src, plan, by_name, routes, cp, zindex, backend, hash_files, finish, algorithm,
                                 check)
        else:
            res = write_in_place(src, plan, by_name, routes, cp, zindex, backend, hash_files, finish, stage,
                                 algorithm, check)
        keep_layout(src, st_before)  # only tensor bytes changed: the next run needs no walk of the file
        return res
    if hash_files == "regions":  # a kernel copy and the touched bytes: no whole-file pass
        from .copyregions import refuse_moving_bytes, write_copy_regions

        refuse_moving_bytes(src, h5_rest, cp, "log whole-file hashes instead (the CLI: drop --evidence regions)")
        return write_copy_regions(src, stage.add(target), plan, by_name, routes, cp, zindex, finish, algorithm,
                                  writeback=stage.durable)
    patches = list(cp.patches)
    crcs: list[tuple[int, bytes, bytes]] = []
    if zindex is not None:  # CRC fields precede and follow the data: work them out before streaming
        old0 = read_words(src, plan, by_name, [r for r in routes if (r.offsets >= 0).any()])
        crcs = crc_patches(src, routes, old0, expected_new(plan, routes, old0), zindex)
        patches += crcs
    tmp = stage.add(target)
    in_hash, out_hash, old, new = copy_apply(src, tmp, plan, routes, backend, patches=sorted(patches),
                                             cached_input=cached_input and not in_place, algorithm=algorithm,
                                             writeback=stage.durable, member_crcs=check)
    if zindex is not None and not np.array_equal(old, old0):
        raise LogMismatchError(f"{src} changed while it was being read; nothing was written")
    if check is not None:
        check.verify()  # before the log is staged: the refusal leaves no output, no log
    undo = None
    if len(cp.handled):
        old[cp.handled], new[cp.handled] = cp.old, cp.new
    if h5_rest:  # other filters / compact / unallocated data: HDF5 read-modify-write on the copy
        say_h5py_notes(cp.notes, stacklevel=4)  # why they go through h5py, said where they do; at inject_file's caller
        o, w, _ = apply_plan_to_file(tmp, plan, by_name, h5_rest, backend)
        for r in h5_rest:
            old[r.positions], new[r.positions] = o[r.positions], w[r.positions]
        undo = byte_diff(src, tmp)
        out_hash = hash_file(tmp, algorithm, cache=False)
    elif cp.resized:  # a member changed size: every byte after it moved
        undo = byte_diff(src, tmp)
    elif cp.patches:
        undo = word_undo(routes, old, new, cp.patches + crcs, os.path.getsize(src))
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
    members_checked: bool = False,
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
        Hash the input and output files for the log (default). ``"regions"``: no whole-file pass; the log holds
        every byte range written (old and new bytes), the file's size and head/tail fingerprints of the input and
        the output (:mod:`fastflip.files.fingerprint`), and revert and replay check those. Direct in place
        (``in_place=True, atomic=False``) only the touched bytes are written; in copy mode the input is copied in
        the kernel and only the touched bytes are written from here (:mod:`fastflip.files.copyregions`; refused
        when a change would move bytes: HDF5 read-modify-write, a member that changes size). ``False``: no
        hashes (revert then needs ``verify=False``).
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
    members_checked : bool
        The caller has checked the ``.npz`` members the plan's sites lie in against their CRC-32
        (:func:`fastflip.files.patches.refuse_damaged_tensors`) and nothing but fastflip's injects and their
        exact undos has written them since (a campaign's own working copy): they are not read again. Default
        False: each stored member a flip lands in is read once and refused when ``np.load`` would refuse it.

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
    refuse_dir(src)
    src = check_input(src)
    with writer_lock(src, "inject --in-place", in_place and lock):
        return _inject_locked(src, dst, in_place, atomic, selection, sampling, shorthand, seed, stream, log_path, plan,
                              layout, backend, hash_files, durable, extra_manifest, overwrite, cached_input,
                              hashing.algorithm(hash_algorithm or hashing.default_algorithm()).name, members_checked)


def _inject_locked(src: str, dst: Any, in_place: bool, atomic: bool, selection: Any, sampling: Any,
                   shorthand: Mapping[str, Any], seed: int | None, stream: Sequence[int], log_path: Any,
                   plan: Plan | None, layout: Layout | None, backend: str, hash_files: bool | str, durable: bool,
                   extra_manifest: Mapping[str, Any] | None, overwrite: bool, cached_input: bool = True,
                   algo: str = "sha256", members_checked: bool = False) -> InjectionResult:
    target = output_target(src, dst, in_place, overwrite)
    if cached_input and not in_place and hash_files != "regions":
        # the copy's input-hash lookup, answered while the layout and plan are made (region evidence hashes none)
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
        seed = random_seed()
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
        lp = log_target(lp, src, target)

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
        _, _, _, _, log = write_plan(src, target, in_place, atomic, plan, by_name, backend, hash_files, finish,
                                     stage, evidence=lp is not None, cached_input=cached_input, algorithm=algo,
                                     members_checked=members_checked)
    return InjectionResult(target, log, lp, dict(log.manifest["counts"]))


# .keras archives: the inner weights file is injected, the archive rewritten.

def inject_checkpoint_file(src: str | os.PathLike, dst: str | os.PathLike | None = None, *, in_place: bool = False,
                           log_path: str | os.PathLike | bool | None = None, overwrite: bool = True,
                           limits: ArchiveLimits | None = None, **inject_kwargs: Any) -> Any:
    """:func:`fastflip.files.inject.inject_file` for an HDF5 checkpoint or a ``.keras`` archive.

    A ``.keras`` archive is altered through its inner ``model.weights.h5`` and written
    to ``dst`` (or, ``in_place``, to ``src`` under a writer lock) as a new archive. The log
    (default ``<dst>.fflog``; in place, an existing log is kept and the new one is
    ``<src>.<k>.fflog``) names the archives and records the inner file's hashes, so
    :func:`fastflip.files.replay.replay` and :func:`fastflip.files.revert.revert` accept the archive.
    The log is renamed into place (durable) just before the archive, in one section with
    SIGINT/SIGTERM deferred: a failed run leaves an existing output and its log unchanged.
    """
    if not is_keras_archive(src):
        return inject_file(src, dst, in_place=in_place, log_path=log_path, overwrite=overwrite, **inject_kwargs)
    if inject_kwargs.get("hash_files") == "regions":
        raise OptionError(f"{src}: region evidence is for single checkpoint files; a .keras archive's log holds "
                          "whole-file hashes of its weights file: drop --evidence regions (hash_files='regions')")
    src = os.fspath(src)
    durable = inject_kwargs.get("durable", True)
    with writer_lock(src, "inject --in-place", in_place):
        target = output_target(src, dst, in_place, overwrite)
        lp = None
        if log_path is not False:
            lp = log_target(os.fspath(log_path) if log_path not in (None, True) else  # type: ignore[arg-type]
                            default_log_path(target, keep_existing=in_place), src, target)
        in_sha = sha256_file(src, cache=not in_place)
        with staged(durable) as stage:
            with edit_archive(src, target, limits=limits, stage=stage) as inner:
                res = inject_file(inner, in_place=True, log_path=False, lock=False, **inject_kwargs)
                m = res.log.manifest
                m["input"]["path"] = os.path.abspath(src)
                m["output"]["path"] = os.path.abspath(target)
                m["container"] = {"format": "keras", "entry": inner.name, "input_sha256": in_sha}  # model.weights.h5
            m["container"]["output_sha256"] = sha256_file(stage.temp(target), cache=False)
            if lp is not None:  # evidence: renamed into place before the archive when the stage commits
                res.log.write(stage.add(lp, evidence=True))
        res.output, res.log_path = target, lp
    return res

