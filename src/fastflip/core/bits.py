"""Bit specifications: ranges, lists and named fields, resolved per dtype.

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Bit 0 is the least significant bit of the stored word. A spec is a comma-separated
list of items, each a position (``31``), an inclusive range (``0-22``) or a named
field of the dtype (``sign``, ``exponent``, ``exponent-msb``, ``mantissa``, ``all``;
integers: ``msb``, ``lsb``, and ``sign`` when signed). ``sign_first=True`` reads
positions in the numbering of older tools where 0 is the most significant (sign) bit.

Examples
--------
>>> import numpy as np
>>> BitSpec.parse("0-2,sign").resolve(np.dtype("f4"))
(0, 1, 2, 31)
>>> BitSpec.parse("0", sign_first=True).resolve(np.dtype("f2"))
(15,)
>>> BitSpec.parse("exponent-msb").resolve(np.dtype("f8"))
(62,)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .dtypes import word_type
from ..errors import BitRangeError, OptionError

__all__ = ["BitSpec", "FIELD_NAMES"]

FIELD_NAMES = ("all", "sign", "exponent", "exponent-msb", "mantissa", "msb", "lsb")
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


@dataclass(frozen=True)
class BitSpec:
    """A parsed bit specification; :meth:`resolve` turns it into positions for a dtype."""

    items: tuple[str, ...] = ("all",)
    sign_first: bool = False

    @classmethod
    def parse(cls, spec: "str | int | Sequence[int | str] | BitSpec | None", *, sign_first: bool = False) -> "BitSpec":
        """Parse ``"0-22"``, ``"sign,exponent"``, ``[30, 31]``, ``30`` or ``None`` (all bits)."""
        if isinstance(spec, BitSpec):
            return spec
        if spec is None:
            return cls(("all",), sign_first)
        if isinstance(spec, (int, np.integer)):
            spec = [int(spec)]
        if isinstance(spec, str):
            raw = [s.strip() for s in spec.split(",")]
        else:
            raw = [str(s).strip() for s in spec]
        items = tuple(s.lower() for s in raw if s)
        if not items:
            raise OptionError("bits: empty bit specification; give positions (31), ranges (0-22) or fields (exponent)")
        for it in items:
            if not (it.isdigit() or _RANGE.match(it) or it in FIELD_NAMES):
                raise OptionError(
                    f"bits: cannot read {it!r}; use positions (31), ranges (0-22) or fields ({', '.join(FIELD_NAMES)})"
                )
        return cls(items, sign_first)

    def resolve(self, dtype: np.dtype | str) -> tuple[int, ...]:
        """Sorted, distinct bit positions (LSB = 0) of this spec for ``dtype``.

        Raises
        ------
        BitRangeError
            If a position lies outside the dtype's width or a field does not exist for it.
        """
        wt = word_type(dtype)
        out: set[int] = set()
        for it in self.items:
            if it in FIELD_NAMES:
                if it not in wt.fields:
                    raise BitRangeError(f"bits: dtype {wt.name} has no field {it!r} (it has: {', '.join(sorted(wt.fields))})")
                out.update(wt.fields[it])
                continue
            m = _RANGE.match(it)
            lo, hi = (int(m.group(1)), int(m.group(2))) if m else (int(it), int(it))
            if lo > hi:
                lo, hi = hi, lo
            if hi >= wt.bits:
                raise BitRangeError(
                    f"bits: position {hi} is outside {wt.name} (bits 0-{wt.bits - 1}); choose bits within the word"
                )
            positions = range(lo, hi + 1)
            out.update((wt.bits - 1 - p) if self.sign_first else p for p in positions)
        return tuple(sorted(out))

    def missing_fields(self, dtype: np.dtype | str) -> tuple[str, ...]:
        """The named fields of this spec that ``dtype`` lacks (``exponent`` for an integer type).

        >>> BitSpec.parse("exponent-msb").missing_fields("i8"), BitSpec.parse("sign").missing_fields("i8")
        (('exponent-msb',), ())
        """
        fields = word_type(dtype).fields
        return tuple(it for it in self.items if it in FIELD_NAMES and it not in fields)

    def __str__(self) -> str:
        return ",".join(self.items) + (" (sign-first)" if self.sign_first else "")
