"""Activation faults where transformers compute: tuple/ModelOutput outputs, softmax, matmul, sdpa and the KV cache.

Every fault is checked against the same fault applied by hand (a forward hook, a patched torch function or a
patched cache layer that flips the logged bit of the logged element), comparing logits exactly. Models are built
from tiny configs (no downloads).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from typing import Any, Callable

import numpy as np
import pytest

from conftest import require
import fastflip
from fastflip.errors import OptionError
from fastflip.core.spec import Sampling

pytestmark = pytest.mark.framework
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpt2(attn: str = "eager") -> Any:
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.set_attn_implementation(attn)
    return model


def bert() -> Any:
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                                  vocab_size=64, max_position_embeddings=32)
    return transformers.BertModel(cfg).eval()


def vit() -> Any:
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                                 image_size=16, patch_size=8, num_channels=3)
    return transformers.ViTModel(cfg).eval()


def tokens(batch: int = 3, length: int = 7) -> Any:
    torch = require("torch")
    return torch.randint(1, 64, (batch, length), generator=torch.Generator().manual_seed(5))


def by_hand(t: Any, records: list[dict], name: str) -> Any:
    """Apply to ``t`` (batch-major float32), in place, each logged fault of target ``name``: old word ^ bits."""
    torch = require("torch")
    n = t[0].numel()
    flat = t.contiguous().clone()
    words = flat.view(-1).view(torch.int32)
    hits = [r for r in records if r["layer"] == name]
    for r in hits:
        pos = r["sample"] * n + r["index"]
        old = int(words[pos]) & 0xFFFFFFFF
        new = old ^ sum(1 << b for b in r["bits"])
        assert old == r["old"] and new == r["new"]
        words[pos] = int(np.uint32(new).view(np.int32))
    t.copy_(flat)  # in place, whatever the strides
    return len(hits)


def same(a: Any, b: Any) -> bool:
    """Bit-identical float32 tensors (NaN included)."""
    torch = require("torch")
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def output(out: Any) -> Any:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("make, glob, first", [
    (gpt2, "transformer.h.*.attn", "transformer.h.0.attn"),
    (bert, "encoder.layer.*.attention.self", "encoder.layer.0.attention.self"),
    (vit, "layers.*.attention", "layers.0.attention"),
])
def test_tuple_outputs_fault_their_first_tensor_like_a_hook_by_hand(make: Callable, glob: str, first: str) -> None:
    torch = require("torch")
    model = make()
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2)) if make is vit else tokens()
    with torch.no_grad():
        clean = output(model(x))
        with fastflip.injected_activations(model, seed=11, count=2, bits="22-27", per_sample=True,
                                           selection=fastflip.Selection(layers=[glob])) as log:
            faulted = output(model(x))
    names = [first.replace(".0.", f".{i}.") + ":out.0" for i in range(2)]
    assert log.layers == names and len(log) == 6 and set(log.sample.tolist()) == {0, 1, 2}
    records = log.records()

    def hook(name: str) -> Callable:
        def fault(_m: Any, _a: Any, out: Any) -> Any:
            first = out[0].contiguous().clone()
            by_hand(first, records, name)
            return (first, *out[1:])
        return fault

    handles = [model.get_submodule(n.split(":")[0]).register_forward_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            hand = output(model(x))
    finally:
        for h in handles:
            h.remove()
    assert same(faulted, hand) and not same(faulted, clean)


def counting(monkeypatch: Any, owner: Any, attr: str, faults: dict[int, Callable]) -> None:
    """Patch ``owner.attr`` so that its ``k``-th call's output goes through ``faults[k]``."""
    orig = getattr(owner, attr)
    calls = [0]

    def patched(*a: Any, **k: Any) -> Any:
        out = orig(*a, **k)
        f = faults.get(calls[0])
        calls[0] += 1
        if f is not None:
            f(out)
        return out

    monkeypatch.setattr(owner, attr, patched)


