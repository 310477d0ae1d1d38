"""A set of live tensors prepared once, and plans checked against it once.

Layer: ``live`` (may import files and below; imported by frameworks and above).

:class:`Targets` holds what every trial needs (base addresses, word widths, byte
orders, shapes) so that applying a plan is one native call over all CPU tensors,
one kernel launch per GPU, and one gather/scatter per TensorFlow variable. A plan is
validated against the targets the first time it is used (names, dtypes, shapes,
element ranges, unique elements, writability) and the resulting site arrays are
cached for as long as the plan object lives, so a plan generated once can be
applied many times at the cost of the kernel call alone.

The targets hold raw addresses. Every read, write and injection first checks that each tensor it
touches still has the storage the targets were built on (:mod:`fastflip.live.storage`): after a
replacement (``m.weight.data = ...``, ``load_state_dict(assign=True)``, ``model.half()``, ``model.to(...)``,
a new array under the same key) it raises :class:`~fastflip.errors.StaleTargetError` and nothing is
written: rebuild the targets. In-place updates (training steps, ``load_state_dict``) keep them valid.

Examples
--------
>>> import numpy as np
>>> from fastflip.core.plan import Plan, TensorRef
>>> t = Targets.from_tensors({"w": np.ones(4, np.float32)})
>>> [r.name for r in t.refs()], t.kinds
(['w'], {'cpu'})
"""

from __future__ import annotations

import difflib
import weakref
from functools import partial
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from ..kernels import dispatch as native
from ..core.dtypes import word_type
from ..errors import (OptionError, PlanMismatchError, ReadOnlyTargetError, SelectionError, StaleTargetError,
                      TensorNotFoundError)
from ..files.layout import Tensor
from ..core.records import SiteArrays
from ..core.plan import Plan, TensorRef
from .adapters import LiveTensor, collect
from .siteaccess import Prepared, SiteAccess
from .storage import MappingSource, key_function, same_objects

__all__ = ["Targets"]

_SMALL = 16  # plans of up to this many sites are checked on Python integers (Targets._prepare_small)


