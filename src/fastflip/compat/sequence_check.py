"""Checks of an older tool's injection sequence (``--loadInjectionSequence``): one line for each malformed entry.

Layer: ``compat`` (imports :mod:`fastflip.errors` only; used by :mod:`fastflip.compat.run` where the sequence is
read and :mod:`fastflip.compat.oldtool` where an entry's indexes meet a dataset's shape).

A sequence maps each location (a dataset path prefix) to a list of entries; an entry is

- ``null`` (an attempt that did not corrupt: skipped),
- ``[indexes, bits]``: ``indexes`` a list of non-negative integers (one per dimension of the dataset, or
  empty: any element), ``bits`` a list of integer bit positions, one integer (an integer dataset's flip) or
  ``null``;
- or ``bits`` alone (the first format: a list of integers, or one integer).

JSON integers only: no floats, strings, booleans or deeper lists.

Examples
--------
>>> check_sequence({"/a": [[[0, 1], [3]], [2, 5], None]}, "s.json")
>>> check_sequence({"/a": [[[0, 1.5], [3]]]}, "s.json")
Traceback (most recent call last):
...
fastflip.errors.OptionError: s.json: entry 0 of '/a' ([[0, 1.5], [3]]): indexes must be non-negative integers
>>> element_of([1, 2], (4, 3), "/a")
5
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..errors import OptionError

__all__ = ["check_sequence", "element_of"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one entry (None when it is well formed)."""
    if entry is None or _is_int(entry):
        return None
    if not isinstance(entry, list):
        return "an entry is [indexes, bits], a list of bits or null"
    if len(entry) == 2 and isinstance(entry[0], list):
        idx, bits = entry
        if not _int_list(idx) or any(i < 0 for i in idx):
            return "indexes must be non-negative integers"
        if bits is not None and not _is_int(bits) and not _int_list(bits):
            return "bits must be integers (a list of bit positions), one integer or null"
        return None
    if not _int_list(entry):
        return "an entry is [indexes, bits] or a list of integer bit positions"
    return None


def check_sequence(sequence: Mapping[str, Sequence[Any]], path: str) -> None:
    """Refuse, in one line naming the entry, a sequence whose entries are not of the documented shape.

    Raises
    ------
    OptionError
        The first malformed entry (its location, position and text) and what an entry must be.
    """
    for prefix, entries in sequence.items():
        for k, entry in enumerate(entries):
            problem = _entry_problem(entry)
            if problem is not None:
                text = json.dumps(entry)
                text = text if len(text) <= 60 else text[:57] + "..."
                raise OptionError(f"{path}: entry {k} of {prefix!r} ({text}): {problem}")


def element_of(indexes: Sequence[int], shape: Sequence[int], prefix: str) -> int:
    """The flat (C-order) element of ``indexes`` in a dataset of ``shape``, for the sequence's ``prefix``.

    Raises
    ------
    OptionError
        Not one index per dimension, or an index past its dimension.
    """
    if len(indexes) != len(shape):
        raise OptionError(f"the injection sequence's indexes {list(indexes)} under {prefix!r} do not fit a dataset "
                          f"of shape {tuple(shape)}: give one index per dimension")
    flat = 0
    for i, n in zip(indexes, shape):
        if not 0 <= i < n:
            raise OptionError(f"the injection sequence's indexes {list(indexes)} under {prefix!r} lie outside "
                              f"a dataset of shape {tuple(shape)}")
        flat = flat * int(n) + int(i)
    return flat
