"""fastflip report: a small real campaign and a small real experiment, their figures, tables and page.

The numbers in the CSV tables are checked against counts made here, in Python, from the
raw trial rows of the store (and from the experiment's own CSV files); the page is
rendered in headless Chromium (Debian's ``chromium``; ``make report-deps``) to check that
every image loads.
"""

from __future__ import annotations

import csv
import html.parser
import json
import math
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from conftest import require
from fastflip.campaign import Campaign
from fastflip.campaign.sweep import sweep
from fastflip.cli import main as cli_main
from fastflip.errors import InputFileError, OptionError, OutputError, StoreError
from fastflip.experiment.runner import run_experiment
from fastflip.experiment.outcomes import read_csv
from fastflip.report import (
    bit_figure,
    curve_figure,
    heatmap_figure,
    load_campaign_data,
    outcome_figure,
    write_report,
)
from fastflip.campaign.stats import wilson_half_width, wilson_interval
from fastflip.campaign.store import TRIAL_OUTCOMES, ResultStore

TESTS = Path(__file__).parent
TOY = str(TESTS / "toy_trainer.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- fixtures
def _campaign() -> Campaign:
    return Campaign.from_dict({
        "name": "report-test", "seed": 7, "target": {"factory": "campaign_helpers:weights"}, "paths": [str(TESTS)],
        "cells": {"bits": ["31", "30", "exponent", "0-3"], "group_by": "layer", "flips": [1, 2]},
        "trials": {"per_cell": 30},
        "evaluator": {"function": "campaign_helpers:evaluate", "critical": 0.05},
    })


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("campaign") / "results.db")
    res = sweep(_campaign(), path, workers=0, progress=False)
    assert res.complete and res.stored == 16 * 30
    return path


@pytest.fixture(scope="module")
def campaign_report(store, tmp_path_factory):
    require("matplotlib")  # the report's figures
    out = tmp_path_factory.mktemp("crep") / "report"
    return write_report(store, out)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    require("sklearn")  # the toy trainer's data
    out = tmp_path_factory.mktemp("exp") / "run"
    cfg = {
        "name": "toy-report", "epochs": 3, "seed": 3, "repetitions": 2, "tolerance": 0.02,
        "trainer": {"framework": "custom", "model_file": TOY},
        "scenarios": [
            {"name": "exp-msb", "epoch": 1, "bits": "exponent-msb", "count": 10, "selection": {"include": ["model/*"]}},
            {"name": "low-mant", "epoch": 2, "bits": "0-3", "count": 10, "selection": {"include": ["model/*"]}},
            {"name": "control", "epoch": 1, "control": True, "repetitions": 1},
        ],
    }
    run_experiment(cfg, out, plot=False)
    return out


@pytest.fixture(scope="module")
def experiment_report(experiment, tmp_path_factory):
    return write_report(experiment, tmp_path_factory.mktemp("erep") / "report")


# ---------------------------------------------------------------------------- helpers
def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _check_png(path: Path) -> None:
    assert path.is_file(), path
    w, h = _png_size(path)
    assert 300 <= w <= 4000 and 150 <= h <= 8000, (path.name, w, h)
    assert path.stat().st_size > 5_000, path.name
    import matplotlib.image

    img = matplotlib.image.imread(str(path))  # decodes the whole file: a truncated PNG raises
    assert img.shape[:2] == (h, w)
    assert float(img[..., :3].std()) > 0.02, f"{path.name} looks blank"


class _Refs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
        for k, v in attrs:
            if k in ("src", "href") and v is not None:
                self.refs.append((tag, v))


def _page_refs(index: Path) -> _Refs:
    p = _Refs()
    p.feed(index.read_text(encoding="utf-8"))
    return p


def _check_page(out: Path) -> set[str]:
    refs = _page_refs(out / "index.html")
    assert refs.scripts == 0  # readable without JavaScript
    names = set()
    for tag, ref in refs.refs:
        assert "://" not in ref and not ref.startswith("/"), f"non-relative link {ref}"
        assert (out / ref).is_file(), f"index.html references missing {ref}"
        names.add(ref)
    imgs = {ref for tag, ref in refs.refs if tag == "img"}
    on_disk = {p.name for p in out.iterdir() if p.suffix in (".png", ".csv")}
    assert {n for n in on_disk if n.endswith(".png")} == imgs  # every figure is shown
    assert on_disk <= names  # every table is linked
    return imgs


