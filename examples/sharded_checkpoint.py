"""Alter a sharded Hugging Face checkpoint as one model, load it, and revert it bit for bit.

Builds a tiny GPT-2 from its config (no download), saves it with ``save_pretrained`` in shards
(``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``), flips 20 exponent bits
sampled across all shards by size, loads the altered directory with ``from_pretrained``, then
reverts it and checks every file against the original.

Run: ``python examples/sharded_checkpoint.py [WORKDIR]`` (a temporary directory by default).
The CLI does the same::

    fastflip inspect gpt2/                      # tensors by index name, each with its shard
    fastflip inject gpt2/ -o gpt2-faulty/ --count 20 --bits exponent --seed 7
    fastflip diff gpt2/ gpt2-faulty/
    fastflip revert gpt2-faulty.fflog gpt2-faulty/
"""

from __future__ import annotations

import filecmp
import os
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from fastflip import Sampling
from fastflip.files.layout import read_layout
from fastflip.files.sharded import inject_dir, revert_dir


def main(work: str) -> dict[str, int]:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).eval()
    src = os.path.join(work, "gpt2")
    model.save_pretrained(src, max_shard_size="20KB")  # 7 shards of a 112 KiB model
    layout = read_layout(src)  # the directory as one checkpoint
    print(f"{src}: {len(layout.tensors)} tensors in {len(layout.shards)} shards")

    out = os.path.join(work, "gpt2-faulty")
    res = inject_dir(src, out, seed=7, sampling=Sampling(count=20, bits="exponent"))
    shards = res.log.manifest["checkpoint_dir"]["shards"]
    print(f"{res.counts['bits_changed']} bits changed in {len(shards)} shard(s); log {res.log_path}")
    for rec in res.log.records(limit=3):
        shard = next(t["shard"] for t in res.log.manifest["tensors"] if t["name"] == rec["tensor"])
        print(f"  {rec['tensor']}[{rec['index']}] in {shard}: {rec['old_value']:.4g} -> {rec['new_value']:.4g}")

    faulty = GPT2LMHeadModel.from_pretrained(out).eval()  # the altered directory loads as it is
    ids = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        changed = int((model(ids).logits.argmax(-1) != faulty(ids).logits.argmax(-1)).sum())
    print(f"next-token predictions changed at {changed} of 16 positions")

    revert_dir(res.log_path, out)
    same = all(filecmp.cmp(os.path.join(src, f), os.path.join(out, f), shallow=False) for f in os.listdir(src))
    assert same and sorted(os.listdir(src)) == sorted(os.listdir(out))
    print("reverted: every file is the original again")
    return {"shards": len(layout.shards), "touched": len(shards), "bits_changed": res.counts["bits_changed"]}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="fastflip-sharded-"))