def test_softmax_and_matmul_inside_eager_attention_match_patched_functions(monkeypatch: Any) -> None:
    torch = require("torch")
    model, x = gpt2("eager"), tokens()
    sel = fastflip.Selection(layers=["transformer.h.1.attn:softmax", "transformer.h.0.attn:matmul"])
    with torch.no_grad():
        clean = model(x).logits
        with fastflip.injected_activations(model, seed=4, count=1, bits="30", per_sample=True, selection=sel) as log:
            faulted = model(x).logits
    assert log.layers == ["transformer.h.0.attn:matmul", "transformer.h.0.attn:matmul#1",
                          "transformer.h.1.attn:softmax"]
    assert log.shapes == [(2, 7, 7), (2, 7, 16), (2, 7, 7)]  # scores (heads, T, T), context (heads, T, head_dim)
    records = log.records()
    # by hand: torch.matmul calls 0 and 1 are layer 0's (scores, context); softmax call 1 is layer 1's probabilities
    counting(monkeypatch, torch, "matmul", {0: lambda o: by_hand(o, records, "transformer.h.0.attn:matmul"),
                                            1: lambda o: by_hand(o, records, "transformer.h.0.attn:matmul#1")})
    counting(monkeypatch, torch.nn.functional, "softmax",
             {1: lambda o: by_hand(o, records, "transformer.h.1.attn:softmax")})
    with torch.no_grad():
        hand = model(x).logits
    assert same(faulted, hand) and not same(faulted, clean)


def test_sdpa_output_matches_a_patched_sdpa_and_softmax_is_not_reachable_there(monkeypatch: Any) -> None:
    torch = require("torch")
    model, x = gpt2("sdpa"), tokens()
    with torch.no_grad():
        clean = model(x).logits
        with fastflip.injected_activations(model, seed=6, count=3, bits="23-30", selection=fastflip.Selection(
                layers=["transformer.h.*.attn:sdpa"])) as log:
            faulted = model(x).logits
        assert log.layers == ["transformer.h.0.attn:sdpa", "transformer.h.1.attn:sdpa"]
        assert log.shapes == [(2, 7, 16)] * 2
        with pytest.raises(OptionError, match=r"transformer\.h\.0\.attn:softmax never ran"):
            with fastflip.injected_activations(model, seed=6, count=1, selection=fastflip.Selection(
                    layers=["transformer.h.0.attn:softmax"])):
                model(x)
    records = log.records()
    counting(monkeypatch, torch.nn.functional, "scaled_dot_product_attention",
             {i: (lambda o, i=i: by_hand(o, records, f"transformer.h.{i}.attn:sdpa")) for i in range(2)})
    with torch.no_grad():
        hand = model(x).logits
    assert same(faulted, hand) and not same(faulted, clean)


def greedy(model: Any, x: Any, steps: int, before: Callable[[int, Any], None] | None = None) -> tuple[Any, Any, Any]:
    """Manual greedy decoding with a DynamicCache: (tokens, logits of every step, the cache)."""
    torch = require("torch")
    transformers = require("transformers")
    cache, ids, inp, logits = transformers.DynamicCache(), x, x, []
    with torch.no_grad():
        for step in range(steps):
            if before is not None:
                before(step, cache)
            lg = model(inp, cache=cache, use_cache=True).logits[:, -1]
            logits.append(lg)
            inp = lg.argmax(-1, keepdim=True)
            ids = torch.cat([ids, inp], 1)
    return ids, torch.stack(logits), cache


