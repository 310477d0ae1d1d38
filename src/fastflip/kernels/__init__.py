"""Kernel layer: the engines that apply the word rule to bytes in memory.

:mod:`~fastflip.kernels.dispatch` chooses a CPU backend (the Cython module ``fastflip.kernels._cython``
built from ``ext/_kernels.pyx``, the Numba kernels of :mod:`~fastflip.kernels.numba_cpu`, or its own
NumPy fallback) and applies plans at byte offsets of a buffer or at raw addresses;
:mod:`~fastflip.kernels.gpu` holds the GPU engines (CUDA C through CuPy, and Numba CUDA);
:mod:`~fastflip.kernels.environment` says which of them this installation can use.

Imports: :mod:`fastflip.errors` and :mod:`fastflip.core`. Imported by ``files``, ``live`` and above.
"""
