"""Integer weights packed in int32 words (GPTQ, AWQ): which logical element a flipped bit belongs to.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Quantized LLM checkpoints (safetensors from AutoGPTQ/GPTQModel, AutoAWQ, transformers' GPTQ/AWQ
integrations) store low-bit integers packed in int32 words, beside float16 scales::

    <layer>.qweight  int32   GPTQ: [in / p, out]   AWQ: [in, out / p]     (p = 32 // bits values per word)
    <layer>.qzeros   int32   [groups, out / p]                            (both)
    <layer>.scales   float16 [groups, out]                                (both)
    <layer>.g_idx    int32   [in]  (GPTQ, optional: the group of each input row)

fastflip injects these files as they are stored: a site is a bit of one int32 *word* (roles: ``qweight`` is
``weight``, ``scales`` ``scale``, ``qzeros`` ``zero``; see :mod:`fastflip.files.roles`). The value a word
holds is ``p`` logical elements, value ``k`` (the *nibble* for 4 bits) in bits ``bits*k .. bits*k + bits-1``;
bit 0 is the word's least significant bit, as everywhere in fastflip. Which logical element that is:

``gptq``
    ``qweight`` word ``(i, j)``, value ``k`` -> element ``(p*i + k, j)`` of the ``[in, out]`` integer matrix
    (packed along the input dimension); ``qzeros`` word ``(g, j)``, value ``k`` -> zero point ``(g, p*j + k)``.
``awq``
    4 bits only, packed along the output dimension in the interleaved order ``AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)``:
    ``qweight`` word ``(i, j)``, nibble ``k`` -> element ``(i, 8*j + AWQ_ORDER[k])``; ``qzeros`` the same
    with ``g`` for ``i``.

The logical ``[in, out]`` matrix is the transpose of ``nn.Linear.weight`` (``[out, in]``); element ``(r, c)``
dequantizes as ``(q[r, c] - zero[g, c]) * scales[g, c]`` with ``g = g_idx[r]`` (or ``r // group_size``).
:func:`detect_packing` tells GPTQ from AWQ by the shapes of ``qweight`` and ``scales`` (GPTQ keeps ``out``
columns, AWQ ``out / 8``); ``fastflip inspect`` prints the rule for every packed tensor it finds.

Examples
--------
A flip of bit 13 in word 5 of a GPTQ ``qweight`` of shape ``[4, 6]`` (``in = 32``, ``out = 6``): word 5 is
``(0, 5)``, bit 13 lies in nibble 3, so the flipped element is ``(3, 5)``, bit 1 of its 4-bit value:

>>> packed_element("gptq", "qweight", (4, 6), 5, 13)
(3, 5, 1)
>>> packed_element("awq", "qweight", (32, 1), 0, 4)   # nibble 1 holds column AWQ_ORDER[1] = 2
(0, 2, 0)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.records import Tensor
from ..errors import OptionError

__all__ = ["AWQ_ORDER", "PACKINGS", "Packed", "packed_element", "packed_elements", "detect_packing", "describe"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACKINGS = ("gptq", "awq")
_KINDS = ("qweight", "qzeros")


@dataclass(frozen=True)
class Packed:
    """One packed tensor of a checkpoint: its path, kind (``qweight``/``qzeros``), packing and bits per value."""

    path: str
    kind: str
    packing: str
    bits: int = 4

    @property
    def per_word(self) -> int:
        """Values per int32 word (8 for 4 bits)."""
        return 32 // self.bits


def _check(packing: str, kind: str, bits: int) -> None:
    if packing not in PACKINGS:
        raise OptionError(f"unknown packing {packing!r}: choose from {', '.join(PACKINGS)}")
    if kind not in _KINDS:
        raise OptionError(f"unknown packed tensor kind {kind!r}: choose from {', '.join(_KINDS)}")
    if bits not in (2, 4, 8) or (packing == "awq" and bits != 4):
        raise OptionError(f"{packing} packing with {bits} bits: gptq packs 2, 4 or 8 bits, awq 4")


def packed_elements(packing: str, kind: str, word_shape: Sequence[int], word_index: np.ndarray,
                    bit: np.ndarray, bits: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, col, bit within the value)`` of the logical elements holding flat ``word_index`` / ``bit`` sites.

    Vectorised form of :func:`packed_element`, for a log's sites (its element index and flipped bit per site).

    Raises
    ------
    OptionError
        Unknown packing or kind, an unsupported width, a word index outside ``word_shape`` or a bit outside 0-31.
    """
    _check(packing, kind, bits)
    if len(word_shape) != 2:
        raise OptionError(f"a packed tensor is 2-D; got shape {tuple(word_shape)}")
    idx, b = np.asarray(word_index, dtype=np.int64), np.asarray(bit, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= math.prod(word_shape)):
        raise OptionError(f"word index outside the {math.prod(word_shape)} words of shape {tuple(word_shape)}")
    if b.size and (b.min() < 0 or b.max() > 31):
        raise OptionError("a bit of an int32 word lies in 0-31")
    i, j = np.unravel_index(idx, tuple(word_shape))
    k, inner = b // bits, b % bits
    p = 32 // bits
    if packing == "gptq" and kind == "qweight":
        return i * p + k, j, inner
    if packing == "awq":
        k = np.asarray(AWQ_ORDER, dtype=np.int64)[k]
    return i, j * p + k, inner


