"""Framework side of activation faults: find layers by name, hook their outputs, probe output shapes.

Layer: ``live`` (may import files and below; imported by frameworks and above).

PyTorch: forward hooks on the selected modules (named by module path, ``layer1.0.conv2``,
for any ``nn.Module`` subclass, nested) and a forward pre-hook on the model itself
that counts forwards and, at the first one, probes the selected layers' output
shapes. The probe runs the same call on the ``meta`` device (no computation, no
side effects); when the model cannot run there (data-dependent Python, autocast),
it runs the real call with copies of the buffers (BatchNorm statistics stay as
they are), the RNG state restored and gradients off.

Keras 3: the selected layers' ``call`` is wrapped on the instance (the class is not
touched) and restored exactly on exit; layers are named by their ``name`` (nested
layers of subclassed models included). While the block runs the model runs eagerly
(``run_eagerly``), so that ``predict``/``evaluate`` see the wrapped calls; compiled
functions are dropped on entry and exit. The probe is ``compute_output_spec``
(symbolic), or the real call when that fails.

Only :mod:`fastflip.live.activations` imports this module; torch and keras are imported
lazily by the class that needs them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import re
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import OptionError, SelectionError
from ..core.plan import TensorRef
from ..files.select import dtype_matcher, glob_to_regex
from .adapters import TORCH_DTYPES

__all__ = ["hooks_for", "TorchHooks", "KerasHooks", "call_name"]

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_PROBES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # model -> {call signature: shapes}


_FORMATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # float formats held in unsigned words


def _format_dtype(name: str, key: str) -> str:
    """The ref dtype of a layer output in a float format NumPy lacks (its format name), if refs carry formats."""
    import dataclasses

    if "format" not in {f.name for f in dataclasses.fields(TensorRef)}:
        raise OptionError(f"layer {name} outputs {key}: this fastflip has no {key} word format; deselect it")
    return key


def label(dtype: str) -> str:
    """A ref dtype for messages: ``float32``, ``bfloat16``."""
    return dtype if dtype in _FORMATS else str(np.dtype(dtype))


def _ref_dtype(ref: TensorRef) -> str:
    return getattr(ref, "format", None) or ref.dtype


def call_name(name: str, k: int) -> str:
    """Name of the ``k``-th call (0-based) of layer ``name`` in one forward: ``name``, ``name#1``, ..."""
    return name if k == 0 else f"{name}#{k}"


def hooks_for(model: Any) -> "_Hooks":
    mod = type(model).__module__.split(".")[0]
    try:
        import torch

        if isinstance(model, torch.nn.Module):
            return TorchHooks(model)
    except ImportError:  # pragma: no cover - torch is an extra
        pass
    if hasattr(model, "_flatten_layers") and hasattr(model, "call"):
        return KerasHooks(model)
    raise OptionError(f"activation faults need a torch.nn.Module or a Keras model, got {type(model).__name__} ({mod})")


def _name_matches(selection: Any, name: str) -> bool:
    """A layer name against a Selection's name criteria (layers, include, exclude, regex)."""
    if selection.layers and not any(fnmatch.fnmatchcase(name, g) for g in selection.layers):
        return False
    if selection.include or selection.regex:
        if not (any(glob_to_regex(g).match("/" + name) for g in selection.include)
                or any(re.search(rx, name) for rx in selection.regex)):
            return False
    return not any(glob_to_regex(g).match("/" + name) for g in selection.exclude)


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:12])
    return shown + (f" (+{len(names) - 12} more)" if len(names) > 12 else "") if names else "none"


