"""The report's figures as matplotlib :class:`~matplotlib.figure.Figure` objects.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

Every function takes the aggregated data (:class:`~fastflip.report.campaign_data.CampaignData`
or :class:`~fastflip.report.experiment_data.ExperimentData`) or the path of a store /
experiment directory, and returns a new figure built without :mod:`matplotlib.pyplot`
(no global state, no display; a notebook shows the returned figure). matplotlib is
imported inside the functions, so importing this module costs nothing.

* :func:`bit_figure` — rate of each outcome per bit position with Wilson intervals;
* :func:`heatmap_figure` — bit × group (layer, tensor or role) heatmap of a rate;
* :func:`outcome_figure` — outcome breakdown per cell (stacked fractions);
* :func:`curve_figure` — accuracy (or loss) per epoch of every run against golden,
  one panel per scenario, injection epoch marked.

Examples
--------
>>> _panel_grid(5)
(2, 3)
>>> short_labels(["bits=31|layer=a|flips=1", "bits=30|layer=a|flips=1"])
['bits=31', 'bits=30']
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..campaign.store import TRIAL_OUTCOMES
from ..errors import OptionError
from ..experiment.outcomes import RUN_OUTCOMES
from ..files.fileio import atomic_output
from .bitclass import BIT_CLASSES, class_spans, condition_fields, drop_values
from .campaign_data import (RATE_KINDS, CampaignData, bit_table, cell_table, group_table, heatmap_table,
                            load_campaign_data)
from .experiment_data import (
    ExperimentData,
    curve_table,
    load_experiment_data,
    summary_table,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["bit_figure", "heatmap_figure", "failure_label", "target_half_width", "drop_figure", "group_figure", "outcome_figure", "curve_figure", "run_outcome_figure", "save_png", "short_labels",
           "OUTCOME_COLOURS", "MAX_CELL_BARS"]

OUTCOME_COLOURS = {"masked": "#4daf4a", "sdc": "#ff7f00", "critical": "#e41a1c", "due": "#6a3d9a"}
OUTCOME_LABELS = {"masked": "masked", "sdc": "SDC", "critical": "critical SDC", "due": "DUE"}
RUN_COLOURS = {"masked": "tab:green", "recovered": "tab:blue", "degraded": "tab:orange", "diverged": "tab:red",
               "crashed": "tab:gray"}
#: The outcome figure draws at most this many cells (those with the highest failure rate).
MAX_CELL_BARS = 80
#: The drop figure draws at most this many trials per bit class as dots (the box plots use them all).
MAX_DROP_DOTS = 3000


def _figure(width: float, height: float) -> "Figure":
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = max(1, min(max_cols, n))
    return (max(1, n) + cols - 1) // cols, cols


def _campaign(data: "CampaignData | str | os.PathLike[str]") -> CampaignData:
    return data if isinstance(data, CampaignData) else load_campaign_data(data)


def _experiment(data: "ExperimentData | str | os.PathLike[str]") -> ExperimentData:
    return data if isinstance(data, ExperimentData) else load_experiment_data(data, hash_inputs=False)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def short_labels(keys: Sequence[str]) -> list[str]:
    """Cell keys without the ``|``-separated parts every key shares."""
    parts = [k.split("|") for k in keys]
    if len(parts) < 2:
        return list(keys)
    common = set(parts[0]).intersection(*parts[1:])
    out = ["|".join(p for p in ps if p not in common) or k for ps, k in zip(parts, keys)]
    return out


def save_png(fig: "Figure", path: str | os.PathLike[str], dpi: int = 100) -> str:
    """Write ``fig`` as a PNG atomically (Agg canvas, no display); return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    p = os.fspath(path)
    with atomic_output(p, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    return p


def bit_figure(data: "CampaignData | str | os.PathLike[str]") -> "Figure":
    """Rate of each outcome per bit position, with Wilson intervals; one panel per condition."""
    data = _campaign(data)
    rows = bit_table(data)
    fields = condition_fields(data)
    conds = [c for c in data.conditions if any(r["condition"] == c for r in rows)] or ["(no single-bit trials)"]
    nbits = max((r["bit"] for r in rows), default=31) + 1
    fig = _figure(min(18.0, max(7.0, 0.28 * nbits + 2.5)), 3.6 * len(conds))
    axes = fig.subplots(len(conds), 1, squeeze=False)[:, 0]
    for ax, cond in zip(axes, conds):
        mine = [r for r in rows if r["condition"] == cond]
        if not mine:
            ax.text(0.5, 0.5, "no trial has a single bit position", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        x = np.array([r["bit"] for r in mine])
        full = np.arange(nbits)
        for o in TRIAL_OUTCOMES:
            y = np.array([r[f"{o}_rate"] for r in mine])
            lo = np.array([r[f"{o}_low"] for r in mine])
            hi = np.array([r[f"{o}_high"] for r in mine])
            line = np.full(nbits, np.nan)  # gaps where a bit has no trial: no line drawn across them
            line[x] = y
            alpha = 0.45 if o == "masked" else 0.95
            ax.plot(full, line, "-", lw=1, color=OUTCOME_COLOURS[o], alpha=alpha)
            ax.errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], fmt="o", ms=3.5, capsize=2,
                        elinewidth=1, color=OUTCOME_COLOURS[o], label=OUTCOME_LABELS[o], alpha=alpha)
        ax.set_xlim(-0.7, nbits - 0.3)
        ax.set_xticks(range(0, nbits, 1 if nbits <= 32 else 2 if nbits <= 64 else 8))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.set_xlabel("bit position (0 = least significant)")
        ax.set_ylabel("rate (95% Wilson interval)" if abs(data.confidence - 0.95) < 1e-9
                      else f"rate ({data.confidence:g} Wilson interval)")
        n = sum(r["trials"] for r in mine)
        ax.set_title(f"{data.name}: outcome rate by bit position — {cond}, {n:,} trials", fontsize=10, pad=14)
        if fields.get(cond) is not None:
            _draw_classes(ax, fields[cond], list(range(nbits)), heat=False)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    return fig


