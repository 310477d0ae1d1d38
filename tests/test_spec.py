"""The Sampling spec (fastflip.core.spec): checked in one place, made from keywords, CLI flags and tables,
and taken by every front end with the same draws as the older keywords."""

from __future__ import annotations

import argparse
import warnings

import h5py
import numpy as np
import pytest

from fastflip import Sampling
from fastflip.cli.options import add_fault_arguments
from fastflip.core.plan import TensorRef
from fastflip.errors import OptionError
from fastflip.experiment.config import ExperimentConfig
from fastflip.files.inject import inject_file
from fastflip.live import injected, plan_for, targets


def _cli(*argv: str) -> Sampling:
    p = argparse.ArgumentParser()
    add_fault_arguments(p)
    return Sampling.from_cli(p.parse_args(list(argv)))


def test_one_spec_from_keywords_flags_and_tables() -> None:
    kw = Sampling(bits="0-22", model="adjacent:2", rate=0.01, nan_policy="avoid", replace=True)
    flags = _cli("--bits", "0-22", "--model", "adjacent:2", "--rate", "0.01", "--nan", "avoid", "--replace")
    table = Sampling.from_mapping({"bits": "0-22", "model": "adjacent:2", "rate": 0.01, "nan_policy": "avoid",
                                   "replace": True})
    assert kw == flags == table
    assert hash(kw) == hash(table)  # frozen: usable as a key
    assert _cli() == Sampling(count=1)  # the CLI's default amount
    assert _cli("--distribution", "a=1,b=3").distribution_arg == {"/a": 1.0, "/b": 3.0}


def test_sampling_of_is_the_one_place_for_sampling_or_its_shorthand() -> None:
    spec = Sampling(bits="exponent", count=2, nan_policy="avoid")
    assert Sampling.of(spec) is spec
    assert Sampling.of({"bits": "exponent", "count": 2, "nan": "avoid"}) == spec
    assert Sampling.of(bits="exponent", count=2, nan_policy="avoid", rate=None) == spec  # None: not given
    assert Sampling.of() is None
    with pytest.raises(OptionError, match="live: say what to flip"):
        Sampling.of(where="live", required=True)
    with pytest.raises(OptionError, match=r"live: give either sampling= or its fields \(replace\), not both"):
        Sampling.of(spec, where="live", replace=False)
    with pytest.raises(OptionError, match=r"live: unknown key 'nan' \(known: ber, bits, count"):
        Sampling.of(where="live", count=1, nan="avoid")
    with pytest.raises(OptionError, match="live.count must be a non-negative integer"):
        Sampling.of(where="live", count=-1)
    with pytest.raises(OptionError, match=r"cfg\.rate must be a number"):
        Sampling.of({"rate": 2.0}, where="cfg")


@pytest.mark.parametrize("bad, message", [
    ({"count": 1, "ber": 0.1}, "exactly one of count, rate or ber (got count, ber)"),
    ({}, "exactly one of count, rate or ber (got none)"),
    ({"count": -1}, "sampling.count must be a non-negative integer"),
    ({"count": 2.5}, "sampling.count must be an integer"),
    ({"rate": 1.5}, "sampling.rate must be a number in [0, 1]"),
    ({"count": 1, "bits": "zz"}, "sampling.bits"),
    ({"count": 1, "model": "melt"}, "sampling.model"),
    ({"count": 1, "nan_policy": "sometimes"}, "sampling.nan_policy must be one of allow, avoid"),
    ({"count": 1, "distribution": "layer"}, "sampling.distribution must be one of element, tensor"),
    ({"count": 1, "distribution": {"a": -1.0}}, "weights must be finite, non-negative"),
    ({"rate": 0.1, "distribution": "tensor"}, "rate draws every element with the same probability"),
    ({"count": 1, "replace": "yes"}, "sampling.replace must be true or false"),
])
def test_every_field_checked_once_with_its_name(bad: dict, message: str) -> None:
    with pytest.raises(OptionError) as exc:
        Sampling(**bad)
    assert message in str(exc.value)


def test_a_table_names_its_place_and_unknown_keys() -> None:
    with pytest.raises(OptionError, match=r"scenarios\[2\]\.count must be a non-negative integer"):
        Sampling.from_mapping({"count": -3}, where="scenarios[2]")
    with pytest.raises(OptionError, match="unknown key 'bit' \\(did you mean 'bits'\\?\\)"):
        Sampling.from_mapping({"bit": "30", "count": 1})


