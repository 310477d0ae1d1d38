"""The GPU word kernels and their compilation: the CUDA C source (NVRTC via CuPy, or the host C compiler
for the tests) and the Numba CUDA kernels, compiled once per device and process, and their launch.

Layer: ``kernels`` (may import core and kernels; imported by files, live and above).

:data:`CUDA_SOURCE` is ``ff_word.h`` (the word rule, loads and stores written once for every C dialect)
followed by three kernels, ``ff_apply``, ``ff_read`` and ``ff_write``; :func:`get_raw_kernels` compiles it
with NVRTC for one device (``cuda-raw``), :func:`build_host_library` with ``-DFF_HOST`` for the host.
:func:`get_gpu_kernels` builds the same three kernels with Numba CUDA from the per-site functions of
:mod:`fastflip.kernels.numba_cpu` (``numba-cuda``; Numba's simulator under ``NUMBA_ENABLE_CUDASIM=1``).
:func:`launch` runs one of them on the device and stream :mod:`fastflip.kernels.gpu` has entered.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import numpy as np

from .numba_cpu import load_word, rule, store_word
from ..errors import DeviceError, one_line

__all__ = ["CUDA_SOURCE", "THREADS", "build_host_library", "get_gpu_kernels", "get_raw_kernels", "grid", "launch"]

THREADS = 256
_KERNELS: dict[Any, Any] = {}  # "numba-cuda" -> Numba dispatchers; ("cuda-raw", device id) -> that device's functions
cuda: Any = None  # numba.cuda, bound on first use (a module global so the simulator can swap it)


def get_gpu_kernels() -> dict[str, Any]:
    """Compile (once per process) the CUDA kernels ``apply``, ``read`` and ``write``."""
    global cuda
    if "numba-cuda" in _KERNELS:
        return _KERNELS["numba-cuda"]
    from numba import cuda as numba_cuda

    cuda = numba_cuda

    d_load = cuda.jit(device=True)(load_word)
    d_store = cuda.jit(device=True)(store_word)
    d_rule = cuda.jit(device=True)(rule)

    @cuda.jit
    def apply(buf, offsets, tensor, itemsizes, swaps, a, o, x, old_out, new_out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            old = d_load(buf, offsets[i], itemsizes[t], swaps[t])
            new = d_rule(old, a[i], o[i], x[i], itemsizes[t])
            d_store(buf, offsets[i], itemsizes[t], swaps[t], new)
            old_out[i] = old
            new_out[i] = new

    @cuda.jit
    def read(buf, offsets, tensor, itemsizes, swaps, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            out[i] = d_load(buf, offsets[i], itemsizes[t], swaps[t])

    @cuda.jit
    def write(buf, offsets, tensor, itemsizes, swaps, words):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            d_store(buf, offsets[i], itemsizes[t], swaps[t], words[i])

    _KERNELS["numba-cuda"] = {"apply": apply, "read": read, "write": write}
    return _KERNELS["numba-cuda"]


def _word_header() -> str:
    """``ff_word.h`` (package data): the word rule and word access shared with the Cython kernels."""
    return importlib.resources.files(__package__).joinpath("ff_word.h").read_text(encoding="utf-8")


#: The CUDA C kernels: ``ff_word.h`` (word rule, loads and stores, written once for every C dialect)
#: followed by the three kernels. NVRTC compiles it for the device; ``-DFF_HOST`` for the host.
CUDA_SOURCE = _word_header() + r"""
FF_GLOBAL void ff_apply(unsigned char* buf, const ff_i64* offsets, const int* tensor, const int* itemsizes,
                        const unsigned char* swaps, const ff_u64* a, const ff_u64* o, const ff_u64* x,
                        ff_u64* old_out, ff_u64* new_out, ff_i64 n) {
    FF_SITES(i, n) {
        int t = tensor[i];
        unsigned char* p = buf + offsets[i];
        ff_u64 old = ff_load(p, itemsizes[t], swaps[t]);
        ff_u64 nw = ff_rule(old, a[i], o[i], x[i], itemsizes[t]);
        ff_store(p, itemsizes[t], swaps[t], nw);
        old_out[i] = old;
        new_out[i] = nw;
    }
}

