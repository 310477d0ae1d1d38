"""Inject into, replay on and revert a Hugging Face checkpoint directory as one model.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A directory that ``save_pretrained`` wrote (an index and its shards, or one
``model.safetensors`` / ``pytorch_model.bin``), or its index file, is one checkpoint
(:mod:`fastflip.files.formats.hfdir`): tensors are named as in the index, one
:class:`~fastflip.core.sampling.SiteSpace` spans every shard (sites are drawn by size across
the whole model; a seed draws the same sites as for the same model saved in one file), and
one log describes the whole injection. Each shard is changed by
:func:`fastflip.files.inject.inject_file` with its share of the plan, so every file format's
rules (zip CRCs of ``.bin`` shards, bounds, hashes) are those of a single file.

The log (``fastflip-log/1``) records, besides the usual columns, each tensor's ``shard`` in its
``tensors`` list (so each flip's shard) and ``checkpoint_dir``: the index, every weight file,
and per touched shard its ``input_sha256``/``output_sha256``/``size``/``sites``. Its
``input``/``output`` ``sha256`` are digests of the touched shards' hashes.

Evidence before change: every write goes through :func:`fastflip.files.fileio.staged`. The touched
shards' new bytes are written to temporaries and made durable, the log is staged as evidence, and one commit,
with SIGINT/SIGTERM deferred (:func:`fastflip.files.fileio.deferred_signals`), renames the log into place
(fsynced) before anything it describes. After a kill at any moment the user has the old state, or the new one
with a log that reverts it.

Output (``-o DIR``): a new directory built as a temporary directory beside it and renamed into place after
the log (an existing one, replaced only with ``overwrite`` / ``--force``, is moved aside, replaced, then
removed). Files the injection does not change (other shards, the index, ``config.json``,
``generation_config.json``, tokenizer files, ...) are carried over byte for byte: shared with the
input where the file system can do it safely (a reflink: copy-on-write, FICLONE), else copied
(``os.copy_file_range``, then a plain copy). Never a hard or symbolic link: a later in-place
injection into the output would write through it into the input.

In place: every touched shard is rewritten to a temporary file beside it, the log is made durable, then each
temporary is renamed over its shard. A SIGKILL between those renames leaves each shard either as it was or
as the log says; :func:`revert_dir` reverts such a directory too (shards already at their logged input are
left alone). A rename that fails part way keeps the log once one shard has changed. The sha256 of a shard
about to be replaced is taken from its bytes, never from :mod:`fastflip.files.hashcache` (inject, replay and
revert alike). The non-atomic path (``atomic=False``: words rewritten where they lie, campaign trials) keeps
its log in memory only; a log file is refused there.

Locks: an in-place inject, replay or revert holds a :class:`~fastflip.files.locks.WriterLock` on the index and
on every weight file of the directory (not only the touched ones) while it reads and changes it, so a second
fastflip writer of the directory, or of any one shard as a single file, is refused with the holder named.
Carried files (``config.json``, tokenizers) are not locked: fastflip never writes them. The locks are per
inode: a shard replaced by the commit's rename is a new, unlocked file once the commit is done.

Examples
--------
>>> import os, json, struct, tempfile, numpy as np
>>> from fastflip import Sampling
>>> d = tempfile.mkdtemp(); src = os.path.join(d, "model")
>>> os.mkdir(src)
>>> wm = {}
>>> for k, name in enumerate(["a.weight", "b.weight"], 1):
...     shard = f"model-0000{k}-of-00002.safetensors"; wm[name] = shard
...     h = json.dumps({name: {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
...     _ = open(os.path.join(src, shard), "wb").write(struct.pack("<Q", len(h)) + h + np.ones(4, "<f4").tobytes())
>>> _ = open(os.path.join(src, "model.safetensors.index.json"), "w").write(json.dumps({"weight_map": wm}))
>>> res = inject_dir(src, os.path.join(d, "out"), seed=1, sampling=Sampling(count=3, bits="sign"))
>>> res.counts["bits_changed"], sorted(os.listdir(res.output))[-1]
(3, 'model.safetensors.index.json')
>>> revert_dir(res.log_path, res.output).sites
3
>>> again = inject_dir(src, os.path.join(d, "again"), seed=1, count=3, bits="sign")  # the shorthand: the same draw
>>> again.log.plan.index.tolist() == res.log.plan.index.tolist()
True
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .. import __version__
from ..core.plan import Plan
from ..core.spec import Sampling
from ..errors import LogMismatchError, OptionError, OutputError, UnsupportedStorageError
from .filebytes import sha256_file
from .fileio import Staging, staged
from .formats.hfdir import KERAS_INDEX_SUFFIX, ShardedLayout, find_index, is_checkpoint_dir
from .keras_sharded import KERAS_SHARDED_FORMAT
from .layout import read_checkpoint_dir  # Hugging Face or Keras sharded
from .h5apply import read_words, route_sites
from .inject import InjectionResult, inject_file
from .sites import injection_counts, random_seed, sampling_of, site_space
from .locks import WriterLock
from .log import InjectionLog
from .outputs import default_log_path
from .patches import restore_words
from .sharecopy import copy_tree, share_copy
from .paths import resolve_output
from .revert import RevertResult, revert_into
from .select import Selection

__all__ = ["ShardPlan", "inject_dir", "replay_dir", "revert_dir", "restore_dir", "copy_checkpoint_dir", "checkpoint_dir_sha256",
           "is_checkpoint_dir", "shard_plans", "is_dir_log"]

@dataclass
class ShardPlan:
    """One shard's share of a whole-model plan: ``positions`` in the plan, ``plan`` with only its tensors."""

    shard: str
    positions: np.ndarray
    plan: Plan