def _file(tmp_path) -> str:
    path = str(tmp_path / "in.h5")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["a"] = rng.normal(size=(30, 7)).astype(">f4")
        f["b"] = rng.integers(-100, 100, size=50).astype("<i2")
    return path


def test_inject_file_takes_a_spec_or_its_shorthand_keywords(tmp_path) -> None:
    src = _file(tmp_path)
    spec = Sampling(bits="exponent", model="flip", count=9)
    new = inject_file(src, str(tmp_path / "new.h5"), seed=4, sampling=spec, log_path=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shorthand is the documented form: no warning
        old = inject_file(src, str(tmp_path / "old.h5"), seed=4, bits="exponent", model="flip", count=9,
                          log_path=False)
    assert [t.name for t in new.log.plan.tensors] == [t.name for t in old.log.plan.tensors]
    assert new.log.plan.tensor.tolist() == old.log.plan.tensor.tolist()
    assert new.log.plan.index.tolist() == old.log.plan.index.tolist()
    assert new.log.plan.xor_mask.tolist() == old.log.plan.xor_mask.tolist()
    assert new.log.manifest["options"] == old.log.manifest["options"]
    as_table = inject_file(src, str(tmp_path / "t.h5"), seed=4, sampling={"bits": "exponent", "count": 9},
                           log_path=False)
    assert as_table.log.plan.index.tolist() == new.log.plan.index.tolist()
    with pytest.raises(OptionError, match="give either sampling= or its fields \\(count\\)"):
        inject_file(src, str(tmp_path / "x.h5"), sampling=spec, count=3)
    with pytest.raises(OptionError, match="inject_file: unknown key 'bit' \\(did you mean 'bits'"):
        inject_file(src, str(tmp_path / "x.h5"), bit="30", count=3)
    with pytest.raises(OptionError, match="inject_file: say what to flip"):
        inject_file(src, str(tmp_path / "x.h5"))
    with pytest.raises(OptionError, match=r"inject_file: give exactly one of count, rate or ber \(got none\)"):
        inject_file(src, str(tmp_path / "x.h5"), bits="30")


def test_the_cli_and_an_experiment_scenario_draw_what_the_spec_draws(tmp_path) -> None:
    cfg = ExperimentConfig.from_dict({"epochs": 2, "scenarios": [
        {"name": "s", "epoch": 1, "bits": "exponent-msb", "count": 4, "nan_policy": "avoid"},
        {"name": "c", "epoch": 1, "control": True}]})
    s, c = cfg.scenarios
    assert s.sampling == Sampling(bits="exponent-msb", count=4, nan_policy="avoid")
    assert c.sampling == Sampling(bits="exponent-msb", count=0) and c.inject_kwargs()["sampling"] is None
    with pytest.raises(OptionError, match=r"scenarios\[0\]\.nan_policy"):
        ExperimentConfig.from_dict({"epochs": 1, "scenarios": [{"name": "s", "epoch": 1, "count": 1,
                                                                "nan_policy": "never"}]})


def test_live_api_takes_the_spec() -> None:
    w = {"w": np.arange(40, dtype=np.float32), "v": np.ones(9, ">f8")}
    spec = Sampling(bits="sign", count=5)
    a = plan_for(targets(w), seed=8, sampling=spec)
    b = plan_for(targets(w), seed=8, bits="sign", count=5)
    assert a.tensor.tolist() == b.tensor.tolist() and a.index.tolist() == b.index.tolist()
    with injected(w, seed=8, sampling=spec) as log:
        assert log.plan.index.tolist() == a.index.tolist()
    assert w["w"].tolist() == list(range(40))
    with pytest.raises(OptionError, match="not both"):
        plan_for(targets(w), seed=1, sampling=spec, count=2)


def test_a_campaign_cell_is_a_spec() -> None:
    from fastflip.campaign.cells import Cell

    cell = Cell(bits="30", group_by="none", group=None, tensors=("/w",), flips=2, fault="stuck-at-1", epoch=None,
                population=10)
    spec = cell.sampling_spec()
    assert (spec.bits, spec.model, spec.count) == ("30", "stuck-at-1", 2)
    plan = spec.plan([TensorRef("/w", "<f4", (10,))], seed=1)
    assert len(plan) == 2 and set(plan.or_mask.tolist()) == {1 << 30}


def test_no_warning_on_the_new_path(tmp_path) -> None:
    src = _file(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inject_file(src, str(tmp_path / "o.h5"), seed=1, sampling=Sampling(count=2), log_path=False)
