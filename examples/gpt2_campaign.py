"""A weight campaign on GPT-2 as Hugging Face builds it: ``python examples/gpt2_campaign.py [--generation]``.

The model is ``GPT2LMHeadModel`` built from its config (tied embeddings, random weights seeded: no download),
GPT-2-small-sized by default (12 layers, 768 wide); ``GPT2_CAMPAIGN_SIZE=tiny`` builds a 2-layer, 32-wide one.
The campaign file is ``gpt2_campaign.toml`` next to this script (the ``language-model`` built-in); with
``--generation`` the same campaign judges greedy generation (``max_new_tokens = 8``) from ``prompts`` instead.
Real text works the same: have ``tokens`` return a tokenizer's ``input_ids`` (equal lengths).

fastflip imports this module in every worker (``paths = ["."]`` in the campaign file), so the factory and the data
functions must give the same model and data in every process: they are seeded.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
         "tiny": dict(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)}


def _config() -> dict[str, int]:
    return SIZES[os.environ.get("GPT2_CAMPAIGN_SIZE", "small")]


def model() -> Any:
    """The target: GPT-2 built from its config, seeded, in eval mode (as it is: no wrapper)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**_config(), tie_word_embeddings=True)).eval()


def tokens() -> np.ndarray:
    """16 sequences of 24 token ids (stand-ins for tokenized text)."""
    return np.random.default_rng(1).integers(0, _config()["vocab_size"], size=(16, 24), dtype=np.int64)


def prompts() -> np.ndarray:
    """8 prompts of 8 token ids for the generation evaluator."""
    return np.random.default_rng(2).integers(0, _config()["vocab_size"], size=(8, 8), dtype=np.int64)


def main(argv: Sequence[str] | None = None) -> int:
    from fastflip.campaign import Campaign, load_campaign
    from fastflip.campaign.summary import summarize
    from fastflip.campaign.sweep import sweep

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--store", default="gpt2.db", help="results store (default gpt2.db; run again to resume)")
    p.add_argument("--generation", action="store_true", help="judge greedy generation instead of next tokens")
    p.add_argument("--per-cell", type=int, default=None, help="trials per cell (default: the campaign file's)")
    p.add_argument("-j", "--workers", type=int, default=None, help="worker processes (0: this process)")
    args = p.parse_args(argv)
    c = load_campaign(os.path.join(HERE, "gpt2_campaign.toml"))
    d = c.to_dict()
    if args.generation:  # metric: the fraction of tokens equal to the golden generation (higher is better)
        d["name"] = "gpt2-generation"
        d["evaluator"].update(builtin="generation", data="gpt2_campaign:prompts", max_new_tokens=8,
                              greater_is_better=True, critical=0.5)
    if args.per_cell:
        d["trials"]["per_cell"] = args.per_cell
    c = Campaign.from_dict(d)
    res = sweep(c, args.store, workers=args.workers)
    print(f"{res.store}: {res.stored} trials; {res.counts}")
    for row in summarize(args.store)["cells"][:5]:
        print(row["key"], f"failure {row['failure_rate']:.2f}")
    return 0


if __name__ == "__main__":  # workers import this file again: keep the sweep under the guard
    sys.exit(main())