def _bit_of(bits: str, sites: str | None) -> int | None:
    """The test's own reading of a trial's bit position (see fastflip.report.campaign_data)."""
    if bits.isdigit():
        return int(bits)
    if sites is None:
        return None
    m = re.fullmatch(r"[^;]*\^b(\d+)", sites)
    return int(m.group(1)) if m else None


def _raw_counts(store: str):
    """Per (condition, bit), (condition, group, bit) and cell: outcome counts from every raw trial row."""
    con = sqlite3.connect(store)
    rows = con.execute(
        "SELECT t.cell_id, c.bits, c.grp, c.flips, c.fault, t.sites, t.outcome FROM trials t JOIN cells c USING (cell_id)"
    ).fetchall()
    con.close()
    by_bit, by_group, by_cell = defaultdict(Counter), defaultdict(Counter), defaultdict(Counter)
    for cell_id, bits, grp, flips, fault, sites, outcome in rows:
        cond = f"fault {fault}, {flips} flip{'s' if flips != 1 else ''}/trial"
        by_cell[cell_id][TRIAL_OUTCOMES[outcome]] += 1
        b = _bit_of(bits, sites)
        if b is not None:
            by_bit[(cond, b)][TRIAL_OUTCOMES[outcome]] += 1
            by_group[(cond, grp, b)][TRIAL_OUTCOMES[outcome]] += 1
    return by_bit, by_group, by_cell, len(rows)


def _check_rates(row: dict[str, str], counts: Counter) -> None:
    n = sum(counts.values())
    assert int(row["trials"]) == n
    for o in TRIAL_OUTCOMES:
        assert int(row[o]) == counts[o]
    kinds = {o: counts[o] for o in TRIAL_OUTCOMES}
    kinds["sdc_total"] = counts["sdc"] + counts["critical"]
    kinds["failure"] = n - counts["masked"]
    for kind, k in kinds.items():
        assert float(row[f"{kind}_rate"]) == k / n
        lo, hi = wilson_interval(k, n)
        assert float(row[f"{kind}_low"]) == pytest.approx(float(lo), abs=1e-12)
        assert float(row[f"{kind}_high"]) == pytest.approx(float(hi), abs=1e-12)