def failure_label(data: CampaignData) -> str:
    """``failure rate (sdc + critical + due)``: the failure classes the campaign counts."""
    fail = getattr(data, "failure", None) or ("sdc", "critical", "due")
    return f"failure rate ({' + '.join(OUTCOME_LABELS.get(f, f) for f in fail)})"


def target_half_width(data: CampaignData) -> float | None:
    """The precision the campaign aimed at: ``[trials] half_width`` or ``margin`` (None with ``per_cell``)."""
    tr = data.config.get("trials") or {}
    for k in ("half_width", "margin"):
        if tr.get(k) is not None:
            return float(tr[k])
    return None


def _draw_classes(ax: Any, fields: Any, positions: Sequence[int], *, heat: bool) -> None:
    """Sign / exponent / mantissa boundaries and labels on a bit axis (bit positions or heatmap columns)."""
    pos = list(positions)
    if not pos:
        return
    for name, lo, hi in class_spans(fields):
        inside = [i for i, b in enumerate(pos) if lo <= b <= hi] if heat else [b for b in pos if lo <= b <= hi]
        if not inside:
            continue
        x0, x1 = min(inside) - 0.5, max(inside) + 0.5
        if lo > 0 and (heat and min(inside) > 0 or not heat):
            ax.axvline(x0, color="#1f78b4", lw=1.6, ls="-" if heat else "--", alpha=0.9, zorder=4)
        ax.text((x0 + x1) / 2, 1.01, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=7, color="#1f78b4")


