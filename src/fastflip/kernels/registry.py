"""The backend registry: one interface for every engine that applies the word rule, chosen in one place.

In the manner of ``numcodecs.registry``: a backend is a class with a ``name`` and the six raw kernels of
:class:`Backend` (read, write and apply words at byte offsets of one buffer, and at addresses given by a
pointer table), registered with :func:`register_backend` and fetched with :func:`get_backend`. The built-in
ones are registered by import path, so nothing heavy (Numba, CuPy) is imported until one is asked for:

- ``cython``: ``ext/_kernels.pyx`` built as ``fastflip.kernels._cython`` (word rule from ``ff_word.h``), CPU;
- ``numba``: the Numba CPU kernels of :mod:`fastflip.kernels.numba_cpu`, CPU;
- ``numpy``: vectorised NumPy (:mod:`fastflip.kernels.engines`), CPU, always there;
- ``cuda-raw``: CUDA C through CuPy/NVRTC (:mod:`fastflip.kernels.gpu`, word rule from ``ff_word.h``), GPU;
- ``numba-cuda``: Numba CUDA (:mod:`fastflip.kernels.gpu`; NumPy arrays under the simulator), GPU.

``'auto'`` is the first CPU backend of :data:`AUTO_ORDER` that loads. The kernels do no checking:
:mod:`fastflip.kernels.dispatch` validates every argument once and then calls one of them.

Imports: :mod:`fastflip.errors` only (backends load by import path). Used by
:mod:`fastflip.kernels.dispatch`, :mod:`fastflip.kernels.environment` and :mod:`fastflip.live.targets`.

Examples
--------
>>> import numpy as np
>>> be = get_backend("numpy")
>>> buf = np.array([0x00, 0x01], dtype=np.uint8)
>>> old, new = be.apply_words(buf, np.array([0], np.int64), 2, False, *(np.array([v], np.uint64) for v in (~0 & (2**64 - 1), 0, 1)))
>>> int(old[0]) == (0x0100 if np.little_endian else 0x0001), int(new[0]) - int(old[0])
(True, 1)
>>> "numpy" in available_backends()
True
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..errors import OptionError

__all__ = ["Backend", "register_backend", "get_backend", "registered_backends", "available_backends",
           "resolve_backend", "AUTO_ORDER"]

#: CPU backends in the order ``'auto'`` tries them.
AUTO_ORDER = ("cython", "numba", "numpy")


class Backend:
    """One engine's raw kernels (no validation; words are uint64 columns in native byte order).

    At byte offsets of one buffer (``buf`` a 1-D ``uint8`` array: host memory, a memory-mapped file,
    or a device array for the GPU backends), one word width ``itemsize`` and byte order (``swap``:
    stored order differs from this machine's):

    - ``read_words(buf, offsets, itemsize, swap) -> words``
    - ``write_words(buf, offsets, itemsize, swap, words)``
    - ``apply_words(buf, offsets, itemsize, swap, and_mask, or_mask, xor_mask) -> (old, new)``

    At the sites of a :class:`fastflip.core.records.SiteArrays` by address, ``table.bases[sites.tensor[i]] +
    sites.offsets[i]`` (``table`` its :class:`fastflip.core.records.TensorTable`, a
    :class:`fastflip.kernels.dispatch.PtrTable` of host tensors: per-tensor width and byte order):

    - ``read_ptrs(table, sites) -> words``
    - ``write_ptrs(table, sites, words)``
    - ``apply_ptrs(table, sites) -> (old, new)`` (the sites' and/or/xor masks)

    At the device-resident sites of a :class:`fastflip.kernels.gpu.SiteArrays` (GPU backends only: the sites
    are uploaded once, when a plan is prepared, and reused by every trial; ``buf`` the device span they
    point into):

    - ``read_sites(buf, sites) -> words``
    - ``write_sites(buf, sites, words)``
    - ``apply_sites(buf, sites) -> (old, new)`` (device arrays; scale sites included)
    - ``prepare_sites(sites)``: compile and load the kernels for the device of ``sites`` (called when a plan
      is prepared, so that a compiler failure comes before anything is flipped)

    GPU backends launch inside the device of ``sites`` and on the stream its tensors' framework uses
    (:func:`fastflip.kernels.gpu.device_scope`).

    Subclasses set ``name`` and ``device`` and may override :meth:`load`, which raises ImportError
    when the engine cannot run here (missing extension, Numba, CuPy or GPU).
    """

    name: str = ""
    device: str = "cpu"
    #: True when the engine's own kernels refuse (ValueError, before any word is touched) an offset outside
    #: its buffer or extent: :mod:`fastflip.kernels.dispatch` then leaves the bounds to them instead of checking
    #: every site first, and names the offending site only when they refuse.
    checks_bounds: bool = False

    def load(self) -> None:
        """Import what the engine needs (raise ImportError when it cannot run here)."""

    def read_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool) -> Any:
        raise NotImplementedError(f"backend {self.name!r} cannot read words at offsets")

    def write_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool, words: Any) -> None:
        raise NotImplementedError(f"backend {self.name!r} cannot write words at offsets")

    def apply_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
                    and_mask: Any, or_mask: Any, xor_mask: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"backend {self.name!r} cannot apply words at offsets")

    def read_ptrs(self, table: Any, sites: Any) -> np.ndarray:
        raise NotImplementedError(f"backend {self.name!r} cannot read words at addresses")

    def write_ptrs(self, table: Any, sites: Any, words: np.ndarray) -> None:
        raise NotImplementedError(f"backend {self.name!r} cannot write words at addresses")

    def apply_ptrs(self, table: Any, sites: Any) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError(f"backend {self.name!r} cannot apply words at addresses")

    def read_sites(self, buf: Any, sites: Any) -> Any:
        raise NotImplementedError(f"backend {self.name!r} cannot read device-resident sites")

    def write_sites(self, buf: Any, sites: Any, words: Any) -> None:
        raise NotImplementedError(f"backend {self.name!r} cannot write device-resident sites")

    def apply_sites(self, buf: Any, sites: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"backend {self.name!r} cannot apply device-resident sites")

    def prepare_sites(self, sites: Any) -> None:
        """Compile / load what :meth:`apply_sites` needs on the device of ``sites`` (nothing by default)."""

    def __repr__(self) -> str:
        return f"<fastflip backend {self.name!r} ({self.device})>"


# name -> a Backend class, or "module:Class" to import on first use
_REGISTRY: dict[str, type[Backend] | str] = {
    "cython": "fastflip.kernels.engines:CythonBackend",
    "numba": "fastflip.kernels.engines:NumbaBackend",
    "numpy": "fastflip.kernels.engines:NumpyBackend",
    "cuda-raw": "fastflip.kernels.gpu:RawCudaBackend",
    "numba-cuda": "fastflip.kernels.gpu:NumbaCudaBackend",
}
_LOADED: dict[str, Backend] = {}
_FAILED: dict[str, str] = {}


def register_backend(cls: type[Backend], name: str | None = None, *, replace: bool = False) -> type[Backend]:
    """Register a :class:`Backend` subclass under ``name`` (default ``cls.name``); usable as a decorator.

    Raises
    ------
    OptionError
        The name is taken (pass ``replace=True`` to override a registered backend) or empty.
    """
    key = name or cls.name
    if not key or key == "auto":
        raise OptionError(f"a backend needs a name other than {key!r}")
    if key in _REGISTRY and not replace and _REGISTRY[key] is not cls:
        raise OptionError(f"backend {key!r} is already registered (replace=True overrides it)")
    _REGISTRY[key] = cls
    _LOADED.pop(key, None)
    _LOADED.pop("auto", None)
    _FAILED.pop(key, None)
    return cls


def registered_backends() -> list[str]:
    """Every registered name, loadable here or not."""
    return list(_REGISTRY)


def _load(name: str) -> Backend:
    if name in _LOADED:
        return _LOADED[name]
    if name in _FAILED:
        raise ImportError(_FAILED[name])
    entry = _REGISTRY[name]
    try:
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        backend = entry()
        backend.load()
    except ImportError as exc:
        _FAILED[name] = str(exc) or type(exc).__name__
        raise
    _LOADED[name] = backend
    return backend


def available_backends(device: str | None = "cpu") -> list[str]:
    """Backends that load on this machine (``device='cpu'``, ``'gpu'`` or None for all), ``'auto'``'s
    order first."""
    names = [n for n in AUTO_ORDER if n in _REGISTRY] + [n for n in _REGISTRY if n not in AUTO_ORDER]
    out = []
    for n in names:
        try:
            be = _load(n)
        except ImportError:
            continue
        if device is None or be.device == device:
            out.append(n)
    return out


def resolve_backend(backend: str = "auto") -> str:
    """The name ``backend`` stands for: ``'auto'`` is the first CPU backend of :data:`AUTO_ORDER` that loads
    (later ones, e.g. Numba, a heavy import, are not touched).

    >>> resolve_backend("numpy")
    'numpy'
    """
    return get_backend(backend).name


def get_backend(name: str = "auto") -> Backend:
    """The loaded backend called ``name`` (``'auto'``: see :func:`resolve_backend`).

    Raises
    ------
    OptionError
        Unknown name, or the backend cannot run here (the message says why).
    """
    if name in _LOADED:
        return _LOADED[name]
    if name == "auto":
        for n in AUTO_ORDER:
            try:
                be = _load(n)
            except (ImportError, KeyError):
                continue
            _LOADED["auto"] = be
            return be
        raise OptionError("no CPU backend loads here")  # pragma: no cover - numpy always does
    if name not in _REGISTRY:
        raise OptionError(f"unknown backend {name!r}: use one of auto, {', '.join(_REGISTRY)}")
    try:
        return _load(name)
    except ImportError as exc:
        raise OptionError(f"backend {name!r} is not available: {exc}") from None