# ---------------------------------------------------------------------------- campaign
def test_campaign_report_files(campaign_report):
    out = Path(campaign_report.out)
    assert campaign_report.kind == "campaign"
    assert sorted(campaign_report.figures) == ["bits.png", "drops.png", "groups.png", "heatmap.png", "outcomes.png"]
    for name in campaign_report.figures:
        _check_png(out / name)
    for name in ("bits.csv", "heatmap.csv", "cells.csv", "margin.csv", "drops.csv", "groups.csv", "campaign.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert _check_page(out) == {"bits.png", "drops.png", "groups.png", "heatmap.png", "outcomes.png"}


def test_campaign_tables_equal_store(store, campaign_report):
    out = Path(campaign_report.out)
    by_bit, by_group, by_cell, n_all = _raw_counts(store)
    bits = _csv_rows(out / "bits.csv")
    assert {(r["condition"], int(r["bit"])) for r in bits} == set(by_bit)
    for r in bits:
        _check_rates(r, by_bit[(r["condition"], int(r["bit"]))])
    # the exponent cells spread single flips over bits 23..30: they must appear per bit
    one = [int(r["bit"]) for r in bits if r["condition"] == "fault flip, 1 flip/trial"]
    assert set(one) >= {0, 1, 2, 3, 30, 31} and len(set(one) & set(range(23, 30))) >= 3
    # two-flip trials of multi-bit cells have no single bit: only the plain-position cells count per bit
    two = {int(r["bit"]) for r in bits if r["condition"] == "fault flip, 2 flips/trial"}
    assert two == {30, 31}
    heat = _csv_rows(out / "heatmap.csv")
    assert {(r["condition"], r["group"], int(r["bit"])) for r in heat} == set(by_group)
    for r in heat:
        _check_rates(r, by_group[(r["condition"], r["group"], int(r["bit"]))])
    assert {r["group"] for r in heat} == {"dense", "out"}
    cells = _csv_rows(out / "cells.csv")
    assert len(cells) == 16 and sum(int(r["trials"]) for r in cells) == n_all
    for r in cells:
        _check_rates(r, by_cell[int(r["cell_id"])])
    margin = _csv_rows(out / "margin.csv")
    assert [m["condition"] for m in margin] == ["fault flip, 1 flip/trial", "fault flip, 2 flips/trial"]
    for m in margin:
        mine = [by_cell[int(c["cell_id"])] for c in cells if c["condition"] == m["condition"]]
        fails = [sum(c.values()) - c["masked"] for c in mine]
        ns = [sum(c.values()) for c in mine]
        assert int(m["trials"]) == sum(ns)
        assert float(m["max_half_width"]) == pytest.approx(float(np.max(wilson_half_width(fails, ns))), abs=1e-12)


F32_CLASS = {**{b: "mantissa" for b in range(23)}, **{b: "exponent" for b in range(23, 31)}, 31: "sign"}


def test_store_records_cell_dtypes_and_merge_keeps_them(store, tmp_path):
    con = sqlite3.connect(store)
    got = json.loads(con.execute("SELECT value FROM meta WHERE key = 'cell_dtypes'").fetchone()[0])
    keys = [k for (k,) in con.execute("SELECT key FROM cells")]
    con.close()
    assert set(got) == set(keys) and all(v == ["float32"] for v in got.values())
    from fastflip.campaign.store_export import merge_stores

    merge_stores(str(tmp_path / "m.db"), [store])
    con = sqlite3.connect(tmp_path / "m.db")
    assert json.loads(con.execute("SELECT value FROM meta WHERE key = 'cell_dtypes'").fetchone()[0]) == got
    con.close()


def test_report_columns_match_export(store, campaign_report, tmp_path):
    out = Path(campaign_report.out)
    assert cli_main(["export", store, "--csv", str(tmp_path / "t.csv")]) == 0
    export_cols = set(_csv_rows(tmp_path / "t.csv")[0])
    cells = _csv_rows(out / "cells.csv")
    shared = {"cell_id", "cell", "bits", "group", "flips", "fault", "epoch"}
    assert shared <= export_cols and shared <= set(cells[0])
    assert not {"key", "grp"} & set(cells[0])
    for r in cells:  # numeric bit where the cell is one position, its class from the recorded dtype
        assert r["bit"] == (r["bits"] if r["bits"].isdigit() else "")
        assert r["bit_class"] == (F32_CLASS[int(r["bit"])] if r["bit"] else "")
    for name in ("bits.csv", "heatmap.csv"):
        for r in _csv_rows(out / name):
            assert r["bit"].isdigit() and r["bit_class"] == F32_CLASS[int(r["bit"])]


@pytest.mark.extra("matplotlib")
def test_heatmap_failure_rate_counts_hatching_and_bit_classes(store):
    stats = require("scipy.stats")
    data = load_campaign_data(store)
    _, by_group, _, _ = _raw_counts(store)
    fig = heatmap_figure(data)  # default: the failure rate, DUE included
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == 2
    for ax, cond in zip(panels, data.conditions):
        grid = ax.images[0].get_array()
        groups = [t.get_text() for t in ax.get_yticklabels()]
        bits = [int(t.get_text()) for t in ax.get_xticklabels()]
        texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts
                 if "\n" in t.get_text()}
        for (c, g, b), counts in by_group.items():
            if c != cond:
                continue
            n = sum(counts.values())
            i, j = groups.index(g), bits.index(b)
            assert grid[i, j] == pytest.approx((counts["sdc"] + counts["critical"] + counts["due"]) / n)
            assert texts[(j, i)].split("\n")[1] == str(n)  # the trial count printed in the square
        assert not [p for p in ax.patches if p.get_hatch()]  # per_cell campaign: no target, nothing hatched
        labels = [t.get_text() for t in ax.texts if t.get_text() in ("sign", "exponent", "mantissa")]
        assert labels == [c for c in ("mantissa", "exponent", "sign") if any(F32_CLASS[b] == c for b in bits)]
        lines = sorted(float(ln.get_xdata()[0]) for ln in ax.lines)
        want = [bits.index(b) - 0.5 for b in (23, 31) if b in bits and bits.index(b) > 0]
        assert lines == want
    data.config["trials"] = {"half_width": 0.05}  # the same data against a precision target
    fig = heatmap_figure(data)
    hatched = 0
    for ax, cond in zip([a for a in fig.axes if a.images], data.conditions):
        wide = 0
        for (c, g, b), counts in by_group.items():
            if c == cond:
                n = sum(counts.values())
                k = n - counts["masked"]
                ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
                wide += (ci.high - ci.low) / 2 > 0.05
        assert len([p for p in ax.patches if p.get_hatch()]) == wide
        hatched += wide
        assert "hatched: interval wider than ±0.05" in ax.get_title()
    assert 0 < hatched < sum(1 for _ in by_group)


