"""The experiment driver with a framework-free trainer (tests/toy_trainer.py): fast, no TF/torch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from fastflip.errors import OptionError, SelectionError
from fastflip.experiment import golden_checkpoint, run_experiment
from fastflip.experiment_config import ExperimentConfig, load_config
from fastflip.experiment_outcomes import classify, read_csv
from fastflip.log import InjectionLog
from fastflip.trainers.data import digits

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
    # the outcome is what classify() says from the recorded curves
    curves = read_csv(out / "curves.csv")
    yv = digits()[3]
    chance = float(np.bincount(yv).max() / len(yv))
    gacc = {r["epoch"]: r["accuracy"] for r in golden}
    for r in rows:
        mine = [c for c in curves if c["scenario"] == r["scenario"] and c["rep"] == r["rep"]]
        assert [c["epoch"] for c in mine] == list(range(r["epoch"], 5))
        acc = {c["epoch"]: c["accuracy"] for c in mine}
        losses = {c["epoch"]: c[k] for c in mine for k in ("loss", "val_loss") if c[k] is not None}
        assert r["outcome"] == classify(gacc, acc, losses, tolerance=0.02, chance=chance, chance_margin=0.05)
    assert res.table().splitlines()[0].split()[:3] == ["scenario", "E", "runs"]


def test_control_run_reproduces_golden_exactly(tmp_path):
    cfg = _cfg(scenarios=[{"name": "c0", "epoch": 0, "control": True, "repetitions": 1},
                          {"name": "c3", "epoch": 3, "control": True, "repetitions": 1}])
    res = run_experiment(cfg, tmp_path / "o")
    g = {r["epoch"]: r for r in res.golden}
    for row in res.results:
        assert row["matches_golden"] is True and row["final_accuracy"] == g[4]["accuracy"]
    metrics = read_csv(tmp_path / "o/runs/c0/000/metrics.csv")
    assert [m["loss"] for m in metrics[1:]] == [g[e]["loss"] for e in range(1, 5)]


def test_rerun_reuses_everything(tmp_path):
    out = tmp_path / "o"
    first = run_experiment(_cfg(), out)
    before = _files(out)
    again = run_experiment(_cfg(), out)
    assert again.reused == len(first.results) == 7
    assert again.results == first.results
    assert _files(out) == before  # nothing recomputed or rewritten differently


def test_changed_scenario_is_redone_others_kept(tmp_path):
    out = tmp_path / "o"
    run_experiment(_cfg(), out)
    cfg = _cfg()
    cfg["scenarios"][1] = dict(cfg["scenarios"][1], bits="0-7")
    res = run_experiment(cfg, out)
    assert res.reused == 4  # exp-msb x3 and control kept; low-mant x3 redone


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


def test_injected_nan_runs_on_and_is_diverged(tmp_path):
    cfg = _cfg(scenarios=[{"name": "nan", "epoch": 2, "bits": "exponent", "model": "stuck-at-1:8", "count": 5,
                           "selection": {"include": ["model/W"]}, "repetitions": 2}])
    res = run_experiment(cfg, tmp_path / "o")
    for r in res.results:
        assert r["outcome"] == "diverged" and r["error"] is None
        assert r["nan_created"] + r["inf_created"] == 5
    metrics = read_csv(tmp_path / "o/runs/nan/000/metrics.csv")
    assert [m["epoch"] for m in metrics] == [2, 3, 4]  # training went on to the last epoch


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


def test_checkpoint_of_another_model_is_a_recorded_crash(tmp_path):
    out = tmp_path / "o"
    run_experiment(_cfg(scenarios=[{"name": "c", "epoch": 1, "control": True, "repetitions": 1}]), out)
    with h5py.File(golden_checkpoint(out, 1, ".h5"), "r+") as f:  # swap in another model's tensor
        del f["model/W"]
        f["model/W"] = np.zeros((32, 10), np.float32)
    res = run_experiment(_cfg(scenarios=[{"name": "c2", "epoch": 1, "control": True, "repetitions": 1}]), out)
    assert res.results[0]["outcome"] == "crashed"
    assert "/model/W has shape (32, 10)" in res.results[0]["error"]


def test_selection_that_matches_nothing_fails_early(tmp_path):
    cfg = _cfg(scenarios=[{"name": "x", "epoch": 1, "count": 1, "selection": {"include": ["nothing/*"]}}])
    with pytest.raises(SelectionError, match="scenario x: .*matched no tensor"):
        run_experiment(cfg, tmp_path / "o")
    assert not (tmp_path / "o/runs").exists()


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


def test_classify_rules():
    g = {0: 0.1, 1: 0.9, 2: 0.95}
    assert classify(g, {1: 0.9, 2: 0.96}, {2: 0.1}, tolerance=0.01) == "masked"
    assert classify(g, {1: 0.5, 2: 0.945}, {2: 0.1}, tolerance=0.01) == "recovered"
    assert classify(g, {1: 0.9, 2: 0.9}, {2: 0.1}, tolerance=0.01) == "degraded"
    assert classify(g, {1: 0.9, 2: 0.12}, {2: 0.1}, tolerance=0.01, chance=0.1) == "diverged"
    assert classify(g, {1: 0.9, 2: 0.95}, {2: float("inf")}, tolerance=0.01) == "diverged"
    assert classify(g, {}, {}, tolerance=0.01, error="boom") == "crashed"


def test_cli_experiment(tmp_path, capsys):
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
    assert err.startswith("fastflip experiment: error: epochs:") and len(err.strip().splitlines()) == 1
    (tmp_path / "noout.yaml").write_text(yaml.safe_dump(_cfg()))
    assert main(["experiment", str(tmp_path / "noout.yaml")]) == 2
    assert "no output directory" in capsys.readouterr().err
