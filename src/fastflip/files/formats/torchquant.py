"""Quantized tensors in ``torch.save`` files (``qint8``/``quint8``/``qint32`` storages), read without torch.

Layer: ``files`` (may import core, kernels and files; imported by live and above). Used by
:mod:`fastflip.files.formats.torchsave`, whose restricted unpickler it extends with the names a quantized
tensor needs (``torch._utils._rebuild_qtensor``, ``torch.QInt8Storage``, ``torch.per_tensor_affine``, ...);
nothing here runs pickled code either.

What a saved ``torch.ao`` quantized model holds (``quantize_dynamic`` / static ``Linear``): each quantized
linear layer saves its packed parameters as ``<module>._packed_params._packed_params = (weight, bias)``;
the weight is a quantized tensor whose storage holds its integer words (``qint8``: int8, ``quint8``: uint8,
``qint32``: int32, stored as plain little-endian words). fastflip lists it as those words:

``/<module>._packed_params._packed_params/0``
    The weight's integer words (role ``weight``, dtype ``int8`` for ``qint8``); a flip there is exactly a
    flip of ``torch.load(...)[key][0].int_repr()``.
``/<module>._packed_params._packed_params/0/scale``, ``.../0/zero_point``
    Per-channel quantization (``per_channel_affine``): the scales (float64, role ``scale``) and zero
    points (int64, role ``zero``), stored tensors of their own. A per-tensor scale and zero point are
    numbers inside the pickle, not storage: they are not listed and cannot be flipped in the file.
``/<module>._packed_params._packed_params/1``
    The float bias (role ``bias``).

The module-level ``<module>.scale`` / ``<module>.zero_point`` tensors (0-d) get the roles ``scale`` / ``zero``
by name (:mod:`fastflip.files.roles`). Quantizer parameters are checked as torch checks them when it loads the
file (a known scheme; a per-channel axis inside the shape and one scale and zero point per channel): a file
torch would refuse is refused.

Examples
--------
>>> packed_label(["0._packed_params._packed_params", "0"])
('0', 'weight')
>>> packed_label(["enc.fc._packed_params._packed_params", "0", "scale"])
('enc.fc', 'scale')
>>> packed_label(["fc.weight"]) is None
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...errors import FormatError

__all__ = ["QUANT_DTYPES", "QUANT_STORAGES", "QScheme", "quantized_globals", "packed_label"]

# quantized dtype -> its stored integer word (the int_repr dtype)
QUANT_DTYPES = {"qint8": "|i1", "quint8": "|u1", "qint32": "<i4"}
QUANT_STORAGES = {"QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32"}
_PER_TENSOR = "per_tensor_affine"
_PER_CHANNEL = ("per_channel_affine", "per_channel_affine_float_qparams")
_PACKED = "._packed_params._packed_params"


@dataclass(frozen=True)
class QScheme:
    """Stand-in for a ``torch.<qscheme>`` global."""

    name: str


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _channel_params(value: Any, what: str, channels: int) -> tuple[tuple[str, Any], ...]:
    """Per-channel scales or zero points: a stored tensor record (kept as a part) or a list of numbers (not)."""
    if isinstance(value, list):
        if len(value) != channels or not all(_number(v) for v in value):
            raise FormatError(f"quantized tensor with {len(value)} per-channel {what} for {channels} channels")
        return ()
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) != 1 or shape[0] != channels:
        raise FormatError(f"quantized tensor whose per-channel {what} are not {channels} values")
    return ((what, value),)


def quantized_globals(rebuild_v2: Callable[..., Any]) -> dict[tuple[str, str], Any]:
    """``find_class`` entries for quantized tensors: ``_rebuild_qtensor`` (built on ``rebuild_v2``, the reader's
    plain tensor rebuild) and the qscheme globals. The record it returns is ``rebuild_v2``'s, with the stored
    per-channel scales and zero points as its ``parts``."""

    def rebuild_qtensor(storage: Any, storage_offset: Any, size: Any, stride: Any, quantizer_params: Any,
                        requires_grad: Any = None, backward_hooks: Any = None) -> Any:
        rec = rebuild_v2(storage, storage_offset, size, stride)
        if rec.dtype not in QUANT_DTYPES:
            raise FormatError(f"quantized tensor record on a {rec.dtype} storage (expected qint8, quint8 or qint32)")
        if not isinstance(quantizer_params, tuple) or not quantizer_params \
                or not isinstance(quantizer_params[0], QScheme):
            raise FormatError("quantized tensor record without a quantization scheme")
        scheme = quantizer_params[0].name
        if scheme == _PER_TENSOR:
            if len(quantizer_params) != 3 or not all(_number(v) for v in quantizer_params[1:]):
                raise FormatError("per-tensor quantized record without a numeric scale and zero point")
            return rec
        if scheme not in _PER_CHANNEL or len(quantizer_params) != 4:
            raise FormatError(f"quantized tensor record with scheme {scheme} (per-tensor and per-channel affine are read)")
        _, scales, zeros, axis = quantizer_params
        if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(rec.shape):
            raise FormatError(f"per-channel quantized record with axis {axis!r} outside its shape {rec.shape}")
        channels = rec.shape[axis]
        parts = _channel_params(scales, "scale", channels) + _channel_params(zeros, "zero_point", channels)
        return dataclasses.replace(rec, parts=parts)

    out: dict[tuple[str, str], Any] = {("torch._utils", "_rebuild_qtensor"): rebuild_qtensor}
    out.update({("torch", name): QScheme(name) for name in (_PER_TENSOR, *_PER_CHANNEL)})
    return out


def packed_label(parts: Sequence[str]) -> tuple[str | None, str] | None:
    """(layer, role) of a tensor saved inside a ``torch.ao`` module's packed parameters, from its key path
    components; None for any other path."""
    for i, p in enumerate(parts):
        if not ("." + p).endswith(_PACKED):
            continue
        layer = p[: -len(_PACKED)] or None  # None: the packed module saved on its own
        rest = list(parts[i + 1:])
        if rest == ["0"]:
            return layer, "weight"
        if rest == ["1"]:
            return layer, "bias"
        if rest in (["0", "scale"], ["0", "zero_point"]):
            return layer, "scale" if rest[1] == "scale" else "zero"
        return None
    return None
