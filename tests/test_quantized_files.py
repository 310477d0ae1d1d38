"""Quantized checkpoints as files: torch.ao quantized state_dicts (qint8/quint8 storages) through the restricted
torch.save reader, checked by torch.load(weights_only=True); roles of quantized safetensors (GPTQ/AWQ int4 packed
in int32 words) and the word/nibble -> logical element map."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

from conftest import require
from fastflip.files.filebytes import sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout
from fastflip.live.api import inject as live_inject, targets
from format_contract import check_format

pytestmark = pytest.mark.framework


def _quantized(per_channel=False, dtype="qint8"):
    torch = require("torch")
    torch.manual_seed(1)
    tq = torch.ao.quantization
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    spec = {torch.nn.Linear: tq.per_channel_dynamic_qconfig} if per_channel else {torch.nn.Linear}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tq.quantize_dynamic(m, spec, dtype=getattr(torch, dtype))


def _words(torch, t):
    """{suffix: stored words} of a loaded tensor: a quantized one gives its int_repr and per-channel qparams."""
    if not t.is_quantized:
        return {"": t.detach().numpy()}
    out = {"": t.int_repr().numpy()}
    if t.qscheme() != torch.per_tensor_affine:
        out["/scale"] = t.q_per_channel_scales().numpy()
        out["/zero_point"] = t.q_per_channel_zero_points().numpy()
    return out


def _flat(torch, obj, prefix=""):
    out = {}
    if isinstance(obj, torch.Tensor):
        out.update({prefix + k: v for k, v in _words(torch, obj).items()})
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(torch, v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(torch, v, f"{prefix}/{i}"))
    return out


def torch_load_quantized(path):
    """What torch itself reads: every tensor's stored words (quantized ones as int_repr), by key path."""
    torch = require("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _flat(torch, torch.load(path, weights_only=True))


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_state_dict_layout_and_roles(tmp_path, per_channel):
    torch = require("torch")
    p = str(tmp_path / "q.pt")
    torch.save(_quantized(per_channel).state_dict(), p)
    lay = read_layout(p)
    by = {t.path: t for t in lay.tensors}
    w = by["/0._packed_params._packed_params/0"]
    assert (w.dtype, w.shape, w.layer, w.role) == (np.dtype("i1"), (6, 8), "0", "weight")
    assert (by["/0._packed_params._packed_params/1"].role, by["/2.scale"].role, by["/2.zero_point"].role) == \
        ("bias", "scale", "zero")
    qparams = {"/0._packed_params._packed_params/0/scale", "/0._packed_params._packed_params/0/zero_point"}
    assert (qparams <= set(by)) == per_channel
    if per_channel:
        assert by["/0._packed_params._packed_params/0/scale"].role == "scale"
        assert by["/0._packed_params._packed_params/0/zero_point"].dtype == np.dtype("<i8")
    assert set(by) == set(torch_load_quantized(p))  # nothing fastflip lists that torch does not read, and back
    assert lay.skipped == []


@pytest.mark.parametrize("per_channel,dtype", [(False, "qint8"), (True, "qint8"), (False, "quint8")])
def test_quantized_state_dict_contract(tmp_path, per_channel, dtype):
    torch = require("torch")
    p = str(tmp_path / "q.pt")
    if dtype == "quint8":  # quantize_dynamic only makes qint8 weights: a quint8 tensor saved as is
        sd = {"w": torch.quantize_per_tensor(torch.randn(5, 4), 0.05, 128, torch.quint8)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(sd, p)
        assert read_layout(p).tensors[0].dtype == np.dtype("u1")
    else:
        torch.save(_quantized(per_channel).state_dict(), p)
    sel = None if per_channel else {"roles": ["weight"]}
    # the flips torch reads back (int_repr) are exactly the logged ones, for every fault model; revert by sha256
    check_format(p, torch_load_quantized, str(tmp_path), fmt="torch",
                 models=["flip", "random-bits:2", "stuck-at-1"] if sel is None else ["flip", "zero"], count=6)
    res = inject_file(p, str(tmp_path / "w.pt"), seed=3, count=4, selection=sel or {"roles": ["weight"]})
    assert {t.name for t in res.log.plan.tensors} <= {"/0._packed_params._packed_params/0",
                                                        "/2._packed_params._packed_params/0", "/w"}


def test_saved_flips_equal_live_flips_through_the_aliases(tmp_path):
    torch = require("torch")
    q = _quantized(per_channel=True)
    live = copy.deepcopy(q)
    p, out = str(tmp_path / "q.pt"), str(tmp_path / "out.pt")
    torch.save(q.state_dict(), p)
    before = sha256_file(p)
    res = inject_file(p, out, seed=7, count=5, selection={"regex": ["_packed_params"]}, bits="0-6")
    loaded = copy.deepcopy(q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded.load_state_dict(torch.load(out, weights_only=True))
    live_inject(targets(live), res.log.plan)  # the file's plan names the saved keys: live aliases take it
    x = torch.randn(4, 8)
    assert torch.equal(loaded(x), live(x)) and not torch.equal(loaded(x), q(x))
    revert(res.log_path, out)
    assert sha256_file(out) == before


def test_quantized_record_checked_as_torch_checks_it(tmp_path):
    from fastflip.files.formats import FormatError
    from fastflip.files.formats.torchquant import quantized_globals
    from fastflip.files.formats.torchsave import StorageRef, _rebuild_v2

    rebuild = quantized_globals(_rebuild_v2)[("torch._utils", "_rebuild_qtensor")]
    per_channel = quantized_globals(_rebuild_v2)[("torch", "per_channel_affine")]
    st = StorageRef("0", "qint8", 12)
    scales = _rebuild_v2(StorageRef("1", "float64", 3), 0, (3,), (1,))
    assert rebuild(st, 0, (3, 4), (4, 1), (per_channel, scales, [0, 0, 0], 0)).parts == (("scale", scales),)
    for bad in ((per_channel, scales, [0, 0, 0], 2), (per_channel, scales, [0, 0], 0), (per_channel, 1.0, 0, 0),
                ("per_tensor_affine", 1.0, 0)):
        with pytest.raises(FormatError):
            rebuild(st, 0, (3, 4), (4, 1), bad)
    with pytest.raises(FormatError):
        rebuild(StorageRef("0", "float32", 12), 0, (3, 4), (4, 1), (per_channel, scales, [0, 0, 0], 0))


def test_legacy_torch_save_of_a_quantized_state_dict(tmp_path):
    torch = require("torch")
    p = str(tmp_path / "q_legacy.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(_quantized(per_channel=True).state_dict(), p, _use_new_zipfile_serialization=False)
    assert read_layout(p).format == "torch-legacy"
    check_format(p, torch_load_quantized, str(tmp_path), fmt="torch-legacy", models=["flip", "stuck-at-1"], count=6)
