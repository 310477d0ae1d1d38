"""Your own PyTorch model in a fastflip experiment.

Point an experiment at this file::

    trainer:
      framework: torch
      model_file: torch_model.py     # relative to the configuration file
      batch_size: 64

fastflip's built-in PyTorch trainer imports the file and calls:

``build_model()``
    Return a ``torch.nn.Module`` producing logits. Called after
    ``torch.manual_seed(seed)``, so its initial weights follow the experiment seed.
``load_data()``
    Return ``(x_train, y_train, x_test, y_test)`` as NumPy arrays (integer labels).
``build_optimizer(model)`` (optional)
    Return the optimizer; default ``torch.optim.Adam(lr=3e-3)``.
``loss_fn(logits, targets)`` (optional)
    Return the scalar loss; default cross-entropy.

Checkpoints are written with :func:`fastflip.frameworks.torch_state.save_checkpoint`: the model's
tensors under ``/model/<state_dict key>``, the optimizer's state under
``/optimizer/state/<param id>/<name>`` (``exp_avg``, ``momentum_buffer``, ...), so
selections such as ``{roles: [optimizer-moment]}`` or ``{layers: ["0"]}`` work.
"""

from __future__ import annotations

import numpy as np
import torch


def load_data():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.data.astype("float32") / 16.0
    y = d.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    return x[360:], y[360:], x[:360], y[:360]


def build_model():
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.BatchNorm1d(64),
        torch.nn.Linear(64, 10),
    )


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def loss_fn(logits, targets):
    return torch.nn.functional.cross_entropy(logits, targets)
