"""Fault models: how one injection site turns into word masks (or a scale factor).

Layer: ``core`` (may import fastflip.errors and core; imported by every layer).

Every model except ``scale`` reduces to the AND/OR/XOR word rule of
:mod:`fastflip.core.plan`. Positions are bit numbers with 0 = least significant bit and
are always drawn from the *allowed* bits of the site's dtype (the resolved
:class:`~fastflip.core.bits.BitSpec`).

=============  ==============================================================  ===============
kind           effect on the word                                              site unit
=============  ==============================================================  ===============
flip           XOR one allowed bit                                             (element, bit)
stuck-at-0     clear ``n`` distinct allowed bits (AND)                         (element, bit)*
stuck-at-1     set ``n`` distinct allowed bits (OR)                            (element, bit)*
random-bits    XOR ``n`` distinct allowed bits chosen at random                element
               (not adjacent; what the older tool called ``burst``)
adjacent       XOR ``n`` consecutive allowed bits (random start): an           element
               adjacent-bit burst; ``burst:n`` is an alias
mask           XOR the pattern ``mask``; ``mask_position='random'``            element
               shifts it to a random place where all its bits are allowed
random-value   set every allowed bit to a random value                         element
zero           clear the whole word                                            element
scale          value <- value * ``factor`` (value-level)                       element
=============  ==============================================================  ===============

(*) with ``n == 1`` stuck-at sites are (element, bit) pairs like flips.

Examples
--------
>>> FaultModel("random-bits", n=3).describe()
'3 distinct random bits'
>>> FaultModel.parse("burst:3").kind  # the literature's burst: adjacent bits
'adjacent'
>>> FaultModel.parse("mask:0b101@random").mask
5
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..errors import OptionError

__all__ = ["FaultModel", "FAULT_KINDS", "GroupBits", "site_masks"]

FAULT_KINDS = ("flip", "stuck-at-0", "stuck-at-1", "random-bits", "adjacent", "mask", "random-value", "zero", "scale")
_ALIASES = {"bitflip": "flip", "bit-flip": "flip", "single": "flip", "stuck0": "stuck-at-0", "stuck1": "stuck-at-1",
            "sa0": "stuck-at-0", "sa1": "stuck-at-1", "random": "random-value", "set-random": "random-value",
            "burst": "adjacent", "distinct": "random-bits"}


@dataclass(frozen=True)
class FaultModel:
    """One fault model (see the module docstring's table).

    Parameters
    ----------
    kind : str
        One of :data:`FAULT_KINDS`.
    n : int
        Bits per site for ``random-bits``, ``adjacent``, ``stuck-at-*``.
    mask : int, optional
        The pattern of ``mask`` (bit 0 = LSB).
    mask_position : {'fixed', 'random'}
    factor : float, optional
        The factor of ``scale``.
    """

    kind: str = "flip"
    n: int = 1
    mask: int | None = None
    mask_position: str = "fixed"
    factor: float | None = None

    def __post_init__(self) -> None:
        kind = _ALIASES.get(self.kind.lower(), self.kind.lower())
        object.__setattr__(self, "kind", kind)
        if kind not in FAULT_KINDS:
            raise OptionError(f"fault model {self.kind!r} is unknown; choose one of: {', '.join(FAULT_KINDS)}")
        if int(self.n) < 1:
            raise OptionError(f"fault model {kind}: n must be >= 1 (got {self.n})")
        object.__setattr__(self, "n", int(self.n))
        if kind == "mask":
            if self.mask is None or int(self.mask) <= 0:
                raise OptionError("fault model mask: give a non-zero bit pattern, e.g. mask:0b101")
            if self.mask_position not in ("fixed", "random"):
                raise OptionError("fault model mask: mask_position must be 'fixed' or 'random'")
        if kind == "scale":
            if self.factor is None or not np.isfinite(float(self.factor)):
                raise OptionError("fault model scale: give a finite factor, e.g. scale:2.0")
            object.__setattr__(self, "factor", float(self.factor))

    @classmethod
    def parse(cls, text: "str | FaultModel | None") -> "FaultModel":
        """Parse the CLI form: ``flip``, ``random-bits:3``, ``adjacent:2`` (alias ``burst:2``), ``stuck-at-1``, ``stuck-at-0:2``,
        ``mask:0b101`` or ``mask:0x5@random``, ``scale:2.0``, ``random-value``, ``zero``."""
        if text is None:
            return _FLIP
        if isinstance(text, FaultModel):
            return text
        name, _, arg = str(text).strip().partition(":")
        kind = _ALIASES.get(name.lower(), name.lower())
        try:
            if kind in ("random-bits", "adjacent", "stuck-at-0", "stuck-at-1") and arg:
                return cls(kind, n=int(arg))
            if kind == "mask":
                pattern, _, where = arg.partition("@")
                return cls(kind, mask=int(pattern, 0), mask_position=where or "fixed")
            if kind == "scale":
                return cls(kind, factor=float(arg))
        except ValueError:
            raise OptionError(f"fault model {text!r}: cannot read its argument {arg!r}") from None
        if arg:
            raise OptionError(f"fault model {name!r} takes no argument (got {arg!r})")
        return cls(kind)

    @property
    def pair_sites(self) -> bool:
        """True when sites are (element, bit) pairs rather than elements."""
        return self.kind == "flip" or (self.kind in ("stuck-at-0", "stuck-at-1") and self.n == 1)

    def describe(self) -> str:
        if self.kind == "random-bits":
            return f"{self.n} distinct random bits"
        if self.kind == "adjacent":
            return f"adjacent burst of {self.n} bits"
        if self.kind == "mask":
            return f"mask {bin(int(self.mask or 0))} ({self.mask_position} position)"
        if self.kind == "scale":
            return f"scale by {self.factor}"
        if self.kind.startswith("stuck") and self.n > 1:
            return f"{self.kind} on {self.n} bits"
        return self.kind

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in _FIELDS}  # asdict's deep copy of five scalars: ~5 µs


_FLIP = FaultModel()
_FIELDS = fields(FaultModel)


@dataclass(frozen=True)
class GroupBits:
    """Allowed bit positions of one dtype group of a site space."""

    positions: np.ndarray  # sorted int64 positions
    width: int  # word width in bits

    @property
    def mask(self) -> int:
        m = 0
        for p in self.positions.tolist():
            m |= 1 << p
        return m


def _bits_to_mask(positions: np.ndarray) -> np.ndarray:
    return np.left_shift(np.uint64(1), positions.astype(np.uint64))


def _bitwise(kind: str, bm: np.ndarray, and_m: np.ndarray, or_m: np.ndarray,
             xor_m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks of flipping (flip/random-bits), clearing (stuck-at-0) or setting (stuck-at-1) the bits ``bm``."""
    if kind == "stuck-at-0":
        return ~bm, or_m, xor_m
    if kind == "stuck-at-1":
        return and_m, bm, xor_m
    return and_m, or_m, bm


def _windows(allowed: int, pattern: int, width: int) -> list[int]:
    """Shifts s with (pattern << s) inside ``allowed`` and the word."""
    out = []
    s = 0
    while (pattern << s) >> width == 0:
        if (pattern << s) & ~allowed == 0:
            out.append(s)
        s += 1
    return out


def site_masks(
    model: FaultModel, group: GroupBits, n_sites: int, rng: np.random.Generator, bit_choice: np.ndarray | None = None,
    bit_masks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """AND/OR/XOR masks and touched-bits mask for ``n_sites`` sites of one dtype group.

    ``bit_choice`` holds already drawn positions for pair sites (flip / single stuck-at);
    ``bit_masks`` (instead) holds, per element, the OR of several distinct drawn bits.
    Random choices for element-level models are drawn from ``rng`` in a fixed order.
    """
    full = np.uint64(0xFFFFFFFFFFFFFFFF)
    and_m = np.full(n_sites, full, dtype=np.uint64)
    or_m = np.zeros(n_sites, dtype=np.uint64)
    xor_m = np.zeros(n_sites, dtype=np.uint64)
    pos = group.positions
    m = len(pos)
    kind = model.kind
    if kind in ("flip", "stuck-at-0", "stuck-at-1") and model.n == 1:
        if bit_masks is not None:
            bm = np.asarray(bit_masks, dtype=np.uint64)
            return (*_bitwise(kind, bm, and_m, or_m, xor_m), bm)
        if bit_choice is None:
            bit_choice = pos[rng.integers(0, m, size=n_sites)] if m else np.zeros(0, np.int64)
        bm = _bits_to_mask(np.asarray(bit_choice))
        return (*_bitwise(kind, bm, and_m, or_m, xor_m), bm)
    if kind in ("random-bits", "stuck-at-0", "stuck-at-1"):
        if model.n > m:
            raise OptionError(f"fault model {model.describe()}: only {m} bits are allowed for this dtype")
        keys = rng.random((n_sites, m))
        chosen = pos[np.argsort(keys, axis=1)[:, : model.n]]
        bm = np.bitwise_or.reduce(_bits_to_mask(chosen), axis=1) if n_sites else np.zeros(0, np.uint64)
        return (*_bitwise(kind, bm, and_m, or_m, xor_m), bm)
    if kind in ("adjacent", "mask"):
        pattern = (1 << model.n) - 1 if kind == "adjacent" else int(model.mask or 0)
        if kind == "mask" and model.mask_position == "fixed":
            if pattern >> group.width:
                raise OptionError(f"fault model mask {bin(pattern)} is wider than the {group.width}-bit word")
            shifts = [0]
        else:
            shifts = _windows(group.mask, pattern, group.width)
            if not shifts:
                raise OptionError(
                    f"fault model {model.describe()}: no place where all its bits fall in the allowed bits"
                )
        s = np.asarray(shifts, dtype=np.uint64)[rng.integers(0, len(shifts), size=n_sites)]
        bm = np.left_shift(np.uint64(pattern), s)
        return and_m, or_m, bm, bm
    allowed = np.uint64(group.mask)
    if kind == "zero":
        and_m[:] = 0
        return and_m, or_m, xor_m, np.full(n_sites, np.uint64((1 << group.width) - 1) if group.width < 64 else full)
    if kind == "random-value":
        rand = rng.integers(0, np.iinfo(np.uint64).max, size=n_sites, dtype=np.uint64, endpoint=True)
        and_m[:] = ~allowed
        or_m = rand & allowed
        return and_m, or_m, xor_m, np.full(n_sites, allowed)
    # scale: identity masks, value-level
    return and_m, or_m, xor_m, np.zeros(n_sites, dtype=np.uint64)
