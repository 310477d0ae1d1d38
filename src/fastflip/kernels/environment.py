"""What this installation of fastflip can use: versions, kernel backends, GPU engines, optional extras.

Layer: ``kernels`` (may import core and kernels; imported by files, live and above).

Imports :mod:`fastflip.kernels.registry`; the CLI's ``fastflip info`` prints it. Optional extras are
found with :func:`importlib.util.find_spec` and their versions read from package metadata, so nothing heavy
is imported to answer, except Numba when the CPU backends are probed (``backends=True``).

Examples
--------
>>> d = describe(backends=False)
>>> d["fastflip"] == __import__("fastflip").__version__
True
>>> "numpy" in d["core"] and "h5py" in d["core"]
True
"""

from __future__ import annotations

import importlib.util
import platform
from typing import Any

from .. import __version__
from .registry import available_backends, resolve_backend

__all__ = ["EXTRAS", "EXTRA_FOR_MODULE", "describe", "format_description", "missing_extra"]

#: Optional extras: import name -> distribution names to read a version from (first found wins).
EXTRAS: dict[str, tuple[str, ...]] = {
    "numba": ("numba",),
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "keras": ("keras",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "dask": ("dask",),
    "distributed": ("distributed",),
    "pyarrow": ("pyarrow",),
    "matplotlib": ("matplotlib",),
    "sklearn": ("scikit-learn",),
    "scipy": ("scipy",),
    "yaml": ("pyyaml",),
    "rich": ("rich",),
    "safetensors": ("safetensors",),
}


#: Top-level module -> the package extra that installs it (``pip install 'fastflip[EXTRA]'``).
EXTRA_FOR_MODULE: dict[str, str] = {
    "numba": "numba", "torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow", "cupy": "cupy-cuda12",
    "dask": "dask", "distributed": "dask", "dask_jobqueue": "dask", "pyarrow": "parquet", "matplotlib": "plot",
    "sklearn": "demo", "scipy": "test", "yaml": "yaml", "rich": "progress", "safetensors": "safetensors",
}


def missing_extra(exc: BaseException) -> str | None:
    """The one-line advice for an ImportError of an optional extra, or None if ``exc`` is not one.

    >>> missing_extra(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    "needs matplotlib, which is not installed: pip install 'fastflip[plot]'"
    """
    name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    top = (name or "").split(".")[0]
    if top not in EXTRA_FOR_MODULE:
        return None
    return f"needs {top}, which is not installed: pip install 'fastflip[{EXTRA_FOR_MODULE[top]}]'"


def _version(dists: tuple[str, ...]) -> str | None:
    import importlib.metadata  # 30 ms (email, socket, ...): only when versions are asked for

    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _gpu() -> dict[str, Any]:
    """CUDA devices through CuPy when it is installed (imports CuPy only then)."""
    if importlib.util.find_spec("cupy") is None:
        return {"cupy": False, "devices": 0, "why": "cupy not installed (extras cupy-cuda12 / cupy-cuda13)"}
    try:
        import cupy  # optional extra

        n = int(cupy.cuda.runtime.getDeviceCount())
        return {"cupy": True, "devices": n, "why": None if n else "no CUDA device visible"}
    except Exception as exc:  # no driver, no device, broken install: say which
        return {"cupy": True, "devices": 0, "why": f"{type(exc).__name__}: {exc}".splitlines()[0]}


def describe(backends: bool = True) -> dict[str, Any]:
    """Versions and capabilities of this installation, as a JSON-ready dict.

    Parameters
    ----------
    backends : bool
        Probe the CPU kernel backends (imports Numba when installed) and CUDA devices (imports CuPy).
    """
    import h5py
    import numpy as np

    out: dict[str, Any] = {
        "fastflip": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "core": {"numpy": np.__version__, "h5py": h5py.version.version, "hdf5": h5py.version.hdf5_version},
        "native_kernels": importlib.util.find_spec("fastflip.kernels._cython") is not None,
        "extras": {name: _version(d) if importlib.util.find_spec(name) is not None else None
                   for name, d in EXTRAS.items()},
    }
    if backends:
        out["cpu_backends"] = available_backends("cpu")
        out["default_backend"] = resolve_backend("auto")
        out["gpu"] = _gpu()
    return out


def format_description(d: dict[str, Any]) -> str:
    """The text form of :func:`describe` shown by ``fastflip info``."""
    lines = [f"fastflip {d['fastflip']} on Python {d['python']} ({d['platform']})",
             "core: " + ", ".join(f"{k} {v}" for k, v in d["core"].items()),
             "native (Cython) kernels: " + ("built" if d["native_kernels"] else
                                            "not built: the NumPy/Numba backends are used")]
    if "cpu_backends" in d:
        lines.append(f"CPU backends: {', '.join(d['cpu_backends'])} (auto = {d['default_backend']})")
        g = d["gpu"]
        lines.append(f"GPU: {g['devices']} CUDA device(s)" + (f" ({g['why']})" if g["why"] else ""))
    have = [f"{k} {v}" for k, v in d["extras"].items() if v]
    missing = [k for k, v in d["extras"].items() if not v]
    lines.append("extras: " + (", ".join(have) or "none"))
    if missing:
        lines.append("not installed: " + ", ".join(missing))
    return "\n".join(lines)
