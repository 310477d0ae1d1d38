"""What activation-fault hooks share across frameworks: layer naming and selection, the recording and
faulting flows, and the dtype words of layer outputs.

Layer: ``live`` (may import files and below; imported by frameworks and above).

:class:`Hooks` is the base of :class:`fastflip.live.act_torch.TorchHooks` and
:class:`fastflip.live.act_keras.KerasHooks`; each framework supplies how it hooks a layer, describes and
writes an output, and probes output shapes (:mod:`fastflip.live.act_frameworks` picks one for a model).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
import weakref
from typing import Any, Callable, ContextManager, Iterator

import numpy as np

from ..core.plan import TensorRef
from ..errors import OptionError, SelectionError
from ..files.select import dtype_matcher
from .act_targets import CACHE_PARTS, Recorded, base_of, choose, output_name, pick, replace, split_target

__all__ = ["FORMATS", "Hooks", "UINT", "call_name", "format_dtype", "label", "listing"]

#: Unsigned word type of each item size
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


#: Float formats held in unsigned words (NumPy lacks them)
FORMATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def format_dtype(name: str, key: str) -> str:
    """The ref dtype of a layer output in a float format NumPy lacks (its format name), if refs carry formats."""
    import dataclasses

    if "format" not in {f.name for f in dataclasses.fields(TensorRef)}:
        raise OptionError(f"layer {name} outputs {key}: this fastflip has no {key} word format; deselect it")
    return key


def label(dtype: str) -> str:
    """A ref dtype for messages: ``float32``, ``bfloat16``."""
    return dtype if dtype in FORMATS else str(np.dtype(dtype))


def _ref_dtype(ref: TensorRef) -> str:
    return getattr(ref, "format", None) or ref.dtype


def call_name(name: str, k: int) -> str:
    """Name of the ``k``-th call (0-based) of layer ``name`` in one forward: ``name``, ``name#1``, ..."""
    return name if k == 0 else f"{name}#{k}"


def listing(names: list[str]) -> str:
    """Up to 12 names for a message, ``a, b (+N more)`` (``none`` when empty)."""
    shown = ", ".join(names[:12])
    return shown + (f" (+{len(names) - 12} more)" if len(names) > 12 else "") if names else "none"


