"""Quantized PyTorch weights live: torchao tensor subclasses and torch.ao quantize_dynamic modules.

Each flip is checked against the same fault applied by hand (the dequantized weight computed in the test,
or a twin module given the flipped words through torch's own API); reverts restore the inner tensors bit
for bit and the outputs exactly.
"""

from __future__ import annotations

import copy
import pickle
import re
import warnings

import numpy as np
import pytest

from conftest import require
from fastflip.core.plan import Plan
from fastflip.live.api import inject, revert, select_live, targets

pytestmark = pytest.mark.framework


def _torch():
    torch = require("torch")
    torch.manual_seed(0)
    return torch


def _flip(tg, name, index, bit):
    """A plan flipping ``bit`` of flat element ``index`` of the live tensor ``name``."""
    ref = tg.get(name).ref()
    return Plan.from_sites([ref], [0], [index], xor_mask=[1 << bit])


def _int8_model(config_name):
    torch = _torch()
    ao = require("torchao.quantization")
    m = torch.nn.Sequential(torch.nn.Linear(8, 4))
    ao.quantize_(m, getattr(ao, config_name)())
    return torch, m


def _dequant(torch, w):
    """The weight an Int8Tensor stands for, computed by hand from its inner tensors (per-row blocks)."""
    return (w.qdata.to(torch.float32) - w.zero_point.to(torch.float32)) * w.scale


def test_torchao_inner_tensors_are_live_targets():
    torch, m = _int8_model("Int8WeightOnlyConfig")
    tg = targets(m)
    by = {t.name: t for t in tg.tensors}
    assert {"0.weight.qdata", "0.weight.scale", "0.weight.zero_point", "0.bias"} <= set(by)
    assert (by["0.weight.qdata"].role, by["0.weight.scale"].role, by["0.weight.zero_point"].role) == \
        ("weight", "scale", "zero")
    assert by["0.weight.qdata"].dtype == np.int8 and by["0.weight.qdata"].layer == "0"
    assert by["0.weight.qdata"].ptr == m[0].weight.qdata.data_ptr()  # the subclass's own storage
    assert [t.name for t in select_live(tg, {"roles": ["scale"]})] == ["0.weight.scale"]
    assert [t.name for t in select_live(tg, {"roles": ["zero"]})] == ["0.weight.zero_point"]


@pytest.mark.parametrize("bit", [0, 6, 7])
def test_torchao_int8_weight_only_flip_matches_hand_dequant_and_reverts(bit):
    torch, m = _int8_model("Int8WeightOnlyConfig")
    w = m[0].weight
    x = torch.randn(3, 8)
    with torch.no_grad():
        y0 = m(x)
    before = {k: getattr(w, k).clone() for k in ("qdata", "scale", "zero_point")}
    tg = targets(m)
    log = inject(tg, _flip(tg, "0.weight.qdata", 1 * 8 + 3, bit))
    old = int(before["qdata"][1, 3]) & 0xFF
    assert int(log.old_words[0]) == old and int(log.new_words[0]) == old ^ (1 << bit)
    expect_q = before["qdata"].clone()
    expect_q.view(torch.uint8)[1, 3] ^= 1 << bit
    assert torch.equal(w.qdata, expect_q)
    with torch.no_grad():
        y1 = m(x)
        by_hand = x @ _dequant(torch, w).T + m[0].bias
    torch.testing.assert_close(y1, by_hand, rtol=1e-5, atol=1e-6)
    assert not torch.equal(y1[:, 1], y0[:, 1])
    assert torch.equal(y1[:, [0, 2, 3]], y0[:, [0, 2, 3]])  # only output 1 reads row 1 of the weight
    revert(tg, log)
    for k, v in before.items():
        assert torch.equal(getattr(w, k), v), k
    with torch.no_grad():
        assert torch.equal(m(x), y0)


def test_torchao_scale_flip_reaches_the_forward_zero_point_flip_the_dequantized_weight():
    torch, m = _int8_model("Int8WeightOnlyConfig")
    w = m[0].weight
    x = torch.randn(2, 8)
    with torch.no_grad():
        y0, d0 = m(x), w.dequantize()
    tg = targets(m)
    log = inject(tg, _flip(tg, "0.weight.scale", 2, 22))
    with torch.no_grad():
        y1 = m(x)
        by_hand = x @ _dequant(torch, w).T + m[0].bias
    torch.testing.assert_close(y1, by_hand, rtol=1e-5, atol=1e-6)
    assert not torch.equal(y1[:, 2], y0[:, 2]) and torch.equal(y1[:, [0, 1, 3]], y0[:, [0, 1, 3]])
    revert(tg, log)
    # the zero point is stored and dequantize() reads it; the symmetric int8 forward does not (documented)
    log = inject(tg, _flip(tg, "0.weight.zero_point", 0, 1))
    with torch.no_grad():
        assert torch.equal(w.dequantize(), _dequant(torch, w)) and not torch.equal(w.dequantize(), d0)
        assert torch.equal(m(x), y0)
    revert(tg, log)
    with torch.no_grad():
        assert torch.equal(m(x), y0) and torch.equal(w.dequantize(), d0)


def test_torchao_dynamic_activation_int8_flip_equals_flip_by_hand():
    torch, m = _int8_model("Int8DynamicActivationInt8WeightConfig")
    twin = copy.deepcopy(m)
    x = torch.randn(3, 8)
    with torch.no_grad():
        y0 = m(x)
    tg = targets(m)
    log = inject(tg, _flip(tg, "0.weight.qdata", 2 * 8 + 5, 7))
    twin[0].weight.qdata.view(torch.uint8)[2, 5] ^= 1 << 7  # the same fault, by hand
    with torch.no_grad():
        y1, expect = m(x), twin(x)
    assert torch.equal(y1, expect) and not torch.equal(y1, y0)
    revert(tg, log)
    with torch.no_grad():
        assert torch.equal(m(x), y0)


