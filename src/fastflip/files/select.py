"""Choose tensors by path glob, regular expression, dtype, role and layer.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Globs use :mod:`fnmatch` semantics on absolute paths (``*`` matches any characters,
``/`` included, so ``*kernel*`` finds every kernel), with two additions: a leading
``/`` is optional (``conv*`` and ``/conv*`` are the same pattern) and ``/**/``
matches zero or more path components. A tensor matches when any of its aliases
does.

Examples
--------
>>> import numpy as np
>>> from fastflip.files.layout import Tensor
>>> def t(path, dt="<f4", role=None):
...     return Tensor(path, (path,), np.dtype(dt), (2,), 2, "contiguous", 0, role=role)
>>> ts = [t("/model/conv1.weight", role="weight"), t("/model/conv1.bias", role="bias"),
...       t("/optimizer/state/0/step", "<i8", "step-counter")]
>>> [x.path for x in select(ts, Selection(include=("model/*",), roles=("weight",)))]
['/model/conv1.weight']
>>> [x.path for x in select(ts, Selection(dtypes=("int",)))]
['/optimizer/state/0/step']
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from ..core.floatformats import format_name
from ..core.records import Tensor
from ..errors import OptionError, SelectionError
from .roles import ROLE_ALIASES, ROLES, alias_layers, label_names

__all__ = ["Selection", "select", "glob_to_regex", "dtype_matcher", "selection_from_args"]

# dtype groups accepted by Selection.dtypes
_DTYPE_GROUPS = {
    "float": "f", "floating": "f", "int": "iu", "integer": "iu", "signed": "i", "sint": "i",
    "uint": "u", "unsigned": "u", "bool": "b",
}


def _translate(piece: str) -> str:
    """fnmatch's translation of one glob piece, without its end anchor."""
    rx = fnmatch.translate(piece)
    return rx[: -len("\\Z")] if rx.endswith("\\Z") else rx


@lru_cache(maxsize=256)
def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a path glob with fnmatch semantics, leading '/' optional.

    ``*`` matches any characters (``/`` included, as in :mod:`fnmatch`); ``**`` is
    accepted too, and ``/**/`` also matches a single ``/`` (zero components).

    >>> bool(glob_to_regex("layers/**/vars/0").match("/layers/vars/0"))
    True
    >>> bool(glob_to_regex("*kernel*").match("/model_weights/dense/dense/kernel:0"))
    True
    >>> bool(glob_to_regex("/layers/*").match("/optimizer/vars"))
    False
    """
    pat = pattern if pattern.startswith("/") else "/" + pattern
    pieces = pat.split("/**/")
    return re.compile("(?:/.*)?/".join(_translate(p) for p in pieces) + r"\Z")


def dtype_matcher(spec: str) -> Any:
    """A predicate ``(numpy dtype, float format=None)`` for one dtype spec ('float32', 'f4', '>f4', 'float', 'int',
    'bfloat16', ...).

    A spec without a byte order matches both orders; ``'<f4'``/``'>f4'`` match one.
    Tensors with a float format (bfloat16 and float8 held in unsigned words) match
    their format's name and ``float``, never an integer spec.

    >>> m = dtype_matcher("float32"); m(np.dtype(">f4")), m(np.dtype("<f8"))
    (True, False)
    >>> dtype_matcher("float")(np.dtype("<u2"), "bfloat16"), dtype_matcher("uint")(np.dtype("<u2"), "bfloat16")
    (True, False)
    """
    s = spec.strip().lower()
    named = format_name(s)
    if named is not None:
        return lambda dt, fmt=None: fmt == named
    if s in _DTYPE_GROUPS:
        kinds = _DTYPE_GROUPS[s]
        return lambda dt, fmt=None: ("f" in kinds) if fmt else dt.kind in kinds
    try:
        want = np.dtype(s)
    except TypeError:
        raise OptionError(
            f"unknown dtype {spec!r}: use e.g. float32, f4, >f4, int8, float, int, uint, bool"
        ) from None
    if s[:1] in "<>":
        return lambda dt, fmt=None: not fmt and dt.str == want.str
    return lambda dt, fmt=None: not fmt and dt.newbyteorder("=") == want.newbyteorder("=")


def _tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    return tuple(v)


@dataclass(frozen=True)
class Selection:
    """Which tensors to act on. Empty criteria select everything.

    Attributes
    ----------
    include : tuple of str
        Path globs; a tensor must match at least one (when any are given) ...
    regex : tuple of str
        ... or match one of these regular expressions (``re.search`` on any alias).
    exclude : tuple of str
        Path globs removed afterwards.
    dtypes : tuple of str
        ``float32``, ``f4`` (either byte order), ``>f4`` (one byte order), or groups:
        ``float``, ``int`` (every integer type, signed or not), ``signed``, ``uint``, ``bool``.
    roles : tuple of str
        ``weight``, ``bias``, ``bn-statistic``, ``optimizer-moment``, ``step-counter``, ``scale``, ``zero``, ``other``
        (short forms: ``optimizer`` = ``optimizer-moment``, ``bn`` = ``bn-statistic``,
        ``counter`` = ``step-counter``).
    layers : tuple of str
        Globs on layer names (fnmatch, ``*`` matches anything). A tensor reached under several
        names (tied weights) matches through the layer of any of them
        (:func:`fastflip.files.roles.alias_layers`).
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("include", "exclude", "regex", "dtypes", "roles", "layers"):
            object.__setattr__(self, name, _tuple(getattr(self, name)))

        object.__setattr__(self, "roles", tuple(dict.fromkeys(ROLE_ALIASES.get(r, r) for r in self.roles)))
        bad = [r for r in self.roles if r not in ROLES]
        if bad:
            raise OptionError(f"unknown role {bad[0]!r}: choose from {', '.join(ROLES)}")
        for rx in self.regex:
            try:
                re.compile(rx)
            except re.error as exc:
                raise OptionError(f"bad regular expression {rx!r}: {exc}") from None
        for d in self.dtypes:
            dtype_matcher(d)

    @property
    def is_all(self) -> bool:
        """True when no criterion is set."""
        return not any((self.include, self.exclude, self.regex, self.dtypes, self.roles, self.layers))

    def describe(self) -> str:
        """Short human-readable form, e.g. ``include=model/* roles=weight``."""
        parts = [f"{k}={','.join(v)}" for k, v in self.as_dict().items() if v]
        return " ".join(parts) or "everything"

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(getattr(self, k)) for k in ("include", "exclude", "regex", "dtypes", "roles", "layers")}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Selection":
        """Build from a config mapping (unknown keys raise :class:`OptionError`)."""
        d = dict(d or {})
        unknown = set(d) - {"include", "exclude", "regex", "dtypes", "roles", "layers"}
        if unknown:
            raise OptionError(f"unknown selection key {sorted(unknown)[0]!r}")
        return cls(**{k: _tuple(v) for k, v in d.items()})

    def matches(self, t: Tensor) -> bool:
        """True when ``t`` passes every criterion."""
        aliases = t.aliases or (t.path,)
        if self.include or self.regex:
            hit = any(glob_to_regex(g).match(a) for g in self.include for a in aliases) or any(
                re.search(rx, a) for rx in self.regex for a in aliases
            )
            if not hit:
                return False
        if self.exclude and any(glob_to_regex(g).match(a) for g in self.exclude for a in aliases):
            return False
        if self.dtypes and not any(dtype_matcher(d)(t.dtype, getattr(t, "format", None)) for d in self.dtypes):
            return False
        if self.roles and t.role not in self.roles:
            return False
        if self.layers:  # any name of a tied tensor: its own layer or an alias's
            if not any(fnmatch.fnmatchcase(lay, g) for g in self.layers for lay in alias_layers(t)):
                return False
        return True


