"""Run older-tool settings on a checkpoint: either design, fastflip's log, the older tool's sequence JSON.

Layer: ``compat`` (may import experiment and below; imported by cli).

Imports :mod:`fastflip.files.inject` and :mod:`fastflip.core.spec`. :func:`run_old_settings` is what
``fastflip inject --config old.yaml`` and ``fastflip hdf5-corrupter`` call. The input is copied to the
output unless ``in_place`` (the older tool always edited its input); either way fastflip's log is written,
so every run replays (``fastflip replay``) and reverts (``fastflip revert``) bit for bit.

Examples
--------
>>> import os, tempfile, numpy as np, h5py
>>> from fastflip.compat.oldconfig import OldSettings
>>> d = tempfile.mkdtemp(); src = os.path.join(d, "m.h5")
>>> with h5py.File(src, "w") as f:
...     f["a"] = np.ones(8, "f4"); f["b"] = np.arange(64, dtype="i4")
>>> r = run_old_settings(OldSettings(tries=10, precision=32), src, os.path.join(d, "o.h5"), seed=4)
>>> r.run.attempts, r.result.log_path.endswith("o.h5.fflog")
(10, True)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..core.plan import Plan
from ..core.spec import SAMPLING_KEYS, Sampling
from ..errors import InputFileError, OptionError
from ..files.fileio import atomic_output, check_output_dir
from ..files.h5apply import read_words
from ..files.inject import InjectionResult, cached_layout, inject_file
from ..files.layout import Tensor
from ..files.outputs import default_log_path
from ..files.paths import resolve_output
from ..files.select import Selection, select
from .sequence_check import check_sequence
from .oldconfig import OldSettings, map_old_config
from .oldtool import MAX_NDIM, OldToolRun, old_tool_plan

__all__ = ["OldRunResult", "run_old_settings", "load_sequence", "save_sequence", "location_list", "DESIGNS"]

DESIGNS = ("oldtool", "fastflip")


@dataclass
class OldRunResult:
    """The injection result, the simulated run (``oldtool`` design) and the sequence file written, if any."""

    result: InjectionResult
    run: OldToolRun | None = None
    sequence_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def location_list(s: OldSettings, tensors: Sequence[Tensor], first_prefix: bool = False) -> tuple[list[int], list[str]]:
    """The older tool's location list as tensor ids, and the location (prefix) each entry is filed under.

    Random locations (or a sequence to load, whose locations pick among all): every tensor once. Otherwise each
    prefix expands to every tensor whose path (or an alias) starts with it, prefix by prefix, so a tensor under
    two prefixes is listed twice. Each entry is filed under the prefix it came from; with ``first_prefix``
    under the first location (in list order) its path starts with, as the older tool filed its saved sequence
    (``get_base_locations_for``): a dataset under two overlapping prefixes always under the first one, and
    with random locations a dataset under an earlier dataset whose path is a prefix of its own.
    """
    if s.use_random_locations or s.load_sequence:
        ids, bases = list(range(len(tensors))), [t.path for t in tensors]
    else:
        ids, bases = [], []
        for loc in s.locations:
            p = "/" + str(loc).lstrip("/")
            hit = [i for i, t in enumerate(tensors) if any(a.startswith(p) for a in t.aliases)]
            if not hit:
                raise OptionError(f"there are no datasets with the prefix {p!r} (locations_to_corrupt)")
            ids.extend(hit)
            bases.extend([p] * len(hit))
    if first_prefix:
        order = list(dict.fromkeys(bases))
        bases = [next(p for p in order if any(a.startswith(p) for a in tensors[i].aliases)) for i in ids]
    return ids, bases


def load_sequence(path: str) -> dict[str, list[Any]]:
    """Read an injection-sequence JSON, in either form: fastflip's (``{location: [[indexes, bits], ...]}``)
    or the older tool's (indexes ``[]`` in its config mode, or bits only in its first versions). ``PATH.json``
    is read when ``PATH`` does not exist (both tools append ``.json`` when saving)."""
    if not os.path.isfile(path) and os.path.isfile(path + ".json"):
        path += ".json"
    if not os.path.isfile(path):
        raise InputFileError(f"{path}: injection sequence file not found")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except ValueError as exc:
        raise OptionError(f"{path}: not an injection sequence (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise OptionError(f"{path}: an injection sequence maps each location to a list of [indexes, bits]")
    check_sequence(data, path)
    return {"/" + str(k).lstrip("/"): v for k, v in data.items()}


def save_sequence(sequence: dict[str, list[Any]], path: str) -> str:
    """Write the sequence as the older tool did (``.json`` appended when missing, indent 2), atomically
    (an empty path gives ``.json``, where the older tool put it without ``injection_sequence_path``)."""
    path = path if path.endswith(".json") else path + ".json"
    check_output_dir(path)
    with atomic_output(path) as tmp:
        with open(tmp, "w") as fh:
            json.dump(sequence, fh, indent=2)
    return path


def _reader(src: str, tensors: Sequence[Tensor]) -> Any:
    """Stored words of (tensor id, element) pairs: one pass over the file (an identity plan read)."""
    by_name = {t.path: t for t in tensors}
    refs = [t.ref() for t in tensors]

    def read(tids: np.ndarray, idx: np.ndarray) -> np.ndarray:
        probe = Plan.from_sites(refs, np.asarray(tids, np.int32), np.asarray(idx, np.int64))
        return read_words(src, probe, by_name)

    return read


def run_old_settings(s: OldSettings, src: str | None = None, dst: str | None = None, *, in_place: bool = False,
                     seed: int | None = None, design: str = "oldtool", log_path: str | bool | None = None,
                     selection: Selection | None = None, sequence_out: str | None = None,
                     old_sequence: str | None = None) -> OldRunResult:
    """Run settings ``s`` on ``src`` (default ``s.hdf5_file``); see the module docstring.

    ``design`` is ``'oldtool'`` (the older tool's sampling and value rules) or ``'fastflip'``
    (:func:`fastflip.compat.oldconfig.map_old_config`). ``selection`` narrows the datasets the settings see.
    The sequence JSON is written when ``s.save_sequence`` (to ``s.sequence_path``, else ``sequence_out``,
    else ``<output>.sequence.json``), each entry filed under the location it was drawn from, with indexes
    unless ``s.save_indexes`` is false. ``old_sequence`` writes it as the older tool did instead:
    ``'config'`` (its config mode: ``<injection_sequence_path>.json`` relative to the working directory, just
    ``.json`` without the key, and no indexes) or ``'flags'`` (its flags: ``--saveInjectionSequence PATH
    SAVE_INDEXES``); either way an entry is filed under the first location its dataset's path starts with.
    """
    import secrets

    if design not in DESIGNS:
        raise OptionError(f"design {design!r}: use oldtool or fastflip")
    if old_sequence not in (None, "config", "flags"):
        raise OptionError(f"old_sequence {old_sequence!r}: use 'config' or 'flags'")
    if old_sequence == "config":
        s = replace(s, save_indexes=False)  # its config reader never set INJECTION_SEQUENCE_SAVE_INDEXES
    src = src or s.hdf5_file
    if not src:
        raise OptionError("no input file: give FILE (--hdf5File) or hdf5_file in the config")
    layout = cached_layout(src)
    tensors = select(layout.tensors, selection) if selection is not None and not selection.is_all else list(layout.tensors)
    if not tensors:
        raise OptionError(f"{src}: no numeric datasets to corrupt")
    seed = secrets.randbits(63) if seed is None else int(seed)
    entries = int(sum(t.size for t in layout.tensors))
    extra = {"old_settings": {k: v for k, v in asdict(s).items() if k not in ("warnings", "notes")}, "design": design,
             **({"old_tool_refused": list(s.notes)} if s.notes else {})}
    warnings = list(s.warnings)
    lp: Any = log_path
    run: OldToolRun | None = None
    seq_target: str | None = None
    if design == "oldtool":
        seq_target = (_sequence_target(s, src, dst, in_place, log_path, sequence_out, old_sequence is not None)
                      if s.save_sequence else None)
        ids, bases = location_list(s, tensors, first_prefix=old_sequence is not None)
        seq = load_sequence(s.sequence_path) if s.load_sequence else None
        deep = sorted({tensors[i].path for i in ids if len(tensors[i].shape) > MAX_NDIM})
        if deep:
            warnings.append(f"{len(deep)} dataset(s) of more than {MAX_NDIM} dimensions ({', '.join(deep[:3])}"
                            f"{', ...' if len(deep) > 3 else ''}) are never changed in the older tool's design (it "
                            "skipped them, yet an attempt on them used up a try); --design fastflip corrupts them")
        run = old_tool_plan(s, [t.ref() for t in tensors], _reader(src, tensors), seed=seed, locations=ids,
                            bases=bases, file_entries=entries, sequence=seq)
        res = inject_file(src, dst, in_place=in_place, plan=run.plan, seed=seed, log_path=lp, layout=layout,
                          extra_manifest=extra)
    else:
        if s.load_sequence:
            raise OptionError("an injection sequence replays the older tool's design; drop --design fastflip")
        names = sorted({a for t in tensors for a in t.aliases})
        mapped = map_old_config(s, [t.dtype.str for t in tensors], entries, seed, names=names)
        warnings = mapped.warnings
        kw = dict(mapped.kwargs)
        kw.pop("log_path", None)
        sel = kw.pop("selection", None)
        if sel is not None and selection is not None and not selection.is_all:
            raise OptionError("the config names locations_to_corrupt; do not also give selection options")
        sampling = Sampling.of(where="config", **{k: kw.pop(k) for k in SAMPLING_KEYS if k in kw})
        res = inject_file(src, dst, in_place=in_place, seed=seed, log_path=lp, layout=layout, sampling=sampling,
                          selection=sel if sel is not None else selection, extra_manifest=extra, **kw)
    seq_path = None
    if s.save_sequence and run is not None:
        seq_path = save_sequence(run.sequence, seq_target or res.output + ".sequence")
    return OldRunResult(res, run, seq_path, warnings, list(s.notes))


def _sequence_target(s: OldSettings, src: str, dst: str | None, in_place: bool, log_path: Any,
                     sequence_out: str | None, old_form: bool = False) -> str | None:
    """The checked path of the sequence JSON, before anything is written: never the input (nor the loaded
    sequence), never the output or the log, never a device/FIFO/socket (:func:`resolve_output`)."""
    out = src if in_place else dst
    if out is None:
        return None
    if old_form:
        path = s.sequence_path or ""
    else:
        path = s.sequence_path or sequence_out or os.path.realpath(out) + ".sequence"
    path = path if path.endswith(".json") else path + ".json"
    log = None if log_path is False else (log_path if isinstance(log_path, str) else
                                          default_log_path(os.path.realpath(out), keep_existing=in_place))
    checked = resolve_output(path, inputs=[src, *([s.sequence_path] if s.load_sequence else [])],
                             others={"output": out, "log": log}, what="sequence file")
    return path if old_form else checked  # the older tool's name as it printed it (relative to the cwd)