def _dynamic(torch, per_channel=False):
    tq = torch.ao.quantization
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    spec = {torch.nn.Linear: tq.per_channel_dynamic_qconfig} if per_channel else {torch.nn.Linear}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tq.quantize_dynamic(m, spec, dtype=torch.qint8)


def _quantized_like(torch, w, words=None, scales=None):
    """The quantized tensor ``w`` with its integer ``words`` and/or per-channel ``scales`` replaced (torch's own API:
    the fault applied by hand)."""
    words = w.int_repr() if words is None else words
    if w.qscheme() == torch.per_tensor_affine:
        return torch._make_per_tensor_quantized_tensor(words, w.q_scale(), w.q_zero_point())
    return torch._make_per_channel_quantized_tensor(
        words, w.q_per_channel_scales() if scales is None else scales, w.q_per_channel_zero_points(),
        w.q_per_channel_axis())


def _set_words(torch, module, words):
    """Give ``module`` the int8 weight ``words`` by torch's own API (the fault applied by hand)."""
    w, b = module._packed_params._weight_bias()
    module._packed_params.set_weight_bias(_quantized_like(torch, w, words), b)


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dynamic_int8_flip_equals_flip_by_hand_and_reverts(per_channel):
    torch = _torch()
    q = _dynamic(torch, per_channel)
    twin = copy.deepcopy(q)
    x = torch.randn(5, 8)
    y0 = q(x)
    words0 = q[0]._packed_params._weight_bias()[0].int_repr().clone()
    tg = targets(q)
    assert tg.get("0.weight").dtype == np.int8 and tg.get("0.weight").role == "weight"
    assert tg.get("0._packed_params._packed_params/0") is tg.get("0.weight")  # the saved state_dict's key
    log = inject(tg, _flip(tg, "0.weight", 1 * 8 + 3, 6))
    flipped = words0.clone()
    flipped.view(torch.uint8)[1, 3] ^= 1 << 6
    assert int(log.old_words[0]) == int(words0[1, 3]) & 0xFF
    assert torch.equal(q[0]._packed_params._weight_bias()[0].int_repr(), flipped)  # repacked at once
    y1 = q(x)
    assert torch.equal(q[0]._packed_params._weight_bias()[0].int_repr(), flipped)
    _set_words(torch, twin[0], flipped)
    assert torch.equal(y1, twin(x)) and not torch.equal(y1, y0)
    revert(tg, log)
    assert torch.equal(q(x), y0)
    assert torch.equal(q[0]._packed_params._weight_bias()[0].int_repr(), words0)
    assert torch.equal(tg.get("0.weight").obj, words0)


def test_quantize_dynamic_per_channel_scale_and_bias_are_targets():
    torch = _torch()
    q = _dynamic(torch, per_channel=True)
    twin = copy.deepcopy(q)
    x = torch.randn(2, 8)
    y0 = q[0](x)
    tg = targets(q)
    roles = {t.name: t.role for t in tg.tensors}
    assert roles["0.weight.scale"] == "scale" and roles["0.weight.zero_point"] == "zero" and roles["0.bias"] == "bias"
    w0, b0 = twin[0]._packed_params._weight_bias()
    log = inject(tg, _flip(tg, "0.weight.scale", 2, 52))  # float64 scales: bit 52 is the exponent's lowest
    y1 = q[0](x)
    scales = w0.q_per_channel_scales().clone()
    scales.view(torch.int64)[2] ^= 1 << 52  # by hand: the same flip, through torch's own API
    twin[0]._packed_params.set_weight_bias(_quantized_like(torch, w0, scales=scales), b0)
    assert torch.equal(q[0]._packed_params._weight_bias()[0].q_per_channel_scales(), scales)
    assert torch.equal(y1, twin[0](x)) and not torch.equal(y1[:, 2], y0[:, 2])
    revert(tg, log)
    assert torch.equal(q[0](x), y0)
    log = inject(tg, _flip(tg, "0.bias", 1, 31))  # the bias sign
    expect = y0.clone()
    expect[:, 1] -= 2 * b0[1]
    torch.testing.assert_close(q[0](x), expect, rtol=1e-5, atol=1e-6)
    revert(tg, log)
    assert torch.equal(q[0](x), y0)


def test_quantize_dynamic_reload_refreshes_the_kept_words():
    torch = _torch()
    q = _dynamic(torch)
    other = _dynamic(torch)
    tg = targets(q)
    x = torch.randn(2, 8)
    q.load_state_dict(other.state_dict())
    assert torch.equal(q(x), other(x))  # the kept words follow the loaded ones
    assert torch.equal(tg.get("0.weight").obj, other[0]._packed_params._weight_bias()[0].int_repr())
    log = inject(tg, _flip(tg, "0.weight", 0, 7))
    assert not torch.equal(q(x), other(x))
    revert(tg, log)
    assert torch.equal(q(x), other(x))


def test_quantize_dynamic_copies_after_targets_stay_independent():
    torch = _torch()
    q = _dynamic(torch)
    tg = targets(q)
    twin = copy.deepcopy(q)  # the model can still be copied (and pickled) once fastflip reaches it
    x = torch.randn(2, 8)
    y0 = q[0](x)
    log = inject(tg, _flip(tg, "0.weight", 5, 7))
    assert not torch.equal(q[0](x), y0) and torch.equal(twin[0](x), y0)  # the copy keeps its own weights
    tg2 = targets(twin)
    log2 = inject(tg2, _flip(tg2, "0.weight", 5, 7))
    assert torch.equal(twin[0](x), q[0](x))  # and takes flips of its own
    revert(tg, log)
    revert(tg2, log2)
    assert torch.equal(q[0](x), y0) and torch.equal(twin[0](x), y0)
    assert len(twin[0]._forward_pre_hooks) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own TypedStorage notice while unpickling
        assert torch.equal(pickle.loads(pickle.dumps(q))[0](x), y0)