def shard_plans(plan: Plan, layout: ShardedLayout) -> list[ShardPlan]:
    """Split ``plan`` by the shard holding each site's tensor (index order of the shards).

    Raises
    ------
    LogMismatchError
        A plan tensor the directory does not hold.
    """
    names = []
    for t in plan.tensors:
        key = "/" + t.name.lstrip("/")
        if key not in layout.shard_of:
            raise LogMismatchError(f"{layout.file}: holds no tensor {t.name!r}, which the plan names; give the "
                                   "checkpoint directory the plan or log was made for")
        names.append(layout.shard_of[key])
    out = []
    site_shard = np.array(names, dtype=object)[plan.tensor] if len(plan) else np.array([], dtype=object)
    for shard in layout.shards:
        pos = np.flatnonzero(site_shard == shard)
        if not len(pos):
            continue
        ids = np.unique(plan.tensor[pos])
        remap = np.full(len(plan.tensors), -1, np.int64)
        remap[ids] = np.arange(len(ids))
        part = plan.select(pos)
        out.append(ShardPlan(shard, pos, Plan(tuple(plan.tensors[i] for i in ids), remap[part.tensor], part.index,
                                              part.and_mask, part.or_mask, part.xor_mask, part.scale, part.bits,
                                              dict(plan.meta))))
    return out


def _read_words(layout: ShardedLayout, plan: Plan) -> np.ndarray:
    """Current words of every plan site, read from each site's shard."""
    out = np.zeros(len(plan), np.uint64)
    for sp in shard_plans(plan, layout):
        lay = layout.shards[sp.shard]
        out[sp.positions] = read_words(os.path.join(layout.file, sp.shard), sp.plan, {t.path: t for t in lay.tensors})
    return out


def _digest(hashes: Mapping[str, str | None]) -> str:
    """One sha256 over (shard, sha256) pairs: the whole directory's hash as far as the log is concerned."""
    import hashlib  # the standard library's sha256, which directory logs use

    return hashlib.sha256(json.dumps(sorted(hashes.items())).encode()).hexdigest()


def is_dir_log(log: InjectionLog) -> bool:
    """True when ``log`` describes an injection into a checkpoint directory."""
    return bool(log.manifest.get("checkpoint_dir"))


