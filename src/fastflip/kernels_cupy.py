"""GPU word kernel: a Numba CUDA kernel driven with CuPy arrays, one launch per plan.

The kernel compiles the per-site functions of :mod:`fastflip.kernels_numba`
(:func:`~fastflip.kernels_numba.load_word`, ``store_word``, ``rule``) with
``numba.cuda.jit(device=True)``, so the word logic the GPU runs is the one the CPU
tests check against :mod:`fastflip.reference`. Under ``NUMBA_ENABLE_CUDASIM=1``
the same kernel runs in Numba's CUDA simulator on NumPy arrays, which is how the
tests exercise it on machines without a GPU.

Several tensors on one device are addressed through one ``uint8`` *span*: a view
from the lowest tensor address to the end of the highest (device memory is one flat
address space), with each site's byte offset taken relative to the span's start.
Only bytes inside the tensors are ever touched (:mod:`fastflip.live` validates the
plan against every tensor's shape before building the offsets).

Value-level (scale) sites: the kernel returns their old words, the new words are
computed by :func:`fastflip.wordrule.scale_words` on the host (only the scale
sites' words cross the bus, never a tensor) and written back by a second launch.

Examples
--------
>>> import numpy as np
>>> k = SiteArrays.from_host(offsets=[0], tensor=[0], sizes=[4], little=[True],
...                          and_mask=[2**64 - 1], or_mask=[0], xor_mask=[1], xp=np)
>>> len(k)
1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .kernels_numba import load_word, rule, store_word
from .wordrule import scale_words

__all__ = ["SiteArrays", "get_gpu_kernels", "launch_apply", "launch_read", "launch_write", "device_span", "THREADS"]

THREADS = 256
_KERNELS: dict[str, Any] = {}
cuda: Any = None  # numba.cuda, bound on first use (a module global so the simulator can swap it)


def get_gpu_kernels() -> dict[str, Any]:
    """Compile (once per process) the CUDA kernels ``apply``, ``read`` and ``write``."""
    global cuda
    if _KERNELS:
        return _KERNELS
    from numba import cuda as numba_cuda

    cuda = numba_cuda

    d_load = cuda.jit(device=True)(load_word)
    d_store = cuda.jit(device=True)(store_word)
    d_rule = cuda.jit(device=True)(rule)

    @cuda.jit
    def apply(buf, offsets, tensor, sizes, little, a, o, x, old_out, new_out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            old = d_load(buf, offsets[i], sizes[t], little[t])
            new = d_rule(old, a[i], o[i], x[i], sizes[t])
            d_store(buf, offsets[i], sizes[t], little[t], new)
            old_out[i] = old
            new_out[i] = new

    @cuda.jit
    def read(buf, offsets, tensor, sizes, little, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            out[i] = d_load(buf, offsets[i], sizes[t], little[t])

    @cuda.jit
    def write(buf, offsets, tensor, sizes, little, words):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            t = tensor[i]
            d_store(buf, offsets[i], sizes[t], little[t], words[i])

    _KERNELS.update(apply=apply, read=read, write=write)
    return _KERNELS


@dataclass
class SiteArrays:
    """A plan's columns on the device (built once per plan and device, applied many times).

    ``offsets`` are byte offsets into the device span, ``tensor`` indexes ``sizes``
    (word bytes) and ``little`` (stored little-endian) per tensor; ``scale_pos`` and
    ``scale_factors`` (host arrays) list the value-level sites and ``scale_dtypes``
    their dtypes.
    """

    offsets: Any
    tensor: Any
    sizes: Any
    little: Any
    and_mask: Any
    or_mask: Any
    xor_mask: Any
    xp: Any
    scale_pos: np.ndarray | None = None
    scale_factors: np.ndarray | None = None
    scale_dtypes: Sequence[np.dtype] | None = None

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    @classmethod
    def from_host(cls, offsets: Any, tensor: Any, sizes: Any, little: Any, and_mask: Any, or_mask: Any,
                  xor_mask: Any, xp: Any, scale: Any = None, dtypes: Sequence[Any] | None = None) -> "SiteArrays":
        """Copy host columns to the device of ``xp`` (``cupy``, or ``numpy`` under the simulator)."""
        def put(v: Any, dtype: Any) -> Any:
            return xp.asarray(np.ascontiguousarray(np.asarray(v).astype(dtype)))

        u64 = lambda v: np.asarray(v, dtype=object).astype(np.uint64) if not isinstance(v, np.ndarray) else v  # noqa: E731
        pos = factors = None
        if scale is not None:
            f = np.asarray(scale, dtype=np.float64)
            where = np.flatnonzero(~np.isnan(f))
            if len(where):
                pos, factors = where, f[where]
        return cls(
            offsets=put(offsets, np.int64), tensor=put(tensor, np.int32), sizes=put(sizes, np.int32),
            little=put(little, np.bool_), and_mask=put(u64(and_mask), np.uint64), or_mask=put(u64(or_mask), np.uint64),
            xor_mask=put(u64(xor_mask), np.uint64), xp=xp, scale_pos=pos, scale_factors=factors,
            scale_dtypes=None if dtypes is None else [np.dtype(d) for d in dtypes],
        )


def _grid(n: int) -> int:
    return max(1, (n + THREADS - 1) // THREADS)


def _host(xp: Any, arr: Any) -> np.ndarray:
    return np.asarray(arr) if xp is np else xp.asnumpy(arr)


def launch_apply(buf: Any, sites: SiteArrays, sync: bool = True) -> tuple[Any, Any]:
    """Apply ``sites`` to the device span ``buf`` in one launch; returns (old, new) device arrays.

    Scale sites (if any) then take one read-back of their old words, the host
    computation, and one more launch to write their new words.
    """
    xp, n = sites.xp, len(sites)
    old = xp.empty(n, dtype=xp.uint64)
    new = xp.empty(n, dtype=xp.uint64)
    if n == 0:
        return old, new
    k = get_gpu_kernels()
    k["apply"][_grid(n), THREADS](buf, sites.offsets, sites.tensor, sites.sizes, sites.little,
                                  sites.and_mask, sites.or_mask, sites.xor_mask, old, new)
    if sites.scale_pos is not None:
        pos = sites.scale_pos
        old_h = _host(xp, old)[pos]
        tid_h = _host(xp, sites.tensor)[pos]
        new_h = np.empty(len(pos), dtype=np.uint64)
        assert sites.scale_dtypes is not None
        for t in np.unique(tid_h):
            sel = tid_h == t
            new_h[sel] = scale_words(old_h[sel], sites.scale_factors[sel], sites.scale_dtypes[int(t)])
        d_pos = xp.asarray(pos)
        new[d_pos] = xp.asarray(new_h)
        k["write"][_grid(len(pos)), THREADS](buf, sites.offsets[d_pos], sites.tensor[d_pos], sites.sizes,
                                             sites.little, new[d_pos])
    if sync and xp is not np:
        xp.cuda.get_current_stream().synchronize()
    return old, new


def launch_read(buf: Any, sites: SiteArrays) -> Any:
    """Words (native order) of every site, as a device array."""
    xp, n = sites.xp, len(sites)
    out = xp.empty(n, dtype=xp.uint64)
    if n:
        get_gpu_kernels()["read"][_grid(n), THREADS](buf, sites.offsets, sites.tensor, sites.sizes, sites.little, out)
    return out


def launch_write(buf: Any, sites: SiteArrays, words: Any) -> None:
    """Store ``words`` (device array, native order) at every site."""
    n = len(sites)
    if n:
        get_gpu_kernels()["write"][_grid(n), THREADS](buf, sites.offsets, sites.tensor, sites.sizes, sites.little,
                                                      sites.xp.asarray(words))


def device_span(ptrs: Sequence[int], nbytes: Sequence[int], device_id: int, owner: Any) -> tuple[Any, int]:
    """A CuPy ``uint8`` array over ``[min(ptrs), max(ptr + nbytes))`` and its start address.

    ``owner`` (e.g. the list of tensors) is kept alive by the array.
    """
    import cupy

    base = int(min(ptrs))
    end = int(max(p + n for p, n in zip(ptrs, nbytes)))
    mem = cupy.cuda.UnownedMemory(base, max(end - base, 1), owner, device_id)
    return cupy.ndarray((max(end - base, 1),), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0)), base