def test_quantize_dynamic_inject_and_revert_repack_once_and_compare_nothing(monkeypatch):
    """Each of inject and revert repacks a touched module once, right after writing, and compares no words (the
    write says they changed); the module shows the change at once."""
    torch = _torch()
    import fastflip.live.quantized as quantized

    q = _dynamic(torch)
    tg = targets(q)
    words0 = q[0]._packed_params._weight_bias()[0].int_repr().clone()
    counts = {"equal": 0, "repack": 0}
    equal, repack = torch.equal, quantized._Unpacked._repack

    def counted_equal(*a):
        counts["equal"] += 1
        return equal(*a)

    def counted_repack(self):
        counts["repack"] += 1
        return repack(self)

    monkeypatch.setattr(torch, "equal", counted_equal)
    monkeypatch.setattr(quantized._Unpacked, "_repack", counted_repack)
    log = inject(tg, _flip(tg, "0.weight", 5, 2))
    assert counts == {"equal": 0, "repack": 1}
    assert int(q[0]._packed_params._weight_bias()[0].int_repr().view(torch.uint8).reshape(-1)[5]) == (
        int(words0.view(torch.uint8).reshape(-1)[5]) ^ 4)
    revert(tg, log)
    assert counts == {"equal": 0, "repack": 2}
    monkeypatch.undo()
    assert torch.equal(q[0]._packed_params._weight_bias()[0].int_repr(), words0)


def test_quantize_dynamic_failed_repack_after_inject_puts_the_words_back(monkeypatch):
    """A repack that raises after the words were written leaves the model as it was (the old words back in the
    kept tensors, the module and its forward), with the error raised in one line naming the module."""
    torch = _torch()
    import fastflip.live.quantized as quantized
    from fastflip.errors import RepackError

    q = _dynamic(torch)
    x = torch.randn(5, 8)
    y0 = q(x)
    tg = targets(q)
    words0 = tg.get("0.weight").obj.clone()

    def broken(self):
        raise RuntimeError("repack failed")

    monkeypatch.setattr(quantized._Unpacked, "_repack", broken)
    with pytest.raises(RepackError, match=r"^torch.ao module '0': repacking its written words failed "
                                          r"\(RuntimeError: repack failed\)"):
        inject(tg, _flip(tg, "0.weight", 5, 2))
    monkeypatch.undo()
    assert torch.equal(tg.get("0.weight").obj, words0)
    assert torch.equal(q[0]._packed_params._weight_bias()[0].int_repr(), words0)
    assert torch.equal(q(x), y0)


def _bits(torch, t):
    """``t``'s words as integers (compares -0.0, NaN payloads and all, bit for bit)."""
    words = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(words).clone()

def _plain(torch, v):
    """``v`` (a tensor, quantized or not, a tuple or list of them, or a number) as integer tensors and numbers that
    :func:`_same` compares bit for bit (a quantized tensor: its words, scales and zero points)."""
    if isinstance(v, (tuple, list)):
        return [_plain(torch, u) for u in v]
    if isinstance(v, torch.Tensor) and v.is_quantized:
        if v.qscheme() == torch.per_tensor_affine:
            return [v.int_repr(), _bits(torch, torch.tensor([v.q_scale()], dtype=torch.float64)), v.q_zero_point()]
        return [v.int_repr()] + [_bits(torch, t) for t in (v.q_per_channel_scales(), v.q_per_channel_zero_points())]
    return _bits(torch, v) if isinstance(v, torch.Tensor) else v


def _same(a, b):
    """Whether two :func:`_plain` values are the same, bit for bit."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    if hasattr(a, "dtype") and hasattr(b, "dtype"):
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    return a == b


def _state(torch, module):
    """``module``'s ``state_dict``, bit for bit (see :func:`_plain`)."""
    return _plain(torch, list(module.state_dict().items()))


def test_quantize_dynamic_failed_repack_after_revert_leaves_the_injected_state(monkeypatch):
    """A revert whose repack raises leaves the model as the inject left it, bit for bit (the kept words, every
    touched module's packed weight and bias, its state_dict and forward; a module repacked before the failure
    takes the injected words again), raises one line naming the module and the cause, and can be retried."""
    torch = _torch()
    from fastflip.errors import RepackError

    q = _dynamic(torch)
    x = torch.randn(5, 8)
    y0 = q(x)
    tg = targets(q)
    log = inject(tg, Plan.from_sites([tg.get("0.weight").ref(), tg.get("2.weight").ref()], [0, 1], [5, 7],
                                     xor_mask=[1 << 2, 1 << 6]))
    y1 = q(x)

    def state():
        return [_plain(torch, [t.obj for t in tg.tensors]),
                _plain(torch, [q[i]._packed_params._weight_bias() for i in (0, 2)]), _state(torch, q)]

    injected = state()
    cls = type(q[0]._packed_params)
    pack, names, first = cls.set_weight_bias, {id(q[0]._packed_params): "0", id(q[2]._packed_params): "2"}, []

    def second_fails(self, w, b):  # the first module repacked succeeds (and is rolled back), the other fails
        first.append(first[0] if first else self)
        if self is not first[0]:
            raise RuntimeError("repack failed\nengine detail")
        return pack(self, w, b)

    monkeypatch.setattr(cls, "set_weight_bias", second_fails)
    with pytest.raises(RepackError) as e:
        revert(tg, log)
    victim = next(n for k, n in names.items() if k != id(first[0]))
    assert str(e.value) == (f"torch.ao module {victim!r}: repacking its written words failed "
                            "(RuntimeError: repack failed); its words from before this call are kept")
    assert _same(state(), injected)
    assert torch.equal(q(x), y1)  # no repack pending: the forward runs with the set_weight_bias still failing
    monkeypatch.undo()
    revert(tg, log)  # the log still applies
    assert torch.equal(q(x), y0)