def _available(tensors: Sequence[Tensor]) -> str:
    paths = ", ".join(t.path for t in tensors[:5]) + (f" (+{len(tensors) - 5} more)" if len(tensors) > 5 else "")
    dts = ", ".join(sorted({getattr(t, "format", None) or t.dtype.str for t in tensors}))
    roles = ", ".join(sorted({t.role for t in tensors if t.role}))
    names = sorted({t.layer for t in tensors if t.layer})
    layers = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
    return f"available: {paths or 'no tensors'}; dtypes: {dts or '-'}; roles: {roles or '-'}; layers: {layers or '-'}"


def _records_of(refs: Sequence[Any]) -> list[Tensor]:
    """Layout records of :class:`~fastflip.core.plan.TensorRef` s (layer and role guessed from the names)."""
    kinds = ["f" if r.format else np.dtype(r.dtype).kind for r in refs]
    labels = label_names([r.name for r in refs], [len(r.shape) for r in refs], kinds)
    return [Tensor(r.name, ("/" + r.name.lstrip("/"),), np.dtype(r.dtype), tuple(r.shape), r.size, "memory",
                   layer=layer, role=role, format=r.format) for r, (layer, role) in zip(refs, labels)]


def select(tensors: Iterable[Any], selection: Selection | None = None) -> list[Any]:
    """The tensors that ``selection`` matches, in their original (layout) order.

    ``tensors`` are layout :class:`~fastflip.files.layout.Tensor` records, or
    :class:`~fastflip.core.plan.TensorRef` s (``fastflip.tensor_refs(model)``; layer and role
    then come from the names; the matching refs are returned). For live models,
    ``fastflip.live.select_live`` uses the model's own layers and roles.

    >>> from fastflip.core.plan import TensorRef
    >>> refs = [TensorRef("model/fc.weight", "<f4", (2, 2)), TensorRef("model/fc.bias", "<f4", (2,))]
    >>> [r.name for r in select(refs, Selection(roles=["bias"]))]
    ['model/fc.bias']

    Raises
    ------
    SelectionError
        When nothing matches; the message names the selection and what was available.
    """
    tensors = list(tensors)
    if tensors and not isinstance(tensors[0], Tensor) and hasattr(tensors[0], "word"):  # TensorRefs
        chosen = {t.path for t in select(_records_of(tensors), selection)}
        return [r for r in tensors if r.name in chosen]
    if selection is None or selection.is_all:
        if not tensors:
            raise SelectionError("no tensors to select from (the file holds no numeric datasets)")
        return tensors
    out = [t for t in tensors if selection.matches(t)]
    if not out:
        raise SelectionError(f"selection {selection.describe()} matched no tensor; {_available(tensors)}")
    return out


def selection_from_args(args: Any) -> Selection:
    """The :class:`Selection` given by the CLI's selection options (comma lists allowed).

    >>> import argparse
    >>> from fastflip.cli.options import add_selection_arguments
    >>> p = argparse.ArgumentParser(); add_selection_arguments(p)
    >>> selection_from_args(p.parse_args(["--include", "model/*", "--role", "weight"])).describe()
    'include=model/* roles=weight'
    """

    def items(name: str) -> tuple[str, ...]:
        out: list[str] = []
        for v in getattr(args, name, None) or ():
            out.extend(x for x in (v.split(",") if name not in ("regex",) else [v]) if x)
        return tuple(out)

    return Selection(include=items("include"), exclude=items("exclude"), regex=items("regex"),
                     dtypes=items("dtype"), roles=items("role"), layers=items("layer"))
