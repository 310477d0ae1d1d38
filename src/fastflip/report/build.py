"""Writing a report directory: figures (PNG), tables (CSV) and ``index.html``.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

:func:`write_report` takes a results store (an SQLite file written by
``fastflip sweep``) or an experiment directory (written by ``fastflip experiment``),
tells which it is from its content, and writes into ``out``:

* campaign: ``bits.png`` / ``bits.csv`` (outcome rates per bit position),
  ``heatmap.png`` / ``heatmap.csv`` (bit × group), ``outcomes.png`` / ``cells.csv``
  (per cell), ``margin.csv`` (the statistical margin reached), ``campaign.json``;
* experiment: ``accuracy.png``, ``loss.png``, ``summary.csv`` (per scenario),
  ``runs.csv`` (per run), ``curves.csv`` (every plotted point), ``experiment.json``;
* ``index.html`` linking them by relative paths, readable without JavaScript.

Each file is written atomically. ``out`` may exist if it is empty or holds an earlier
report (a ``.fastflip-report`` marker); anything else needs ``force=True``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import __version__
from ..campaign.significance import PAIRWISE_FIELDS
from ..campaign.store import TRIAL_OUTCOMES
from ..errors import InputFileError, OutputError
from ..experiment.outcomes import RESULT_FIELDS, write_csv
from ..files.fileio import atomic_output
from ..files.paths import resolve_output
from . import html as H
from .bitclass import DROP_FIELDS, bit_class, condition_fields, drop_table
from .campaign_data import (
    CampaignData,
    bit_table,
    cell_table,
    group_table,
    heatmap_table,
    load_campaign_data,
    margin_table,
)
from .experiment_data import (
    EXPERIMENT_OUTCOMES,
    ExperimentData,
    curve_table,
    failure_classes,
    is_experiment_dir,
    load_experiment_data,
    summary_table,
    tests_table,
)
from .figures import (
    bit_figure,
    curve_figure,
    drop_figure,
    failure_label,
    group_figure,
    heatmap_figure,
    outcome_figure,
    run_outcome_figure,
    save_png,
    target_half_width,
)

__all__ = ["Report", "write_report", "detect_source", "MARKER"]

MARKER = ".fastflip-report"
_SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class Report:
    """What :func:`write_report` wrote: the kind of source, the page, and every file beside it."""

    kind: str
    source: str
    out: str
    index: str
    figures: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    seconds: float = 0.0


def detect_source(path: str | os.PathLike[str]) -> str:
    """``'campaign'`` for a results store, ``'experiment'`` for an experiment directory.

    Anything else raises :class:`~fastflip.errors.InputFileError` naming what was expected.
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputFileError(f"{p}: no such file or directory; give a results store or an experiment directory")
    if os.path.isdir(p):
        if is_experiment_dir(p):
            return "experiment"
        raise InputFileError(f"{p}: a directory without experiment.json; give a results store or an experiment directory")
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise InputFileError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    if head == _SQLITE_MAGIC or len(head) == 0:
        return "campaign"  # an empty file is refused by the store with its own message
    raise InputFileError(f"{p}: neither a fastflip results store (SQLite) nor an experiment directory")


FILES = {"campaign": ("bits.png", "bits.csv", "heatmap.png", "heatmap.csv", "outcomes.png", "cells.csv", "margin.csv",
                      "drops.png", "drops.csv", "groups.png", "groups.csv", "campaign.json"),
         "experiment": ("accuracy.png", "outcome_rates.png", "loss.png", "summary.csv", "tests.csv", "runs.csv",
                        "curves.csv", "experiment.json")}


def _check_files(src: str, out: str, kind: str) -> None:
    """Every file the report may write in ``out``, checked before any is written
    (:func:`fastflip.files.paths.resolve_output`): never the store (or a file of the experiment folder) being
    read, whatever its name (a store called ``cells.csv``), never a directory, device, FIFO or socket."""
    if not os.path.isdir(out):
        return  # a new folder holds nothing to overwrite
    ins = [src, *([os.path.join(src, n) for n in os.listdir(src)] if os.path.isdir(src) else [])]
    for name in (*FILES[kind], "index.html", MARKER):
        resolve_output(os.path.join(out, name), inputs=ins, what="report file",
                       hint=f"it is the {kind} being read; choose another report directory")