class _Hooks:
    """What both frameworks share: layer naming, selection, the recording and faulting flows."""

    layers: dict[str, Any]
    leaves: list[str]

    def select(self, selection: Any) -> list[str]:
        """The selected layer names (default: every leaf layer)."""
        if selection is not None and selection.roles:
            raise OptionError("roles select tensors, not layer outputs: use layers=, include= or dtypes= for activations")
        self.explicit = not (selection is None or not (selection.layers or selection.include or selection.exclude
                                                       or selection.regex))
        if not self.explicit:  # every leaf layer that the forward calls
            names = list(self.leaves)
        else:
            names = [n for n in self.layers if _name_matches(selection, n)]
        if not names:
            raise SelectionError(f"selection {selection.describe() if selection is not None else ''} matches no layer "
                                 f"of this {type(self.model).__name__}; its layers: {_listing(list(self.layers))}")
        return names

    def refs(self, names: list[str], rec: dict[str, tuple[tuple[int, ...], str]], selection: Any) -> list[TensorRef]:
        """Per-sample output refs in forward order, filtered by the selection's dtypes."""
        missing = [n for n in names if n not in rec]
        if missing and getattr(self, "explicit", True):
            raise OptionError(f"layer(s) {_listing(missing)} never ran in the forward of this {type(self.model).__name__} "
                              "(defined but not called?): select layers that model.forward calls")
        refs = [TensorRef(n, dt, shape) for n, (shape, dt) in rec.items()]
        if not refs:
            raise OptionError(f"no layer of this {type(self.model).__name__} ran in its forward")
        if selection is not None and selection.dtypes:
            def keep(r: TensorRef) -> bool:
                fmt = getattr(r, "format", None)
                return any(dtype_matcher(d)(np.dtype(r.dtype), fmt) if fmt else dtype_matcher(d)(np.dtype(r.dtype))
                           for d in selection.dtypes)

            refs = [r for r in refs if keep(r)]
            if not refs:
                raise SelectionError(f"no selected layer outputs dtype {', '.join(selection.dtypes)}; outputs: "
                                     + _listing([f"{n} {label(dt)}" for n, (_, dt) in rec.items()]))
        empty = [r.name for r in refs if r.size == 0]
        if empty:
            raise OptionError(f"layer output(s) {_listing(empty)} have no elements; deselect them")
        return refs

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
        st["probed"] = set(rec)

    def _record_output(self, rec: dict, name: str, counts: dict[str, int], out: Any) -> None:
        k = counts.get(name, 0)
        counts[name] = k + 1
        rec[call_name(name, k)] = self.describe(name, out)

    def _fault_output(self, st: dict[str, Any], name: str, out: Any, alias: bool = False) -> Any:
        k = st["counts"].get(name, 0)
        st["counts"][name] = k + 1
        cname = call_name(name, k)
        sites = st["state"]["sites"]
        if sites is None:
            raise OptionError(f"layer {name} ran outside a forward of the model itself: call the model, not its layers")
        li = st["index"].get(cname)
        if li is None:
            if cname not in st["probed"]:
                raise OptionError(f"layer {name} ran {k + 1} times in forward {st['log'].forwards}, more than in the first "
                                  "forward: its extra outputs have no sites")
            return None
        shape, dt = self.describe(name, out)
        ref = sites.refs[li]
        if TensorRef(ref.name, dt, shape) != ref:
            raise OptionError(f"layer {cname} outputs {shape} {label(dt)} per sample in forward {st['log'].forwards}, "
                              f"but {ref.shape} {label(_ref_dtype(ref))} when its sites were drawn: activation sites need "
                              "fixed output shapes and dtypes (use one input shape per block)")
        return self.write(out, li, sites, st["log"], alias)


# ------------------------------------------------------------------------------ PyTorch

