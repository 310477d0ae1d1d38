"""Bit flips in quantized models: torchao int8 live, a torch.ao quantized state_dict file, a GPTQ int4 checkpoint.

Run it (CPU, a few seconds, nothing downloaded: the model is built from its config)::

    python examples/quantized_model.py

1. A small Llama built from its config, its linear layers quantized by torchao (``Int8WeightOnlyConfig``):
   fastflip reaches each quantized weight's inner tensors (``<layer>.weight.qdata`` int8 words, role
   ``weight``; ``.scale``, role ``scale``; ``.zero_point``, role ``zero``), flips int8 words live and reverts
   them bit for bit.
2. The same float model quantized by ``torch.ao.quantization.quantize_dynamic`` and saved as a state_dict:
   its qint8 weights are read as int8 words, injected in the file, and ``torch.load(weights_only=True)`` sees
   exactly the logged flips in ``int_repr()``; the log reverts the file.
3. A GPTQ-style safetensors layer (4-bit values packed 8 per int32 word): a site is a bit of a word;
   :func:`fastflip.files.packing.packed_element` names the logical element it belongs to.
"""

from __future__ import annotations

import copy
import os
import tempfile
import warnings

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from torchao.quantization import Int8WeightOnlyConfig, quantize_
from transformers import LlamaConfig, LlamaForCausalLM

import fastflip
from fastflip.live import targets
from fastflip.files.filebytes import sha256_file
from fastflip.files.layout import read_layout
from fastflip.files.packing import detect_packing, packed_element


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg).eval()


def next_tokens(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.argmax(-1)


def torchao_live(float_model: torch.nn.Module, ids: torch.Tensor) -> None:
    model = copy.deepcopy(float_model)
    quantize_(model, Int8WeightOnlyConfig())
    tg = targets(model)  # build once: every trial reuses it
    roles = {t.name: t.role for t in tg.tensors}
    q = "model.layers.0.self_attn.q_proj.weight"
    print(f"{q}: qdata {roles[q + '.qdata']}, scale {roles[q + '.scale']}, zero_point {roles[q + '.zero_point']}")
    clean = next_tokens(model, ids)
    qdata = model.model.layers[0].self_attn.q_proj.weight.qdata
    before = qdata.clone()
    # 100 flips of int8 bit 6 or 7 (value 64, or the sign) in the quantized words of every weight
    with fastflip.injected(tg, seed=4, count=100, bits="6-7", roles=["weight"]) as log:
        faulty = next_tokens(model, ids)
    print(f"torchao int8: {len(log)} words flipped, {int((faulty != clean).sum())} of {clean.numel()} "
          "next-token predictions changed")
    assert torch.equal(qdata, before) and torch.equal(next_tokens(model, ids), clean)  # reverted bit for bit


def quantized_state_dict_file(float_model: torch.nn.Module, folder: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(float_model), {torch.nn.Linear},
                                                       dtype=torch.qint8)
    src, out = os.path.join(folder, "q.pt"), os.path.join(folder, "q_faulty.pt")
    torch.save(model.state_dict(), src)
    key = "model.layers.0.mlp.down_proj._packed_params._packed_params"
    t = {t.path: t for t in read_layout(src).tensors}["/" + key + "/0"]
    print(f"/{key}/0: {t.dtype} {t.shape}, role {t.role}, layer {t.layer}")
    res = fastflip.inject_file(src, out, seed=2, sampling={"count": 5}, selection={"roles": ["weight"],
                                                                               "layers": ["model.layers.0.*"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = torch.load(src, weights_only=True)
        after = torch.load(out, weights_only=True)
    plan = res.log.plan
    names = [plan.tensors[i].name for i in plan.tensor]
    for name, index, old, new in zip(names, plan.index, res.log.old_words, res.log.new_words):
        k = name.lstrip("/").rsplit("/", 1)[0]
        w0, w1 = before[k][0].int_repr().flatten(), after[k][0].int_repr().flatten()
        assert int(w0[index]) & 0xFF == old and int(w1[index]) & 0xFF == new  # torch reads the logged words
    fastflip.revert(res.log_path, out)
    assert sha256_file(out) == sha256_file(src)
    print(f"quantize_dynamic state_dict: {len(res.log)} int8 words flipped in the file, torch.load agrees, reverted")


def gptq_checkpoint(folder: str) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 16, (64, 16), dtype=np.uint32)  # the [in, out] 4-bit matrix
    qweight = np.zeros((8, 16), dtype=np.uint32)
    for k in range(8):  # GPTQ: 8 consecutive input rows in one word, row 8i+k in bits 4k..4k+3
        qweight |= values[k::8] << np.uint32(4 * k)
    layer = "model.layers.0.self_attn.q_proj"
    src, out = os.path.join(folder, "gptq.safetensors"), os.path.join(folder, "gptq_faulty.safetensors")
    save_file({f"{layer}.qweight": qweight.view(np.int32), f"{layer}.scales": np.ones((1, 16), np.float16),
               f"{layer}.qzeros": np.full((1, 2), 0x88888888, np.uint32).view(np.int32)}, src)
    layout = read_layout(src)
    print("roles:", {t.path.rsplit(".", 1)[1]: t.role for t in layout.tensors})
    (packed, _zeros) = detect_packing(layout.tensors)
    res = fastflip.inject_file(src, out, seed=1, sampling={"count": 1}, selection={"include": ["*qweight"]})
    word, mask = int(res.log.plan.index[0]), int(res.log.plan.xor_mask[0])
    bit = mask.bit_length() - 1
    row, col, vbit = packed_element(packed.packing, "qweight", qweight.shape, word, bit)
    i, j = (int(n) for n in np.unravel_index(word, qweight.shape))
    print(f"{packed.packing}: word ({i}, {j}) bit {bit} -> element ({row}, {col}), "
          f"bit {vbit} of its 4-bit value")
    got = load_file(out)[f"{layer}.qweight"].view(np.uint32)
    assert (int(got.flat[word] >> np.uint32(4 * (bit // 4))) & 15) == int(values[row, col]) ^ (1 << vbit)


def main() -> None:
    float_model = tiny_llama()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    torchao_live(float_model, ids)
    with tempfile.TemporaryDirectory() as folder:
        quantized_state_dict_file(float_model, folder)
        gptq_checkpoint(folder)


if __name__ == "__main__":
    main()