def _target_dir(src: str, dst: Any, overwrite: bool) -> str:
    if dst is None:
        raise OptionError("give an output directory (-o OUT); the input is only changed with --in-place")
    out = os.path.abspath(os.fspath(dst))
    if out.endswith((".index.json", KERAS_INDEX_SUFFIX)):
        raise OptionError(f"{dst}: the output of a checkpoint directory (or sharded Keras save) is a directory, "
                          "written with the same file names; give its path")
    real, src_real = os.path.realpath(out), os.path.realpath(src)
    if real == src_real or real.startswith(src_real + os.sep) or src_real.startswith(real + os.sep):
        raise OutputError(f"{dst}: the output directory is (inside) the input {src}; choose another path "
                          "(or --in-place)")
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise OutputError(f"{dst}: exists and is not a directory; choose another path")
        if not overwrite:
            raise OutputError(f"{dst}: output exists; use --force to replace it")
        found = find_index(out)
        if os.listdir(out) and not (found and (found[1] or found[2])):
            raise OutputError(f"{dst}: exists and is not a checkpoint directory; fastflip replaces only a checkpoint "
                              "directory (--force), never another folder: choose a new path")
    parent = os.path.dirname(real)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise OutputError(f"{dst}: output directory {parent} does not exist or is not writable")
    return real


def _log_path(log_path: Any, target: str, src: str, in_place: bool) -> str | None:
    if log_path is False:
        return None
    lp = os.fspath(log_path) if log_path not in (None, True) else default_log_path(target, keep_existing=in_place)
    if os.path.realpath(lp).startswith(os.path.realpath(target) + os.sep):
        raise OutputError(f"{lp}: the log would be inside the output directory; give a path outside it")
    return resolve_output(lp, inputs=[src], what="log")


@contextlib.contextmanager
def _writer_lock(layout: ShardedLayout, what: str, on: bool = True) -> Iterator[None]:
    """While the block runs, a :class:`~fastflip.files.locks.WriterLock` on every file of the checkpoint that a
    fastflip writer may change or read as its layout: the index and every weight file (shard), in name order.

    A second in-place inject/replay/revert of the directory, or of one of its shards as a file, is refused
    with the holder named, whichever file it starts from. Carried files (``config.json``, tokenizer files, ...)
    are not locked: no fastflip writer changes them. Nothing is locked when ``on`` is false.
    """
    with contextlib.ExitStack() as locks:
        if on:
            for name in sorted(([layout.index] if layout.index else []) + list(layout.shards)):
                locks.enter_context(WriterLock(os.path.join(layout.file, name), what))
        yield


class _NotCarried:
    """The entries of the directory a new output does not carry over, as :func:`~fastflip.files.sharecopy.copy_tree`
    asks while it lists the directory: the ``touched`` shards (written anew) and, for a Keras sharded save, every
    entry that is not its index or one of its shards (a Keras set is addressed by its index, and shares its folder
    with anything)."""

    def __init__(self, layout: ShardedLayout, touched: set[str]) -> None:
        self.touched = touched
        self.own = {layout.index, *layout.shards} if layout.format == KERAS_SHARDED_FORMAT else None

    def __contains__(self, name: object) -> bool:
        return name in self.touched or (self.own is not None and name not in self.own)


def _stage_shards(st: Staging, root: str, in_place: bool, target: str) -> Callable[[str], str]:
    """Where each touched shard's new bytes go: a temporary beside the shard (in place), or the shard's name in a
    temporary folder staged to become ``target``; both renamed into place when ``st`` commits, after the log."""
    if in_place:
        return lambda shard: st.add(os.path.join(root, shard))
    folder = st.add_dir(target)
    return lambda shard: os.path.join(folder, shard)


