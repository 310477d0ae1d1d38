"""Hugging Face models as they are, for campaign tests: built from their configs (no downloads), seeded.

* ``gpt2``: ``GPT2LMHeadModel`` (n_layer=2, n_embd=32, tied embeddings) on token ids (``tokens``, ``prompts``);
* ``bert``: ``BertForSequenceClassification`` (2 layers, hidden 32) on token ids with labels = its fault-free
  predictions (``bert_data``);
* ``tokens_loader``: the same token ids as a data loader yielding batches of 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = 64


def gpt2() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg).eval()


def tokens() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, size=(8, 12), dtype=np.int64)


def tokens_loader() -> Any:
    x = tokens()
    return (x[i:i + 3] for i in range(0, len(x), 3))


def prompts() -> np.ndarray:
    return np.random.default_rng(2).integers(0, VOCAB, size=(4, 6), dtype=np.int64)


def bert() -> Any:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=VOCAB, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


def bert_data() -> tuple[np.ndarray, np.ndarray]:
    import torch

    x = np.random.default_rng(3).integers(0, VOCAB, size=(10, 8), dtype=np.int64)
    with torch.no_grad():
        y = bert()(torch.as_tensor(x)).logits.argmax(-1).numpy()
    return x, y


# --------------------------------------------------------------------------- errors that are not fault outcomes
ERRORS = {"memory": MemoryError, "import": ModuleNotFoundError, "file": FileNotFoundError, "value": ValueError}


def _raising(kind: str) -> Any:
    import campaign_helpers

    golden = campaign_helpers.weights()

    def evaluate(w: Any) -> Any:
        if any(not np.array_equal(w[k], golden[k], equal_nan=True) for k in golden):  # a faulted trial
            if kind == "torch-oom":
                import torch

                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            raise ERRORS[kind]("no room" if kind != "import" else "No module named 'missing'")
        return campaign_helpers.evaluate(w)

    return evaluate


memory_error = _raising("memory")
torch_oom = _raising("torch-oom")
import_error = _raising("import")
file_error = _raising("file")
value_error = _raising("value")
