"""The LLMs researchers study now, built from tiny configs (no downloads), attacked live and in files.

Llama (grouped-query attention: 4 query heads, 2 key/value heads; rotary; RMSNorm), Qwen2 (q/k/v biases),
Mistral (sliding window), Gemma (lm_head tied to the scaled embedding) and T5 (encoder-decoder; one shared
embedding tied to the encoder, the decoder and lm_head; relative position bias), in float32 and bfloat16:

- live weights: exactly the words ``state_dict()`` shows change, under every name of a tied tensor (one tensor,
  flipped once); the revert gives back every word and the logits bit for bit;
- live activations: each fault equals the same bit of the same element of the same output applied by a forward
  hook written here (or a patched ``DynamicLayer.update`` for ``:cache.key``/``:cache.value``), in
  ``model(ids)`` (logits and every cached key/value) and in ``model.generate(..., max_new_tokens=3)`` with its
  cache; what cannot be reached is refused in one line;
- files: a ``save_pretrained`` directory in small shards is read as ``safetensors`` and ``from_pretrained`` read
  it (the tied names absent from the file are the ones fastflip does not list), injected through the CLI and
  judged by ``from_pretrained``, reverted bit for bit;
- a campaign over a Llama with the language-model evaluator leaves the model's words as they were.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import fastflip
from attack_check import verdict
from conftest import require, snapshot
from fastflip import live
from fastflip.cli import main
from fastflip.errors import OptionError
from fastflip.files.layout import read_layout
from fastflip.files.log import InjectionLog
from format_builders import copy_checkpoint
from framework_views import dir_view
from hf_helpers import build
from test_attack_live_torch import _agrees

pytestmark = pytest.mark.framework

FAMILIES = ["llama", "qwen2", "mistral", "gemma", "t5"]
# the tensor every tied name reaches, and the tied names (absent from a save_pretrained directory)
SHARED = {"gemma": "model.embed_tokens.weight", "t5": "shared.weight"}
TIED = {"gemma": {"lm_head.weight"}, "t5": {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                                            "lm_head.weight"}}


def _model(name: str, dtype: str = "float32") -> Any:
    torch = require("torch")
    require("transformers")
    return build(name).to(getattr(torch, dtype))


def _ids(batch: int = 2, length: int = 6) -> Any:
    torch = require("torch")
    return torch.randint(3, 96, (batch, length), generator=torch.Generator().manual_seed(1))


def _words(t: Any) -> np.ndarray:
    """The stored words of a torch tensor (2-, 4- or 8-byte items), flat."""
    torch = require("torch")
    w = t.detach().contiguous().reshape(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return w.numpy().view(f"u{t.element_size()}")


def _same(a: Any, b: Any) -> bool:
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and np.array_equal(_words(a), _words(b))


def _forward(model: Any, name: str, ids: Any) -> list[Any]:
    """The logits of ``model(ids)`` with a cache, and every key and value the cache holds after it."""
    kw = {"decoder_input_ids": ids[:, :3]} if name == "t5" else {}
    out = model(ids, use_cache=True, **kw)
    cache = out.cache
    parts = [cache.self_attention_cache, cache.cross_attention_cache] if name == "t5" else [cache]
    return [out.logits] + [t for c in parts for layer in c.layers for t in (layer.keys, layer.values)]


def _generate(model: Any, ids: Any, **kw: Any) -> list[Any]:
    """Greedy ``generate`` of 3 tokens with the cache: every step's scores and the sequences."""
    g = model.generate(ids, max_new_tokens=3, do_sample=False, use_cache=True, output_scores=True,
                       return_dict_in_generate=True, **kw)
    return [*g.scores, g.sequences]


# ------------------------------------------------------------------------------------------------ live weights

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", FAMILIES)
def test_live_weights_flip_the_words_state_dict_shows_tied_once_and_revert_exactly(name: str, dtype: str) -> None:
    torch = require("torch")
    model = _model(name, dtype)
    tg = live.targets(model)
    live_names = {t.name for t in tg.tensors}
    assert set(model.state_dict()) <= live_names | {a for t in tg.tensors for a in t.aliases}
    head = SHARED.get(name, "lm_head.weight")
    if name in TIED:  # one tensor, saying which names it is tied to, as for GPT-2
        assert TIED[name] <= set(tg.get(head).aliases) and not TIED[name] & live_names
    ids = _ids()
    with torch.no_grad():
        clean = _forward(model, name, ids)[0]
    _agrees(model, count=48, seed=5)
    plan = _agrees(model, count=16, layers=["lm_head"])  # a tied lm_head is the shared tensor
    assert {t.name for t in plan.tensors} == {head}
    log = live.inject(tg, live.plan_for(tg, seed=2, count=4, bits="14" if dtype == "bfloat16" else "30",
                                       layers=["lm_head"]))
    with torch.no_grad():
        faulted = _forward(model, name, ids)[0]
    live.revert(tg, log)
    with torch.no_grad():
        back = _forward(model, name, ids)[0]
    assert not _same(faulted, clean) and _same(back, clean)


