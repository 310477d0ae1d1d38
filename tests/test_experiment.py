"""The experiment driver with a framework-free trainer (tests/toy_trainer.py): fast, no TF/torch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import require

from fastflip.errors import OptionError, SelectionError
from fastflip.experiment.runner import golden_checkpoint, run_experiment
from fastflip.experiment.config import ExperimentConfig, load_config
from fastflip.experiment.outcomes import Verdict, classify_run, read_csv, summarize
from fastflip.files.log import InjectionLog
from fastflip.frameworks.trainers.data import digits

from outcome_rules import independent_outcome

TOY = str(Path(__file__).with_name("toy_trainer.py"))


def _cfg(**over):
    d = {
        "name": "toy", "epochs": 4, "seed": 1, "repetitions": 3, "tolerance": 0.02,
        "trainer": {"framework": "custom", "model_file": TOY},
        "scenarios": [
            {"name": "exp-msb", "epoch": 2, "bits": "exponent-msb", "count": 10, "selection": {"include": ["model/*"]}},
            {"name": "low-mant", "epoch": 2, "bits": "0-3", "count": 10, "selection": {"include": ["model/*"]}},
            {"name": "control", "epoch": 1, "control": True, "repetitions": 1},
        ],
    }
    d.update(over)
    return d


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name not in ("experiment.json", "accuracy.png")}


@pytest.mark.extra("sklearn")  # the digits trainer
def test_experiment_outputs_and_outcomes(tmp_path):
    res = run_experiment(_cfg(), tmp_path / "out")
    out = tmp_path / "out"
    for name in ("results.csv", "curves.csv", "accuracy.png", "experiment.json", "golden/metrics.csv"):
        assert (out / name).is_file(), name
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    golden = read_csv(out / "golden/metrics.csv")
    assert [r["epoch"] for r in golden] == [0, 1, 2, 3, 4]
    assert all(golden_checkpoint(out, e, ".h5").is_file() for e in range(5))
    rows = read_csv(out / "results.csv")
    assert [(r["scenario"], r["rep"]) for r in rows] == [
        ("exp-msb", 0), ("exp-msb", 1), ("exp-msb", 2), ("low-mant", 0), ("low-mant", 1), ("low-mant", 2),
        ("control", 0)]
    seeds = [r["seed"] for r in rows]
    assert len(set(seeds)) == len(seeds)  # distinct, recorded seeds
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["run_seeds"]["exp-msb"] == seeds[:3] and meta["status"] == "complete"
    assert meta["config"]["epochs"] == 4 and meta["fastflip_version"]
    # every faulty run keeps its log, and the log's flips are the ones asked for
    for r in rows[:6]:
        log = InjectionLog.load(out / "runs" / r["scenario"] / f"{r['rep']:03d}" / "injection.fflog")
        assert len(log) == 10 and log.manifest["seed"] == r["seed"] and r["flips"] == 10
        recs = log.records()
        want = [30] if r["scenario"] == "exp-msb" else [0, 1, 2, 3]
        assert all(set(x["bit_positions"]) <= set(want) for x in recs)
        assert not (out / "runs" / r["scenario"] / f"{r['rep']:03d}" / "injected.h5").exists()  # not kept
    control = rows[-1]
    assert control["outcome"] == "masked" and control["matches_golden"] is True
    assert all(r["matches_golden"] is False for r in rows[:3])
    # the outcome is what an independent reading of the recorded curves says
    curves = read_csv(out / "curves.csv")
    yv = digits()[3]
    chance = float(np.bincount(yv).max() / len(yv))
    for r in rows:
        mine = [c for c in curves if c["scenario"] == r["scenario"] and c["rep"] == r["rep"]]
        assert [c["epoch"] for c in mine] == list(range(r["epoch"], 5))
        assert [c["phase"] for c in mine] == ["injected"] + ["train"] * (4 - r["epoch"])
        assert all(c["loss"] is not None and c["train_accuracy"] is not None for c in mine[1:])  # both recorded
        assert (r["outcome"], r["epochs_to_recovery"]) == independent_outcome(mine, golden, 0.02, chance, 0.05)
    assert res.table().splitlines()[0].split()[:3] == ["scenario", "E", "runs"]


@pytest.mark.extra("sklearn")  # the digits trainer
def test_control_run_reproduces_golden_exactly(tmp_path):
    cfg = _cfg(scenarios=[{"name": "c0", "epoch": 0, "control": True, "repetitions": 1},
                          {"name": "c3", "epoch": 3, "control": True, "repetitions": 1}])
    res = run_experiment(cfg, tmp_path / "o")
    g = {r["epoch"]: r for r in res.golden}
    for row in res.results:
        assert row["matches_golden"] is True and row["final_accuracy"] == g[4]["accuracy"]
    metrics = read_csv(tmp_path / "o/runs/c0/000/metrics.csv")
    assert [m["loss"] for m in metrics[1:]] == [g[e]["loss"] for e in range(1, 5)]


@pytest.mark.extra("sklearn")  # the digits trainer
def test_rerun_reuses_everything(tmp_path):
    out = tmp_path / "o"
    first = run_experiment(_cfg(), out)
    before = _files(out)
    again = run_experiment(_cfg(), out)
    assert again.reused == len(first.results) == 7
    assert again.results == first.results
    assert _files(out) == before  # nothing recomputed or rewritten differently


@pytest.mark.extra("sklearn")  # the digits trainer
def test_changed_scenario_is_redone_others_kept(tmp_path):
    out = tmp_path / "o"
    run_experiment(_cfg(), out)
    cfg = _cfg()
    cfg["scenarios"][1] = dict(cfg["scenarios"][1], bits="0-7")
    res = run_experiment(cfg, out)
    assert res.reused == 4  # exp-msb x3 and control kept; low-mant x3 redone


@pytest.mark.extra("sklearn")  # the digits trainer
def test_interrupted_runs_resume_to_the_same_results(tmp_path):
    full = run_experiment(_cfg(), tmp_path / "full")
    seen = []

    def stop_after_three(line):
        seen.append(line)
        if sum(" rep " in s for s in seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(_cfg(), tmp_path / "part", progress=stop_after_three)
    # leave a half-written run behind, as a kill during a run would
    half = tmp_path / "part/runs/low-mant/000"
    half.mkdir(parents=True, exist_ok=True)
    (half / "metrics.csv").write_text("epoch\n")
    res = run_experiment(_cfg(), tmp_path / "part")
    assert res.reused == 3
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    assert strip(res.results) == strip(full.results)


@pytest.mark.extra("sklearn")  # the digits trainer
def test_interrupted_golden_run_resumes_from_its_last_checkpoint(tmp_path):
    full = run_experiment(_cfg(), tmp_path / "full")

    def stop(line):
        if line.startswith("golden epoch 2/"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(_cfg(), tmp_path / "part", progress=stop)
    assert len(read_csv(tmp_path / "part/golden/metrics.csv")) == 3
    lines = []
    res = run_experiment(_cfg(), tmp_path / "part", progress=lines.append)
    assert "golden run: resuming after epoch 2" in lines
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(res.golden) == strip(full.golden)
    for e in range(5):
        a, b = golden_checkpoint(tmp_path / "part", e, ".h5"), golden_checkpoint(tmp_path / "full", e, ".h5")
        with h5py.File(a) as fa, h5py.File(b) as fb:
            assert np.array_equal(fa["model/W"][()], fb["model/W"][()])


@pytest.mark.extra("sklearn")  # the digits trainer
def test_injected_nan_runs_on_and_is_diverged(tmp_path):
    cfg = _cfg(scenarios=[{"name": "nan", "epoch": 2, "bits": "exponent", "model": "stuck-at-1:8", "count": 5,
                           "selection": {"include": ["model/W"]}, "repetitions": 2}])
    res = run_experiment(cfg, tmp_path / "o")
    for r in res.results:
        assert r["outcome"] == "diverged" and r["error"] is None
        assert r["nan_created"] + r["inf_created"] == 5
    metrics = read_csv(tmp_path / "o/runs/nan/000/metrics.csv")
    assert [m["epoch"] for m in metrics] == [2, 3, 4]  # training went on to the last epoch


@pytest.mark.extra("sklearn")  # the digits trainer
def test_crash_in_user_trainer_is_recorded_and_the_experiment_goes_on(tmp_path):
    cfg = _cfg(trainer={"framework": "custom", "model_file": TOY, "crash_above": 1e6})
    res = run_experiment(cfg, tmp_path / "o")
    by = {}
    for r in res.results:
        by.setdefault(r["scenario"], []).append(r)
    assert all(r["outcome"] == "crashed" for r in by["exp-msb"])
    assert all("RuntimeError: toy trainer: weights out of range" == r["error"] for r in by["exp-msb"])
    assert all(r["outcome"] != "crashed" for r in by["low-mant"] + by["control"])
    rows = read_csv(tmp_path / "o/results.csv")
    assert rows[0]["error"] == "RuntimeError: toy trainer: weights out of range"


@pytest.mark.extra("sklearn")  # the digits trainer
def test_checkpoint_of_another_model_is_a_recorded_crash(tmp_path):
    out = tmp_path / "o"
    run_experiment(_cfg(scenarios=[{"name": "c", "epoch": 1, "control": True, "repetitions": 1}]), out)
    with h5py.File(golden_checkpoint(out, 1, ".h5"), "r+") as f:  # swap in another model's tensor
        del f["model/W"]
        f["model/W"] = np.zeros((32, 10), np.float32)
    res = run_experiment(_cfg(scenarios=[{"name": "c2", "epoch": 1, "control": True, "repetitions": 1}]), out)
    assert res.results[0]["outcome"] == "crashed"
    assert "/model/W has shape (32, 10)" in res.results[0]["error"]


@pytest.mark.extra("sklearn")  # the digits trainer
def test_selection_that_matches_nothing_fails_early(tmp_path):
    cfg = _cfg(scenarios=[{"name": "x", "epoch": 1, "count": 1, "selection": {"include": ["nothing/*"]}}])
    with pytest.raises(SelectionError, match="scenario x: .*matched no tensor"):
        run_experiment(cfg, tmp_path / "o")
    assert not (tmp_path / "o/runs").exists()


@pytest.mark.extra("sklearn")  # the digits trainer
def test_other_golden_config_in_same_dir_is_refused(tmp_path):
    run_experiment(_cfg(scenarios=[{"name": "c", "epoch": 1, "control": True, "repetitions": 1}]), tmp_path / "o")
    with pytest.raises(OptionError, match="another golden run"):
        run_experiment(_cfg(seed=2), tmp_path / "o")


@pytest.mark.parametrize("bad, msg", [
    ({"epochs": 0}, "epochs"),
    ({"scenarios": []}, "at least one scenario"),
    ({"scenarios": [{"name": "a", "epoch": 9, "count": 1}]}, "after the last epoch"),
    ({"scenarios": [{"name": "a", "epoch": 1}]}, "exactly one of count, rate, ber"),
    ({"scenarios": [{"name": "a", "epoch": 1, "count": 1, "colour": 1}]}, "unknown key 'colour'"),
    ({"scenarios": [{"name": "a/b", "epoch": 1, "count": 1}]}, "name"),
    ({"scenarios": [{"name": "a", "epoch": 1, "count": 1}, {"name": "a", "epoch": 1, "count": 2}]}, "duplicate"),
    ({"scenarios": [{"name": "a", "epoch": 1, "count": 1, "selection": {"roles": ["brain"]}}]}, "unknown role"),
    ({"tolerance": 2}, "tolerance"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_bad_configurations(bad, msg):
    with pytest.raises(OptionError, match=msg):
        ExperimentConfig.from_dict(_cfg(**bad))


def test_yaml_and_json_config_files(tmp_path):
    import yaml

    d = _cfg(output="res")
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(d))
    (tmp_path / "e.json").write_text(json.dumps(d))
    a, b = load_config(tmp_path / "e.yaml"), load_config(tmp_path / "e.json")
    assert a.as_dict() == b.as_dict() and a.base_dir == str(tmp_path.resolve())
    (tmp_path / "bad.yaml").write_text("epochs: [\n")
    with pytest.raises(OptionError, match="invalid YAML"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.extra("sklearn")  # the digits trainer
def test_relative_model_file_and_output_resolve_against_the_config(tmp_path):
    import shutil

    import yaml

    shutil.copy(TOY, tmp_path / "mine.py")
    d = _cfg(output="res", trainer={"framework": "custom", "model_file": "mine.py"},
             scenarios=[{"name": "c", "epoch": 3, "control": True, "repetitions": 1}])
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(d))
    cwd = os.getcwd()
    os.chdir("/")
    try:
        res = run_experiment(tmp_path / "e.yaml")
    finally:
        os.chdir(cwd)
    assert res.out == tmp_path / "res" and (tmp_path / "res/results.csv").exists()


NAN, INF = float("nan"), float("inf")
G = [{"val_loss": 0.3, "accuracy": 0.9}, {"loss": 0.2, "train_accuracy": 0.93, "val_loss": 0.25, "accuracy": 0.92},
     {"loss": 0.1, "train_accuracy": 0.95, "val_loss": 0.2, "accuracy": 0.95}]


def _pt(acc, loss=0.1, train=0.95, val=0.2):
    return {"loss": loss, "train_accuracy": train, "val_loss": val, "accuracy": acc}


@pytest.mark.parametrize("run, kw, want", [
    # masked: never beyond tolerance (higher is within)
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.96)], {}, Verdict("masked", 0)),
    # a transient NaN/Inf in the evaluation right after injection, ending at golden accuracy: recovered
    ([{"val_loss": NAN, "accuracy": 0.1}, _pt(0.92), _pt(0.95)], {}, Verdict("recovered", 1)),
    ([{"val_loss": INF, "accuracy": 0.9}, _pt(0.92), _pt(0.95)], {}, Verdict("recovered", 1)),
    # a training loss that became NaN is never masked, even with accuracy at golden's
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92, loss=NAN), _pt(0.95)], {}, Verdict("recovered", 2)),
    # ... and ending on a NaN training loss is diverged
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.95, loss=NAN)], {}, Verdict("diverged", None)),
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.95, val=INF)], {}, Verdict("diverged", None)),
    # training accuracy checked too: a dip in it alone leaves tolerance
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92, train=0.5), _pt(0.95)], {}, Verdict("recovered", 2)),
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.95, train=0.5)], {}, Verdict("degraded", None)),
    # left, came back, left again, came back: recovery counts to the last return
    ([{"val_loss": 0.3, "accuracy": 0.2}, _pt(0.6), _pt(0.94)], {}, Verdict("recovered", 2)),
    # degraded: ends finite, above chance, beyond tolerance
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.5)], {"chance": 0.1}, Verdict("degraded", None)),
    # diverged: ends at chance (within the margin)
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.14)], {"chance": 0.1}, Verdict("diverged", None)),
    ([{"val_loss": 0.3, "accuracy": 0.9}, _pt(0.92), _pt(0.16)], {"chance": 0.1}, Verdict("degraded", None)),
    ([], {"error": "boom"}, Verdict("crashed", None)),
    ([{"val_loss": 0.3, "accuracy": 0.9}], {"error": "RuntimeError: x"}, Verdict("crashed", None)),
])
def test_classify_rules(run, kw, want):
    assert classify_run(run, G[: len(run)] if run else [], tolerance=0.02, **kw) == want


def test_classify_agrees_with_the_independent_rules_on_random_curves():
    rng = np.random.default_rng(0)
    golden = [{"epoch": e, "loss": 0.5 / (e + 1), "train_accuracy": 0.8 + 0.04 * e, "val_loss": 0.4 / (e + 1),
               "accuracy": 0.78 + 0.04 * e} for e in range(5)]
    seen = set()
    for _ in range(3000):
        start = int(rng.integers(0, 4))
        run = []
        for e in range(start, 5):
            p = {"epoch": e, "phase": "injected" if e == start else "train", "val_loss": float(rng.random()),
                 "accuracy": float(rng.choice([0.1, golden[e]["accuracy"] - 0.05, golden[e]["accuracy"], 0.99]))}
            if e > start:
                p.update(loss=float(rng.choice([0.1, NAN, INF], p=[0.8, 0.1, 0.1])),
                         train_accuracy=float(rng.choice([0.5, golden[e]["train_accuracy"]])))
            if rng.random() < 0.1:
                p["val_loss"] = NAN
            run.append(p)
        gp = [{k: golden[p["epoch"]][k] for k in (("val_loss", "accuracy") if p["phase"] == "injected"
                                                   else ("loss", "train_accuracy", "val_loss", "accuracy"))} for p in run]
        got = classify_run(run, gp, tolerance=0.02, chance=0.1, chance_margin=0.05)
        assert tuple(got) == independent_outcome(run, golden, 0.02, 0.1, 0.05)
        seen.add(got.outcome)
    assert seen == {"masked", "recovered", "degraded", "diverged"}


def test_summary_intervals_and_failure_definition():
    from scipy.stats import binomtest

    rows = [{"scenario": "a", "epoch": 1, "outcome": o, "final_accuracy": 0.9}
            for o in ["masked"] * 7 + ["recovered"] * 2 + ["diverged"] * 3]
    s = summarize(rows)[0]
    assert (s["runs"], s["masked"], s["recovered"], s["diverged"], s["failures"]) == (12, 7, 2, 3, 3)
    z = 1.959963984540054
    for o, k in (("masked", 7), ("recovered", 2), ("failure", 3), ("crashed", 0)):
        n, ph = 12, k / 12  # Wilson's formula written out
        c = (ph + z * z / (2 * n)) / (1 + z * z / n)
        h = z / (1 + z * z / n) * np.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n))
        assert s[f"{o}_rate"] == ph
        assert s[f"{o}_low"] == pytest.approx(max(0.0, c - h), abs=1e-12)
        assert s[f"{o}_high"] == pytest.approx(min(1.0, c + h), abs=1e-12)
        assert binomtest(k, n).proportion_ci(0.95, method="wilson").low == pytest.approx(s[f"{o}_low"], abs=1e-9)
    s2 = summarize(rows, failure=["recovered", "diverged"])[0]
    assert s2["failures"] == 5 and s2["failure_classes"] == "recovered+diverged"
    with pytest.raises(OptionError, match="failure: unknown outcome class 'sdc'"):
        summarize(rows, failure=["sdc"])


def test_cli_experiment(tmp_path, capsys):
    require("sklearn")  # the CLI turns a missing extra into a one-line error, not an ImportError
    import yaml

    from fastflip.cli import main

    (tmp_path / "e.yaml").write_text(yaml.safe_dump(_cfg(repetitions=1)))
    assert main(["experiment", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "o"), "-q", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["scenario", "E", "runs"] and "low-mant" in out
    assert (tmp_path / "o/results.csv").exists() and not (tmp_path / "o/accuracy.png").exists()
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(_cfg(epochs=-1)))
    assert main(["experiment", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastflip experiment: error: ") and len(err.strip().splitlines()) == 1
    assert "bad.yaml: epochs must be a positive integer (got -1)" in err
    (tmp_path / "noout.yaml").write_text(yaml.safe_dump(_cfg()))
    assert main(["experiment", str(tmp_path / "noout.yaml")]) == 2
    assert "no output directory" in capsys.readouterr().err


@pytest.mark.extra("sklearn")  # the digits trainer
def test_injection_at_an_iteration_within_an_epoch(tmp_path):
    cfg = _cfg(scenarios=[
        {"name": "mid-control", "at": {"epoch": 2, "iteration": 7}, "control": True, "repetitions": 1},
        {"name": "mid-exp", "at": {"epoch": 2, "iteration": 7}, "bits": "exponent-msb", "count": 10,
         "selection": {"include": ["model/*"]}, "repetitions": 2},
    ])
    res = run_experiment(cfg, tmp_path / "o")
    out = tmp_path / "o"
    g = {r["epoch"]: r for r in res.golden}
    ctrl, *runs = res.results
    # the golden state after 7 batches of epoch 2, made once: resuming from it reproduces golden exactly
    assert (out / "golden/ckpt-e002-i000007.h5").is_file()
    assert ctrl["matches_golden"] is True and ctrl["outcome"] == "masked" and ctrl["final_accuracy"] == g[4]["accuracy"]
    m = read_csv(out / "runs/mid-control/000/metrics.csv")
    assert [(r["epoch"], r["iteration"], r["phase"]) for r in m] == [(2, 7, "injected"), (2, None, "train"),
                                                                     (3, None, "train"), (4, None, "train")]
    assert [r["val_loss"] for r in m[1:]] == [g[e]["val_loss"] for e in (2, 3, 4)]
    with h5py.File(out / "golden/ckpt-e002-i000007.h5") as f:  # 7 optimizer steps after epoch 1's checkpoint
        with h5py.File(golden_checkpoint(out, 1, ".h5")) as f1:
            steps_per_epoch = -(-len(digits()[1]) // 64)
            assert int(f["optimizer/step"][()]) == int(f1["optimizer/step"][()]) + 7 == 7 + steps_per_epoch
    for r in runs:
        assert r["iteration"] == 7 and r["epoch"] == 2 and r["flips"] == 10
        log = InjectionLog.load(out / "runs/mid-exp" / f"{r['rep']:03d}" / "injection.fflog")
        assert log.manifest["input"]["path"].endswith("golden/ckpt-e002-i000007.h5")
        assert r["matches_golden"] is False
    rows = read_csv(out / "results.csv")
    assert rows[1]["iteration"] == 7


@pytest.mark.extra("sklearn")  # the digits trainer
def test_iteration_errors(tmp_path):
    bad = _cfg(scenarios=[{"name": "x", "at": {"epoch": 2, "iteration": 1000}, "count": 1,
                           "selection": {"include": ["model/*"]}}])
    with pytest.raises(OptionError, match=r"an epoch has only 23 iterations; choose an iteration from 1 to 22"):
        run_experiment(bad, tmp_path / "o")
    with pytest.raises(OptionError, match="give either epoch or at"):
        ExperimentConfig.from_dict(_cfg(scenarios=[{"name": "x", "epoch": 1, "at": {"epoch": 1}, "count": 1}]))
    with pytest.raises(OptionError, match=r"at.iteration must be a positive integer \(got 0\)"):
        ExperimentConfig.from_dict(_cfg(scenarios=[{"name": "x", "at": {"epoch": 1, "iteration": 0}, "count": 1}]))

    class NoRange:
        framework, checkpoint_suffix = "x", ".h5"

        def build(self): ...
        def train_epoch(self, epoch): ...
        def evaluate(self): ...
        def save_checkpoint(self, path): ...
        def load_checkpoint(self, path): ...

    cfg = _cfg(scenarios=[{"name": "x", "at": {"epoch": 2, "iteration": 3}, "count": 1}])
    with pytest.raises(OptionError, match=r"scenario x: injecting at an iteration needs train_epoch\(epoch, start, stop\)"):
        run_experiment(cfg, tmp_path / "n", trainer=NoRange())


@pytest.mark.extra("sklearn")  # the digits trainer
def test_pairwise_tests_between_scenarios_in_results(tmp_path):
    from scipy.stats import fisher_exact

    res = run_experiment(_cfg(repetitions=4), tmp_path / "o")
    meta = json.loads((tmp_path / "o/experiment.json").read_text())
    tests = read_csv(tmp_path / "o/tests.csv")
    assert [(t["a"], t["b"]) for t in tests] == [("exp-msb", "low-mant")]  # control left out by default
    by = {s["scenario"]: s for s in res.summary}
    a, b = by["exp-msb"], by["low-mant"]
    want = fisher_exact([[a["failures"], 4 - a["failures"]], [b["failures"], 4 - b["failures"]]]).pvalue
    assert tests[0]["p_value"] == pytest.approx(want, rel=1e-9) and meta["tests"][0]["p_value"] == tests[0]["p_value"]
    assert tests[0]["p_holm"] == tests[0]["p_value"]  # a family of one
    summary = read_csv(tmp_path / "o/summary.csv")
    assert {"failure_low", "failure_high", "masked_low", "diverged_high"} <= set(summary[0])
    assert "Fisher p" in res.table()


def test_requested_test_with_a_scenario_without_runs_is_one_clear_line(tmp_path):
    with pytest.raises(OptionError, match="compare: no scenario named 'nope'"):
        ExperimentConfig.from_dict(_cfg(compare=[["exp-msb", "nope"]]))
    from fastflip.experiment.runner import scenario_tests

    cfg = ExperimentConfig.from_dict(_cfg(compare=[["exp-msb", "low-mant"]]))
    summary = summarize([{"scenario": "exp-msb", "epoch": 2, "outcome": "diverged"}])
    with pytest.raises(OptionError, match="^test exp-msb vs low-mant: scenario 'low-mant' has no trials; run it"):
        scenario_tests(summary, cfg)
    with pytest.raises(OptionError, match="failure: unknown outcome class 'sdc'"):
        ExperimentConfig.from_dict(_cfg(failure=["sdc"]))


def test_example_configuration_validates():
    cfg = load_config(Path(__file__).resolve().parent.parent / "examples" / "demo_experiment.yaml")
    names = [s.name for s in cfg.scenarios]
    assert cfg.compare == (("random-bits", "spare-exp-msb"),) and "control" in names
    assert any(s.iteration == 10 for s in cfg.scenarios)