def heatmap_figure(data: "CampaignData | str | os.PathLike[str]", kind: str = "failure") -> "Figure":
    """Bit × group heatmap of a rate (default the failure rate as the campaign defines it, DUE included).

    One panel per condition. Each square prints its rate and trial count; squares
    whose Wilson half-width (of that rate) is wider than the campaign's target
    (``[trials] half_width`` or ``margin``) are hatched; grey squares have no trials.
    Sign / exponent / mantissa boundaries are drawn where the store records the
    cells' dtypes. ``kind`` is one of :data:`fastflip.report.campaign_data.RATE_KINDS`.
    """
    if kind not in RATE_KINDS:
        raise OptionError(f"heatmap kind must be one of {', '.join(RATE_KINDS)}, got {kind!r}")

    data = _campaign(data)
    rows = heatmap_table(data)
    fields = condition_fields(data)
    target = target_half_width(data)
    conds = [c for c in data.conditions if any(r["condition"] == c for r in rows)] or ["(no single-bit trials)"]
    groups: list[str] = []
    for r in rows:
        if r["group"] not in groups:
            groups.append(r["group"])
    bits = sorted({r["bit"] for r in rows})
    height = min(40.0, max(3.0, 0.34 * len(groups) + 2.0))
    fig = _figure(min(20.0, max(6.5, 0.42 * len(bits) + 0.12 * max((len(g) for g in groups), default=4) + 2.5)),
                  height * len(conds))
    axes = fig.subplots(len(conds), 1, squeeze=False)[:, 0]
    label = failure_label(data) if kind == "failure" else {"sdc_total": "SDC rate (SDC + critical SDC)"}.get(
        kind, f"{OUTCOME_LABELS.get(kind, kind)} rate")
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    cmap = colormaps["magma_r"].with_extremes(bad="#d9d9d9")
    for ax, cond in zip(axes, conds):
        grid = np.full((len(groups), len(bits)), np.nan)
        trials = np.zeros((len(groups), len(bits)), dtype=np.int64)
        wide = np.zeros((len(groups), len(bits)), dtype=bool)
        for r in rows:
            if r["condition"] == cond:
                i, j = groups.index(r["group"]), bits.index(r["bit"])
                grid[i, j] = r[f"{kind}_rate"]
                trials[i, j] = r["trials"]
                wide[i, j] = target is not None and (r[f"{kind}_high"] - r[f"{kind}_low"]) / 2 > target + 1e-12
        if not bits:
            ax.text(0.5, 0.5, "no trial has a single bit position", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=0.0, vmax=1.0,
                       interpolation="nearest")
        ax.set_xticks(range(len(bits)), [str(b) for b in bits], fontsize=7)
        ax.set_yticks(range(len(groups)), groups, fontsize=7)
        ax.set_xlabel("bit position (0 = least significant)")
        ax.set_ylabel(data.group_by if data.group_by != "none" else "")
        notes = []
        if target is not None:
            notes.append(f"hatched: interval wider than ±{target:g}")
        if fields.get(cond) is None:
            notes.append("bit classes unknown (dtype not recorded or mixed)")
        ax.set_title(f"{data.name}: {label} — {cond}" + ("\n" + "; ".join(notes) if notes else ""), fontsize=9,
                     pad=14)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                v = grid[i, j]
                if math.isnan(v):
                    continue
                if wide[i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="////", lw=0,
                                           edgecolor="#808080" if v <= 0.55 else "#bfbfbf", zorder=3))
                if grid.size <= 900:
                    txt = (f"{v:.2f}"[1:] if 0 < v < 1 else f"{v:.0f}") + f"\n{trials[i, j]}"
                    ax.text(j, i, txt, ha="center", va="center", fontsize=5.5, linespacing=0.9,
                            color="white" if v > 0.55 else "black", zorder=5)
        if fields.get(cond) is not None:
            _draw_classes(ax, fields[cond], bits, heat=True)
        fig.colorbar(im, ax=ax, label="rate" if kind != "failure" else "failure rate", shrink=0.9)
    return fig


