"""Running trials: inject → evaluate → revert, and the outcome of each.

A :class:`TrialRunner` is built once per worker process (it loads the target once,
evaluates the fault-free *golden* run once, and prepares one
:class:`fastflip.sampling.SiteSpace` per cell) and then runs any (cell, trial) pair:

1. sites from ``SiteSpace.plan(seed=campaign seed, stream=(cell, trial), count=flips)``;
2. ``memory`` mode: :func:`fastflip.live.inject` into the loaded arrays, evaluate,
   :func:`fastflip.live.revert` (bit-exact);
   ``checkpoint`` mode: inject into the worker's working copy of the checkpoint file,
   evaluate with its path (function or shell command), revert the words exactly;
3. the outcome, by comparing with the golden run:

   ``masked``   outputs identical to the golden outputs;
   ``sdc``      outputs changed (the metric delta = golden metric − metric is stored);
   ``critical`` an SDC whose delta exceeds ``[evaluator] critical``;
   ``due``      NaN/Inf outputs or metric, or an exception (its message is stored).

An evaluator returns a metric (a float), an array of outputs, a ``(outputs, metric)``
pair or a mapping with ``outputs`` and ``metric``. A trial whose evaluator raises is a
DUE; it never stops the campaign.

Examples
--------
>>> import numpy as np
>>> classify(np.array([1.0, 2.0]), 0.9, np.array([1.0, 2.5]), 0.5, critical=0.1)
(2, 0.4)
>>> classify(np.array([1.0]), 0.9, np.array([np.nan]), 0.9, critical=0.1)[0]
3
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import socket
import subprocess
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import FastflipError, OptionError
from ..store import TrialRow
from .cells import Cell, call_factory, import_object, target_tensors
from .config import Campaign
from .lifeline import make_workdir

__all__ = ["MASKED", "SDC", "CRITICAL", "DUE", "classify", "sites_summary", "trial_seed", "TrialRunner", "run_chunk", "close_runners"]

MASKED, SDC, CRITICAL, DUE = 0, 1, 2, 3
_INF = float("inf")
_MESSAGE_LIMIT = 400


def trial_seed(seed: int, cell_id: int, trial: int) -> np.random.SeedSequence:
    """The key trial ``trial`` of cell ``cell_id`` draws its sites from: ``SeedSequence([seed, cell, trial])``.

    The store keeps (campaign seed, cell, trial) per row, which is this key.

    >>> trial_seed(1, 0, 0).entropy
    [1, 0, 0]
    """
    return np.random.SeedSequence([int(seed), int(cell_id), int(trial)])


def sites_summary(plan: Any) -> str:
    """``name[index]^b<bits>`` per site, ``;``-separated (bits as positions, high first).

    >>> from fastflip.plan import Plan, TensorRef
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


def _split_result(result: Any) -> tuple[np.ndarray, float]:
    if isinstance(result, Mapping):
        outputs = result.get("outputs")
        metric = result.get("metric")
        if outputs is None and metric is None:
            raise OptionError("an evaluator's mapping must hold 'outputs' and/or 'metric'")
        if outputs is None:
            outputs = metric
        if metric is None:
            metric = float("nan") if np.size(outputs) != 1 else float(np.asarray(outputs).reshape(-1)[0])
        return np.asarray(outputs), float(metric)
    if isinstance(result, tuple) and len(result) == 2:
        return np.asarray(result[0]), float(result[1])
    arr = np.asarray(result)
    if arr.size == 1:
        return arr, float(arr.reshape(-1)[0])
    return arr, float("nan")


