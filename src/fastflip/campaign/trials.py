"""Running trials: inject → evaluate → revert, and the outcome of each.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A :class:`TrialRunner` is built once per worker process (it loads the target once,
evaluates the fault-free *golden* run once, and prepares one
:class:`fastflip.core.sampling.SiteSpace` per cell) and then runs any (cell, trial) pair:

1. sites: distinct across the cell's trials, from a permutation keyed by (seed, cell)
   (:func:`fastflip.campaign.cells.trial_sites`, then ``SiteSpace.plan_sites`` with the
   generator of ``(seed, cell, trial)`` for the model's random parts), or, for
   ``distribution = 'tensor'``, ``SiteSpace.plan(Sampling(count=flips), seed, stream=(cell, trial))``;
2. ``memory`` mode: :func:`fastflip.live.inject` into the loaded arrays, evaluate,
   :func:`fastflip.live.revert` (bit-exact); activation targets: evaluate inside
   :func:`fastflip.live.activations.injected_activations` with the trial's plan (its
   sites in every sample of every forward of the evaluation);
   ``checkpoint`` mode: inject into the worker's working copy of the checkpoint file,
   evaluate with its path (function or shell command), revert the words exactly;
3. the outcome, by comparing the evaluator's answer with the golden run's
   (:func:`fastflip.campaign.outcomes.judge`; the table is in ``docs/outcomes.md``):

   * ``masked``: the answer is unchanged (``numeric`` set when only the raw outputs changed);
   * ``sdc``: the answer changed (for a classifier: some input's prediction); the fraction
     of inputs whose answer changed and the metric delta are stored;
   * ``critical``: an SDC whose metric got worse by more than ``[evaluator] critical``;
   * ``due``: NaN/Inf outputs or metric, or an exception (its message is stored).

Evaluators: ``builtin = "classification"`` (top-1, or top-k with ``top_k``; the answer is
each input's predicted class, the metric the top-k accuracy), ``builtin = "regression"``
(the answer is the outputs, equal within ``rtol``/``atol``; the metric is the mean squared
error, lower is better), a ``function`` whose result ``[evaluator] returns`` describes
(outputs, predictions and/or metric; see :func:`fastflip.campaign.outcomes.answer_from`), or a
``command`` printing a metric. A trial whose evaluator raises is a DUE; it never stops the
campaign, unless the error is out of memory or the environment's (:mod:`fastflip.campaign.failures`):
then the sweep stops with one line (:class:`~fastflip.campaign.failures.TrialAborted`).

Examples
--------
>>> import numpy as np
>>> classification_answer(np.array([[2.0, 1.0], [0.5, 0.7]]), np.array([0, 1])).predictions.tolist()
[0, 1]
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import socket
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import live
from ..core.blockplan import plan_block, plan_sites_block
from ..errors import FastflipError, OptionError, one_line
from ..files.formats.hfdir import KERAS_INDEX_SUFFIX, ShardedLayout
from ..files.patches import refuse_damaged_tensors, restore_words
from ..files.inject import inject_file
from ..files.keras_dtypes import stored_words
from ..files.layout import open_h5, read_layout
from ..files.sharded import copy_checkpoint_dir, inject_dir, is_checkpoint_dir, restore_dir
from ..live.activations import injected_activations
from .outcomes import CRITICAL, DUE, MASKED, SDC, Answer, Judgement, answer_from, judge
from .store import TrialRow
from .cells import Cell, block_trial_sites, call_factory, target_digest, target_tensors, trial_sites
from .evaluate import classification_answer, make_evaluator
from .config import Campaign
from .batchgate import serial_note, serial_reason
from .failures import TrialAborted, environment_failure
from .lifeline import make_workdir

__all__ = ["MASKED", "SDC", "CRITICAL", "DUE", "classification_answer", "make_evaluator", "sites_summary", "trial_seed",
           "TrialRunner", "run_chunk", "close_runners", "adopt_runner"]

_INF = float("inf")
_MESSAGE_LIMIT = 400
_DUE = Judgement(DUE, None, None, None, None)


def trial_seed(seed: int, cell_id: int, trial: int) -> np.random.SeedSequence:
    """The key trial ``trial`` of cell ``cell_id`` draws its sites from: ``SeedSequence([seed, cell, trial])``.

    The store keeps (campaign seed, cell, trial) per row, which is this key.

    >>> trial_seed(1, 0, 0).entropy
    [1, 0, 0]
    """
    return np.random.SeedSequence([int(seed), int(cell_id), int(trial)])


def sites_summary(plan: Any) -> str:
    """``name[index]^b<bits>`` per site, ``;``-separated (bits as positions, high first).

    >>> from fastflip.core.plan import Plan, TensorRef
    >>> p = Plan.from_sites([TensorRef("w", "<f4", (9,))], [0, 0], [2, 7], xor_mask=[1 << 30, 3])
    >>> sites_summary(p)
    'w[2]^b30;w[7]^b1,0'
    """
    names = [t.name for t in plan.tensors]
    out = []
    for t, i, b in zip(plan.tensor.tolist(), plan.index.tolist(), plan.bits.tolist()):
        bits = []
        while b:
            k = b.bit_length() - 1
            bits.append(str(k))
            b ^= 1 << k
        out.append(f"{names[t]}[{i}]^b{','.join(bits)}")
    return ";".join(out)


# ------------------------------------------------------------------------------ the runner
class TrialRunner:
    """Everything a worker needs to run trials of one campaign (built once per process).

    ``target``: the factory's object, already built in this process (used for the first epoch instead of
    calling the factory again; None: the runner calls the factory itself).
    """

    def __init__(self, campaign: Campaign, cells: Sequence[Cell], target: Any = None) -> None:
        self.campaign = campaign
        self.cells = list(cells)
        self.seed = campaign.seed
        ev = campaign.evaluator
        self.critical = ev.critical
        self.returns = ev.returns
        self._judge_opts = {"critical": ev.critical, "rtol": ev.rtol, "atol": ev.atol,
                            "greater_is_better": ev.greater_is_better}
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.evaluate = make_evaluator(campaign)
        epochs: list[int | None] = sorted({c.epoch for c in self.cells}, key=lambda e: -1 if e is None else e)
        self.targets: dict[int | None, Any] = {}
        self.golden: dict[int | None, Answer] = {}
        self._workdir: str | None = None
        self.layouts: dict[int | None, Any] = {}
        self._by_name: dict[int | None, dict[str, Any]] = {}
        self._raw_cells: dict[int, bool] = {}
        self.live: dict[int | None, Any] = {}
        refs_by_epoch = {}
        for e in epochs:
            built, target = target, None
            if campaign.target.kind == "activations":  # faults go into layer outputs during the evaluation
                obj = built if built is not None else call_factory(campaign)
                tensors = target_tensors(campaign, e, obj)
                self.targets[e] = obj
                self.golden[e] = answer_from(self.evaluate(obj), self.returns)
            elif campaign.mode == "memory":
                if campaign.target.factory is not None:
                    obj = built if built is not None else call_factory(campaign)
                    tensors = target_tensors(campaign, e, obj)
                else:
                    tensors = target_tensors(campaign, e)
                    obj = self._read_checkpoint(campaign.checkpoint_path(e), {t.path: t.dtype for t in tensors})
                self.targets[e] = obj
                self.live[e] = live.targets(obj)
                self.golden[e] = answer_from(self.evaluate(obj), self.returns)
            else:
                tensors = target_tensors(campaign, e)
                self.targets[e] = self._working_copy(campaign.checkpoint_path(e))
                self.layouts[e] = read_layout(self.targets[e])
                if self.layouts[e].format == "npz":  # once per copy: its trials write only words, CRCs and undos
                    names = {t.path for t in tensors}
                    refuse_damaged_tensors(self.targets[e], [t for t in self.layouts[e].tensors if t.path in names],
                                           label=campaign.checkpoint_path(e))  # the user's file, not the copy
                self.golden[e] = answer_from(self.evaluate(self.targets[e]), self.returns)
            refs_by_epoch[e] = {t.path: t.ref() for t in tensors}
        for e, g in self.golden.items():
            if judge(g, g, **self._judge_opts).outcome == DUE:
                raise OptionError(f"the fault-free (golden) evaluation gives NaN/Inf outputs (epoch {e}); fix the evaluator")
        self.specs = specs = [c.sampling_spec(campaign.cells.distribution) for c in self.cells]  # one per cell
        self.spaces = [sp.space([refs_by_epoch[c.epoch][name] for name in c.tensors]) for sp, c in zip(specs, self.cells)]
        self.models = [sp.fault_model for sp in specs]
        self.flips = [c.flips for c in self.cells]
        self._n_sites = [sp.n_sites(m) for sp, m in zip(self.spaces, self.models)]
        self._perms: dict[tuple[int, int], Any] = {}
        self._batcher: Any = False  # built on the first run_many (None: trials run one by one)

    @staticmethod
    def _read_checkpoint(path: str, dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
        """The selected datasets in memory, each as its tensor's stored words (a Keras bfloat16 variable, which
        h5py reads as opaque bytes, as uint16 words)."""
        with open_h5(path) as f:
            return {n: np.array(stored_words(f[n][()], dt)) for n, dt in dtypes.items()}

    def _restore(self, path: str, log: Any, epoch: int | None) -> None:
        """Undo one injection in the worker's own copy: the revert of :func:`fastflip.files.revert.revert`
        without its whole-file hashes and layout walk (the copy is ours; its layout is known)."""
        if isinstance(self.layouts[epoch], ShardedLayout):  # a checkpoint directory: each shard's words
            restore_dir(path, log, self.layouts[epoch])
        elif log.undo is not None:  # every byte the trial wrote: words, zip CRC fields, re-encoded chunks
            log.undo.apply(path, durable=False)  # the copy is scratch: nothing to fsync
        else:
            by_name = self._by_name.get(epoch)
            if by_name is None:
                by_name = self._by_name[epoch] = {t.path: t for t in self.layouts[epoch].tensors}
            restore_words(path, log.plan, by_name, log.old_words, log.new_words,  # zip CRC fields too
                          zipped=self.layouts[epoch].format in ("torch", "npz"))

    def _working_copy(self, path: str) -> str:
        if self._workdir is None:
            self._workdir = make_workdir()
            # removed when the worker process ends normally; the sweep removes it after a kill
            multiprocessing.util.Finalize(self, self.close, exitpriority=10)
        dst = os.path.join(self._workdir, f"{len(os.listdir(self._workdir))}-{os.path.basename(path)}")
        if is_checkpoint_dir(path):  # a Hugging Face directory or Keras sharded save: a copy of it (shared blocks)
            if path.endswith(KERAS_INDEX_SUFFIX):  # a Keras sharded index: the same index in a copy of its set
                return os.path.join(copy_checkpoint_dir(path, dst), os.path.basename(path))
            return copy_checkpoint_dir(path, dst)
        shutil.copyfile(path, dst)
        return dst

    def close(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def plan(self, cell_id: int, trial: int) -> Any:
        """The plan of one trial (regenerated from (seed, cell, trial) alone; see :mod:`fastflip.campaign.cells`)."""
        space, model = self.spaces[cell_id], self.models[cell_id]
        if self.cells[cell_id].sampling == "independent":
            return space.plan(self.specs[cell_id], seed=self.seed, stream=(cell_id, trial))
        sites = trial_sites(self._perms, self.seed, cell_id, self.cells[cell_id], trial, self._n_sites[cell_id])
        return space.plan_sites(sites, seed=self.seed, stream=(cell_id, trial), model=model)

    def plan_block(self, cell_id: int, trials: "Sequence[int] | np.ndarray") -> Any:
        """The plans of many trials of one cell as a :class:`~fastflip.core.blockplan.PlanBlock` (trial ``trials[j]``
        is ``block.plan(j)``, equal to :meth:`plan`; vectorised for the permutation design)."""
        space, model = self.spaces[cell_id], self.models[cell_id]
        trials = np.asarray(trials, dtype=np.int64).reshape(-1)
        streams = [(cell_id, t) for t in trials.tolist()]
        if self.cells[cell_id].sampling == "independent":
            return plan_block(space, self.specs[cell_id], seed=self.seed, streams=streams)
        sites = block_trial_sites(self._perms, self.seed, cell_id, self.cells[cell_id], trials, self._n_sites[cell_id])
        return plan_sites_block(space, sites, seed=self.seed, streams=streams, model=model)

    def _judge(self, result: Any, epoch: int | None) -> Judgement:
        """The :class:`~fastflip.campaign.outcomes.Judgement` of an evaluator's result against the golden run."""
        golden = self.golden[epoch]
        if type(result) is float and golden.outputs is None and golden.predictions is None:  # fast path: a metric
            if result != result or result in (_INF, -_INF):
                return Judgement(DUE, None, None, None, None)
            if result == golden.metric:
                return Judgement(MASKED, None, 0.0, result, 0.0)
            assert golden.metric is not None
            d = golden.metric - result if self._judge_opts["greater_is_better"] else result - golden.metric
            delta = round(d, 12)
            return Judgement(CRITICAL if delta > self.critical else SDC, None, 1.0, result, delta)
        return judge(golden, answer_from(result, self.returns), **self._judge_opts)

    def _due(self, exc: Exception, cell_id: int, trial: int) -> tuple[Judgement, str]:
        """A trial's exception as a DUE and its message, or :class:`~fastflip.campaign.failures.TrialAborted` when it
        is out of memory or the environment's (not an outcome of the fault: the sweep stops; docs/outcomes.md)."""
        why = environment_failure(exc)
        if why is not None:
            raise TrialAborted(
                f"trial {trial} of cell {cell_id} ({self.cells[cell_id].key}): {why} in the evaluator "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}); "
                "not a fault outcome, so the sweep stops: finished trials are saved; fix the cause (memory: "
                "[evaluator] batch_size, --batch-trials, fewer workers) and run again to resume") from None
        return _DUE, f"{type(exc).__name__}: {exc}"[:_MESSAGE_LIMIT]

    def judged_row(self, cell_id: int, trial: int, plan: Any, result: Callable[[], Any], elapsed: float) -> TrialRow:
        """The row of a trial whose evaluator result ``result()`` is known (a raising result is a DUE)."""
        message = None
        try:
            j = self._judge(result(), self.cells[cell_id].epoch)
        except Exception as exc:  # a crashing trial is a DUE, never the end of the campaign
            j, message = self._due(exc, cell_id, trial)
        return TrialRow(cell_id, trial, self.seed, sites_summary(plan), j.outcome, j.metric, j.delta, message,
                        elapsed, self.worker, None if j.numeric is None else int(j.numeric), j.changed)

    def batch_decision(self) -> tuple[Any, str | None, bool]:
        """``(a TrialBatcher for this runner, None, False)``, or ``(None, why its trials run one by one, whether
        building the batcher failed)``. A runner whose trials run one by one for a reason
        :func:`~fastflip.campaign.batchgate.serial_reason` names does not import the batched machinery; otherwise
        :func:`fastflip.campaign.batched.batch_decision` builds the batcher."""
        why = serial_reason(self)
        if why is not None:
            return None, why, False
        from .batched import batch_decision  # torch-side batching (torch.fx splits, per-trial modules): only when it may apply
        return batch_decision(self)

    def batcher(self) -> Any:
        """The runner's :class:`~fastflip.campaign.batched.TrialBatcher`, decided on the first call and kept, or None
        when its trials run one by one (a one-time notice says why when batching was asked for)."""
        if self._batcher is False:
            batcher, why, failed = self.batch_decision()
            if batcher is None:
                serial_note(self, why, failed)
            self._batcher = batcher
        return self._batcher

    def run_many(self, cell_id: int, trials: Sequence[int]) -> list[TrialRow]:
        """Run trials of one cell: ``B`` per forward where the target allows it
        (:mod:`fastflip.campaign.batched`), else one by one; the rows are those of :meth:`run`."""
        trials = [int(t) for t in trials]
        batcher = self.batcher()
        if batcher is None or len(trials) < 2:
            return [self.run(cell_id, t) for t in trials]
        return batcher.run(self, cell_id, trials)

    def run(self, cell_id: int, trial: int) -> TrialRow:
        """Run one trial; exceptions of the evaluator become a DUE outcome."""
        start = time.perf_counter()
        epoch = self.cells[cell_id].epoch
        plan = self.plan(cell_id, trial)
        target = self.targets[epoch]
        message = None
        if self.campaign.target.kind == "activations":
            try:
                with injected_activations(target, self.seed, plan=plan):
                    result = self.evaluate(target)
                j = self._judge(result, epoch)
            except FastflipError:
                raise  # a layer that stopped running or changed shape: the campaign's definition is wrong
            except Exception as exc:  # a crashing trial is a DUE, never the end of the campaign
                j, message = self._due(exc, cell_id, trial)
        elif self.campaign.mode == "memory":
            tg = self.live[epoch]
            log = live.inject(tg, plan)
            try:
                j = self._judge(self.evaluate(target), epoch)
            except Exception as exc:  # a crashing trial is a DUE, never the end of the campaign
                j, message = self._due(exc, cell_id, trial)
            finally:
                live.revert(tg, log)
        else:
            raw = self._raw_cells.get(cell_id)
            if raw is None:
                by_path = {t.path: t for t in self.layouts[epoch].tensors}
                raw = self._raw_cells[cell_id] = all(by_path[n].raw_writable for n in self.cells[cell_id].tensors)
            # raw storage: rewrite the words where they lie; filtered chunks: re-encode through a temporary copy
            inject = inject_dir if isinstance(self.layouts[epoch], ShardedLayout) else inject_file
            checked = {} if inject is inject_dir else {"members_checked": True}  # .npz members: when the copy was made
            res = inject(target, in_place=True, atomic=not raw, plan=plan, layout=self.layouts[epoch],
                         log_path=False, hash_files=False, durable=False, **checked)  # a scratch copy
            try:
                j = self._judge(self.evaluate(target), epoch)
            except Exception as exc:
                j, message = self._due(exc, cell_id, trial)
            finally:
                self._restore(target, res.log, epoch)
        return TrialRow(cell_id, trial, self.seed, sites_summary(plan), j.outcome, j.metric, j.delta, message,
                        time.perf_counter() - start, self.worker,
                        None if j.numeric is None else int(j.numeric), j.changed)


