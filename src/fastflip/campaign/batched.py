"""Batched trials for PyTorch targets: B trials of a cell in one forward pass.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A trial of a ``memory``-mode campaign on a PyTorch module with a built-in evaluator
(``classification`` or ``regression``) is one forward pass of the evaluation set through
the faulty model. :class:`BatchedTorch` runs ``B`` weight-fault trials at once:

* only the faulted tensors are copied: each becomes a stack of ``B`` copies, trial ``j``'s
  sites applied to copy ``j`` by the plan's exact word rule (:mod:`fastflip.core.wordrule`; the
  few faulted words make one trip to the host per block and tensor, never one per trial);
  every other tensor is shared;
* the model, traced by ``torch.fx`` (a static graph: no control flow on values), runs once
  on the evaluation inputs repeated ``B`` times along the batch dimension; every module
  holding a faulted tensor runs once per trial, on that trial's part of its input with
  that trial's copy (the serial forward's kernel and batch size, so huge or infinite
  faulty values meet the same arithmetic as in a serial trial), the other modules once on
  the whole batch (tied weights follow: every module holding a faulted tensor is split);
* golden-prefix reuse: the values that the rest of the network needs from before the first
  node touching a faulted tensor are computed once per cell on the fault-free model, and
  each block runs only the rest of the network. A split that would need more than
  batch-major tensors (a size read early) runs the full forward (said once).

:class:`BatchedActivations` does the same for activation faults: ``B × N`` samples per
forward, trial ``j``'s plan in the layer outputs of its ``N`` samples; with the prefix, the
faulted layer's golden output is faulted per trial and only the rest of the network runs.

The user's tensors are never written: during a block the faulted modules' ``forward`` and
parameter slots are swapped and put back in ``finally``. On a CUDA model everything (stacks,
flips, forward) stays on the device; the outputs of a block come back once for judging.

``B`` is chosen from free memory (host RAM, or the CUDA device's free memory) and the
output size of one forward, unless ``[evaluator] batch_trials`` / ``--batch-trials`` gives
it; out-of-memory halves ``B`` and continues. A model that cannot be batched (no static
graph: control flow on tensor values; ``forward`` writing to its parameters in place; a
faulted tensor used outside a layer's forward; outputs that differ from the plain forward
in a probe of fault-free copies) runs trial by trial, said in one line.

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
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import FastflipError

__all__ = ["BatchedTorch", "Unbatchable", "auto_batch", "is_oom", "say_once"]

_MAX_AUTO = 64  # CPU: beyond this many trials per pass the forward is not faster per trial, only bigger
_MAX_AUTO_GPU = 512
_SAID: set[str] = set()


class Unbatchable(FastflipError):
    """The model cannot run several trials in one forward (the message says why)."""


def say_once(text: str, stream: Any = None) -> None:
    """Write ``fastflip: text`` once per process (fallback notes of workers)."""
    if text in _SAID:
        return
    _SAID.add(text)
    out = stream if stream is not None else sys.stderr
    out.write(f"fastflip: {text}\n")
    out.flush()


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (host or device)."""
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


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


