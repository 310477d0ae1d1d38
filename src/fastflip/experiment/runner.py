"""The checkpoint-alteration experiment: golden run, faulty resumed runs, outcomes, curves, plot.

Layer: ``experiment`` (may import campaign and below; imported by report, compat, cli and the demo).

:func:`run_experiment` (and ``fastflip experiment CONFIG``):

1. golden run: build the trainer with the configured seed, evaluate the initial
   model (epoch 0), then train N epochs, saving an HDF5 checkpoint and the
   metrics (loss, validation loss, accuracy) after every epoch;
2. for every scenario and repetition (a distinct, recorded seed each): copy the
   golden checkpoint of epoch E, inject (:func:`fastflip.files.inject.inject_file`,
   log kept; ``.keras`` archives through :func:`fastflip.files.archives.edit_archive`),
   load it, evaluate, and resume training to epoch N with the golden data order;
3. classify each run (:mod:`fastflip.experiment.outcomes`); a run whose loading or
   training raises is recorded as ``crashed`` with its message and the driver goes on;
4. write ``results.csv``, ``curves.csv``, ``accuracy.png`` and ``experiment.json``.

Everything lands in one output directory (layout in ``docs/experiment.md``).
Re-running reuses the golden run (resuming it from its last checkpoint if it was
interrupted) and every finished run whose scenario is unchanged; a run left
unfinished is redone from scratch.

Examples
--------
See ``python -m fastflip.demo`` and ``docs/experiment.md``; a doctest would train a model.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import __version__
from ..campaign.significance import PAIRWISE_FIELDS, format_tests, pairwise_tests
from ..errors import OptionError
from ..files.fileio import atomic_output
from ..files.inject import inject_checkpoint_file
from ..files.archives import is_keras_archive, read_archive
from ..files.layout import read_layout
from ..files.select import Selection, select
from ..frameworks.trainers import make_trainer
from .config import ExperimentConfig, Scenario, load_config
from .outcomes import (
    METRIC_FIELDS,
    RESULT_FIELDS,
    classify_run,
    format_summary,
    plot_accuracy,
    read_csv,
    summarize,
    write_csv,
)

__all__ = ["ExperimentResult", "run_experiment", "inject_checkpoint", "golden_checkpoint", "golden_mid_checkpoint"]

Progress = Callable[[str], None]


@dataclass
class ExperimentResult:
    """What an experiment produced (everything is also on disk under ``out``)."""

    out: Path
    config: ExperimentConfig
    golden: list[dict[str, Any]]
    results: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    timings: dict[str, float] = field(default_factory=dict)
    reused: int = 0
    tests: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        """The per-scenario outcome table as text."""
        return format_summary(self.summary) + ("\n\n" + format_tests(self.tests) if self.tests else "")


def golden_checkpoint(out: Path, epoch: int, suffix: str) -> Path:
    """Path of the golden checkpoint saved after ``epoch`` (0 = initial state)."""
    return Path(out) / "golden" / f"ckpt-e{epoch:03d}{suffix}"


def golden_mid_checkpoint(out: Path, epoch: int, iteration: int, suffix: str) -> Path:
    """Path of the golden checkpoint after ``iteration`` batches of ``epoch`` (made for ``at:`` scenarios)."""
    return Path(out) / "golden" / f"ckpt-e{epoch:03d}-i{iteration:06d}{suffix}"


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp, open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}".strip()


def inject_checkpoint(src: Path, dst: Path, scenario: Scenario, seed: int, log_path: Path) -> Any:
    """Inject ``scenario``'s faults into a copy of checkpoint ``src`` written to ``dst``.

    ``.keras`` archives are altered through their inner ``model.weights.h5``.
    Returns the :class:`fastflip.files.inject.InjectionResult`.
    """
    extra = {"experiment": {"scenario": scenario.name, "epoch": scenario.epoch, "iteration": scenario.iteration,
                            "source": str(src)}}
    # per-run copies are scratch files (rebuilt on re-run): atomic, but not fsync'ed
    return inject_checkpoint_file(src, dst, seed=seed, log_path=log_path, extra_manifest=extra, durable=False,
                                  **scenario.inject_kwargs())


def _check_selection(path: Path, scenario: Scenario) -> None:
    """Raise now (a clear one-line error) if a scenario's selection matches nothing."""
    sel = Selection.from_dict(dict(scenario.selection))
    if is_keras_archive(path):
        with read_archive(path) as inner:
            tensors = read_layout(inner).tensors
    else:
        tensors = read_layout(path).tensors
    try:
        select(tensors, sel)
    except Exception as exc:
        raise type(exc)(f"scenario {scenario.name}: {exc}") from None


