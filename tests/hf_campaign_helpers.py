"""Hugging Face models as they are, for campaign tests: campaign factories over :func:`hf_helpers.build` (built from
their configs, no downloads, seeded) and their data.

* ``gpt2``: ``GPT2LMHeadModel`` (n_layer=2, n_embd=32, tied embeddings) on token ids (``tokens``, ``prompts``);
* ``bert``: ``BertForSequenceClassification`` (2 layers, hidden 32, 3 labels) on token ids with labels = its
  fault-free predictions (``bert_data``);
* ``tokens_loader``: the same token ids as a data loader yielding batches of 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_helpers import MODELS, build

VOCAB = MODELS["gpt2"][1]["vocab_size"]  # token ids of every model here lie below it


def gpt2() -> Any:
    """GPT-2 of :data:`hf_helpers.MODELS` (seed 0)."""
    return build("gpt2")


def tokens() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, size=(8, 12), dtype=np.int64)


def tokens_loader() -> Any:
    x = tokens()
    return (x[i:i + 3] for i in range(0, len(x), 3))


def prompts() -> np.ndarray:
    return np.random.default_rng(2).integers(0, VOCAB, size=(4, 6), dtype=np.int64)


def bert() -> Any:
    """The BERT classifier of :data:`hf_helpers.MODELS` (3 labels, seed 0)."""
    return build("bert-classifier")


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


_ONE: dict[str, Any] = {}


def llama() -> Any:
    """The Llama of :data:`hf_helpers.MODELS` (seed 0), one instance per process, so that a test can read the
    words of the very model a sweep faulted and reverted."""
    if "llama" not in _ONE:
        _ONE["llama"] = build("llama")
    return _ONE["llama"]
