"""fastflip: exact, fast, reproducible bit flips in HDF5 checkpoints and live tensors.

The public API is imported lazily so that ``import fastflip`` stays light (NumPy
and h5py are imported on first use, deep-learning frameworks only by adapters).

>>> import fastflip
>>> fastflip.FaultModel.parse("burst:2").n
2
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# Library messages go to the "fastflip" logger; a host application decides where they go (the CLI maps -v/-q).
logging.getLogger(__name__).addHandler(logging.NullHandler())

_EXPORTS = {
    "inject_file": "files.inject", "replay": "files.replay", "revert": "files.revert",
    "InjectionResult": "files.inject", "InjectionLog": "files.log",
    "inject_dir": "files.sharded", "replay_dir": "files.sharded", "revert_dir": "files.sharded", "read_layout": "files.layout",
    "Layout": "files.layout", "Tensor": "files.layout", "Selection": "files.select", "select": "files.select",
    "BitSpec": "core.bits", "FaultModel": "core.faults", "SiteSpace": "core.sampling",
    "Sampling": "core.spec",
    "Plan": "core.plan", "TensorRef": "core.plan", "diff_files": "files.diff", "FastflipError": "errors",
    "injected": "live", "tensor_refs": "live", "site": "live",
    "injected_activations": "live.activations", "ActivationLog": "live.activations",
}

__all__ = ["__version__", *_EXPORTS]

# The layers (docs/internals.md), imported on first attribute access: ``fastflip.core.plan`` after ``import fastflip``.
_SUBPACKAGES = ("core", "kernels", "files", "live", "frameworks", "campaign", "experiment", "report", "compat", "cli")


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None and name in _SUBPACKAGES:  # fastflip.core, fastflip.files, ...
        return importlib.import_module(f"{__name__}.{name}")
    if mod is None:
        raise AttributeError(f"module 'fastflip' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
