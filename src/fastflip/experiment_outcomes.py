"""Outcomes of faulty runs, the per-epoch metric files, the results table and the accuracy plot.

Outcome classes (checked in this order):

``crashed``
    loading the altered checkpoint, training or evaluating raised; the message is kept.
``diverged``
    a loss became NaN/Inf after the injection, or the final accuracy is at chance
    level (``<= chance + chance_margin``).
``degraded``
    the final accuracy is more than ``tolerance`` below the golden run's.
``recovered``
    the final accuracy is within ``tolerance`` of golden, but at some epoch from the
    injection on (the evaluation right after injecting included) it was more than
    ``tolerance`` below golden's accuracy at that epoch.
``masked``
    within ``tolerance`` of golden at every epoch from the injection on.

Examples
--------
>>> golden = {0: 0.1, 1: 0.8, 2: 0.9, 3: 0.95}
>>> classify(golden, {2: 0.9, 3: 0.95}, {3: 0.1}, tolerance=0.02)
'masked'
>>> classify(golden, {2: 0.2, 3: 0.94}, {3: 0.1}, tolerance=0.02)
'recovered'
>>> classify(golden, {2: 0.2, 3: 0.5}, {3: 0.1}, tolerance=0.02)
'degraded'
>>> classify(golden, {2: 0.9, 3: 0.9}, {3: float("nan")}, tolerance=0.02)
'diverged'
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .fileio import atomic_output

__all__ = ["OUTCOMES", "classify", "write_csv", "read_csv", "summarize", "format_summary", "plot_accuracy",
           "METRIC_FIELDS", "RESULT_FIELDS"]

OUTCOMES = ("masked", "recovered", "degraded", "diverged", "crashed")
METRIC_FIELDS = ("epoch", "phase", "loss", "val_loss", "accuracy", "seconds")
RESULT_FIELDS = ("scenario", "rep", "seed", "epoch", "framework", "outcome", "final_accuracy", "golden_accuracy",
                 "delta", "min_accuracy", "post_injection_accuracy", "matches_golden", "flips", "nan_created",
                 "inf_created", "inject_seconds", "train_seconds", "error")


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def classify(
    golden_accuracy: Mapping[int, float],
    run_accuracy: Mapping[int, float],
    run_losses: Mapping[int, float],
    *,
    tolerance: float,
    chance: float | None = None,
    chance_margin: float = 0.05,
    error: str | None = None,
) -> str:
    """Classify one run from its per-epoch accuracies and losses against golden's (see module docs)."""
    if error:
        return "crashed"
    if any(not _finite(v) for v in run_losses.values()) or any(not _finite(v) for v in run_accuracy.values()):
        return "diverged"
    last = max(run_accuracy)
    final = float(run_accuracy[last])
    if chance is not None and final <= chance + chance_margin:
        return "diverged"
    if final < float(golden_accuracy[last]) - tolerance:
        return "degraded"
    dropped = any(float(acc) < float(golden_accuracy[e]) - tolerance for e, acc in run_accuracy.items())
    return "recovered" if dropped else "masked"


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


def summarize(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario: runs, outcome counts, mean and minimum final accuracy."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        by.setdefault(str(r["scenario"]), []).append(r)
    out = []
    for name, rows in by.items():
        counts = Counter(str(r["outcome"]) for r in rows)
        finals = [float(r["final_accuracy"]) for r in rows if _finite(r.get("final_accuracy"))]
        out.append({
            "scenario": name, "epoch": rows[0].get("epoch"), "runs": len(rows), **{o: counts.get(o, 0) for o in OUTCOMES},
            "mean_final_accuracy": sum(finals) / len(finals) if finals else float("nan"),
            "min_final_accuracy": min(finals) if finals else float("nan"),
            "golden_accuracy": rows[0].get("golden_accuracy"),
        })
    return out


def format_summary(summary: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`summarize`'s rows.

    >>> print(format_summary([{"scenario": "a", "epoch": 2, "runs": 1, "masked": 1, "recovered": 0,
    ...     "degraded": 0, "diverged": 0, "crashed": 0, "mean_final_accuracy": 0.9, "min_final_accuracy": 0.9,
    ...     "golden_accuracy": 0.91}]))
    scenario  E  runs  masked  recovered  degraded  diverged  crashed  mean acc  min acc  golden
    a         2     1       1          0         0         0        0    0.9000   0.9000  0.9100
    """
    head = ["scenario", "E", "runs", *OUTCOMES, "mean acc", "min acc", "golden"]
    body = []
    for s in summary:
        body.append([str(s["scenario"]), str(s["epoch"]), str(s["runs"]), *(str(s[o]) for o in OUTCOMES),
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
