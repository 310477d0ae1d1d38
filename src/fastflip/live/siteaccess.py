"""Reading, writing and applying a prepared plan's sites on every engine: CPU kernels, one launch per GPU,
TensorFlow variables.

Layer: ``live`` (may import files and below; imported by frameworks and above).

:class:`Prepared` is a plan resolved against a set of live tensors: its sites (target tensor id and
byte offset) and which of them go to which engine. :class:`SiteAccess` is the word access of
:class:`fastflip.live.targets.Targets` (its base class): a plan whose sites all lie on CPU tensors takes
one raw kernel call (nothing re-validated); a mixed plan is applied part by part (CPU tensors, each CUDA
device as one span and one launch, each TensorFlow variable by gather and scatter), and when a part fails
the words of the parts already flipped are written back before one error line names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core.dtypes import word_type
from ..core.plan import Plan
from ..core.records import SiteArrays
from ..core.wordrule import new_words_for
from ..errors import DeviceError, FastflipError, OptionError, one_line
from ..kernels import dispatch as native
from ..kernels import gpu
from ..kernels.registry import Backend, get_backend
from .adapters import LiveTensor

__all__ = ["Prepared", "SiteAccess"]


def _fast(prep: "Prepared", backend: str) -> Backend | None:
    """The per-trial fast path: a CPU backend's raw kernels, nothing re-validated (the sites were checked
    when the plan was prepared), when every site lies on a CPU tensor."""
    if prep.cpu is not None:
        return None
    be = get_backend(backend)
    return be if be.device == "cpu" else None


def _cpu(backend: str) -> str:
    """The CPU backend ``backend`` stands for: itself, or 'auto' when it names a GPU backend (which then
    serves the CUDA tensors only)."""
    return backend if get_backend(backend).device == "cpu" else "auto"


def _gpu(sites: Any, backend: str) -> Backend:
    """The registry's GPU backend for device-resident ``sites``: ``backend`` when it names a GPU backend,
    else the one for their arrays (``cuda-raw`` for CuPy, ``numba-cuda`` for the simulator's NumPy)."""
    be = get_backend(backend)
    if be.device == "gpu":
        return be
    return gpu.gpu_backend(sites.xp)


@dataclass
class Prepared:
    """A plan's sites resolved against one :class:`Targets` (built by :meth:`Targets.prepare`).

    ``sites`` is the one site type (:class:`fastflip.core.records.SiteArrays`): target tensor id per
    site (``tensor``, int32, indexing :attr:`Targets.table`), byte offset from the tensor's base
    address (``offsets``, int64) and the plan's masks and scale. The partitions say which sites go to
    which engine.
    """

    sites: SiteArrays
    cpu: np.ndarray | None  # site positions on CPU tensors, or None when every site is (fast path)
    cuda: dict[int, tuple[np.ndarray, Any]] = field(default_factory=dict)  # device -> (positions, SiteArrays)
    tf: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (tensor id, positions)
    bitwise: bool = True  # no scale site
    fresh: tuple[Callable[[], bool], ...] = ()  # storage checks of the tensors it touches (Targets.check)
    touched: tuple[int, ...] = ()  # the target ids those checks cover


class SiteAccess:
    """Word access at the sites of prepared plans (the base class of :class:`fastflip.live.targets.Targets`,
    which provides ``tensors``, ``table``, ``prepare`` and ``check``)."""

    tensors: list[LiveTensor]
    table: native.PtrTable
    prepare: Callable[[Plan], Prepared]
    check: Callable[[Prepared], None]
    _spans: dict[int, tuple[Any, int]]

    # ------------------------------------------------------------------ GPU

    def _span(self, device: int) -> tuple[Any, int]:
        if device not in self._spans:
            on = [t for t in self.tensors if t.kind == "cuda" and t.device == device]
            try:
                self._spans[device] = gpu.device_span([t.ptr for t in on], [t.extent for t in on], device, [t.obj for t in on])
            except ImportError as exc:
                raise OptionError(f"GPU tensors need CuPy (pip install 'fastflip[cupy]'): {exc}") from None
        return self._spans[device]

    def _site_arrays(self, plan: Plan, pos: np.ndarray, device: int, tid: np.ndarray, offsets: np.ndarray) -> Any:
        try:
            import cupy
        except ImportError as exc:
            raise OptionError(f"GPU tensors need CuPy (pip install 'fastflip[cupy]'): {exc}") from None
        _, base = self._span(device)
        tids = tid[pos]
        offs = gpu.span_offsets([t.ptr for t in self.tensors], tids, offsets[pos], base)
        on = {type(t.obj).__module__.split(".")[0] for t in self.tensors if t.kind == "cuda" and t.device == device}
        sites = gpu.SiteArrays.from_host(
            offs, tids, self.table, plan.and_mask[pos], plan.or_mask[pos], plan.xor_mask[pos], xp=cupy,
            scale=None if plan.scale is None else plan.scale[pos], positions=pos, device=device,
            streams=tuple(sorted(on & {"torch", "cupy"})),
        )
        gpu.gpu_backend(cupy).prepare_sites(sites)  # kernels compiled for this device now, before anything is flipped
        return sites

    # ------------------------------------------------------------------ word access per group

    def read(self, prep: Prepared, backend: str = "auto") -> np.ndarray:
        """Current words of every site of a prepared plan (native order)."""
        if prep.fresh:
            self.check(prep)
        n = len(prep.sites.tensor)
        be = _fast(prep, backend)
        if be is not None:
            return be.read_ptrs(self.table, prep.sites)
        if prep.cpu is None:
            return native.read_ptrs(self.table, prep.sites.tensor, prep.sites.offsets, _cpu(backend))
        out = np.empty(n, dtype=np.uint64)
        if len(prep.cpu):
            out[prep.cpu] = native.read_ptrs(self.table, prep.sites.tensor[prep.cpu], prep.sites.offsets[prep.cpu],
                                             _cpu(backend))
        for dev, (pos, sites) in prep.cuda.items():
            out[pos] = sites.xp.asnumpy(_gpu(sites, backend).read_sites(self._span(dev)[0], sites))
        for i, pos in prep.tf:
            out[pos] = _tf_read(self.tensors[i], self._tf_index(prep, pos, i))
        return out

    def write(self, prep: Prepared, words: np.ndarray, backend: str = "auto", *, checked: bool = False) -> None:
        """Store ``words`` (native order) at every site of a prepared plan (``checked``: :meth:`check`
        has just passed, with no code in between that could replace a storage)."""
        if prep.fresh and not checked:
            self.check(prep)
        words = np.ascontiguousarray(words, dtype=np.uint64)
        if len(words) != len(prep.sites.tensor):
            raise OptionError(f"{len(words)} words for {len(prep.sites.tensor)} sites")
        be = _fast(prep, backend)
        if be is not None:
            be.write_ptrs(self.table, prep.sites, words)
            return
        if prep.cpu is None:
            native.write_ptrs(self.table, prep.sites.tensor, prep.sites.offsets, words, _cpu(backend))
            return
        if len(prep.cpu):
            native.write_ptrs(self.table, prep.sites.tensor[prep.cpu], prep.sites.offsets[prep.cpu], words[prep.cpu],
                              _cpu(backend))
        for dev, (pos, sites) in prep.cuda.items():
            _gpu(sites, backend).write_sites(self._span(dev)[0], sites, words[pos])  # uploaded on the device and stream
        for i, pos in prep.tf:
            _tf_write(self.tensors[i], self._tf_index(prep, pos, i), words[pos])

    def apply(self, plan: Plan, prep: Prepared, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """Apply ``plan`` (already prepared) in place; (old, new) words in plan order."""
        if prep.fresh:
            self.check(prep)
        be = _fast(prep, backend) if prep.bitwise else None
        if be is not None:  # the per-trial fast path: one kernel call, nothing re-validated
            return be.apply_ptrs(self.table, prep.sites)
        if prep.cpu is None:
            return native.apply_ptrs(self.table, prep.sites.tensor, prep.sites.offsets, plan.and_mask, plan.or_mask,
                                     plan.xor_mask, _cpu(backend), scale=None if prep.bitwise else plan.scale)
        n = len(plan)
        old, new = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
        done = Prepared(prep.sites, cpu=prep.cpu[:0], bitwise=prep.bitwise)  # what is flipped, undone on a failure
        where = "the CPU tensors"
        if prep.cuda and get_backend(backend).device == "gpu":  # an engine chosen by name: compiled before any flip
            for _, sites in prep.cuda.values():
                _gpu(sites, backend).prepare_sites(sites)
        try:
            if len(prep.cpu):
                c = prep.cpu
                old[c], new[c] = native.apply_ptrs(self.table, prep.sites.tensor[c], prep.sites.offsets[c],
                                                   plan.and_mask[c], plan.or_mask[c], plan.xor_mask[c], _cpu(backend),
                                                   scale=None if plan.scale is None else plan.scale[c])
                done.cpu = c
            for dev, (pos, sites) in prep.cuda.items():
                where = f"CUDA device {dev}"
                d_old, d_new = _gpu(sites, backend).apply_sites(self._span(dev)[0], sites)
                old[pos], new[pos] = sites.xp.asnumpy(d_old), sites.xp.asnumpy(d_new)
                done.cuda[dev] = (pos, sites)
            for i, pos in prep.tf:
                where = f"TensorFlow variable {self.tensors[i].name!r}"
                t = self.tensors[i]
                idx = self._tf_index(prep, pos, i)
                o = _tf_read(t, idx)
                w = new_words_for(o, plan, pos, word_type(t.dtype, t.format))
                _tf_write(t, idx, w)
                old[pos], new[pos] = o, w
                done.tf.append((i, pos))
        except Exception as exc:
            raise self._roll_back(done, old, where, exc, backend) from None
        return old, new

    def _roll_back(self, done: Prepared, old: np.ndarray, where: str, exc: Exception, backend: str) -> Exception:
        """Write the old words of the parts of a mixed plan already flipped (``done``) back after ``exc``
        stopped it at ``where``; the one-line error to raise."""
        count = len(done.cpu) + sum(len(p) for p, _ in done.cuda.values()) + sum(len(p) for _, p in done.tf)
        try:
            self.write(done, old, backend)
        except Exception as undo:
            return DeviceError(f"injecting into {where} failed ({type(exc).__name__}: {one_line(exc)}) and writing "
                               f"back the {count} sites already flipped failed too ({one_line(undo)}): the tensors "
                               "are in an unknown state; reload them")
        if isinstance(exc, FastflipError) or not (count or where.startswith("CUDA")):
            return exc  # already one line, or a CPU/TensorFlow failure before anything was flipped: as it was
        undone = f"the {count} sites already flipped elsewhere were written back" if count else "no other part was flipped"
        return DeviceError(f"injecting into {where} failed ({type(exc).__name__}: {one_line(exc)}); {undone}")

    def _tf_index(self, prep: Prepared, pos: np.ndarray, i: int) -> np.ndarray:
        return prep.sites.offsets[pos] // self.tensors[i].dtype.itemsize

    def word_reader(self) -> Callable[[Plan], np.ndarray]:
        """``read_words(plan)`` for :meth:`fastflip.core.sampling.SiteSpace.plan` (``nan_policy='avoid'``)."""
        return lambda plan: self.read(self.prepare(plan))


# ---------------------------------------------------------------------- TensorFlow variables


def _tf_words_dtype(t: LiveTensor) -> Any:
    import tensorflow as tf

    return {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[t.dtype.itemsize]


def _tf_read(t: LiveTensor, flat_index: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    var = t.obj
    values = tf.gather(tf.reshape(var, [-1]), tf.constant(flat_index, dtype=tf.int64))
    if t.dtype.kind == "b":
        words = tf.cast(values, tf.uint8)
    else:
        words = tf.bitcast(values, _tf_words_dtype(t))
    return words.numpy().astype(np.uint64)


def _tf_write(t: LiveTensor, flat_index: np.ndarray, words: np.ndarray) -> None:
    import tensorflow as tf

    var = t.obj
    raw = tf.constant(np.asarray(words).astype(word_type(t.dtype).uint))
    values = tf.cast(raw, tf.bool) if t.dtype.kind == "b" else tf.bitcast(raw, var.dtype)
    if not t.shape:
        var.assign(tf.reshape(values, []))
        return
    coords = np.stack(np.unravel_index(np.asarray(flat_index, dtype=np.int64), t.shape), axis=1)
    var.scatter_nd_update(tf.constant(coords, dtype=tf.int64), values)