class BatchedTorch:
    """Run blocks of weight-fault trials of one PyTorch module in shared forwards (module docstring).

    Parameters
    ----------
    model : torch.nn.Module
        In eval mode (its tensors are only read).
    x : array or tensor
        The evaluation inputs (one forward, as the built-in evaluators run it).
    """

    def __init__(self, model: Any, x: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        first = next(iter(list(model.parameters()) + list(model.buffers())), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.x = torch.as_tensor(x).to(self.device)
        self.named = {**dict(model.named_parameters(remove_duplicate=False)),
                      **dict(model.named_buffers(remove_duplicate=False))}
        self._suffix: dict[tuple[str, ...], Any] = {}
        self._out_bytes: int | None = None
        self._gm: Any = None

    # -- the faulty copies -------------------------------------------------------------
    def stacks(self, block: Any, names: Sequence[str]) -> dict[int, Any]:
        """``{id(tensor): stack of B faulty copies}`` for every tensor the block's plans touch."""
        torch = self.torch
        from ..core.wordrule import rule_words, scale_words

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
        """The model traced by ``torch.fx`` (batching needs a static graph: control flow cannot depend on values)."""
        if self._gm is None:
            import torch.fx as fx

            try:
                # wrapped, so that a model that is itself one torch.nn layer is one call of it
                gm = fx.symbolic_trace(self.torch.nn.Sequential(self.model))
            except Exception as exc:
                first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
                raise Unbatchable(f"torch.fx cannot trace it, so trials cannot share a forward "
                                  f"(control flow on tensor values?): {type(exc).__name__}: {first}") from None
            for n in gm.graph.nodes:  # forward writing to its own tensors: every trial would write the same one
                if n.op in ("call_method", "call_function") and str(getattr(n.target, "__name__", n.target)).endswith("_") \
                        and n.args and getattr(n.args[0], "op", None) == "get_attr":
                    op = n.target if isinstance(n.target, str) else n.target.__name__
                    raise Unbatchable(f"its forward writes to {str(n.args[0].target).partition('.')[2]} in place ({op})")
            self._gm = gm
        return self._gm

    def outputs(self, block: Any, cell_tensors: Sequence[str], prefix: bool = True) -> np.ndarray:
        """The model's outputs for every trial of ``block``: an array ``(B, *output shape)``.

        The evaluation inputs are repeated ``B`` times along the batch dimension; every module that holds a
        faulted tensor runs once per trial on that trial's part of its input with that trial's copy (the same
        kernel and batch as the serial forward); the other modules run once on the whole batch.
        """
        torch = self.torch
        B = len(block)
        stacks = self.stacks(block, cell_tensors)
        gm = self.graph()
        split = self.suffix(cell_tensors) if prefix else None
        module, args = split if split is not None else (gm, (self.x,))
        args = tuple(a.repeat(B, *([1] * (a.dim() - 1))) for a in args)
        restore = self._patch(gm, module, stacks, B)
        try:
            with torch.no_grad():
                out = module(*args)
        finally:
            for mod in restore:
                del mod.forward
        if not isinstance(out, torch.Tensor):
            raise Unbatchable(f"the model returns a {type(out).__name__}, not a tensor")
        if out.shape[0] % B:
            raise Unbatchable("its outputs are not batch-major (the batch is not their first dimension)")
        return out.detach().reshape(B, out.shape[0] // B, *out.shape[1:]).cpu().numpy()

    def _patch(self, gm: Any, module: Any, stacks: dict[int, Any], B: int) -> list[Any]:
        """Make every called module holding a faulted tensor run trial by trial (undone by deleting ``forward``)."""
        torch = self.torch
        used = {n.target for n in module.graph.nodes if n.op == "call_module"}
        for n in module.graph.nodes:
            if n.op == "get_attr":
                obj: Any = module
                for part in str(n.target).split("."):
                    obj = getattr(obj, part)
                if id(obj) in stacks:
                    raise Unbatchable(f"faulted tensor {str(n.target).partition('.')[2]} is used outside the "
                                      "forward of a torch.nn layer")
        patched = []
        for name in sorted(used):
            mod = module.get_submodule(name)
            hit = {}
            for store in ("_parameters", "_buffers"):
                for pn, t in getattr(mod, store).items():
                    if t is not None and id(t) in stacks:
                        hit[(store, pn)] = (t, stacks[id(t)])
            if not hit:
                continue

            def per_trial(*a: Any, _mod: Any = mod, _hit: dict = hit, **kw: Any) -> Any:
                total = next(t.shape[0] for t in a if isinstance(t, torch.Tensor))
                n = total // B
                outs = []
                try:
                    for j in range(B):
                        for (store, pn), (_, st) in _hit.items():
                            getattr(_mod, store)[pn] = st[j]
                        part = [t[j * n:(j + 1) * n] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == total
                                else t for t in a]
                        outs.append(type(_mod).forward(_mod, *part, **kw))
                finally:
                    for (store, pn), (orig, _) in _hit.items():
                        getattr(_mod, store)[pn] = orig
                return torch.cat(outs, 0)

            mod.forward = per_trial
            patched.append(mod)
        if not patched:
            raise Unbatchable("no module of the graph holds the faulted tensors")
        return patched

    def golden_outputs(self) -> np.ndarray:
        """One fault-free forward (the serial evaluators' call)."""
        with self.torch.no_grad():
            return self.model(self.x).detach().cpu().numpy()

    def per_trial_bytes(self) -> int:
        """Memory one more trial in a block needs: the outputs of every module in one forward, twice."""
        if self._out_bytes is None:
            total = [0]

            def hook(mod: Any, inp: Any, out: Any) -> None:
                if isinstance(out, self.torch.Tensor):
                    total[0] += out.numel() * out.element_size()

            hooks = [m.register_forward_hook(hook) for m in self.model.modules()]
            try:
                self.golden_outputs()
            finally:
                for h in hooks:
                    h.remove()
            self._out_bytes = 2 * total[0] + self.x.numel() * self.x.element_size()
        return self._out_bytes

    # -- golden prefix -----------------------------------------------------------------
    def suffix(self, cell_tensors: Sequence[str]) -> tuple[Any, tuple[Any, ...]] | None:
        """``(graph module running the rest of the network, its cached inputs)`` for faults in ``cell_tensors``,
        or None when nothing comes before the faulted tensors' first use or the split needs more than
        batch-major tensors (then the full forward runs; said once)."""
        key = tuple(sorted(cell_tensors))
        if key not in self._suffix:
            try:
                self._suffix[key] = split_after_prefix(self.graph(), self.x, [self.named[n] for n in key])
            except Unbatchable as exc:
                say_once(f"golden-prefix reuse off for {type(self.model).__name__} (tensors {', '.join(key[:3])}): "
                         f"{exc}; running the full forward")
                self._suffix[key] = None
        return self._suffix[key]


class BatchedActivations(BatchedTorch):
    """Blocks of activation-fault trials: the inputs repeated ``B`` times, trial ``j``'s plan faulting the layer
    outputs of samples ``j*N … j*N+N-1`` (:func:`fastflip.live.activations.injected_activations` with a block)."""

    def __init__(self, model: Any, x: Any, seed: int) -> None:
        super().__init__(model, x)
        self.seed = int(seed)

    def suffix(self, cell_tensors: Sequence[str]) -> Any:
        """``(rest of the network, its golden inputs, position of the faulted layer's output)`` for a cell of one
        layer output, or None (several layer outputs, no prefix, or a model the split refuses; said once)."""
        key = tuple(sorted(cell_tensors))
        if key not in self._suffix:
            self._suffix[key] = None
            if len(key) == 1:
                try:
                    self._suffix[key] = split_after_layer(self.graph(), self.x, key[0])
                except Unbatchable as exc:
                    say_once(f"golden-prefix reuse off for {type(self.model).__name__} (layer {key[0]}): {exc}; "
                             "running the full forward")
        return self._suffix[key]

    def outputs(self, block: Any, cell_tensors: Sequence[str], prefix: bool = True) -> np.ndarray:
        from ..live.activations import injected_activations

        torch = self.torch
        self.graph()  # a static graph: no control flow on (faulted) values
        B, n = len(block), int(self.x.shape[0])
        split = self.suffix(cell_tensors) if prefix else None
        if split is not None:  # the golden output of the faulted layer, faulted per trial, then the rest
            from ..live.act_frameworks import TorchHooks
            from ..live.activations import ActivationLog, Sites

            suffix, inputs, at = split
            args = [a.repeat(B, *([1] * (a.dim() - 1))) for a in inputs]
            refs = list(block.tensors)
            sites = Sites(refs, seed=self.seed, plan=block, samples_per_plan=n)
            li = [r.name for r in refs].index(cell_tensors[0])
            faulted = TorchHooks(self.model).write(args[at], li, sites, ActivationLog(seed=self.seed), alias=True)
            if faulted is not None:
                args[at] = faulted
            with torch.no_grad():
                out = suffix(*args)
            return out.detach().reshape(B, n, *out.shape[1:]).cpu().numpy()
        xb = self.x.repeat(B, *([1] * (self.x.dim() - 1)))
        with injected_activations(self.model, self.seed, plan=block, samples_per_plan=n):
            with torch.no_grad():
                out = self.model(xb)
        if not isinstance(out, torch.Tensor) or out.shape[0] != B * n:
            raise Unbatchable("its outputs are not one batch-major tensor")
        return out.detach().reshape(B, n, *out.shape[1:]).cpu().numpy()


def split_after_prefix(gm: Any, x: Any, faulted: Sequence[Any]) -> tuple[Any, tuple[Any, ...]] | None:
    """Split a traced model before the first graph node that reads a tensor of ``faulted``.

    Returns ``(suffix, inputs)``: a ``torch.fx.GraphModule`` whose inputs are the values
    the rest of the network needs from the prefix (computed here once on the fault-free
    model with input ``x``), or None when there is no prefix to reuse. ``suffix(*inputs)``
    equals ``gm(x)``.
    """
    import torch
    import torch.fx as fx

    ids = {id(t) for t in faulted}
    nodes = list(gm.graph.nodes)
    modules = dict(gm.named_modules())

    def reads_fault(n: Any) -> bool:
        if n.op == "call_module":
            mod = modules[n.target]
            return any(id(t) in ids for t in list(mod.parameters()) + list(mod.buffers()))
        if n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            return id(obj) in ids
        return False

    first = next((k for k, n in enumerate(nodes) if reads_fault(n)), None)
    if first is None:
        raise Unbatchable("no graph node reads the faulted tensors")
    split = split_at(gm, x, first)
    return None if split is None else split[:2]


def split_at(gm: Any, x: Any, first: int) -> tuple[Any, tuple[Any, ...], list[Any]] | None:
    """``(suffix, inputs, frontier nodes)``: ``gm`` cut before its node ``first`` (see :func:`split_after_prefix`)."""
    import torch
    import torch.fx as fx

    nodes = list(gm.graph.nodes)
    prefix = nodes[:first]
    if all(n.op in ("placeholder", "get_attr") for n in prefix):
        return None
    later = set(nodes[first:])
    frontier = [n for n in prefix if n.op != "get_attr" and any(u in later for u in n.users)]
    env: dict[Any, Any] = {}
    want = set(frontier)
    interp = fx.Interpreter(gm)
    with torch.no_grad():
        args = iter([x])
        for n in prefix:
            if n.op == "placeholder":
                env[n] = next(args)
            else:
                env[n] = getattr(interp, n.op)(n.target, *fx.node.map_arg((n.args, n.kwargs), lambda a: env[a]))
            for a in n.all_input_nodes:  # free the values whose every user has run and the rest does not need
                if a not in want and a in env and all(u in env for u in a.users):
                    del env[a]
    inputs = tuple(env[n] for n in frontier)
    batch = x.shape[0]
    if not all(isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch for v in inputs):
        raise Unbatchable("the rest of the network needs values that are not batch-major tensors (sizes?)")
    graph = fx.Graph()
    remap: dict[Any, Any] = {}
    for n in frontier:
        remap[n] = graph.placeholder(f"golden_{n.name}")
    for n in prefix:
        if n.op == "get_attr" and any(u in later for u in n.users):
            remap[n] = graph.node_copy(n, lambda a: remap[a])
    for n in nodes[first:]:
        remap[n] = graph.node_copy(n, lambda a: remap[a])
    return fx.GraphModule(gm, graph), inputs, frontier


def split_after_layer(gm: Any, x: Any, name: str) -> tuple[Any, tuple[Any, ...], int] | None:
    """Cut a traced model right after the call of layer output ``name`` (``layer`` or ``layer#k``, the k-th call).

    Returns ``(suffix, inputs, position of that layer's output among inputs)`` or None (nothing to reuse).
    """
    layer, _, k = name.partition("#")
    calls = [i for i, n in enumerate(gm.graph.nodes) if n.op == "call_module" and n.target == f"0.{layer}"]
    if len(calls) <= int(k or 0):
        raise Unbatchable(f"layer {name} is not a call of the traced graph")
    at = calls[int(k or 0)]
    split = split_at(gm, x, at + 1)
    if split is None:
        return None
    suffix, inputs, frontier = split
    node = list(gm.graph.nodes)[at]
    if node not in frontier:
        raise Unbatchable(f"the output of layer {name} is not used by the rest of the network")
    return suffix, inputs, frontier.index(node)


class TrialBatcher:
    """A worker's batched path: blocks of one cell's trials through :class:`BatchedTorch` (module docstring).

    Built by :func:`make_batcher` for a runner whose campaign allows it; ``run`` gives the
    same rows as running the trials one by one (``runner.run``), which remains the path
    for cells or blocks that cannot be batched.
    """

    def __init__(self, runner: Any, model: Any, evaluate: Any, batch: int | None) -> None:
        if runner.campaign.target.kind == "activations":
            self.bt: BatchedTorch = BatchedActivations(model, evaluate.inputs, runner.seed)
        else:
            self.bt = BatchedTorch(model, evaluate.inputs)
        self.answer = evaluate.answer
        self.batch = batch
        self.prefix = True
        self._ok: dict[tuple[str, ...], bool] = {}
        self._golden: np.ndarray | None = None
        self._off: str | None = None  # why the model cannot batch at all

    def size(self) -> int:
        """Trials per forward: the configured number, or what free memory allows."""
        if self.batch is None:  # a GPU keeps gaining from wider forwards long after a CPU core has stopped
            limit = _MAX_AUTO_GPU if getattr(self.bt.device, "type", "cpu") == "cuda" else _MAX_AUTO
            self.batch = auto_batch(self.bt.per_trial_bytes(), free_memory(self.bt.device), limit)
        return self.batch

    def usable(self, runner: Any, cell_id: int) -> bool:
        """Whether the cell's trials can be batched: a probe of two fault-free copies against the golden forward."""
        from ..core.blockplan import PlanBlock
        from ..core.plan import Plan

        key = tuple(sorted(runner.cells[cell_id].tensors))
        if key not in self._ok and self._off is None:
            try:
                self.bt.graph()
            except Unbatchable as exc:  # the whole model: said once
                self._off = str(exc)
                say_once(f"batched trials off for {type(self.bt.model).__name__}: {exc}; running trials one at a time")
        if self._off is not None:
            return False
        if key not in self._ok:
            refs = runner.spaces[cell_id].tensors
            same = Plan.from_sites(refs, [0], [0])  # identity masks: the copy equals the original
            try:
                if self._golden is None:
                    self._golden = self.bt.golden_outputs()
                out = self.bt.outputs(PlanBlock.from_plans([same, same]), key, prefix=self.prefix)
                if out.shape[1:] != self._golden.shape or not all(
                        np.allclose(o, self._golden, rtol=1e-5, atol=1e-6, equal_nan=True) for o in out):
                    raise Unbatchable("its batched outputs differ from its plain forward (in-place writes to "
                                      "parameters in forward?)")
                self._ok[key] = True
            except Exception as exc:  # anything the batched forward cannot do: the serial path is always right
                why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
                say_once(f"batched trials off for {type(self.bt.model).__name__} (tensors {', '.join(key[:3])}"
                         f"{'...' if len(key) > 3 else ''}): {why}; running those trials one at a time")
                self._ok[key] = False
        return self._ok[key]

    def run(self, runner: Any, cell_id: int, trials: Sequence[int]) -> list[Any]:
        """Rows of ``trials`` of cell ``cell_id``, in order."""
        import time

        if not self.usable(runner, cell_id):
            return [runner.run(cell_id, t) for t in trials]
        cell = runner.cells[cell_id]
        rows: list[Any] = []
        pos = 0
        while pos < len(trials):
            size = self.size()
            chunk = list(trials[pos : pos + size])
            start = time.perf_counter()
            block = runner.plan_block(cell_id, chunk)
            try:
                out = self.bt.outputs(block, cell.tensors, prefix=self.prefix)
            except Exception as exc:
                if is_oom(exc) and size > 1:
                    self.batch = size // 2
                    say_once(f"out of memory with {size} trials per forward; continuing with {self.batch}")
                    continue
                say_once(f"a batched forward failed ({type(exc).__name__}: {str(exc)[:120]}); "
                         "running those trials one at a time")
                rows += [runner.run(cell_id, t) for t in chunk]
                pos += len(chunk)
                continue
            each = (time.perf_counter() - start) / len(chunk)
            for j, t in enumerate(chunk):
                rows.append(runner.judged_row(cell_id, t, block.plan(j), lambda o=out[j]: self.answer(o), each))
            pos += len(chunk)
        return rows


def make_batcher(runner: Any) -> TrialBatcher | None:
    """The runner's :class:`TrialBatcher`, or None when its trials run one by one (said once when asked for)."""
    campaign = runner.campaign
    want = campaign.evaluator.batch_trials
    if want == 1:
        return None
    model = runner.targets.get(None)
    why = None
    if campaign.mode != "memory":
        why = "checkpoint mode evaluates files"
    elif not hasattr(runner.evaluate, "answer"):
        why = "a function or command evaluator runs the model itself (only built-in evaluators batch)"
    else:
        from ..live.adapters import framework_of

        if framework_of(model) != "torch":
            why = "the target is not a PyTorch module"
        elif model.training:
            why = "the model is in training mode (call model.eval() in the factory)"
    if why is not None:
        if want is not None:
            say_once(f"batch_trials = {want} ignored: {why}; running trials one at a time")
        return None
    try:
        return TrialBatcher(runner, model, runner.evaluate, want)
    except Exception as exc:  # e.g. evaluation inputs torch cannot take as one tensor: the serial path still runs
        say_once(f"batched trials off: {type(exc).__name__}: {str(exc)[:160]}; running trials one at a time")
        return None
