"""Trials per second of a weight campaign on a GPT-2 built from its config: serial vs batched, one worker.

Model: ``GPT2LMHeadModel`` with the GPT-2 vocabulary (50,257 tokens, tied embeddings) and 1,024 positions, but
4 layers 256 wide instead of GPT-2 small's 12 × 768 (which is too slow for this shared 2-vCPU machine): ~16 M
parameters, 12.9 M of them the tied embedding / LM head. The ``language-model`` built-in on 8 sequences of 32
tokens (``batch_size = 8``), cells per layer × bit 30 over four layers (attention, MLP, LayerNorm), ``PER_CELL``
trials each. Both modes run the same trials in this process (``TrialRunner.run_many``, as a sweep's worker does);
the batched rows are checked equal to the serial ones (outcome, metric, delta, sites, numeric, changed) first.
torch.fx cannot trace the model: batched trials take the full path (faulted modules once per trial).

Run: ``pytest bench/bench_hf_campaign.py --benchmark-only --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PER_CELL = 8
BATCH = 8
LAYERS = ["transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_fc", "transformer.h.3.attn.c_proj", "transformer.ln_f"]


def model() -> object:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=50257, n_positions=1024, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg).eval()


def tokens() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 50257, size=(8, 32), dtype=np.int64)


@pytest.fixture(scope="module")
def setup():
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    torch.set_num_threads(1)  # one worker on a shared machine
    c = Campaign.from_dict({
        "name": "bench-gpt2", "seed": 3, "paths": [HERE], "target": {"factory": "bench_hf_campaign:model"},
        "select": {"layers": LAYERS}, "cells": {"bits": ["30"], "group_by": "layer"}, "trials": {"per_cell": PER_CELL},
        "evaluator": {"builtin": "language-model", "data": "bench_hf_campaign:tokens", "batch_size": 8,
                      "critical": 1.0}})
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    serial = [tuple(runner.run(cid, t)) for cid in range(len(cells)) for t in range(PER_CELL)]
    return runner, len(cells), serial


def _mode(benchmark, setup, batch):
    from trial_modes import time_mode

    runner, n, serial = setup
    keep = (0, 1, 2, 3, 4, 5, 6, 7, 10, 11)  # every column but duration and worker

    def same(rows):
        assert [tuple(r[i] for i in keep) for r in rows] == [tuple(s[i] for i in keep) for s in serial]

    time_mode(benchmark, runner, n, PER_CELL, batch, same)
    benchmark.extra_info["path"] = runner._batcher.path() if runner._batcher else "serial"


def test_serial(benchmark, setup):
    _mode(benchmark, setup, 1)


def test_batched(benchmark, setup):
    _mode(benchmark, setup, BATCH)
