"""Framework side of activation faults: the hooks for a model's framework (find layers by name, hook their
outputs, probe output shapes).

Layer: ``live`` (may import files and below; imported by frameworks and above).

PyTorch: forward hooks on the selected modules (named by module path, ``layer1.0.conv2``,
for any ``nn.Module`` subclass, nested; tuple/dict outputs give their first tensor or the
element a ``MODULE:out.K`` target names, :mod:`fastflip.live.act_targets`), an
:class:`~fastflip.live.act_ops.OpWatch` for functional targets (``MODULE:softmax``,
``MODULE:cache.key``) and a forward pre-hook on the model itself
that counts forwards and, at the first one, probes the selected layers' output
shapes. The probe runs the same call on the ``meta`` device (no computation, no
side effects); when the model cannot run there (data-dependent Python, autocast),
it runs the real call with copies of the buffers (BatchNorm statistics stay as
they are), the RNG state restored and gradients off.

Keras 3: the selected layers' ``call`` is wrapped on the instance (the class is not
touched) and restored exactly on exit; layers are named by their ``name`` (nested
layers of subclassed models included). While the block runs the model runs eagerly
(``run_eagerly``), so that ``predict``/``evaluate`` see the wrapped calls; compiled
functions are dropped on entry and exit. The probe is ``compute_output_spec``
(symbolic), or the real call when that fails.

:func:`hooks_for` picks the framework's hooks (:mod:`fastflip.live.act_torch`,
:mod:`fastflip.live.act_keras`, sharing :mod:`fastflip.live.act_hooks`); torch and keras are imported
lazily by the class that needs them.
"""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from .act_hooks import Hooks
from .act_keras import KerasHooks
from .act_torch import TorchHooks

__all__ = ["hooks_for"]


def hooks_for(model: Any) -> Hooks:
    """The activation hooks of ``model``: :class:`TorchHooks` for a ``torch.nn.Module``, :class:`KerasHooks` for a
    Keras model (an :class:`~fastflip.errors.OptionError` for anything else)."""
    mod = type(model).__module__.split(".")[0]
    try:
        import torch

        if isinstance(model, torch.nn.Module):
            return TorchHooks(model)
    except ImportError:  # pragma: no cover - torch is an extra
        pass
    if hasattr(model, "_flatten_layers") and hasattr(model, "call"):
        return KerasHooks(model)
    raise OptionError(f"activation faults need a torch.nn.Module or a Keras model, got {type(model).__name__} ({mod})")
