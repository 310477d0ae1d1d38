"""PyTorch side of activation faults: forward hooks on the selected modules and output-shape probes.

Layer: ``live`` (may import files and below; imported by frameworks and above).

Forward hooks on the selected modules (named by module path, ``layer1.0.conv2``, for any ``nn.Module``
subclass, nested; tuple/dict outputs give their first tensor or the element a ``MODULE:out.K`` target
names, :mod:`fastflip.live.act_targets`), an :class:`~fastflip.live.act_ops.OpWatch` for functional
targets (``MODULE:softmax``, ``MODULE:cache.key``), and on the model itself a forward pre-hook that starts each
forward (at the first one, it probes the selected layers' output shapes) and a forward hook, called also when
the forward raises, that ends it. The probe runs the same call
on the ``meta`` device (no computation, no side effects); when the model cannot run there
(data-dependent Python, autocast), it runs the real call with copies of the buffers (BatchNorm statistics
stay as they are), the RNG state restored and gradients off; the model's forward hooks are set aside while
it runs. An output is faulted in place only when it is the call's own new memory (not a view, and its storage not
an input's nor one of the model's parameters', buffers' and tensor attributes', gathered once per block), else
in a copy.
torch is imported by :class:`TorchHooks`.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Any, Callable, ContextManager, Iterator

import numpy as np

from ..errors import OptionError
from .act_hooks import FORMATS, UINT, Hooks, format_dtype
from .act_ops import OpWatch
from .act_targets import CACHE_PARTS, Recorded, base_of, is_cache, module_targets, split_target
from .adapters import TORCH_DTYPES
from .frameworks import is_lazy

__all__ = ["TorchHooks"]

_PROBES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # model -> {call signature: shapes}
_OURS: set[int] = set()  # ids of every module hook fastflip's activation blocks have registered now


class TorchHooks(Hooks):
    _OPS = True
    _FORWARD_AT = True

    def __init__(self, model: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.layers = {n: m for n, m in model.named_modules() if n}
        self.leaves = [n for n, m in self.layers.items() if not any(True for _ in m.children())]
        self._held: set[int] | None = None  # storages of the model's parameters and buffers in this block
        self._lazy = False  # some parameter was lazy when _held was built
        self._own: set[int] = set()  # ids of the hooks of this faulting block
        self._calls: list[tuple] = []  # (args, kwargs) of each call of the model running now, outermost first
        # torch.compile'd modules (the model itself, or a submodule compiled in place): their graphs skip hooks
        self.compiled = [n for n, m in model.named_modules() if type(m).__name__ == "OptimizedModule"
                         or getattr(m, "_compiled_call_impl", None) is not None]

    def select(self, selection: Any) -> list[str]:
        """The selected targets; refused in one line when one runs inside a ``torch.compile``'d module, whose
        compiled graph would skip the hooks (the block would run with no fault and an empty log)."""
        names = super().select(selection)
        for name in names:
            module = split_target(name)[0]
            inside = next((c for c in self.compiled if not c or module == c or module.startswith(c + ".")), None)
            if inside is not None:
                what = f"module {inside!r}" if inside else "model"
                raise OptionError(f"activation target {name} runs inside the torch.compile'd {what}, whose graph skips "
                                  "the hooks that fault it: fault the module before compiling it "
                                  "(torch.compile(m)._orig_mod is m)")
        return names

    _WORD = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}

    def describe(self, name: str, out: Any) -> tuple[tuple[int, ...], str]:
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            raise OptionError(f"layer {name} returns a {type(out).__name__}, not a tensor: select a layer whose "
                              "output is one tensor")
        if out.dim() == 0:
            raise OptionError(f"layer {name} returns a scalar: activation sites need a batch dimension")
        key = str(out.dtype).replace("torch.", "")
        if key in FORMATS:
            return tuple(int(s) for s in out.shape[1:]), format_dtype(name, key)
        dt = TORCH_DTYPES.get(key)
        if dt is None or dt == "?":
            raise OptionError(f"layer {name} outputs {out.dtype}: activation faults support float16/32/64, bfloat16, "
                              "float8 and integer outputs; deselect it")
        return tuple(int(s) for s in out.shape[1:]), np.dtype(dt).str

    def write(self, out: Any, li: int, sites: Any, log: Any, alias: Callable[[], bool] | None = None) -> Any:
        """Fault ``out`` in place when that is safe, else return a faulted copy (the hook's new output).

        ``alias()``, asked only when this call has sites, says whether ``out`` may share memory with something
        that outlives the call (then it is faulted in a copy)."""
        torch = self.torch
        batch = int(out.shape[0])
        wdt = getattr(torch, self._WORD[out.element_size()])
        udt = UINT[out.element_size()]
        flat = out.detach().reshape(-1)
        words = flat.view(wdt)

        def read(pos: np.ndarray) -> np.ndarray:
            got = words[torch.from_numpy(pos).to(out.device)]
            return got.cpu().numpy().view(udt).astype(np.uint64)

        shared = self._shared_by(sites.refs[li].name) if batch == 1 and sites.per_sample else 0
        if shared > 1:
            raise OptionError(f"layer {sites.refs[li].name} outputs a batch of 1 that the {shared} samples of the "
                              "forward share (a position bias, rotary tables): per_sample faults need one output per "
                              "sample; use per_sample=False there, or select another target")
        sample, index, bits, old, new = sites.fault(li, batch, read)
        log.add(log.forwards, li, sample, index, bits, old, new)
        if not len(index):
            return None
        n = sites.refs[li].size
        pos = torch.from_numpy(sample * n + index).to(out.device)
        vals = torch.from_numpy(new.astype(udt).view(self._WORD[out.element_size()])).to(out.device).view(out.dtype)
        if (out.is_contiguous() and not (torch.is_grad_enabled() and out.requires_grad)
                and not (alias is not None and alias())):
            out.view(-1)[pos] = vals
            return None
        # out of place: keeps autograd whole (no gradient through a faulted element) and never writes into an input
        return out.reshape(-1).index_put((pos,), vals).view(out.shape)

    def _aliases(self, t: Any, args: tuple) -> bool:
        """True when ``t`` is a view, or shares its storage with an input or with one of the model's parameters,
        buffers and plain tensor attributes: a fault written there in place could outlive the forward."""
        if t._base is not None:  # a view: of what (a cache in a dict, a buffer replaced in this block) is not known
            return True
        ptr = t.untyped_storage().data_ptr()
        if any(isinstance(a, self.torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args):
            return True
        if self._held is None:
            self._held = self._storages()
        return ptr in self._held

    def _shared_by(self, name: str) -> int:
        """How many samples of the running forward share output ``name``, an output of batch dimension 1 (a
        position bias, rotary tables: one tensor for the whole batch): the forward's batch, the first dimension of
        its first input of two or more dimensions, positional then keyword (token ids, pixel values; not a 1-d
        ``cache_position``, nor a mask that follows them); 0 when it has none. An RNN's outputs (``nn.RNN``,
        ``GRU``, ``LSTM``) are shared by none: their dimension 0 is time or layers (``h_n``), which
        ``per_sample`` indexes as it does dimension 0 of any output."""
        from torch.utils._pytree import tree_leaves

        torch = self.torch
        if isinstance(self.layers.get(split_target(base_of(name))[0]), torch.nn.RNNBase):
            return 0
        first = next((t for t in tree_leaves(self._calls[:1]) if isinstance(t, torch.Tensor) and t.dim() >= 2), None)
        return 0 if first is None else int(first.shape[0])

    def _storages(self) -> set[int]:
        """The storages of the model's parameters, buffers and plain tensor attributes of its modules (a table
        cached as ``self.table = ...``), built once per faulting block (again at each forward while a lazy module's
        parameters have no storage yet: ``self._lazy``)."""
        torch = self.torch
        held = [*self.model.parameters(), *self.model.buffers()]
        held += [v for m in self.model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
        self._lazy = any(is_lazy(x) for x in held)
        return {x.untyped_storage().data_ptr() for x in held
                if not is_lazy(x) and x.layout == torch.strided and not x.is_meta}

    @contextlib.contextmanager
    def _hooked(self, names: list[str], pre: Callable, post: Callable, on_output: Callable,
                own: set[int] | None = None) -> Iterator[None]:
        """Model pre/post hooks, forward hooks on the module targets and an :class:`OpWatch` for the functional
        ones, each output handed to ``on_output(target, output, args)`` (its return value replaces the output).
        The hooks' ids are in :data:`_OURS` while they are registered (and in ``own`` when given)."""
        watch = OpWatch(self.torch, self.layers, names, on_output)

        def start(m: Any, args: tuple, kwargs: dict) -> None:
            watch.reset()
            pre(m, args, kwargs)

        def make(name: str) -> Callable:
            return lambda _m, args, out: on_output(name, out, args)

        handles = [self.model.register_forward_pre_hook(start, with_kwargs=True),
                   self.model.register_forward_hook(post, always_call=True)]
        try:
            handles += [self.layers[split_target(n)[0]].register_forward_hook(make(n)) for n in module_targets(names)]
            with watch.active():
                ids = {h.id for h in (*handles, *watch.handles)}
                _OURS.update(ids)
                if own is not None:
                    own.update(ids)
                yield
        finally:
            for h in handles:
                h.remove()
            _OURS.difference_update({h.id for h in (*handles, *watch.handles)})

    @contextlib.contextmanager
    def recording(self, names: list[str]) -> Iterator[dict]:
        rec = Recorded()
        st = {"counts": {}, "done": False, "depth": 0}  # a call of the model inside its forward is part of it

        def pre(_m: Any, _a: Any, _k: Any) -> None:
            if not st["depth"]:
                st["counts"] = {}
            st["depth"] += 1

        def post(_m: Any, _a: Any, _o: Any) -> None:
            st["depth"] -= 1
            st["done"] = not st["depth"]

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
            with self._forward_hooks_aside(self._own):
                cache[key] = self._run_probe(names, args, kwargs, autocast)
        return cache[key].copy()

    @contextlib.contextmanager
    def _forward_hooks_aside(self, keep: set[int]) -> Iterator[None]:
        """While the shapes are probed, every module's forward hooks are set aside except this block's own
        (``keep``; its functional-target watch needs them), and so are the forward pre-hooks of other fastflip
        blocks on the model; everything is put back after, in order. Hooks that record outputs (feature
        extraction, statistics) and an enclosing ``injected_activations`` block see the forwards the user
        runs, never the probe. The user's forward pre-hooks stay: a module may need them to compute
        (old-style ``weight_norm``)."""
        from collections import OrderedDict

        post = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
        pre = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")
        others = _OURS - keep
        saved = []
        for m in self.model.modules():
            for attr, drop in [*((a, lambda k: k not in keep) for a in post), *((a, others.__contains__) for a in pre)]:
                hooks = m.__dict__.get(attr)
                if hooks and any(drop(k) for k in hooks):
                    saved.append((m, attr, hooks))
                    m.__dict__[attr] = OrderedDict((k, v) for k, v in hooks.items() if not drop(k))
        try:
            yield
        finally:
            for m, attr, hooks in reversed(saved):
                m.__dict__[attr] = hooks

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

    def _faulting_hooks(self, names: list[str], probing: Callable[[], bool], start: Callable[[Callable[[], dict]], None],
                        end: Callable[[], None], fault: Callable[..., Any]) -> ContextManager[None]:
        """:meth:`Hooks.faulting`'s hooks: the model's forward pre-hook starts each call of it, its forward hook
        (always called, also when the forward raises) ends it; an output sharing storage with an input
        (ReLU(inplace), views) or the model's tensors is faulted in a copy."""

        def pre(_m: Any, args: tuple, kwargs: dict) -> None:
            if self._lazy:  # a lazy module gets its parameters in a forward: their storages are new
                self._held = None
            if not probing():
                self._calls.append((args, kwargs))
                start(lambda: self._probe(names, args, kwargs))

        def post(_m: Any, _a: Any, _o: Any) -> None:
            if not probing() and self._calls:  # none when an earlier pre-hook raised before this block's started
                self._calls.pop()
                end()

        self._own.clear()
        self._calls.clear()
        self._held, self._lazy = None, False  # built at the block's first faulted output that may alias
        return self._hooked(names, pre, post, fault, own=self._own)

    def _hint(self, name: str) -> str:
        """For an operation or a later output element (``:softmax``, ``:matmul``, ``:out.1``) of a Hugging Face
        model whose attention is not ``eager``: that attention (``sdpa``, flash) fuses the softmax and the matmuls
        and returns no attention weights."""
        impl = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
        what = split_target(base_of(name))[1]
        if not isinstance(impl, str) or impl == "eager" or not what or what == "out.0" or what in CACHE_PARTS:
            return ""
        return (f"; this model's attention runs as {impl!r}, which fuses softmax and matmul and returns no attention "
                "weights: model.set_attn_implementation(\"eager\") (or attn_implementation=\"eager\") reaches them")

    def _outside_hint(self, name: str) -> str:
        """Why a target ran outside the model's forward, where that is known: recomputed in ``backward()``
        (gradient checkpointing), or inside a submodule the model also runs on its own (``generate()`` runs an
        encoder-decoder's encoder once, through ``model.get_encoder()``)."""
        if self.torch._C._current_graph_task_id() != -1:
            return "; it ran in backward(), where gradient checkpointing recomputes it: turn checkpointing off to fault it"
        encoder = getattr(self.model, "get_encoder", None)
        if callable(encoder):
            module, sub = split_target(name)[0], encoder()
            top = next((n for n, m in self.layers.items() if m is sub), None)
            if top is not None and (module == top or module.startswith(top + ".")):
                return ("; for a submodule the model runs on its own (generate() runs the encoder once, outside the "
                        "model's forward), wrap that submodule (e.g. model.get_encoder()) instead")
        return ""
