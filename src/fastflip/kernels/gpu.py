"""GPU word kernels driven with CuPy arrays, one launch per plan.

Layer: ``kernels`` (may import core and kernels; imported by files, live and above).

Two interchangeable engines (the backend registry's ``cuda-raw`` and ``numba-cuda``), both checked
without a GPU; their kernels are in :mod:`fastflip.kernels.gpu_kernels`:

- ``'cuda-raw'``: a CUDA C kernel (:data:`~fastflip.kernels.gpu_kernels.CUDA_SOURCE`) compiled by CuPy
  (NVRTC). The same source, with a grid-stride loop that degenerates to a plain loop, is compiled by the
  host C compiler in the tests (:func:`~fastflip.kernels.gpu_kernels.build_host_library`) and checked
  against :mod:`fastflip.core.reference` — one word-rule source, two instantiations.
- ``'numba-cuda'``: a Numba CUDA kernel compiling the per-site functions of
  :mod:`fastflip.kernels.numba_cpu` (``load_word``, ``store_word``, ``rule``) with
  ``numba.cuda.jit(device=True)``; under ``NUMBA_ENABLE_CUDASIM=1`` it runs in
  Numba's CUDA simulator on NumPy arrays.

``'auto'`` takes ``'cuda-raw'`` for CuPy arrays (CuPy alone suffices) and ``'numba-cuda'``
for NumPy arrays (the simulator); there is no global default to change: pass ``engine=`` (or, on the
live path, ``backend=`` naming a GPU backend).

Several tensors on one device are addressed through one ``uint8`` *span*: a view
from the lowest tensor address to the end of the highest (device memory is one flat
address space), with each site's byte offset taken relative to the span's start.
Only bytes inside the tensors are ever touched (:mod:`fastflip.live` validates the
plan against every tensor's shape before building the offsets).

Devices and streams (see docs/internals.md, "GPU kernels: devices and streams"): a :class:`SiteArrays`
knows its ``device`` and which frameworks' streams its tensors follow (``streams``); every launch, upload
and read-back of :func:`launch_apply`, :func:`launch_read` and :func:`launch_write` runs inside
:func:`device_scope` — ``cupy.cuda.Device(device)`` and, for PyTorch tensors, torch's current stream of
that device (wrapped as ``cupy.cuda.ExternalStream``; CuPy's current stream otherwise, made to wait for the
other when a device holds both) — and ends with a synchronisation of that stream. Compiled kernels are
cached per device (:func:`~fastflip.kernels.gpu_kernels.get_raw_kernels`); :meth:`RawCudaBackend.prepare_sites` compiles them when a
plan is prepared, so a missing NVRTC is one :class:`~fastflip.errors.DeviceError` before anything is
flipped.

Value-level (scale) sites: the kernel returns their old words, the new words are
computed by :func:`fastflip.core.wordrule.scale_words` on the host (only the scale
sites' words cross the bus, never a tensor) and written back by a second launch.

Examples
--------
>>> import numpy as np
>>> from fastflip.core.dtypes import word_type
>>> k = SiteArrays.from_host(offsets=[0], tensor=[0], table=records.TensorTable.of_words([word_type("<f4")]),
...                          and_mask=[2**64 - 1], or_mask=[0], xor_mask=[1], xp=np)
>>> len(k), k.table.itemsizes.tolist()
(1, [4])
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..core import records
from .gpu_kernels import get_gpu_kernels, get_raw_kernels, launch
from .registry import Backend, get_backend
from ..core.wordrule import scale_words
from ..errors import OptionError

__all__ = ["SiteArrays", "launch_apply", "launch_read", "launch_write", "device_span", "span_offsets", "device_scope",
           "gpu_backend", "ENGINES", "RawCudaBackend", "NumbaCudaBackend"]


@dataclass(frozen=True, eq=False, kw_only=True)
class SiteArrays(records.SiteArrays):
    """A plan's columns on the device (built once per plan and device, applied many times).

    The one site type (:class:`fastflip.core.records.SiteArrays`) with its columns on the device of
    ``xp``: ``offsets`` are byte offsets into the device span and ``tensor`` indexes ``table``, the
    :class:`fastflip.core.records.TensorTable` of the tensors, whose ``itemsizes`` and ``swaps`` columns
    the kernels read on the device (``dtypes``, ``bases`` and ``extents`` stay on the host). ``scale_pos``
    and ``scale_factors`` (host arrays) list the value-level sites. ``device`` is the CUDA device the
    columns and the tensors live on (None: the current one, and the simulator) and ``streams`` the
    frameworks whose current stream launches must follow (``'torch'``, ``'cupy'``; empty means CuPy's),
    see :func:`device_scope`.
    """

    table: records.TensorTable
    xp: Any
    scale_pos: np.ndarray | None = None
    scale_factors: np.ndarray | None = None
    device: int | None = None
    streams: tuple[str, ...] = ()

    @classmethod
    def from_host(cls, offsets: Any, tensor: Any, table: records.TensorTable, and_mask: Any, or_mask: Any,
                  xor_mask: Any, xp: Any, scale: Any = None, positions: Any = None, device: int | None = None,
                  streams: Sequence[str] = ()) -> "SiteArrays":
        """Copy host columns, and ``table``'s word sizes and byte orders, to ``device`` of ``xp`` (``cupy``,
        or ``numpy`` under the simulator).

        The copies are made inside ``cupy.cuda.Device(device)`` on CuPy's current stream, which is then
        synchronised, so that a launch on any other stream (torch's) finds them in place.
        """
        def put(v: Any, dtype: Any) -> Any:
            return xp.asarray(np.ascontiguousarray(np.asarray(v).astype(dtype)))

        u64 = lambda v: np.asarray(v, dtype=object).astype(np.uint64) if not isinstance(v, np.ndarray) else v  # noqa: E731
        pos = factors = None
        if scale is not None:
            f = np.asarray(scale, dtype=np.float64)
            where = np.flatnonzero(~np.isnan(f))
            if len(where):
                pos, factors = where, f[where]
        on = contextlib.nullcontext() if xp is np or device is None else xp.cuda.Device(device)
        with on:
            on_device = records.TensorTable(itemsizes=put(table.itemsizes, np.int32), swaps=put(table.swaps, np.uint8),
                                            dtypes=list(table.dtypes), bases=table.bases, extents=table.extents)
            out = cls(
                offsets=put(offsets, np.int64), tensor=put(tensor, np.int32), table=on_device,
                and_mask=put(u64(and_mask), np.uint64), or_mask=put(u64(or_mask), np.uint64),
                xor_mask=put(u64(xor_mask), np.uint64), xp=xp, scale_pos=pos,
                positions=None if positions is None else np.asarray(positions, np.int64), scale_factors=factors,
                device=None if device is None else int(device), streams=tuple(streams),
            )
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
        return out


#: The GPU engines, by the names the backend registry gives them.
ENGINES = ("cuda-raw", "numba-cuda")


def _engine(xp: Any, engine: str) -> str:
    """The engine ``engine`` names for arrays of ``xp``: 'auto' is ``cuda-raw`` for CuPy arrays and
    ``numba-cuda`` for NumPy arrays (Numba's simulator)."""
    if engine == "auto":
        return "numba-cuda" if xp is np else "cuda-raw"
    if engine not in ENGINES:
        raise OptionError(f"unknown GPU engine {engine!r}: use 'auto', {', '.join(repr(e) for e in ENGINES)}")
    return engine


def gpu_backend(xp: Any, engine: str = "auto") -> Backend:
    """The registry's GPU backend for arrays of module ``xp`` (CuPy, or NumPy under Numba's simulator).

    ``engine``: 'auto' (``cuda-raw`` for CuPy, ``numba-cuda`` for NumPy), or one of :data:`ENGINES`.

    >>> _engine(np, "auto")    # what gpu_backend(numpy) fetches from the registry
    'numba-cuda'
    """
    return get_backend(_engine(xp, engine))


_EXTERNAL: dict[tuple[int, int], Any] = {}  # (device, stream pointer) -> cupy.cuda.ExternalStream


def _torch_stream(cupy: Any, device: int) -> Any:
    """torch's current stream of ``device`` as a CuPy stream (CuPy's own object when the pointers agree)."""
    ptr = int(sys.modules["torch"].cuda.current_stream(device).cuda_stream)
    current = cupy.cuda.get_current_stream()
    if int(current.ptr) == ptr:
        return current
    key = (device, ptr)
    if key not in _EXTERNAL:
        if len(_EXTERNAL) > 64:
            _EXTERNAL.clear()
        _EXTERNAL[key] = cupy.cuda.ExternalStream(ptr)
    return _EXTERNAL[key]


@contextlib.contextmanager
def device_scope(sites: SiteArrays) -> Iterator[None]:
    """Enter the device of ``sites`` and the stream its launches must follow; synchronise it on exit.

    - device: ``cupy.cuda.Device(sites.device)`` (every launch, upload and read-back inside it);
    - stream: torch's current stream of that device when ``'torch'`` is in ``sites.streams`` (wrapped as
      ``cupy.cuda.ExternalStream``), so the flip is ordered after the work already queued on it (a
      forward pass, an optimizer step); otherwise CuPy's current stream. When the device holds tensors of
      both, torch's stream first waits for an event recorded on CuPy's;
    - on a normal exit that stream is synchronised, so the words are in place (and the returned device
      arrays complete) whatever stream the caller uses next; an error propagates as it is (the caller
      rolls back what other parts flipped, see :meth:`fastflip.live.targets.Targets.apply`).

    NumPy arrays (the simulator) and ``device=None`` (the caller's current device and stream) enter nothing
    but the synchronisation.
    """
    xp = sites.xp
    if xp is np:
        yield
        return
    with contextlib.ExitStack() as scope:
        if sites.device is not None:
            scope.enter_context(xp.cuda.Device(sites.device))
        stream = xp.cuda.get_current_stream()
        if "torch" in sites.streams and "torch" in sys.modules:
            ext = _torch_stream(xp, xp.cuda.Device().id)
            if ext is not stream:
                if "cupy" in sites.streams:
                    ext.wait_event(stream.record())
                stream = scope.enter_context(ext)
        yield
        stream.synchronize()  # not on an error: a failed launch leaves the stream to the caller's handling


def _words_of(sites: SiteArrays) -> tuple[Any, Any]:
    """The per-tensor kernel arguments: word sizes and byte orders (``swaps``), on the device."""
    return sites.table.itemsizes, sites.table.swaps


def _host(xp: Any, arr: Any) -> np.ndarray:
    return np.asarray(arr) if xp is np else xp.asnumpy(arr)


def launch_apply(buf: Any, sites: SiteArrays, sync: bool = True, engine: str = "auto") -> tuple[Any, Any]:
    """Apply ``sites`` to the device span ``buf`` in one launch; returns (old, new) device arrays.

    Scale sites (if any) then take one read-back of their old words, the host computation, and one
    more launch to write their new words. Runs inside :func:`device_scope` (``sync=False``: on the
    caller's current device and stream, not synchronised — for timing the kernel alone).
    """
    with device_scope(sites) if sync else contextlib.nullcontext():
        return _apply(buf, sites, _engine(sites.xp, engine))


def _apply(buf: Any, sites: SiteArrays, eng: str) -> tuple[Any, Any]:
    xp, n = sites.xp, len(sites)
    old = xp.empty(n, dtype=xp.uint64)
    new = xp.empty(n, dtype=xp.uint64)
    if n == 0:
        return old, new
    launch(sites, "apply", eng, n, buf, sites.offsets, sites.tensor, *_words_of(sites), sites.and_mask,
            sites.or_mask, sites.xor_mask, old, new)
    if sites.scale_pos is not None:
        pos = sites.scale_pos
        old_h = _host(xp, old)[pos]
        tid_h = _host(xp, sites.tensor)[pos]
        new_h = np.empty(len(pos), dtype=np.uint64)
        assert sites.scale_factors is not None
        for t in np.unique(tid_h):
            sel = tid_h == t
            new_h[sel] = scale_words(old_h[sel], sites.scale_factors[sel], sites.table.dtypes[int(t)])
        d_pos = xp.asarray(pos)
        new[d_pos] = xp.asarray(new_h)
        launch(sites, "write", eng, len(pos), buf, xp.ascontiguousarray(sites.offsets[d_pos]),
                xp.ascontiguousarray(sites.tensor[d_pos]), *_words_of(sites), xp.ascontiguousarray(new[d_pos]))
    return old, new


def launch_read(buf: Any, sites: SiteArrays, engine: str = "auto") -> Any:
    """Words (native order) of every site, as a device array (complete on return: see :func:`device_scope`)."""
    xp, n = sites.xp, len(sites)
    with device_scope(sites):
        out = xp.empty(n, dtype=xp.uint64)
        if n:
            launch(sites, "read", _engine(xp, engine), n, buf, sites.offsets, sites.tensor, *_words_of(sites), out)
    return out


def launch_write(buf: Any, sites: SiteArrays, words: Any, engine: str = "auto") -> None:
    """Store ``words`` (host or device array, native order) at every site; uploaded inside :func:`device_scope`."""
    xp, n = sites.xp, len(sites)
    if n:
        with device_scope(sites):
            launch(sites, "write", _engine(xp, engine), n, buf, sites.offsets, sites.tensor, *_words_of(sites),
                    xp.ascontiguousarray(xp.asarray(words, dtype=xp.uint64)))


def device_span(ptrs: Sequence[int], nbytes: Sequence[int], device_id: int, owner: Any) -> tuple[Any, int]:
    """A CuPy ``uint8`` array over ``[min(ptrs), max(ptr + nbytes))`` and its start address.

    ``owner`` (e.g. the list of tensors) is kept alive by the array.
    """
    import cupy

    base = int(min(ptrs))
    end = int(max(p + n for p, n in zip(ptrs, nbytes)))
    mem = cupy.cuda.UnownedMemory(base, max(end - base, 1), owner, device_id)
    return cupy.ndarray((max(end - base, 1),), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0)), base


def span_offsets(ptrs: Any, tensor: Any, offsets: Any, base: int) -> np.ndarray:
    """Each site's byte offset in a device span that starts at address ``base`` (:func:`device_span`): the
    address of its tensor (``ptrs[tensor]``) less ``base``, plus its byte offset in that tensor (host int64).

    The one routine that turns (tensor, offset) sites into span offsets, for the live path
    (:mod:`fastflip.live.siteaccess`), the ``*_ptrs`` entries of the GPU engines and bench/gpu_check.py.

    >>> span_offsets([0x7000, 0x9000], [1, 0, 1], [4, 8, 0], base=0x7000).tolist()
    [8196, 8, 8192]
    """
    at = np.asarray(ptrs, dtype=np.uint64)[np.asarray(tensor, dtype=np.intp)]
    return (at - np.uint64(base)).astype(np.int64) + np.asarray(offsets, dtype=np.int64)


# ------------------------------------------------------------------------------ registry backends


class _GpuBackend(Backend):
    """A GPU engine behind the registry's interface: words at byte offsets of a device ``uint8`` array
    (CuPy; NumPy under Numba's CUDA simulator), and at device addresses of a pointer table (through
    :func:`device_span`, CuPy only). Sites go to the device as one :class:`SiteArrays`, one launch."""

    device = "gpu"

    def _sites(self, buf: Any, offsets: Any, tensor: Any, table: records.TensorTable,
               masks: tuple[Any, Any, Any] | None = None) -> SiteArrays:
        xp = _xp(buf)
        zero = np.zeros(len(offsets), np.uint64)
        a, o, x = masks if masks is not None else (zero, zero, zero)
        device = None if xp is np else int(buf.device.id)
        return SiteArrays.from_host(offsets=offsets, tensor=tensor, table=table, and_mask=a, or_mask=o, xor_mask=x,
                                    xp=xp, device=device)

    def _one(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
             masks: tuple[Any, Any, Any] | None = None) -> SiteArrays:
        one = records.TensorTable(itemsizes=[itemsize], swaps=[bool(swap)], dtypes=[None], bases=[0], extents=[0])
        return self._sites(buf, offsets, np.zeros(len(offsets), np.int32), one, masks)

    def read_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool) -> Any:
        return launch_read(buf, self._one(buf, offsets, itemsize, swap), engine=self.name)

    def write_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool, words: Any) -> None:
        launch_write(buf, self._one(buf, offsets, itemsize, swap), words, engine=self.name)

    def apply_words(self, buf: Any, offsets: np.ndarray, itemsize: int, swap: bool,
                    and_mask: Any, or_mask: Any, xor_mask: Any) -> tuple[Any, Any]:
        return launch_apply(buf, self._one(buf, offsets, itemsize, swap, (and_mask, or_mask, xor_mask)),
                            engine=self.name)

    def read_sites(self, buf: Any, sites: SiteArrays) -> Any:
        return launch_read(buf, sites, engine=self.name)

    def write_sites(self, buf: Any, sites: SiteArrays, words: Any) -> None:
        launch_write(buf, sites, words, engine=self.name)

    def apply_sites(self, buf: Any, sites: SiteArrays) -> tuple[Any, Any]:
        return launch_apply(buf, sites, engine=self.name)

    def _span(self, table: Any, host: records.SiteArrays, masks: bool = False) -> tuple[Any, SiteArrays]:
        """The device span of ``table``'s tensors and ``host``'s sites on it (masks uploaded when ``masks``)."""
        import cupy

        device = cupy.cuda.Device().id  # a pointer table does not say its device: the caller's current one
        span, base = device_span(table.bases.tolist(), table.extents.tolist(), device, table)
        offs = span_offsets(table.bases, host.tensor, host.offsets, base)
        zero = np.zeros(len(offs), np.uint64)
        a, o, x = (host.and_mask, host.or_mask, host.xor_mask) if masks else (zero, zero, zero)
        return span, SiteArrays.from_host(offs, host.tensor, table, a, o, x, xp=cupy, device=device)

    def read_ptrs(self, table: Any, sites: records.SiteArrays) -> np.ndarray:
        span, dev = self._span(table, sites)
        return _host(dev.xp, launch_read(span, dev, engine=self.name))

    def write_ptrs(self, table: Any, sites: records.SiteArrays, words: np.ndarray) -> None:
        span, dev = self._span(table, sites)
        launch_write(span, dev, dev.xp.asarray(words), engine=self.name)

    def apply_ptrs(self, table: Any, sites: records.SiteArrays) -> tuple[np.ndarray, np.ndarray]:
        span, dev = self._span(table, sites, masks=True)
        old, new = launch_apply(span, dev, engine=self.name)
        return _host(dev.xp, old), _host(dev.xp, new)