def packed_element(packing: str, kind: str, word_shape: Sequence[int], word_index: int, bit: int,
                   bits: int = 4) -> tuple[int, int, int]:
    """``(row, col, bit within the value)`` of the logical element that bit ``bit`` of flat word ``word_index``
    belongs to (see the module text for the rules; rows and columns of the ``[in, out]`` matrix)."""
    r, c, v = packed_elements(packing, kind, word_shape, np.array([word_index]), np.array([bit]), bits)
    return int(r[0]), int(c[0]), int(v[0])


def _stem(path: str, leaf: str) -> str | None:
    m = re.match(rf"^(.*)[./]{leaf}$", path)
    return m.group(1) if m else None


def detect_packing(tensors: Sequence[Tensor]) -> list[Packed]:
    """The packed ``qweight``/``qzeros`` tensors among ``tensors``, with their packing, told apart by shapes.

    A ``<layer>.qweight`` (int32, 2-D) beside a ``<layer>.scales`` ``[groups, out]`` is GPTQ when it has ``out``
    columns, AWQ when it has ``out / 8``; its ``<layer>.qzeros`` follows it. GPTQ's bits per value come from
    ``g_idx`` (``[in]``) when present (``in = rows * 32 / bits``), else 4. Anything else is not listed.
    """
    by_path = {t.path: t for t in tensors}
    out: list[Packed] = []
    for t in tensors:
        stem = _stem(t.path, "qweight")
        if stem is None or t.dtype.kind not in "iu" or t.dtype.itemsize != 4 or len(t.shape) != 2:
            continue
        sep = t.path[len(stem)]
        scales = by_path.get(f"{stem}{sep}scales")
        if scales is None or len(scales.shape) != 2:
            continue
        if t.shape[1] == scales.shape[1]:
            packing, bits = "gptq", 4
            g_idx = by_path.get(f"{stem}{sep}g_idx")
            if g_idx is not None and len(g_idx.shape) == 1 and (32 * t.shape[0]) % g_idx.shape[0] == 0:
                bits = 32 * t.shape[0] // g_idx.shape[0]
        elif t.shape[1] * 8 == scales.shape[1]:
            packing, bits = "awq", 4
        else:
            continue
        if bits not in (2, 4, 8):
            continue
        out.append(Packed(t.path, "qweight", packing, bits))
        zeros = by_path.get(f"{stem}{sep}qzeros")
        if zeros is not None and len(zeros.shape) == 2 and zeros.shape[1] * (32 // bits) == scales.shape[1]:
            out.append(Packed(zeros.path, "qzeros", packing, bits))
    return out


def describe(p: Packed) -> str:
    """One line saying which element a word's bits belong to (what ``fastflip inspect`` prints)."""
    n, w = p.per_word, p.bits
    rng = f"bits {w}k..{w}k+{w - 1}"
    if p.packing == "gptq" and p.kind == "qweight":
        where = f"element ({n}i+k, j) of the [in, out] matrix"
    elif p.packing == "gptq":
        where = f"zero point (g, {n}j+k)"
    else:
        where = ("element (i, 8j+AWQ_ORDER[k])" if p.kind == "qweight" else "zero point (g, 8j+AWQ_ORDER[k])") + \
            ", AWQ_ORDER = 0,2,4,6,1,3,5,7"
    word = "(i, j)" if p.kind == "qweight" else "(g, j)"
    return f"{p.path}: {p.packing} {w}-bit, {n} per int32 word: word {word} {rng} = {where}"
