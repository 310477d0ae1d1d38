"""Activation (neuron) faults in PyTorch models as users write them.

Exactness: every faulted output is compared with the pure-NumPy reference applied to
the golden (fault-free) output, with the plan regenerated independently from
(seed, sample); flips are also checked with plain NumPy XOR.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fastflip
from act_models import resnet18, small_net
from conftest import require
from fastflip.errors import BitRangeError, FastflipError, OptionError, SelectionError
from fastflip.core.plan import TensorRef
from fastflip.core.reference import apply_plan
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling

pytestmark = pytest.mark.framework

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
FAULTS = ["flip", "random-bits:3", "adjacent:2", "stuck-at-0", "stuck-at-1", "mask:0b101@random", "random-value",
          "zero", "scale:-2.5"]


def words(t) -> np.ndarray:  # noqa: ANN001 - a torch tensor
    torch = require("torch")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: its words
        t = t.view(torch.int16)
    a = t.numpy()
    return a.view(UINT[a.dtype.itemsize])


def hook_counts(model) -> list[int]:  # noqa: ANN001
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16"])
@pytest.mark.parametrize("fault", FAULTS)
def test_per_sample_faults_match_reference(dtype: str, fault: str) -> None:
    torch = require("torch")
    if dtype == "bfloat16" and "format" not in {f.name for f in dataclasses.fields(TensorRef)}:
        pytest.skip("bfloat16 outputs need fastflip's float formats, not in this build")
    model = small_net().to(getattr(torch, dtype))
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1)).to(getattr(torch, dtype))
    with torch.no_grad():
        golden = model(x)
        with fastflip.injected_activations(model, seed=11, count=2, model=fault, per_sample=True,
                                           selection=fastflip.Selection(layers=["head"])) as log:
            faulted = model(x)
    assert log.layers == ["head"] and log.forwards == 1
    ref = TensorRef("head", dtype if dtype == "bfloat16" else np.dtype(dtype).str, (10,))
    space = SiteSpace([ref])
    g, f = words(golden), words(faulted)
    for b in range(len(x)):
        plan = space.plan(Sampling(count=2, model=fault), seed=11, stream=(b,))  # trial b from its key alone
        arrays = {"head": g[b].copy() if dtype == "bfloat16" else golden[b].numpy().copy()}  # bf16: its words
        old, new = apply_plan(arrays, plan)
        assert np.array_equal(arrays["head"].view(f.dtype), f[b]), (fault, dtype, b)
        rows = log.sample == b
        assert np.array_equal(np.sort(log.index[rows]), np.sort(plan.index))
        order = np.argsort(log.index[rows])
        assert np.array_equal(log.old_words[rows][order], old[np.argsort(plan.index)])
        assert np.array_equal(log.new_words[rows][order], new[np.argsort(plan.index)])
        assert np.array_equal(log.old_words[rows], g[b][log.index[rows]].astype(np.uint64))
        if fault == "flip":  # plain NumPy: one bit XORed
            assert np.array_equal(log.new_words[rows], log.old_words[rows] ^ log.bits[rows])


def test_unfaulted_samples_are_bit_identical_and_logged_faults_independent() -> None:
    torch = require("torch")
    model = small_net()
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        golden = model(x)
        with fastflip.injected_activations(model, seed=5, rate=0.002, per_sample=True,
                                           selection=fastflip.Selection(layers=["body.block.conv1"])) as log:
            faulted = model(x)
    hit = set(log.sample.tolist())
    assert 0 < len(hit) < 16  # seeded: some samples drew no site
    for b in range(16):
        same = torch.equal(words_t(golden[b]), words_t(faulted[b]))
        if b not in hit:
            assert same, b
    # each sample's sites are its own draw: regenerate them from (seed, b)
    space = SiteSpace([TensorRef("body.block.conv1", "<f4", (8, 8, 8))])
    for b in range(16):
        plan = space.plan(Sampling(rate=0.002), seed=5, stream=(b,))
        assert sorted(log.index[log.sample == b].tolist()) == sorted(plan.index.tolist())
    assert len({tuple(log.index[log.sample == b]) for b in hit}) == len(hit)


def words_t(t):  # noqa: ANN001, ANN201 - bitwise view for torch.equal
    torch = require("torch")
    return t.contiguous().view(torch.int32)


def test_shared_sites_and_every_forward() -> None:
    torch = require("torch")
    model = small_net()
    sel = fastflip.Selection(layers=["stem.*", "head"])
    logs = {}
    for batch in (3, 5):
        x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(3))
        with torch.no_grad(), fastflip.injected_activations(model, seed=9, count=4, selection=sel) as log:
            model(x)
            model(x)
        logs[batch] = log
        assert log.forwards == 2 and set(log.forward.tolist()) == {0, 1}
        per = [sorted(zip(log.layer[(log.sample == b) & (log.forward == 0)].tolist(),
                          log.index[(log.sample == b) & (log.forward == 0)].tolist())) for b in range(batch)]
        assert all(p == per[0] for p in per)  # per_sample=False: the same neurons in every sample
    assert logs[3].layers == ["stem.0", "stem.1", "head"]
    first = logs[3].forward == 0
    assert sorted(zip(logs[3].layer[first & (logs[3].sample == 0)].tolist(), logs[3].index[first & (logs[3].sample == 0)].tolist())) \
        == sorted(zip(logs[5].layer[(logs[5].forward == 0) & (logs[5].sample == 0)].tolist(),
                      logs[5].index[(logs[5].forward == 0) & (logs[5].sample == 0)].tolist()))


def test_hooks_removed_also_when_the_body_raises() -> None:
    torch = require("torch")
    model = small_net()
    before = hook_counts(model)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(RuntimeError, match="boom"):
        with fastflip.injected_activations(model, seed=1, count=1):
            model(x)
            raise RuntimeError("boom")
    assert hook_counts(model) == before
    with torch.no_grad():
        golden = model(x)
        with fastflip.injected_activations(model, seed=1, count=50, bits="30"):
            assert not torch.equal(model(x), golden)
        assert torch.equal(model(x), golden)
    assert hook_counts(model) == before


def test_resnet18_named_layers_reused_relu_and_probe_without_side_effects() -> None:
    torch = require("torch")
    model = resnet18().train()
    twin = resnet18().train()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    sel = fastflip.Selection(layers=["layer1.0.relu", "layer4.1.conv2", "fc"])
    with torch.no_grad(), fastflip.injected_activations(model, seed=3, count=1, per_sample=True, bits="0-22",
                                                        selection=sel) as log:
        model(x)
    twin(x).sum()  # the twin's BatchNorm statistics after exactly one forward
    assert log.layers == ["layer1.0.relu", "layer1.0.relu#1", "layer4.1.conv2", "fc"]
    assert log.shapes[2] == (512, 1, 1) and log.shapes[0] == (64, 8, 8)
    assert len(log) == 4
    for (name, a), (_, b) in zip(model.named_buffers(), twin.named_buffers()):
        if "layer" in name:  # the faults are after every BN but layer1's; the probe must not have run BN a second time
            continue
        assert torch.equal(a, b), name
    assert torch.equal(model.bn1.running_mean, twin.bn1.running_mean)


def test_data_dependent_model_falls_back_to_a_real_probe_without_side_effects() -> None:
    torch = require("torch")
    nn = torch.nn

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.bn, self.fc2 = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            h = self.bn(self.fc1(x))
            if float(h.detach().abs().sum()) > 0:  # data-dependent Python: cannot run on the meta device
                h = torch.relu(h)
            return self.fc2(h)

    torch.manual_seed(0)
    model, x = Gated().train(), torch.randn(5, 4)
    twin = Gated().train()
    twin.load_state_dict(model.state_dict())
    rng_before = torch.random.get_rng_state()
    with torch.no_grad(), fastflip.injected_activations(model, seed=2, count=1, selection=fastflip.Selection(layers=["fc2"])) as log:
        model(x)
    twin(x)
    assert torch.equal(model.bn.running_mean, twin.bn.running_mean)
    assert int(model.bn.num_batches_tracked) == 1
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert log.layers == ["fc2"] and len(log) == 5


def test_training_with_autograd_goes_out_of_place() -> None:
    torch = require("torch")
    model = small_net().train()
    x = torch.randn(4, 3, 8, 8)
    with fastflip.injected_activations(model, seed=1, count=3, bits="20", selection=fastflip.Selection(layers=["body.block.conv1"])) as log:
        loss = model(x).square().mean()
        loss.backward()
    assert len(log) == 12 and model.stem[0].weight.grad is not None


def test_nan_policy_avoid_redraws_in_the_same_layer() -> None:
    torch = require("torch")
    model = small_net()
    x = torch.randn(8, 3, 8, 8)
    sel = fastflip.Selection(layers=["head"])
    with torch.no_grad(), fastflip.injected_activations(model, seed=4, count=3, bits="exponent", per_sample=True,
                                                        model="random-value", selection=sel) as allow:
        model(x)
    assert allow.nan_count + allow.inf_count > 0  # the seed makes some; avoid must remove them
    with torch.no_grad(), fastflip.injected_activations(model, seed=4, count=3, bits="exponent", per_sample=True,
                                                        model="random-value", selection=sel,
                                                        nan_policy="avoid") as avoid:
        y = model(x)
    assert avoid.nan_count == avoid.inf_count == 0 and bool(torch.isfinite(y).all())
    assert [int((avoid.sample == b).sum()) for b in range(8)] == [3] * 8


def test_seed_drawn_from_the_os_is_recorded() -> None:
    torch = require("torch")
    model = small_net()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), fastflip.injected_activations(model, count=1, per_sample=True) as log:
        y = model(x)
    assert isinstance(log.seed, int) and log.seed >= 0
    with torch.no_grad(), fastflip.injected_activations(model, log.seed, count=1, per_sample=True) as again:
        y2 = model(x)
    assert torch.equal(y, y2) and again.records() == log.records()


def test_bad_input_gives_one_line_errors_and_leaves_no_hook() -> None:
    torch = require("torch")
    nn = torch.nn
    model = small_net()
    before = hook_counts(model)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(SelectionError, match=r"matches no layer.*its layers: stem, stem\.0"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["layer9"])):
            model(x)
    with pytest.raises(OptionError, match=r"layer\(s\) unused never ran in the forward"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["unused", "head"])):
            model(x)
    with pytest.raises(OptionError, match="never ran a forward inside"):
        with fastflip.injected_activations(model, seed=1, count=1):
            pass
    with pytest.raises(OptionError, match="injected_activations: say what to flip"):
        with fastflip.injected_activations(model, seed=1):
            pass
    with pytest.raises(OptionError, match=r"injected_activations: give exactly one of count, rate or ber \(got count, "):
        with fastflip.injected_activations(model, seed=1, count=1, ber=0.1):
            pass
    with pytest.raises(OptionError, match="injected_activations: unknown key 'bit' \\(did you mean 'bits'"):
        with fastflip.injected_activations(model, seed=1, count=1, bit="30"):
            pass
    assert hook_counts(model) == before

    class Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.fc = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.fc(self.lstm(x)[0]).argmax(-1)

    class ArgMax(nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return x.argmax(-1)

    seq = Seq()
    with fastflip.injected_activations(seq, seed=1, count=1, selection=fastflip.Selection(layers=["lstm"])) as log:
        seq(torch.randn(2, 5, 3))  # a tuple output: its first tensor is faulted, and named for it
    assert log.layers == ["lstm:out.0"] and len(log) == 2
    with pytest.raises(OptionError, match=r"layer lstm:out\.1 element 1 of its tuple output is a tuple, not a tensor"):
        with fastflip.injected_activations(seq, seed=1, count=1, selection=fastflip.Selection(layers=["lstm:out.1"])):
            seq(torch.randn(2, 5, 3))
    wrapped = nn.Sequential(nn.Linear(3, 4), ArgMax())
    with pytest.raises(BitRangeError, match=r"output of layer\(s\) 1 \(int64\)"):
        with fastflip.injected_activations(wrapped, seed=1, count=1, bits="exponent",
                                           selection=fastflip.Selection(layers=["1"])):
            wrapped(torch.randn(2, 3))
    with fastflip.injected_activations(wrapped, seed=1, count=1, bits="0", selection=fastflip.Selection(dtypes=["float"])) as log:
        wrapped(torch.randn(2, 3))
    assert log.layers == ["0"]
    for err in (SelectionError, OptionError, BitRangeError):
        assert issubclass(err, FastflipError)