def test_metric_drops_by_bit_class(store, campaign_report):
    con = sqlite3.connect(store)
    rows = con.execute("SELECT c.bits, c.flips, c.fault, t.sites, t.delta FROM trials t JOIN cells c USING (cell_id) "
                       "WHERE t.delta IS NOT NULL").fetchall()
    con.close()
    want = defaultdict(list)
    for bits, flips, fault, sites, delta in rows:
        b = _bit_of(bits, sites)
        if b is not None:
            want[(f"fault {fault}, {flips} flip{'s' if flips != 1 else ''}/trial", F32_CLASS[b])].append(delta)
    got = _csv_rows(Path(campaign_report.out) / "drops.csv")
    assert {(r["condition"], r["bit_class"]) for r in got} == set(want)
    for r in got:
        v = np.array(want[(r["condition"], r["bit_class"])])
        assert int(r["trials"]) == len(v) and int(r["with_drop"]) == int((v > 0).sum())
        assert float(r["mean_drop"]) == pytest.approx(v.mean()) and float(r["max_drop"]) == v.max()
        assert float(r["median_drop"]) == pytest.approx(np.median(v))


def test_vulnerability_per_layer_table_and_figure(store, campaign_report):
    from fastflip.report.figures import group_figure

    con = sqlite3.connect(store)
    cells = con.execute("SELECT cell_id, grp, flips, population FROM cells").fetchall()
    outcomes = con.execute("SELECT cell_id, outcome FROM trials").fetchall()
    con.close()
    n, k = Counter(), Counter()
    for cid, o in outcomes:
        n[cid] += 1
        k[cid] += TRIAL_OUTCOMES[o] != "masked"  # the default failure classes: sdc, critical, due
    rows = _csv_rows(Path(campaign_report.out) / "groups.csv")
    assert {(r["group"], r["flips"]) for r in rows} == {(g, str(f)) for _, g, f, _ in cells}
    for r in rows:  # stratified by population over the group's cells, written out here
        mine = [(cid, pop) for cid, g, f, pop in cells if g == r["group"] and str(f) == r["flips"]]
        total = sum(pop for cid, g, f, pop in cells if str(f) == r["flips"])
        sites = sum(pop for _, pop in mine)
        rate = sum(pop / sites * k[cid] / n[cid] for cid, pop in mine)
        assert int(r["sites"]) == sites and float(r["share"]) == pytest.approx(sites / total)
        assert float(r["rate"]) == pytest.approx(rate) and float(r["low"]) <= rate <= float(r["high"])
        assert float(r["contribution"]) == pytest.approx(sites / total * rate)
    fig = group_figure(store)
    bars = [a for a in fig.axes if a.patches]
    assert len(bars) == 4  # rate and contribution, for each of the two conditions
    widths = sorted(round(p.get_width(), 9) for p in bars[0].patches)
    assert widths == sorted(round(float(r["rate"]), 9) for r in rows if r["flips"] == "1")
    assert "groups.png" in _check_page(Path(campaign_report.out))


def test_campaign_page_header(store, campaign_report):
    text = Path(campaign_report.index).read_text()
    st = ResultStore.open(store)
    try:
        for needle in (st.config_hash, f"fastflip {st.fastflip_version}", "480 stored of 480 planned",
                       "report-test", "campaign_helpers:evaluate", "margin reached"):
            assert needle in text, needle
        assert re.search(r"<td>seed</td><td>7</td>", text)
    finally:
        st.close()