def _prepare_out(out: str, force: bool) -> None:
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write the report to {out}: its parent directory {parent} does not exist")
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"cannot write the report to {out}: it is a file, not a directory")
    if os.path.isdir(out):
        entries = os.listdir(out)
        if entries and MARKER not in entries and not force:
            raise OutputError(f"{out} is not empty and holds no earlier fastflip report; pass --force (force=True) to write there")
    else:
        try:
            os.mkdir(out)
        except OSError as exc:
            raise OutputError(f"cannot create {out}: {exc.strerror or exc}") from exc
    if not os.access(out, os.W_OK):
        raise OutputError(f"cannot write the report to {out}: not writable")


def _write_text(path: str, text: str) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def _fields(rows: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in rows:
        for k in r:
            if k not in out:
                out.append(k)
    return out


def _save(fig: Any, out: str, name: str, rep: Report) -> None:
    try:
        save_png(fig, os.path.join(out, name))
    finally:
        fig.clear()
    rep.figures.append(name)


def _csv(rows: Sequence[dict[str, Any]], out: str, name: str, rep: Report, fields: Sequence[str] | None = None) -> None:
    write_csv(os.path.join(out, name), rows, list(fields) if fields is not None else _fields(rows))
    rep.tables.append(name)


def _when(ts: float | None) -> str:
    if not ts:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _hashes(h: dict[str, str]) -> Any:
    if not h:
        return "none (the target is in memory)"
    return H.Markup("<br>".join(f"{H.esc(k)}: <code>{H.esc(v)}</code>" for k, v in sorted(h.items())))


_PCT = "{:.2%}"
_RATE = "{:.4f}"


#: Report column names that differ from ``fastflip export``'s, renamed so both read the same.
_EXPORT_NAMES = {"key": "cell", "grp": "group"}


def _export_names(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``fastflip export``'s column names and a numeric ``bit`` (None unless one plain position)."""
    out = []
    for r in rows:
        d: dict[str, Any] = {}
        for k, v in r.items():
            d[_EXPORT_NAMES.get(k, k)] = v
            if k == "bits" and "bit" not in r:
                d["bit"] = int(v) if str(v or "").isdigit() else None
        out.append(d)
    return out


def _with_classes(rows: Sequence[dict[str, Any]], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows with ``bit_class`` (sign / exponent / mantissa; empty where the dtype is unknown) after ``bit``."""
    out = []
    for r in rows:
        d: dict[str, Any] = {}
        for k, v in r.items():
            d[k] = v
            if k == "bit":
                f = fields.get(r.get("condition"))
                d["bit_class"] = bit_class(int(v), f) if v is not None else None
        out.append(d)
    return out


def _campaign_report(data: CampaignData, out: str, rep: Report) -> str:
    fields = condition_fields(data)
    bits, heat, cells, margin = bit_table(data), heatmap_table(data), cell_table(data), margin_table(data)
    drops = drop_table(data)
    groups = group_table(data)
    _csv(_with_classes(bits, fields), out, "bits.csv", rep)
    _csv(_with_classes(heat, fields), out, "heatmap.csv", rep)
    _csv(_with_classes(_export_names(cells), fields), out, "cells.csv", rep)
    _csv(margin, out, "margin.csv", rep)
    _csv(drops, out, "drops.csv", rep, fields=DROP_FIELDS)
    if groups:
        _csv(groups, out, "groups.csv", rep)
    with atomic_output(os.path.join(out, "campaign.json")) as tmp, open(tmp, "w") as fh:
        json.dump({"name": data.name, "seed": data.seed, "config": data.config, "config_hash": data.config_hash,
                   "fastflip_version": data.fastflip_version, "input_hashes": data.input_hashes,
                   "shard": data.shard}, fh, indent=2, sort_keys=True, default=str)
    rep.tables.append("campaign.json")
    _save(bit_figure(data), out, "bits.png", rep)
    _save(heatmap_figure(data), out, "heatmap.png", rep)
    _save(outcome_figure(data), out, "outcomes.png", rep)
    _save(drop_figure(data), out, "drops.png", rep)
    if groups:
        _save(group_figure(data), out, "groups.png", rep)
    hw_target = target_half_width(data)
    flabel = failure_label(data)

    totals = data.totals()
    n = data.n_trials
    trials_cfg = data.config.get("trials") or {}
    target = (f"half-width {trials_cfg['half_width']}" if trials_cfg.get("half_width") is not None
              else f"margin {trials_cfg['margin']}" if trials_cfg.get("margin") is not None
              else f"{trials_cfg.get('per_cell')} trials per cell" if trials_cfg.get("per_cell") is not None else "–")
    worst = max((m["max_half_width"] for m in margin), default=float("nan"))
    wanted = trials_cfg.get("half_width") if trials_cfg.get("half_width") is not None else trials_cfg.get("margin")
    reached = ""
    if wanted is not None:
        hws = [(c["failure_high"] - c["failure_low"]) / 2 for c in cells if c["trials"] > 0]
        ok = sum(1 for h in hws if h <= float(wanted) + 1e-12)
        reached = f"; {ok} of {len(cells)} cells within the target ±{float(wanted):g}"
    header = H.key_values([
        ("campaign", data.name),
        ("results store", os.path.abspath(data.path)),
        ("seed", data.seed),
        ("written by", f"fastflip {data.fastflip_version}" + (f" (shard {data.shard})" if data.shard else "")),
        ("report by", f"fastflip {__version__}, {_when(time.time())}"),
        ("created", _when(data.created)),
        ("configuration hash", H.Markup(f"<code>{H.esc(data.config_hash)}</code>")),
        ("input hashes (SHA-256)", _hashes(data.input_hashes)),
        ("cells", f"{len(data.cells)} ({', '.join(data.conditions)}; grouped by {data.group_by})"),
        ("trials", f"{n:,} stored of {data.n_planned:,} planned"),
        ("outcomes", ", ".join(f"{o} {totals[o]:,} ({totals[o] / n:.2%})" for o in TRIAL_OUTCOMES)),
        ("trials rule", target),
        ("margin reached", f"largest per-cell Wilson half-width of the failure rate ±{worst:.4f} "
                           f"at {data.confidence:.0%} confidence{reached}"),
    ])
    margin_html = H.table(margin, [
        ("condition", "condition", None), ("cells", "cells", None), ("trials", "trials", "{:,}"),
        ("planned", "planned", "{:,}"), ("max_half_width", "max cell half-width", _RATE),
        ("median_half_width", "median cell half-width", _RATE), ("failure_rate", "failure rate (stratified)", _PCT),
        ("failure_low", "low", _PCT), ("failure_high", "high", _PCT), ("failure_half_width", "± half-width", _RATE),
    ])
    bit_cols: list[H.Column] = [("condition", "condition", None), ("bit", "bit", None), ("trials", "trials", "{:,}")]
    for o in TRIAL_OUTCOMES:
        bit_cols += [(f"{o}_rate", f"{o}", _PCT), (f"{o}_low", "low", _PCT), (f"{o}_high", "high", _PCT)]
    sections: list[tuple[str | None, str]] = [
        (None, header),
        ("Statistical margin", margin_html + '<p class="muted">Failure = SDC + critical SDC + DUE. Data: '
         '<a href="margin.csv">margin.csv</a></p>'),
        ("Vulnerability by bit position", H.figure(
            "bits.png", "outcome rate per bit position",
            "Rate of each outcome per bit position with Wilson intervals (bit 0 = least significant). "
            "Trials that flip several sites or bits count in their cell only.", ["bits.csv"])
         + H.table(bits, bit_cols)),
        ("Bit × " + data.group_by, H.figure(
            "heatmap.png", "failure rate heatmap",
            f"{flabel[0].upper() + flabel[1:]} per {data.group_by} and bit position; each square prints its rate and "
            "its number of trials; "
            + (f"hatched squares have a Wilson interval wider than the target ±{hw_target:g}; " if hw_target else "")
            + "blue lines: sign / exponent / mantissa boundaries (where the store records dtypes); grey: no trials.",
            ["heatmap.csv"])),
        *([(f"Vulnerability per {data.group_by}", H.figure(
            "groups.png", f"vulnerability per {data.group_by}",
            f"Left: the {flabel} of one flip in each {data.group_by} (expected failures per flip there) with its "
            f"{data.confidence:.0%} interval; right: its contribution, the {data.group_by}'s share of the sites × "
            "that rate (expected failures per flip anywhere that land in it; they add up to the condition's "
            "stratified rate).", ["groups.csv"])
           + H.table(groups, [("condition", "condition", None), ("group", data.group_by, None),
                              ("sites", "sites", "{:,}"), ("share", "share", _PCT), ("trials", "trials", "{:,}"),
                              ("failures", "failures", "{:,}"), ("rate", "rate", _PCT), ("low", "low", _PCT),
                              ("high", "high", _PCT), ("relative", "× overall", "{:.2f}"),
                              ("contribution", "contribution", _PCT), ("contribution_low", "low", _PCT),
                              ("contribution_high", "high", _PCT)]))] if groups else []),
        ("Metric drop by bit class", H.figure(
            "drops.png", "metric drop by bit class",
            "Distribution of the metric drop (golden − faulty) of single-bit trials per bit class; trials without a "
            "metric (DUE) are not drawn.", ["drops.csv"])
         + (H.table(drops, [("condition", "condition", None), ("bit_class", "bit class", None),
                            ("trials", "trials", "{:,}"), ("with_drop_rate", "dropped", _PCT),
                            ("mean_drop", "mean drop", _RATE), ("median_drop", "median", _RATE),
                            ("p90_drop", "90th pct", _RATE), ("max_drop", "max", _RATE),
                            ("nonfinite", "non-finite", None)]) if drops else "")),
        ("Outcomes per cell", H.figure(
            "outcomes.png", "outcome breakdown per cell",
            "Fractions of masked / SDC / critical SDC / DUE trials per cell.", ["cells.csv"])),
        ("Configuration", f'<details><summary>campaign configuration (<a href="campaign.json">campaign.json</a>)'
         f"</summary><pre>{H.esc(json.dumps(data.config, indent=2, sort_keys=True, default=str))}</pre></details>"),
    ]
    return H.page(f"fastflip campaign report: {data.name}", sections,
                  subtitle=f"{n:,} trials in {len(data.cells)} cells; rates with {data.confidence:.0%} Wilson intervals")


def _experiment_report(data: ExperimentData, out: str, rep: Report) -> str:
    summary, curves, tests = summary_table(data), curve_table(data), tests_table(data)
    fail = failure_classes(data)
    _csv(summary, out, "summary.csv", rep)
    _csv(tests, out, "tests.csv", rep, fields=[*PAIRWISE_FIELDS, "a_low", "a_high", "b_low", "b_high"])
    _csv(data.results, out, "runs.csv", rep, fields=RESULT_FIELDS)
    _csv(curves, out, "curves.csv", rep)
    with atomic_output(os.path.join(out, "experiment.json")) as tmp, open(tmp, "w") as fh:
        json.dump(dict(data.meta, input_hashes=data.input_hashes), fh, indent=2, sort_keys=True, default=str)
    rep.tables.append("experiment.json")
    _save(curve_figure(data, "accuracy"), out, "accuracy.png", rep)
    _save(run_outcome_figure(data), out, "outcome_rates.png", rep)
    has_val = any(isinstance(p["val_loss"], float) for p in curves)
    loss_metric = "val_loss" if has_val else "loss"
    _save(curve_figure(data, loss_metric), out, "loss.png", rep)
    meta = data.meta
    cfg = meta.get("config") or {}
    counts = {o: sum(1 for r in data.results if r.get("outcome") == o) for o in EXPERIMENT_OUTCOMES}
    header = H.key_values([
        ("experiment", data.name),
        ("directory", os.path.abspath(data.path)),
        ("seed", data.seed),
        ("written by", f"fastflip {data.fastflip_version} ({meta.get('framework') or '?'}; status {meta.get('status')})"),
        ("report by", f"fastflip {__version__}, {_when(time.time())}"),
        ("golden run", f"{len(data.golden) - 1} epochs, final accuracy "
                       f"{H.fmt(data.golden[-1].get('accuracy') if data.golden else None, '{:.4f}')}; "
                       f"digest {meta.get('golden_digest', '–')}"),
        ("input hashes (SHA-256)", _hashes(data.input_hashes)),
        ("runs", f"{len(data.results)} in {len(data.scenarios)} scenarios (tolerance {cfg.get('tolerance', '–')})"),
        ("outcomes", ", ".join(f"{o} {counts[o]}" for o in EXPERIMENT_OUTCOMES)),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted((meta.get("versions") or {}).items()))),
    ])
    sum_cols: list[H.Column] = [("scenario", "scenario", None), ("epoch", "E", None), ("runs", "runs", None)]
    sum_cols += [(o, o, None) for o in EXPERIMENT_OUTCOMES]
    sum_cols += [("failures", "failures", None), ("failure_rate", "failure rate", _PCT),
                 ("failure_low", "low", _PCT), ("failure_high", "high", _PCT),
                 ("mean_epochs_to_recovery", "epochs to recovery (mean)", "{:.2f}"),
                 ("mean_final_accuracy", "mean final acc", "{:.4f}"), ("min_final_accuracy", "min final acc", "{:.4f}"),
                 ("golden_accuracy", "golden", "{:.4f}")]
    test_cols: list[H.Column] = [("a", "scenario A", None), ("a_failures", "failures A", None),
                                 ("a_trials", "runs A", None), ("a_rate", "rate A", _PCT), ("b", "scenario B", None),
                                 ("b_failures", "failures B", None), ("b_trials", "runs B", None),
                                 ("b_rate", "rate B", _PCT), ("p_value", "Fisher p", "{:.4g}"),
                                 ("p_holm", "Holm p", "{:.4g}"), ("significant", "significant", None)]
    run_cols: list[H.Column] = [("scenario", "scenario", None), ("rep", "rep", None), ("seed", "seed", None),
                                ("epoch", "E", None), ("iteration", "iteration", None), ("flips", "flips", None),
                                ("outcome", "outcome", None), ("epochs_to_recovery", "epochs to recovery", None),
                                ("post_injection_accuracy", "acc after injection", "{:.4f}"),
                                ("min_accuracy", "min acc", "{:.4f}"), ("final_accuracy", "final acc", "{:.4f}"),
                                ("delta", "Δ vs golden", "{:+.4f}"), ("error", "error", None)]
    sections: list[tuple[str | None, str]] = [
        (None, header),
        ("Outcomes per scenario", H.table(summary, sum_cols) + H.figure(
            "outcome_rates.png", "outcome rates per scenario with Wilson intervals",
            f"Rate of each outcome per scenario with {0.95:.0%} Wilson intervals; failure = {' + '.join(fail)}.",
            ["summary.csv"])),
        ("Tests between scenarios", (H.table(tests, test_cols) if tests else "<p>No pair of scenarios to test.</p>")
         + '<p class="muted">Fisher\'s exact test (two-sided) of failure vs not, p-values Holm-corrected over the '
           'family; * significant at 0.05. Data: <a href="tests.csv">tests.csv</a></p>'),
        ("Accuracy per epoch", H.figure(
            "accuracy.png", "accuracy per epoch against golden",
            "Accuracy of every run (coloured by outcome) against the golden run; dotted line: injection epoch.",
            ["curves.csv"])),
        ("Loss per epoch", H.figure(
            "loss.png", f"{loss_metric} per epoch against golden",
            f"{loss_metric.replace('_', ' ')} of every run against the golden run; crosses on the top edge: NaN/Inf.",
            ["curves.csv"])),
        ("Runs", H.table(data.results, run_cols) + '<p class="muted">Data: <a href="runs.csv">runs.csv</a></p>'),
        ("Configuration", f'<details><summary>experiment configuration (<a href="experiment.json">experiment.json</a>)'
         f"</summary><pre>{H.esc(json.dumps(cfg, indent=2, sort_keys=True, default=str))}</pre></details>"),
    ]
    return H.page(f"fastflip experiment report: {data.name}", sections,
                  subtitle=f"{len(data.results)} faulty runs against one golden run")


def write_report(source: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False) -> Report:
    """Write the report of a results store or an experiment directory into ``out``.

    Parameters
    ----------
    source : path
        A results store (``fastflip sweep``) or an experiment directory (``fastflip experiment``).
    out : path
        The report directory (created; its parent must exist).
    force : bool
        Write into a non-empty directory that holds no earlier report.

    Returns
    -------
    Report
        The kind of source and the files written (relative to ``out``).
    """
    t0 = time.perf_counter()
    src, dst = os.fspath(source), os.fspath(out)
    kind = detect_source(src)
    if os.path.realpath(dst) == os.path.realpath(src):
        raise OutputError(f"cannot write the report into {dst}: it is the {kind} itself; choose another directory")
    _check_files(src, dst, kind)
    data: Any = load_campaign_data(src) if kind == "campaign" else load_experiment_data(src)
    _prepare_out(dst, force)
    rep = Report(kind, src, dst, os.path.join(dst, "index.html"))
    page = _campaign_report(data, dst, rep) if kind == "campaign" else _experiment_report(data, dst, rep)
    _write_text(rep.index, page)
    marker = os.path.join(dst, MARKER)
    if not os.path.exists(marker):
        _write_text(marker, f"written by fastflip {__version__} report\n")
    rep.seconds = time.perf_counter() - t0
    return rep

