"""The sampling spec: what to flip and how many, one frozen record for every front end.

:class:`Sampling` says, for every front end (the CLI, experiment scenarios, campaign cells, the file and
live APIs, activation faults), what to flip: allowed bits (``bits``, ``sign_first``), the fault model (``model``),
the amount (exactly one of ``count``, ``rate``, ``ber``), the distribution over tensors, the NaN policy
and whether sites may repeat (``replace``). It is checked once, when it is made, by keywords,
:meth:`Sampling.from_cli` (argparse flags) or :meth:`Sampling.from_mapping` (a YAML/TOML table);
:meth:`Sampling.of` is the one place where an entry point's ``sampling=`` or shorthand keywords become one. It is
turned into a :class:`~fastflip.core.sampling.SiteSpace` and a :class:`~fastflip.core.plan.Plan` by
:meth:`Sampling.space` and :meth:`Sampling.plan`. Seeds are not part of it: a spec says what to
draw, the seed which draw.

Imports: :mod:`fastflip.errors` and ``core`` (bits, faults, sampling, configcheck). Every front end
imports it: :func:`fastflip.files.inject.inject_file`, ``fastflip inject``, :mod:`fastflip.experiment.config`
scenarios, :mod:`fastflip.campaign.cells`, :func:`fastflip.live.injected` / :func:`fastflip.live.api.plan_for`
and :func:`fastflip.live.activations.injected_activations`.

Examples
--------
>>> s = Sampling(bits="exponent", model="flip", count=3)
>>> s.amount, s.describe()
({'count': 3}, 'flip on bits exponent: count 3, element distribution')
>>> Sampling.from_mapping({"bits": "30", "rate": 0.01, "nan_policy": "avoid"}).rate
0.01
>>> Sampling(count=1, rate=0.1)
Traceback (most recent call last):
...
fastflip.errors.OptionError: sampling: give exactly one of count, rate or ber (got count, rate)
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import OptionError
from . import configcheck as cc
from .bits import BitSpec
from .faults import FaultModel
from .plan import Plan, TensorRef
from .sampling import SiteSpace

__all__ = ["Sampling", "parse_distribution", "SAMPLING_KEYS"]

#: The keys of a sampling table (YAML/TOML) and the keywords of :class:`Sampling`.
SAMPLING_KEYS = ("bits", "sign_first", "model", "count", "rate", "ber", "distribution", "nan_policy", "replace")
_AMOUNTS = ("count", "rate", "ber")


def parse_distribution(text: str) -> str | dict[str, float]:
    """``element`` / ``tensor`` / ``a=1,b=2`` / ``@file.json`` (the CLI's ``--distribution``) → the distribution.

    >>> parse_distribution("conv=2,dense=1")
    {'/conv': 2.0, '/dense': 1.0}
    """
    if text in ("element", "tensor"):
        return text
    if text.startswith("@"):
        try:
            with open(text[1:]) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise OptionError(f"--distribution {text}: cannot read the weights file ({exc})") from None
        if not isinstance(data, dict):
            raise OptionError(f"--distribution {text}: the file must hold a JSON object of name: weight")
        return {str(k): float(v) for k, v in data.items()}
    out = {}
    for item in text.split(","):
        name, eq, w = item.rpartition("=")
        if not eq or not name:
            raise OptionError(f"--distribution: cannot read {item!r}; use element, tensor, name=w,... or @file.json")
        try:
            out[name if name.startswith("/") else "/" + name] = float(w)
        except ValueError:
            raise OptionError(f"--distribution: weight {w!r} is not a number") from None
    return out


def _bits_value(bits: Any) -> str | tuple[str, ...] | None:
    if bits is None or isinstance(bits, str):
        return bits
    if isinstance(bits, BitSpec):
        return tuple(bits.items)
    if isinstance(bits, numbers.Integral) and not isinstance(bits, bool):
        return str(int(bits))
    if isinstance(bits, (list, tuple)):
        return tuple(str(b) for b in bits)
    raise OptionError(f"sampling: bits must be a spec such as 'exponent', '0-22' or [30, 31] (got {bits!r})")


@dataclass(frozen=True)
class Sampling:
    """What to flip and how many sites (see the module docstring); frozen, checked on creation.

    Parameters
    ----------
    bits : str, sequence of int/str, BitSpec or None
        Allowed bit positions (:class:`~fastflip.core.bits.BitSpec`; None: every bit). ``sign_first``
        reads them in the older tools' numbering (0 = the sign bit).
    model : str or FaultModel
        The fault model (``flip``, ``adjacent:3``, ``random-bits:2``, ``stuck-at-1``, ``scale:2``, ...).
    count, rate, ber
        Exactly one: a number of sites, a fraction of elements, or a per-bit rate.
    distribution : 'element', 'tensor' or mapping of tensor name to weight
    nan_policy : 'allow' or 'avoid'
    replace : bool
        Allow a site to be drawn twice.

    Raises
    ------
    OptionError
        Any field out of its domain, with the field named.
    """

    bits: str | tuple[str, ...] | None = None
    model: str | FaultModel = "flip"
    count: int | None = None
    rate: float | None = None
    ber: float | None = None
    distribution: str | tuple[tuple[str, float], ...] = "element"
    nan_policy: str = "allow"
    replace: bool = False
    sign_first: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if isinstance(self.bits, BitSpec) and self.bits.sign_first:
            set_(self, "sign_first", True)
        set_(self, "bits", _bits_value(self.bits))
        set_(self, "sign_first", cc.boolean(self.sign_first, "sampling.sign_first"))
        cc.named("sampling.bits", lambda b: BitSpec.parse(b, sign_first=self.sign_first),
                 self.bits if not isinstance(self.bits, tuple) else list(self.bits))
        fault = self.model if isinstance(self.model, FaultModel) else (  # a FaultModel object is kept as it is
            cc.named("sampling.model", FaultModel.parse, cc.string(self.model, "sampling.model")))
        set_(self, "_fault", fault)  # parsed once: a loop of draws reads it per trial
        given = [k for k in _AMOUNTS if getattr(self, k) is not None]
        if len(given) != 1:
            raise OptionError(f"sampling: give exactly one of count, rate or ber (got {', '.join(given) or 'none'})")
        if self.count is not None:
            set_(self, "count", cc.integer(self.count, "sampling.count", 0))
        for k in ("rate", "ber"):
            if getattr(self, k) is not None:
                set_(self, k, cc.number(getattr(self, k), f"sampling.{k}", 0, 1))
        dist = self.distribution
        if isinstance(dist, Mapping) or isinstance(dist, tuple):
            items = tuple((str(k), float(v)) for k, v in (dist.items() if isinstance(dist, Mapping) else dist))
            weights = [w for _, w in items]
            if not items or not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
                raise OptionError("sampling: distribution weights must be finite, non-negative and not all zero")
            set_(self, "distribution", items)
        else:
            cc.choice(dist, "sampling.distribution", ("element", "tensor"))
        if self.distribution != "element" and (self.rate is not None or self.ber is not None):
            raise OptionError(f"sampling: {'rate' if self.rate is not None else 'ber'} draws every element with the "
                              "same probability: use distribution='element'")
        cc.choice(self.nan_policy, "sampling.nan_policy", ("allow", "avoid"))
        cc.boolean(self.replace, "sampling.replace")

    # ------------------------------------------------------------------ makers

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "sampling",
                     defaults: Mapping[str, Any] | None = None) -> "Sampling":
        """From a YAML/TOML table (keys :data:`SAMPLING_KEYS`; ``nan`` is read as ``nan_policy``).

        ``defaults`` fill keys the table leaves out; an unknown key is refused, named, with the nearest
        valid one.
        """
        d = dict(cc.table(data, where, optional=False))
        if "nan" in d and "nan_policy" not in d:
            d["nan_policy"] = d.pop("nan")
        cc.check_keys(d, SAMPLING_KEYS, where)
        merged = {**dict(defaults or {}), **d}
        if isinstance(merged.get("bits"), list):
            merged["bits"] = cc.strings(merged["bits"], f"{where}.bits", ints_ok=True)
        try:
            return cls(**merged)
        except OptionError as exc:
            msg = str(exc).replace("sampling.", f"{where}.", 1).replace("sampling:", f"{where}:", 1)
            raise type(exc)(msg) from None

    @classmethod
    def from_cli(cls, args: Any) -> "Sampling":
        """From the flags of :func:`fastflip.cli.options.add_fault_arguments` (``--count 1`` when no amount is given)."""
        amounts = {k: getattr(args, k) for k in _AMOUNTS if getattr(args, k, None) is not None}
        dist = getattr(args, "distribution", "element")
        return cls(bits=getattr(args, "bits", None), sign_first=getattr(args, "sign_first", False),
                   model=getattr(args, "model", "flip"), **(amounts or {"count": 1}),
                   distribution=parse_distribution(dist) if isinstance(dist, str) else dist,
                   nan_policy=getattr(args, "nan", "allow"), replace=getattr(args, "replace", False))

    @classmethod
    def of(cls, sampling: "Sampling | Mapping[str, Any] | None" = None, *, where: str = "sampling",
           required: bool = False, **shorthand: Any) -> "Sampling | None":
        """The Sampling of a call: ``sampling=`` (a Sampling or its table) or the shorthand keywords.

        Every entry point that says what to flip (:func:`fastflip.files.inject.inject_file`,
        :func:`fastflip.files.sharded.inject_dir`, :func:`fastflip.live.injected`,
        :func:`fastflip.live.api.plan_for`, :func:`fastflip.live.activations.injected_activations`)
        takes ``sampling=`` or, as a shorthand, the fields of :class:`Sampling` as keywords
        (``count=``, ``rate=``, ``ber=``, ``bits=``, ``sign_first=``, ``model=``, ``distribution=``,
        ``nan_policy=``, ``replace=``) and turns them into one here. A keyword given as None is not given.
        When neither is given: None (the caller fixes the sites with a plan), or, ``required``, an OptionError.

        >>> Sampling.of(count=2, bits="sign") == Sampling(count=2, bits="sign")
        True
        >>> Sampling.of({"rate": 0.5}).rate, Sampling.of() is None
        (0.5, True)
        >>> Sampling.of(Sampling(count=1), count=2)
        Traceback (most recent call last):
        ...
        fastflip.errors.OptionError: sampling: give either sampling= or its fields (count), not both

        Raises
        ------
        OptionError
            An unknown keyword (with the nearest field), both forms given, or a field out of its domain.
        """
        given = {k: v for k, v in shorthand.items() if v is not None}
        cc.check_keys(shorthand, SAMPLING_KEYS, where)
        if sampling is not None:
            if given:
                raise OptionError(f"{where}: give either sampling= or its fields ({', '.join(given)}), not both")
            if isinstance(sampling, Sampling):
                return sampling
            return cls.from_mapping(sampling, where=where)
        if not given:
            if required:
                raise OptionError(f"{where}: say what to flip: sampling=fastflip.Sampling(...) or its fields as "
                                  "keywords, with one of count=, rate= or ber= (how many sites to hit)")
            return None
        try:
            return cls(**given)
        except OptionError as exc:
            raise type(exc)(str(exc).replace("sampling", where, 1)) from None

    def with_changes(self, **changes: Any) -> "Sampling":
        """A copy with fields changed (checked again)."""
        if any(k in changes for k in _AMOUNTS):  # a new amount replaces the old one
            changes = {**{k: None for k in _AMOUNTS}, **changes}
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ use

    @property
    def amount(self) -> dict[str, int | float]:
        """``{'count': n}``, ``{'rate': r}`` or ``{'ber': p}``."""
        return {k: getattr(self, k) for k in _AMOUNTS if getattr(self, k) is not None}

    @property
    def bit_spec(self) -> BitSpec:
        return BitSpec.parse(self.bits if not isinstance(self.bits, tuple) else list(self.bits), sign_first=self.sign_first)

    @property
    def fault_model(self) -> FaultModel:
        """The parsed fault model."""
        return self._fault

    @property
    def distribution_arg(self) -> str | dict[str, float]:
        """The distribution as :class:`~fastflip.core.sampling.SiteSpace` takes it."""
        return dict(self.distribution) if isinstance(self.distribution, tuple) else self.distribution

    def space(self, tensors: Sequence[TensorRef]) -> SiteSpace:
        """The site space over ``tensors`` under this spec's bits and distribution."""
        return SiteSpace(tensors, bits=self.bit_spec, distribution=self.distribution_arg)

    def plan(self, space: SiteSpace | Sequence[TensorRef], *, seed: int, stream: Sequence[int] = (),
             read_words: Callable[[Plan], Any] | None = None) -> Plan:
        """Draw one plan: :meth:`SiteSpace.plan` of ``space`` (a space of this spec, or tensor refs to build one).

        >>> from fastflip.core.plan import TensorRef
        >>> s = Sampling(bits="sign", count=2)
        >>> s.plan([TensorRef("w", "<f4", (8,))], seed=3).xor_mask.tolist()
        [2147483648, 2147483648]
        """
        if not isinstance(space, SiteSpace):
            space = self.space(space)
        return space.plan(self, seed=seed, stream=stream, read_words=read_words)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what a log's options record)."""
        d = dataclasses.asdict(self)
        d["bits"] = list(self.bits) if isinstance(self.bits, tuple) else self.bits
        d["distribution"] = self.distribution_arg
        if isinstance(self.model, FaultModel):
            d["model"] = self.model.as_dict()
        return d

    def describe(self) -> str:
        """One line: model, bits, amount, distribution."""
        bits = "all bits" if self.bits is None else "bits " + (",".join(self.bits) if isinstance(self.bits, tuple)
                                                             else self.bits)
        (k, v), = self.amount.items()
        dist = self.distribution if isinstance(self.distribution, str) else "weighted"
        model = self.model.describe() if isinstance(self.model, FaultModel) else self.model
        return f"{model} on {bits}: {k} {v}, {dist} distribution"
