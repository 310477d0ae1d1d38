"""Outcomes of faulty runs, the per-epoch metric files, the results table and the accuracy plot.

Layer: ``experiment`` (may import campaign and below; imported by report, compat, cli and the demo).

The run classes are the experiment rows of fastflip's one outcome vocabulary
(:data:`fastflip.campaign.outcomes.RUN_OUTCOMES`, ``docs/outcomes.md``).

A run is a sequence of *points*: the evaluation right after the injection
(phase ``injected``), then one point per epoch trained after it (phase ``train``).
Each point carries the training loss and accuracy of that epoch (``loss``,
``train_accuracy``; none at the ``injected`` point) and the validation ones
(``val_loss``, ``accuracy``), and is compared with the golden run's point at the
same place. A point is *beyond tolerance* when

* any recorded loss or accuracy is NaN/Inf (a transient one included), or
* the validation accuracy, or the training accuracy where both runs record it, is
  more than ``tolerance`` below golden's at that point (higher counts as within).

Outcome classes (checked in this order):

``crashed``
    injecting, loading the altered checkpoint, training or evaluating raised.
``diverged``
    the run *ends* non-finite (a loss or accuracy of its last point is NaN/Inf) or at
    chance level (final accuracy ``<= chance + chance_margin``).
``degraded``
    it ends finite and above chance, but beyond tolerance.
``recovered``
    it ends within tolerance after being beyond it at some point;
    ``epochs_to_recovery`` counts the epochs trained after the injection until it was
    back within tolerance for good.
``masked``
    never beyond tolerance (``epochs_to_recovery`` is 0).

Examples
--------
>>> g = [{"accuracy": 0.9}, {"loss": 0.3, "accuracy": 0.95}]       # golden at E and E+1
>>> classify_run([{"accuracy": 0.9}, {"loss": 0.3, "accuracy": 0.95}], g, tolerance=0.02)
Verdict(outcome='masked', epochs_to_recovery=0)
>>> classify_run([{"val_loss": float("nan"), "accuracy": 0.1}, {"loss": 0.3, "accuracy": 0.95}], g, tolerance=0.02)
Verdict(outcome='recovered', epochs_to_recovery=1)
>>> classify_run([{"accuracy": 0.9}, {"loss": 0.3, "accuracy": 0.5}], g, tolerance=0.02).outcome
'degraded'
>>> classify_run([{"accuracy": 0.9}, {"loss": float("nan"), "accuracy": 0.95}], g, tolerance=0.02).outcome
'diverged'
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ..campaign.outcomes import RUN_DEFAULT_FAILURE, RUN_OUTCOMES
from ..campaign.stats import wilson_interval
from ..errors import OptionError
from ..files.fileio import atomic_output

__all__ = ["RUN_OUTCOMES", "Verdict", "classify_run", "beyond_tolerance", "write_csv", "read_csv", "summarize",
           "format_summary", "plot_accuracy", "METRIC_FIELDS", "RESULT_FIELDS", "DEFAULT_FAILURE",
           "check_failure"]

METRIC_FIELDS = ("epoch", "iteration", "phase", "loss", "train_accuracy", "val_loss", "accuracy", "seconds")
RESULT_FIELDS = ("scenario", "rep", "seed", "epoch", "iteration", "framework", "outcome", "epochs_to_recovery",
                 "final_accuracy", "golden_accuracy", "delta", "min_accuracy", "post_injection_accuracy",
                 "final_loss", "final_val_loss", "nonfinite_points", "matches_golden", "flips", "nan_created",
                 "inf_created", "inject_seconds", "train_seconds", "error")

_LOSSES = ("loss", "val_loss")
_ACCURACIES = ("accuracy", "train_accuracy")


class Verdict(NamedTuple):
    """The outcome of one run and the epochs it took to come back within tolerance (None if it did not)."""

    outcome: str
    epochs_to_recovery: int | None


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _recorded(point: Mapping[str, Any], key: str) -> bool:
    return point.get(key) is not None and point.get(key) != ""


def _nonfinite(point: Mapping[str, Any]) -> bool:
    return any(_recorded(point, k) and not _finite(point[k]) for k in (*_LOSSES, *_ACCURACIES))


def beyond_tolerance(point: Mapping[str, Any], golden: Mapping[str, Any], tolerance: float) -> bool:
    """True when a run's point is beyond tolerance of golden's (see the module docs).

    >>> beyond_tolerance({"loss": float("inf"), "accuracy": 0.9}, {"loss": 0.2, "accuracy": 0.9}, 0.02)
    True
    >>> beyond_tolerance({"accuracy": 0.89}, {"accuracy": 0.9}, 0.02)
    False
    """
    if _nonfinite(point):
        return True
    for k in _ACCURACIES:
        if _recorded(point, k) and _finite(golden.get(k)) and float(point[k]) < float(golden[k]) - tolerance:
            return True
    return False


def classify_run(
    run: Sequence[Mapping[str, Any]],
    golden: Sequence[Mapping[str, Any]],
    *,
    tolerance: float,
    chance: float | None = None,
    chance_margin: float = 0.05,
    error: str | None = None,
) -> Verdict:
    """Classify one run from its points and golden's at the same places (see the module docs).

    ``run[i]`` and ``golden[i]`` are metric mappings (``loss``, ``train_accuracy``,
    ``val_loss``, ``accuracy``); ``run[0]`` is the evaluation right after injecting.
    """
    if error or not run:
        return Verdict("crashed", None)
    if len(golden) != len(run):
        raise OptionError(f"classify_run: {len(run)} run points but {len(golden)} golden points")
    out = [beyond_tolerance(p, g, tolerance) for p, g in zip(run, golden)]
    last = run[-1]
    if _nonfinite(last) or not _recorded(last, "accuracy"):
        return Verdict("diverged", None)
    if chance is not None and float(last["accuracy"]) <= chance + chance_margin:
        return Verdict("diverged", None)
    if out[-1]:
        return Verdict("degraded", None)
    if not any(out):
        return Verdict("masked", 0)
    back = max(i for i, o in enumerate(out) if o) + 1  # the first point of the final stretch within tolerance
    return Verdict("recovered", back)


def write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]], fields: Sequence[str]) -> None:
    """Write rows atomically (missing keys left empty; floats in full precision)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(p) as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else (repr(r[k]) if isinstance(r[k], float) else r[k]))
                        for k in fields})


