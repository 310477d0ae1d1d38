"""Explicit sites: address one element by tensor name and index (and bit), like PyTorchFI's layer/dim addressing.

Layer: ``live`` (may import files and below; imported by frameworks and above).

``site(model, "layer4.1.conv2.weight", (0, 3, 1, 1), bits=30)`` is the plan that
flips bit 30 of that one weight; a list of ``(name, index, bits)`` tuples gives one
plan over several elements. ``value=`` stores a value instead (PyTorchFI's
``value=``); ``model=`` applies any fault model to the given bits (random parts
drawn from ``seed``).

Examples
--------
>>> import numpy as np
>>> w = {"fc.weight": np.ones((2, 3), np.float32)}
>>> plan = site(w, "fc.weight", (1, 2), bits="sign")
>>> int(plan.index[0]), hex(int(plan.xor_mask[0]))
(5, '0x80000000')
>>> from fastflip.live import injected
>>> with injected(w, plan):
...     w["fc.weight"][1].tolist()
[1.0, 1.0, -1.0]
>>> plan = site(w, [("fc.weight", 0, 30), ("fc.weight", -1, None)], value=0.5)
>>> plan.index.tolist()
[0, 5]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.bits import BitSpec
from ..core.dtypes import to_words, word_type
from ..errors import OptionError, PlanMismatchError
from ..core.faults import FaultModel, GroupBits, site_masks
from ..core.floatformats import FORMATS, encode
from ..core.plan import Plan, TensorRef, merge_duplicate_elements
from .targets import Targets

__all__ = ["site", "flat_index"]


def flat_index(name: str, shape: tuple[int, ...], index: "int | Sequence[int]") -> int:
    """The flat C-order index of ``index`` (an int counts in the flattened tensor; negative counts from the end).

    >>> flat_index("w", (2, 3), (1, -1)), flat_index("w", (2, 3), -1)
    (5, 5)
    """
    size = int(np.prod(shape, dtype=np.int64))
    if isinstance(index, (int, np.integer)):
        i = int(index) + (size if int(index) < 0 else 0)
        if not 0 <= i < size:
            raise PlanMismatchError(f"tensor {name!r}: flat index {index} is outside its {size} elements")
        return i
    idx = tuple(int(x) for x in index)
    if len(idx) != len(shape):
        raise PlanMismatchError(f"tensor {name!r} has shape {tuple(shape)}: give {len(shape)} indices, not {len(idx)}")
    fixed = []
    for k, (x, n) in enumerate(zip(idx, shape)):
        y = x + n if x < 0 else x
        if not 0 <= y < n:
            raise PlanMismatchError(f"tensor {name!r}: index {x} of dimension {k} is outside 0..{n - 1}")
        fixed.append(y)
    return int(np.ravel_multi_index(tuple(fixed), shape)) if shape else 0


def site(obj: Any, name: "str | Sequence[tuple[Any, ...]]", index: "int | Sequence[int] | None" = None,
         bits: Any = None, *, model: "FaultModel | str | None" = None, value: float | int | None = None,
         seed: int = 0) -> Plan:
    """A plan for explicit elements of a live model (or mapping / :class:`Targets`).

    Parameters
    ----------
    obj : torch.nn.Module, Keras model, mapping or Targets
    name : str or list of (name, index[, bits])
        The tensor's name or any alias (``layer4.1.conv2.weight``, ``model/...``).
    index : int or tuple of int
        Multi-dimensional index, or a flat one (negative values count from the end).
    bits : int, str or list, optional
        Bit positions (bit 0 = LSB) or fields (``sign``, ``exponent-msb``); default:
        bit positions chosen by the fault model among all bits.
    model : FaultModel or str
        Default ``flip``: every given bit is flipped. ``stuck-at-0``/``stuck-at-1``
        clear/set the given bits; other models act within the given bits.
    value : number, optional
        Store this value (converted to the tensor's dtype) instead; ``bits`` is then ignored.
    seed : int
        For models with random parts (``random-bits``, ``random-value``...).
    """
    tg = obj if isinstance(obj, Targets) else Targets.from_tensors(obj)
    specs = [(name, index, bits)] if isinstance(name, str) else [tuple(s) + (None,) * (3 - len(s)) for s in name]
    fm = FaultModel.parse(model)
    if value is not None and model is not None:
        raise OptionError("give either value= or model=, not both")
    refs: dict[str, int] = {}
    tensors: list[TensorRef] = []
    tid, idx, and_m, or_m, xor_m, scale = [], [], [], [], [], []
    rng = np.random.default_rng(seed)
    for nm, ix, bt in specs:
        if ix is None:
            raise OptionError(f"tensor {nm!r}: give the element's index")
        t = tg.get(str(nm))
        if t.name not in refs:
            refs[t.name] = len(tensors)
            tensors.append(TensorRef(t.name, t.dtype.str, t.shape, t.format))
        tid.append(refs[t.name])
        idx.append(flat_index(t.name, t.shape, ix))
        full = np.uint64(0xFFFFFFFFFFFFFFFF)
        if value is not None:
            if t.format:
                word = int(encode(np.array([float(value)]), FORMATS[t.format])[0])
            else:
                word = int(to_words(np.array([value]).astype(t.dtype.newbyteorder("=")))[0])
            and_m.append(np.uint64(0)), or_m.append(np.uint64(word)), xor_m.append(np.uint64(0)), scale.append(np.nan)
            continue
        positions = np.array(BitSpec.parse(bt).resolve(word_type(t.dtype, t.format)), dtype=np.int64)
        if fm.kind in ("flip", "stuck-at-0", "stuck-at-1") and bt is not None:
            bm = np.uint64(sum(1 << int(p) for p in positions))
            a, o, x = ((~bm, np.uint64(0), np.uint64(0)) if fm.kind == "stuck-at-0" else
                       (full, bm, np.uint64(0)) if fm.kind == "stuck-at-1" else (full, np.uint64(0), bm))
            and_m.append(a), or_m.append(o), xor_m.append(x), scale.append(np.nan)
            continue
        a, o, x, _ = site_masks(fm, GroupBits(positions, t.dtype.itemsize * 8), 1, rng)
        and_m.append(a[0]), or_m.append(o[0]), xor_m.append(x[0])
        scale.append(fm.factor if fm.kind == "scale" else np.nan)
    has_scale = any(not np.isnan(s) for s in scale)
    plan = Plan(tuple(tensors), np.array(tid, np.int32), np.array(idx, np.int64), np.array(and_m, np.uint64),
                np.array(or_m, np.uint64), np.array(xor_m, np.uint64), np.array(scale) if has_scale else None,
                meta={"explicit": [[str(n), str(i), None if b is None else str(b)] for n, i, b in specs],
                      "model": fm.as_dict() if value is None else {"kind": "value", "value": float(value)}})
    return merge_duplicate_elements(plan) if len(plan) > 1 else plan