@pytest.mark.extra("matplotlib")
def test_figures_api_returns_matplotlib_figures(store):
    from matplotlib.figure import Figure

    data = load_campaign_data(store)
    f = bit_figure(data)
    assert isinstance(f, Figure)
    assert len([a for a in f.axes if a.get_xlabel()]) == 2  # one panel per condition (1 and 2 flips)
    h = heatmap_figure(store, kind="due")  # a path works too
    assert isinstance(h, Figure)
    im = [a for a in h.axes if a.images][0].images[0]
    assert im.get_array().shape[0] == 2  # layers dense, out
    o = outcome_figure(data, max_cells=5)
    bars = [p for p in o.axes[0].patches]
    assert len(bars) == 5 * len(TRIAL_OUTCOMES)
    assert "5 of 16 cells" in o.axes[0].get_title()
    with pytest.raises(OptionError, match="heatmap kind must be one of .*, got 'nope'"):
        heatmap_figure(data, kind="nope")


def test_report_import_is_light():
    code = "import fastflip.report, fastflip.cli, sys; print('matplotlib' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


# ---------------------------------------------------------------------------- experiment
def test_experiment_report_files_and_tables(experiment, experiment_report):
    stats = require("scipy.stats")
    out = Path(experiment_report.out)
    assert experiment_report.kind == "experiment"
    assert sorted(experiment_report.figures) == ["accuracy.png", "loss.png", "outcome_rates.png"]
    for name in experiment_report.figures:
        _check_png(out / name)
    assert _check_page(out) == {"accuracy.png", "loss.png", "outcome_rates.png"}
    results = read_csv(experiment / "results.csv")
    summary = _csv_rows(out / "summary.csv")
    assert [s["scenario"] for s in summary] == ["exp-msb", "low-mant", "control"]
    for s in summary:
        mine = [r for r in results if r["scenario"] == s["scenario"]]
        assert int(s["runs"]) == len(mine)
        counts = Counter(r["outcome"] for r in mine)
        for o in ("masked", "recovered", "degraded", "diverged", "crashed"):
            assert int(s[o]) == counts[o]
        finals = [r["final_accuracy"] for r in mine if r["final_accuracy"] is not None
                  and math.isfinite(r["final_accuracy"])]
        if finals:
            assert float(s["mean_final_accuracy"]) == pytest.approx(sum(finals) / len(finals), rel=1e-12)
            assert float(s["min_final_accuracy"]) == min(finals)
        k = counts["degraded"] + counts["diverged"] + counts["crashed"]  # the default failure classes
        assert int(s["failures"]) == k
        lo, hi = stats.binomtest(k, len(mine)).proportion_ci(0.95, method="wilson")
        assert (float(s["failure_low"]), float(s["failure_high"])) == pytest.approx((lo, hi), abs=1e-9)
    tests = _csv_rows(out / "tests.csv")
    by = {s["scenario"]: s for s in summary}
    assert [(t["a"], t["b"]) for t in tests] == [("exp-msb", "low-mant")]
    a, b = by["exp-msb"], by["low-mant"]
    table = [[int(a["failures"]), int(a["runs"]) - int(a["failures"])],
             [int(b["failures"]), int(b["runs"]) - int(b["failures"])]]
    assert float(tests[0]["p_value"]) == pytest.approx(stats.fisher_exact(table).pvalue, rel=1e-9)
    golden = {r["epoch"]: r for r in read_csv(experiment / "golden" / "metrics.csv")}
    src = [r for r in read_csv(experiment / "curves.csv") if r["scenario"] != "golden"]
    got = read_csv(out / "curves.csv")
    gold_rows = [r for r in got if r["scenario"] == "golden"]
    assert [r["epoch"] for r in gold_rows] == sorted(golden)
    assert all(r["accuracy"] == golden[r["epoch"]]["accuracy"] for r in gold_rows)
    runs = [r for r in got if r["scenario"] != "golden"]
    assert len(runs) == len(src)
    for a, b in zip(runs, src):
        assert (a["scenario"], a["rep"], a["epoch"]) == (b["scenario"], b["rep"], b["epoch"])
        for k in ("accuracy", "val_loss", "loss"):
            x, y = a[k], b[k]
            assert x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        assert a["golden_accuracy"] == golden[a["epoch"]]["accuracy"]
        if isinstance(a["accuracy"], float) and math.isfinite(a["accuracy"]):
            assert a["accuracy_delta"] == a["accuracy"] - a["golden_accuracy"]
    meta = json.loads((experiment / "experiment.json").read_text())
    text = Path(experiment_report.index).read_text()
    assert meta["golden_digest"] in text and f"fastflip {meta['fastflip_version']}" in text
    hashes = json.loads((out / "experiment.json").read_text())["input_hashes"]
    assert set(hashes) == {"golden/ckpt-e001.h5", "golden/ckpt-e002.h5"}