# ------------------------------------------------------------------------------ worker entry
_RUNNERS: dict[str, TrialRunner] = {}


def get_runner(token: str, campaign_dict: dict[str, Any], cells: Sequence[Cell],
               digest: str | None = None) -> TrialRunner:
    """The process's runner for a campaign (built on first use, then reused).

    ``digest`` is the factory target's :func:`~fastflip.campaign.cells.target_digest` in the
    sweep process: a worker whose factory gives other tensors refuses to run.
    """
    runner = _RUNNERS.get(token)
    if runner is None:
        for old in _RUNNERS.values():
            old.close()
        _RUNNERS.clear()
        runner = TrialRunner(Campaign.from_dict(campaign_dict), cells)
        _RUNNERS[token] = runner
    if digest is not None and not getattr(runner, "_digest_checked", False):  # built here, or by the pre-flight
        if target_digest(runner.targets[None]) != digest:
            _RUNNERS.pop(token, None)
            raise OptionError(
                f"the target factory {runner.campaign.target.factory} gives other tensors in worker "
                f"{runner.worker} than in the sweep (unseeded random weights?); results would not be reproducible"
            )
        runner._digest_checked = True
    return runner


def adopt_runner(token: str, runner: TrialRunner) -> None:
    """Make ``runner`` (built by the sweep's pre-flight in this process) the process's runner for ``token``."""
    close_runners()
    _RUNNERS[token] = runner


def close_runners() -> None:
    """Close this process's runners (removes their working copies)."""
    for runner in _RUNNERS.values():
        runner.close()
    _RUNNERS.clear()


def run_chunk(token: str, campaign_dict: dict[str, Any], cells: Sequence[Cell], cell_id: int,
              trials: Sequence[int]) -> list[TrialRow]:
    """Run trials of one cell in this process (a convenience for harnesses with their own executor)."""
    runner = get_runner(token, campaign_dict, cells)
    return runner.run_many(cell_id, [int(t) for t in trials])


def worker_error(exc: BaseException) -> str:
    """One line naming a worker-side failure that is not a trial outcome (bad config, missing module)."""
    if isinstance(exc, FastflipError):
        return one_line(exc)
    return f"{type(exc).__name__}: {exc}"
