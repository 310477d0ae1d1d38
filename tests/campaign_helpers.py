"""Targets and evaluators for the campaign tests (imported by worker processes through `paths`)."""

from __future__ import annotations

import os
import time

import numpy as np

_rng = np.random.default_rng(1234)
X = _rng.standard_normal((64, 16)).astype(np.float32)
_W0 = {
    "dense/kernel": (_rng.standard_normal((16, 8)) * 0.5).astype(np.float32),
    "dense/bias": (_rng.standard_normal(8) * 0.1).astype(np.float32),
    "out/kernel": (_rng.standard_normal((8, 4)) * 0.5).astype(np.float32),
}


def _forward(w):
    with np.errstate(all="ignore"):  # flipped exponents overflow: that is the point
        h = np.maximum(X @ w["dense/kernel"] + w["dense/bias"], 0)
        return h @ w["out/kernel"]


Y = np.argmax(_forward(_W0), axis=1)
Y[::5] = (Y[::5] + 1) % 4  # golden accuracy 0.8: room to go up and down


def weights():
    """A fresh copy of the small MLP's weights."""
    return {k: v.copy() for k, v in _W0.items()}


def evaluate(w):
    """Logits and accuracy on a fixed batch."""
    logits = _forward(w)
    with np.errstate(all="ignore"):
        acc = float(np.mean(np.argmax(logits, axis=1) == Y))
    return logits, acc


def heldout():
    return X, Y


class Model:
    """A callable model (for the built-in accuracy evaluator)."""

    def __init__(self):
        self.w = weights()

    def __call__(self, x):
        h = np.maximum(x @ self.w["dense/kernel"] + self.w["dense/bias"], 0)
        return h @ self.w["out/kernel"]


def picky(w):
    """Raises on huge weights (a DUE by exception), else evaluates."""
    if any(np.abs(a).max() > 1e30 for a in w.values()):
        raise ValueError("weights out of range")
    return evaluate(w)


def crashing(w):
    """Kills its own process on huge weights in out/kernel (a worker crash)."""
    if np.abs(w["out/kernel"]).max() > 1e30:
        os._exit(7)
    return evaluate(w)


def slow(w):
    time.sleep(0.002)
    return evaluate(w)


def constant(w):
    return 1.0


def evaluate_h5(w):
    """Memory mode on an HDF5 target: the arrays are keyed by their '/paths'."""
    return evaluate({k.lstrip("/"): v for k, v in w.items()})


def evaluate_file(path):
    """Checkpoint mode: read the (faulty) file and evaluate it."""
    import h5py

    with h5py.File(path, "r") as f:
        return evaluate({k: f[k][()] for k in ("dense/kernel", "dense/bias", "out/kernel")})


def torch_model():
    """The same MLP as a torch.nn.Sequential (float32, eval mode)."""
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4, bias=False))
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(_W0["dense/kernel"].T.copy()))
        m[0].bias.copy_(torch.from_numpy(_W0["dense/bias"]))
        m[2].weight.copy_(torch.from_numpy(_W0["out/kernel"].T.copy()))
    return m.eval()


if __name__ == "__main__":  # the evaluator command of checkpoint campaigns: prints the accuracy last
    import sys

    if sys.argv[2:] == ["fail"]:
        print("cannot evaluate", file=sys.stderr)
        sys.exit(3)
    print("evaluating", sys.argv[1])
    print(evaluate_file(sys.argv[1])[1])


FACTORY_CALLS: list[int] = []  # the process ids of counted_weights' calls made in this process


def counted_weights():
    """weights(), recording each call made in this process in FACTORY_CALLS."""
    FACTORY_CALLS.append(os.getpid())
    return weights()


def unseeded_weights():
    """Weights that differ on every call (a factory mistake the sweep must catch)."""
    w = weights()
    w["dense/bias"] = np.random.default_rng().standard_normal(8).astype(np.float32)
    return w


def keras_model():
    """The same MLP as a Keras Sequential model."""
    import keras

    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu", name="dense"),
                          keras.layers.Dense(4, use_bias=False, name="out")])
    m.get_layer("dense").set_weights([_W0["dense/kernel"], _W0["dense/bias"]])
    m.get_layer("out").set_weights([_W0["out/kernel"]])
    return m


def dies_in_workers():
    """Weights in the sweep process; a hard crash in any pool worker (a broken install, say)."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        os._exit(9)
    return weights()


def faulty_torch_outputs(runner, cell_id, trial, x):
    """A torch target's outputs on ``x`` under one trial's faults (injected, run, reverted): an
    evaluation independent of the campaign's evaluator."""
    import torch

    from fastflip import live

    log = live.inject(runner.live[None], runner.plan(cell_id, trial))
    try:
        with torch.no_grad():
            return runner.targets[None](torch.as_tensor(x)).numpy()
    finally:
        live.revert(runner.live[None], log)
