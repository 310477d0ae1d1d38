"""Where the modules of fastflip 0.1's flat layout went (issue 12), and the import hook that keeps the old
paths working with a :class:`DeprecationWarning`.

``import fastflip.native``, ``from fastflip.layout import Tensor`` or ``fastflip.torch`` still work: the finder
below, installed at the front of :data:`sys.meta_path` by ``fastflip/__init__.py``, answers for every old
dotted name (and the submodules of old packages, e.g. ``fastflip.formats.torchsave``) with the module at its
new path, so both names are one module object. No file is left at an old path.

Imports: nothing of fastflip (the root package imports it).

>>> import warnings, importlib, sys
>>> sys.modules.pop("fastflip.faults", None) and None
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     old = importlib.import_module("fastflip.faults")
>>> old is importlib.import_module("fastflip.core.faults"), caught[0].category.__name__
(True, 'DeprecationWarning')
>>> new_path("fastflip.formats.torchsave")
'fastflip.files.formats.torchsave'
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "new_path", "install"]

#: Old module name (relative to ``fastflip``) -> its new name. ``fastflip.experiment`` is not here: it is
#: now a package that re-exports what the module exported (its code is in ``fastflip.experiment.runner``).
MOVED: dict[str, str] = {
    "dtypes": "core.dtypes",
    "floatformats": "core.floatformats",
    "bits": "core.bits",
    "faults": "core.faults",
    "sampling": "core.sampling",
    "plan": "core.plan",
    "wordrule": "core.wordrule",
    "reference": "core.reference",
    "permutation": "core.permutation",
    "configcheck": "core.configcheck",
    "native": "kernels.dispatch",
    "kernels_numba": "kernels.numba_cpu",
    "kernels_cupy": "kernels.gpu",
    "environment": "kernels.environment",
    "_kernels": "kernels._cython",
    "layout": "files.layout",
    "roles": "files.roles",
    "select": "files.select",
    "h5target": "files.h5apply",
    "h5chunks": "files.h5chunks",
    "patches": "files.patches",
    "fileio": "files.fileio",
    "inject": "files.inject",
    "log": "files.log",
    "logcheck": "files.logcheck",
    "diff": "files.diff",
    "paths": "files.paths",
    "locks": "files.locks",
    "keras_io": "files.keras_archive",
    "formats": "files.formats",
    "torch": "frameworks.torch_state",
    "convert": "frameworks.convert",
    "trainers": "frameworks.trainers",
    "experiment_config": "experiment.config",
    "experiment_outcomes": "experiment.outcomes",
    "store": "campaign.store",
    "store_guard": "campaign.store_guard",
    "stats": "campaign.stats",
    "significance": "campaign.significance",
    "outcomes": "campaign.outcomes",
    "oldconfig": "compat.oldconfig",
}


def new_path(fullname: str) -> str | None:
    """The new dotted name of an old one (``fastflip.native`` -> ``fastflip.kernels.dispatch``), else None."""
    if not fullname.startswith("fastflip."):
        return None
    parts = fullname.split(".")[1:]
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in MOVED:
            return ".".join(["fastflip", MOVED[key], *parts[i:]])
    return None


def _stacklevel() -> int:
    """The caller's frame: the first one outside the import machinery and this module (``warnings``
    itself skips the frozen importlib frames, so they are not counted)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename in (__file__, importlib.__file__)):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1
        frame = frame.f_back
    return level


def warn_moved(old: str, new: str) -> None:
    """Say once per call site that ``old`` is now ``new``."""
    warnings.warn(f"{old} moved to {new}; import it from there (the old path will be removed)",
                  DeprecationWarning, stacklevel=_stacklevel())


def warn_renamed(old: str, new: str) -> None:
    """Say that the public name ``old`` (``module.NAME``) is now ``new`` in the same module."""
    warnings.warn(f"{old} is renamed {new} (the old name will be removed)", DeprecationWarning,
                  stacklevel=3)


class _AliasLoader:  # importlib.abc.Loader's protocol (not its class: importlib.abc costs 35 ms at start-up)
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warn_moved(spec.name, self.new)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed; the import system set its ``__spec__`` to the
        alias's, so give it back its own (relative imports inside it rely on it)."""
        module.__spec__ = self.spec


class _AliasFinder:  # importlib.abc.MetaPathFinder's protocol
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


_FINDER = _AliasFinder()


def install() -> None:
    """Put the finder at the front of :data:`sys.meta_path` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