def _apply(layout: ShardedLayout, plan: Plan, inject_one: Callable[[str, ShardPlan], InjectionResult]
           ) -> tuple[np.ndarray, np.ndarray, dict[str, dict[str, Any]]]:
    """Inject each touched shard's share of ``plan`` with ``inject_one(shard path, share)``;
    (old words, new words, per-shard record)."""
    old = np.zeros(len(plan), np.uint64)
    new = np.zeros(len(plan), np.uint64)
    shards: dict[str, dict[str, Any]] = {}
    sps = shard_plans(plan, layout)
    for sp in sps:  # all refused before any shard is written
        if not all(layout.shards[sp.shard].tensor(t.name).raw_writable for t in sp.plan.tensors):
            raise UnsupportedStorageError(f"{os.path.join(layout.file, sp.shard)}: this shard's tensors need "
                                          "re-encoded bytes, which a checkpoint directory's log does not hold; "
                                          "inject into the file itself")
    for sp in sps:
        src = os.path.join(layout.file, sp.shard)
        size = os.path.getsize(src)
        res = inject_one(src, sp)
        old[sp.positions], new[sp.positions] = res.log.old_words, res.log.new_words
        shards[sp.shard] = {"input_sha256": res.log.manifest["input"]["sha256"],
                            "output_sha256": res.log.manifest["output"]["sha256"], "size": size,
                            "sites": int(len(sp.positions))}
    return old, new, shards


def _write_dir(layout: ShardedLayout, target: str, in_place: bool, plan: Plan, lp: str | None, backend: str,
               durable: bool, make_manifest: Callable[[np.ndarray, np.ndarray, dict[str, Any]], dict[str, Any]]
               ) -> InjectionLog:
    """Stage, log, commit: the one write sequence of :func:`inject_dir` and :func:`replay_dir`.

    Evidence before change (:func:`fastflip.files.fileio.staged`): the touched shards are written to temporaries
    (in place: beside them; else into a temporary folder with the carried files), the log is staged as evidence,
    then one commit with SIGINT/SIGTERM deferred renames the log into place (durable) before the output folder or
    the first shard.
    """
    with staged(durable, name=target) as st:
        shard_path = _stage_shards(st, layout.file, in_place, target)

        def one(src: str, sp: ShardPlan) -> InjectionResult:
            return inject_file(src, shard_path(sp.shard), plan=sp.plan, layout=layout.shards[sp.shard],
                               log_path=False, backend=backend, durable=durable, lock=False, hash_algorithm="sha256",
                               cached_input=not in_place)  # a shard about to be replaced: hashed from its bytes

        old, new, shards = _apply(layout, plan, one)
        manifest = make_manifest(old, new, shards)
        if not in_place:
            manifest["checkpoint_dir"]["carried"] = copy_tree(layout.file, st.temp(target),
                                                               _NotCarried(layout, set(shards)), durable)
        log = InjectionLog.from_plan(plan, old, new, manifest)
        if lp is not None:
            log.write(st.add(lp, evidence=True))
    return log


def _manifest(layout: ShardedLayout, target: str, plan: Plan, old: np.ndarray, new: np.ndarray,
              shards: dict[str, Any], seed: int, stream: Sequence[int], options: dict[str, Any],
              in_place: bool) -> dict[str, Any]:
    return {
        "fastflip_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": int(seed), "stream": [int(s) for s in stream], "options": options,
        "input": {"path": os.path.abspath(layout.file),
                  "sha256": _digest({k: v["input_sha256"] for k, v in shards.items()}),
                  "size": int(sum(os.path.getsize(p) for p in layout.shard_paths()))},
        "output": {"path": os.path.abspath(target), "sha256": _digest({k: v["output_sha256"] for k, v in shards.items()})},
        "in_place": in_place, "counts": injection_counts(plan, old, new), "plan": plan.meta,
        "checkpoint_dir": {"format": layout.format, "index": layout.index, "weight_files": list(layout.shards),
                           "shards": shards},
        "_storage": {t.name: {"storage": "contiguous", "shard": layout.shard_of["/" + t.name.lstrip("/")]}
                     for t in plan.tensors},
    }


