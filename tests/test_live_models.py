"""Live injection into models as users write them: subclasses, nesting, BatchNorm, tied weights, optimizers, Keras.

Every injection is checked against an independent computation: the expected words
are computed here with NumPy on copies taken before the injection (the plan's word
rule ``((old & and) | or) ^ xor`` written out, not fastflip's kernels), and every
revert must give back the original bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip import live
from fastflip.errors import BitRangeError, LogMismatchError, OptionError, PlanMismatchError, SelectionError
from fastflip.files.select import Selection
from fastflip.core.spec import Sampling
from user_models import keras_subclassed, torch_classes

pytestmark = pytest.mark.framework
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def snapshot(named: dict) -> dict[str, np.ndarray]:
    """Raw bytes of every tensor, as NumPy arrays (copies)."""
    out = {}
    for k, v in named.items():
        a = v.detach().cpu() if hasattr(v, "detach") else v
        a = np.array(a.numpy() if hasattr(a, "numpy") else a, copy=True)
        out[k] = a
    return out


def expected_after(before: dict[str, np.ndarray], log: live.LiveLog, name_of) -> dict[str, np.ndarray]:
    """Apply the plan's masks to copies with NumPy, site by site (independent of fastflip's kernels)."""
    out = {k: v.copy() for k, v in before.items()}
    p = log.plan
    for i in range(len(p)):
        name = name_of(p.tensors[int(p.tensor[i])].name)
        a = out[name]
        words = a.reshape(-1).view(UINT[a.dtype.itemsize])
        old = int(words[int(p.index[i])])
        new = ((old & int(p.and_mask[i])) | int(p.or_mask[i])) ^ int(p.xor_mask[i])
        new &= (1 << (8 * a.dtype.itemsize)) - 1
        assert old == int(log.old_words[i]) and new == int(log.new_words[i])
        words[int(p.index[i])] = new
    return out


def state_bytes(model) -> dict[str, bytes]:
    return {k: v.detach().cpu().numpy().tobytes() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------ PyTorch subclasses


def test_user_subclass_with_nested_blocks_and_batchnorm_readme_snippet() -> None:
    torch = require("torch")
    torch.manual_seed(0)
    net = torch_classes()["Net"]()
    net(torch.randn(4, 3, 8, 8))  # a training-mode forward: num_batches_tracked becomes 1
    tg = live.targets(net)
    state = net.state_dict()
    assert sorted(t.name for t in tg.tensors) == sorted(state)  # the framework's own names
    by = {t.name: t for t in tg.tensors}
    assert by["blocks.1.bn.num_batches_tracked"].role == "step-counter"
    assert by["blocks.1.bn.num_batches_tracked"].dtype == np.dtype("int64")
    assert by["blocks.0.bn.running_var"].role == "bn-statistic" and by["blocks.0.conv.weight"].role == "weight"
    assert by["fc.bias"].role == "bias" and by["blocks.0.bn.weight"].layer == "blocks.0.bn"
    before = snapshot(state)
    # the README's snippet: BatchNorm's int64 counters have no exponent, so they are left out (and said so)
    with fastflip.injected(net, seed=1, count=40, bits="exponent-msb") as log:
        assert sorted(log.plan.meta["left_out"]["tensors"]) == sorted(k for k in state if "num_batches" in k)
        assert {p.name for p in log.plan.tensors} == {k for k in state if state[k].is_floating_point()}
        assert log.changed == len(log) == 40 and log.seed == 1
        assert all(int(b) == 1 << 30 for b in log.plan.bits)  # float32 exponent MSB, nothing else
        want = expected_after(before, log, lambda n: n)
        for k, v in net.state_dict().items():
            assert v.numpy().tobytes() == want[k].tobytes(), k
    assert state_bytes(net) == {k: v.tobytes() for k, v in before.items()}


def test_campaign_style_factory_model_and_checkpoint_plan_apply_to_a_subclass(tmp_path) -> None:
    torch = require("torch")
    from fastflip.files.inject import inject_file
    from fastflip.frameworks.torch_state import load_checkpoint, save_checkpoint

    torch.manual_seed(1)
    Net = torch_classes()["Net"]
    net = Net()
    save_checkpoint(tmp_path / "m.h5", net)
    res = inject_file(tmp_path / "m.h5", tmp_path / "f.h5", seed=4, count=25, selection=Selection(dtypes=["float"]),
                      log_path=False)
    faulty = Net()
    load_checkpoint(tmp_path / "f.h5", faulty)
    before = state_bytes(net)
    log = live.inject(net, res.log.plan)  # the file's plan names /model/<key>: the aliases reach the tensors
    assert log.new_words.tolist() == res.log.new_words.tolist()
    assert state_bytes(net) == state_bytes(faulty)
    live.revert(net, log)
    assert state_bytes(net) == before


def test_resnet18_shaped_selection_by_layer_role_regex_and_dtype() -> None:
    torch = require("torch")
    torch.manual_seed(2)
    net = torch_classes()["ResNet18"](width=8, classes=10)
    names = [t.name for t in live.targets(net).tensors]
    assert "layer4.1.conv2.weight" in names and "layer2.0.downsample.1.running_mean" in names
    before = snapshot(net.state_dict())
    sel = fastflip.Selection(layers=["layer4.*"], roles=["weight"])
    with fastflip.injected(net, seed=3, count=30, selection=sel) as log:
        hit = {log.plan.tensors[int(j)].name for j in log.plan.tensor}
        assert hit and all(n.startswith("layer4.") and n.endswith("weight") for n in hit)
        assert not any(".bn" in n or "downsample.1" in n for n in hit)  # BatchNorm's gamma is a weight of a bn layer
        want = expected_after(before, log, lambda n: n)
        for k, v in net.state_dict().items():
            assert v.numpy().tobytes() == want[k].tobytes(), k
    assert state_bytes(net) == {k: v.tobytes() for k, v in before.items()}
    # the same selection given as keywords, as a mapping, and with the CLI's regex/dtype/exclude meaning
    with fastflip.injected(net, seed=3, count=30, layers=["layer4.*"], roles=["weight"]) as log2:
        assert log2.plan.index.tolist() == log.plan.index.tolist()
    with fastflip.injected(net, seed=5, count=10, selection={"regex": [r"^/layer1\.0\."], "exclude": ["*bn*"],
                                                            "dtypes": ["float32"]}) as log3:
        assert all(n.startswith("layer1.0.") and "bn" not in n for n in (t.name for t in log3.plan.tensors))
    with fastflip.injected(net, seed=5, count=4, include=["model/fc.*"]) as log4:  # checkpoint paths match too
        assert {t.name for t in log4.plan.tensors} == {"fc.weight", "fc.bias"}


def test_tied_embedding_is_one_site_space_and_reverts_exactly() -> None:
    torch = require("torch")
    torch.manual_seed(3)
    lm = torch_classes()["TinyLM"]()
    tg = live.targets(lm)
    emb = tg.get("lm_head.weight")
    assert emb.name == "embed.weight" and emb.aliases == ("model/embed.weight", "lm_head.weight", "model/lm_head.weight")
    assert [r.name for r in tg.refs()].count("embed.weight") == 1 and "lm_head.weight" not in [r.name for r in tg.refs()]
    n_elements = sum(p.numel() for p in lm.parameters())  # parameters() lists the tied weight once
    with fastflip.injected(lm, seed=0, rate=1.0, model="zero") as log:  # every element once: no double weight
        assert len(log) == n_elements
    ids = torch.tensor([[1, 2, 3]])
    clean = lm(ids).detach().clone()
    plan = live.site(lm, "lm_head.weight", (2, 5), bits=30)  # addressed through the tied name
    w0 = lm.embed.weight.detach().numpy().copy()
    with fastflip.injected(lm, plan) as log:
        want = w0.copy()
        want.reshape(-1).view(np.uint32)[2 * 16 + 5] ^= 1 << 30
        assert lm.embed.weight.detach().numpy().tobytes() == want.tobytes()
        assert lm.lm_head.weight.detach().numpy().tobytes() == want.tobytes()  # the same storage
        assert not torch.equal(lm(ids), clean)
    assert lm.embed.weight.detach().numpy().tobytes() == w0.tobytes() and torch.equal(lm(ids), clean)
    from fastflip.core.plan import Plan, TensorRef

    refs = [TensorRef("embed.weight", "<f4", (50, 16)), TensorRef("lm_head.weight", "<f4", (50, 16))]
    twice = Plan.from_sites(refs, [0, 1], [7, 7], xor_mask=[1, 2])  # one element under both names
    with pytest.raises(PlanMismatchError, match="twice"):
        live.inject(lm, twice)
    assert lm.embed.weight.detach().numpy().tobytes() == w0.tobytes()


def test_views_of_a_parameter_are_one_storage() -> None:
    torch = require("torch")

    class WithView(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(3, 4))
            self.register_buffer("row1", self.weight.data[1], persistent=False)  # a view into the parameter

    m = WithView()
    tg = live.targets(m)
    assert tg.get("row1").view_of == "weight" and [r.name for r in tg.refs()] == ["weight"]
    before = m.weight.detach().numpy().copy()
    with fastflip.injected(m, live.site(m, "row1", 2, bits="sign")):
        want = before.copy()
        want[1, 2] = -want[1, 2]
        assert m.weight.detach().numpy().tobytes() == want.tobytes()
    assert m.weight.detach().numpy().tobytes() == before.tobytes()
    both = live.site(m, [("row1", 0, 0), ("weight", (1, 0), 1)])  # the same stored element twice
    with pytest.raises(PlanMismatchError, match="twice"):
        live.inject(m, both)


def test_torch_optimizer_state_when_asked() -> None:
    torch = require("torch")
    torch.manual_seed(4)
    net = torch_classes()["Net"]()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    assert not any(t.name.startswith("optimizer/") for t in live.targets(net).tensors)
    tg = live.targets(net, optimizer=opt)
    by = {t.name: t for t in tg.tensors}
    assert by["optimizer/fc.weight/exp_avg"].role == "optimizer-moment"
    assert by["optimizer/fc.weight/exp_avg"].layer == "fc"
    assert by["optimizer/fc.weight/step"].role == "step-counter"
    ids = [p for g in opt.param_groups for p in g["params"]]
    k = next(i for i, p in enumerate(ids) if p is net.fc.weight)
    assert f"optimizer/state/{k}/exp_avg_sq" in by["optimizer/fc.weight/exp_avg_sq"].aliases
    state = {f"optimizer/{n}/{k}": v for n, p in (("fc.weight", net.fc.weight), ("fc.bias", net.fc.bias))
             for k, v in opt.state[p].items() if k != "step"}
    before = snapshot(state)
    with fastflip.injected(net, optimizer=opt, seed=2, count=12, roles=["optimizer"], layers=["fc"]) as log:
        assert {t.name for t in log.plan.tensors} == set(state)
        want = expected_after(before, log, lambda n: n)
        for k, v in state.items():
            assert v.numpy().tobytes() == want[k].tobytes(), k
    assert snapshot(state).keys() == before.keys()
    for k, v in state.items():
        assert v.numpy().tobytes() == before[k].tobytes(), k


def test_seed_left_out_is_drawn_and_recorded() -> None:
    torch = require("torch")
    net = torch_classes()["Net"]()
    before = state_bytes(net)
    with fastflip.injected(net, count=3) as log:
        seed = log.seed
        assert isinstance(seed, int) and seed >= 0 and log.to_dict()["meta"]["seed"] == seed
        after = state_bytes(net)
    with fastflip.injected(net, count=3, seed=seed) as again:  # the recorded seed replays the trial
        assert again.plan.index.tolist() == log.plan.index.tolist() and state_bytes(net) == after
    assert state_bytes(net) == before


def test_explicit_site_like_pytorchfi_layer_dim_addressing() -> None:
    torch = require("torch")
    torch.manual_seed(5)
    net = torch_classes()["ResNet18"](width=8, classes=10)
    w = net.layer4[1].conv2.weight.detach()
    v0 = float(w[0, 3, 1, 1])
    plan = fastflip.site(net, "layer4.1.conv2.weight", (0, 3, 1, 1), bits=30)
    with fastflip.injected(net, plan):
        expect = np.array([v0], np.float32).view(np.uint32) ^ np.uint32(1 << 30)
        assert np.array([float(w[0, 3, 1, 1])], np.float32).view(np.uint32)[0] == expect[0]
    assert float(w[0, 3, 1, 1]) == v0
    with fastflip.injected(net, fastflip.site(net, "layer4.1.conv2.weight", (0, 3, 1, 1), value=10000.0)):
        assert float(w[0, 3, 1, 1]) == 10000.0  # PyTorchFI's value= form
    assert float(w[0, 3, 1, 1]) == v0
    with pytest.raises(PlanMismatchError, match="dimension 1"):
        fastflip.site(net, "layer4.1.conv2.weight", (0, 99, 1, 1), bits=30)
    with pytest.raises(fastflip.FastflipError, match="layer4.1.conv2.weight"):
        fastflip.site(net, "layer4.1.conv9.weight", 0, bits=30)


# ------------------------------------------------------------------------ bad input


def test_bad_input_gives_one_line_errors_and_changes_nothing() -> None:
    torch = require("torch")
    with pytest.raises(SelectionError, match="no tensors"):
        live.targets(torch.nn.ReLU())
    with pytest.raises(OptionError, match="cannot find tensors in a object"):
        live.targets(object())
    net = torch_classes()["Net"]()
    before = state_bytes(net)
    with pytest.raises(SelectionError, match=r"matched no tensor; available: .*layers: blocks\.0\.bn, .*stem"):
        with fastflip.injected(net, seed=1, count=1, layers=["encoder.*"]):
            pass
    with pytest.raises(BitRangeError, match=r"num_batches_tracked \(int64\).*--dtype float"):
        with fastflip.injected(net, seed=1, count=1, bits="exponent", roles=["step-counter"]):
            pass
    with pytest.raises(OptionError, match="unknown key 'layer' \\(did you mean 'layers'"):
        with fastflip.injected(net, seed=1, count=1, layer=["fc"]):
            pass
    assert state_bytes(net) == before
    # a revert after the user changed a faulted element: refused, naming it, nothing reverted
    log = live.inject(net, fastflip.site(net, [("fc.weight", 0, 30), ("stem.bias", 1, 30)]))
    faulty = state_bytes(net)
    with torch.no_grad():
        net.stem.bias[1] = 0.25
    with pytest.raises(LogMismatchError, match=r"stem\.bias\[1\]"):
        live.revert(net, log)
    assert state_bytes(net)["fc.weight"] == faulty["fc.weight"]  # not half-reverted


# ------------------------------------------------------------------------ Keras


def test_keras_subclassed_model_names_roles_injection_and_revert() -> None:
    require("keras")
    model = keras_subclassed()
    tg = live.targets(model, include_optimizer=True)
    by = {t.name: t for t in tg.tensors}
    assert {"hidden/kernel", "hidden/bias", "block/inner/kernel", "block/bn/moving_mean", "out/kernel"} <= set(by)
    assert by["hidden/kernel"].role == "weight" and by["block/bn/moving_variance"].role == "bn-statistic"
    assert by["block/inner/kernel"].layer == "block/inner"
    assert by["optimizer/iteration"].role == "step-counter" and by["optimizer/iteration"].dtype == np.dtype("int64")
    moment = [t for t in tg.tensors if t.role == "optimizer-moment"]
    assert moment and {t.layer for t in moment} == {"hidden", "block/inner", "block/bn", "out"}
    variables = {v.path: v for v in model.weights}
    before = {k: np.array(v.numpy()) for k, v in variables.items()}
    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    clean = model.predict(x, verbose=0)
    with fastflip.injected(model, seed=6, count=15, roles=["weight"], bits="exponent-msb") as log:
        assert all(by[t.name].role == "weight" for t in log.plan.tensors)
        want = expected_after(before, log, lambda n: f"classifier/{n}" if f"classifier/{n}" in before else n)
        for k, v in variables.items():
            assert np.array(v.numpy()).tobytes() == want[k].tobytes(), k
        assert not np.array_equal(model.predict(x, verbose=0), clean)
    for k, v in variables.items():
        assert np.array(v.numpy()).tobytes() == before[k].tobytes(), k
    assert np.array_equal(model.predict(x, verbose=0), clean)


def test_keras_campaign_roles_match(tmp_path) -> None:
    """``roles = ["weight"]`` in a campaign over a Keras factory matches the kernels (it matched nothing before)."""
    require("keras")
    from fastflip.campaign.cells import target_tensors
    from test_campaign import make

    c = make(target={"factory": "user_models:keras_subclassed"}, select={"roles": ["weight"]})
    names = {t.path for t in target_tensors(c)}
    assert {"hidden/kernel", "block/inner/kernel", "out/kernel", "block/bn/gamma"} == names


# ------------------------------------------------------------------------ files: --bits exponent-msb


def test_cli_exponent_msb_on_keras_file_with_int64_iteration(tmp_path) -> None:
    keras = require("keras")
    h5py = require("h5py")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(2, name="out")])
    model.compile("adam", "mse")
    model.fit(np.zeros((8, 4), "f4"), np.zeros((8, 2), "f4"), verbose=0)
    src = tmp_path / "model.h5"
    model.save(src)  # legacy HDF5: model_weights/... and optimizer_weights/.../iteration:0 (int64)
    with h5py.File(src, "r") as f:
        ints = []
        f.visititems(lambda n, o: ints.append(n) if isinstance(o, h5py.Dataset) and o.dtype.kind == "i" else None)
    assert ints and any("iteration" in n for n in ints)
    out = tmp_path / "faulty.h5"
    r = subprocess.run([sys.executable, "-m", "fastflip", "inject", str(src), "-o", str(out), "--bits", "exponent-msb",
                        "--count", "5", "--seed", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "left out 1 tensor(s) without exponent-msb" in r.stdout and "iteration" in r.stdout
    from fastflip.files.log import InjectionLog

    log = InjectionLog.load(str(out) + ".fflog")
    assert all(np.dtype(t.dtype).kind == "f" for t in log.plan.tensors) and len(log.old_words) == 5
    with h5py.File(src, "r") as a, h5py.File(out, "r") as b:
        for i in range(5):
            path = log.plan.tensors[int(log.plan.tensor[i])].name
            old = np.asarray(a[path][()]).reshape(-1).view(np.uint32)[int(log.plan.index[i])]
            new = np.asarray(b[path][()]).reshape(-1).view(np.uint32)[int(log.plan.index[i])]
            assert int(old) ^ int(new) == 1 << 30
    only_ints = subprocess.run([sys.executable, "-m", "fastflip", "inject", str(src), "-o", str(tmp_path / "x.h5"),
                                "--bits", "exponent-msb", "--dtype", "int", "--seed", "3"], capture_output=True, text=True)
    assert only_ints.returncode != 0 and len(only_ints.stderr.strip().splitlines()) == 1
    assert "iteration" in only_ints.stderr and "--dtype float" in only_ints.stderr and not (tmp_path / "x.h5").exists()


def test_sitespace_and_inject_file_leave_out_fieldless_tensors(tmp_path) -> None:
    from fastflip.core.plan import TensorRef
    from fastflip.core.sampling import SiteSpace

    space = SiteSpace([TensorRef("w", "<f4", (10,)), TensorRef("n", "<i8", ()), TensorRef("h", "<f2", (4,))],
                      bits="exponent-msb")
    assert [t.name for t in space.tensors] == ["w", "h"] and space.left_out["tensors"] == ["n"]
    plan = space.plan(Sampling(count=14), seed=0)
    assert {hex(int(b)) for b, t in zip(plan.bits, plan.tensor)} == {"0x40000000", "0x4000"}
    assert SiteSpace([TensorRef("n", "<i8", ())], bits="sign").tensors[0].name == "n"  # signed ints have a sign
    with pytest.raises(BitRangeError, match=r"u \(uint8\)"):
        SiteSpace([TensorRef("u", "|u1", (3,))], bits="sign")


def test_campaign_cells_with_named_fields_leave_out_int_counters() -> None:
    require("torch")
    from fastflip.campaign.sweep import campaign_cells
    from test_campaign import make

    c = make(target={"factory": "user_models:torch_net"}, cells={"bits": ["exponent-msb", "0"], "group_by": "tensor"})
    cells = campaign_cells(c)
    msb = {x.group for x in cells if x.bits == "exponent-msb"}
    lsb = {x.group for x in cells if x.bits == "0"}
    assert "blocks.0.bn.num_batches_tracked" in lsb and not any("num_batches" in g for g in msb)
    assert msb == {g for g in lsb if "num_batches" not in g}


def test_campaign_sweep_over_a_subclass_factory(tmp_path) -> None:
    torch = require("torch")
    from fastflip.campaign.sweep import campaign_cells, sweep
    from fastflip.campaign.trials import TrialRunner
    from test_campaign import make

    c = make(target={"factory": "user_models:torch_net"}, cells={"bits": ["exponent-msb"], "group_by": "layer"},
             evaluator={"function": "user_models:evaluate_net", "critical": 0.05}, trials={"per_cell": 4})
    cells = campaign_cells(c)
    assert {x.group for x in cells} == {"stem", "blocks.0.conv", "blocks.0.bn", "blocks.1.conv", "blocks.1.bn", "fc"}
    runner = TrialRunner(c, cells)
    model = runner.targets[None]
    before = state_bytes(model)
    rows = [runner.run(cid, t) for cid in range(len(cells)) for t in range(4)]
    assert len(rows) == 24 and state_bytes(model) == before  # every trial reverted
    res = sweep(c, str(tmp_path / "t.db"), workers=0, progress=False)
    assert res.complete and res.stored == 24


def test_tensors_that_cannot_be_injected_are_named_not_skipped_silently() -> None:
    torch = require("torch")
    m = torch.nn.Linear(2, 2)
    m.register_buffer("phase", torch.zeros(3, dtype=torch.complex64))
    with pytest.warns(UserWarning, match=r"1 tensor\(s\) left out: tensor 'phase' has dtype torch.complex64"):
        tg = live.targets(m)
    assert tg.skipped == ["phase"] and {t.name for t in tg.tensors} == {"weight", "bias"}


def test_select_takes_live_refs() -> None:
    torch = require("torch")
    from fastflip.files.select import select

    net = torch_classes()["Net"]()
    refs = fastflip.tensor_refs(net)
    got = select(refs, Selection(roles=["weight"], layers=["blocks.*"]))
    assert [r.name for r in got] == ["blocks.0.bn.weight", "blocks.0.conv.weight", "blocks.1.bn.weight",
                                     "blocks.1.conv.weight"]
    assert [r.name for r in fastflip.tensor_refs(net, {"roles": ["step-counter"]})] == [
        "blocks.0.bn.num_batches_tracked", "blocks.1.bn.num_batches_tracked"]
    with pytest.raises(SelectionError, match="layers: blocks.0.bn"):
        select(refs, Selection(layers=["decoder*"]))


@pytest.mark.extra("keras")
def test_keras_subclassed_aliases_are_the_paths_keras_writes(tmp_path) -> None:
    """Names are Keras's public ``variable.path``; each alias is the dataset ``model.save_weights`` writes for
    that variable (read back from the file Keras wrote, optimizer included), on a subclassed model with a
    nested custom layer and BatchNorm."""
    h5py = require("h5py")
    model = keras_subclassed()
    path = tmp_path / "m.weights.h5"
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        stored: dict[str, np.ndarray] = {}
        f.visititems(lambda n, o: stored.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    tg = live.targets(model, include_optimizer=True)
    # the model's own name prefix (``classifier/``) is dropped, as for a functional model's layers
    assert [t.name for t in tg.tensors][: len(model.weights)] == [v.path.removeprefix("classifier/") for v in model.weights]
    aliased = [t for t in tg.tensors if t.aliases]
    assert {t.aliases[0] for t in aliased} == set(stored)  # every dataset of the file reaches one variable
    for t in aliased:
        assert np.asarray(t.obj.numpy()).tobytes() == stored[t.aliases[0]].tobytes(), (t.name, t.aliases[0])
    by_alias = {t.aliases[0]: t for t in aliased}
    kernel = next(t for t in aliased if t.name == "block/inner/kernel")
    with fastflip.injected(model, fastflip.site(model, kernel.aliases[0], (0, 0), bits=30)):
        assert np.asarray(by_alias[kernel.aliases[0]].obj.numpy())[0, 0] != stored[kernel.aliases[0]][0, 0]
    assert np.asarray(kernel.obj.numpy()).tobytes() == stored[kernel.aliases[0]].tobytes()