FF_GLOBAL void ff_read(const unsigned char* buf, const ff_i64* offsets, const int* tensor, const int* itemsizes,
                       const unsigned char* swaps, ff_u64* out, ff_i64 n) {
    FF_SITES(i, n) {
        int t = tensor[i];
        out[i] = ff_load(buf + offsets[i], itemsizes[t], swaps[t]);
    }
}

FF_GLOBAL void ff_write(unsigned char* buf, const ff_i64* offsets, const int* tensor, const int* itemsizes,
                        const unsigned char* swaps, const ff_u64* words, ff_i64 n) {
    FF_SITES(i, n) {
        int t = tensor[i];
        ff_store(buf + offsets[i], itemsizes[t], swaps[t], words[i]);
    }
}
"""


def build_host_library(directory: str, compiler: str = "cc") -> Any:
    """Compile :data:`CUDA_SOURCE` for the host (``-DFF_HOST``) and load it with ctypes.

    The returned library has ``ff_apply``, ``ff_read`` and ``ff_write`` taking the
    kernel's arguments as raw pointers; tests use it to check the GPU source.
    """
    import ctypes
    import os
    import subprocess

    src = os.path.join(directory, "ff_kernels.c")
    lib = os.path.join(directory, "ff_kernels.so")
    with open(src, "w") as f:
        f.write(CUDA_SOURCE)
    subprocess.run([compiler, "-DFF_HOST", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True,
                   capture_output=True, text=True)
    return ctypes.CDLL(lib)


def get_raw_kernels(device: int | None = None) -> dict[str, Any]:
    """The CUDA C kernels (``apply``, ``read``, ``write``) compiled with NVRTC and loaded on ``device``
    (None: CuPy's current device), once per device and process.

    A CuPy function is bound to the device that was current when it was fetched, so the cache is keyed
    by device: a kernel loaded on device 0 is never launched on device 1.

    Raises
    ------
    DeviceError
        NVRTC is missing or fails (one line; nothing has been launched).
    """
    import cupy

    dev = cupy.cuda.Device().id if device is None else int(device)
    key = ("cuda-raw", dev)
    if key not in _KERNELS:
        try:
            with cupy.cuda.Device(dev):
                module = cupy.RawModule(code=CUDA_SOURCE)
                _KERNELS[key] = {k: module.get_function(f"ff_{k}") for k in ("apply", "read", "write")}
        except Exception as exc:  # CompileException, NVRTCError, RuntimeError/ImportError/OSError (no libnvrtc)
            raise DeviceError(f"cannot compile fastflip's CUDA kernels for device {dev} with NVRTC "
                              f"({type(exc).__name__}: {one_line(exc)}): install NVRTC for your CUDA version "
                              "(pip install 'fastflip[cupy-cuda12]' brings it); nothing was flipped") from None
    return _KERNELS[key]


def grid(n: int) -> int:
    """Blocks of :data:`THREADS` threads that cover ``n`` sites (at least one)."""
    return max(1, (n + THREADS - 1) // THREADS)


def launch(sites: Any, kind: str, engine: str, n: int, *args: Any) -> None:
    """Launch kernel ``kind`` (apply/read/write) of ``engine`` over ``n`` sites with ``args`` (the kernel's,
    without n), on the current device and stream: ``sites`` is a :class:`fastflip.kernels.gpu.SiteArrays`
    (its ``device`` and ``xp``); callers are inside :func:`fastflip.kernels.gpu.device_scope`."""
    if engine == "cuda-raw":
        get_raw_kernels(sites.device)[kind]((min(grid(n), 1 << 22),), (THREADS,), (*args, np.int64(n)))
    elif sites.xp is np:  # Numba's simulator
        get_gpu_kernels()[kind][grid(n), THREADS](*args)
    else:  # Numba on CuPy arrays: Numba's context of the device, CuPy's current stream
        kernels = get_gpu_kernels()
        with cuda.gpus[sites.xp.cuda.Device().id]:
            stream = cuda.external_stream(sites.xp.cuda.get_current_stream().ptr)
            kernels[kind][grid(n), THREADS, stream](*args)