# ------------------------------------------------------------------------------------------- live activations

def _xor(t: Any, records: list[dict]) -> Any:
    """A copy of ``t`` (batch-major) with each record's bits XORed into its element (checking the logged words)."""
    torch = require("torch")
    out = t.detach().contiguous().clone()
    w = out.view(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    n, size = t[0].numel(), t.element_size()
    for r in records:
        pos = r["sample"] * n + r["index"]
        old = int(w[pos]) & ((1 << 8 * size) - 1)
        new = old ^ sum(1 << b for b in r["bits"])
        assert (old, new) == (r["old"], r["new"]), r
        w[pos] = int(np.array(new, f"u{size}").view(f"i{size}"))
    return out


@contextlib.contextmanager
def _by_hand(model: Any, records: list[dict]) -> Iterator[None]:
    """The logged faults applied by hand, at their forward: a forward hook on each target module, registered
    before its other hooks (transformers' capture of ``output_attentions`` then sees the fault, as it sees
    fastflip's, written into the output's own memory), XORs them into its output (``MODULE:out.K``: element ``K``
    of a tuple); for ``MODULE:cache.key|value`` the ``update`` of ``DynamicLayer``, ``StaticLayer`` and their
    sliding-window subclasses is patched to XOR them, in place, into what the update of that module's layer
    returns: the layer's cache (self-attention, or for T5's ``EncDecAttention`` the cross-attention cache), which
    the later steps read."""
    torch = require("torch")
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

    st: dict[str, Any] = {"forward": -1}

    def count(_m: Any, _a: tuple, _k: dict) -> None:
        st["forward"] += 1

    def cache_of(target: str) -> Any:  # the Cache the module is called with (the model may make it itself)
        def hook(_m: Any, _a: tuple, kwargs: dict) -> None:
            st[target] = next((v for v in kwargs.values() if type(v).__name__.endswith("Cache")), None)
        return hook

    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["layer"], []).append(r)
    now = {k: (lambda rs=rs: [r for r in rs if r["forward"] == st["forward"]]) for k, rs in by.items()}
    handles = [model.register_forward_pre_hook(count, with_kwargs=True)]
    caches = {}
    for target in by:
        module, _, what = target.partition(":")
        if what.startswith("cache."):
            caches[target] = (model.get_submodule(module), "EncDecAttention" in module, what == "cache.value")
            handles.append(model.get_submodule(module).register_forward_pre_hook(cache_of(target), with_kwargs=True))
            continue

        def hook(_m: Any, _a: tuple, out: Any, target: str = target, what: str = what) -> Any:
            hits = now[target]()
            if not hits:
                return None
            if isinstance(out, torch.Tensor):
                return _xor(out, hits)
            k = int(what.split(".")[1])
            return (*out[:k], _xor(out[k], hits), *out[k + 1:])
        handles.append(model.get_submodule(module).register_forward_hook(hook, prepend=True))

    def patched(orig: Any) -> Any:
        def update(self: Any, *a: Any, **k: Any) -> Any:
            pair = list(orig(self, *a, **k))
            for target, (module, cross, part) in caches.items():
                cache = st.get(target)
                cache = getattr(cache, "cross_attention_cache" if cross else "self_attention_cache", cache)
                hits = now[target]()
                if hits and cache is not None and self is cache.layers[module.layer_idx]:
                    # into the cache itself: the later steps read it
                    pair[part].copy_(_xor(pair[part], hits))
            return tuple(pair)
        return update

    classes = [DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer]
    saved = [c.__dict__["update"] for c in classes]
    for c, orig in zip(classes, saved):
        c.update = patched(orig)
    try:
        yield
    finally:
        for c, orig in zip(classes, saved):
            c.update = orig
        for h in handles:
            h.remove()