# ---------------------------------------------------------------------------------- float16 dynamic Linear


def _float16_dynamic(torch, values, features=(8, 4)):
    """``quantize_dynamic(..., dtype=torch.float16)`` of one ``Linear(*features)`` whose first weight row starts
    with ``values``."""
    m = torch.nn.Sequential(torch.nn.Linear(*features))
    with torch.no_grad():
        m[0].weight[0, : len(values)] = torch.tensor(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.float16)


def _xor_bit(t, index, bit):
    """Flip ``bit`` of flat element ``index`` of the plain CPU tensor ``t`` in place (the fault by hand)."""
    flat = t.detach().numpy().reshape(-1).view(f"u{t.element_size()}")
    flat[index] ^= flat.dtype.type(1 << bit)
    return t



def test_quantize_dynamic_float16_every_bit_of_a_word_is_what_the_module_computes_with():
    """The weight is offered as the float16 words the packed module holds; each of the 16 bits of a word, flipped,
    is the packed weight and the forward of that word flipped by hand (the exponent's top bit included), and each
    revert gives the packed weight back bit for bit."""
    torch = _torch()
    q = _float16_dynamic(torch, [0.7])  # exponent 0b01110: no single flip makes it Inf or NaN
    x = torch.randn(3, 8)
    y0 = q(x)
    w0, b0 = (v.clone() for v in q[0]._packed_params._weight_bias())
    tg = targets(q)
    t = tg.get("0.weight")
    assert (t.dtype, t.role, t.layer) == (np.float16, "weight", "0")
    assert torch.equal(_bits(torch, t.obj), _bits(torch, w0.half()))
    twin = copy.deepcopy(q)
    for bit in range(16):
        log = inject(tg, _flip(tg, "0.weight", 0, bit))
        by_hand = _xor_bit(w0.half(), 0, bit)
        assert int(log.new_words[0]) == int(_bits(torch, by_hand)[0, 0]) & 0xFFFF
        assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, by_hand.float())), bit
        twin[0]._packed_params.set_weight_bias(by_hand.float(), b0)
        y1 = q(x)
        assert torch.equal(y1, twin(x)) and not torch.equal(y1[:, 0], y0[:, 0]), bit
        torch.testing.assert_close(y1, torch.nn.functional.linear(x, by_hand.float(), b0), rtol=1e-3, atol=1e-3)
        revert(tg, log)
        assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, w0)), bit
        assert torch.equal(q(x), y0), bit


def test_quantize_dynamic_float16_holds_every_finite_word_exactly():
    """Every finite float16 word (subnormals and -0.0 included), written at once, is the packed weight bit for bit,
    and the revert gives the old weight back bit for bit: the engine's packing keeps each of them."""
    torch = _torch()
    q = _float16_dynamic(torch, [], (248, 256))  # room for the 63488 finite words
    w0 = q[0]._packed_params._weight_bias()[0].clone()
    tg = targets(q)
    words = np.arange(1 << 16, dtype=np.uint64)
    words = words[(words & 0x7C00) != 0x7C00]  # exponent all ones: Inf and NaN, refused (test below)
    plan = Plan.from_sites([tg.get("0.weight").ref()], np.zeros(len(words), np.int32), np.arange(len(words)),
                           and_mask=np.zeros(len(words), np.uint64), or_mask=words)
    log = inject(tg, plan)
    packed = _bits(torch, q[0]._packed_params._weight_bias()[0].half()).reshape(-1).numpy().view(np.uint16)
    assert np.array_equal(packed, words.astype(np.uint16))
    assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, torch.from_numpy(
        words.astype(np.uint16).view(np.float16).astype(np.float32)).reshape(256, 248)))
    revert(tg, log)
    assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, w0))



def test_quantize_dynamic_float16_weight_is_not_the_saved_files_float32_weight(tmp_path):
    """torch saves a float16 Linear's weight as float32 (``.../0`` in the file): other words than the float16 ones
    offered live, so the live weight claims no file alias and a plan drawn from the file is refused naming the
    tensor; the bias is float32 in both and keeps its file alias."""
    torch = _torch()
    from fastflip.errors import TensorNotFoundError
    from fastflip.files.layout import read_layout

    q = _float16_dynamic(torch, [0.5])
    torch.save(q.state_dict(), tmp_path / "q.pt")
    saved = {t.name: t for t in read_layout(tmp_path / "q.pt").tensors}
    key = "0._packed_params._packed_params/0"
    assert np.dtype(saved["/" + key].dtype) == np.float32
    tg = targets(q)
    assert tg.get("0.weight").dtype == np.float16 and tg.get("0.weight").aliases == ("model/0.weight",)
    assert tg.get("0._packed_params._packed_params/1") is tg.get("0.bias")
    with pytest.raises(TensorNotFoundError, match=rf"^no tensor '{re.escape(key)}' here"):
        tg.get(key)
    x = torch.randn(2, 8)
    y0 = q(x)
    with pytest.raises(TensorNotFoundError, match=rf"names tensor '/{re.escape(key)}', which these tensors lack"):
        inject(tg, Plan.from_sites([saved["/" + key].ref()], [0], [0], xor_mask=[1]))
    assert torch.equal(tg.get("0.weight").obj, q[0]._packed_params._weight_bias()[0].half()) and torch.equal(q(x), y0)


