"""Live targets never write into a storage the model no longer holds; a plan that was applied stays the plan
its log describes."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from conftest import require
from fastflip import live
from fastflip.core.plan import Plan, TensorRef
from fastflip.core.spec import Sampling
from fastflip.errors import LogMismatchError, StaleTargetError

SIGN = 1 << 31


def _plan(name: str, shape: tuple[int, ...], index: int = 0) -> Plan:
    return Plan.from_sites([TensorRef(name, "<f4", shape)], [0], [index], xor_mask=[SIGN])


# ---------------------------------------------------------------------------------- NumPy mappings


def test_numpy_array_replaced_in_the_mapping_is_refused_and_neither_array_changes():
    d = {"w": np.ones(4, np.float32)}
    tg = live.targets(d)
    plan = _plan("w", (4,))
    live.revert(tg, live.inject(tg, plan))  # prepared and cached while the targets are fresh
    old = d["w"]
    d["w"] = np.full(4, 2.0, np.float32)
    with pytest.raises(StaleTargetError, match=r"tensor 'w' .*rebuild"):
        live.inject(tg, plan)
    assert old.tolist() == [1.0] * 4 and d["w"].tolist() == [2.0] * 4
    tg = live.targets(d)  # rebuilt: the new array
    with live.injected(tg, plan):
        assert d["w"][0] == -2.0
    assert d["w"].tolist() == [2.0] * 4


def test_revert_after_a_replacement_is_refused_before_reading_anything():
    d = {"w": np.ones(4, np.float32)}
    tg = live.targets(d)
    log = live.inject(tg, _plan("w", (4,), 2))
    del d["w"]
    with pytest.raises(StaleTargetError, match="'w' is gone"):
        live.revert(tg, log)


# ---------------------------------------------------------------------------------- PyTorch


def _linear():
    torch = require("torch")
    torch.manual_seed(0)
    return torch, torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _replace_data(torch, m):
    m[0].weight.data = torch.zeros(3, 4)


def _assign_state(torch, m):
    m.load_state_dict({k: torch.zeros_like(v) for k, v in m.state_dict().items()}, assign=True)


def _half(torch, m):
    m.half()


def _to_double(torch, m):
    m.to(torch.float64)


def _new_submodule(torch, m):
    m[0] = torch.nn.Linear(4, 3)


@pytest.mark.framework
@pytest.mark.parametrize("replace", [_replace_data, _assign_state, _half, _to_double, _new_submodule])
def test_torch_storage_replacement_is_refused_and_nothing_is_written(replace):
    torch, m = _linear()
    tg = live.targets(m)
    plan = _plan("0.weight", (3, 4), 5)
    live.revert(tg, live.inject(tg, plan))
    old = tg.get("0.weight").obj.clone()
    replace(torch, m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(StaleTargetError, match=r"'0\.weight'.*rebuild"):
        live.inject(tg, plan)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert torch.equal(tg.get("0.weight").obj, old)  # the storage the targets were built on is untouched too


@pytest.mark.framework
def test_torch_in_place_updates_keep_targets_valid():
    torch, m = _linear()
    tg = live.targets(m)
    plan = _plan("0.weight", (3, 4), 5)
    with torch.no_grad():
        m[0].weight.add_(1.0)  # a training step: same storage
        m.load_state_dict(m.state_dict())  # copy_ in place
    want = m[0].weight.detach().reshape(-1)[5].item()
    with live.injected(tg, plan):
        assert m[0].weight.detach().reshape(-1)[5].item() == -want


@pytest.mark.framework
def test_torch_tensor_in_a_mapping_given_new_data_is_refused():
    torch = require("torch")
    w = torch.ones(4)
    tg = live.targets({"w": w})
    w.data = torch.zeros(4)  # the same tensor object, another storage (the old one is freed)
    with pytest.raises(StaleTargetError):
        live.inject(tg, _plan("w", (4,)))
    assert w.tolist() == [0.0] * 4


@pytest.mark.framework
def test_optimizer_state_replaced_by_load_state_dict_is_refused():
    torch, m = _linear()
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 4)).sum().backward()
    opt.step()
    tg = live.targets(m, optimizer=opt)
    name = "optimizer/0.weight/exp_avg"
    plan = _plan(name, (3, 4), 1)
    live.revert(tg, live.inject(tg, plan))
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # new state tensors
    with pytest.raises(StaleTargetError, match="exp_avg"):
        live.inject(tg, plan)


# ---------------------------------------------------------------------------------- plans


def test_plan_columns_are_read_only():
    plan = _plan("w", (4,))
    for col in (plan.tensor, plan.index, plan.and_mask, plan.or_mask, plan.xor_mask, plan.bits):
        assert not col.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            col[0] = 1


def test_a_plan_copies_a_view_of_memory_the_caller_can_still_write():
    idx = np.array([9, 0, 1], np.int64)
    plan = Plan((TensorRef("w", "<f4", (4,)),), np.zeros(2, np.int32), idx[1:], np.full(2, ~np.uint64(0)),
                np.zeros(2, np.uint64), np.array([SIGN, SIGN], np.uint64))
    idx[1] = 3
    assert plan.index.tolist() == [0, 1] and idx.flags.writeable


def test_a_changed_plan_index_flips_the_site_it_logs():
    """The prepared-plan cache is keyed on the plan's very columns: a column replaced after a first use
    is prepared again, so the element flipped is the one the log names."""
    w = np.arange(1, 5, dtype=np.float32)
    tg = live.targets({"w": w})
    plan = _plan("w", (4,), 0)
    live.revert(tg, live.inject(tg, plan))
    plan.index = np.array([3], np.int64)
    log = live.inject(tg, plan)
    assert log.plan.index.tolist() == [3]
    assert w.tolist() == [1.0, 2.0, 3.0, -4.0]
    live.revert(tg, log)
    assert w.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_plan_changed_between_inject_and_revert_is_refused_by_revert():
    w = np.arange(1, 5, dtype=np.float32)
    tg = live.targets({"w": w})
    plan = _plan("w", (4,), 0)
    log = live.inject(tg, plan)
    log.plan = dataclasses.replace(plan, index=np.array([2], np.int64))
    with pytest.raises(LogMismatchError):
        live.revert(tg, log)
    assert w.tolist() == [-1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("count", [1, 3, 40])
def test_the_per_trial_path_checks_storage_too(count):
    """Plans of a few sites take a lean preparation path (live.targets._prepare_small); it carries the same
    storage checks as the general one, for any plan size."""
    torch = require("torch")
    from fastflip import SiteSpace

    net = torch.nn.Linear(16, 16)
    tg = live.targets(net)
    plan = SiteSpace(tg.refs(), bits=30).plan(Sampling(count=count), seed=1, stream=(0,))
    live.revert(tg, live.inject(tg, plan))  # prepared and cached while fresh
    before = net.weight.detach().clone()
    net.weight.data = before.clone()
    with pytest.raises(StaleTargetError):
        live.inject(tg, plan)
    assert torch.equal(net.weight.detach(), before)