def _nonfinite(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" and not bool(np.isfinite(a).all())


def classify(golden: np.ndarray, golden_metric: float, outputs: np.ndarray, metric: float,
             *, critical: float) -> tuple[int, float | None]:
    """Outcome code and metric delta of one trial (see the module docstring)."""
    if _nonfinite(outputs):
        return DUE, None
    if outputs.shape == golden.shape and np.array_equal(outputs, golden):
        return MASKED, 0.0
    if np.isnan(golden_metric) and np.isnan(metric):
        return SDC, None  # outputs only: no metric to compare
    if not np.isfinite(metric):
        return DUE, None
    delta = float(golden_metric) - float(metric)
    delta = round(delta, 12)
    return (CRITICAL if delta > critical else SDC), delta


# ------------------------------------------------------------------------------ evaluators
def _predict(model: Any, x: Any) -> np.ndarray:
    mod = type(model).__module__
    if mod.startswith("torch"):
        import torch

        with torch.no_grad():
            return model(torch.as_tensor(x)).detach().cpu().numpy()
    if mod.startswith(("keras", "tensorflow", "tf_keras")):
        return np.asarray(model(x, training=False))
    if callable(model):
        return np.asarray(model(x))
    raise OptionError(f"builtin accuracy: cannot run a {type(model).__name__}; give [evaluator] function instead")


def make_evaluator(campaign: Campaign) -> Callable[[Any], Any]:
    """The campaign's evaluator as ``f(model or checkpoint path) -> result``."""
    ev = campaign.evaluator
    paths = [campaign.resolve(p) for p in campaign.paths]
    if ev.function is not None:
        fn = import_object(ev.function, paths)
        if not callable(fn):
            raise OptionError(f"[evaluator] function {ev.function} is not callable")
        return fn
    if ev.builtin == "accuracy":
        assert ev.data is not None
        x, y = import_object(ev.data, paths)()
        y = np.asarray(y)

        def accuracy(model: Any) -> tuple[np.ndarray, float]:
            logits = _predict(model, x)
            return logits, float(np.mean(np.argmax(logits, axis=-1) == y))

        return accuracy
    assert ev.command is not None
    command = ev.command

    def run_command(path: str) -> float:
        proc = subprocess.run(command.replace("{checkpoint}", path), shell=True, capture_output=True, text=True,
                              timeout=ev.timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"command exited {proc.returncode}: {tail[0]}")
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise RuntimeError("command printed no metric")
        return float(lines[-1])

    return run_command


# ------------------------------------------------------------------------------ the runner
class TrialRunner:
    """Everything a worker needs to run trials of one campaign (built once per process)."""

    def __init__(self, campaign: Campaign, cells: Sequence[Cell]) -> None:
        from ..sampling import SiteSpace

        self.campaign = campaign
        self.cells = list(cells)
        self.seed = campaign.seed
        self.critical = campaign.evaluator.critical
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.evaluate = make_evaluator(campaign)
        epochs: list[int | None] = sorted({c.epoch for c in self.cells}, key=lambda e: -1 if e is None else e)
        self.targets: dict[int | None, Any] = {}
        self.golden: dict[int | None, tuple[np.ndarray, float]] = {}
        self._workdir: str | None = None
        self.layouts: dict[int | None, Any] = {}
        self._by_name: dict[int | None, dict[str, Any]] = {}
        self._raw_cells: dict[int, bool] = {}
        self.live: dict[int | None, Any] = {}
        refs_by_epoch = {}
        for e in epochs:
            if campaign.mode == "memory":
                from ..live import targets as live_targets

                if campaign.target.factory is not None:
                    obj = call_factory(campaign)
                    tensors = target_tensors(campaign, e, obj)
                else:
                    tensors = target_tensors(campaign, e)
                    obj = self._read_checkpoint(campaign.checkpoint_path(e), [t.path for t in tensors])
                self.targets[e] = obj
                self.live[e] = live_targets(obj)
                self.golden[e] = _split_result(self.evaluate(obj))
            else:
                from ..layout import read_layout

                tensors = target_tensors(campaign, e)
                self.targets[e] = self._working_copy(campaign.checkpoint_path(e))
                self.layouts[e] = read_layout(self.targets[e])
                self.golden[e] = _split_result(self.evaluate(self.targets[e]))
            refs_by_epoch[e] = {t.path: t.ref() for t in tensors}
        for e, (out, metric) in self.golden.items():
            if _nonfinite(out) or not (np.isnan(metric) or np.isfinite(metric)):
                raise OptionError(f"the fault-free (golden) evaluation gives NaN/Inf outputs (epoch {e}); fix the evaluator")
        self.spaces = []
        for c in self.cells:
            refs = [refs_by_epoch[c.epoch][name] for name in c.tensors]
            self.spaces.append(SiteSpace(refs, bits=c.bits, distribution=campaign.cells.distribution))
        from ..faults import FaultModel

        self.models = [FaultModel.parse(c.fault) for c in self.cells]
        self.flips = [c.flips for c in self.cells]
        from .. import live

        self._live = live

    @staticmethod
    def _read_checkpoint(path: str, names: Sequence[str]) -> dict[str, np.ndarray]:
        from ..layout import open_h5

        with open_h5(path) as f:
            return {n: np.array(f[n][()]) for n in names}

    def _restore(self, path: str, log: Any, epoch: int | None) -> None:
        """Undo one injection in the worker's own copy: the revert of :func:`fastflip.inject.revert`
        without its whole-file hashes and layout walk (the copy is ours; its layout is known)."""
        if log.undo is not None:  # re-encoded chunks: restore their bytes
            log.undo.apply(path)
        else:
            from ..h5target import write_words_to_file

            by_name = self._by_name.get(epoch)
            if by_name is None:
                by_name = self._by_name[epoch] = {t.path: t for t in self.layouts[epoch].tensors}
            write_words_to_file(path, log.plan, by_name, log.old_words)

    def _working_copy(self, path: str) -> str:
        if self._workdir is None:
            self._workdir = make_workdir()
            # removed when the worker process ends normally; the sweep removes it after a kill
            multiprocessing.util.Finalize(self, self.close, exitpriority=10)
        dst = os.path.join(self._workdir, f"{len(os.listdir(self._workdir))}-{os.path.basename(path)}")
        shutil.copyfile(path, dst)
        return dst

    def close(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def plan(self, cell_id: int, trial: int) -> Any:
        """The plan of one trial (regenerated from (seed, cell, trial) alone)."""
        c = self.cells[cell_id]
        return self.spaces[cell_id].plan(seed=self.seed, stream=(cell_id, trial), count=c.flips,
                                         model=self.models[cell_id])

    def _judge(self, result: Any, epoch: int | None) -> tuple[int, float | None, float | None]:
        """(outcome, metric, delta) of an evaluator's result against the golden run."""
        golden, golden_metric = self.golden[epoch]
        if type(result) is float and golden.ndim == 0:  # fast path: a scalar metric
            if result != result or result in (_INF, -_INF):
                return DUE, None, None
            if result == golden_metric:
                return MASKED, result, 0.0
            delta = round(golden_metric - result, 12)
            return (CRITICAL if delta > self.critical else SDC), result, delta
        outputs, metric = _split_result(result)
        outcome, delta = classify(golden, golden_metric, outputs, metric, critical=self.critical)
        return outcome, (metric if np.isfinite(metric) else None), delta

    def run(self, cell_id: int, trial: int) -> TrialRow:
        """Run one trial; exceptions of the evaluator become a DUE outcome."""
        start = time.perf_counter()
        epoch = self.cells[cell_id].epoch
        plan = self.spaces[cell_id].plan(seed=self.seed, stream=(cell_id, trial), count=self.flips[cell_id],
                                         model=self.models[cell_id])
        target = self.targets[epoch]
        message = None
        if self.campaign.mode == "memory":
            live = self._live
            tg = self.live[epoch]
            log = live.inject(tg, plan)
            try:
                outcome, metric, delta = self._judge(self.evaluate(target), epoch)
            except Exception as exc:  # a crashing trial is a DUE, never the end of the campaign
                outcome, metric, delta, message = DUE, None, None, f"{type(exc).__name__}: {exc}"[:_MESSAGE_LIMIT]
            finally:
                live.revert(tg, log)
        else:
            from ..inject import inject_file

            raw = self._raw_cells.get(cell_id)
            if raw is None:
                by_path = {t.path: t for t in self.layouts[epoch].tensors}
                raw = self._raw_cells[cell_id] = all(by_path[n].raw_writable for n in self.cells[cell_id].tensors)
            # raw storage: rewrite the words where they lie; filtered chunks: re-encode through a temporary copy
            res = inject_file(target, in_place=True, atomic=not raw, plan=plan, layout=self.layouts[epoch],
                              log_path=False, hash_files=False)
            try:
                outcome, metric, delta = self._judge(self.evaluate(target), epoch)
            except Exception as exc:
                outcome, metric, delta, message = DUE, None, None, f"{type(exc).__name__}: {exc}"[:_MESSAGE_LIMIT]
            finally:
                self._restore(target, res.log, epoch)
        return TrialRow(cell_id, trial, self.seed, sites_summary(plan), outcome, metric,
                        delta, message, time.perf_counter() - start, self.worker)


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
        if digest is not None:
            from .cells import target_digest

            mine = target_digest(runner.targets[None])
            if mine != digest:
                raise OptionError(
                    f"the target factory {runner.campaign.target.factory} gives other tensors in worker "
                    f"{runner.worker} than in the sweep (unseeded random weights?); results would not be reproducible"
                )
        _RUNNERS[token] = runner
    return runner


def close_runners() -> None:
    """Close this process's runners (removes their working copies)."""
    for runner in _RUNNERS.values():
        runner.close()
    _RUNNERS.clear()


def run_chunk(token: str, campaign_dict: dict[str, Any], cells: Sequence[Cell], cell_id: int,
              trials: Sequence[int]) -> list[TrialRow]:
    """Run trials of one cell in this process (a convenience for harnesses with their own executor)."""
    runner = get_runner(token, campaign_dict, cells)
    return [runner.run(cell_id, int(t)) for t in trials]


def worker_error(exc: BaseException) -> str:
    """One line naming a worker-side failure that is not a trial outcome (bad config, missing module)."""
    if isinstance(exc, FastflipError):
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