class TorchHooks(_Hooks):
    def __init__(self, model: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.layers = {n: m for n, m in model.named_modules() if n}
        self.leaves = [n for n, m in self.layers.items() if not any(True for _ in m.children())]

    _WORD = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}

    def describe(self, name: str, out: Any) -> tuple[tuple[int, ...], str]:
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            raise OptionError(f"layer {name} returns a {type(out).__name__}, not a tensor: select a layer whose "
                              "output is one tensor")
        if out.dim() == 0:
            raise OptionError(f"layer {name} returns a scalar: activation sites need a batch dimension")
        key = str(out.dtype).replace("torch.", "")
        if key in _FORMATS:
            return tuple(int(s) for s in out.shape[1:]), _format_dtype(name, key)
        dt = TORCH_DTYPES.get(key)
        if dt is None or dt == "?":
            raise OptionError(f"layer {name} outputs {out.dtype}: activation faults support float16/32/64, bfloat16, "
                              "float8 and integer outputs; deselect it")
        return tuple(int(s) for s in out.shape[1:]), np.dtype(dt).str

    def write(self, out: Any, li: int, sites: Any, log: Any, alias: bool = False) -> Any:
        """Fault ``out`` in place when that is safe, else return a faulted copy (the hook's new output)."""
        torch = self.torch
        batch = int(out.shape[0])
        wdt = getattr(torch, self._WORD[out.element_size()])
        udt = _UINT[out.element_size()]
        flat = out.detach().reshape(-1)
        words = flat.view(wdt)

        def read(pos: np.ndarray) -> np.ndarray:
            got = words[torch.from_numpy(pos).to(out.device)]
            return got.cpu().numpy().view(udt).astype(np.uint64)

        sample, index, bits, old, new = sites.fault(li, batch, read)
        log.add(log.forwards, li, sample, index, bits, old, new)
        if not len(index):
            return None
        n = sites.refs[li].size
        pos = torch.from_numpy(sample * n + index).to(out.device)
        vals = torch.from_numpy(new.astype(udt).view(self._WORD[out.element_size()])).to(out.device).view(out.dtype)
        if out.is_contiguous() and not alias and not (torch.is_grad_enabled() and out.requires_grad):
            out.view(-1)[pos] = vals
            return None
        # out of place: keeps autograd whole (no gradient through a faulted element) and never writes into an input
        return out.reshape(-1).index_put((pos,), vals).view(out.shape)

    @contextlib.contextmanager
    def recording(self, names: list[str]) -> Iterator[dict]:
        rec: dict[str, tuple[tuple[int, ...], str]] = {}
        st = {"counts": {}, "done": False}

        def pre(_m: Any, _a: Any) -> None:
            st["counts"] = {}

        def post(_m: Any, _a: Any, _o: Any) -> None:
            st["done"] = True

        def make(name: str) -> Callable:
            def hook(_m: Any, _a: Any, out: Any) -> None:
                if not st["done"]:
                    self._record_output(rec, name, st["counts"], out)
            return hook

        handles = [self.model.register_forward_pre_hook(pre), self.model.register_forward_hook(post)]
        try:
            handles += [self.layers[n].register_forward_hook(make(n)) for n in names]
            yield rec
        finally:
            for h in handles:
                h.remove()

    def _probe(self, names: list[str], args: tuple, kwargs: dict) -> dict:
        """Output shapes of the selected layers for this call (cached per model and input signature)."""
        torch = self.torch
        from torch.utils._pytree import tree_leaves

        autocast = any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda") if hasattr(torch, d))
        first = next(iter(self.model.parameters()), None)
        key = (tuple(names), autocast, None if first is None else (first.dtype, first.device),
               tuple((tuple(t.shape[1:]), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t).__name__
                     for t in tree_leaves((args, kwargs))))
        cache = _PROBES.setdefault(self.model, {})
        if key not in cache:
            if len(cache) > 16:
                cache.clear()
            cache[key] = self._run_probe(names, args, kwargs, autocast)
        return dict(cache[key])

    def _run_probe(self, names: list[str], args: tuple, kwargs: dict, autocast: bool) -> dict:
        torch = self.torch
        from torch.func import functional_call
        from torch.utils._pytree import tree_map

        if not autocast:
            try:
                meta = lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t  # noqa: E731
                state = {k: v.to("meta") for k, v in [*self.model.named_parameters(), *self.model.named_buffers()]}
                with self.recording(names) as rec, torch.no_grad():
                    functional_call(self.model, state, tree_map(meta, args), tree_map(meta, kwargs), strict=False)
                return rec
            except Exception:  # not runnable on meta: probe with the real call below
                pass
        buffers = {k: v.clone() for k, v in self.model.named_buffers()}
        devices = sorted({t.device.index or 0 for t in self.model.parameters() if t.is_cuda})
        with self.recording(names) as rec, torch.no_grad(), torch.random.fork_rng(devices=devices):
            functional_call(self.model, buffers, args, kwargs, strict=False)
        return rec

    @contextlib.contextmanager
    def faulting(self, names: list[str], selection: Any, log: Any, state: dict, make_sites: Callable) -> Iterator[None]:
        if state["sites"] is not None:  # a fixed plan: hook the layers it names
            names = list(dict.fromkeys(r.name.split("#")[0] for r in state["sites"].refs))
            self._check_names(names)
        st: dict[str, Any] = {"counts": {}, "state": state, "log": log, "probing": False, "probed": set(), "index": {}}
        if state["sites"] is not None:
            st["index"] = {r.name: i for i, r in enumerate(state["sites"].refs)}
            st["probed"] = set(st["index"])

        def pre(_m: Any, args: tuple, kwargs: dict) -> None:
            if st["probing"]:
                return
            st["counts"] = {}
            if state["sites"] is None:
                self._learn(st, names, selection, make_sites, lambda: self._probe(names, args, kwargs))

        def post(_m: Any, _a: Any, _o: Any) -> None:
            if not st["probing"]:
                log.forwards += 1

        def make(name: str) -> Callable:
            def hook(_m: Any, args: tuple, out: Any) -> Any:
                if st["probing"]:
                    return None
                torch = self.torch
                alias = False
                if isinstance(out, torch.Tensor):  # an output that aliases an input (ReLU(inplace), views) is copied
                    ptr = out.untyped_storage().data_ptr()
                    alias = any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)
                return self._fault_output(st, name, out, alias)
            return hook

        handles = [self.model.register_forward_pre_hook(pre, with_kwargs=True), self.model.register_forward_hook(post)]
        ok = False
        try:
            handles += [self.layers[n].register_forward_hook(make(n)) for n in names]
            yield
            ok = True
        finally:
            for h in handles:
                h.remove()
        if ok and log.forwards == 0:
            raise OptionError(f"the {type(self.model).__name__} never ran a forward inside injected_activations(...): "
                              "nothing was injected (call the model inside the block)")

    def _check_names(self, names: list[str]) -> None:
        bad = [n for n in names if n not in self.layers]
        if bad:
            raise SelectionError(f"layer {bad[0]!r} is not in this {type(self.model).__name__}; its layers: "
                                 f"{_listing(list(self.layers))}")