def outcome_figure(data: "CampaignData | str | os.PathLike[str]", max_cells: int = MAX_CELL_BARS) -> "Figure":
    """Outcome breakdown per cell: stacked fractions of masked / SDC / critical SDC / DUE.

    With more than ``max_cells`` cells, the ``max_cells`` with the highest failure rate
    are drawn (the title says so; ``cells.csv`` holds them all).
    """
    data = _campaign(data)
    rows = [r for r in cell_table(data) if r["trials"] > 0]
    total = len(rows)
    if total > max_cells:
        rows = sorted(rows, key=lambda r: (-r["failure_rate"], r["cell_id"]))[:max_cells]
        rows.sort(key=lambda r: r["cell_id"])
    labels = short_labels([r["key"] for r in rows])
    fig = _figure(9.5, min(60.0, max(2.6, 0.24 * len(rows) + 1.6)))
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for o in TRIAL_OUTCOMES:
        w = np.array([r[f"{o}_rate"] for r in rows])
        ax.barh(y, w, left=left, color=OUTCOME_COLOURS[o], label=OUTCOME_LABELS[o], height=0.8)
        left += w
    for yi, r in zip(y, rows):
        ax.text(1.01, yi, f"n={r['trials']:,}", va="center", fontsize=6.5, transform=ax.get_yaxis_transform())
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("fraction of trials")
    shown = f"{len(rows)} of {total} cells (highest failure rate)" if total > len(rows) else f"{total} cells"
    ax.set_title(f"{data.name}: outcome per cell — {shown}", fontsize=10)
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.02 + 0.5 / max(len(rows), 1)),
              frameon=False)
    return fig


def curve_figure(data: "ExperimentData | str | os.PathLike[str]", metric: str = "accuracy") -> "Figure":
    """``metric`` (accuracy, val_loss or loss) per epoch of every run against golden.

    One panel per scenario; runs are coloured by outcome, the injection epoch is a
    dotted line. Loss panels use a log scale; a non-finite loss is drawn as a cross
    on the top edge.
    """
    from matplotlib.ticker import MaxNLocator

    data = _experiment(data)
    pts = curve_table(data)
    scen = data.scenarios
    nrows, ncols = _panel_grid(len(scen))
    fig = _figure(4.3 * ncols, 3.3 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=metric == "accuracy")
    gold = [(p["epoch"], p[metric]) for p in pts if p["scenario"] == "golden" and _finite(p[metric])]
    is_loss = metric != "accuracy"
    for ax, sc in zip(axes.flat, scen):
        if gold:
            ax.plot(*zip(*gold), color="black", lw=3, alpha=0.45, label="golden", zorder=1)
        reps: dict[Any, list[dict[str, Any]]] = {}
        for p in pts:
            if p["scenario"] == sc["name"]:
                reps.setdefault(p["rep"], []).append(p)
        seen: set[str] = set()
        for rep, rp in reps.items():
            rp.sort(key=lambda p: p["epoch"])
            outcome = str(rp[0]["outcome"])
            colour = RUN_COLOURS.get(outcome, "tab:purple")
            good = [(p["epoch"], p[metric]) for p in rp if _finite(p[metric])]
            lab = outcome if outcome not in seen else None
            seen.add(outcome)
            if good:
                ax.plot(*zip(*good), "o-", ms=2.5, color=colour, alpha=0.75, lw=1.2, label=lab, zorder=2)
                lab = None
            bad = [p["epoch"] for p in rp if p[metric] is not None and not _finite(p[metric])]
            if bad:  # NaN / Inf: a cross on the top edge
                ax.plot(bad, [1.0] * len(bad), "x", color=colour, ms=6, mew=1.5, transform=ax.get_xaxis_transform(),
                        clip_on=False, label=lab, zorder=3)
        ax.axvline(sc["epoch"], color="gray", ls=":", lw=1.2)
        ax.text(sc["epoch"], 0.02, " injection", color="gray", fontsize=7, transform=ax.get_xaxis_transform())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{sc['name']} (E={sc['epoch']}, {len(reps)} run{'s' if len(reps) != 1 else ''})", fontsize=9)
        ax.set_xlabel("epoch")
        if is_loss:
            finite = [p[metric] for p in pts if _finite(p[metric]) and p[metric] > 0]
            if finite and max(finite) / min(finite) > 50:
                ax.set_yscale("log")
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[:, 0]:
        ax.set_ylabel(metric.replace("_", " "))
    for ax in list(axes.flat)[len(scen):]:
        ax.set_axis_off()
    fig.suptitle(f"{data.name}: {metric.replace('_', ' ')} per epoch vs golden", fontsize=10)
    return fig


