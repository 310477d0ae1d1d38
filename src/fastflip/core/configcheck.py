"""Type checks for configuration files: every key checked, the key named in the error.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Used by the campaign file (:mod:`fastflip.campaign.config`) and the experiment
configuration (:mod:`fastflip.experiment.config`). Each checker takes the value and the
key's full name as the user wrote it (``"[trials] per_cell"``, ``"scenarios[2].count"``)
and returns the value in its canonical type, or raises :class:`OptionError` of one line
that names the key, what it needs and what it got::

    [trials] per_cell must be a positive integer (got -5)

Booleans are never numbers, NaN and infinity are refused wherever a number must be
finite, a table or list where a string belongs is an error (never its ``repr``), and
an unknown key is named with the nearest valid one.

Examples
--------
>>> positive_int(3, "[trials] per_cell")
3
>>> positive_int(-5, "[trials] per_cell")
Traceback (most recent call last):
...
fastflip.errors.OptionError: [trials] per_cell must be a positive integer (got -5)
>>> number(float("nan"), "[evaluator] critical")
Traceback (most recent call last):
...
fastflip.errors.OptionError: [evaluator] critical must be a finite number (got nan)
>>> check_keys({"per_cel": 3}, ["per_cell", "margin"], "[trials]")
Traceback (most recent call last):
...
fastflip.errors.OptionError: [trials]: unknown key 'per_cel' (did you mean 'per_cell'?)
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

from ..errors import OptionError

__all__ = [
    "show", "check_keys", "table", "string", "opt_string", "choice", "boolean", "integer", "positive_int",
    "number", "strings", "ints", "named",
]


def show(v: Any) -> str:
    """How a wrong value appears in a message: short, and never a table's repr."""
    if isinstance(v, Mapping):
        return "a table"
    if isinstance(v, (list, tuple)):
        return "a list" if v else "an empty list"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return repr(v if len(v) <= 40 else v[:37] + "...")
    if v is None:
        return "nothing"
    if isinstance(v, (int, float)):
        return repr(v)
    return f"a {type(v).__name__}"


def _fail(key: str, need: str, v: Any) -> OptionError:
    return OptionError(f"{key} must be {need} (got {show(v)})")


def check_keys(data: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Refuse keys not in ``known``, naming the nearest valid one."""
    known = sorted(known)
    for k in data:
        if k in known:
            continue
        if not isinstance(k, str):
            raise OptionError(f"{where}: keys must be names, got {show(k)}")
        import difflib  # only to suggest a name in this error

        near = difflib.get_close_matches(k, known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(known)}"
        raise OptionError(f"{where}: unknown key {k!r} ({hint})")


def table(v: Any, key: str, *, optional: bool = True) -> dict[str, Any]:
    """A table (mapping); None gives an empty one when ``optional``."""
    if v is None and optional:
        return {}
    if not isinstance(v, Mapping):
        raise _fail(key, "a table", v)
    return dict(v)


def string(v: Any, key: str) -> str:
    """A non-empty string."""
    if not isinstance(v, str) or not v.strip():
        raise _fail(key, "a non-empty string", v)
    return v


def opt_string(v: Any, key: str) -> str | None:
    return None if v is None else string(v, key)


def choice(v: Any, key: str, options: Iterable[str]) -> str:
    """One string of ``options``."""
    options = tuple(options)
    if not isinstance(v, str) or v not in options:
        raise _fail(key, "one of " + ", ".join(options), v)
    return v


def boolean(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise _fail(key, "true or false", v)
    return v


def integer(v: Any, key: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool, not a float such as ``5.0``) within ``[lo, hi]``."""
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise _fail(key, "an integer", v)
    n = int(v)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        if lo == 1 and hi is None:
            raise _fail(key, "a positive integer", v)
        if lo == 0 and hi is None:
            raise _fail(key, "a non-negative integer", v)
        rng = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"between {lo} and {hi}")
        raise _fail(key, f"an integer {rng}", v)
    return n


def positive_int(v: Any, key: str) -> int:
    return integer(v, key, 1)


def number(v: Any, key: str, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite number within the bounds (open or closed)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise _fail(key, "a number", v)
    x = float(v)
    if not math.isfinite(x):
        raise _fail(key, "a finite number", v)
    bad = (lo is not None and (x < lo or (lo_open and x == lo))) or (hi is not None and (x > hi or (hi_open and x == hi)))
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        if hi is None:
            need = f"a number {'>' if lo_open else '>='} {lo:g}"
        elif lo is None:
            need = f"a number {'<' if hi_open else '<='} {hi:g}"
        else:
            need = f"a number in {left}{lo:g}, {hi:g}{right}"
        raise _fail(key, need, v)
    return x


def strings(v: Any, key: str, *, ints_ok: bool = False) -> list[str]:
    """A string or a list of strings (and integers when ``ints_ok``: bit positions); None gives []."""
    if v is None:
        return []
    items = v if isinstance(v, (list, tuple)) else [v]
    out = []
    for x in items:
        if isinstance(x, str) and x.strip():
            out.append(x)
        elif ints_ok and isinstance(x, numbers.Integral) and not isinstance(x, bool):
            out.append(str(int(x)))
        else:
            need = "a string or a list of strings" + (" or integers" if ints_ok else "")
            raise _fail(key, need, x if isinstance(v, (list, tuple)) else v)
    return out


def ints(v: Any, key: str, lo: int | None = None) -> list[int]:
    """An integer or a list of integers (each ``>= lo``); None gives []."""
    if v is None:
        return []
    items = v if isinstance(v, (list, tuple)) else [v]
    return [integer(x, key, lo) for x in items]


def named(key: str, parse: Any, value: Any) -> Any:
    """``parse(value)``, an :class:`OptionError` of the parser prefixed with the key it came from.

    >>> from fastflip.core.bits import BitSpec
    >>> named("[cells] bits", BitSpec.parse, "zz")
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: [cells] bits: cannot read 'zz'; use positions (31), ranges (0-22) or fields (all, sign, exponent, exponent-msb, mantissa, msb, lsb)
    """
    try:
        return parse(value)
    except OptionError as exc:
        text = str(exc)
        leaf = key.replace("]", " ").replace(".", " ").split()[-1]
        if text.startswith(leaf + ": "):  # the parser already named the key's last part
            text = text[len(leaf) + 2:]
        raise OptionError(text if text.startswith(key) else f"{key}: {text}") from None