def inject_dir(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None = None, *, in_place: bool = False,
               selection: Selection | Mapping[str, Any] | None = None,
               sampling: Sampling | Mapping[str, Any] | None = None, seed: int | None = None,
               stream: Sequence[int] = (), log_path: str | os.PathLike[str] | bool | None = None,
               plan: Plan | None = None, backend: str = "auto", durable: bool = True, overwrite: bool = True,
               extra_manifest: Mapping[str, Any] | None = None, atomic: bool = True, hash_files: bool | str = True,
               layout: ShardedLayout | None = None, lock: bool = True, **shorthand: Any) -> InjectionResult:
    """Flip bits in a Hugging Face checkpoint directory (or its index file) as one model.

    Parameters are those of :func:`fastflip.files.inject.inject_file` (``sampling=`` or its fields as
    keywords); ``dst`` is a directory
    (written atomically; ``overwrite`` replaces an existing one), the log defaults to
    ``<dst>.fflog`` beside it (in place: ``<dir>.fflog``, or ``<dir>.<k>.fflog`` when that exists).
    See the module docstring for what is shared, copied and logged.

    ``in_place=True, atomic=False`` rewrites the words where they lie in each shard, with no temporary
    copy and no staging (``hash_files=False``: no sha256 either): the fast path of campaign trials,
    undone by :func:`restore_dir`. It keeps its log in memory only (``log_path=False``; a log file is refused):
    evidence before change would need every shard's new bytes worked out before the first is written.

    In place, the whole checkpoint is locked while it is read and changed (every weight file and the index;
    see the module docstring), unless ``lock=False``.
    """
    if hash_files == "regions":
        raise OptionError(f"{os.fspath(src)}: region evidence is for single files; a checkpoint directory's log holds "
                          "each shard's hash: drop --evidence regions (hash_files='regions')")
    layout = layout or read_checkpoint_dir(src)
    root = layout.file
    if not atomic and not in_place:
        raise OptionError("atomic=False applies to in-place injection only")
    if in_place and dst is not None and os.path.realpath(os.fspath(dst)) != os.path.realpath(root):
        raise OptionError("give either an output directory or in_place=True (--in-place), not both")
    target = os.path.realpath(root) if in_place else _target_dir(root, dst, overwrite)
    lp = _log_path(log_path, target, root, in_place)
    if not atomic and lp is not None:
        raise OptionError("atomic=False in a checkpoint directory keeps its log in memory only (log_path=False, "
                          "undone by restore_dir); for a log file, inject atomically (atomic=True)")
    with _writer_lock(layout, "inject --in-place", in_place and lock):  # the layout is read before; the words after
        if isinstance(selection, Mapping):
            selection = Selection.from_dict(selection)
        smp = sampling_of(sampling, plan, shorthand, where="inject_dir")
        if seed is None:
            seed = random_seed()
        if plan is None:
            assert smp is not None
            space = site_space(layout, selection, smp.bit_spec, smp.distribution_arg)
            plan = smp.plan(space, seed=seed, stream=stream, read_words=lambda p: _read_words(layout, p))
        options = {"selection": (selection or Selection()).as_dict(), **(smp.as_dict() if smp is not None else {}),
                   "in_place": in_place, "stream": list(stream), "durable": durable}

        def manifest(old: np.ndarray, new: np.ndarray, shards: dict[str, Any]) -> dict[str, Any]:
            return {**_manifest(layout, target, plan, old, new, shards, seed, stream, options, in_place),
                    **dict(extra_manifest or {})}

        if atomic:
            log = _write_dir(layout, target, in_place, plan, lp, backend, durable, manifest)
        else:  # no log file (checked above): nothing to commit first, the words are written where they lie
            def direct(path: str, sp: ShardPlan) -> InjectionResult:
                return inject_file(path, in_place=True, atomic=False, plan=sp.plan, layout=layout.shards[sp.shard],
                                   log_path=False, backend=backend, hash_files=hash_files, durable=durable, lock=False,
                                   hash_algorithm="sha256")  # the directory log is defined on sha256

            old, new, shards = _apply(layout, plan, direct)
            log = InjectionLog.from_plan(plan, old, new, manifest(old, new, shards))
    return InjectionResult(target, log, lp, dict(log.manifest["counts"]))


