"""Activation faults in a GPT-2-sized model's attention: the attention block's output, the attention
probabilities (softmax), the sdpa output and the KV cache during generation.

Run: ``python examples/gpt2_activation_faults.py`` (CPU, a few seconds; the model is built from its config,
nothing is downloaded). docs/transformers.md ("Activation faults in attention") walks through it.
"""

from __future__ import annotations

import torch
import transformers

import fastflip

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                 bos_token_id=0, eos_token_id=0, pad_token_id=0)
model = transformers.GPT2LMHeadModel(config).eval()
prompts = torch.randint(1, 64, (4, 8), generator=torch.Generator().manual_seed(1))


def changed(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many prompts' next-token predictions differ."""
    return int((a.argmax(-1) != b.argmax(-1)).any(-1).sum())


with torch.no_grad():
    golden = model(prompts).logits

    # 1. The attention block's output: GPT2Attention returns (hidden states, weights); its first tensor is faulted.
    with fastflip.injected_activations(model, seed=1, count=1, bits="30", per_sample=True,
                                       selection=fastflip.Selection(layers=["transformer.h.*.attn"])) as log:
        out = model(prompts).logits
    print(f"attn outputs   {log.layers}: {changed(out, golden)}/4 prompts changed")

    # 2. Attention probabilities: the first softmax inside layer 0's attention (eager attention computes it).
    model.set_attn_implementation("eager")
    with fastflip.injected_activations(model, seed=2, count=1, bits="30", per_sample=True,
                                       selection=fastflip.Selection(layers=["transformer.h.0.attn:softmax"])) as log:
        out = model(prompts).logits
    r = log.records()[0]
    print(f"softmax        {log.layers[0]} {log.shapes[0]} (heads, query, key): sample {r['sample']} element "
          f"{r['index']} bit {r['bits']} {r['old']:#010x} -> {r['new']:#010x}; {changed(out, golden)}/4 changed")

    # 3. With sdpa (transformers' default) the softmax is fused: fault the sdpa output instead.
    model.set_attn_implementation("sdpa")
    with fastflip.injected_activations(model, seed=3, count=1, bits="30", per_sample=True,
                                       selection=fastflip.Selection(layers=["transformer.h.*.attn:sdpa"])) as log:
        out = model(prompts).logits
    print(f"sdpa outputs   {log.layers}: {changed(out, golden)}/4 prompts changed")

    # 4. The KV cache during generation: layer 0's cached values at step 3 (forward 3 of generate), which every
    #    later step reads.
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    clean = model.generate(prompts, **kw)
    with fastflip.injected_activations(model, seed=4, count=1, bits="30", per_sample=True, forward=3,
                                       selection=fastflip.Selection(layers=["transformer.h.0.attn:cache.value"])) as log:
        faulted = model.generate(prompts, **kw)
    differ = (faulted != clean).any(-1).sum().item()
    print(f"KV cache       {log.layers[0]} {log.shapes[0]} at forward {sorted(set(log.forward.tolist()))}: "
          f"{differ}/4 generations differ")
    assert log.forwards == 6 and set(log.forward.tolist()) == {3}