@pytest.mark.parametrize("value, bit, word", [(1.5, 14, 0x7E00), (65504.0, 10, 0x7FFF), (-1.0, 14, 0xFC00)])
def test_quantize_dynamic_float16_non_finite_word_is_refused_and_nothing_changes(value, bit, word):
    """A flip that makes a float16 word Inf or NaN (which the engine's packing would saturate to +-65504) is
    refused in one line naming the module and the word; the kept words, the packed weight and the forward stay
    as they were, and the next flip still applies."""
    torch = _torch()
    from fastflip.errors import RepackError

    q = _float16_dynamic(torch, [0.25, value])
    x = torch.randn(3, 8)
    y0 = q(x)
    w0 = q[0]._packed_params._weight_bias()[0].clone()
    tg = targets(q)
    kept = _bits(torch, tg.get("0.weight").obj)
    with pytest.raises(RepackError, match=rf"^torch.ao module '0': repacking its written words failed \(ValueError: "
                                          rf"float16 word {word:#06x} at element 1 of its weight is not finite"):
        inject(tg, _flip(tg, "0.weight", 1, bit))
    assert torch.equal(_bits(torch, tg.get("0.weight").obj), kept)
    assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, w0))
    assert torch.equal(q(x), y0)
    log = inject(tg, _flip(tg, "0.weight", 0, 14))  # 0.25 -> 16384.0: finite, held exactly
    assert float(q[0]._packed_params._weight_bias()[0][0, 0]) == 16384.0
    revert(tg, log)
    assert torch.equal(_bits(torch, q[0]._packed_params._weight_bias()[0]), _bits(torch, w0))


# ---------------------------------------------------------------------------------- static Conv, Embedding, LSTM


def _static(torch, layer, qconfig, shape):
    """``layer`` statically quantized between a QuantStub and a DeQuantStub (prepare, calibrate, convert)."""
    tq = torch.ao.quantization
    m = torch.nn.Sequential(tq.QuantStub(), layer, tq.DeQuantStub()).eval()
    m.qconfig = tq.get_default_qconfig(qconfig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = tq.prepare(m)
        p(torch.randn(*shape))
        return tq.convert(p)


@pytest.mark.parametrize("qconfig", ["x86", "qnnpack"], ids=["per-channel", "per-tensor"])  # the default engine
def test_static_conv_weight_scale_and_bias_flips_equal_flips_by_hand_and_revert(qconfig):
    torch = _torch()
    c = _static(torch, torch.nn.Conv2d(2, 3, 3), qconfig, (4, 2, 6, 6))
    conv = c[1]
    x = torch.randn(2, 2, 6, 6)
    y0 = c(x)
    w0, b0 = conv._weight_bias()
    tg = targets(c)
    t = tg.get("1.weight")
    assert (t.dtype, t.role, t.layer, t.shape) == (np.int8, "weight", "1", (3, 2, 3, 3))
    assert tg.get("1.bias").role == "bias" and not tg.skipped
    per_channel = w0.qscheme() != torch.per_tensor_affine
    assert ("1.weight.scale" in tg.index) == per_channel
    sites = [("1.weight", 1 * 18 + 4, 6), ("1.bias", 2, 31)] + [("1.weight.scale", 1, 52)] * per_channel
    for name, index, bit in sites:
        log = inject(tg, _flip(tg, name, index, bit))
        twin = copy.deepcopy(c)
        words, bias = w0.int_repr().clone(), b0.clone()
        scales = w0.q_per_channel_scales().clone() if per_channel else None
        _xor_bit({"1.weight": words, "1.bias": bias, "1.weight.scale": scales}[name], index, bit)
        twin[1].set_weight_bias(_quantized_like(torch, w0, words, scales), bias)  # the fault, by hand
        w1, b1 = conv._weight_bias()
        assert torch.equal(w1.int_repr(), words) and torch.equal(_bits(torch, b1), _bits(torch, bias)), name
        y1 = c(x)
        assert torch.equal(y1, twin(x)) and not torch.equal(y1, y0), name
        revert(tg, log)
        w2, b2 = conv._weight_bias()
        assert torch.equal(w2.int_repr(), w0.int_repr()) and torch.equal(_bits(torch, b2), _bits(torch, b0))
        if per_channel:
            assert torch.equal(_bits(torch, w2.q_per_channel_scales()), _bits(torch, w0.q_per_channel_scales()))
        assert torch.equal(c(x), y0), name


def _embedding(torch, layer=None):
    """A quantized 8-bit ``Embedding(10, 4)`` (or ``layer``) in a Sequential (``float_qparams_weight_only_qconfig``)."""
    tq = torch.ao.quantization
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4) if layer is None else layer).eval()
    m[0].qconfig = tq.float_qparams_weight_only_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tq.convert(tq.prepare(m))


@pytest.mark.parametrize("name, index, bit", [("0.weight", 2 * 4 + 1, 7), ("0.weight.scale", 2, 23),
                                              ("0.weight.zero_point", 2, 30)])