# (model, target, forward): forward None is model(ids); k is generate's forward k (the step making token k)
_DECODER = ["self_attn", "mlp", "input_layernorm", "self_attn.k_proj", "self_attn.v_proj"]
CASES = [("llama", f"model.layers.{i % 2}.{t}", f) for i, t in enumerate(_DECODER) for f in (None, 0 if i > 2 else 2)]
CASES += [("llama", t, f) for t in ("model.layers.0", "model.norm", "model.embed_tokens") for f in (None, 1)]
CASES += [("llama", "model.layers.0.self_attn:cache.key", 1), ("llama", "model.layers.1.self_attn:cache.value", 0)]
CASES += [(n, f"model.layers.{i % 2}.{t}", f) for n in ("qwen2", "mistral", "gemma")
          for i, t in enumerate(("self_attn", "mlp", "post_attention_layernorm", "self_attn.v_proj"))
          for f in (None, i % 2)]
CASES += [(n, "model.layers.0.self_attn:cache.key", 2) for n in ("qwen2", "mistral", "gemma")]
CASES += [("gemma", "model.embed_tokens", None)]
_T5 = ["decoder.block.0.layer.0.SelfAttention", "decoder.block.1.layer.1.EncDecAttention",
       "decoder.block.0.layer.1.EncDecAttention.k", "decoder.block.0.layer.2.DenseReluDense",
       "decoder.block.1.layer.0.layer_norm"]
CASES += [("t5", t, f) for t in _T5 for f in (None, 0)] + [("t5", _T5[0], 2), ("t5", _T5[1], 1)]
CASES += [("t5", t, None) for t in ("encoder.block.0.layer.0.SelfAttention", "encoder.block.1.layer.1.DenseReluDense",
                                    "encoder.final_layer_norm")]
CASES += [("t5", "decoder.block.0.layer.0.SelfAttention:cache.value", 1),
          ("t5", "decoder.block.1.layer.1.EncDecAttention:cache.key", 0)]


# bfloat16: every model(ids) case, and Llama's KV-cache faults in generate
CASES = [(*c, d) for c in CASES for d in ("float32", "bfloat16")
         if d == "float32" or (c[2] is None and "cache." not in c[1]) or (c[0] == "llama" and "cache." in c[1])]


@pytest.mark.parametrize("name, target, forward, dtype", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_activation_faults_equal_a_hook_by_hand_in_forward_and_generate(name: str, target: str, forward: int | None,
                                                                        dtype: str) -> None:
    """The logits (and every cached key/value) of ``model(ids)``, or the scores and tokens of ``generate`` with
    ``forward=k``, equal the same faults applied by hand, bit for bit, and differ from the fault-free run."""
    torch = require("torch")
    model, ids = _model(name, dtype), _ids()
    run = (lambda: _forward(model, name, ids)) if forward is None else (lambda: _generate(model, ids))
    with torch.no_grad():
        clean = run()
        with fastflip.injected_activations(model, seed=3, count=2, bits="8-14" if dtype == "bfloat16" else "20-30",
                                           per_sample=True, forward=forward,
                                           selection=fastflip.Selection(layers=[target])) as log:
            faulted = run()
        assert len(log) == 4  # 2 sites in each of 2 samples
        assert {r["forward"] for r in log.records()} == {forward or 0}
        with _by_hand(model, log.records()):
            hand = run()
    assert len(faulted) == len(hand) and all(_same(a, b) for a, b in zip(faulted, hand))
    assert not all(_same(a, b) for a, b in zip(faulted, clean))


@pytest.mark.parametrize("name, target", [("t5", "encoder.block.0.layer.0.SelfAttention:out.1"),
                                          ("llama", "model.rotary_emb")])
def test_an_output_the_batch_shares_is_refused_per_sample_and_faulted_for_all_samples_otherwise(name: str,
                                                                                                 target: str) -> None:
    """T5's relative position bias and Llama's rotary tables have a batch dimension of 1, shared by every sample:
    per-sample faults there are refused in one line (one sample's fault would reach all); with per_sample=False the
    fault is the hook's by hand, in every sample."""
    torch = require("torch")
    model, ids = _model(name), _ids()
    sel = fastflip.Selection(layers=[target])
    with pytest.raises(OptionError) as err, torch.no_grad():
        with fastflip.injected_activations(model, seed=3, count=2, bits="20-30", per_sample=True, selection=sel):
            _forward(model, name, ids)
    assert "\n" not in str(err.value) and "per_sample=False" in str(err.value)
    with torch.no_grad():
        clean = _forward(model, name, ids)
        with fastflip.injected_activations(model, seed=3, count=2, bits="20-30", selection=sel) as log:
            faulted = _forward(model, name, ids)
        assert len(log) == 2 and set(log.sample.tolist()) == {0}
        with _by_hand(model, log.records()):
            hand = _forward(model, name, ids)
    assert all(_same(a, b) for a, b in zip(faulted, hand)) and not all(_same(a, b) for a, b in zip(faulted, clean))


def _batch_of_one(case: str) -> tuple[Any, Callable[[], Any], str]:
    """A forward of one sample with another input of two or more dimensions whose first dimension is not the
    batch (an (S, S) attention mask, positional or by keyword; BERT's (layers, heads) ``head_mask``), or a GRU whose
    ``h_n`` (``out.1``, (layers, batch, hidden)) has one layer: the model, its call and a target."""
    torch = require("torch")
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    if case == "bert":
        from transformers import BertConfig, BertModel

        bert = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=32)).eval()
        ids = torch.randint(0, 64, (1, 7), generator=gen)
        return bert, lambda: bert(ids, head_mask=torch.ones(2, 2)).last_hidden_state, "encoder.layer.0.output.dense"
    if case == "gru":
        rnn = nn.Sequential()
        rnn.gru = nn.GRU(4, 6, num_layers=1, batch_first=True)
        xs = torch.randn(3, 5, 4, generator=gen)
        return rnn, lambda: rnn(xs)[1], "gru:out.1"
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1).eval()
    x, mask = torch.randn(1, 5, 8, generator=gen), torch.zeros(5, 5)
    return enc, (lambda: enc(x, mask)) if case == "mask" else (lambda: enc(x, mask=mask)), "layers.0.linear1"


