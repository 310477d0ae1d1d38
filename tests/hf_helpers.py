"""Tiny Hugging Face models built from their configs and saved as ``save_pretrained`` does (tests only)."""

from __future__ import annotations

import filecmp
import json
import os
from typing import Any

import numpy as np

# (config class, config keywords, model class) per model: tiny, built from configs, no downloads
MODELS = {
    "gpt2": ("GPT2Config", dict(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32), "GPT2LMHeadModel"),
    "bert": ("BertConfig", dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=32), "BertForMaskedLM"),
    "bert-classifier": ("BertConfig", dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=32, num_labels=3),
                        "BertForSequenceClassification"),
    "vit": ("ViTConfig", dict(image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=64), "ViTForImageClassification"),
}
# decoder-only LLMs (grouped-query attention: 4 query heads, 2 key/value heads; rotary; RMSNorm) and T5
_LLM = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MODELS.update({
    "llama": ("LlamaConfig", _LLM, "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", _LLM, "Qwen2ForCausalLM"),  # q/k/v biases
    "mistral": ("MistralConfig", dict(_LLM, sliding_window=4), "MistralForCausalLM"),  # a window prompts overrun
    "gemma": ("GemmaConfig", dict(_LLM, head_dim=8), "GemmaForCausalLM"),  # lm_head tied, embeddings scaled
    "t5": ("T5Config", dict(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, tie_word_embeddings=True),
           "T5ForConditionalGeneration"),  # shared embedding tied to encoder, decoder and lm_head
})


def build(name: str, seed: int = 0) -> Any:
    """The model ``name`` of :data:`MODELS`, initialised with ``seed``."""
    import torch
    import transformers

    cfg_cls, kw, model_cls = MODELS[name]
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()


def model_class(name: str) -> Any:
    import transformers

    return getattr(transformers, MODELS[name][2])


def save_sharded(model: Any, d: str, fmt: str = "safetensors", max_shard_size: str = "20KB") -> list[str]:
    """Save ``model`` to ``d`` in shards: ``safetensors`` through ``save_pretrained``, ``bin`` as transformers 4
    wrote them (``pytorch_model-0000k-of-0000n.bin`` + ``pytorch_model.bin.index.json``; transformers 5 writes
    safetensors only). Returns the weight files."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    model.save_pretrained(d, max_shard_size=max_shard_size)
    if fmt == "bin":
        for f in os.listdir(d):
            if f.startswith("model") and ("safetensors" in f):
                os.unlink(os.path.join(d, f))
        tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {})
        sd = {k: v for k, v in model.state_dict().items() if k not in tied}
        split = split_torch_state_dict_into_shards(sd, filename_pattern="pytorch_model{suffix}.bin",
                                                   max_shard_size=max_shard_size)
        for fname, keys in split.filename_to_tensors.items():
            torch.save({k: sd[k].contiguous() for k in keys}, os.path.join(d, fname))
        if split.is_sharded:
            with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as fh:
                json.dump({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, fh)
    return sorted(f for f in os.listdir(d) if f.endswith((".safetensors", ".bin")))


def same_tree(a: str, b: str) -> bool:
    """True when the two directories hold the same file names with the same bytes."""
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    return all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def words(t: Any) -> np.ndarray:
    """The stored words of a float32 torch tensor, flat."""
    return t.detach().contiguous().numpy().view(np.uint32).reshape(-1)


def check_loaded(original: dict[str, Any], loaded: dict[str, Any], log: Any) -> None:
    """Assert that ``loaded`` (a state_dict from ``from_pretrained`` of the injected directory) differs from
    ``original`` exactly by the log's changes: each key that differs equals one logged tensor's new words at
    its logged elements and nothing else; every logged tensor is reached (a tied one by each of its keys).

    Keys are matched by content, not by name: transformers 5 renames some saved keys on load (ViT's
    ``attention.attention.query`` is ``attention.q_proj`` live), so the files' names are not the live ones.
    """
    changed: dict[str, dict[int, int]] = {}
    for r in log.records():
        if r["old_word"] != r["new_word"]:
            changed.setdefault(r["tensor"], {})[r["index"]] = r["new_word"]
    assert set(original) == set(loaded)
    reached = set()
    for k, v in loaded.items():
        a, b = words(original[k]), words(v)
        pos = np.flatnonzero(a != b)
        if not len(pos):
            continue
        got = {int(i): int(b[i]) for i in pos}
        hits = [name for name, want in changed.items() if want == got]
        assert hits, f"{k}: {len(pos)} element(s) differ that no logged tensor changed"
        reached.update(hits)
    assert reached == set(changed), f"logged changes not seen after from_pretrained: {set(changed) - reached}"


def evaluate_gpt2_dir(path: str) -> tuple[Any, float]:
    """A campaign evaluator for a GPT-2 checkpoint directory: next-token logits on 16 fixed tokens and the
    share of positions whose prediction is the next input token."""
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    ids = torch.arange(16).reshape(1, 16) % 64
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
    return logits, float(np.mean(logits[:-1].argmax(-1) == ids[0, 1:].numpy()))
