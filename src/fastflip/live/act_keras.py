"""Keras 3 side of activation faults: the selected layers' ``call`` wrapped on the instance.

Layer: ``live`` (may import files and below; imported by frameworks and above).

The selected layers' ``call`` is wrapped on the instance (the class is not touched) and restored exactly
on exit; layers are named by their ``name`` (nested layers of subclassed models included). While the
block runs the model runs eagerly (``run_eagerly``), so that ``predict``/``evaluate`` see the wrapped
calls; compiled functions are dropped on entry and exit. The probe is ``compute_output_spec``
(symbolic), or the real call when that fails. keras is imported by :class:`KerasHooks`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import FastflipError, OptionError
from .act_hooks import FORMATS, UINT, Hooks, format_dtype
from .act_targets import Recorded, split_target

__all__ = ["KerasHooks"]


def _as_raised(exc: FastflipError) -> None:
    """Mark one of fastflip's own errors so that it leaves Keras layer calls as raised, in one line: Keras rewrites
    the message of an exception crossing a layer call (the layer's name and arguments, on several lines) unless
    the exception is marked as described already."""
    exc._keras_call_info_injected = True  # type: ignore[attr-defined]


def _after(hook: Callable[[Any], Any]) -> Callable[[Callable], Callable]:
    """Wrapper factory for a layer's ``call``: ``hook(output)`` runs after it and may return a new output."""
    def make(call: Callable) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            out = call(*a, **k)
            try:
                res = hook(out)
            except FastflipError as exc:
                _as_raised(exc)
                raise
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


class KerasHooks(Hooks):
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
        if dt in FORMATS:
            return tuple(int(s) for s in out.shape[1:]), format_dtype(name, dt)
        try:
            npdt = np.dtype(dt)
        except TypeError:
            npdt = None
        if npdt is None or npdt.kind not in "fiu" or npdt.itemsize not in UINT:
            raise OptionError(f"layer {name} outputs {dt}: activation faults support float16/32/64, bfloat16, "
                              "float8 and integer outputs; deselect it")
        return tuple(int(s) for s in out.shape[1:]), npdt.str

    def write(self, out: Any, li: int, sites: Any, log: Any, alias: Callable[[], bool] | None = None) -> Any:
        import keras

        arr = np.array(out)
        batch = int(arr.shape[0])
        words = arr.reshape(-1).view(UINT[arr.dtype.itemsize])
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
    def _faulting_hooks(self, names: list[str], probing: Callable[[], bool], start: Callable[[Callable[[], dict]], None],
                        end: Callable[[], None], fault: Callable[..., Any]) -> Iterator[None]:
        """:meth:`Hooks.faulting`'s hooks: the model's ``call`` wrapped to start and end each outermost forward
        (ended also when it raises), the targets' ``call`` to fault their outputs, the model run eagerly meanwhile."""
        def root(call: Callable) -> Callable:
            def wrapper(*a: Any, **k: Any) -> Any:
                if probing():
                    return call(*a, **k)
                try:  # a call inside the model's own forward is part of it (``start`` and ``end`` count the depth)
                    try:
                        start(lambda: self._probe(names, call, a, k))
                    except FastflipError as exc:
                        _as_raised(exc)
                        raise
                    return call(*a, **k)
                finally:
                    end()
            return wrapper

        with self._eager():
            with self._wrapped({"": root, **_wraps(names, fault)}):
                yield