@pytest.mark.parametrize("case", ["mask", "mask=", "bert", "gru"])
def test_a_batch_of_one_beside_a_non_batch_input_is_faulted_per_sample_as_a_hook_by_hand(case: str) -> None:
    """The forward's batch is its first input's (the ids, the pixels), not the largest first dimension of its
    inputs: per-sample faults of a batch of 1 beside an (S, S) mask or BERT's ``head_mask`` are not refused, nor are
    they on a one-layer GRU's ``h_n`` (dimension 0 is its layers, as with two); they equal a hook by hand."""
    torch = require("torch")
    model, call, target = _batch_of_one(case)
    with torch.no_grad():
        clean = call()
        with fastflip.injected_activations(model, seed=3, count=2, bits="20-30", per_sample=True,
                                           selection=fastflip.Selection(layers=[target])) as log:
            faulted = call()
        assert len(log) == 2 and set(log.sample.tolist()) == {0}
        with _by_hand(model, log.records()):
            hand = call()
    assert _same(faulted, hand) and not _same(faulted, clean)


@pytest.mark.parametrize("name, target, forward", [("llama", "model.layers.0.self_attn:cache.key", 1),
                                                   ("mistral", "model.layers.1.self_attn:cache.value", 0),
                                                   ("llama", "model.layers.1.self_attn.k_proj", 1)])
def test_static_cache_faults_equal_a_patched_static_layer(name: str, target: str, forward: int) -> None:
    """``cache_implementation="static"``: the cache is one preallocated buffer per layer (Mistral's a sliding
    window); a ``:cache.*`` fault is written into it, as a patched ``StaticLayer.update`` writes, and the scores and
    tokens of ``generate`` equal that reference bit for bit."""
    torch = require("torch")
    model, ids = _model(name), _ids()
    with torch.no_grad():
        clean = _generate(model, ids, cache_implementation="static")
        with fastflip.injected_activations(model, seed=3, count=2, bits="20-30", per_sample=True, forward=forward,
                                           selection=fastflip.Selection(layers=[target])) as log:
            faulted = _generate(model, ids, cache_implementation="static")
        with _by_hand(model, log.records()):
            hand = _generate(model, ids, cache_implementation="static")
    assert all(_same(a, b) for a, b in zip(faulted, hand)) and not all(_same(a, b) for a, b in zip(faulted, clean))