def test_quantized_embedding_flips_equal_flips_by_hand_and_revert(name, index, bit):
    """A model holding only a quantized Embedding has its packed words, scales and zero points as targets; each
    flip is the packed weight and the lookup of the same flip given through torch's own API."""
    torch = _torch()
    e = _embedding(torch)
    ids = torch.tensor([[2, 5], [2, 0]])
    y0 = e(ids)
    w0 = e[0]._packed_params._weight()  # its scales and zero points are views of the packed object: copy them now
    words0, scales0, zeros0 = (v.clone() for v in (w0.int_repr(), w0.q_per_channel_scales(),
                                                  w0.q_per_channel_zero_points()))
    tg = targets(e)
    assert {t.name: (t.dtype, t.role) for t in tg.tensors} == {
        "0.weight": (np.uint8, "weight"), "0.weight.scale": (np.float32, "scale"),
        "0.weight.zero_point": (np.float32, "zero")}
    log = inject(tg, _flip(tg, name, index, bit))
    words, scales, zeros = words0.clone(), scales0.clone(), zeros0.clone()
    _xor_bit({"0.weight": words, "0.weight.scale": scales, "0.weight.zero_point": zeros}[name], index, bit)
    twin = copy.deepcopy(e)
    twin[0]._packed_params.set_weight(torch._make_per_channel_quantized_tensor(words, scales, zeros, 0))
    w1 = e[0]._packed_params._weight()
    assert torch.equal(w1.int_repr(), words)
    assert torch.equal(_bits(torch, w1.q_per_channel_scales()), _bits(torch, scales))
    assert torch.equal(_bits(torch, w1.q_per_channel_zero_points()), _bits(torch, zeros))
    y1 = e(ids)
    assert torch.equal(y1, twin(ids)) and not torch.equal(y1, y0)
    assert torch.equal(y1[0, 1], y0[0, 1])  # only row 2 changed
    revert(tg, log)
    w2 = e[0]._packed_params._weight()
    assert torch.equal(w2.int_repr(), words0)
    assert torch.equal(_bits(torch, w2.q_per_channel_scales()), _bits(torch, scales0))
    assert torch.equal(_bits(torch, w2.q_per_channel_zero_points()), _bits(torch, zeros0))
    for key, v in (("0.weight", words0), ("0.weight.scale", scales0), ("0.weight.zero_point", zeros0)):
        # the kept tensors are fastflip's own memory, not views of a packed object a repack freed
        assert torch.equal(_bits(torch, tg.get(key).obj), _bits(torch, v)), key
    assert torch.equal(e(ids), y0)



def _packed_case(torch, kind):
    """``(model, input, layer, unpack, repack)`` of one packed module kind: ``unpack(module)`` is its ``(weight,
    bias)`` as torch unpacks it, ``repack(module, weight, bias)`` gives it those through torch's own API."""
    if kind == "EmbeddingBag":
        q = _embedding(torch, torch.nn.EmbeddingBag(10, 4, mode="sum"))
        return (q, torch.tensor([[0, 2], [4, 1]]), "0", lambda m: (m._packed_params._weight(), None),
                lambda m, w, _b: m._packed_params.set_weight(w))
    layer, qconfig, shape = {"Conv1d": (torch.nn.Conv1d(2, 3, 3), "x86", (2, 2, 8)),
                             "Conv3d": (torch.nn.Conv3d(2, 3, 2), "x86", (2, 2, 4, 4, 4)),
                             "ConvTranspose2d": (torch.nn.ConvTranspose2d(2, 3, 3), "qnnpack", (2, 2, 5, 5))}[kind]
    return (_static(torch, layer, qconfig, shape), torch.randn(*shape), "1", lambda m: m._weight_bias(),
            lambda m, w, b: m.set_weight_bias(w, b))


def _by_hand(torch, w, b, part, index, bit):
    """``(w, b)`` with ``bit`` of flat element ``index`` of ``part`` flipped (``weight``, ``bias``, ``weight.scale``,
    ``weight.zero_point``), rebuilt through torch's own API."""
    if w.qscheme() == torch.per_tensor_affine:
        parts = {"weight": w.int_repr().clone()}
    else:
        parts = {"weight": w.int_repr().clone(), "weight.scale": w.q_per_channel_scales().clone(),
                 "weight.zero_point": w.q_per_channel_zero_points().clone()}
    parts["bias"] = None if b is None else b.detach().clone()
    _xor_bit(parts[part], index, bit)
    if w.qscheme() == torch.per_tensor_affine:
        return torch._make_per_tensor_quantized_tensor(parts["weight"], w.q_scale(), w.q_zero_point()), parts["bias"]
    return torch._make_per_channel_quantized_tensor(parts["weight"], parts["weight.scale"], parts["weight.zero_point"],
                                                    w.q_per_channel_axis()), parts["bias"]


@pytest.mark.parametrize("kind", ["Conv1d", "Conv3d", "ConvTranspose2d", "EmbeddingBag"])
def test_packed_module_kinds_flip_every_part_as_by_hand_and_revert_bit_for_bit(kind):
    """Each live part of a static Conv1d/Conv3d (per-channel), a ConvTranspose2d (per-tensor: torch quantizes it
    no other way) and an 8-bit EmbeddingBag, flipped, is the module's unpacked state of the same flip made by hand,
    bit for bit, and the forward of a twin given that state through torch's own API; each revert gives the
    state_dict back bit for bit."""
    torch = _torch()
    q, x, layer, unpack, repack = _packed_case(torch, kind)
    module = q[int(layer)]
    y0, state0, pristine = q(x), _state(torch, q), copy.deepcopy(q)
    w0, b0 = (_plain(torch, v) for v in unpack(module))
    tg = targets(q)
    parts = [t for t in tg.tensors if t.layer == layer]
    expect = {"weight"} | ({"bias"} if kind != "EmbeddingBag" else set()) | (
        {"weight.scale", "weight.zero_point"} if kind != "ConvTranspose2d" else set())
    assert {t.name[len(layer) + 1:] for t in parts} == expect and not tg.skipped
    bits = {np.dtype(np.int8): 6, np.dtype(np.uint8): 6, np.dtype(np.float32): 22, np.dtype(np.float64): 51}
    for t in parts:
        bit = bits.get(np.dtype(t.dtype), 1)
        log = inject(tg, _flip(tg, t.name, 1, bit))
        twin = copy.deepcopy(pristine)
        w, b = _by_hand(torch, *unpack(twin[int(layer)]), t.name[len(layer) + 1:], 1, bit)
        repack(twin[int(layer)], w, b)
        assert _same(_plain(torch, unpack(module)), _plain(torch, (w, b))), t.name
        assert torch.equal(q(x), twin(x)) and (t.role != "weight" or not torch.equal(q(x), y0)), t.name
        revert(tg, log)
        assert _same(_state(torch, q), state0), t.name
        assert _same(_plain(torch, unpack(module)), [w0, b0]) and torch.equal(q(x), y0), t.name