def _xp(buf: Any) -> Any:
    """The array module of ``buf``: CuPy for device arrays, NumPy otherwise (the simulator)."""
    if isinstance(buf, np.ndarray):
        return np
    import cupy

    return cupy


class RawCudaBackend(_GpuBackend):
    """``'cuda-raw'``: :data:`CUDA_SOURCE` (``ff_word.h`` + kernels) compiled by NVRTC through CuPy."""

    name = "cuda-raw"

    def prepare_sites(self, sites: SiteArrays) -> None:
        """Compile (NVRTC) and load the kernels on the device of ``sites``; :class:`DeviceError` when NVRTC
        is missing or fails."""
        get_raw_kernels(sites.device)

    def load(self) -> None:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:  # pragma: no cover - needs a machine with CuPy and no GPU
            raise ImportError("CuPy finds no CUDA device")


class NumbaCudaBackend(_GpuBackend):
    """``'numba-cuda'``: the Numba CUDA kernels (:func:`get_gpu_kernels`); with ``NUMBA_ENABLE_CUDASIM=1``
    they run in Numba's simulator on NumPy arrays."""

    name = "numba-cuda"

    def prepare_sites(self, sites: SiteArrays) -> None:
        """Build the Numba dispatchers (Numba compiles each for its argument types at the first launch)."""
        get_gpu_kernels()

    def load(self) -> None:
        from numba import cuda as numba_cuda

        if not numba_cuda.is_available():
            raise ImportError("Numba finds no CUDA device (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")