class _Driver:
    def __init__(self, cfg: ExperimentConfig, out: Path, trainer: Any, progress: Progress) -> None:
        self.cfg, self.out, self.trainer, self.say = cfg, out, trainer, progress
        self.suffix = trainer.checkpoint_suffix
        self.built = False
        self.timings = {"golden_train_s": 0.0, "golden_checkpoint_s": 0.0, "run_inject_s": 0.0,
                        "run_load_s": 0.0, "run_train_s": 0.0}

    def _build(self) -> None:
        self.trainer.build()
        self.built = True

    def _evaluate(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.trainer.evaluate().items()}

    # ------------------------------------------------------------------ golden
    def golden(self) -> list[dict[str, Any]]:
        gdir = self.out / "golden"
        gdir.mkdir(parents=True, exist_ok=True)
        mpath = gdir / "metrics.csv"
        rows = read_csv(mpath) if mpath.exists() else []
        rows = [r for r in rows if golden_checkpoint(self.out, int(r["epoch"]), self.suffix).exists()]
        rows = [r for i, r in enumerate(rows) if int(r["epoch"]) == i]  # a clean prefix 0..k
        if len(rows) == self.cfg.epochs + 1:
            self.say(f"golden run: reused ({self.cfg.epochs} epochs, final accuracy {rows[-1]['accuracy']:.4f})")
            return rows
        self._build()
        if rows:
            k = int(rows[-1]["epoch"])
            self.trainer.load_checkpoint(golden_checkpoint(self.out, k, self.suffix))
            self.say(f"golden run: resuming after epoch {k}")
        else:
            t = time.perf_counter()
            self.trainer.save_checkpoint(golden_checkpoint(self.out, 0, self.suffix))
            self.timings["golden_checkpoint_s"] += time.perf_counter() - t
            rows = [{"epoch": 0, "phase": "initial", **self._evaluate(), "seconds": 0.0}]
            write_csv(mpath, rows, METRIC_FIELDS)
        for e in range(len(rows), self.cfg.epochs + 1):
            t0 = time.perf_counter()
            m = {k: float(v) for k, v in self.trainer.train_epoch(e).items()}
            m.update(self._evaluate())
            t1 = time.perf_counter()
            self.trainer.save_checkpoint(golden_checkpoint(self.out, e, self.suffix))
            t2 = time.perf_counter()
            self.timings["golden_train_s"] += t1 - t0
            self.timings["golden_checkpoint_s"] += t2 - t1
            rows.append({"epoch": e, "phase": "train", **m, "seconds": t1 - t0})
            write_csv(mpath, rows, METRIC_FIELDS)
            self.say(f"golden epoch {e}/{self.cfg.epochs}: loss {m.get('loss', float('nan')):.4f} "
                     f"accuracy {m.get('accuracy', float('nan')):.4f}")
        return read_csv(mpath)  # the rows as every later reader sees them

    # ------------------------------------------------------------------ mid-epoch golden state
    def golden_mid(self, epoch: int, iteration: int) -> dict[str, Any]:
        """Golden state after ``iteration`` batches of ``epoch``: its checkpoint and metrics (made once).

        Returns ``{"injected": <evaluation there>, "rest": <training metrics of the
        epoch's remaining batches>}``; the checkpoint is :func:`golden_mid_checkpoint`.
        """
        ckpt = golden_mid_checkpoint(self.out, epoch, iteration, self.suffix)
        mpath = ckpt.with_name(ckpt.name[: -len(self.suffix)] + ".json")
        got = _read_json(mpath)
        if got and ckpt.exists() and got.get("golden_digest") == self.cfg.golden_digest():
            return got
        if not self.built:
            self._build()
        self.trainer.load_checkpoint(golden_checkpoint(self.out, epoch - 1, self.suffix))
        per_epoch = getattr(self.trainer, "iterations_per_epoch", None)
        if per_epoch is not None and iteration >= int(per_epoch):
            raise OptionError(f"at: {{epoch: {epoch}, iteration: {iteration}}}: an epoch has only {int(per_epoch)} "
                              f"iterations; choose an iteration from 1 to {int(per_epoch) - 1}")
        self.trainer.train_epoch(epoch, stop=iteration)
        self.trainer.save_checkpoint(ckpt)
        injected = self._evaluate()
        rest = {k: float(v) for k, v in self.trainer.train_epoch(epoch, start=iteration).items()}
        data = {"epoch": epoch, "iteration": iteration, "injected": injected, "rest": rest,
                "golden_digest": self.cfg.golden_digest()}
        _write_json(mpath, data)
        self.say(f"golden state after {iteration} iterations of epoch {epoch}: accuracy {injected['accuracy']:.4f}")
        return data

    def golden_points(self, sc: Scenario, golden: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Golden's metrics at every point of a run of ``sc`` (the run's points line up with these)."""
        g = {int(r["epoch"]): r for r in golden}
        val = ("val_loss", "accuracy")
        if sc.iteration is None:
            pts = [{k: g[sc.epoch].get(k) for k in val}]
        else:
            mid = self.golden_mid(sc.epoch, sc.iteration)
            pts = [{k: mid["injected"].get(k) for k in val},
                   {**{k: g[sc.epoch].get(k) for k in val}, **{k: mid["rest"].get(k) for k in ("loss", "train_accuracy")}}]
        keys = ("loss", "train_accuracy", *val)
        return pts + [{k: g[e].get(k) for k in keys} for e in range(sc.epoch + 1, self.cfg.epochs + 1)]

    # ------------------------------------------------------------------ one faulty run
    def run(self, sc: Scenario, rep: int, golden: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict], bool]:
        seed = self.cfg.run_seed(sc, rep)
        rdir = self.out / "runs" / sc.name / f"{rep:03d}"
        done = _read_json(rdir / "result.json")
        if (done and done.get("scenario_digest") == sc.digest() and done.get("seed") == seed
                and done.get("golden_digest") == self.cfg.golden_digest() and (rdir / "metrics.csv").exists()
                and "epochs_to_recovery" in done.get("row", {})):
            return dict(done["row"]), read_csv(rdir / "metrics.csv"), True
        if rdir.exists():
            shutil.rmtree(rdir)
        gpts = self.golden_points(sc, golden)
        rdir.mkdir(parents=True)
        if not self.built:
            self._build()
        if sc.iteration is None:
            src = golden_checkpoint(self.out, sc.epoch, self.suffix)
        else:
            src = golden_mid_checkpoint(self.out, sc.epoch, sc.iteration, self.suffix)
        altered = rdir / f"injected{self.suffix}"
        g = {int(r["epoch"]): r for r in golden}
        row: dict[str, Any] = {"scenario": sc.name, "rep": rep, "seed": seed, "epoch": sc.epoch,
                               "iteration": sc.iteration, "framework": getattr(self.trainer, "framework", ""),
                               "golden_accuracy": g[self.cfg.epochs]["accuracy"], "flips": 0,
                               "nan_created": 0, "inf_created": 0}
        rows: list[dict[str, Any]] = []
        error = None
        t0 = time.perf_counter()
        try:
            if sc.control:
                shutil.copyfile(src, altered)
            else:
                res = inject_checkpoint(src, altered, sc, seed, rdir / "injection.fflog")
                counts = res.counts
                row.update(flips=int(counts.get("flips", 0)),
                           nan_created=res.nan_count, inf_created=res.inf_count)
        except Exception as exc:  # recorded: a fault model that cannot apply is this run's outcome
            error = "inject: " + _one_line(exc)
        t1 = time.perf_counter()
        self.timings["run_inject_s"] += t1 - t0
        row["inject_seconds"] = t1 - t0
        train_s = 0.0
        if error is None:
            try:
                self.trainer.load_checkpoint(altered)
                t2 = time.perf_counter()
                self.timings["run_load_s"] += t2 - t1
                rows.append({"epoch": sc.epoch, "iteration": sc.iteration, "phase": "injected", **self._evaluate(),
                             "seconds": 0.0})
                if sc.iteration is not None:  # the rest of the epoch the fault landed in
                    ta = time.perf_counter()
                    m = {k: float(v) for k, v in self.trainer.train_epoch(sc.epoch, start=sc.iteration).items()}
                    m.update(self._evaluate())
                    rows.append({"epoch": sc.epoch, "phase": "train", **m, "seconds": time.perf_counter() - ta})
                for e in range(sc.epoch + 1, self.cfg.epochs + 1):
                    ta = time.perf_counter()
                    m = {k: float(v) for k, v in self.trainer.train_epoch(e).items()}
                    m.update(self._evaluate())
                    rows.append({"epoch": e, "phase": "train", **m, "seconds": time.perf_counter() - ta})
                train_s = time.perf_counter() - t2
            except Exception as exc:  # a crash in loading or in a user's trainer: record it, go on
                error = _one_line(exc)
                self.built = False  # the trainer's state is unknown now: rebuild before the next run
        self.timings["run_train_s"] += train_s
        row["train_seconds"] = train_s
        if not self.cfg.keep_checkpoints and altered.exists():
            altered.unlink()
        verdict = classify_run(rows, gpts[: len(rows)], tolerance=self.cfg.tolerance, chance=self._chance(),
                           chance_margin=self.cfg.chance_margin, error=error)
        row["outcome"], row["epochs_to_recovery"] = verdict
        row["error"] = error
        complete = len(rows) == len(gpts)
        if rows:
            last = rows[-1]
            row["final_accuracy"] = last["accuracy"] if complete else None
            row["final_loss"] = last.get("loss") if complete else None
            row["final_val_loss"] = last.get("val_loss") if complete else None
            row["min_accuracy"] = min(r["accuracy"] for r in rows)
            row["post_injection_accuracy"] = rows[0]["accuracy"]
            row["delta"] = None if row["final_accuracy"] is None else row["final_accuracy"] - row["golden_accuracy"]
            row["nonfinite_points"] = sum(1 for r in rows if any(
                r.get(k) is not None and not math.isfinite(float(r[k]))
                for k in ("loss", "train_accuracy", "val_loss", "accuracy")))
        row["matches_golden"] = error is None and complete and _matches_golden(rows, gpts)
        write_csv(rdir / "metrics.csv", rows, METRIC_FIELDS)
        _write_json(rdir / "result.json", {"row": row, "seed": seed, "scenario": sc.name,
                                           "scenario_digest": sc.digest(), "golden_digest": self.cfg.golden_digest()})
        done = _read_json(rdir / "result.json") or {}
        return dict(done["row"]), read_csv(rdir / "metrics.csv"), False

    def _chance(self) -> float | None:
        if self.cfg.chance is not None:
            return self.cfg.chance
        c = getattr(self.trainer, "chance_level", None)
        return float(c) if c is not None else None


def _matches_golden(rows: list[dict[str, Any]], golden: list[Mapping[str, Any]]) -> bool:
    """True when every metric of a run equals golden's at the same point, exactly."""
    if not rows or len(rows) != len(golden):
        return False
    return all(r.get(k) == g.get(k) for r, g in zip(rows, golden) for k in g)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"fastflip": __version__}
    for name in ("numpy", "h5py", "keras", "tensorflow-cpu", "tensorflow", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def run_experiment(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    trainer: Any = None,
    progress: Progress | None = None,
    plot: bool = True,
) -> ExperimentResult:
    """Run (or finish) an experiment and return its results.

    Parameters
    ----------
    config : ExperimentConfig, mapping or path
        The configuration (see :mod:`fastflip.experiment.config`).
    out : path, optional
        Output directory (default: the configuration's ``output``, relative to its file).
    trainer : Trainer, optional
        Use this trainer instead of building one from ``config.trainer``.
    progress : callable, optional
        Called with one line of text per step (``print`` for a console).
    plot : bool
        Write ``accuracy.png`` (needs matplotlib).
    """
    cfg = config if isinstance(config, ExperimentConfig) else load_config(config)
    say = progress or (lambda s: None)
    if out is None:
        if not cfg.output:
            raise OptionError("no output directory: pass out= (or --out) or set 'output' in the configuration")
        out = cfg.output if os.path.isabs(cfg.output) or not cfg.base_dir else os.path.join(cfg.base_dir, cfg.output)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "experiment.json"
    old = _read_json(meta_path)
    if old and old.get("golden_digest") not in (None, cfg.golden_digest()):
        raise OptionError(
            f"{out}: holds an experiment with another golden run (trainer, epochs or seed differ); "
            "use another output directory or delete this one"
        )
    if trainer is None:
        trainer = make_trainer(cfg.trainer, seed=cfg.seed, base_dir=cfg.base_dir)
    seeds = {sc.name: [cfg.run_seed(sc, r) for r in range(sc.repetitions)] for sc in cfg.scenarios}
    meta = {"fastflip_version": __version__, "config": cfg.as_dict(), "golden_digest": cfg.golden_digest(),
            "seed": cfg.seed, "run_seeds": seeds, "versions": _versions(),
            "framework": getattr(trainer, "framework", ""), "checkpoint_suffix": trainer.checkpoint_suffix,
            "status": "running"}
    _write_json(meta_path, meta)
    drv = _Driver(cfg, out, trainer, say)
    t_start = time.perf_counter()
    for sc in cfg.scenarios:
        if sc.iteration is not None and not _takes_range(trainer):
            raise OptionError(f"scenario {sc.name}: injecting at an iteration needs train_epoch(epoch, start, stop) "
                              f"but {type(trainer).__name__}.train_epoch takes no start/stop (docs/experiment.md)")
    golden = drv.golden()
    for sc in cfg.scenarios:
        if not sc.control:
            _check_selection(golden_checkpoint(out, sc.start_epoch, trainer.checkpoint_suffix), sc)
    results: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = [{"scenario": "golden", "rep": None, "seed": cfg.seed, "outcome": None, **r}
                                    for r in golden]
    plotted: list[dict[str, Any]] = []
    reused = 0
    for sc in cfg.scenarios:
        for rep in range(sc.repetitions):
            row, rows, was_reused = drv.run(sc, rep, golden)
            reused += was_reused
            results.append(row)
            curves += [{"scenario": sc.name, "rep": rep, "seed": row["seed"], "outcome": row["outcome"], **r}
                       for r in rows]
            plotted.append({"scenario": sc.name, "outcome": row["outcome"],
                            "curve": {int(r["epoch"]): r["accuracy"] for r in rows}})
            fa = row.get("final_accuracy")
            say(f"{sc.name} rep {rep + 1}/{sc.repetitions}: {row['outcome']}"
                + (f" (final {fa:.4f}, golden {row['golden_accuracy']:.4f})" if isinstance(fa, float) else "")
                + (" [reused]" if was_reused else "") + (f" - {row['error']}" if row.get("error") else ""))
    write_csv(out / "results.csv", results, RESULT_FIELDS)
    write_csv(out / "curves.csv", curves, ("scenario", "rep", "seed", "outcome", *METRIC_FIELDS))
    summary = summarize(results, failure=cfg.failure)
    tests = scenario_tests(summary, cfg)
    write_csv(out / "summary.csv", summary, list(summary[0]) if summary else ["scenario"])
    write_csv(out / "tests.csv", tests, PAIRWISE_FIELDS)
    if plot:
        gacc = {int(r["epoch"]): float(r["accuracy"]) for r in golden}
        plot_accuracy(out / "accuracy.png", gacc, plotted, cfg.scenarios,
                      title=f"{cfg.name}: accuracy after injection vs golden ({meta['framework']})")
    timings = dict(drv.timings, total_s=time.perf_counter() - t_start)
    meta.update(status="complete", timings=timings, summary=summary, tests=tests, reused_runs=reused)
    _write_json(meta_path, meta)
    return ExperimentResult(out, cfg, golden, results, summary, timings, reused, tests)


def _takes_range(trainer: Any) -> bool:
    try:
        params = inspect.signature(trainer.train_epoch).parameters
    except (TypeError, ValueError):
        return False
    return "start" in params and "stop" in params


def scenario_tests(summary: list[dict[str, Any]], cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Fisher's exact test of the failure rate between scenarios, Holm-corrected over the family.

    The pairs are the configuration's ``compare`` list, else every pair of
    non-control scenarios. A requested scenario without runs raises one clear line.
    """
    control = {sc.name for sc in cfg.scenarios if sc.control}
    wanted = cfg.compare
    groups = {s["scenario"]: (int(s["failures"]), int(s["runs"])) for s in summary
              if wanted is not None or s["scenario"] not in control}
    for sc in cfg.scenarios:  # a scenario named in compare but without any run: (0, 0), refused below
        groups.setdefault(sc.name, (0, 0)) if wanted is not None else None
    return pairwise_tests(groups, wanted, what="scenario")