def test_static_conv_failed_repack_is_one_line_and_changes_nothing():
    """A flip the engine cannot pack (bit 62 of a float64 per-channel scale: too large for its float32) is refused
    with RepackError in one line naming the module and the cause; the state_dict and the forward are unchanged."""
    torch = _torch()
    from fastflip.errors import RepackError

    c = _static(torch, torch.nn.Conv2d(2, 3, 3), "x86", (4, 2, 6, 6))
    x = torch.randn(2, 2, 6, 6)
    y0, state0 = c(x), _state(torch, c)
    tg = targets(c)
    with pytest.raises(RepackError) as e:
        inject(tg, _flip(tg, "1.weight.scale", 1, 62))
    assert re.fullmatch(r"torch.ao module '1': repacking its written words failed \(RuntimeError: [^\n]+\); its "
                        r"words from before this call are kept", str(e.value))
    assert _same(_state(torch, c), state0) and torch.equal(c(x), y0)


def test_packed_weights_fastflip_cannot_reach_are_listed_as_left_out():
    """A dynamic-quantized LSTM's (and LSTMCell's) packed weights and a 4-bit EmbeddingBag's are named in
    ``skipped`` with why (and one warning
    says so); a model holding nothing else is refused listing them; asking for one says why it was left out."""
    torch = _torch()
    from fastflip.errors import SelectionError, TensorNotFoundError

    tq = torch.ao.quantization
    m = torch.nn.Sequential(torch.nn.LSTM(4, 3), torch.nn.LSTMCell(4, 3), torch.nn.Linear(3, 2),
                            torch.nn.EmbeddingBag(10, 4))
    m[3].qconfig = tq.float_qparams_weight_only_qconfig_4bit  # quint4x2: two words to a byte
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = tq.quantize_dynamic(m, {torch.nn.LSTM, torch.nn.LSTMCell, torch.nn.Linear}, dtype=torch.qint8)
        q = tq.convert(tq.prepare(q.eval()), inplace=False)
        lstm_only = tq.quantize_dynamic(torch.nn.Sequential(torch.nn.LSTM(4, 3)), {torch.nn.LSTM})
    with pytest.warns(UserWarning, match=r"fastflip: 4 tensor\(s\) left out: torch.ao module '0' \(LSTM\) keeps "
                                         r"'0._all_weight_values.0.param' packed"):
        tg = targets(q)
    assert [t.name for t in tg.tensors] == ["2.weight", "2.bias"]
    assert tg.skipped == ["0._all_weight_values.0.param", "1._packed_weight_ih", "1._packed_weight_hh",
                          "3._packed_params._packed_weight"]
    for key, owner in (("1._packed_weight_hh", "'1' (LSTMCell)"), ("3._packed_params._packed_weight",
                                                                      "'3' (EmbeddingBag)")):
        with pytest.raises(TensorNotFoundError, match=rf"^torch.ao module {re.escape(owner)} keeps '{key}' packed "
                                                      r".* \(left out of these targets\)$"):
            tg.get(key)
    with pytest.raises(SelectionError, match=r"left out: 0._all_weight_values.0.param\)"):
        targets(lstm_only)