def test_curve_figure_panels(experiment):
    f = curve_figure(experiment, "accuracy")
    titled = [a.get_title() for a in f.axes if a.get_title()]
    assert titled == ["exp-msb (E=1, 2 runs)", "low-mant (E=2, 2 runs)", "control (E=1, 1 run)"]
    for ax, epoch in zip([a for a in f.axes if a.get_title()], (1, 2, 1)):
        vlines = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
        assert vlines and float(vlines[0].get_xdata()[0]) == epoch  # injection epoch marked


# ---------------------------------------------------------------------------- browser
def _chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1":
            pytest.fail("chromium is missing but 'make report-deps' installs it")
        pytest.skip("chromium not installed (make report-deps)")
    return exe


_PROBE = ('<script>window.addEventListener("load",function(){var r=[];for(var i of document.images){'
          'r.push([i.getAttribute("src"),i.complete,i.naturalWidth,i.naturalHeight]);}'
          'document.body.setAttribute("data-probe",JSON.stringify(r));});</script>')


def _render(exe: str, page: Path, profile: Path) -> list[list]:
    """Load ``page`` in headless Chromium; return [src, complete, naturalWidth, naturalHeight] per image."""
    res = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'data-probe="([^"]*)"', res.stdout)
    assert m, "the page did not finish loading in Chromium"
    import html as _html

    return json.loads(_html.unescape(m.group(1)))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["campaign_report", "experiment_report"])
def test_page_renders_in_chromium(which, request, tmp_path):
    exe = _chromium()
    rep = request.getfixturevalue(which)
    out = Path(rep.out)
    page = out / "index.html"
    # the page itself (it holds no script, see _check_page): Chromium loads and paints it
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p0'}",
         "--window-size=1200,2000", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    _check_png(shot)
    # a copy with a probe script beside it: every image complete with its PNG's own size
    probe = out / "_probe.html"
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    try:
        images = _render(exe, probe, tmp_path / "p1")
        assert sorted(src for src, *_ in images) == sorted(rep.figures)
        for src, complete, w, h in images:
            assert complete and (w, h) == _png_size(out / src), src
        # control: the same probe sees a missing image
        broken = page.read_text().replace(f'src="{rep.figures[0]}"', 'src="missing.png"')
        probe.write_text(broken.replace("</body>", _PROBE + "</body>"))
        bad = {src: w for src, _, w, _ in _render(exe, probe, tmp_path / "p2")}
        assert bad["missing.png"] == 0
    finally:
        probe.unlink()


# ---------------------------------------------------------------------------- bad input
def _cli(capsys, *argv):
    code = cli_main(["report", *map(str, argv)])
    err = capsys.readouterr().err.strip()
    return code, err


def test_empty_store_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "empty.db"
    ResultStore.create(str(path), {"name": "e", "seed": 1}, [{"key": "c0", "planned": 5}]).close()
    code, err = _cli(capsys, path, "-o", tmp_path / "rep")
    assert code == 2 and len(err.splitlines()) == 1
    assert "holds no trials yet" in err and "fastflip sweep" in err
    assert not (tmp_path / "rep").exists()  # nothing written for a refused input
    (tmp_path / "zero.db").write_bytes(b"")
    code, err = _cli(capsys, tmp_path / "zero.db", "-o", tmp_path / "rep")
    assert code == 2 and len(err.splitlines()) == 1 and "not a fastflip results store" in err