def restore_dir(root: str | os.PathLike[str], log: InjectionLog, layout: ShardedLayout | None = None) -> None:
    """Write a directory log's old words back where they lie (zip CRCs of ``.bin`` shards with them), checking
    nothing: the undo of :func:`inject_dir` ``(in_place=True, atomic=False)`` in a working copy that is the
    caller's own (campaign trials). :func:`revert_dir` is the checked revert."""
    layout = layout or read_checkpoint_dir(root)
    for sp in shard_plans(log.plan, layout):
        path = os.path.join(layout.file, sp.shard)
        by_name = {t.path: t for t in layout.shards[sp.shard].tensors}
        routes = route_sites(path, sp.plan, by_name)
        restore_words(path, sp.plan, by_name, log.old_words[sp.positions], log.new_words[sp.positions], routes)


def checkpoint_dir_sha256(path: str | os.PathLike[str]) -> str:
    """One sha256 of a checkpoint directory's weights: over (file name, sha256) of its index and every weight file."""
    layout = read_checkpoint_dir(path)
    names = ([layout.index] if layout.index else []) + list(layout.shards)
    return _digest({n: sha256_file(os.path.join(layout.file, n)) for n in names})


def copy_checkpoint_dir(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """Copy a checkpoint directory to the new directory ``dst`` (files shared by reflink where possible, else
    copied; never linked); return ``dst``."""
    dst = os.fspath(dst)
    layout = read_checkpoint_dir(src)
    os.mkdir(dst)
    copy_tree(layout.file, dst, _NotCarried(layout, set()))
    return dst


def _sub_log(lg: InjectionLog, sp: ShardPlan, shard: Mapping[str, Any]) -> InjectionLog:
    """The single-file log of one shard's share of a directory log."""
    m = {"input": {"sha256": shard["input_sha256"]}, "output": {"sha256": shard["output_sha256"]}}
    return InjectionLog(m, sp.plan, lg.old_words[sp.positions], lg.new_words[sp.positions])


def _dir_log(log: InjectionLog | str | os.PathLike[str]) -> InjectionLog:
    lg = log if isinstance(log, InjectionLog) else InjectionLog.load(log)
    if not is_dir_log(lg):
        raise LogMismatchError("this log describes a single checkpoint file, not a checkpoint directory; "
                               "give the file it was made for")
    return lg


def replay_dir(log: InjectionLog | str | os.PathLike[str], src: str | os.PathLike[str],
               out: str | os.PathLike[str] | None = None, *, in_place: bool = False,
               log_path: str | os.PathLike[str] | bool | None = False, overwrite: bool = True) -> InjectionResult:
    """Re-apply a directory log to the directory it was made from; every touched shard must come out
    with its logged sha256 (nothing is committed otherwise).

    Raises
    ------
    LogMismatchError
        A shard is not the logged input, or the result differs from the logged output.
    """
    lg = _dir_log(log)
    layout = read_checkpoint_dir(src)
    root = layout.file
    target = os.path.realpath(root) if in_place else _target_dir(root, out, overwrite)
    lp = _log_path(log_path, target, root, in_place)
    want = lg.manifest["checkpoint_dir"]["shards"]

    def manifest(old: np.ndarray, new: np.ndarray, shards: dict[str, Any]) -> dict[str, Any]:
        for name, rec in shards.items():
            w = want.get(name, {})
            if rec["input_sha256"] != w.get("input_sha256"):
                raise LogMismatchError(f"{os.path.join(root, name)} is not the shard this log was made from "
                                       "(sha256 differs); give the original directory")
            if rec["output_sha256"] != w.get("output_sha256"):
                raise LogMismatchError(f"replaying onto {os.path.join(root, name)} gave another file than the log "
                                       "records; nothing was written")
        if not np.array_equal(old, lg.old_words) or not np.array_equal(new, lg.new_words):
            raise LogMismatchError(f"replaying onto {root} gave other words than the log records; nothing was written")
        m = {k: v for k, v in lg.manifest.items() if k != "tensors"}
        m["output"] = dict(m["output"], path=os.path.abspath(target))
        m["replayed_from"] = lg.manifest.get("created")
        m["_storage"] = {t["name"]: {k: v for k, v in t.items() if k in ("storage", "shard")}
                         for t in lg.manifest.get("tensors", [])}
        return m

    with _writer_lock(layout, "replay --in-place", in_place):
        new_log = _write_dir(layout, target, in_place, lg.plan, lp, "auto", True, manifest)
    return InjectionResult(target, new_log, lp, dict(lg.manifest.get("counts", {})))


def revert_dir(log: InjectionLog | str | os.PathLike[str], file: str | os.PathLike[str],
               out: str | os.PathLike[str] | None = None, *, overwrite: bool = True, verify: bool = True
               ) -> RevertResult:
    """Restore every shard the logged injection changed (in place unless ``out``), each checked by sha256.

    A shard already at its logged input (an in-place run killed between its renames) is left alone;
    ``sites`` of the result counts the sites restored (0 when every touched shard already was the original).
    Each shard is read once (its hash now and the hash it will have, from the same bytes); a shard that is not
    the logged output is hashed once more, to tell the logged input from another file.

    A log without hashes (``hash_files=False``) cannot prove a restored shard is the original: it is refused
    unless ``verify=False``; then only the words at the logged sites are checked and the result says
    ``verified=False``.

    Raises
    ------
    LogMismatchError
        A touched shard is neither the logged output nor the logged input; nothing is changed.
    """
    lg = _dir_log(log)
    layout = read_checkpoint_dir(file)
    root = layout.file
    in_place = out is None
    target = os.path.realpath(root) if in_place else _target_dir(root, out, overwrite)
    want = lg.manifest["checkpoint_dir"]["shards"]
    missing = sorted(set(want) - set(layout.shards))
    if missing:
        raise LogMismatchError(f"{root}: lacks {missing[0]}, which the log changed; give the directory it describes")
    hashed = all(rec.get("input_sha256") and rec.get("output_sha256") for rec in want.values())
    if verify and not hashed:
        raise LogMismatchError(f"{root}: the log holds no hash of the original shards, so a revert cannot be "
                               "verified; give --no-verify (verify=False) to revert without that check")
    with _writer_lock(layout, "revert", in_place), staged(name=target) as st:
        shard_path = _stage_shards(st, root, in_place, target)
        todo = {sp.shard: sp for sp in shard_plans(lg.plan, layout)}
        restored = 0
        for name, rec in want.items():
            sp = todo[name]
            path, tmp = os.path.join(root, name), shard_path(name)
            try:
                revert_into(_sub_log(lg, sp, rec), path, tmp, verify=hashed)  # staged once, by ``st``
                restored += len(sp.positions)
                continue
            except LogMismatchError:
                if not hashed:
                    raise
                digest = sha256_file(path, cache=False)  # not the logged output: the logged input, or another file?
                if digest == rec["output_sha256"]:
                    raise
                if digest != rec["input_sha256"]:
                    raise LogMismatchError(f"{path} is not the shard this log describes (sha256 differs); "
                                           "nothing was changed") from None
            if in_place:
                st.drop(tmp)  # already the original: left alone
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)  # what the refused revert wrote there
                share_copy(path, tmp, True)
        if not in_place:
            copy_tree(root, st.temp(target), _NotCarried(layout, set(want)), True)
    return RevertResult(target, lg.manifest["input"]["sha256"], restored, verified=hashed)