# ------------------------------------------------------------------------------ Keras 3

def _after(hook: Callable[[Any], Any]) -> Callable[[Callable], Callable]:
    """Wrapper factory for a layer's ``call``: ``hook(output)`` runs after it and may return a new output."""
    def make(call: Callable) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            out = call(*a, **k)
            res = hook(out)
            return out if res is None else res
        return wrapper
    return make


class KerasHooks(_Hooks):
    def __init__(self, model: Any) -> None:
        self.model = model
        found = list(model._flatten_layers(include_self=False, recursive=True))
        self.layers = {}
        for layer in found:
            if layer.name in self.layers and self.layers[layer.name] is not layer:
                raise OptionError(f"two layers of this {type(model).__name__} are named {layer.name!r}: give them "
                                  "distinct names to address their outputs")
            self.layers[layer.name] = layer
        self.leaves = [n for n, l in self.layers.items() if not list(l._flatten_layers(include_self=False))]

    def describe(self, name: str, out: Any) -> tuple[tuple[int, ...], str]:
        import keras

        if not hasattr(out, "shape") or not hasattr(out, "dtype") or isinstance(out, (list, tuple, dict)):
            raise OptionError(f"layer {name} returns a {type(out).__name__}, not a tensor: select a layer whose "
                              "output is one tensor")
        if len(out.shape) == 0:
            raise OptionError(f"layer {name} returns a scalar: activation sites need a batch dimension")
        dt = keras.backend.standardize_dtype(out.dtype)
        if dt in _FORMATS:
            return tuple(int(s) for s in out.shape[1:]), _format_dtype(name, dt)
        try:
            npdt = np.dtype(dt)
        except TypeError:
            npdt = None
        if npdt is None or npdt.kind not in "fiu" or npdt.itemsize not in _UINT:
            raise OptionError(f"layer {name} outputs {dt}: activation faults support float16/32/64, bfloat16, "
                              "float8 and integer outputs; deselect it")
        return tuple(int(s) for s in out.shape[1:]), npdt.str

    def write(self, out: Any, li: int, sites: Any, log: Any, alias: bool = False) -> Any:
        import keras

        arr = np.array(out)
        batch = int(arr.shape[0])
        words = arr.reshape(-1).view(_UINT[arr.dtype.itemsize])
        sample, index, bits, old, new = sites.fault(li, batch, lambda pos: words[pos].astype(np.uint64))
        log.add(log.forwards, li, sample, index, bits, old, new)
        if not len(index):
            return out
        words[sample * sites.refs[li].size + index] = new
        return keras.ops.convert_to_tensor(arr, dtype=keras.backend.standardize_dtype(out.dtype))

    @contextlib.contextmanager
    def _wrapped(self, wraps: dict[str, Callable]) -> Iterator[None]:
        """Wrap ``call`` on the instances named in ``wraps`` ('' = the model); restore exactly on exit."""
        saved = []
        try:
            for name, make in wraps.items():
                layer = self.model if name == "" else self.layers[name]
                had = "call" in layer.__dict__
                saved.append((layer, had, layer.__dict__.get("call")))
                object.__setattr__(layer, "call", make(layer.call))
            yield
        finally:
            for layer, had, orig in reversed(saved):
                if had:
                    object.__setattr__(layer, "call", orig)
                else:
                    object.__delattr__(layer, "call")

    @contextlib.contextmanager
    def recording(self, names: list[str]) -> Iterator[dict]:
        rec: dict[str, tuple[tuple[int, ...], str]] = {}
        st = {"counts": {}, "depth": 0, "done": False}

        def root(call: Callable) -> Callable:
            def wrapper(*a: Any, **k: Any) -> Any:
                st["counts"] = {}
                out = call(*a, **k)
                st["done"] = True
                return out
            return wrapper

        def record(name: str, out: Any) -> None:
            if not st["done"]:
                self._record_output(rec, name, st["counts"], out)

        with self._eager(), self._wrapped({"": root, **{n: _after(functools.partial(record, n)) for n in names}}):
            yield rec

    @contextlib.contextmanager
    def _eager(self) -> Iterator[None]:
        m = self.model
        before = getattr(m, "_run_eagerly", None)
        for f in ("predict_function", "test_function", "train_function"):
            if hasattr(m, f):
                setattr(m, f, None)
        if hasattr(m, "run_eagerly"):
            m.run_eagerly = True
        try:
            yield
        finally:
            if before is not None:
                m._run_eagerly = before
            for f in ("predict_function", "test_function", "train_function"):
                if hasattr(m, f):
                    setattr(m, f, None)

    def _probe(self, names: list[str], call: Callable, args: tuple, kwargs: dict) -> dict:
        import keras

        with self.recording(names) as rec:
            try:
                spec = lambda t: keras.KerasTensor(t.shape, keras.backend.standardize_dtype(t.dtype)) if hasattr(t, "shape") and hasattr(t, "dtype") else t  # noqa: E731
                self.model.compute_output_spec(*[spec(a) for a in args], **{k: spec(v) for k, v in kwargs.items()})
                if all(n in rec for n in names):
                    return rec
            except Exception:
                pass
            rec.clear()
        with self.recording(names) as rec:
            call(*args, **kwargs)
        return rec

    @contextlib.contextmanager
    def faulting(self, names: list[str], selection: Any, log: Any, state: dict, make_sites: Callable) -> Iterator[None]:
        if state["sites"] is not None:
            names = list(dict.fromkeys(r.name.split("#")[0] for r in state["sites"].refs))
            bad = [n for n in names if n not in self.layers]
            if bad:
                raise SelectionError(f"layer {bad[0]!r} is not in this model; its layers: {_listing(list(self.layers))}")
        st: dict[str, Any] = {"counts": {}, "state": state, "log": log, "probed": set(), "index": {}, "depth": 0,
                              "probing": False}
        if state["sites"] is not None:
            st["index"] = {r.name: i for i, r in enumerate(state["sites"].refs)}
            st["probed"] = set(st["index"])

        def root(call: Callable) -> Callable:
            def wrapper(*a: Any, **k: Any) -> Any:
                if st["depth"] or st["probing"]:
                    return call(*a, **k)
                st["counts"] = {}
                if state["sites"] is None:
                    self._learn(st, names, selection, make_sites, lambda: self._probe(names, call, a, k))
                    st["counts"] = {}
                st["depth"] += 1
                try:
                    out = call(*a, **k)
                finally:
                    st["depth"] -= 1
                log.forwards += 1
                return out
            return wrapper

        def fault(name: str, out: Any) -> Any:
            return None if st["probing"] else self._fault_output(st, name, out)

        ok = False
        with self._eager():
            with self._wrapped({"": root, **{n: _after(functools.partial(fault, n)) for n in names}}):
                yield
                ok = True
        if ok and log.forwards == 0:
            raise OptionError(f"the {type(self.model).__name__} never ran a forward inside injected_activations(...): "
                              "nothing was injected (call the model inside the block)")
