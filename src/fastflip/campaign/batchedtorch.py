"""Weight and activation faults of B trials in one PyTorch forward: the faulty copies, the per-trial modules and
the golden-activation cache.

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

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from ..core.wordrule import rule_words, scale_words
from ..live.act_torch import TorchHooks
from ..live.activations import ActivationLog, Sites, injected_activations
from .batchgate import say_once
from .batchsize import free_memory
from .builtins import logits_of, model_forward, to_numpy
from .fxsplit import first_uses, split_after_layer, split_after_prefix
from .pertrial import PerTrial, Unbatchable

__all__ = ["BatchedActivations", "BatchedTorch", "Untraceable", "faulted_names"]

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
        self._parts: tuple[dict[int, str], list[tuple[str, Any]]] | None = None
        self._untraceable: str | None = None

    # -- the faulty copies -------------------------------------------------------------
    def stacks(self, block: Any) -> dict[int, Any]:
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

    def graph_parts(self) -> tuple[dict[int, str], list[tuple[str, Any]]]:
        """What every block needs of the traced graph, read in one walk of its nodes per model:
        ``{id(tensor): name}`` of the tensors it reads outside a module's forward (``get_attr`` nodes, in graph
        order) and ``[(name, module)]`` of the modules it calls, sorted by name."""
        if self._parts is None:
            gm = self.graph()
            attrs: dict[int, str] = {}
            called: set[str] = set()
            for n in gm.graph.nodes:
                if n.op == "get_attr":
                    obj: Any = gm
                    for part in str(n.target).split("."):
                        obj = getattr(obj, part)
                    attrs.setdefault(id(obj), str(n.target).partition(".")[2])
                elif n.op == "call_module":
                    called.add(n.target)
            self._parts = attrs, [(name.partition(".")[2], gm.get_submodule(name)) for name in sorted(called)]
        return self._parts

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
        stacks = self.stacks(block)
        if poison:  # the probe: trial 1 holds the largest finite values, so that any mixing of trials shows in the others
            for st in stacks.values():
                if st.is_floating_point() and B > 2:
                    st[1].fill_(torch.finfo(st.dtype).max)
        gm = self.graph() if self.traceable() else None
        if gm is not None:
            attrs, modules = self.graph_parts()
            for tid, name in attrs.items():
                if tid in stacks:
                    raise Unbatchable(f"faulted tensor {name} is used outside the forward of a torch.nn layer")
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
                faulted = TorchHooks(self.model).write(args[at], li, sites, ActivationLog(seed=self.seed),
                                                       alias=lambda: True)  # the cached golden output: a copy
                if faulted is not None:
                    args[at] = faulted
                with torch.no_grad():
                    return np.array(to_numpy(logits_of(suffix(*args))))  # never a view of a reused tile
            xb = torch.as_tensor(np.asarray(x)).to(self.device)
            with injected_activations(self.model, self.seed, plan=block, samples_per_plan=n):
                with torch.no_grad():
                    return to_numpy(logits_of(self.model(xb)))

        yield forward