class Hooks:
    """What both frameworks share: layer naming, selection, the recording and faulting flows."""

    layers: dict[str, Any]
    leaves: list[str]

    def select(self, selection: Any) -> list[str]:
        """The selected layer names (default: every leaf layer)."""
        if selection is not None and selection.roles:
            raise OptionError("roles select tensors, not layer outputs: use layers=, include= or dtypes= for activations")
        self.chosen = choose(self.layers, self.leaves, selection, ops=self._OPS)
        names = self.chosen.names
        if not names:
            raise SelectionError(f"selection {selection.describe() if selection is not None else ''} matches no layer "
                                 f"of this {type(self.model).__name__}; its layers: {listing(list(self.layers))}")
        return names

    _OPS = False  # functional targets (MODULE:OP, MODULE:cache.*) need PyTorch

    def refs(self, names: list[str], rec: dict[str, tuple[tuple[int, ...], str]], selection: Any) -> list[TensorRef]:
        """Per-sample output refs in forward order, filtered by the selection's dtypes.

        Targets that never ran or whose output is not a tensor stop the block when they were named exactly,
        and are left out (one warning lists them) when a glob or the default selection matched them."""
        chosen = self.chosen
        exact = chosen.exact
        ran = getattr(rec, "ran", set(rec))
        errors = {c: m for c, m in getattr(rec, "errors", {}).items() if chosen.wanted(c)[2]}
        have = {chosen.wanted(c)[:2] for c in [*rec, *errors]}
        for base, ks in chosen.calls.items():
            lost = sorted(k for k in ks or () if (base, k) not in have)
            if lost and base in exact and base in ran:
                raise OptionError(f"{base}#{lost[0]} never ran: {base} ran "
                                  f"{max([k + 1 for b, k in have if b == base], default=0)} time(s) in the forward")
        missing = [n for n in names if n not in ran]
        hard = [n for n in missing if n in exact]
        if hard:
            why = self._hint(hard[0]) or " (defined but not called?): select layers that model.forward calls"
            raise OptionError(f"layer(s) {listing(hard)} never ran in the forward of this {type(self.model).__name__}"
                              + why)
        for c, msg in errors.items():
            if base_of(c) in exact:
                raise OptionError(msg + self._hint(c))
        left = ([f"{n} (never ran)" for n in missing] if chosen.explicit else []) + list(errors.values())
        refs = [TensorRef(n, dt, shape) for n, (shape, dt) in rec.items() if chosen.wanted(n)[2]]
        if not refs:
            raise OptionError(f"no layer of this {type(self.model).__name__} ran in its forward"
                              + (f" with a tensor output ({'; '.join(left[:4])})" if left else ""))
        if left:
            warnings.warn(f"fastflip: {len(left)} activation target(s) left out: {'; '.join(left[:8])}"
                          + (f" (+{len(left) - 8} more)" if len(left) > 8 else ""), stacklevel=5)
        if selection is not None and selection.dtypes:
            def keep(r: TensorRef) -> bool:
                fmt = getattr(r, "format", None)
                return any(dtype_matcher(d)(np.dtype(r.dtype), fmt) if fmt else dtype_matcher(d)(np.dtype(r.dtype))
                           for d in selection.dtypes)

            refs = [r for r in refs if keep(r)]
            if not refs:
                raise SelectionError(f"no selected layer outputs dtype {', '.join(selection.dtypes)}; outputs: "
                                     + listing([f"{n} {label(dt)}" for n, (_, dt) in rec.items()]))
        empty = [r.name for r in refs if r.size == 0]
        if empty:
            raise OptionError(f"layer output(s) {listing(empty)} have no elements; deselect them")
        return refs

    _FORWARD_AT = False  # forward= (fault one forward of the block) needs PyTorch's per-forward hooks

    @contextlib.contextmanager
    def faulting(self, names: list[str], selection: Any, log: Any, state: dict, make_sites: Callable,
                 at: int | None = None) -> Iterator[None]:
        """Fault the outputs of the targets ``names`` in every forward of the model inside the block (only forward
        ``at`` when given), by the sites ``state["sites"]`` holds, or, when it holds none, by the sites
        ``make_sites(refs)`` draws at the first forward from the probed output shapes; every fault is added to
        ``log``. The framework hooks the model's forward and the targets' outputs (:meth:`_faulting_hooks`).

        Raises
        ------
        OptionError
            ``at`` on a framework without per-forward hooks, or when the block ran no forward (or none numbered
            ``at``, or forward ``at`` ended before its targets ran: a forward that raises is counted).
        SelectionError
            A fixed plan naming a layer the model does not have.
        """
        if at is not None and not self._FORWARD_AT:
            raise OptionError("forward= (fault one forward of the block) needs a PyTorch model")
        fixed = state["sites"]
        if fixed is not None:  # a fixed plan: hook the targets it names
            names = list(dict.fromkeys(base_of(r.name) for r in fixed.refs))
            bad = [split_target(n)[0] for n in names if split_target(n)[0] not in self.layers]
            if bad:
                raise SelectionError(f"layer {bad[0]!r} is not in this {type(self.model).__name__}; its layers: "
                                     f"{listing(list(self.layers))}")
        # "on": this forward is faulted; "hit": a target ran in a faulted forward; "depth": forwards of the model
        # running now (a model calling itself nests them); a target that runs at depth 0 runs outside a forward of
        # the model and is refused
        st: dict[str, Any] = {"counts": {}, "state": state, "log": log, "probing": False, "probed": set(), "index": {},
                              "on": at is None, "at": at, "cached": [], "depth": 0, "hit": False}
        if fixed is not None:
            st["index"] = {r.name: i for i, r in enumerate(fixed.refs)}
            st["probed"], st["fixed"] = set(st["index"]), True

        def start(probe: Callable[[], dict]) -> None:
            st["depth"] += 1
            if st["depth"] > 1:  # the model called inside its own forward: part of that forward
                return
            st["counts"] = {}
            st["on"] = at is None or log.forwards == at
            if st["on"] and state["sites"] is None:
                self._learn(st, names, selection, make_sites, probe)
                st["counts"] = {}

        def end() -> None:
            st["depth"] -= 1
            if not st["depth"]:
                log.forwards += 1

        def fault(name: str, out: Any, args: tuple = ()) -> Any:
            if st["probing"]:
                return None
            if not st["depth"]:
                raise OptionError(f"layer {name} ran outside a forward of the model itself: call the model, not its "
                                  f"layers{self._outside_hint(name)}")
            if not st["on"]:
                return None
            st["hit"] = True
            return self._fault_output(st, name, out, args)

        ok = False
        with self._faulting_hooks(names, lambda: st["probing"], start, end, fault):
            yield
            ok = True
        if ok and log.forwards == 0:
            raise OptionError(f"the {type(self.model).__name__} never ran a forward inside injected_activations(...): "
                              "nothing was injected (call the model inside the block)")
        if ok and at is not None and log.forwards <= at:
            raise OptionError(f"forward={at} but the {type(self.model).__name__} ran {log.forwards} forward(s) inside "
                              "injected_activations(...): nothing was injected")
        if ok and at is not None and not st["hit"]:
            raise OptionError(f"forward={at} of the {type(self.model).__name__} ended before its targets ran (a forward "
                              f"that raises counts: a retry runs as forward {at + 1}): nothing was injected")

    def _faulting_hooks(self, names: list[str], probing: Callable[[], bool], start: Callable[[Callable[[], dict]], None],
                        end: Callable[[], None], fault: Callable[..., Any]) -> ContextManager[None]:
        """The framework's hooks of :meth:`faulting`: at the start of each call of the model itself (none while
        ``probing()``), ``start(probe)`` with the probe of that call's output shapes, and ``end()`` after it, also
        when it raises (``start`` included); each output of a target through ``fault(target, output[, args])`` (its
        result, when not None, replaces the output). ``start`` and ``end`` count the forwards (an outermost call is
        one) and whether one is running."""
        raise NotImplementedError

    def _hint(self, name: str) -> str:
        """More of the refusal of target ``name`` that never ran or holds no tensor, where the framework knows
        why (after the message, from ``; ``)."""
        return ""

    def _outside_hint(self, name: str) -> str:
        """More of the refusal of target ``name`` run outside a forward of the model (after ``call the model, not
        its layers``), where the framework knows why it ran there."""
        return ""

    def _learn(self, st: dict[str, Any], names: list[str], selection: Any, make_sites: Callable,
               probe: Callable[[], dict]) -> None:
        """At the first forward: probe the output shapes (the faulting hooks stand aside) and draw the sites."""
        st["probing"] = True
        try:
            rec = probe()
        finally:
            st["probing"] = False
        refs = self.refs(names, rec, selection)
        make_sites(refs)
        st["index"] = {r.name: i for i, r in enumerate(refs)}
        st["probed"] = set(rec) | set(getattr(rec, "errors", ()))

    def _record_output(self, rec: Recorded, name: str, counts: dict[str, int], out: Any) -> None:
        """Record the output of target ``name`` (``MODULE[:WHAT]``): its picked tensor's shape, or why it has none."""
        k = counts.get(name, 0)
        counts[name] = k + 1
        rec.ran.add(name)
        what = split_target(name)[1]
        try:
            key, t = pick(out, what)
        except OptionError as exc:
            rec.errors[call_name(name, k)] = f"layer {call_name(name, k)} {exc}"
            return
        cname = call_name(output_name(name, what, key), k)
        try:
            rec[cname] = self.describe(cname, t)
        except OptionError as exc:
            rec.errors[call_name(name, k)] = str(exc)

    def _aliases(self, t: Any, args: tuple) -> bool:
        """Whether output ``t`` may share memory with something that outlives the call (one of its inputs, the
        model's own parameters and buffers): then it is faulted in a copy."""
        return False

    @staticmethod
    def _once_in_cache(st: dict[str, Any], cname: str, t: Any) -> None:
        """Refuse to fault a cache tensor that an earlier forward of this block faulted and that still holds it (a
        static cache returns its one buffer at every step): a second flip of the same bits would undo the first."""
        if st["at"] is None:
            if any(r() is t for r in st["cached"]):
                raise OptionError(f"layer {cname} returns in forward {st['log'].forwards} the cache tensor faulted in "
                                  "an earlier forward, which still holds that fault (a static cache): faulting it in "
                                  "every forward would flip the same bits back; give forward=k to fault it once")
            st["cached"] = [r for r in st["cached"] if r() is not None] + [weakref.ref(t)]

    def _fault_output(self, st: dict[str, Any], name: str, out: Any, args: tuple = ()) -> Any:
        """The faulted output of one call of target ``name``, or None when ``out`` was faulted in place / untouched."""
        k = st["counts"].get(name, 0)
        st["counts"][name] = k + 1
        sites = st["state"]["sites"]
        what = split_target(name)[1]
        try:
            key, t = pick(out, what)
        except OptionError as exc:
            if call_name(name, k) in st["probed"]:  # left out when the sites were drawn
                return None
            raise OptionError(f"layer {call_name(name, k)} {exc} in forward {st['log'].forwards}") from None
        cname = call_name(output_name(name, what, key), k)
        if ("faulted", cname) in st["counts"]:  # `attn` and `attn:out.0` name one output: fault it once
            return None
        st["counts"][("faulted", cname)] = 1
        li = st["index"].get(cname)
        if li is None:  # a fixed plan names only the calls it faults (a cell of `relu#1`)
            if not st.get("fixed") and cname not in st["probed"] and call_name(name, k) not in st["probed"]:
                raise OptionError(f"layer {name} ran {k + 1} times in forward {st['log'].forwards}, more than in the first "
                                  "forward: its extra outputs have no sites")
            return None
        shape, dt = self.describe(cname, t)
        ref = sites.refs[li]
        if TensorRef(ref.name, dt, shape) != ref:
            raise OptionError(f"layer {cname} outputs {shape} {label(dt)} per sample in forward {st['log'].forwards}, "
                              f"but {ref.shape} {label(_ref_dtype(ref))} when its sites were drawn: activation sites need "
                              "fixed output shapes and dtypes (use one input shape per block, or forward= to fault "
                              "one forward)")
        # a KV cache's tensors are faulted where they are stored (later steps read the fault) when they are
        # contiguous and need no gradient, else in a copy (as any output); any other output is faulted in place
        # only when it is the call's own new memory (the alias test runs only for a call that has sites)
        if what in CACHE_PARTS:
            self._once_in_cache(st, cname, t)
        alias = None if what in CACHE_PARTS else lambda: self._aliases(t, args)
        new = self.write(t, li, sites, st["log"], alias)
        return None if new is None else replace(out, key, new)
