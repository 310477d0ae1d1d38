"""Batched trials of a worker: which cells batch, how many trials per forward, and the rows of a block.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A ``memory``-mode campaign on a PyTorch module with a built-in evaluator runs a cell's trials in blocks
through :class:`fastflip.campaign.batchedtorch.BatchedTorch` (weights) or
:class:`~fastflip.campaign.batchedtorch.BatchedActivations` (layer outputs); :class:`TrialBatcher` decides
per model and cell whether that is possible, groups a cell's trials by the golden prefix they share, and
gives the same rows as running the trials one by one (``TrialRunner.run``), which remains the path for
cells or blocks that cannot be batched.

``B`` is chosen by measurement on a CPU (:func:`fastflip.campaign.batchsize.choose_batch`, serial when no
size beats it) and from free memory on a GPU (host RAM or the device's free memory and the output size of
one forward), unless ``[evaluator] batch_trials`` / ``--batch-trials`` gives it; out-of-memory halves
``B`` and continues. Before a cell batches, a probe runs three copies (fault-free, extreme, fault-free)
and requires the fault-free ones to equal the plain forward (without a graph, the faulted slots hold NaN
outside their modules meanwhile): a model whose forward mixes trials (control flow or statistics over the
batch), reads a faulted tensor outside its module or writes to its parameters in place runs that cell
trial by trial, said in one line.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ..core.blockplan import PlanBlock
from ..core.plan import Plan
from ..errors import one_line
from .batchedtorch import BatchedActivations, BatchedTorch, faulted_names
from .batchsize import MAX_AUTO, MAX_AUTO_GPU, auto_batch, choose_batch, free_memory, steady_allocator
from .batchgate import say_once
from .builtins import model_forward
from .failures import is_oom
from .pertrial import Unbatchable

__all__ = ["PROBE_ROWS", "TrialBatcher", "batch_decision"]

#: Rows of the first mini-batch the per-cell probe runs (three copies each): enough rows per trial that modules run
#: as in real blocks (:data:`fastflip.campaign.pertrial.SMALL_ROWS`), few enough that the probe costs little
PROBE_ROWS = 32


class TrialBatcher:
    """A worker's batched path: blocks of one cell's trials through :class:`BatchedTorch` (module docstring).

    Built by :func:`batch_decision` for a runner whose campaign allows it; ``run`` gives the
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
        self._steady = False  # the allocator is set for blocks when the first block runs (not in a process that only decides)
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
                             MAX_AUTO_GPU if gpu else MAX_AUTO)
            if gpu:
                self.batch = cap
            else:
                try:
                    self.choice = choose_batch(self.measure, cap)
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
        if not self._steady:  # blocks reuse the heap instead of faulting in fresh pages (glibc; else a no-op)
            steady_allocator()
            self._steady = True
        cell = runner.cells[cell_id]
        start = time.perf_counter()
        whole = runner.plan_block(cell_id, trials)
        plans = whole.plans()
        plan_each = (time.perf_counter() - start) / len(trials)
        rows: dict[int, Any] = {}
        for group in self.groups(plans):
            pos = 0
            while pos < len(group):
                size = self.size()
                part = group[pos : pos + size]
                start = time.perf_counter()
                block = PlanBlock.from_plans([plans[j] for j in part])
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
                    rows[j] = runner.judged_row(cell_id, trials[j], plans[j], lambda a=answers[k]: a, each)
                pos += len(part)
        return [rows[j] for j in range(len(trials))]

    def groups(self, plans: Sequence[Any]) -> list[list[int]]:
        """The positions of ``plans`` (a block's trials) grouped so that each group shares one golden prefix (its first
        faulted graph node, or faulted layer output), in order of first appearance; without a prefix, one group."""
        if not (self.prefix and self.evaluate.single_forward and self.path() == "prefix"):
            return [list(range(len(plans)))]
        keys = [self.bt.group_key(faulted_names(p)) for p in plans]
        out: dict[Any, list[int]] = {}
        for j, key in enumerate(keys):
            out.setdefault(key, []).append(j)
        return list(out.values())


def batch_decision(runner: Any) -> tuple[TrialBatcher | None, str | None, bool]:
    """``(the runner's TrialBatcher, None, False)``, or ``(None, why building it failed, True)``; called by
    :meth:`fastflip.campaign.trials.TrialRunner.batch_decision` once
    :func:`~fastflip.campaign.batchgate.serial_reason` allows batching."""
    try:
        return TrialBatcher(runner, runner.targets.get(None), runner.evaluate,
                            runner.campaign.evaluator.batch_trials), None, False
    except Exception as exc:  # e.g. evaluation inputs torch cannot take as one tensor: the serial path still runs
        return None, f"{type(exc).__name__}: {str(exc)[:160]}", True
