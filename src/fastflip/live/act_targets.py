"""Names of activation targets: layer outputs, elements of tuple/dict outputs, functional operations, KV caches.

Layer: ``live`` (imported by the activation hooks, :mod:`fastflip.live.act_hooks`, :mod:`fastflip.live.act_torch`,
:mod:`fastflip.live.act_keras`, and by :mod:`fastflip.live.act_ops`).

A target is written ``MODULE[:WHAT][#CALL]``:

- ``transformer.h.0.mlp`` — the output of a module (PyTorch module path, Keras layer
  name). When the module returns a tuple, list, dict or ``ModelOutput``, its first
  tensor is faulted and the target is named for it: ``transformer.h.0.attn:out.0``,
  ``bert.encoder.layer.0:out.0``, ``vit:out.last_hidden_state``.
- ``MODULE:out.K`` — element ``K`` of such an output: an index (``attn:out.1``) or a
  key (``bert:out.pooler_output``).
- ``MODULE:OP`` — the output of every call of the torch function ``OP`` made while
  ``MODULE`` runs its forward (nested modules included): ``softmax``, ``matmul``
  (``torch.matmul``, ``Tensor.matmul`` and ``@``), ``sdpa``
  (``F.scaled_dot_product_attention``), or any other torch function by its name
  (``bmm``, ``baddbmm``, ``addmm``, ``gelu``...).
- ``MODULE:cache.key`` / ``MODULE:cache.value`` — the keys / values a Hugging Face
  ``Cache`` returns from ``update`` inside ``MODULE`` (the whole cache of that layer
  at that step, which later steps read).
- ``#CALL`` — the ``CALL``-th (0-based) output of that target in one forward of the
  model: ``attn:softmax`` is the first softmax, ``attn:softmax#1`` the second.

Examples
--------
>>> split_target("transformer.h.0.attn:softmax")
('transformer.h.0.attn', 'softmax')
>>> base_of("transformer.h.0.attn:sdpa#2"), op_name("scaled_dot_product_attention")
('transformer.h.0.attn:sdpa', 'sdpa')
>>> import numpy as np
>>> key, t = pick({"loss": None, "logits": np.zeros((2, 3))}, None)  # a ModelOutput-like dict
>>> key, t.shape, output_name("model", None, key)
('logits', (2, 3), 'model:out.logits')
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any, Iterable

from ..errors import OptionError
from ..files.select import glob_to_regex

__all__ = ["CACHE_PARTS", "Chosen", "Recorded", "base_of", "choose", "is_cache", "module_targets", "op_name",
           "output_name", "parse_what", "pick", "replace", "split_target"]

CACHE_PARTS = ("cache.key", "cache.value")
_OP_ALIASES = {"__matmul__": "matmul", "__rmatmul__": "matmul", "scaled_dot_product_attention": "sdpa"}
_WHAT = re.compile(r"(out\.[A-Za-z0-9_]+|cache\.key|cache\.value|[A-Za-z_][A-Za-z0-9_]*)")


def op_name(name: str) -> str:
    """The target name of a torch function called ``name`` (``__matmul__`` -> ``matmul``)."""
    return _OP_ALIASES.get(name, name)


def split_target(target: str) -> tuple[str, str | None]:
    """``(module, what)`` of a target without its ``#CALL`` suffix (``what`` is None for a plain output)."""
    module, sep, what = target.partition(":")
    return module, (what if sep else None)


def base_of(name: str) -> str:
    """A target's name without its ``#CALL`` suffix."""
    return name.split("#", 1)[0]


def parse_what(what: str, pattern: str) -> str:
    """The canonical ``WHAT`` part of a selection pattern, or one line saying what may follow the colon."""
    if not _WHAT.fullmatch(what):
        raise OptionError(f"activation target {pattern!r}: after ':' give out.INDEX, out.KEY, cache.key, cache.value "
                          "or a torch function name (softmax, matmul, sdpa, ...)")
    return what if what.startswith(("out.", "cache.")) else op_name(what)


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (tuple, list, dict))


def _items(out: Any) -> list[tuple[Any, Any]]:
    """``(key, value)`` pairs of a container output (``ModelOutput`` and dicts by key, sequences by index)."""
    if isinstance(out, dict):  # ModelOutput is an OrderedDict of its non-None fields
        return list(out.items())
    if isinstance(out, (tuple, list)):
        return list(enumerate(out))
    return []


def pick(out: Any, what: str | None) -> tuple[Any, Any]:
    """``(key, tensor)`` of an output: the output itself (key None), its first tensor, or element ``out.K``.

    Raises :class:`OptionError` naming what the output holds when there is no such tensor.
    """
    if what is None or not what.startswith("out."):
        if _is_tensor(out):
            return None, out
        for k, v in _items(out):
            if _is_tensor(v):
                return k, v
        raise OptionError(f"returns a {type(out).__name__} without a tensor")
    want = what[4:]
    items = _items(out)
    if not items:
        raise OptionError(f"returns a {type(out).__name__}, which has no element {want}")
    keys = [k for k, _ in items]
    if want in keys:
        at = keys.index(want)
    elif want.isdigit() and int(want) < len(items):  # tuples by index, ModelOutput / dicts also by position
        at = int(want)
    else:
        raise OptionError(f"returns a {type(out).__name__} without element {want} (it has "
                          f"{', '.join(str(k) for k in keys)})")
    value = items[at][1]
    if not _is_tensor(value):
        raise OptionError(f"element {want} of its {type(out).__name__} output is a {type(value).__name__}, not a tensor")
    return (keys[at] if want in keys else at), value


