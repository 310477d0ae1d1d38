"""Batched trials for PyTorch targets: B trials of a cell in one forward pass.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A trial of a ``memory``-mode campaign on a PyTorch module with a built-in evaluator
(:mod:`fastflip.campaign.builtins`) is a forward pass per mini-batch of the evaluation set through the
faulty model (several per mini-batch for ``generation``). :class:`BatchedTorch` runs ``B`` weight-fault
trials at once:

* only the faulted tensors are copied: each becomes a stack of ``B`` copies, trial ``j``'s
  sites applied to copy ``j`` by the plan's exact word rule (:mod:`fastflip.core.wordrule`; the
  few faulted words make one trip to the host per block and tensor, never one per trial);
  every other tensor is shared;
* the model runs once on each mini-batch repeated ``B`` times along the batch dimension; every
  module holding a faulted tensor runs once per trial, on that trial's part of its input with
  that trial's copy (:mod:`fastflip.campaign.pertrial`: the serial forward's kernel and batch size,
  so huge or infinite faulty values meet the same arithmetic as in a serial trial), the other
  modules once on the whole batch (tied weights follow: every module holding a faulted tensor is split);
* two paths: **prefix** — a model ``torch.fx`` traces (a static graph) reuses golden prefixes: the
  values the rest of the network needs from before the first node touching a faulted tensor are
  computed once per cell and mini-batch on the fault-free model, and each block runs only the rest
  (:mod:`fastflip.campaign.fxsplit`; a split that would need more than batch-major tensors runs the
  full forward, with a one-time notice); **full** — a model ``torch.fx`` cannot trace (every Hugging Face model) runs
  its whole forward per block with the faulted modules swapped for the block, no graph needed.

:class:`BatchedActivations` does the same for activation faults: ``B × N`` samples per
forward, trial ``j``'s plan in the layer outputs of its ``N`` samples; with the prefix, the
faulted layer's golden output is faulted per trial and only the rest of the network runs.

The user's tensors are never written: during a block the faulted modules' ``forward`` and
parameter slots are swapped and put back in ``finally``. On a CUDA model everything (stacks,
flips, forward) stays on the device; the outputs of a block come back once for judging.

``B`` is chosen from free memory (host RAM, or the CUDA device's free memory) and the
output size of one forward, unless ``[evaluator] batch_trials`` / ``--batch-trials`` gives
it; out-of-memory halves ``B`` and continues. Before a cell batches, a probe runs three copies
(fault-free, extreme, fault-free) and requires the fault-free ones to equal the plain forward
(without a graph, the faulted slots hold NaN outside their modules meanwhile): a model whose forward
mixes trials (control flow or statistics over the batch), reads a faulted tensor outside its module
or writes to its parameters in place runs that cell trial by trial, said in one line.

Examples
--------
>>> import torch
>>> from fastflip.core.blockplan import PlanBlock
>>> from fastflip.core.plan import Plan, TensorRef
>>> m = torch.nn.Linear(2, 2).eval()
>>> with torch.no_grad():
...     _ = m.weight.copy_(torch.eye(2)); _ = m.bias.zero_()
>>> bt = BatchedTorch(m, torch.tensor([[1.0, 2.0]]))
>>> ref = TensorRef("weight", "<f4", (2, 2))
>>> block = PlanBlock.from_plans([Plan.from_sites([ref], [0], [0], xor_mask=[1 << 31]),  # w[0, 0] = -1
...                               Plan.from_sites([ref], [0], [3], xor_mask=[1 << 30])])  # w[1, 1] = 1 * 2**128 -> inf
>>> bt.outputs(block, ["weight"]).tolist()
[[[-1.0, 2.0]], [[1.0, inf]]]
>>> m.weight.tolist()  # the model itself is never written
[[1.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from ..core.blockplan import PlanBlock
from ..core.plan import Plan
from ..core.wordrule import rule_words, scale_words
from ..errors import one_line
from ..live.act_frameworks import TorchHooks
from ..live.activations import ActivationLog, Sites, injected_activations
from ..live.adapters import framework_of
from .batchsize import choose_batch
from .builtins import logits_of, model_forward, to_numpy
from .failures import is_oom
from .fxsplit import first_uses, split_after_layer, split_after_prefix
from .pertrial import PerTrial, Unbatchable

__all__ = ["BatchedTorch", "Unbatchable", "auto_batch", "is_oom", "say_once", "split_after_prefix",
           "split_after_layer"]

_MAX_AUTO = 64  # CPU: beyond this many trials per pass the forward is not faster per trial, only bigger
_MAX_AUTO_GPU = 512
#: Rows of the first mini-batch the per-cell probe runs (three copies each): enough rows per trial that modules run
#: as in real blocks (:data:`fastflip.campaign.pertrial.SMALL_ROWS`), few enough that the probe costs little
PROBE_ROWS = 32
_SAID: set[str] = set()


def say_once(text: str, stream: Any = None) -> None:
    """Write ``fastflip: text`` once per process (fallback notes of workers)."""
    if text in _SAID:
        return
    _SAID.add(text)
    out = stream if stream is not None else sys.stderr
    out.write(f"fastflip: {text}\n")
    out.flush()


def steady_allocator() -> bool:
    """Keep freed memory in this process for reuse (glibc: no ``mmap`` per large block, no trim below 1 GiB).

    Batched forwards allocate activations of tens of MB block after block; glibc serves every allocation above
    32 MB with a fresh ``mmap``, so each block faults its pages in again (measured: half the CPU time in the kernel).
    With ``M_MMAP_MAX = 0`` and a 1 GiB trim threshold they are reused from the heap: the process keeps its peak
    memory until it ends. Off with ``FASTFLIP_MALLOC=system``; a no-op (False) where the C library is not glibc.
    """
    if os.environ.get("FASTFLIP_MALLOC") == "system" or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-4, 0)) and bool(libc.mallopt(-1, 1 << 30))  # M_MMAP_MAX, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def free_memory(device: Any) -> int:
    """Free bytes where ``device``'s tensors live (CUDA: the device's free memory; else available RAM)."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def auto_batch(per_trial_bytes: int, free: int, limit: int = _MAX_AUTO) -> int:
    """Trials per forward that fit a quarter of ``free`` bytes (at least 1, at most ``limit``).

    >>> auto_batch(100 << 20, 8 << 30), auto_batch(100 << 20, 100 << 20), auto_batch(1, 1 << 40)
    (20, 1, 64)
    """
    return int(max(1, min(limit, (free // 4) // max(int(per_trial_bytes), 1))))


_WORDS = {"float32": "int32", "float64": "int64", "float16": "int16", "bfloat16": "int16", "int64": "int64",
          "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "float8_e4m3fn": "uint8",
          "float8_e5m2": "uint8"}
_UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def faulted_names(block: Any) -> tuple[str, ...]:
    """The names of the tensors (or layer outputs) the plans of ``block`` touch, sorted."""
    return tuple(sorted({block.tensors[t].name for t in np.unique(block.tensor).tolist()}))


class Untraceable(Unbatchable):
    """``torch.fx`` cannot trace the model: its faulted modules run per trial without a graph (no golden prefix)."""


class BatchedTorch:
    """Run blocks of weight-fault trials of one PyTorch module in shared forwards (module docstring).

    Parameters
    ----------
    model : torch.nn.Module
        In eval mode (its tensors are only read).
    x : array or tensor
        Evaluation inputs of one forward (the built-in evaluator's first mini-batch: the probe, the memory
        estimate and :meth:`outputs` use them).
    """

    def __init__(self, model: Any, x: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        first = next(iter(list(model.parameters()) + list(model.buffers())), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.x = to_numpy(x)
        if self.x.dtype == object:
            raise ValueError("the evaluation inputs are not one array")
        self.named = {**dict(model.named_parameters(remove_duplicate=False)),
                      **dict(model.named_buffers(remove_duplicate=False))}
        self._suffix: dict[tuple[Any, ...], Any] = {}
        self._cached: dict[tuple[Any, ...], int] = {}  # bytes of golden values per cached boundary
        #: bytes the golden-activation cache may hold (default: an eighth of free memory, at least 64 MiB)
        self.cache_budget: int | None = None
        self._bufs: dict[tuple[Any, ...], Any] = {}  # preallocated tiles of golden values, reused block after block
        self._first: dict[int, int] | None = None
        self._out_bytes: int | None = None
        self._gm: Any = None
        self._untraceable: str | None = None

    # -- the faulty copies -------------------------------------------------------------
    def stacks(self, block: Any, names: Sequence[str]) -> dict[int, Any]:
        """``{id(tensor): stack of B faulty copies}`` for every tensor the block's plans touch."""
        torch = self.torch

        B = len(block)
        trial = block.trial_of_row
        out: dict[int, Any] = {}
        for tid in np.unique(block.tensor).tolist():
            ref = block.tensors[tid]
            base = self.named[ref.name].detach()
            rows = np.flatnonzero(block.tensor == tid)
            wname = _WORDS.get(str(base.dtype).replace("torch.", ""))
            if wname is None:
                raise Unbatchable(f"tensor {ref.name} of dtype {base.dtype} has no word view")
            st = base.unsqueeze(0).repeat(B, *([1] * base.dim())).contiguous()
            words = st.view(getattr(torch, wname)).view(B, -1)
            j = torch.as_tensor(trial[rows], device=self.device)
            i = torch.as_tensor(block.index[rows], device=self.device)
            bits = ref.word.bits
            old = words[j, i].cpu().numpy().view(_UNSIGNED[bits]).astype(np.uint64)
            if block.scale is not None and not np.isnan(block.scale[rows]).all():
                new = scale_words(old, block.scale[rows], ref.word)
            else:
                new = rule_words(old, block.and_mask[rows], block.or_mask[rows], block.xor_mask[rows], bits)
            signed = new.astype(_UNSIGNED[bits]).view(np.dtype(wname))
            words[j, i] = torch.from_numpy(signed).to(self.device)
            out[id(self.named[ref.name])] = st
        return out

    # -- forwards ----------------------------------------------------------------------
    def graph(self) -> Any:
        """The model traced by ``torch.fx`` (:class:`Untraceable` when it cannot be traced; :class:`Unbatchable`
        when its forward writes to its own tensors)."""
        if self._untraceable is not None:
            raise Untraceable(self._untraceable)
        if self._gm is None:
            import torch.fx as fx

            try:
                # wrapped, so that a model that is itself one torch.nn layer is one call of it
                gm = fx.symbolic_trace(self.torch.nn.Sequential(self.model))
            except Exception as exc:
                first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
                self._untraceable = (f"torch.fx cannot trace it (control flow on tensor values?): "
                                     f"{type(exc).__name__}: {first}")
                raise Untraceable(self._untraceable) from None
            for n in gm.graph.nodes:  # forward writing to its own tensors: every trial would write the same one
                if n.op in ("call_method", "call_function") and str(getattr(n.target, "__name__", n.target)).endswith("_") \
                        and n.args and getattr(n.args[0], "op", None) == "get_attr":
                    op = n.target if isinstance(n.target, str) else n.target.__name__
                    raise Unbatchable(f"its forward writes to {str(n.args[0].target).partition('.')[2]} in place ({op})")
            self._gm = gm
        return self._gm

    def traceable(self) -> bool:
        """Whether ``torch.fx`` traces the model (else the faulted modules run per trial without a graph)."""
        try:
            self.graph()
        except Untraceable:
            return False
        return True

    def path(self, single_forward: bool = True) -> str:
        """``'prefix'`` (a traced graph: golden prefixes reused where a cell allows) or ``'full'`` (full forwards)."""
        return "prefix" if single_forward and self.traceable() else "full"

    @contextmanager
    def trials(self, block: Any, cell_tensors: Sequence[str], prefix: bool = True,
               poison: bool = False) -> Iterator[Any]:
        """Within the context, ``forward(inputs, chunk, chunk_inputs) -> logits`` runs the block's trials.

        ``inputs`` are a chunk's inputs repeated ``B`` times; every module that holds a faulted tensor runs once
        per trial on that trial's rows with that trial's copy (the same kernel and batch as the serial forward),
        the other modules once on the whole batch. With a traced graph and ``chunk`` given, the cached golden
        prefix of that chunk is reused. ``poison`` (the probe): NaN in the faulted slots outside their holders.
        """
        torch = self.torch
        B = len(block)
        stacks = self.stacks(block, cell_tensors)
        if poison:  # the probe: trial 1 holds the largest finite values, so that any mixing of trials shows in the others
            for st in stacks.values():
                if st.is_floating_point() and B > 2:
                    st[1].fill_(torch.finfo(st.dtype).max)
        gm = self.graph() if self.traceable() else None
        if gm is not None:
            self._check_attrs(gm, stacks)
            used = sorted({n.target for n in gm.graph.nodes if n.op == "call_module"})
            modules = [(name.partition(".")[2], gm.get_submodule(name)) for name in used]
        else:
            modules = list(self.model.named_modules())
        key = faulted_names(block) or tuple(sorted(cell_tensors))  # the boundary of the faults this block holds

        def forward(x: Any, chunk: int | None = None, chunk_x: Any = None, only: int | None = None) -> np.ndarray:
            pt.rows, pt.only = len(x), only
            split = self.suffix(key, chunk, chunk_x) if prefix and gm is not None and chunk is not None else None
            with torch.no_grad():
                if split is not None:
                    module, args = split
                    out = module(*self.tiled(args, B if only is None else 1))
                    return np.array(to_numpy(logits_of(out)))  # never a view of a reused tile
                out = (gm if gm is not None else self.model)(torch.as_tensor(np.asarray(x)).to(self.device))
            return to_numpy(logits_of(out))

        with PerTrial(modules, stacks, B, poison=poison and gm is None) as pt:
            yield forward

    @staticmethod
    def _check_attrs(gm: Any, stacks: dict[int, Any]) -> None:
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                obj: Any = gm
                for part in str(n.target).split("."):
                    obj = getattr(obj, part)
                if id(obj) in stacks:
                    raise Unbatchable(f"faulted tensor {str(n.target).partition('.')[2]} is used outside the "
                                      "forward of a torch.nn layer")

    def run(self, block: Any, cell_tensors: Sequence[str], evaluate: Any, prefix: bool = True) -> list[Any]:
        """The answers of the block's trials by the built-in evaluator ``evaluate``
        (:meth:`fastflip.campaign.builtins.Builtin.run`)."""
        with self.trials(block, cell_tensors, prefix and evaluate.single_forward) as fwd:
            return evaluate.run(fwd, len(block))

    def outputs(self, block: Any, cell_tensors: Sequence[str], prefix: bool = True) -> np.ndarray:
        """The model's outputs (logits) on :attr:`x` for every trial of ``block``: an array ``(B, *output shape)``."""
        B = len(block)
        with self.trials(block, cell_tensors, prefix) as fwd:
            out = fwd(np.concatenate([self.x] * B), 0, self.x)
        if out.shape[0] % B:
            raise Unbatchable("its outputs are not batch-major (the batch is not their first dimension)")
        return out.reshape(B, out.shape[0] // B, *out.shape[1:])

    def golden_outputs(self) -> np.ndarray:
        """One fault-free forward of :attr:`x` (the serial evaluators' call)."""
        return model_forward(self.model)(self.x)

    def per_trial_bytes(self) -> int:
        """Memory one more trial in a block needs: the outputs of every module in one forward, twice."""
        if self._out_bytes is None:
            total = [0]
            torch = self.torch

            def hook(mod: Any, inp: Any, out: Any) -> None:
                for o in (out if isinstance(out, (tuple, list)) else [out]):
                    if isinstance(o, torch.Tensor):
                        total[0] += o.numel() * o.element_size()

            hooks = [m.register_forward_hook(hook) for m in self.model.modules()]
            try:
                self.golden_outputs()
            finally:
                for h in hooks:
                    h.remove()
            self._out_bytes = 2 * total[0] + self.x.nbytes
        return self._out_bytes

    # -- golden prefix -----------------------------------------------------------------
    def _chunk(self, chunk: int | None, x: Any) -> tuple[int, Any]:
        return (0, self.x) if chunk is None or x is None else (chunk, x)

    def suffix(self, cell_tensors: Sequence[str], chunk: int | None = None,
               x: Any = None) -> tuple[Any, tuple[Any, ...]] | None:
        """``(graph module running the rest of the network, its cached inputs)`` for faults in ``cell_tensors`` on
        the inputs ``x`` of mini-batch ``chunk`` (default: :attr:`x`), or None when nothing comes before the faulted
        tensors' first use or the split needs more than batch-major tensors (then the full forward runs, with a one-time notice)."""
        names = tuple(sorted(cell_tensors))
        chunk, x = self._chunk(chunk, x)
        key = (self.boundary(names), chunk)  # every set of tensors first read at the same node shares the entry
        if key not in self._suffix:
            xt = self.torch.as_tensor(np.asarray(x)).to(self.device)
            try:
                split = split_after_prefix(self.graph(), xt, [self.named[n] for n in names], self.first_uses())
            except Unbatchable as exc:
                at = list(self.graph().graph.nodes)[key[0]].target if key[0] >= 0 else ", ".join(names[:3])
                say_once(f"golden-prefix reuse off for {type(self.model).__name__} (faults from "
                         f"{str(at).partition('.')[2] or at} on): {exc}; running the full forward")
                split = None
            self._remember(key, split)
        return self._suffix[key]

    # -- the golden-activation cache -----------------------------------------------------
    def first_uses(self) -> dict[int, int]:
        """``{id(tensor): graph node that first reads it}`` (:func:`fastflip.campaign.fxsplit.first_uses`)."""
        if self._first is None:
            self._first = first_uses(self.graph())
        return self._first

    def boundary(self, names: Sequence[str]) -> Any:
        """Where faults in tensors ``names`` cut the graph: the first node reading any of them (-1: none does).
        Trials with the same boundary share one cached set of golden values per mini-batch, whatever their cell."""
        first = self.first_uses()
        return min((first.get(id(self.named[n]), -1) for n in names), default=-1)

    def group_key(self, names: Sequence[str]) -> Any:
        """The key trials are grouped by so that a block shares one golden prefix (None: no graph, one group)."""
        return self.boundary(names) if self.traceable() else None

    def _remember(self, key: tuple[Any, ...], split: Any) -> None:
        """Cache a split, evicting the oldest entries while the golden values would pass :attr:`cache_budget`."""
        torch = self.torch
        if self.cache_budget is None:
            self.cache_budget = max(free_memory(self.device) // 8, 64 << 20)
        size = 0 if split is None else sum(a.numel() * a.element_size() for a in split[1]
                                           if isinstance(a, torch.Tensor))
        while self._suffix and sum(self._cached.values()) + size > self.cache_budget:
            old = next(iter(self._suffix))
            del self._suffix[old]
            self._cached.pop(old, None)
        self._suffix[key] = split
        self._cached[key] = size

    def tiled(self, args: Sequence[Any], reps: int) -> list[Any]:
        """``args`` repeated ``reps`` times along the batch, in buffers allocated once per position and shape and
        refilled block after block (no fresh, page-faulting allocation of the stacked golden values per block)."""
        torch = self.torch
        out = []
        for i, a in enumerate(args):
            shape = (reps * a.shape[0], *a.shape[1:])
            key = (i, shape, a.dtype, a.device)
            buf = self._bufs.get(key)
            if buf is None:
                buf = self._bufs[key] = torch.empty(shape, dtype=a.dtype, device=a.device)
            buf.view(reps, *a.shape).copy_(a.unsqueeze(0).expand(reps, *a.shape))
            out.append(buf)
        return out


class BatchedActivations(BatchedTorch):
    """Blocks of activation-fault trials: the inputs repeated ``B`` times, trial ``j``'s plan faulting the layer
    outputs of samples ``j*N … j*N+N-1`` (:func:`fastflip.live.activations.injected_activations` with a block)."""

    def __init__(self, model: Any, x: Any, seed: int) -> None:
        super().__init__(model, x)
        self.seed = int(seed)

    def path(self, single_forward: bool = True) -> str:
        self.graph()  # a static graph: no control flow on (faulted) values
        return "prefix" if single_forward else "full"

    def suffix(self, cell_tensors: Sequence[str], chunk: int | None = None, x: Any = None) -> Any:
        """``(rest of the network, its golden inputs, position of the faulted layer's output)`` for a cell of one
        layer output, or None (several layer outputs, no prefix, or a model the split refuses; a one-time notice says why)."""
        names = tuple(sorted(cell_tensors))
        chunk, x = self._chunk(chunk, x)
        key = (names, chunk)  # a layer output's name is its boundary, whatever the cell
        if key not in self._suffix:
            split = None
            if len(names) == 1:
                xt = self.torch.as_tensor(np.asarray(x)).to(self.device)
                try:
                    split = split_after_layer(self.graph(), xt, names[0])
                except Unbatchable as exc:
                    say_once(f"golden-prefix reuse off for {type(self.model).__name__} (layer {names[0]}): {exc}; "
                             "running the full forward")
            self._remember(key, split)
        return self._suffix[key]

    def group_key(self, names: Sequence[str]) -> Any:
        """Trials faulting the outputs of one layer share its golden output (several layers: the full forward)."""
        return tuple(sorted(names)) if len(names) == 1 else None

    @contextmanager
    def trials(self, block: Any, cell_tensors: Sequence[str], prefix: bool = True,
               poison: bool = False) -> Iterator[Any]:
        torch = self.torch
        self.graph()  # a static graph: no control flow on (faulted) values
        B = len(block)
        key = faulted_names(block) or tuple(cell_tensors)

        def forward(x: Any, chunk: int | None = None, chunk_x: Any = None, only: int | None = None) -> np.ndarray:
            if only is not None:
                raise Unbatchable("a mini-batch of one input runs its activation trials one at a time")
            n = len(x) // B
            split = self.suffix(key, chunk, chunk_x) if prefix and chunk is not None else None
            if split is not None:  # the golden output of the faulted layer, faulted per trial, then the rest
                suffix, inputs, at = split
                args = self.tiled(inputs, B)
                refs = list(block.tensors)
                sites = Sites(refs, seed=self.seed, plan=block, samples_per_plan=n)
                li = [r.name for r in refs].index(key[0])
                faulted = TorchHooks(self.model).write(args[at], li, sites, ActivationLog(seed=self.seed), alias=True)
                if faulted is not None:
                    args[at] = faulted
                with torch.no_grad():
                    return np.array(to_numpy(logits_of(suffix(*args))))  # never a view of a reused tile
            xb = torch.as_tensor(np.asarray(x)).to(self.device)
            with injected_activations(self.model, self.seed, plan=block, samples_per_plan=n):
                with torch.no_grad():
                    return to_numpy(logits_of(self.model(xb)))

        yield forward


class TrialBatcher:
    """A worker's batched path: blocks of one cell's trials through :class:`BatchedTorch` (module docstring).

    Built by :func:`make_batcher` for a runner whose campaign allows it; ``run`` gives the
    same rows as running the trials one by one (``runner.run``), which remains the path
    for cells or blocks that cannot be batched.
    """

    def __init__(self, runner: Any, model: Any, evaluate: Any, batch: int | None) -> None:
        x0 = evaluate.chunks[0]
        if runner.campaign.target.kind == "activations":
            self.bt: BatchedTorch = BatchedActivations(model, x0, runner.seed)
        else:
            self.bt = BatchedTorch(model, x0)
        self.evaluate = evaluate
        self.batch = batch
        self.runner = runner
        steady_allocator()  # blocks reuse the heap instead of faulting in fresh pages
        #: ``f(B) -> seconds per trial`` with ``B`` trials per forward (1: serial); default :meth:`measure`
        self.timer: Any = None
        #: the measurement behind an automatic :attr:`batch` (:class:`fastflip.campaign.batchsize.BatchChoice`)
        self.choice: Any = None
        self.prefix = True
        self._ok: dict[tuple[str, ...], bool] = {}
        self._golden: np.ndarray | None = None
        self._off: str | None = None  # why the model cannot batch at all

    def size(self, workers: int = 1) -> int:
        """Trials per forward: the configured number, or on a CPU the fastest measured size within what free memory
        allows (shared by ``workers``; 1 when serial measured fastest: :attr:`choice`); on a GPU what memory allows."""
        if self.batch is None:  # a GPU keeps gaining from wider forwards long after a CPU core has stopped
            gpu = getattr(self.bt.device, "type", "cpu") == "cuda"
            cap = auto_batch(self.bt.per_trial_bytes(), free_memory(self.bt.device) // max(workers, 1),
                             _MAX_AUTO_GPU if gpu else _MAX_AUTO)
            if gpu:
                self.batch = cap
            else:
                try:
                    self.choice = choose_batch(self.timer or self.measure, cap)
                    self.batch = self.choice.size
                except Exception as exc:  # a forward the measurement cannot run: the serial path is always right
                    say_once(f"timing batched trials failed ({type(exc).__name__}: {str(exc)[:120]}); "
                             "running trials one at a time")
                    self.batch = 1
        return self.batch

    def _typical(self) -> list[Any]:
        """The campaign tensor whose faults cut the graph nearest its middle (the median trial's work), as a
        one-site identity plan's tensors (the first cell's first tensor without a graph)."""
        refs = {r.name: r for sp in self.runner.spaces for r in sp.tensors}
        names = list(refs)
        if self.path() == "prefix" and not isinstance(self.bt, BatchedActivations):
            names.sort(key=lambda n: self.bt.boundary([n]))
            return [refs[names[len(names) // 2]]]
        return [self.runner.spaces[0].tensors[0]]

    def measure(self, size: int, repeat: int = 2) -> float:
        """Seconds per trial (best of ``repeat``) of a block of ``size`` fault-free trials of the typical tensor on
        the first mini-batch, as blocks run; ``size = 1``: the serial trial's forward of the same inputs."""
        x0 = self.bt.x
        refs = self._typical()
        if size == 1:
            def once() -> None:
                self.bt.golden_outputs()
        else:
            block = PlanBlock.from_plans([Plan.from_sites(refs, [0], [0])] * size)
            prefix = self.prefix and self.evaluate.single_forward

            def once() -> None:
                with self.bt.trials(block, [refs[0].name], prefix) as fwd:
                    fwd(np.concatenate([x0] * size), 0, x0)
        once()  # warm-up: the cached prefix, the tiles, the allocator
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            once()
            best = min(best, time.perf_counter() - start)
        return best / size

    def path(self) -> str:
        """How blocks run: ``'prefix'`` (golden prefixes reused where a cell allows), ``'full'`` (full forwards,
        faulted modules per trial) or ``'serial'`` (the model cannot batch; the reason is :attr:`why`)."""
        try:
            return self.bt.path(self.evaluate.single_forward and self.prefix)
        except Unbatchable as exc:
            self._off = str(exc)
            return "serial"

    @property
    def why(self) -> str | None:
        return self._off

    def usable(self, runner: Any, cell_id: int) -> bool:
        """Whether the cell's trials can be batched: a probe of two fault-free copies against the golden forward
        (without a traced graph, with NaN in the faulted tensors' slots outside their modules)."""
        key = tuple(sorted(runner.cells[cell_id].tensors))
        if key not in self._ok and self._off is None:
            if self.path() == "serial":  # the whole model: a one-time notice
                say_once(f"batched trials off for {type(self.bt.model).__name__}: {self._off}; "
                         "running trials one at a time")
            elif not self.bt.traceable() and not isinstance(self.bt, BatchedActivations):
                say_once(f"{type(self.bt.model).__name__}: {self.bt._untraceable}; its faulted modules run once "
                         "per trial on their share of each batch (no golden prefix)")
        if self._off is not None:
            return False
        if key not in self._ok:
            refs = runner.spaces[cell_id].tensors
            same = Plan.from_sites(refs, [0], [0])  # identity masks: the copy equals the original
            try:
                x0 = self.bt.x[:PROBE_ROWS]  # the probe's cost: a few rows, not the whole first mini-batch
                if self._golden is None:
                    self._golden = model_forward(self.bt.model)(x0)
                # trials 0 and 2 fault-free, trial 1 extreme (weights; activations: identity): 0 and 2 must equal
                # the plain forward, or the forward mixes trials (control flow or statistics over the batch)
                with self.bt.trials(PlanBlock.from_plans([same, same, same]), key, self.prefix and
                                    self.evaluate.single_forward, poison=True) as fwd:
                    out = fwd(np.concatenate([x0, x0, x0]), -1, x0)  # chunk -1: its own cache entry
                out = out.reshape(3, -1, *out.shape[1:])
                if out.shape[1:] != self._golden.shape or not all(
                        np.allclose(o, self._golden, rtol=1e-5, atol=1e-6, equal_nan=True) for o in out[::2]):
                    raise Unbatchable("its batched outputs differ from its plain forward (control flow or statistics "
                                      "over the batch, a faulted tensor read outside its module, or written in forward?)")
                self._ok[key] = True
            except Exception as exc:  # anything the batched forward cannot do: the serial path is always right
                why = one_line(exc)[:160]
                say_once(f"batched trials off for {type(self.bt.model).__name__} (tensors {', '.join(key[:3])}"
                         f"{'...' if len(key) > 3 else ''}): {why}; running those trials one at a time")
                self._ok[key] = False
        return self._ok[key]

    def run(self, runner: Any, cell_id: int, trials: Sequence[int]) -> list[Any]:
        """Rows of ``trials`` of cell ``cell_id``, in order."""
        if not self.usable(runner, cell_id) or self.size() == 1:
            return [runner.run(cell_id, t) for t in trials]
        cell = runner.cells[cell_id]
        start = time.perf_counter()
        whole = runner.plan_block(cell_id, trials)
        plan_each = (time.perf_counter() - start) / len(trials)
        rows: dict[int, Any] = {}
        for group in self.groups(whole):
            pos = 0
            while pos < len(group):
                size = self.size()
                part = group[pos : pos + size]
                start = time.perf_counter()
                block = PlanBlock.from_plans([whole.plan(j) for j in part])
                try:
                    answers = self.bt.run(block, cell.tensors, self.evaluate, prefix=self.prefix)
                except Exception as exc:
                    if is_oom(exc) and size > 1:
                        self.batch = size // 2
                        say_once(f"out of memory with {size} trials per forward; continuing with {self.batch}")
                        continue
                    say_once(f"a batched forward failed ({type(exc).__name__}: {str(exc)[:120]}); "
                             "running those trials one at a time")
                    rows.update((j, runner.run(cell_id, trials[j])) for j in part)
                    pos += len(part)
                    continue
                each = (time.perf_counter() - start) / len(part) + plan_each
                for k, j in enumerate(part):
                    rows[j] = runner.judged_row(cell_id, trials[j], block.plan(k), lambda a=answers[k]: a, each)
                pos += len(part)
        return [rows[j] for j in range(len(trials))]

    def groups(self, block: Any) -> list[list[int]]:
        """The positions of ``block``'s trials grouped so that each group shares one golden prefix (its first faulted
        graph node, or faulted layer output), in order of first appearance; without a prefix, one group."""
        if not (self.prefix and self.evaluate.single_forward and self.path() == "prefix"):
            return [list(range(len(block)))]
        keys = [self.bt.group_key(faulted_names(block.plan(j))) for j in range(len(block))]
        out: dict[Any, list[int]] = {}
        for j, key in enumerate(keys):
            out.setdefault(key, []).append(j)
        return list(out.values())


def batch_decision(runner: Any) -> tuple[TrialBatcher | None, str | None, bool]:
    """``(the runner's TrialBatcher, None, False)``, or ``(None, why its trials run one by one, whether building the
    batcher failed)``."""
    campaign = runner.campaign
    model = runner.targets.get(None)
    why = None
    if campaign.evaluator.batch_trials == 1:
        why = "batch_trials = 1"
    elif campaign.mode != "memory":
        why = "checkpoint mode evaluates files"
    elif not hasattr(runner.evaluate, "single_forward"):
        why = "a function or command evaluator runs the model itself (only built-in evaluators batch)"
    else:
        if framework_of(model) != "torch":
            why = "the target is not a PyTorch module"
        elif model.training:
            why = "the model is in training mode (call model.eval() in the factory)"
    if why is not None:
        return None, why, False
    try:
        return TrialBatcher(runner, model, runner.evaluate, campaign.evaluator.batch_trials), None, False
    except Exception as exc:  # e.g. evaluation inputs torch cannot take as one tensor: the serial path still runs
        return None, f"{type(exc).__name__}: {str(exc)[:160]}", True


def make_batcher(runner: Any) -> TrialBatcher | None:
    """The runner's :class:`TrialBatcher`, or None when its trials run one by one (a one-time notice says why when batching was asked for)."""
    batcher, why, failed = batch_decision(runner)
    want = runner.campaign.evaluator.batch_trials
    if failed:
        say_once(f"batched trials off: {why}; running trials one at a time")
    elif batcher is None and want not in (None, 1):
        say_once(f"batch_trials = {want} ignored: {why}; running trials one at a time")
    return batcher
