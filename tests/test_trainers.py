"""Built-in Keras / PyTorch trainers, user model files, and the Keras injection callback (real frameworks)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import require
from flip_helper import words_of
from fastflip.errors import OptionError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOY = str(Path(__file__).with_name("toy_trainer.py"))


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _controls(framework, **trainer):
    return {
        "epochs": 3, "seed": 4, "trainer": {"framework": framework, **trainer},
        "scenarios": [{"name": "c1", "epoch": 1, "control": True, "repetitions": 1},
                      {"name": "c0", "epoch": 0, "control": True, "repetitions": 1},
                      {"name": "cmid", "at": {"epoch": 2, "iteration": 10}, "control": True, "repetitions": 1},
                      {"name": "flip", "epoch": 1, "count": 3, "bits": "0-3", "repetitions": 1,
                       "selection": {"roles": ["weight"]}}],
    }


@pytest.mark.framework
@pytest.mark.parametrize("framework, extra", [("torch", {}), ("keras", {}), ("keras", {"checkpoint_format": "keras"})])
def test_resume_from_unaltered_checkpoint_reproduces_golden(framework, extra, tmp_path, request):
    request.getfixturevalue(framework)
    from fastflip.experiment.runner import run_experiment

    res = run_experiment(_controls(framework, **extra), tmp_path / "o", plot=False)
    c1, c0, cmid, flip = res.results
    assert c1["matches_golden"] is True and c0["matches_golden"] is True, res.results
    # split after 10 batches of epoch 2, checkpointed, reloaded, finished: the golden curve exactly
    assert cmid["matches_golden"] is True and cmid["iteration"] == 10, res.results
    assert flip["error"] is None and flip["flips"] == 3  # the injection path works for this checkpoint kind
    suffix = ".keras" if extra else (".weights.h5" if framework == "keras" else ".h5")
    assert (tmp_path / f"o/golden/ckpt-e003{suffix}").is_file()


@pytest.mark.framework
def test_keras_checkpoint_of_another_model_names_the_tensor(keras, tmp_path):
    from fastflip.frameworks.torch_state import CheckpointMismatchError
    from fastflip.frameworks.trainers.keras_trainer import KerasTrainer, digits_data

    def other():
        m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(5)])
        m.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return m

    t = KerasTrainer(seed=0)
    t.build()
    t.save_checkpoint(tmp_path / "mine.weights.h5")
    o = KerasTrainer(other, digits_data, seed=0)
    o.build()
    with pytest.raises(CheckpointMismatchError, match=r"tensor /layers/.* is missing|has shape"):
        o.load_checkpoint(tmp_path / "mine.weights.h5")
    o.save_checkpoint(tmp_path / "other.weights.h5")
    with pytest.raises(CheckpointMismatchError, match=r"/layers/dense/vars/0 has shape \(64, 5\) but the model "
                                                      r"expects \(512, 10\)"):
        t.load_checkpoint(tmp_path / "other.weights.h5")
    with pytest.raises(OptionError, match="must end in .weights.h5"):
        t.save_checkpoint(tmp_path / "x.h5")


@pytest.mark.framework
@pytest.mark.parametrize("framework, module", [("keras", "keras_model.py"), ("torch", "torch_model.py")])
def test_example_model_files_plug_in(framework, module, tmp_path, request):
    request.getfixturevalue(framework)
    from fastflip.frameworks.trainers import make_trainer

    t = make_trainer({"framework": framework, "model_file": module, "batch_size": 64}, seed=0,
                     base_dir=str(EXAMPLES))
    t.build()
    first = t.evaluate()["accuracy"]
    for e in (1, 2):
        assert np.isfinite(t.train_epoch(e)["loss"])
    m = t.evaluate()
    assert m["accuracy"] > max(0.5, first)  # it learns
    p = tmp_path / f"ck{t.checkpoint_suffix}"
    t.save_checkpoint(p)
    t.train_epoch(3)
    t.load_checkpoint(p)
    assert t.evaluate() == m


@pytest.mark.extra("sklearn")  # fastflip.frameworks.trainers imports it
def test_user_file_errors(tmp_path):
    from fastflip.frameworks.trainers import make_trainer

    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(OptionError, match="must define make_trainer"):
        make_trainer({"framework": "custom", "model_file": str(tmp_path / "empty.py")})
    (tmp_path / "bad.py").write_text("def make_trainer(seed, **kw):\n    return object()\n")
    with pytest.raises(OptionError, match="without the Trainer methods"):
        make_trainer({"framework": "custom", "model_file": str(tmp_path / "bad.py")})
    with pytest.raises(OptionError, match="framework"):
        make_trainer({"framework": "jax"})
    t = make_trainer({"framework": "custom", "model_file": TOY, "lr": 0.1}, seed=5)
    assert t.seed == 5 and t.lr == 0.1


@pytest.mark.framework
@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_keras_callback_injects_and_reloads(keras, tmp_path, suffix):
    from fastflip.files.log import InjectionLog
    from fastflip.frameworks.trainers.keras_callback import FaultInjectionCallback
    from fastflip.frameworks.trainers.keras_trainer import digits_cnn, digits_data

    keras.utils.set_random_seed(0)
    x, y, _, _ = digits_data()
    x, y = x[:256], y[:256]
    model = digits_cnn()
    seen = {}

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == 2:
                self.model.save_weights(tmp_path / "after-reload.weights.h5")
            if epoch + 1 == 3:
                seen["done"] = True

    cb = FaultInjectionCallback(str(tmp_path / ("ck/e{epoch:03d}" + suffix)), inject_epoch=2, seed=11, count=6,
                                bits="exponent-msb", selection={"roles": ["weight"]})
    model.fit(x, y, epochs=3, batch_size=64, verbose=0, shuffle=False, callbacks=[cb, Snapshot()])
    assert seen["done"] and sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.endswith("fflog")) == [
        f"e001{suffix}", f"e002.injected{suffix}", f"e002{suffix}", f"e003{suffix}"]
    assert cb.injected_path == tmp_path / f"ck/e002.injected{suffix}"
    log = InjectionLog.load(str(cb.injected_path) + ".fflog")
    assert len(log) == 6 and log.manifest["seed"] == 11
    with h5py.File(tmp_path / "after-reload.weights.h5") as f:  # the model carried the altered values on
        for rec in log.records():
            stored = f[rec["tensor"]][()].reshape(-1)
            assert int(words_of(stored)[rec["index"]]) == rec["new_word"], rec
            assert 30 in rec["bit_positions"]
    with pytest.raises(OptionError, match="must end in"):
        FaultInjectionCallback(str(tmp_path / "x.h5"), 1, seed=0, count=1)


@pytest.mark.framework
def test_keras_callback_injects_at_an_iteration(keras, tmp_path):
    from fastflip.files.log import InjectionLog
    from fastflip.frameworks.trainers.keras_callback import FaultInjectionCallback
    from fastflip.frameworks.trainers.keras_trainer import digits_cnn, digits_data

    keras.utils.set_random_seed(0)
    x, y, _, _ = digits_data()
    x, y = x[:256], y[:256]  # 4 batches of 64 per epoch
    model = digits_cnn()
    steps = []

    class Snapshot(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(int(self.model.optimizer.iterations))
            if len(steps) == 4 + 3:  # epoch 2, after its 3rd batch: right after the callback reloaded
                self.model.save_weights(tmp_path / "after-reload.weights.h5")

    cb = FaultInjectionCallback(str(tmp_path / "ck/e{epoch:03d}.weights.h5"), inject_epoch=2, inject_iteration=3,
                                seed=5, count=4, bits="exponent-msb", selection={"roles": ["weight"]})
    model.fit(x, y, epochs=3, batch_size=64, verbose=0, shuffle=False, callbacks=[cb, Snapshot()])
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.endswith("fflog"))
    assert names == ["e001.weights.h5", "e002-i000003.injected.weights.h5", "e002-i000003.weights.h5",
                     "e002.weights.h5", "e003.weights.h5"]
    log = InjectionLog.load(str(cb.injected_path) + ".fflog")
    assert len(log) == 4 and log.manifest["seed"] == 5
    with h5py.File(tmp_path / "ck/e002-i000003.weights.h5") as f:  # saved after 4 + 3 optimizer steps
        assert int(f["optimizer/vars/0"][()]) == 7  # Keras 3 stores the optimizer's iteration counter first
    with h5py.File(tmp_path / "after-reload.weights.h5") as f:  # the model carried the altered values on
        for rec in log.records():
            assert int(words_of(f[rec["tensor"]][()].reshape(-1))[rec["index"]]) == rec["new_word"], rec
    assert steps == list(range(1, 13))
    with pytest.raises(OptionError, match="inject_iteration"):
        FaultInjectionCallback(str(tmp_path / "x.weights.h5"), 1, seed=0, count=1, inject_iteration=0)


@pytest.mark.framework
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_injected_nan_keeps_training_and_is_diverged(framework, tmp_path, request):
    request.getfixturevalue(framework)
    from fastflip.experiment.runner import run_experiment
    from fastflip.experiment.outcomes import read_csv

    cfg = {"epochs": 2, "seed": 1, "trainer": {"framework": framework},
           "scenarios": [{"name": "nan", "epoch": 1, "bits": "exponent", "model": "stuck-at-1:8", "count": 4,
                          "repetitions": 1, "selection": {"roles": ["weight"]}}]}
    res = run_experiment(cfg, tmp_path / "o", plot=False)
    row = res.results[0]
    assert row["outcome"] == "diverged" and row["error"] is None, row
    assert row["nan_created"] + row["inf_created"] == 4
    assert [m["epoch"] for m in read_csv(tmp_path / "o/runs/nan/000/metrics.csv")] == [1, 2]


@pytest.mark.framework
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_outcome_rules_on_real_training(framework, tmp_path, request):
    """Exponent-MSB flips into real Keras / PyTorch models: both losses and accuracies recorded, outcome by the rules."""
    request.getfixturevalue(framework)
    from outcome_rules import independent_outcome

    from fastflip.experiment.runner import run_experiment
    from fastflip.experiment.outcomes import read_csv

    cfg = {"epochs": 3, "seed": 2, "trainer": {"framework": framework},
           "scenarios": [{"name": "msb", "epoch": 1, "bits": "exponent-msb", "count": 2, "repetitions": 3,
                          "selection": {"roles": ["weight"]}},
                         {"name": "mid", "at": {"epoch": 2, "iteration": 5}, "bits": "exponent-msb", "count": 1,
                          "repetitions": 2, "selection": {"roles": ["weight"]}}]}
    res = run_experiment(cfg, tmp_path / "o", plot=False)
    golden = read_csv(tmp_path / "o/golden/metrics.csv")
    assert all(g["loss"] is not None and g["train_accuracy"] is not None and g["val_loss"] is not None
               for g in golden[1:])
    assert golden[1]["loss"] != golden[1]["val_loss"]  # two losses, not one overwriting the other
    from fastflip.frameworks.trainers.data import digits

    yv = digits()[3]
    chance = float(np.bincount(yv).max() / len(yv))
    for r in res.results:
        m = read_csv(tmp_path / f"o/runs/{r['scenario']}/{r['rep']:03d}/metrics.csv")
        assert r["error"] is None
        if r["scenario"] == "msb":
            assert r["outcome"] in ("masked", "recovered", "degraded", "diverged")
            assert (r["outcome"], r["epochs_to_recovery"]) == independent_outcome(m, golden, 0.02, chance, 0.05)
        else:
            assert [(x["epoch"], x["phase"]) for x in m] == [(2, "injected"), (2, "train"), (3, "train")]
        if any(x["loss"] is not None and not np.isfinite(x["loss"]) for x in m):
            assert r["outcome"] != "masked"


@pytest.mark.framework
def test_demo_runs_and_reports(torch, tmp_path, capsys):
    from fastflip.demo import main
    from fastflip.experiment.outcomes import read_csv

    assert main([str(tmp_path / "d"), "--framework", "torch", "--repetitions", "3"]) == 0
    out = capsys.readouterr().out
    assert "control run reproduces golden exactly: True" in out
    assert "| torch | random-bits | 3 |" in out and "| torch | spare-exp-msb | 3 |" in out
    assert "| torch:random-bits vs torch:spare-exp-msb |" in out
    contrast = read_csv(tmp_path / "d/contrast.csv")
    assert [(r["a"], r["b"]) for r in contrast] == [("torch:random-bits", "torch:spare-exp-msb")]
    results = read_csv(tmp_path / "d/torch/results.csv")
    fails = {s: sum(r["outcome"] in ("degraded", "diverged", "crashed") for r in results if r["scenario"] == s)
             for s in ("random-bits", "spare-exp-msb")}
    assert (contrast[0]["a_failures"], contrast[0]["b_failures"]) == (fails["random-bits"], fails["spare-exp-msb"])
    for r in results:  # the spared scenario really never flipped bit 30
        if r["scenario"] == "spare-exp-msb":
            from fastflip.files.log import InjectionLog

            log = InjectionLog.load(tmp_path / f"d/torch/runs/spare-exp-msb/{r['rep']:03d}/injection.fflog")
            assert len(log) == 32 and all(30 not in x["bit_positions"] for x in log.records())
    assert (tmp_path / "d/torch/accuracy.png").is_file() and (tmp_path / "d/torch/results.csv").is_file()
    assert (tmp_path / "d/torch-report/index.html").is_file() and (tmp_path / "d/torch-report/accuracy.png").is_file()
    assert main([str(tmp_path / "d"), "--framework", "torch", "--repetitions", "3"]) == 0  # again: all reused
    assert capsys.readouterr().out.count("[reused]") == 7
