"""Framework side of activation faults: find layers by name, hook their outputs, probe output shapes.

Layer: ``live`` (may import files and below; imported by frameworks and above).

PyTorch: forward hooks on the selected modules (named by module path, ``layer1.0.conv2``,
for any ``nn.Module`` subclass, nested; tuple/dict outputs give their first tensor or the
element a ``MODULE:out.K`` target names, :mod:`fastflip.live.act_targets`), an
:class:`~fastflip.live.act_ops.OpWatch` for functional targets (``MODULE:softmax``,
``MODULE:cache.key``) and a forward pre-hook on the model itself
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
import copy
import functools
import warnings
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import OptionError, SelectionError
from ..core.plan import TensorRef
from ..files.select import dtype_matcher
from .act_ops import OpWatch
from .act_targets import (Recorded, base_of, choose, is_cache, module_targets, output_name, pick, replace,
                          split_target)
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
        self.chosen = choose(self.layers, self.leaves, selection, ops=self._OPS)
        names = self.chosen.names
        if not names:
            raise SelectionError(f"selection {selection.describe() if selection is not None else ''} matches no layer "
                                 f"of this {type(self.model).__name__}; its layers: {_listing(list(self.layers))}")
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
            raise OptionError(f"layer(s) {_listing(hard)} never ran in the forward of this {type(self.model).__name__} "
                              "(defined but not called?): select layers that model.forward calls")
        for c, msg in errors.items():
            if base_of(c) in exact:
                raise OptionError(msg)
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
        """Whether output ``t`` shares memory with one of the call's inputs (then it is faulted in a copy)."""
        return False

    def _fault_output(self, st: dict[str, Any], name: str, out: Any, args: tuple = ()) -> Any:
        """The faulted output of one call of target ``name``, or None when ``out`` was faulted in place / untouched."""
        k = st["counts"].get(name, 0)
        st["counts"][name] = k + 1
        sites = st["state"]["sites"]
        if sites is None:
            raise OptionError(f"layer {name} ran outside a forward of the model itself: call the model, not its layers")
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
        new = self.write(t, li, sites, st["log"], self._aliases(t, args))
        return None if new is None else replace(out, key, new)


# ------------------------------------------------------------------------------ PyTorch