def test_kv_cache_fault_at_one_step_persists_like_a_patched_cache_layer() -> None:
    torch = require("torch")
    model, x = gpt2("eager"), tokens(length=5)
    clean_ids, clean, _ = greedy(model, x, 5)
    sel = fastflip.Selection(layers=["transformer.h.0.attn:cache.key"])
    with fastflip.injected_activations(model, seed=2, count=1, bits="30", per_sample=True, forward=2,
                                       selection=sel) as log:
        ids, faulted, cache = greedy(model, x, 5)
    assert log.layers == ["transformer.h.0.attn:cache.key"] and log.shapes == [(2, 7, 16)]  # 5 prompt + 2 steps
    assert set(log.forward.tolist()) == {2} and log.forwards == 5 and len(log) == 3
    records = log.records()
    for r in records:  # the fault stays in the cache that the later steps read
        head, pos, d = np.unravel_index(r["index"], (2, 7, 16))
        w = cache.layers[0].keys[r["sample"], head, pos, d].view(torch.int32)
        assert int(w) & 0xFFFFFFFF == r["new"]

    def before(step: int, c: Any) -> None:  # by hand: layer 0's cache update of step 2 flips the logged keys
        if step != 2:
            return
        layer, orig = c.layers[0], c.layers[0].update

        def update(*a: Any, **k: Any) -> Any:
            keys, values = orig(*a, **k)
            by_hand(keys, records, "transformer.h.0.attn:cache.key")
            del layer.update
            return keys, values
        layer.update = update

    hand_ids, hand, _ = greedy(model, x, 5, before)
    assert torch.equal(faulted, hand) and torch.equal(ids, hand_ids)
    assert torch.equal(faulted[:2], clean[:2]) and not torch.equal(faulted[2:], clean[2:])
    assert not torch.equal(faulted[3:], clean[3:])  # later steps read the faulted cache


def test_kv_cache_values_during_generate_match_a_patched_dynamic_layer(monkeypatch: Any) -> None:
    torch = require("torch")
    transformers = require("transformers")
    model, x = gpt2("sdpa"), tokens(length=5)
    kw = dict(max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        clean = model.generate(x, **kw)
        with fastflip.injected_activations(model, seed=8, count=2, bits="22-27", forward=1, selection=fastflip.Selection(
                layers=["transformer.h.1.attn:cache.value"])) as log:
            faulted = model.generate(x, **kw)
    assert log.layers == ["transformer.h.1.attn:cache.value"] and log.shapes == [(2, 6, 16)]
    records = log.records()
    # by hand: DynamicLayer.update calls run layer 0, layer 1 per forward: call 3 is layer 1's in forward 1
    orig = transformers.cache_utils.DynamicLayer.update
    calls = [0]

    def update(self: Any, *a: Any, **k: Any) -> Any:
        keys, values = orig(self, *a, **k)
        if calls[0] == 3:
            by_hand(values, records, "transformer.h.1.attn:cache.value")
        calls[0] += 1
        return keys, values

    monkeypatch.setattr(transformers.cache_utils.DynamicLayer, "update", update)
    with torch.no_grad():
        hand = model.generate(x, **kw)
    assert same(torch.stack(faulted.scores), torch.stack(hand.scores))
    assert torch.equal(faulted.sequences, hand.sequences)
    assert not same(torch.stack(faulted.scores), torch.stack(clean.scores))


def test_a_broad_glob_over_bert_layers_leaves_out_what_has_no_tensor_and_says_so_once() -> None:
    torch = require("torch")
    model, x = bert(), tokens()
    sel = fastflip.Selection(layers=["encoder.layer.*", "encoder.layer.*.attention.self:out.1", "encoder"])
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fastflip.injected_activations(model, seed=1, count=1, selection=sel) as log:
            model(x)
            model(x)
    said = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert len(said) == 1  # sdpa attention returns (context, None): element 1 is not a tensor
    assert "encoder.layer.0.attention.self:out.1 element 1 of its tuple output is a NoneType" in said[0]
    assert "encoder.layer.0.attention.self.dropout (never ran)" in said[0]  # eval-mode sdpa skips it
    assert {"encoder.layer.0.attention.self:out.0", "encoder.layer.1.attention:out.0", "encoder.layer.1",
            "encoder:out.last_hidden_state"} <= set(log.layers)
    assert not any(n.endswith((":out.1", "self.dropout")) for n in log.layers)
    assert log.forwards == 2 and len(log) == 2 * 3
    with pytest.raises(OptionError, match=r"layer encoder\.layer\.0\.attention\.self:out\.1 element 1 .* NoneType"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(
                layers=["encoder.layer.0.attention.self:out.1"])):
            model(x)
    with pytest.raises(OptionError, match=r"after ':' give out\.INDEX"):
        fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(
            layers=["encoder:out-1"])).__enter__()