def test_newer_store_is_refused(store, tmp_path, capsys):
    newer = tmp_path / "newer.db"
    shutil.copy(store, newer)
    con = sqlite3.connect(newer)
    con.execute("UPDATE campaign SET fastflip_version = '99.0.0'")
    con.commit()
    con.close()
    code, err = _cli(capsys, newer, "-o", tmp_path / "rep")
    assert code == 2 and len(err.splitlines()) == 1
    assert "newer" in err and "99.0.0" in err
    con = sqlite3.connect(newer)
    con.execute("UPDATE campaign SET fastflip_version = '0.0.1'")
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    code, err = _cli(capsys, newer, "-o", tmp_path / "rep")
    assert code == 2 and "schema version 99" in err
    with pytest.raises(StoreError):
        write_report(newer, tmp_path / "rep2")


def test_report_never_writes_into_its_experiment(experiment, capsys):
    before = (experiment / "curves.csv").read_bytes()
    code, err = _cli(capsys, experiment, "-o", experiment, "--force")
    assert code == 2 and "is the experiment itself" in err
    assert (experiment / "curves.csv").read_bytes() == before


def test_newer_experiment_is_refused(experiment, tmp_path, capsys):
    copy = tmp_path / "exp"
    shutil.copytree(experiment, copy)
    meta = json.loads((copy / "experiment.json").read_text())
    meta["fastflip_version"] = "42.0"
    (copy / "experiment.json").write_text(json.dumps(meta))
    code, err = _cli(capsys, copy, "-o", tmp_path / "rep")
    assert code == 2 and len(err.splitlines()) == 1 and "newer" in err and "42.0" in err


def test_missing_output_parent(store, tmp_path, capsys):
    code, err = _cli(capsys, store, "-o", tmp_path / "no" / "such" / "rep")
    assert code == 2 and len(err.splitlines()) == 1
    assert "parent directory" in err and "does not exist" in err
    assert not (tmp_path / "no").exists()


def test_other_bad_inputs(store, tmp_path, capsys):
    require("matplotlib")  # the CLI turns a missing extra into a one-line error, not an ImportError
    code, err = _cli(capsys, tmp_path / "nothing.db", "-o", tmp_path / "rep")
    assert code == 2 and "no such file" in err
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputFileError, match="without experiment.json"):
        write_report(tmp_path / "plain", tmp_path / "rep")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputFileError, match="neither"):
        write_report(tmp_path / "notes.txt", tmp_path / "rep")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    code, err = _cli(capsys, store, "-o", busy)
    assert code == 2 and "--force" in err
    assert _cli(capsys, store, "-o", busy, "--force")[0] == 0
    assert (busy / "mine.txt").read_text() == "keep" and (busy / "index.html").is_file()
    assert _cli(capsys, store, "-o", busy)[0] == 0  # an earlier report may be rewritten
    with pytest.raises(OutputError, match="is a file"):
        write_report(store, tmp_path / "notes.txt")


@pytest.mark.extra("matplotlib")
def test_sequential_campaign_margin_against_target(tmp_path):
    c = Campaign.from_dict({
        "name": "seq", "seed": 11, "target": {"factory": "campaign_helpers:weights"}, "paths": [str(TESTS)],
        "cells": {"bits": ["30", "0"]},
        "trials": {"half_width": 0.1, "block": 20, "min_trials": 20, "max_per_cell": 200},
        "evaluator": {"function": "campaign_helpers:evaluate", "critical": 0.05},
    })
    store = str(tmp_path / "seq.db")
    assert sweep(c, store, workers=0, progress=False).complete
    rep = write_report(store, tmp_path / "rep")
    _, _, by_cell, _ = _raw_counts(store)
    hws = [float(wilson_half_width(sum(v.values()) - v["masked"], sum(v.values()))) for v in by_cell.values()]
    ok = sum(h <= 0.1 for h in hws)
    text = Path(rep.index).read_text()
    assert f"±{max(hws):.4f} at 95% confidence; {ok} of 2 cells within the target ±0.1" in text
    margin = _csv_rows(Path(rep.out) / "margin.csv")
    assert float(margin[0]["max_half_width"]) == pytest.approx(max(hws), abs=1e-12)
