"""Numba word kernels, and the per-site word logic shared with the GPU kernel.

Layer: ``kernels`` (may import core and kernels; imported by files, live and above).

The per-site functions :func:`load_word`, :func:`store_word` and :func:`rule` are
plain Python over a ``uint8`` buffer: this module compiles them with ``numba.njit``
for the CPU, and :mod:`fastflip.kernels.gpu` compiles the *same* functions with
``numba.cuda.jit(device=True)`` for the GPU. Testing the CPU instantiation against
:mod:`fastflip.core.reference` therefore tests the GPU kernel's word logic as well.

Words are assembled byte by byte, so unaligned offsets work everywhere. ``swap`` is
fastflip's one byte-order flag: True when the stored order differs from this machine's.
Nothing here validates: :mod:`fastflip.kernels.dispatch` checks every argument once.
Kernels compile lazily on first use and are cached on disk (``cache=True``).

Examples
--------
>>> import numpy as np
>>> buf = np.frombuffer(np.array([1.0], dtype="<f4").tobytes(), dtype=np.uint8).copy()
>>> hex(int(load_word(buf, 0, 4, not np.little_endian)))
'0x3f800000'
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

__all__ = ["load_word", "store_word", "rule", "get_kernels", "make_pointer_intrinsic"]

_NATIVE_LITTLE = bool(np.little_endian)  # a compile-time constant of the Numba kernels


def load_word(buf: np.ndarray, off: int, size: int, swap: bool) -> np.uint64:
    """The ``size``-byte word stored at ``buf[off:off+size]`` as a native integer."""
    little = _NATIVE_LITTLE if not swap else not _NATIVE_LITTLE
    w = np.uint64(0)
    for j in range(size):
        shift = j if little else size - 1 - j
        w |= np.uint64(buf[off + j]) << np.uint64(8 * shift)
    return w


def store_word(buf: np.ndarray, off: int, size: int, swap: bool, w: np.uint64) -> None:
    """Store the native integer ``w`` as a ``size``-byte word at ``buf[off:off+size]``."""
    little = _NATIVE_LITTLE if not swap else not _NATIVE_LITTLE
    for j in range(size):
        shift = j if little else size - 1 - j
        buf[off + j] = np.uint8((w >> np.uint64(8 * shift)) & np.uint64(0xFF))


def rule(old: np.uint64, a: np.uint64, o: np.uint64, x: np.uint64, size: int) -> np.uint64:
    """``((old & a) | o) ^ x`` truncated to a ``size``-byte word."""
    width = np.uint64(0xFFFFFFFFFFFFFFFF)
    if size < 8:
        width = (np.uint64(1) << np.uint64(8 * size)) - np.uint64(1)
    return (((old & a) | o) ^ x) & width


_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()  # one compilation, and no half-filled cache seen by another thread


def make_pointer_intrinsic() -> Callable[..., Any]:
    """A Numba intrinsic turning an integer address into a ``uint8*`` (CPU target)."""
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def as_u8_pointer(typingctx: Any, addr: Any) -> Any:
        sig = types.CPointer(types.uint8)(types.uint64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))

        return sig, codegen

    return as_u8_pointer


def get_kernels() -> dict[str, Any]:
    """Compile (once per process, cached on disk) and return the CPU kernels.

    Keys: ``apply_words``, ``read_words``, ``write_words`` (one buffer, one word width, the
    signatures of :mod:`fastflip.kernels._cython`) and ``apply_ptrs``, ``read_ptrs``, ``write_ptrs``
    (several tensors by base address: a TensorTable's ``bases``, ``itemsizes``, ``swaps`` columns).
    """
    if not _CACHE:
        with _LOCK:
            if not _CACHE:
                _CACHE.update(_compile())  # one C-level update: other threads see all kernels or none
    return _CACHE


def _compile() -> dict[str, Any]:
    """JIT-compile the CPU kernels (see :func:`get_kernels`)."""
    import numba

    jit = numba.njit(cache=True, nogil=True)
    _load = jit(load_word)
    _store = jit(store_word)
    _rule = jit(rule)
    as_ptr = make_pointer_intrinsic()

    # the loops take the word width as a literal (one specialization per width), so the
    # byte loops of load_word/store_word unroll: 2-3x faster than a run-time width
    @jit
    def _apply_loop(buf, offsets, size, swap, a, o, x, old_out, new_out):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            old = _load(buf, offsets[i], size, swap)
            new = _rule(old, a[i], o[i], x[i], size)
            _store(buf, offsets[i], size, swap, new)
            old_out[i] = old
            new_out[i] = new

    @jit
    def _read_loop(buf, offsets, size, swap, out):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            out[i] = _load(buf, offsets[i], size, swap)

    @jit
    def _write_loop(buf, offsets, size, swap, words):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            _store(buf, offsets[i], size, swap, words[i])

    @jit
    def apply_words(buf, offsets, size, swap, a, o, x, old_out, new_out):  # type: ignore[no-untyped-def]
        if size == 4:
            _apply_loop(buf, offsets, 4, swap, a, o, x, old_out, new_out)
        elif size == 8:
            _apply_loop(buf, offsets, 8, swap, a, o, x, old_out, new_out)
        elif size == 2:
            _apply_loop(buf, offsets, 2, swap, a, o, x, old_out, new_out)
        else:
            _apply_loop(buf, offsets, 1, swap, a, o, x, old_out, new_out)

    @jit
    def read_words(buf, offsets, size, swap, out):  # type: ignore[no-untyped-def]
        if size == 4:
            _read_loop(buf, offsets, 4, swap, out)
        elif size == 8:
            _read_loop(buf, offsets, 8, swap, out)
        elif size == 2:
            _read_loop(buf, offsets, 2, swap, out)
        else:
            _read_loop(buf, offsets, 1, swap, out)

    @jit
    def write_words(buf, offsets, size, swap, words):  # type: ignore[no-untyped-def]
        if size == 4:
            _write_loop(buf, offsets, 4, swap, words)
        elif size == 8:
            _write_loop(buf, offsets, 8, swap, words)
        elif size == 2:
            _write_loop(buf, offsets, 2, swap, words)
        else:
            _write_loop(buf, offsets, 1, swap, words)

    @jit
    def _site_view(bases, itemsizes, t, off):  # type: ignore[no-untyped-def]
        return numba.carray(as_ptr(bases[t] + np.uint64(off)), (itemsizes[t],))

    @jit
    def apply_ptrs(bases, itemsizes, swaps, tensor, offsets, a, o, x, old_out, new_out):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            t = tensor[i]
            view = _site_view(bases, itemsizes, t, offsets[i])
            old = _load(view, 0, itemsizes[t], swaps[t])
            new = _rule(old, a[i], o[i], x[i], itemsizes[t])
            _store(view, 0, itemsizes[t], swaps[t], new)
            old_out[i] = old
            new_out[i] = new

    @jit
    def read_ptrs(bases, itemsizes, swaps, tensor, offsets, out):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            t = tensor[i]
            out[i] = _load(_site_view(bases, itemsizes, t, offsets[i]), 0, itemsizes[t], swaps[t])

    @jit
    def write_ptrs(bases, itemsizes, swaps, tensor, offsets, words):  # type: ignore[no-untyped-def]
        for i in range(offsets.shape[0]):
            t = tensor[i]
            _store(_site_view(bases, itemsizes, t, offsets[i]), 0, itemsizes[t], swaps[t], words[i])

    return dict(
        apply_words=apply_words, read_words=read_words, write_words=write_words,
        apply_ptrs=apply_ptrs, read_ptrs=read_ptrs, write_ptrs=write_ptrs,
    )