class TorchHooks(_Hooks):
    _OPS = True

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

    def _aliases(self, t: Any, args: tuple) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(isinstance(a, self.torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)

    @contextlib.contextmanager
    def _hooked(self, names: list[str], pre: Callable, post: Callable, on_output: Callable) -> Iterator[None]:
        """Model pre/post hooks, forward hooks on the module targets and an :class:`OpWatch` for the functional
        ones, each output handed to ``on_output(target, output, args)`` (its return value replaces the output)."""
        watch = OpWatch(self.torch, self.layers, names, on_output)

        def start(m: Any, args: tuple, kwargs: dict) -> None:
            watch.reset()
            pre(m, args, kwargs)

        def make(name: str) -> Callable:
            return lambda _m, args, out: on_output(name, out, args)

        handles = [self.model.register_forward_pre_hook(start, with_kwargs=True), self.model.register_forward_hook(post)]
        try:
            handles += [self.layers[split_target(n)[0]].register_forward_hook(make(n)) for n in module_targets(names)]
            with watch.active():
                yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def recording(self, names: list[str]) -> Iterator[dict]:
        rec = Recorded()
        st = {"counts": {}, "done": False}

        def pre(_m: Any, _a: Any, _k: Any) -> None:
            st["counts"] = {}

        def post(_m: Any, _a: Any, _o: Any) -> None:
            st["done"] = True

        def record(name: str, out: Any, _args: tuple) -> None:
            if not st["done"]:
                self._record_output(rec, name, st["counts"], out)

        with self._hooked(names, pre, post, record):
            yield rec

    def _probe(self, names: list[str], args: tuple, kwargs: dict) -> dict:
        """Output shapes of the selected layers for this call (cached per model and input signature)."""
        torch = self.torch
        from torch.utils._pytree import tree_leaves

        autocast = any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda") if hasattr(torch, d))
        first = next(iter(self.model.parameters()), None)
        key = (tuple(names), autocast, None if first is None else (first.dtype, first.device),
               tuple((tuple(t.shape[1:]), t.dtype, t.device) if isinstance(t, torch.Tensor)
                     else (type(t).__name__, t.get_seq_length()) if is_cache(t) else type(t).__name__
                     for t in tree_leaves((args, kwargs))))
        cache = _PROBES.setdefault(self.model, {})
        if key not in cache:
            if len(cache) > 16:
                cache.clear()
            cache[key] = self._run_probe(names, args, kwargs, autocast)
        return cache[key].copy()

    def _run_probe(self, names: list[str], args: tuple, kwargs: dict, autocast: bool) -> dict:
        torch = self.torch
        from torch.func import functional_call
        from torch.utils._pytree import tree_map

        if any(is_cache(v) for v in (*args, *kwargs.values())):  # a KV cache: probe on a copy, never on meta
            args = tuple(copy.deepcopy(a) if is_cache(a) else a for a in args)
            kwargs = {k: copy.deepcopy(v) if is_cache(v) else v for k, v in kwargs.items()}
        elif not autocast:
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
    def faulting(self, names: list[str], selection: Any, log: Any, state: dict, make_sites: Callable,
                 at: int | None = None) -> Iterator[None]:
        if state["sites"] is not None:  # a fixed plan: hook the targets it names
            names = list(dict.fromkeys(base_of(r.name) for r in state["sites"].refs))
            self._check_names([split_target(n)[0] for n in names])
        st: dict[str, Any] = {"counts": {}, "state": state, "log": log, "probing": False, "probed": set(), "index": {},
                              "on": False}
        if state["sites"] is not None:
            st["index"] = {r.name: i for i, r in enumerate(state["sites"].refs)}
            st["probed"], st["fixed"] = set(st["index"]), True

        def pre(_m: Any, args: tuple, kwargs: dict) -> None:
            if st["probing"]:
                return
            st["counts"] = {}
            st["on"] = at is None or log.forwards == at
            if st["on"] and state["sites"] is None:
                self._learn(st, names, selection, make_sites, lambda: self._probe(names, args, kwargs))

        def post(_m: Any, _a: Any, _o: Any) -> None:
            if not st["probing"]:
                log.forwards += 1

        def fault(name: str, out: Any, args: tuple) -> Any:
            # an output that aliases an input (ReLU(inplace), views) is faulted in a copy
            return self._fault_output(st, name, out, args) if st["on"] and not st["probing"] else None

        ok = False
        with self._hooked(names, pre, post, fault):
            yield
            ok = True
        if ok and log.forwards == 0:
            raise OptionError(f"the {type(self.model).__name__} never ran a forward inside injected_activations(...): "
                              "nothing was injected (call the model inside the block)")
        if ok and at is not None and log.forwards <= at:
            raise OptionError(f"forward={at} but the {type(self.model).__name__} ran {log.forwards} forward(s) inside "
                              "injected_activations(...): nothing was injected")

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


def _wraps(names: list[str], fn: Callable[[str, Any], Any]) -> dict[str, Callable]:
    """``call`` wrappers per layer: ``fn(target, output)`` for each target (``LAYER`` or ``LAYER:out.K``) of it."""
    by_layer: dict[str, list[str]] = {}
    for n in names:
        by_layer.setdefault(split_target(n)[0], []).append(n)

    def chain(targets: list[str], out: Any) -> Any:
        for t in targets:
            res = fn(t, out)
            out = out if res is None else res
        return out

    return {layer: _after(functools.partial(chain, targets)) for layer, targets in by_layer.items()}


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
        rec = Recorded()
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

        with self._eager(), self._wrapped({"": root, **_wraps(names, record)}):
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
                if all(n in rec.ran for n in names):
                    return rec
            except Exception:
                pass
            rec.clear()
        with self.recording(names) as rec:
            call(*args, **kwargs)
        return rec

    @contextlib.contextmanager
    def faulting(self, names: list[str], selection: Any, log: Any, state: dict, make_sites: Callable,
                 at: int | None = None) -> Iterator[None]:
        if at is not None:
            raise OptionError("forward= (fault one forward of the block) needs a PyTorch model")
        if state["sites"] is not None:
            names = list(dict.fromkeys(base_of(r.name) for r in state["sites"].refs))
            bad = [split_target(n)[0] for n in names if split_target(n)[0] not in self.layers]
            if bad:
                raise SelectionError(f"layer {bad[0]!r} is not in this model; its layers: {_listing(list(self.layers))}")
        st: dict[str, Any] = {"counts": {}, "state": state, "log": log, "probed": set(), "index": {}, "depth": 0,
                              "probing": False}
        if state["sites"] is not None:
            st["index"] = {r.name: i for i, r in enumerate(state["sites"].refs)}
            st["probed"], st["fixed"] = set(st["index"]), True

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
            with self._wrapped({"": root, **_wraps(names, fault)}):
                yield
                ok = True
        if ok and log.forwards == 0:
            raise OptionError(f"the {type(self.model).__name__} never ran a forward inside injected_activations(...): "
                              "nothing was injected (call the model inside the block)")