def test_a_static_cache_faulted_in_every_forward_is_refused_and_fresh_caches_are_faulted_each_time() -> None:
    """A static cache returns its one buffer at every step, so a ``:cache.*`` fault in every forward would flip the
    same bits back at the next step: refused in one line that says forward=k. Forwards that each build their own
    cache (``model(ids)`` twice) are faulted each time, as the hook by hand faults them."""
    torch = require("torch")
    model, ids = _model("llama"), _ids()
    sel = fastflip.Selection(layers=["model.layers.0.self_attn:cache.key"])
    with pytest.raises(OptionError) as err, torch.no_grad():
        with fastflip.injected_activations(model, seed=3, count=1, bits="30", selection=sel):
            _generate(model, ids, cache_implementation="static")
    assert "\n" not in str(err.value) and "forward=k" in str(err.value)

    def twice() -> list[Any]:
        return _forward(model, "llama", ids) + _forward(model, "llama", ids)

    with torch.no_grad():
        clean = twice()
        with fastflip.injected_activations(model, seed=3, count=1, bits="30", selection=sel) as log:
            faulted = twice()
        assert sorted(set(log.forward.tolist())) == [0, 1]
        with _by_hand(model, log.records()):
            hand = twice()
    assert all(_same(a, b) for a, b in zip(faulted, hand)) and not all(_same(a, b) for a, b in zip(faulted, clean))


def test_output_attentions_captured_by_transformers_show_a_fault_in_the_attention_weights() -> None:
    """Eager attention returns its weights (``self_attn:out.1``), which transformers captures for
    ``output_attentions`` by a forward hook of its own, registered before the block: fastflip writes the fault into
    the weights' own memory (the call's new tensor), so the captured attentions show it, as they show the hook by
    hand that writes there first; the scores and tokens do not change (nothing downstream reads the weights)."""
    torch = require("torch")
    model, ids, target = _model("llama"), _ids(), "model.layers.0.self_attn:out.1"
    model.set_attn_implementation("eager")

    def run() -> list[Any]:
        g = model.generate(ids, max_new_tokens=3, do_sample=False, output_scores=True, output_attentions=True,
                           return_dict_in_generate=True)
        return [*g.scores, g.sequences, *(a for step in g.attentions for a in step)]

    with torch.no_grad():
        clean = run()
        with fastflip.injected_activations(model, seed=3, count=2, bits="20-30", per_sample=True, forward=1,
                                           selection=fastflip.Selection(layers=[target])) as log:
            faulted = run()
        with _by_hand(model, log.records()):
            hand = run()
    assert len(faulted) == len(hand) and all(_same(a, b) for a, b in zip(faulted, hand))
    differ = [i for i, (a, b) in enumerate(zip(faulted, clean)) if not _same(a, b)]
    assert differ == [4 + 2 * 1]  # step 1's attentions of layer 0 (after 3 scores, the sequences, step 0's 2)


def test_llama_gqa_cache_holds_the_key_value_heads_and_keeps_a_fault_for_later_steps() -> None:
    """The cache of a grouped-query model holds ``num_key_value_heads`` heads: ``:cache.key`` sites are drawn over
    them (2 heads, not 4); a fault written at step 1 is in the cache the later steps read."""
    torch = require("torch")
    model, ids = _model("llama"), _ids()
    with torch.no_grad(), fastflip.injected_activations(
            model, seed=4, count=1, bits="30", forward=1,
            selection=fastflip.Selection(layers=["model.layers.0.self_attn:cache.key"])) as log:
        out = model.generate(ids, max_new_tokens=3, do_sample=False, use_cache=True, return_dict_in_generate=True)
    assert log.shapes == [(2, 7, 8)]  # kv heads, 6 prompt tokens + 1, head_dim
    keys = out.past_key_values.layers[0].keys
    for r in log.records():
        head, pos, d = np.unravel_index(r["index"], (2, 7, 8))
        assert int(_words(keys[r["sample"], head, pos, d].reshape(1))[0]) == r["new"]