def test_targets_walk_the_modules_once_for_packed_weights(monkeypatch):
    """Building targets looks at each module once for packed weights: the reached modules and the ones listed as
    left out come from the same walk."""
    torch = _torch()
    import fastflip.live.quantized as quantized

    tq = torch.ao.quantization
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = tq.quantize_dynamic(torch.nn.Sequential(torch.nn.LSTM(4, 3), torch.nn.Linear(3, 2)),
                                {torch.nn.LSTM, torch.nn.Linear})
    seen, access = [], quantized._access

    def counted(module, prefix):
        seen.append(id(module))
        return access(module, prefix)

    monkeypatch.setattr(quantized, "_access", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the LSTM's packed weights, left out
        tg = targets(q)
    assert [t.name for t in tg.tensors] == ["1.weight", "1.bias"] and tg.skipped == ["0._all_weight_values.0.param"]
    assert sorted(seen) == sorted(set(seen)) and id(q[1]) in seen and id(q[1]._packed_params) not in seen


def test_a_torchscript_object_outside_torch_ao_is_left_out_as_what_it_is():
    """A TorchScript object held by a module that is no torch.ao quantized module (a custom holder) is listed as
    left out by its attribute path, named as a TorchScript object of its class, not as a torch.ao packed weight."""
    torch = _torch()
    from fastflip.errors import TensorNotFoundError

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w = torch.quantize_per_tensor(torch.randn(2, 2), 0.1, 0, torch.qint8)
            self.blob = torch.ops.quantized.linear_prepack(w, None)

    m = torch.nn.Sequential(torch.nn.Linear(2, 2), Holder())
    with pytest.warns(UserWarning, match=r"fastflip: 1 tensor\(s\) left out: module '1' \(Holder\) holds '1.blob', "
                                         r"a TorchScript object of class \S+LinearPackedParamsBase whose contents "
                                         r"fastflip cannot reach"):
        tg = targets(m)
    assert [t.name for t in tg.tensors] == ["0.weight", "0.bias"] and tg.skipped == ["1.blob"]
    with pytest.raises(TensorNotFoundError, match=r"^module '1' \(Holder\) holds '1.blob', a TorchScript object "
                                                  r"of class \S+ whose contents fastflip cannot reach \(left out"):
        tg.get("1.blob")


@pytest.mark.parametrize("kind", ["float16", "conv", "embedding"])
def test_packed_reload_refreshes_the_kept_words_of_every_kind(kind):
    """``load_state_dict`` of another model's weights: the kept words follow (float16 words, conv and embedding
    words), the forward is the other model's, and a flip after it applies to the loaded words and reverts."""
    torch = _torch()
    build = {"float16": lambda: _float16_dynamic(torch, [0.5]),
             "conv": lambda: _static(torch, torch.nn.Conv2d(2, 3, 3), "x86", (4, 2, 6, 6)),
             "embedding": lambda: _embedding(torch)}[kind]
    x = {"float16": torch.randn(2, 8), "conv": torch.randn(2, 2, 6, 6), "embedding": torch.tensor([[0, 3]])}[kind]
    q, other = build(), build()
    tg = targets(q)
    name = "0.weight" if kind != "conv" else "1.weight"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.load_state_dict(other.state_dict())
    y = other(x)
    assert torch.equal(q(x), y) and not torch.equal(tg.get(name).obj, targets(build()).get(name).obj)
    assert torch.equal(_bits(torch, tg.get(name).obj), _bits(torch, targets(other).get(name).obj))
    log = inject(tg, _flip(tg, name, 1, 6))
    assert not torch.equal(q(x), y)
    revert(tg, log)
    assert torch.equal(q(x), y)



def _set_bits(tg, name, index, word):
    """A plan setting the bits of ``word`` in flat element ``index`` of the live tensor ``name``."""
    return Plan.from_sites([tg.get(name).ref()], [0], [index], or_mask=[word])


@pytest.mark.parametrize("kind", ["bias", "scale", "embedding scale"])
def test_packed_nan_part_is_repacked_once_not_at_every_forward(kind, monkeypatch):
    """A write that makes a float part NaN (a bias, a float64 per-channel scale, an embedding's float32 scale) is
    packed once, by the inject; later forwards find the kept words unchanged (NaN compares by its bits) and repack
    nothing; the forward is a twin's given the same words through torch's own API; the revert is bit for bit."""
    torch = _torch()
    if kind == "embedding scale":
        q, x, name, index, word = _embedding(torch), torch.tensor([[2, 5]]), "0.weight.scale", 2, 0x7FC00000
        setter = "set_weight"
    else:
        q, x = _dynamic(torch, per_channel=kind == "scale"), torch.randn(3, 8)
        name, index, word = ("0.bias", 1, 0x7FC00000) if kind == "bias" else ("0.weight.scale", 1, 0x7FF8 << 48)
        setter = "set_weight_bias"
    twin, y0, state0 = copy.deepcopy(q), q[0](x), _state(torch, q)
    tg = targets(q)
    log = inject(tg, _set_bits(tg, name, index, word))
    count, cls = [], type(q[0]._packed_params)
    pack = getattr(cls, setter)

    def counted(self, *a):
        count.append(1)
        return pack(self, *a)

    monkeypatch.setattr(cls, setter, counted)
    ys = [q[0](x) for _ in range(5)]
    assert count == []  # the inject packed it; the forwards found nothing to repack
    monkeypatch.undo()
    if kind == "embedding scale":  # the same NaN, given by hand through torch's own API
        w = twin[0]._packed_params._weight()
        scales = w.q_per_channel_scales().clone()
        scales.view(torch.int32)[index] |= word
        twin[0]._packed_params.set_weight(torch._make_per_channel_quantized_tensor(
            w.int_repr(), scales, w.q_per_channel_zero_points().clone(), 0))
    else:
        w, b = twin[0]._packed_params._weight_bias()
        if kind == "bias":
            b = b.clone()
            b.view(torch.int32)[index] |= word
        else:
            scales = w.q_per_channel_scales().clone()
            scales.view(torch.int64)[index] |= word
            w = _quantized_like(torch, w, scales=scales)
        twin[0]._packed_params.set_weight_bias(w, b)
    y1 = twin[0](x)
    assert torch.isnan(y1).any()
    for y in ys:
        assert torch.equal(_bits(torch, y), _bits(torch, y1))
    revert(tg, log)
    assert _same(_state(torch, q), state0)
    assert torch.equal(q[0](x), y0)


def test_a_quantstub_scale_is_a_scale_not_a_weight():
    """A converted QuantStub's input ``scale`` has role "scale" (its ``zero_point`` "zero"), so a selection of the
    weights of a statically quantized model holds its layers' weights only; a float module's own parameter named
    ``scale`` (a norm's gain) stays a weight."""
    torch = _torch()
    c = _static(torch, torch.nn.Conv2d(2, 3, 3), "x86", (4, 2, 6, 6))
    tg = targets(c)
    assert (tg.get("0.scale").role, tg.get("0.zero_point").role) == ("scale", "zero")
    assert [t.name for t in tg.tensors if t.role == "weight"] == ["1.weight"]

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.scale

    assert targets(torch.nn.Sequential(Norm())).get("0.scale").role == "weight"