def run_outcome_figure(data: "ExperimentData | str | os.PathLike[str]") -> "Figure":
    """Rate of each run outcome and of failure per scenario, with 95% Wilson intervals."""
    data = _experiment(data)
    rows = summary_table(data)
    kinds = [*RUN_OUTCOMES, "failure"]
    fig = _figure(max(6.5, 1.4 * len(rows) + 3.0), 3.6)
    ax = fig.subplots()
    width = 0.8 / len(kinds)
    for j, k in enumerate(kinds):
        x = np.arange(len(rows)) - 0.4 + width * (j + 0.5)
        y = np.array([r[f"{k}_rate"] for r in rows])
        lo = np.array([r[f"{k}_low"] for r in rows])
        hi = np.array([r[f"{k}_high"] for r in rows])
        colour = "black" if k == "failure" else RUN_COLOURS[k]
        ax.bar(x, y, width * 0.9, color=colour, alpha=0.35 if k != "failure" else 0.6, label=k)
        ax.errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], fmt="none", ecolor=colour,
                    elinewidth=1.2, capsize=2)
    ax.set_xticks(range(len(rows)), [f"{r['scenario']}\n(n={r['runs']})" for r in rows], fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of runs (95% Wilson interval)")
    fail = rows[0]["failure_classes"].replace("+", " + ") if rows else ""
    ax.set_title(f"{data.name}: outcomes per scenario (failure = {fail})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    return fig


def drop_figure(data: "CampaignData | str | os.PathLike[str]") -> "Figure":
    """Distribution of the metric drop (golden − faulty) of single-bit trials by bit class, per condition.

    Box plots (median, quartiles, 5–95% whiskers) over every trial, with up to
    :data:`MAX_DROP_DOTS` of them per class drawn as dots (a random sample beyond); the
    label under each box gives the trials and the share that dropped at all. Trials
    whose metric was NaN/Inf are counted on the label, not drawn. Needs the dtypes the
    store records (older stores get a panel that says so).
    """
    data = _campaign(data)
    values = drop_values(data)
    conds = [c for c in data.conditions if any(k[0] == c for k in values)]
    fig = _figure(7.5, 3.4 * max(1, len(conds)))
    axes = fig.subplots(max(1, len(conds)), 1, squeeze=False)[:, 0]
    if not conds:
        axes[0].text(0.5, 0.5, "no single-bit trial with a recorded metric and known bit classes\n"
                     "(the store records dtypes from this fastflip on)", ha="center", va="center",
                     transform=axes[0].transAxes)
        axes[0].set_axis_off()
        return fig
    rng = np.random.default_rng(0)  # jitter only
    colours = {"sign": "#1b9e77", "exponent": "#d95f02", "mantissa": "#7570b3"}
    for ax, cond in zip(axes, conds):
        classes = [c for c in BIT_CLASSES[::-1] if (cond, c) in values]  # mantissa, exponent, sign
        finite = []
        labels = []
        for cls in classes:
            arr = np.asarray(values[(cond, cls)], dtype=np.float64)
            fin = arr[np.isfinite(arr)]
            finite.append(fin)
            share = float((fin > 0).sum() / arr.size) if arr.size else 0.0
            labels.append(f"{cls}\n{arr.size:,} trials, {share:.1%} dropped"
                          + (f"\n{arr.size - fin.size} non-finite" if arr.size > fin.size else ""))
        pos = np.arange(len(classes))
        ax.boxplot([f if f.size else np.array([np.nan]) for f in finite], positions=pos, widths=0.5, whis=(5, 95),
                   showfliers=False, medianprops={"color": "black"})
        for x, cls, fin in zip(pos, classes, finite):
            dots = fin if fin.size <= MAX_DROP_DOTS else fin[rng.integers(0, fin.size, MAX_DROP_DOTS)]
            ax.scatter(x + rng.uniform(-0.18, 0.18, dots.size), dots, s=6, alpha=0.35, color=colours[cls], lw=0,
                       zorder=3)
        ax.set_xticks(pos, labels, fontsize=8)
        ax.axhline(0, color="gray", lw=0.8)
        allv = np.concatenate(finite) if finite else np.array([])
        if allv.size and np.nanmax(np.abs(allv)) > 0:
            ax.set_yscale("symlog", linthresh=max(1e-3, float(np.nanmax(np.abs(allv))) * 1e-3))
        ax.set_ylabel("metric drop (golden − faulty)")
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"{data.name}: metric drop by bit class — {cond}", fontsize=10)
    return fig


def group_figure(data: "CampaignData | str | os.PathLike[str]") -> "Figure":
    """Per-layer (tensor, role: the campaign's ``group_by``) vulnerability with intervals, one row per condition.

    Left: the failure rate of one flip in the group (expected failures per flip there)
    with its interval; right: the group's contribution (its share of the sites × that
    rate: expected failures per flip anywhere that land in it), the share printed
    beside each bar. Rows of :func:`~fastflip.report.campaign_data.group_table`.
    """
    data = _campaign(data)
    rows = group_table(data)
    conds = [c for c in data.conditions if any(r["condition"] == c for r in rows)]
    groups: list[str] = []
    for r in rows:
        if str(r["group"]) not in groups:
            groups.append(str(r["group"]))
    fig = _figure(10.0, max(2.4, 0.32 * len(groups) + 1.6) * max(1, len(conds)))
    if not conds:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "the campaign has no grouping (group_by = none): no per-layer view", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    axes = fig.subplots(len(conds), 2, squeeze=False, sharey="row")
    for (ax_r, ax_c), cond in zip(axes, conds):
        mine = {str(r["group"]): r for r in rows if r["condition"] == cond}
        names = [g for g in groups if g in mine]
        y = np.arange(len(names))[::-1]
        for ax, key, colour in ((ax_r, "rate", "#e41a1c"), (ax_c, "contribution", "#377eb8")):
            v = np.array([mine[g][key] for g in names], dtype=float)
            lo = np.array([mine[g]["low" if key == "rate" else "contribution_low"] for g in names], dtype=float)
            hi = np.array([mine[g]["high" if key == "rate" else "contribution_high"] for g in names], dtype=float)
            ax.barh(y, np.nan_to_num(v), color=colour, alpha=0.55, height=0.7)
            ax.errorbar(np.nan_to_num(v), y, xerr=[np.nan_to_num(np.maximum(v - lo, 0)),
                                                   np.nan_to_num(np.maximum(hi - v, 0))],
                        fmt="none", ecolor="black", elinewidth=1, capsize=2)
            ax.grid(axis="x", alpha=0.3)
            top = float(np.nanmax(hi)) * 1.15 if len(hi) and np.isfinite(np.nanmax(hi)) else 1.0
            ax.set_xlim(0, min(1.02, max(1e-6, top)))
        for yi, g in zip(y, names):
            r = mine[g]
            ax_c.text(1.01, yi, f"share {r['share']:.1%}, n={r['trials']:,}", va="center", fontsize=6.5,
                      transform=ax_c.get_yaxis_transform())
        ax_r.set_yticks(y, names, fontsize=7)
        ax_r.set_xlabel("failure rate of a flip in it (95% interval)")
        ax_c.set_xlabel("contribution: share of sites × rate")
        ax_r.set_title(f"{data.name}: vulnerability per {data.group_by} — {cond}", fontsize=9, loc="left")
    return fig
