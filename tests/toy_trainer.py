"""A framework-free trainer for experiment tests: softmax regression on the digits, NumPy + h5py.

It follows fastflip.frameworks.trainers.protocol.Trainer and is loaded the way a user's own file is
(``trainer: {framework: custom, model_file: toy_trainer.py}``). ``crash_above`` makes
train_epoch raise when a weight's magnitude exceeds it, standing in for a user's trainer
that blows up on a corrupted state.
"""

from __future__ import annotations

import h5py
import numpy as np

from fastflip.frameworks.trainers.data import digits


class ToyTrainer:
    framework = "numpy"
    checkpoint_suffix = ".h5"

    def __init__(self, seed=0, crash_above=None, lr=0.5, momentum=0.9, batch_size=64):
        self.seed, self.crash_above, self.lr, self.mu, self.bs = seed, crash_above, lr, momentum, batch_size
        xt, yt, xv, yv = digits()
        self.x, self.y = xt.reshape(len(xt), -1).astype(np.float32), yt
        self.xv, self.yv = xv.reshape(len(xv), -1).astype(np.float32), yv
        self.chance_level = float(np.bincount(yv).max() / len(yv))

    def build(self):
        rng = np.random.default_rng(self.seed)
        self.W = (rng.standard_normal((64, 10)) * 0.01).astype(np.float32)
        self.b = np.zeros(10, np.float32)
        self.vW = np.zeros_like(self.W)
        self.vb = np.zeros_like(self.b)
        self.step = np.int64(0)

    def _logits(self, x):
        return x @ self.W + self.b

    def _loss_grad(self, x, y):
        with np.errstate(all="ignore"):
            z = self._logits(x)
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
            p[np.arange(len(y)), y] -= 1
            return loss, (x.T @ p / len(y)).astype(np.float32), p.mean(axis=0).astype(np.float32)

    @property
    def iterations_per_epoch(self):
        return -(-len(self.y) // self.bs)

    def train_epoch(self, epoch, start=0, stop=None):
        if self.crash_above is not None and np.nanmax(np.abs(self.W)) > self.crash_above:
            raise RuntimeError("toy trainer: weights out of range")
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.y))
        order = order[start * self.bs: None if stop is None else stop * self.bs]
        losses, correct = [], 0
        for s in range(0, len(order), self.bs):
            i = order[s:s + self.bs]
            with np.errstate(all="ignore"):
                correct += int((self._logits(self.x[i]).argmax(axis=1) == self.y[i]).sum())
            loss, gW, gb = self._loss_grad(self.x[i], self.y[i])
            with np.errstate(all="ignore"):
                self.vW = (self.mu * self.vW + gW).astype(np.float32)
                self.vb = (self.mu * self.vb + gb).astype(np.float32)
                self.W = (self.W - self.lr * self.vW).astype(np.float32)
                self.b = (self.b - self.lr * self.vb).astype(np.float32)
            self.step += 1
            losses.append(loss)
        return {"loss": float(np.mean(losses)), "train_accuracy": correct / len(order)}

    def evaluate(self):
        loss, _, _ = self._loss_grad(self.xv, self.yv)
        with np.errstate(all="ignore"):
            acc = float((self._logits(self.xv).argmax(axis=1) == self.yv).mean())
        return {"val_loss": loss, "accuracy": acc}

    def save_checkpoint(self, path):
        with h5py.File(path, "w") as f:
            f["model/W"], f["model/b"] = self.W, self.b
            f["optimizer/vW"], f["optimizer/vb"] = self.vW, self.vb
            f["optimizer/step"] = self.step

    def load_checkpoint(self, path):
        with h5py.File(path, "r") as f:
            if f["model/W"].shape != self.W.shape:
                raise ValueError(f"/model/W has shape {f['model/W'].shape}")
            self.W, self.b = f["model/W"][()], f["model/b"][()]
            self.vW, self.vb = f["optimizer/vW"][()], f["optimizer/vb"][()]
            self.step = np.int64(f["optimizer/step"][()])


def make_trainer(seed=0, **options):
    return ToyTrainer(seed=seed, **options)