def test_t5_encoder_in_generate_is_refused_in_one_line_and_faulted_through_get_encoder() -> None:
    """generate runs T5's encoder once, outside the model's forward: a target there is refused in one line that
    names the way (a block over ``model.get_encoder()``), which faults it as a hook by hand does."""
    torch = require("torch")
    model, ids = _model("t5"), _ids()
    sel = fastflip.Selection(layers=["block.0.layer.0.SelfAttention"])
    for forward in (None, 0):
        with pytest.raises(OptionError) as err, torch.no_grad():
            with fastflip.injected_activations(model, seed=1, count=1, forward=forward, selection=fastflip.Selection(
                    layers=["encoder.block.0.layer.0.SelfAttention"])):
                _generate(model, ids)
        assert "\n" not in str(err.value) and str(err.value).endswith(
            "ran outside a forward of the model itself: call the model, not its layers; for a submodule the model "
            "runs on its own (generate() runs the encoder once, outside the model's forward), wrap that submodule "
            "(e.g. model.get_encoder()) instead")
    encoder = model.get_encoder()
    with torch.no_grad():
        clean = _generate(model, ids)
        with fastflip.injected_activations(encoder, seed=1, count=2, bits="20-30", per_sample=True,
                                           selection=sel) as log:
            faulted = _generate(model, ids)
        assert log.forwards == 1 and len(log) == 4
        with _by_hand(encoder, log.records()):
            hand = _generate(model, ids)
    assert all(_same(a, b) for a, b in zip(faulted, hand)) and not all(_same(a, b) for a, b in zip(faulted, clean))


def test_refusals_are_one_line() -> None:
    """An attention-weights element that sdpa does not return and sdpa's inner softmax (each naming sdpa and the
    eager way), and a generate whose output shapes change between steps without forward=: one line each, saying
    why."""
    torch = require("torch")
    model, ids = _model("llama"), _ids()
    sdpa = (r"; this model's attention runs as 'sdpa', which fuses softmax and matmul and returns no attention "
            r"weights: model\.set_attn_implementation\(\"eager\"\) \(or attn_implementation=\"eager\"\) reaches them$")
    for target, forward, reason in [
            ("model.layers.0.self_attn:out.1", None, r"element 1 of its tuple output is a NoneType, not a tensor" + sdpa),
            ("model.layers.0.self_attn:softmax", 0, r"never ran in the forward of this LlamaForCausalLM" + sdpa),
            ("model.layers.0.mlp", None, r"outputs \(1, 32\) float32 per sample in forward 1, but \(6, 32\) float32 "
                                         r"when its sites were drawn: .*or forward= to fault one forward\)$")]:
        with pytest.raises(OptionError, match=r"^layer(\(s\))? " + target.replace(".", r"\.") + " " + reason) as err, \
                torch.no_grad():
            with fastflip.injected_activations(model, seed=1, count=1, forward=forward,
                                               selection=fastflip.Selection(layers=[target])):
                _generate(model, ids)
        assert "\n" not in str(err.value)
    model.set_attn_implementation("eager")
    with torch.no_grad(), fastflip.injected_activations(model, seed=1, count=1, forward=0, selection=fastflip.Selection(
            layers=["model.layers.0.self_attn:out.1", "model.layers.0.self_attn:softmax"])) as log:
        _generate(model, ids)
    assert log.layers == ["model.layers.0.self_attn:softmax", "model.layers.0.self_attn:out.1"]


# ------------------------------------------------------------------------------------------------------- files

def _tied_groups(model: Any) -> dict[str, set[str]]:
    """Every state_dict key -> the keys sharing its storage (itself included)."""
    sd = model.state_dict()
    by: dict[int, set[str]] = {}
    for k, v in sd.items():
        by.setdefault(v.data_ptr(), set()).add(k)
    return {k: by[v.data_ptr()] for k, v in sd.items()}


@pytest.mark.parametrize("name, dtype", [("llama", "bfloat16"), ("gemma", "bfloat16"), ("t5", "float32"),
                                         ("qwen2", "float32"), ("mistral", "bfloat16")])