def output_name(base: str, what: str | None, key: Any) -> str:
    """The target name of a picked output: ``base`` for a tensor output, ``base:out.KEY`` for its first tensor."""
    if key is None or what is not None:
        return base
    return f"{base}:out.{key}"


def replace(out: Any, key: Any, new: Any) -> Any:
    """``out`` with element ``key`` replaced by ``new`` (``key`` None: ``new`` itself)."""
    if key is None:
        return new
    if isinstance(out, dict):
        if isinstance(key, int):
            key = list(out)[key]
        out[key] = new  # ModelOutput.__setitem__ also sets the attribute
        return out
    items = list(out)
    items[key] = new
    if isinstance(out, list):
        return items
    return out._replace(**{out._fields[key]: new}) if hasattr(out, "_fields") else type(out)(items)


def module_targets(names: list[str]) -> list[str]:
    """The targets that are module outputs (``MODULE`` or ``MODULE:out.K``), hooked with forward hooks."""
    whats = [split_target(n)[1] for n in names]
    return [n for n, w in zip(names, whats) if w is None or w.startswith("out.")]


def is_cache(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``transformers`` Cache (without importing transformers)."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(obj).__mro__)


# ------------------------------------------------------------------------------ selections of targets

class Recorded(dict):
    """Per-sample output (shape, dtype) of each target call; ``errors``: call name -> why it has no usable
    output; ``ran``: the targets that produced an output (with or without error)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, str] = {}
        self.ran: set[str] = set()

    def clear(self) -> None:
        super().clear()
        self.errors.clear()
        self.ran.clear()

    def copy(self) -> "Recorded":
        new = Recorded()
        new.update(self)
        new.errors, new.ran = dict(self.errors), set(self.ran)
        return new


_GLOB = re.compile(r"[*?\[]")
_CALL = re.compile(r"(.*)#(\d+)")


def name_matches(selection: Any, name: str) -> bool:
    """A layer name against a Selection's name criteria (layers, include, exclude, regex)."""
    if selection.layers and not any(fnmatch.fnmatchcase(name, g) for g in selection.layers):
        return False
    if selection.include or selection.regex:
        if not (any(glob_to_regex(g).match("/" + name) for g in selection.include)
                or any(re.search(rx, name) for rx in selection.regex)):
            return False
    return not any(glob_to_regex(g).match("/" + name) for g in selection.exclude)


@dataclasses.dataclass
class Chosen:
    """The targets a selection names: ``names`` (``MODULE[:WHAT]``, hooked), ``exact`` (named without a wildcard:
    problems with them stop the block), ``calls`` (target -> the call numbers a ``#k`` pattern keeps; absent or
    None: every call), ``explicit`` (False for the default selection of every leaf layer)."""

    names: list[str]
    exact: set[str] = dataclasses.field(default_factory=set)
    calls: dict[str, set[int] | None] = dataclasses.field(default_factory=dict)
    explicit: bool = True

    def restrict(self, target: str, k: int | None) -> None:
        """Keep only call ``k`` of ``target`` (a pattern ending in ``#k``); a pattern without ``#`` keeps every call."""
        if target in self.calls and self.calls[target] is None:
            return
        self.calls[target] = None if k is None else (self.calls.get(target) or set()) | {k}

    def wanted(self, name: str) -> tuple[str, int, bool]:
        """``(selected target, call number, kept)`` of a recorded call name (``attn:out.0#1`` -> ``attn``, 1)."""
        base, _, k = name.partition("#")
        module, what = split_target(base)
        key = base if base in self.calls or not (what is None or what.startswith("out.")) else module
        allowed = self.calls.get(key)
        return key, int(k or 0), allowed is None or int(k or 0) in allowed


def choose(layers: Iterable[str], leaves: list[str], selection: Any, *, ops: bool) -> Chosen:
    """The targets of ``selection`` among a model's layer names (``leaves`` when it names none).

    ``layers`` patterns may carry ``:WHAT`` (``transformer.h.*.attn:softmax``) and ``#k``;
    ``ops`` False (Keras) refuses functional ``WHAT`` parts.
    """
    layers = list(layers)
    if selection is None or not (selection.layers or selection.include or selection.exclude or selection.regex):
        return Chosen(list(leaves), explicit=False)  # every leaf layer that the forward calls
    chosen = Chosen([])
    pats = [(m.group(1), int(m.group(2))) if m else (p, None)
            for p, m in ((p, _CALL.fullmatch(p)) for p in selection.layers)]
    functional = [(p, k) for p, k in pats if ":" in p]
    modular = [(p, k) for p, k in pats if ":" not in p]
    if modular or selection.include or selection.regex or not functional:
        sel = dataclasses.replace(selection, layers=tuple(p for p, _ in modular))
        chosen.names = [n for n in layers if name_matches(sel, n)]
        chosen.exact.update(n for n in chosen.names if n in {p for p, _ in modular})
        for n in chosen.names:
            for p, k in modular:
                if fnmatch.fnmatchcase(n, p):
                    chosen.restrict(n, k)
    unexcluded = [n for n in layers if not any(glob_to_regex(g).match("/" + n) for g in selection.exclude)]
    for p, k in functional:
        glob, what = p.split(":", 1)
        what = parse_what(what, p)
        if not ops and not what.startswith("out."):
            raise OptionError(f"activation target {p!r}: functional targets (softmax, matmul, cache.key, ...) "
                              "need a PyTorch model; give a layer name or LAYER:out.K")
        hit = [f"{n}:{what}" for n in unexcluded if fnmatch.fnmatchcase(n, glob)]
        chosen.names += hit
        for n in hit:
            chosen.restrict(n, k)
        if not _GLOB.search(glob):
            chosen.exact.update(hit)
    chosen.names = list(dict.fromkeys(chosen.names))
    return chosen