def _parse(v: str) -> Any:
    if v == "":
        return None
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    if v in ("True", "False"):
        return v == "True"
    return v


def read_csv(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a CSV written by :func:`write_csv` (numbers parsed back, exactly)."""
    with open(path, newline="") as fh:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(fh)]


#: Outcome classes counted as failure unless an experiment's ``failure`` says otherwise.
DEFAULT_FAILURE = RUN_DEFAULT_FAILURE  # fastflip.campaign.outcomes holds every class name and default


def check_failure(failure: Iterable[str] | None) -> tuple[str, ...]:
    """Validate a ``failure`` list of outcome classes (default :data:`DEFAULT_FAILURE`).

    >>> check_failure(["diverged", "degraded"])
    ('degraded', 'diverged')
    >>> check_failure(["sdc"])
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: failure: unknown outcome class 'sdc'; experiment outcomes are masked, recovered, degraded, diverged, crashed
    """
    if failure is None:
        return DEFAULT_FAILURE
    if isinstance(failure, str) or not isinstance(failure, Iterable):
        raise OptionError(f"failure: expected a list of outcome classes such as [degraded, diverged], got {failure!r}")
    got = [str(f) for f in failure]
    for f in got:
        if f not in RUN_OUTCOMES:
            raise OptionError(f"failure: unknown outcome class {f!r}; experiment outcomes are {', '.join(RUN_OUTCOMES)}")
    if not got:
        raise OptionError("failure: give at least one outcome class")
    return tuple(o for o in RUN_OUTCOMES if o in got)


def summarize(
    results: Iterable[Mapping[str, Any]],
    *,
    failure: Iterable[str] | None = None,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """One row per scenario: runs, each outcome's count, rate and Wilson interval, failures, accuracies.

    Columns: ``scenario, epoch, iteration, runs``, per outcome ``o, o_rate, o_low, o_high``,
    ``failures, failure_rate, failure_low, failure_high`` (failure = the classes of
    ``failure``, default :data:`DEFAULT_FAILURE`), ``mean_epochs_to_recovery`` (of
    recovered runs), ``mean_final_accuracy, min_final_accuracy, golden_accuracy``.

    >>> rows = summarize([{"scenario": "a", "epoch": 2, "outcome": "masked", "final_accuracy": 0.9},
    ...                   {"scenario": "a", "epoch": 2, "outcome": "diverged", "final_accuracy": 0.1}])
    >>> rows[0]["failures"], rows[0]["failure_rate"], round(rows[0]["failure_low"], 4)
    (1, 0.5, 0.0945)
    """
    fail = check_failure(failure)
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        by.setdefault(str(r["scenario"]), []).append(r)
    out = []
    for name, rows in by.items():
        counts = Counter(str(r["outcome"]) for r in rows)
        finals = [float(r["final_accuracy"]) for r in rows if _finite(r.get("final_accuracy"))]
        rec = [float(r["epochs_to_recovery"]) for r in rows
               if r.get("outcome") == "recovered" and _finite(r.get("epochs_to_recovery"))]
        n = len(rows)
        row: dict[str, Any] = {"scenario": name, "epoch": rows[0].get("epoch"), "iteration": rows[0].get("iteration"),
                               "runs": n}
        for o, k in [*((o, counts.get(o, 0)) for o in RUN_OUTCOMES), ("failure", sum(counts.get(o, 0) for o in fail))]:
            lo, hi = wilson_interval(k, n, confidence)
            row["failures" if o == "failure" else o] = k
            row.update({f"{o}_rate": k / n, f"{o}_low": float(lo), f"{o}_high": float(hi)})
        row.update(
            failure_classes="+".join(fail),
            mean_epochs_to_recovery=sum(rec) / len(rec) if rec else None,
            mean_final_accuracy=sum(finals) / len(finals) if finals else float("nan"),
            min_final_accuracy=min(finals) if finals else float("nan"),
            golden_accuracy=rows[0].get("golden_accuracy"),
        )
        out.append(row)
    return out


def format_summary(summary: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`summarize`'s rows (failure rate with its Wilson interval).

    >>> print(format_summary(summarize([{"scenario": "a", "epoch": 2, "outcome": "masked",
    ...     "final_accuracy": 0.9, "golden_accuracy": 0.91}])))
    scenario  E  runs  masked  recovered  degraded  diverged  crashed    failure [95% CI]  mean acc  min acc  golden
    a         2     1       1          0         0         0        0  0.0% [0.0%, 79.3%]    0.9000   0.9000  0.9100
    """
    head = ["scenario", "E", "runs", *RUN_OUTCOMES, "failure [95% CI]", "mean acc", "min acc", "golden"]
    body = []
    for s in summary:
        e = str(s["epoch"]) + (f".{s['iteration']}" if s.get("iteration") not in (None, "") else "")
        body.append([str(s["scenario"]), e, str(s["runs"]), *(str(s[o]) for o in RUN_OUTCOMES),
                     f"{s['failure_rate']:.1%} [{s['failure_low']:.1%}, {s['failure_high']:.1%}]",
                     f"{float(s['mean_final_accuracy']):.4f}", f"{float(s['min_final_accuracy']):.4f}",
                     f"{float(s['golden_accuracy']):.4f}" if _finite(s.get("golden_accuracy")) else "-"])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = []
    for r in [head, *body]:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


_COLOURS = {"masked": "tab:green", "recovered": "tab:blue", "degraded": "tab:orange", "diverged": "tab:red",
            "crashed": "tab:gray"}


def plot_accuracy(
    path: str | os.PathLike,
    golden: Mapping[int, float],
    runs: Sequence[Mapping[str, Any]],
    scenarios: Sequence[Any],
    title: str = "",
) -> None:
    """Accuracy curves of every run against golden, one panel per scenario, coloured by outcome.

    ``runs`` items hold ``scenario``, ``outcome`` and ``curve`` (epoch → accuracy).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = max(1, len(scenarios))
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    from matplotlib.ticker import MaxNLocator

    ge = sorted(golden)
    for ax, sc in zip(axes.flat, scenarios):
        ax.plot(ge, [golden[e] for e in ge], color="black", lw=3, alpha=0.45, label="golden", zorder=1)
        mine = [r for r in runs if r["scenario"] == sc.name]
        seen = set()
        for r in mine:
            curve = r.get("curve") or {}
            if not curve:
                continue
            es = sorted(curve)
            xs = [sc.epoch, *es] if es[0] != sc.epoch else es
            ys = [float(golden[sc.epoch]), *[curve[e] for e in es]] if es[0] != sc.epoch else [curve[e] for e in es]
            ys = [y if _finite(y) else 0.0 for y in ys]
            label = r["outcome"] if r["outcome"] not in seen else None
            seen.add(r["outcome"])
            ax.plot(xs, ys, color=_COLOURS.get(r["outcome"], "tab:purple"), alpha=0.75, lw=1.2, label=label, zorder=2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axvline(sc.epoch, color="gray", ls=":", lw=1)
        ax.set_title(f"{sc.name} (E={sc.epoch})", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = Path(path)
    with atomic_output(p, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)

