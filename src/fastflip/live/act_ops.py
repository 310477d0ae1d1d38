"""Functional activation targets in PyTorch: torch function calls and KV-cache updates inside a module's forward.

Layer: ``live`` (imported by :mod:`fastflip.live.act_torch` only; torch is imported by the caller).

:class:`OpWatch` sees the outputs of ``MODULE:OP`` and ``MODULE:cache.key|value``
targets (names in :mod:`fastflip.live.act_targets`). Forward pre-hooks and
forward hooks (``always_call``, so a raising forward leaves no stale scope) keep
the stack of watched modules that are running; a
``torch.overrides.TorchFunctionMode`` entered for the whole block passes every
torch call through and, while a watched module runs, hands the output of each
call of a watched function to ``on_output(target, output, args)``, whose return
value (when not None) replaces the output. Inside the mode's handler the mode is
off, so the call itself and ``on_output`` are not seen again.

KV caches: while a module with a cache target runs, the ``update`` method of the
``transformers`` Cache among its arguments (``cache=``/``past_key_values=``; for an
``EncoderDecoderCache`` both its self-attention and its cross-attention cache, of which
the module updates one) is wrapped on that instance and restored when the forward
ends. ``update`` returns the layer's whole cache (past and new positions); a fault
written into it in place stays in the cache for the later steps (``DynamicCache``,
``StaticCache``); caches that return copies (quantized, offloaded) keep the fault for
the current step only.

Not reachable: the inside of fused kernels (only the output of ``sdpa``, not its
internal softmax), ``torch.compile``'d or scripted graphs (they do not dispatch
through Python modes), and calls made on other threads (modes are per thread).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from .act_targets import CACHE_PARTS, is_cache, op_name, split_target

__all__ = ["OpWatch"]


def _find_caches(args: tuple, kwargs: dict) -> list[Any]:
    """The Caches among a forward's arguments whose ``update`` the module may call: a cache itself, or both parts
    of an encoder-decoder cache (a self-attention module updates its ``self_attention_cache``, a cross-attention
    one — T5's ``EncDecAttention`` — its ``cross_attention_cache``, once, at the first step)."""
    for v in (*args, *kwargs.values()):
        if is_cache(v):
            parts = [getattr(v, a, None) for a in ("self_attention_cache", "cross_attention_cache")]
            parts = [p for p in parts if is_cache(p)]
            return parts or [v]
    return []


class OpWatch:
    """Functional targets of some modules: ``targets`` maps a module name to the ``WHAT`` parts it watches."""

    def __init__(self, torch: Any, layers: dict[str, Any], names: list[str],
                 on_output: Callable[[str, Any, tuple], Any]) -> None:
        self.torch, self.layers, self.on_output = torch, layers, on_output
        self.targets: dict[str, set[str]] = {}
        for n in names:
            module, what = split_target(n)
            if what is not None and not what.startswith("out."):
                self.targets.setdefault(module, set()).add(what)
        self.ops = {w for ws in self.targets.values() for w in ws if w not in CACHE_PARTS}
        self.stack: list[str] = []
        self.handles: list[Any] = []  # the module hooks while active (their ids tell fastflip's hooks apart)

    def reset(self) -> None:
        """Forget the running modules (at the start of each forward of the model)."""
        self.stack.clear()

    def _mode(self) -> Any:
        watch = self

        class Mode(self.torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if watch.stack:
                    op = op_name(getattr(func, "__name__", ""))
                    if op in watch.ops:
                        for module in list(dict.fromkeys(watch.stack)):
                            if op in watch.targets[module]:
                                new = watch.on_output(f"{module}:{op}", out, args)
                                out = out if new is None else new
                return out

        return Mode()

    def _wrap_cache(self, module: str, cache: Any, saved: list) -> None:
        parts = [w for w in CACHE_PARTS if w in self.targets[module]]
        had = "update" in cache.__dict__
        before = cache.__dict__.get("update")
        orig = cache.update

        def update(*a: Any, **k: Any) -> Any:
            keys, values = orig(*a, **k)
            pair = [keys, values]
            for i, part in enumerate(CACHE_PARTS):
                if part in parts:
                    new = self.on_output(f"{module}:{part}", pair[i], ())
                    pair[i] = pair[i] if new is None else new
            return pair[0], pair[1]

        cache.update = update
        saved.append((cache, had, before))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Watch the targets while the block runs (hooks and the mode removed on exit)."""
        if not self.targets:
            yield
            return
        wrapped: dict[str, list] = {}

        def pre(name: str) -> Callable:
            def hook(_m: Any, args: tuple, kwargs: dict) -> None:
                self.stack.append(name)
                if any(w in CACHE_PARTS for w in self.targets[name]):
                    for cache in _find_caches(args, kwargs):
                        self._wrap_cache(name, cache, wrapped.setdefault(name, []))
            return hook

        def post(name: str) -> Callable:
            def hook(_m: Any, _a: Any, _o: Any) -> None:
                if name in self.stack:
                    del self.stack[len(self.stack) - 1 - self.stack[::-1].index(name)]
                for cache, had, orig in reversed(wrapped.pop(name, [])):
                    if had:
                        cache.update = orig
                    else:
                        del cache.update
            return hook

        handles = self.handles = []
        try:
            for name in self.targets:
                layer = self.layers[name]
                handles.append(layer.register_forward_pre_hook(pre(name), with_kwargs=True))
                handles.append(layer.register_forward_hook(post(name), always_call=True))
            with (self._mode() if self.ops else contextlib.nullcontext()):
                yield
        finally:
            for h in handles:
                h.remove()
            self.stack.clear()
