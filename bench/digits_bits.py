"""Figure for bench/README.md: failure rate per bit of a digits CNN under the outcome vocabulary of fastflip 0.2.

A small CNN (conv 1→8, conv 8→16, linear 64→10; 1 898 float32 parameters) is trained on scikit-learn's bundled
``load_digits`` (1 200 training images, 597 held out; seeded, CPU). The campaign flips one bit per trial in every
bit position 0–31 of all its weights (one cell per bit, ``per_cell`` trials each, permutation sampling without
replacement), judged by the built-in classification evaluator: SDC = the prediction of at least one held-out
image changed. The same store is also summarised with fastflip 0.1's definition (any changed logit:
``failure = ["masked_numeric", "sdc", "critical", "due"]``).

Run: ``python bench/digits_bits.py [per_cell] [workdir]`` (default 200 trials per cell).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _data():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return x, y


def heldout():
    x, y = _data()
    return x[1200:], y[1200:]


_MODEL = None


def cnn():
    """The trained CNN (trained once per process, deterministically)."""
    global _MODEL
    if _MODEL is None:
        import torch

        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
        m = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(64, 10))
        x, y = _data()
        xt, yt = torch.from_numpy(x[:1200]), torch.from_numpy(y[:1200])
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(150):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(xt), yt)
            loss.backward()
            opt.step()
        _MODEL = m.eval()
    return _MODEL


def main(per_cell: int = 200, workdir: str | None = None) -> None:
    from fastflip.campaign import Campaign
    from fastflip.campaign.summary import stratified_rate, summarize
    from fastflip.campaign.sweep import sweep

    workdir = workdir or tempfile.mkdtemp(prefix="digits-bits-")
    store = os.path.join(workdir, "digits.db")
    c = Campaign.from_dict({
        "name": "digits-cnn-bits", "seed": 2026, "paths": [HERE],
        "target": {"factory": "digits_bits:cnn"},
        "cells": {"bits": [str(b) for b in range(32)], "group_by": "none"},
        "trials": {"per_cell": per_cell},
        "evaluator": {"builtin": "classification", "data": "digits_bits:heldout", "critical": 0.01},
    })
    t0 = time.perf_counter()
    res = sweep(c, store, workers=int(os.environ.get("WORKERS", "1")), progress=False)
    took = time.perf_counter() - t0
    new = summarize(store)
    old = summarize(store, failure=["masked_numeric", "sdc", "critical", "due"])
    import torch

    x, y = heldout()
    model = cnn()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    print(f"digits CNN: {sum(p.numel() for p in cnn().parameters())} parameters, held-out accuracy {acc:.4f}; "
          f"{res.stored} trials in {took:.0f} s ({res.stored / took:.0f} trials/s, {res.counts})")
    print("bit  trials  failure (new)  95% Wilson          old 'any logit changed'  masked_numeric")
    for cn, co in zip(new["cells"], old["cells"]):
        print(f"{cn['bits']:>3}  {cn['trials']:>6}  {cn['failure_rate']:.4f}         "
              f"[{cn['failure_low']:.4f}, {cn['failure_high']:.4f}]    {co['failure_rate']:.4f}"
              f"                   {cn['masked_numeric']}")
    for name, bits in (("mantissa 0-22", range(23)), ("exponent 23-30", range(23, 31)), ("sign 31", [31]),
                       ("bit 30", [30])):
        for label, s in (("new", new), ("old", old)):
            cells = [cc for cc in s["cells"] if int(cc["bits"]) in bits]
            r = stratified_rate(cells)
            print(f"{name:<15} {label}: {r['rate']:.4f} [{r['low']:.4f}, {r['high']:.4f}] over {r['trials']} trials")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, sys.argv[2] if len(sys.argv) > 2 else None)
