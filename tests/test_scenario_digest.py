"""A scenario holds its sampling as a Sampling; its digest (what an experiment resumes by) is unchanged."""

from __future__ import annotations

from fastflip.core.spec import Sampling
from fastflip.experiment.config import ExperimentConfig

CONFIG = {"epochs": 4, "scenarios": [
    {"name": "exp", "epoch": 2, "bits": "exponent-msb", "count": 10, "selection": {"roles": ["weight"]}},
    {"name": "mid", "at": {"epoch": 3, "iteration": 5}, "bits": 30, "rate": 0.001, "model": "stuck-at-1",
     "nan_policy": "avoid"},
    {"name": "b", "epoch": 1, "ber": 1e-6, "sign_first": True, "bits": "1-8", "distribution": "element"},
    {"name": "ctl", "epoch": 2, "control": True, "repetitions": 1}]}

# Obtained by running the code of commit 7d6d68a (Scenario with flat bits/model/count/rate/ber/... fields) on CONFIG:
#   ExperimentConfig.from_dict(CONFIG).scenarios[i].digest()
DIGESTS_BEFORE = {"exp": "20dd12a5f25f1519", "mid": "a2224c4412125484", "b": "dbe7d750ef07dd68",
                  "ctl": "98b35700526f57c8"}


def test_scenario_digests_are_the_ones_computed_before():
    """Experiments written before keep resuming: the digest is computed from the same flat table."""
    cfg = ExperimentConfig.from_dict(CONFIG)
    assert {sc.name: sc.digest() for sc in cfg.scenarios} == DIGESTS_BEFORE


def test_scenario_holds_a_sampling():
    exp, mid, b, ctl = ExperimentConfig.from_dict(CONFIG).scenarios
    assert exp.sampling == Sampling(bits="exponent-msb", count=10)
    assert mid.sampling == Sampling(bits="30", rate=0.001, model="stuck-at-1", nan_policy="avoid")
    assert b.sampling.sign_first and b.sampling.ber == 1e-6
    assert ctl.control and ctl.sampling.count == 0 and ctl.inject_kwargs()["sampling"] is None  # flips nothing
    assert exp.inject_kwargs() == {"selection": {"roles": ["weight"]}, "sampling": exp.sampling}
    assert not hasattr(exp, "count") and not hasattr(exp, "bits")  # one form: the Sampling
    table = ctl.as_dict()
    assert table["count"] is None and table["bits"] == "exponent-msb" and table["control"]
