"""Int4 (and 2/8-bit) weights packed in int32 words as GPTQ and AWQ checkpoints store them: roles in safetensors,
the packing told apart by shapes, and the (word, bit) -> logical element map checked against independent
pack/unpack code (the libraries' loops, transcribed) on an injected file read back by safetensors."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from fastflip.cli import main
from fastflip.errors import OptionError
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from fastflip.files.packing import Packed, describe, detect_packing, packed_element, packed_elements

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map when packing
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # and the order its unpacking restores columns with


def gptq_pack_rows(q, bits=4):
    """AutoGPTQ's packing loop: values ``q`` [in, out] -> int32 words [in * bits / 32, out]."""
    p = 32 // bits
    out = np.zeros((q.shape[0] // p, q.shape[1]), dtype=np.uint32)
    for row in range(out.shape[0]):
        for j in range(p):
            out[row] |= q[row * p + j].astype(np.uint32) << (bits * j)
    return out.view(np.int32)


def gptq_pack_cols(z, bits=4):
    """AutoGPTQ's qzeros packing: [groups, out] -> [groups, out * bits / 32] along columns."""
    p = 32 // bits
    out = np.zeros((z.shape[0], z.shape[1] // p), dtype=np.uint32)
    for col in range(out.shape[1]):
        for j in range(p):
            out[:, col] |= z[:, col * p + j].astype(np.uint32) << (bits * j)
    return out.view(np.int32)


def gptq_unpack_rows(words, bits=4):
    p = 32 // bits
    w = words.view(np.uint32)
    vals = (w[:, None, :] >> (bits * np.arange(p, dtype=np.uint32))[None, :, None]) & ((1 << bits) - 1)
    return vals.reshape(-1, w.shape[1])


def gptq_unpack_cols(words, bits=4):
    p = 32 // bits
    w = words.view(np.uint32)
    return ((w[:, :, None] >> (bits * np.arange(p, dtype=np.uint32))) & ((1 << bits) - 1)).reshape(w.shape[0], -1)


def awq_pack(q):
    """AutoAWQ's gemm packing: [rows, out] -> [rows, out / 8], columns interleaved by order_map."""
    out = np.zeros((q.shape[0], q.shape[1] // 8), dtype=np.uint32)
    for col in range(out.shape[1]):
        for i in range(8):
            out[:, col] |= q[:, col * 8 + AWQ_PACK_ORDER[i]].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def awq_unpack(words):
    """AutoAWQ's unpacking: shifts 0, 4, ..., 28, then columns put back with AWQ_REVERSE_ORDER."""
    vals = gptq_unpack_cols(words, 4)
    order = (np.arange(vals.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER]).reshape(-1)
    return vals[:, order]


def test_transcribed_packers_round_trip():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (32, 16), dtype=np.uint8)
    assert np.array_equal(gptq_unpack_rows(gptq_pack_rows(q)), q)
    assert np.array_equal(gptq_unpack_cols(gptq_pack_cols(q)), q)
    assert np.array_equal(awq_unpack(awq_pack(q)), q)
    q2 = rng.integers(0, 4, (32, 16), dtype=np.uint8)
    assert np.array_equal(gptq_unpack_rows(gptq_pack_rows(q2, 2), 2), q2)


def _checkpoint(rng, packing, in_f=32, out_f=16, group=16, bits=4):
    """A layer as GPTQ / AWQ save it: qweight, qzeros, scales (and g_idx for GPTQ); plus the logical values."""
    top = 1 << bits
    q = rng.integers(0, top, (in_f, out_f), dtype=np.uint8)
    z = rng.integers(0, top, (in_f // group, out_f), dtype=np.uint8)
    scales = rng.random((in_f // group, out_f)).astype(np.float16)
    if packing == "gptq":
        tensors = {"qweight": gptq_pack_rows(q, bits), "qzeros": gptq_pack_cols(z, bits), "scales": scales,
                   "g_idx": (np.arange(in_f) // group).astype(np.int32)}
    else:
        tensors = {"qweight": awq_pack(q), "qzeros": awq_pack(z), "scales": scales}
    return q, z, {f"model.layers.0.self_attn.q_proj.{k}": v for k, v in tensors.items()}


def _unpack(packing, kind, words, bits=4):
    if packing == "awq":
        return awq_unpack(words)
    return gptq_unpack_rows(words, bits) if kind == "qweight" else gptq_unpack_cols(words, bits)


@pytest.mark.framework
@pytest.mark.parametrize("packing,bits", [("gptq", 4), ("awq", 4), ("gptq", 2), ("gptq", 8)])
def test_flips_in_packed_words_land_on_the_elements_the_map_names(tmp_path, packing, bits):
    st = require("safetensors.numpy")
    rng = np.random.default_rng(3)
    q, z, tensors = _checkpoint(rng, packing, bits=bits)
    src, out = str(tmp_path / "model.safetensors"), str(tmp_path / "out.safetensors")
    st.save_file(tensors, src)
    lay = read_layout(src)
    by = {t.path.rsplit(".", 1)[1]: t for t in lay.tensors}
    assert {k: (t.role, t.layer) for k, t in by.items()} == {
        **{"qweight": ("weight", "model.layers.0.self_attn.q_proj"), "qzeros": ("zero", "model.layers.0.self_attn.q_proj"),
           "scales": ("scale", "model.layers.0.self_attn.q_proj")},
        **({"g_idx": ("other", "model.layers.0.self_attn.q_proj")} if packing == "gptq" else {})}
    found = {p.kind: p for p in detect_packing(lay.tensors)}
    assert {k: (p.packing, p.bits) for k, p in found.items()} == {"qweight": (packing, bits), "qzeros": (packing, bits)}
    res = inject_file(src, out, seed=11, sampling={"count": 24}, selection={"regex": ["qweight$|qzeros$"]})
    got = st.load_file(out)
    plan = res.log.plan
    for kind, before in (("qweight", q), ("qzeros", z)):
        path = f"/model.layers.0.self_attn.q_proj.{kind}"
        tid = [i for i, r in enumerate(plan.tensors) if r.name == path]
        sites = np.isin(plan.tensor, tid)
        masks = plan.xor_mask[sites].astype(np.uint64)
        word, bit = np.nonzero((masks[:, None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1))  # every flipped bit
        rows, cols, inner = packed_elements(packing, kind, by[kind].shape, plan.index[sites][word], bit, bits)
        expect = before.copy()
        np.bitwise_xor.at(expect, (rows, cols), (1 << inner).astype(np.uint8))
        after = _unpack(packing, kind, got[path[1:]], bits)
        assert np.array_equal(after, expect), kind  # exactly the named elements changed, by the named bit
        assert len(bit) or kind == "qzeros"


def test_packed_element_rules_and_errors():
    assert packed_element("gptq", "qweight", (4, 6), 5, 13) == (3, 5, 1)
    assert packed_element("gptq", "qzeros", (2, 3), 4, 31) == (1, 15, 3)
    assert [packed_element("awq", "qweight", (1, 1), 0, 4 * k)[1] for k in range(8)] == AWQ_PACK_ORDER
    assert packed_element("gptq", "qweight", (2, 3), 3, 9, bits=2) == (16 * 1 + 4, 0, 1)  # 16 values per word
    for bad in (dict(packing="exl2"), dict(kind="scales"), dict(bits=3), dict(packing="awq", bits=8),
                dict(index=24), dict(bit=32)):
        args = {"packing": "gptq", "kind": "qweight", "bits": 4, "index": 0, "bit": 0, **bad}
        with pytest.raises(OptionError):
            packed_element(args["packing"], args["kind"], (4, 6), args["index"], args["bit"], args["bits"])


@pytest.mark.framework
def test_inspect_names_the_packing(tmp_path, capsys):
    st = require("safetensors.numpy")
    rng = np.random.default_rng(5)
    src = str(tmp_path / "m.safetensors")
    _, _, gptq = _checkpoint(rng, "gptq")
    _, _, awq = _checkpoint(rng, "awq")
    st.save_file({**gptq, **{k.replace("q_proj", "k_proj"): v for k, v in awq.items()}}, src)
    assert main(["inspect", src]) == 0
    text = capsys.readouterr().out
    assert "zero [model.layers.0.self_attn.q_proj]" in text and "scale [model.layers.0.self_attn.k_proj]" in text
    assert describe(Packed("/model.layers.0.self_attn.q_proj.qweight", "qweight", "gptq")) in text
    assert describe(Packed("/model.layers.0.self_attn.k_proj.qzeros", "qzeros", "awq")) in text
    assert main(["inspect", "--json", src]) == 0
    assert '"packing": "awq"' in capsys.readouterr().out
