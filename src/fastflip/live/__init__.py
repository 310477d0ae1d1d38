"""Fault injection into live tensors: NumPy, PyTorch (CPU/CUDA), CuPy and TensorFlow/Keras variables.

Layer: ``live`` (may import files and below; imported by frameworks and above).

``inject(tensors, plan) -> LiveLog``, ``revert(tensors, log)``, ``injected(...)``
(context manager), ``targets(model)`` (prepare once for many trials) and
``tensor_refs(model)`` (to build a ``SiteSpace`` from a live model), ``site(model,
name, index, bits)`` (one explicit element). See
:mod:`fastflip.live.api`, :mod:`fastflip.live.targets` and
:mod:`fastflip.live.adapters` (tensor naming per framework).

Examples
--------
>>> import numpy as np
>>> from fastflip import live
>>> from fastflip.core.plan import Plan, TensorRef
>>> w = {"w": np.zeros(3, dtype=np.int8)}
>>> log = live.inject(w, Plan.from_sites([TensorRef("w", "i1", (3,))], [0], [2], or_mask=[0x81]))
>>> w["w"].tolist(), log.new_words.tolist()
([0, 0, -127], [129])
>>> live.revert(w, log); w["w"].tolist()
[0, 0, 0]
"""

from .api import LiveLog, inject, injected, plan_for, revert, select_live, targets, tensor_refs
from .sites import site
from .targets import Targets

__all__ = ["LiveLog", "Targets", "inject", "injected", "plan_for", "revert", "select_live", "site", "targets",
           "tensor_refs"]
