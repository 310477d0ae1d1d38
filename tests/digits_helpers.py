"""A small digits classifier trained in the test process (scikit-learn's bundled load_digits; nothing downloaded).

A one-hidden-layer MLP (64 -> 32 -> 10, ReLU) trained with scikit-learn, its weights as float32 arrays, and
evaluators over the 597 held-out images: one that says what it returns (outputs, predictions, metric) and one
in fastflip 0.1's style (logits and accuracy, read as outputs).
"""

from __future__ import annotations

import warnings

import numpy as np

_CACHE: dict = {}


def _trained() -> dict:
    if not _CACHE:
        from sklearn.datasets import load_digits
        from sklearn.neural_network import MLPClassifier

        x, y = load_digits(return_X_y=True)
        x = (x / 16.0).astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=300, random_state=0).fit(x[:1200], y[:1200])
        _CACHE["w"] = {
            "hidden/kernel": clf.coefs_[0].astype(np.float32), "hidden/bias": clf.intercepts_[0].astype(np.float32),
            "out/kernel": clf.coefs_[1].astype(np.float32), "out/bias": clf.intercepts_[1].astype(np.float32),
        }
        _CACHE["x"], _CACHE["y"] = x[1200:], y[1200:]
    return _CACHE


def weights() -> dict:
    return {k: v.copy() for k, v in _trained()["w"].items()}


def heldout():
    return _trained()["x"], _trained()["y"]


def forward(w: dict, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        h = np.maximum(x @ w["hidden/kernel"] + w["hidden/bias"], 0)
        return h @ w["out/kernel"] + w["out/bias"]


def evaluate(w: dict) -> dict:
    """Outputs (logits), predictions (argmax) and accuracy: ``returns = ["outputs", "predictions", "metric"]``."""
    x, y = heldout()
    logits = forward(w, x)
    pred = np.argmax(logits, axis=1)
    return {"outputs": logits, "predictions": pred, "metric": float(np.mean(pred == y))}


def evaluate_logits(w: dict):
    """fastflip 0.1 style: (logits, accuracy) with no ``returns``: the logits become the answer."""
    d = evaluate(w)
    return d["outputs"], d["metric"]


def nothing(w: dict):
    return None


class Model:
    """A callable model (numpy) for the built-in classification evaluator."""

    def __init__(self) -> None:
        self.w = weights()

    def __call__(self, x):
        return forward(self.w, x)


def torch_model():
    import torch

    w = weights()
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(w["hidden/kernel"].T.copy()))
        m[0].bias.copy_(torch.from_numpy(w["hidden/bias"]))
        m[2].weight.copy_(torch.from_numpy(w["out/kernel"].T.copy()))
        m[2].bias.copy_(torch.from_numpy(w["out/bias"]))
    return m.eval()


def regression_data():
    """(images, label as a number): a toy regression target for the built-in regression evaluator."""
    x, y = heldout()
    return x, y.astype(np.float32)


def torch_regressor():
    """A least-squares linear fit of the digit's value on its pixels, as a torch.nn.Linear(64, 1)."""
    import torch

    from sklearn.datasets import load_digits

    xa, ya = load_digits(return_X_y=True)
    xa = np.hstack([(xa[:1200] / 16.0), np.ones((1200, 1))])
    coef = np.linalg.lstsq(xa, ya[:1200].astype(np.float64), rcond=None)[0]
    m = torch.nn.Linear(64, 1)
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(coef[:64].astype(np.float32)[None, :]))
        m.bias.copy_(torch.tensor([coef[64]], dtype=torch.float32))
    return m.eval()