class Targets(SiteAccess):
    """Named live tensors, prepared for repeated injection.

    Build with :meth:`from_tensors` (a mapping, a ``torch.nn.Module``, a Keras model,
    or another ``Targets``). ``skipped`` names model tensors of unsupported dtypes.
    """

    def __init__(self, tensors: list[LiveTensor], skipped: "list[str] | dict[str, str] | None" = None) -> None:
        self.tensors = list(tensors)
        self.skipped = list(skipped or [])
        self._why = dict(skipped) if isinstance(skipped, dict) else {}  # name -> why it was left out
        # names compare without a leading "/": a layout calls a dataset "/model/w", a live model "model/w"
        self.index = {t.name.lstrip("/"): i for i, t in enumerate(self.tensors)}
        if len(self.index) != len(self.tensors):
            raise OptionError("two live tensors have the same name")
        for i, t in enumerate(self.tensors):  # aliases (tied names, checkpoint paths) reach the same tensor
            for a in t.aliases:
                self.index.setdefault(a.lstrip("/"), i)
        # views, or tensors sharing memory in any other way: a plan is checked for sites whose bytes overlap
        self._has_views = any(t.view_of for t in self.tensors) or _overlapping(self.tensors)
        for t in self.tensors:
            if t.kind != "tf" and any(s < 0 for s in t.strides):
                raise OptionError(f"tensor {t.name!r} has negative strides: pass a contiguous array")
        cpu = [t.kind == "cpu" for t in self.tensors]
        self.table = native.PtrTable(
            [t.ptr if c else 0 for t, c in zip(self.tensors, cpu)],
            [t.dtype.itemsize for t in self.tensors],
            [word_type(t.dtype).swapped for t in self.tensors],
            [t.extent if c else 0 for t, c in zip(self.tensors, cpu)],
            [word_type(t.dtype, t.format) if t.format else t.dtype for t in self.tensors],
        )
        self.kinds = {t.kind for t in self.tensors}
        self._prepared: dict[int, tuple[weakref.ref, Prepared, tuple[Any, ...]]] = {}
        self._mappings: dict[int, tuple[tuple[TensorRef, ...], np.ndarray]] = {}
        self._sizes = np.array([t.size for t in self.tensors], dtype=np.int64)
        self._writable = np.array([t.writable for t in self.tensors], dtype=bool)
        self._all_writable = bool(self._writable.all())
        self._contiguous = np.array([t.kind == "tf" or t.contiguous for t in self.tensors], dtype=bool)
        self._all_contiguous = bool(self._contiguous.all())
        self._kind = np.array([{"cpu": 0, "cuda": 1, "tf": 2}[t.kind] for t in self.tensors], dtype=np.int8)
        self._all_cpu = not self._kind.any()
        self._device = np.array([t.device for t in self.tensors], dtype=np.int64)
        self._spans: dict[int, tuple[Any, int]] = {}
        # per tensor: (source, key function, key) of its storage when built, re-checked before each use
        self._fresh: list[tuple[Callable[[], Any], Callable[[Any], Any], Any] | None] = [
            _freshness(t) for t in self.tensors]
        self._checked = np.array([f is not None for f in self._fresh], dtype=bool)
        self._all_checked = bool(self._checked.all())
        self._any_checked = bool(self._checked.any())
        # NumPy arrays of one mapping (the common case) are checked as one group: their keys and objects
        arrays = [f is not None and isinstance(f[0], MappingSource) and isinstance(t.obj, np.ndarray)
                  for f, t in zip(self._fresh, self.tensors)]
        owners = {id(f[0].mapping) for f, a in zip(self._fresh, arrays) if a}  # type: ignore[index]
        self._one_mapping = (self._fresh[0][0].mapping  # type: ignore[index]
                             if self._all_checked and all(arrays) and len(owners) == 1 else None)
        self._map_keys = [f[0].key if a else None for f, a in zip(self._fresh, arrays)]  # type: ignore[index]
        self._objs = [t.obj for t in self.tensors]
        self._lists: tuple[list[int], list[int], list[bool]] | None = None  # for _prepare_small
        self._syncs = [t.sync for t in self.tensors]  # torch.ao packed weights: repack around each write
        self._any_sync = any(s is not None for s in self._syncs)

    @classmethod
    def from_tensors(cls, obj: Any, *, include_optimizer: bool = False, optimizer: Any = None) -> "Targets":
        """Targets of a mapping name -> tensor, a PyTorch module or a Keras model (see :mod:`.adapters`).

        ``optimizer``: a ``torch.optim`` optimizer whose state joins the targets (for a
        Keras model, ``include_optimizer=True`` adds its own optimizer's variables).

        Raises
        ------
        SelectionError
            The object holds no tensor that can be injected (the message lists what was left out).
        """
        if isinstance(obj, Targets):
            return obj
        tensors, skipped = collect(obj, include_optimizer=include_optimizer, optimizer=optimizer)
        if not tensors:
            names = list(skipped)
            left = f" (left out: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""
            raise SelectionError(f"no tensors to inject in this {type(obj).__name__}{left}; "
                                 "pass a model with float/int tensors or a mapping name -> tensor")
        return cls(tensors, skipped)

    def __len__(self) -> int:
        return len(self.tensors)

    def sync(self, prep: Prepared, written: bool = False) -> None:
        """Bring the model's own copies of the words ``prep`` touches up to date (a ``torch.ao`` packed weight:
        reloaded from the module when it was replaced; repacked when ``written``, after the words were written);
        nothing for others. :func:`fastflip.live.inject` and :func:`~fastflip.live.revert` call it before writing
        and, with ``written=True``, after."""
        if self._any_sync:
            for sync in {self._syncs[i] for i in np.unique(prep.sites.tensor).tolist() if self._syncs[i] is not None}:
                sync(written)

    def refs(self) -> list[TensorRef]:
        """:class:`~fastflip.core.plan.TensorRef` of every tensor, to build a ``SiteSpace`` from a live model.

        Ordered as a checkpoint's layout orders its datasets (HDF5 name order, group by
        group), so that a site space over a live model and one over its checkpoint are
        the same space: the same seed draws the same sites in both.
        """
        return [t.ref() for t in self.sampled()]

    def sampled(self) -> list[LiveTensor]:
        """The tensors a site space draws from, in checkpoint order (views of other tensors left out)."""
        keep = [t for t in self.tensors if not t.view_of]
        return sorted(keep, key=lambda t: (t.order or t.name).strip("/").split("/"))

    def records(self) -> list[Tensor]:
        """:class:`~fastflip.files.layout.Tensor` records of :meth:`sampled` (name, aliases, layer, role) for
        :func:`fastflip.files.select.select`; every name and alias matches as ``/<name>``."""
        return [t.record() for t in self.sampled()]

    def get(self, name: str) -> LiveTensor:
        """The tensor called ``name`` (or having it as an alias).

        Raises
        ------
        TensorNotFoundError
            With the names that exist.
        """
        i = self.index.get(name.lstrip("/"))
        if i is None and name.lstrip("/") in self._why:
            raise TensorNotFoundError(f"{self._why[name.lstrip('/')]} (left out of these targets)")
        if i is None:
            near = difflib.get_close_matches(name.lstrip("/"), list(self.index), n=3)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise TensorNotFoundError(f"no tensor {name!r} here; {hint}{self.describe_names()}")
        return self.tensors[i]

    def describe_names(self, limit: int = 8) -> str:
        """``have: a, b, ... (+N more)`` for error messages."""
        names = [t.name for t in self.tensors]
        more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
        return "have: " + (", ".join(names[:limit]) or "no tensors") + more

    # ------------------------------------------------------------------ plan validation

    def prepare(self, plan: Plan) -> Prepared:
        """Check ``plan`` against these tensors (once per plan object) and resolve its sites.

        The result is cached while the plan object lives and holds the same column arrays (they
        are read-only; a column replaced by assignment is prepared again).

        Raises
        ------
        TensorNotFoundError, PlanMismatchError
            The plan names a tensor that is not here, or its dtype/shape differs, or
            an element index is out of range, or an element appears twice.
        ReadOnlyTargetError
            The plan touches a read-only array.
        """
        key = id(plan)
        hit = self._prepared.get(key)
        if hit is not None and hit[0]() is plan:
            c = hit[2]  # the very columns it was prepared from (they are read-only: see Plan)
            if (c[0] is plan.tensor and c[1] is plan.index and c[2] is plan.and_mask and c[3] is plan.or_mask
                    and c[4] is plan.xor_mask and c[5] is plan.scale and c[6] is plan.tensors):
                return hit[1]
        prep = self._prepare(plan)
        cols = (plan.tensor, plan.index, plan.and_mask, plan.or_mask, plan.xor_mask, plan.scale, plan.tensors)
        self._prepared[key] = (weakref.ref(plan, lambda _r, k=key: self._prepared.pop(k, None)), prep, cols)
        return prep

    def _mapping(self, refs: tuple[TensorRef, ...]) -> np.ndarray:
        """Target id of each of a plan's tensors (checked once per tensor tuple: plans drawn
        from one ``SiteSpace`` share theirs)."""
        hit = self._mappings.get(id(refs))
        if hit is not None and hit[0] is refs:
            return hit[1]
        mapping = np.empty(len(refs), dtype=np.int32)
        for j, ref in enumerate(refs):
            i = self.index.get(ref.name.lstrip("/"))
            if i is None:
                raise TensorNotFoundError(f"the plan names tensor {ref.name!r}, which these tensors lack ({self.describe_names(5)})")
            t = self.tensors[i]
            # a plan's float format may describe plain unsigned words (a checkpoint's bf16 read into a uint16 array)
            if np.dtype(ref.dtype).newbyteorder("=") != t.dtype.newbyteorder("=") or (t.format and ref.format != t.format):
                raise PlanMismatchError(f"tensor {ref.name!r}: the plan's dtype is {ref.format or np.dtype(ref.dtype)}, "
                                        f"the tensor's is {t.format or t.dtype}")
            if tuple(ref.shape) != tuple(t.shape):
                raise PlanMismatchError(f"tensor {ref.name!r}: the plan's shape is {tuple(ref.shape)}, the tensor's is {t.shape}")
            mapping[j] = i
        if len(self._mappings) > 64:
            self._mappings.clear()
        self._mappings[id(refs)] = (refs, mapping)
        return mapping

    def _prepare(self, plan: Plan) -> Prepared:
        mapping = self._mapping(plan.tensors)
        n = len(plan)
        if 0 < n <= _SMALL and self._all_cpu and self._all_contiguous and not self._has_views:
            small = self._prepare_small(plan, mapping)
            if small is not None:
                return small
        if n and (int(plan.tensor.min()) < 0 or int(plan.tensor.max()) >= len(mapping)):
            raise PlanMismatchError(f"the plan's tensor ids must lie in [0, {len(mapping)})")
        tid = np.ascontiguousarray(mapping[plan.tensor]) if n else np.zeros(0, dtype=np.int32)
        idx = plan.index
        if n:
            outside = (idx < 0) | (idx >= self._sizes[tid])
            if outside.any():
                b = int(np.flatnonzero(outside)[0])
                t = self.tensors[int(tid[b])]
                raise PlanMismatchError(f"tensor {t.name!r}: element index {int(idx[b])} is outside its {t.size} elements")
            if not self._all_writable and not self._writable[tid].all():
                t = self.tensors[int(tid[np.flatnonzero(~self._writable[tid])[0]])]
                raise ReadOnlyTargetError(f"tensor {t.name!r} is read-only: pass a writable array (np.array(x) or mmap mode 'r+')")
            if n > 1 and not self._has_views:
                key = np.sort(tid.astype(np.int64) * (1 << 40) + idx)
                same = key[1:] == key[:-1]
                if same.any():
                    t = self.tensors[int(key[np.flatnonzero(same)[0]] >> 40)]
                    raise PlanMismatchError(f"tensor {t.name!r}: the plan hits an element twice (merge duplicate sites first)")
        offsets = idx * self.table.itemsizes[tid].astype(np.int64)
        strided = None if self._all_contiguous else ~self._contiguous[tid]
        if strided is not None and strided.any():
            for i in np.unique(tid[strided]):
                pos = np.flatnonzero(tid == i)
                offsets[pos] = self.tensors[int(i)].byte_offsets(idx[pos])
        if n > 1 and self._has_views:  # tensors share memory: compare the sites' bytes, not (tensor, index)
            twice = self._overlapping_site(tid, offsets)
            if twice is not None:
                raise PlanMismatchError(f"tensor {self.tensors[twice].name!r}: the plan hits stored bytes twice (through "
                                        "a view or alias, or tensors sharing memory); merge duplicate sites first")
        kinds = None if self._all_cpu else self._kind[tid]
        bitwise = plan.scale is None or bool(np.isnan(plan.scale).all())
        if not bitwise:
            bare = [r.name for r, i in zip(plan.tensors, mapping) if r.format and not self.tensors[int(i)].format]
            if bare:
                raise PlanMismatchError(f"tensor {bare[0]!r}: scaling {plan.tensors[0].format} values needs a tensor "
                                        "that knows its format (a torch bfloat16/float8 tensor), not plain words")
        prep = Prepared(SiteArrays(tensor=tid, offsets=np.ascontiguousarray(offsets), and_mask=plan.and_mask,
                                   or_mask=plan.or_mask, xor_mask=plan.xor_mask, scale=None if bitwise else plan.scale),
                        cpu=None, bitwise=bitwise)
        prep.touched, prep.fresh = self._checks(tid)
        if n and kinds is not None and kinds.any():
            prep.cpu = np.flatnonzero(kinds == 0)
            for i in np.unique(tid[kinds == 2]):
                prep.tf.append((int(i), np.flatnonzero(tid == i)))
            cuda_pos = np.flatnonzero(kinds == 1)
            devices = self._device[tid[cuda_pos]]
            for dev in np.unique(devices):
                pos = cuda_pos[devices == dev]
                prep.cuda[int(dev)] = (pos, self._site_arrays(plan, pos, int(dev), tid, offsets))
        return prep

    def _checks(self, tid: np.ndarray) -> tuple[tuple[int, ...], tuple[Callable[[], bool], ...]]:
        """The target ids among ``tid`` whose storage :meth:`check` re-checks, and the checks: one per tensor,
        or one for all the NumPy arrays of one mapping."""
        if not self._any_checked or not len(tid):
            return (), ()
        ids = tuple(dict.fromkeys(tid.tolist()) if len(tid) <= 64 else np.unique(tid).tolist())
        if self._one_mapping is not None:  # every tensor a NumPy array of one mapping: one identity pass
            pick = itemgetter(*ids)
            keys, objs = (pick(self._map_keys), pick(self._objs)) if len(ids) > 1 else (
                [self._map_keys[ids[0]]], [self._objs[ids[0]]])
            return ids, (same_objects(self._one_mapping, list(keys), list(objs)),)
        if not self._all_checked:
            ids = tuple(i for i in ids if self._checked[i])
        checks: list[Callable[[], bool]] = []
        arrays: dict[int, tuple[Any, list[Any], list[Any]]] = {}
        for i in ids:
            source, keyof, key = self._fresh[i]  # type: ignore[misc]
            if isinstance(source, MappingSource) and isinstance(self.tensors[i].obj, np.ndarray):
                group = arrays.setdefault(id(source.mapping), (source.mapping, [], []))
                group[1].append(source.key)
                group[2].append(self.tensors[i].obj)
            else:
                checks.append(partial(_same_storage, source, keyof, key))
        checks += [same_objects(m, keys, objs) for m, keys, objs in arrays.values()]
        return ids, tuple(checks)

    def check(self, prep: Prepared) -> None:
        """Refuse when a tensor ``prep`` touches no longer has the storage these targets were built on.

        A few attribute reads per touched torch tensor, one identity pass for a mapping's NumPy arrays
        (see :mod:`fastflip.live.storage`); every :meth:`read`, :meth:`write` and :meth:`apply` calls it first.

        Raises
        ------
        StaleTargetError
            The model holds another storage (or nothing) under that tensor's name now.
        """
        for ok in prep.fresh:
            if not ok():
                self._refuse(prep)

    def _refuse(self, prep: Prepared) -> None:
        for i in prep.touched:
            source, keyof, key = self._fresh[i]  # type: ignore[misc]
            now = source()
            if now is None or keyof(now) != key:
                name = self.tensors[i].name
                what = "is gone" if now is None else "has another storage (replaced, moved or converted)"
                raise StaleTargetError(f"tensor {name!r} {what} since these targets were built; rebuild them "
                                       "(fastflip.live.targets(model)) after .data =, .to(), .half() or "
                                       "load_state_dict(assign=True); nothing was changed")
        raise StaleTargetError("a tensor's storage changed since these targets were built; rebuild them")

    def _overlapping_site(self, tid: np.ndarray, offsets: np.ndarray) -> int | None:
        """The target id of a site whose word overlaps an earlier site's word in memory (same device), or None."""
        mem = np.flatnonzero(self._kind[tid] != 2)  # TensorFlow variables have no address
        tid, offsets = tid[mem], offsets[mem]
        start = np.array([t.ptr for t in self.tensors], dtype=np.int64)[tid] + offsets
        end = start + self.table.itemsizes[tid].astype(np.int64)
        dev = self._device[tid] * 4 + self._kind[tid]
        for d in np.unique(dev):
            pos = np.flatnonzero(dev == d)
            order = pos[np.argsort(start[pos], kind="stable")]
            reach = np.maximum.accumulate(end[order])
            hit = np.flatnonzero(start[order][1:] < reach[:-1])
            if len(hit):
                return int(tid[order][hit[0] + 1])
        return None

    def _prepare_small(self, plan: Plan, mapping: np.ndarray) -> Prepared | None:
        """:meth:`_prepare` of a trial's few sites on contiguous CPU tensors, with the same checks on Python
        integers (a NumPy call per check costs more than the check); None leaves errors and scale plans to it."""
        if plan.scale is not None:
            return None
        if self._lists is None:
            self._lists = (self._sizes.tolist(), self.table.itemsizes.tolist(), self._writable.tolist())
        sizes, itemsizes, writable = self._lists
        tid, offsets = [], []
        for t, i in zip(plan.tensor.tolist(), plan.index.tolist()):
            if not 0 <= t < len(mapping):
                return None
            k = int(mapping[t])
            if not (0 <= i < sizes[k] and writable[k]):
                return None
            tid.append(k)
            offsets.append(i * itemsizes[k])
        if len(tid) > 1 and len(set(zip(tid, offsets))) < len(tid):
            return None
        tids = np.array(tid, np.int32)
        prep = Prepared(SiteArrays(tensor=tids, offsets=np.array(offsets, np.int64),
                                   and_mask=plan.and_mask, or_mask=plan.or_mask, xor_mask=plan.xor_mask), cpu=None)
        prep.touched, prep.fresh = self._checks(tids)  # the storage checks, as _prepare sets them
        return prep


def _same_storage(source: Callable[[], Any], keyof: Callable[[Any], Any], key: Any) -> bool:
    now = source()
    return now is not None and keyof(now) == key


def _freshness(t: LiveTensor) -> tuple[Callable[[], Any], Callable[[Any], Any], Any] | None:
    """(source, key function, key) of a raw-address tensor that knows its source; None otherwise
    (TensorFlow variables are written through the variable, never a raw address)."""
    if t.source is None or t.kind == "tf" or t.obj is None:
        return None
    keyof = key_function(t.obj)
    try:
        return t.source, keyof, keyof(t.obj)
    except Exception:  # a tensor kind whose storage cannot be described: nothing to compare with
        return None


def _overlapping(tensors: list[LiveTensor]) -> bool:
    """Whether the memory of two of ``tensors`` (CPU or one CUDA device) overlaps: views, dtype views, two
    slices of one storage."""
    spans = sorted((t.kind, t.device, t.ptr, t.ptr + t.extent) for t in tensors if t.kind != "tf" and t.size)
    for (k0, d0, _, end0), (k1, d1, start1, _) in zip(spans, spans[1:]):
        if (k0, d0) == (k1, d1) and start1 < end0:
            return True
    return False
