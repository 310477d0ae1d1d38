"""Cost of the experiment's checkpoint handling next to the training it drives (digits CNN, Keras and PyTorch).

An experiment adds, per faulty run, one injection (copy of the epoch-E checkpoint,
10 flips, log written) and one checkpoint load; the golden run adds one checkpoint
save per epoch. Compare those with one training epoch (train + evaluate).

Run: ``pytest bench/bench_experiment.py --benchmark-only --benchmark-columns=min,median,max,rounds``.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

FRAMEWORKS = ("keras", "torch")


@pytest.fixture(scope="module", params=FRAMEWORKS)
def setup(request: Any, tmp_path_factory: Any) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    pytest.importorskip("keras" if request.param == "keras" else "torch")
    from fastflip.frameworks.trainers import make_trainer

    trainer = make_trainer({"framework": request.param}, seed=0)
    trainer.build()
    trainer.train_epoch(1)  # warm up (graph tracing, allocations)
    d = Path(tmp_path_factory.mktemp(request.param))
    ck = d / f"ck{trainer.checkpoint_suffix}"
    trainer.save_checkpoint(ck)
    return {"trainer": trainer, "dir": d, "ck": ck, "epochs": itertools.count(2)}


def test_train_one_epoch(benchmark: Any, setup: dict[str, Any]) -> None:
    t = setup["trainer"]
    benchmark.pedantic(lambda: (t.train_epoch(next(setup["epochs"])), t.evaluate()), rounds=5, iterations=1)


def test_save_checkpoint(benchmark: Any, setup: dict[str, Any]) -> None:
    t = setup["trainer"]
    out = setup["dir"] / f"save{t.checkpoint_suffix}"
    benchmark.pedantic(lambda: t.save_checkpoint(out), rounds=10, iterations=1)


def test_inject_checkpoint(benchmark: Any, setup: dict[str, Any]) -> None:
    from fastflip.experiment.runner import inject_checkpoint
    from fastflip.experiment.config import ExperimentConfig

    t = setup["trainer"]
    cfg = ExperimentConfig.from_dict({"epochs": 5, "scenarios": [
        {"name": "w", "epoch": 2, "count": 10, "bits": "exponent-msb", "selection": {"roles": ["weight", "bias"]}}]})
    sc = cfg.scenarios[0]
    seeds = itertools.count(1)
    out = setup["dir"] / f"alt{t.checkpoint_suffix}"
    log = setup["dir"] / "alt.fflog"
    benchmark.pedantic(lambda: inject_checkpoint(setup["ck"], out, sc, next(seeds), log), rounds=10, iterations=1)


def test_load_checkpoint(benchmark: Any, setup: dict[str, Any]) -> None:
    t = setup["trainer"]
    benchmark.pedantic(lambda: t.load_checkpoint(setup["ck"]), rounds=10, iterations=1)