def test_save_pretrained_shards_read_as_from_pretrained_reads_them(name: str, dtype: str, tmp_path: Any) -> None:
    """fastflip lists exactly the tensors the shards hold (the state_dict less the tied names), the verdict
    agrees with safetensors; a CLI injection (the tied tensor included) reads back through ``from_pretrained`` as
    logged under every tied name (into a new directory, and in place), and revert gives back every byte."""
    model = _model(name, dtype)
    d = str(tmp_path / "m")
    model.save_pretrained(d, max_shard_size="8KB")
    assert len([f for f in os.listdir(d) if f.endswith(".safetensors")]) >= 3
    sd, ties = model.state_dict(), _tied_groups(model)
    listed = {a.lstrip("/") for t in read_layout(d).tensors for a in t.aliases}
    assert listed == set(sd) - TIED.get(name, set())
    assert verdict(d, dir_view, str(tmp_path / "verdict"), count=8) == "agrees"
    cls = type(model)
    original = snapshot(d)
    out = str(tmp_path / "out")
    include = ["--include", f"*{SHARED.get(name, 'embed_tokens')}*"]
    for extra in ([], include, [*include, "--in-place"]):
        if "--in-place" in extra:  # into a copy of the directory, its log beside it
            shutil.rmtree(out)
            copy_checkpoint(d, out)
            args = [out, *extra]
        else:
            args = [d, "-o", out, *extra, "--force"]
        assert main(["inject", *args, "--seed", "5", "--count", "6", "-q"]) == 0
        log = InjectionLog.load(out + ".fflog")
        expect = {k: _words(v).copy() for k, v in sd.items()}
        for r in log.records():
            for k in ties[r["tensor"].lstrip("/")]:
                assert expect[k][r["index"]] == r["old_word"]
                expect[k][r["index"]] = r["new_word"]
        loaded = cls.from_pretrained(out, dtype="auto").state_dict()
        assert set(loaded) == set(sd)
        for k, v in loaded.items():
            assert v.dtype == sd[k].dtype and np.array_equal(_words(v), expect[k]), k
        if extra:
            assert {r["tensor"].lstrip("/") for r in log.records()} == {SHARED.get(name, "model.embed_tokens.weight")}
        assert main(["revert", out + ".fflog", out, "-q"]) == 0 and snapshot(out) == original
        os.unlink(out + ".fflog")


# --------------------------------------------------------------------------------------------------- campaigns

def _llama_sweeps(tmp_path: Any, layers: list[str], evaluator: dict, **target: Any) -> list[tuple]:
    """One campaign over the Llama of ``hf_campaign_helpers.llama`` (one instance), swept one trial at a time and
    2 trials per forward: the rows (equal in both), with more than one outcome; the model's words are as before."""
    require("torch")
    require("transformers")
    import hf_campaign_helpers
    from test_campaign import make
    from test_hf_campaign import _rows

    from fastflip.campaign.sweep import sweep

    model = hf_campaign_helpers.llama()
    before = {k: _words(v).copy() for k, v in model.state_dict().items()}
    c = make(target={"factory": "hf_campaign_helpers:llama", **target}, select={"layers": layers},
             evaluator={"function": None, "critical": 1.0, **evaluator},
             trials={"per_cell": 2}, cells={"bits": ["30", "22"], "group_by": "layer"})
    serial, batched = str(tmp_path / "s.db"), str(tmp_path / "b.db")
    assert sweep(c, serial, workers=0, progress=False, batch_trials=1).complete
    assert sweep(c, batched, workers=0, batch_trials=2, stream=io.StringIO()).complete
    rows = _rows(serial)
    assert rows == _rows(batched) and len({r[4] for r in rows}) > 1
    assert hf_campaign_helpers.llama() is model
    after = model.state_dict()
    assert set(after) == set(before) and all(np.array_equal(_words(v), before[k]) for k, v in after.items())
    return rows


_LM = {"builtin": "language-model", "data": "hf_campaign_helpers:tokens", "batch_size": 4}


@pytest.mark.parametrize("evaluator", [
    _LM, {"builtin": "generation", "data": "hf_campaign_helpers:prompts", "batch_size": 4, "max_new_tokens": 3}],
    ids=["language-model", "generation"])
def test_llama_weight_campaign_runs_and_leaves_the_model_as_it_was(evaluator: dict, tmp_path: Any) -> None:
    """A sweep with the language-model or the generation evaluator over a Llama: serial and batched trials store
    the same rows, and the model the factory gave holds every word it held before."""
    rows = _llama_sweeps(tmp_path, ["model.embed_tokens", "model.layers.0.self_attn.k_proj", "model.norm"], evaluator)
    assert len(rows) == 3 * 2 * 2


def test_llama_activation_campaign_serial_equals_batched(tmp_path: Any) -> None:
    """An activation campaign (attention output, MLPs, a k/v projection) over a Llama with the language-model
    evaluator: batched trials (each trial's plan in its own samples of one forward) store the rows of one trial at a
    time, and real outcomes were compared."""
    layers = ["model.layers.0.self_attn", "model.layers.*.mlp", "model.layers.1.self_attn.v_proj"]
    rows = _llama_sweeps(tmp_path, layers, _LM, kind="activations")
    assert len(rows) == 4 * 2 * 2