def test_model_output_elements_by_key_or_position_name_the_same_element() -> None:
    torch = require("torch")
    model, x = bert(), tokens()
    runs = {}
    for what in ("encoder", "encoder:out.last_hidden_state", "encoder:out.0"):
        with torch.no_grad(), fastflip.injected_activations(model, seed=3, count=1, selection=fastflip.Selection(
                layers=[what])) as log:
            runs[what] = model(x).pooler_output
        runs[what + " log"] = (log.layers, log.records())
    assert runs["encoder log"][0] == ["encoder:out.last_hidden_state"] == runs["encoder:out.last_hidden_state log"][0]
    assert runs["encoder:out.0 log"][0] == ["encoder:out.0"]
    assert torch.equal(runs["encoder"], runs["encoder:out.0"])
    assert torch.equal(runs["encoder"], runs["encoder:out.last_hidden_state"])


def test_one_call_selected_by_number_and_a_fixed_plan_of_it_match_a_patched_matmul(monkeypatch: Any) -> None:
    torch = require("torch")
    from fastflip.core.sampling import SiteSpace
    from fastflip.live.activations import layer_outputs

    model, x = gpt2("eager"), tokens()
    sel = fastflip.Selection(layers=["transformer.h.0.attn:matmul#1"])  # the context p @ v, not the scores
    with torch.no_grad():
        clean = model(x).logits
        refs = layer_outputs(model, lambda: model(x), sel)
        assert [(r.name, r.shape) for r in refs] == [("transformer.h.0.attn:matmul#1", (2, 7, 16))]
        plan = SiteSpace(refs, bits="30").plan(Sampling(count=2), seed=9)  # a campaign trial's plan: every sample
        with fastflip.injected_activations(model, 9, plan=plan) as log:
            faulted = model(x).logits
        with pytest.raises(OptionError, match=r"transformer\.h\.0\.attn:matmul#2 never ran: .* ran 2 time"):
            layer_outputs(model, lambda: model(x), fastflip.Selection(layers=["transformer.h.0.attn:matmul#2"]))
    assert log.layers == ["transformer.h.0.attn:matmul#1"] and len(log) == 2 * 3
    records = log.records()
    counting(monkeypatch, torch, "matmul", {1: lambda o: by_hand(o, records, "transformer.h.0.attn:matmul#1")})
    with torch.no_grad():
        hand = model(x).logits
    assert same(faulted, hand) and not same(faulted, clean)


def test_one_output_named_twice_is_faulted_once_and_forward_must_exist() -> None:
    torch = require("torch")
    model, x = gpt2("eager"), tokens()
    runs = []
    for layers in (["transformer.h.0.attn"], ["transformer.h.0.attn", "transformer.h.0.attn:out.0"]):
        with torch.no_grad(), fastflip.injected_activations(model, seed=5, count=1, bits="30", selection=fastflip.Selection(
                layers=layers)) as log:
            runs.append((model(x).logits, log.layers, log.records()))
    assert same(runs[0][0], runs[1][0]) and runs[0][1:] == runs[1][1:] == (["transformer.h.0.attn:out.0"], runs[0][2])
    with pytest.raises(OptionError, match=r"forward=2 but the GPT2LMHeadModel ran 2 forward\(s\)"):
        with torch.no_grad(), fastflip.injected_activations(model, seed=5, count=1, forward=2, selection=fastflip.Selection(
                layers=["transformer.h.0.attn"])):
            model(x)
            model(x)


@pytest.mark.slow
def test_gpt2_activation_example_runs() -> None:
    require("torch")
    require("transformers")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "gpt2_activation_faults.py")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "KV cache" in res.stdout and "softmax" in res.stdout
