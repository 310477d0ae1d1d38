"""Live weight injection into PyTorch models as people write them, judged by PyTorch's own reading.

Each case injects through the public API (``live.targets`` / ``live.plan_for`` / ``live.inject``), then reads
the model back the way PyTorch does (``state_dict()``, ``named_parameters()``, ``named_buffers()``, every
name of tied tensors) and checks that exactly the logged words changed, by the logged amount, under every
name that reaches them; the revert must give back every tensor bit for bit. Tensors fastflip cannot reach
as they are read (an uninitialized lazy parameter, a sparse or negated-view buffer, an expanded view whose
elements share memory, a meta tensor) must be left out with a one-line reason, never flipped wrongly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip import live
from fastflip.errors import FastflipError, OptionError, SelectionError, StaleTargetError

pytestmark = pytest.mark.framework


def _words(t):
    torch = require("torch")
    t = t.detach().resolve_neg().reshape(-1).contiguous()
    return t.view(torch.uint8).numpy().view(f"u{t.element_size()}").copy()


def _reading(model):
    """What PyTorch says the model holds: every state_dict entry, parameter and buffer name, as raw words."""
    torch = require("torch")
    from torch.nn.parameter import is_lazy

    def readable(v):
        return isinstance(v, torch.Tensor) and not is_lazy(v) and not v.is_meta and v.layout == torch.strided

    found = [*model.state_dict(keep_vars=True).items(), *model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {k: _words(v) for k, v in found if readable(v)}


def _agrees(model, *, seed=3, count=16, **options):
    """Inject a drawn plan; PyTorch's reading must show exactly the logged words; revert must restore all."""
    before = _reading(model)
    tg = live.targets(model)
    plan = live.plan_for(tg, seed=seed, count=count, **options)
    log = live.inject(tg, plan)
    after = _reading(model)
    expect = {k: v.copy() for k, v in before.items()}
    for j in range(len(plan)):
        ref = plan.tensors[int(plan.tensor[j])]
        names = {ref.name, *tg.get(ref.name).aliases}
        hit = [k for k in expect if k in names]
        assert hit, f"{ref.name} is not a name PyTorch reads"
        for k in hit:
            assert expect[k][int(plan.index[j])] == log.old_words[j]
            expect[k][int(plan.index[j])] = log.new_words[j]
    for k in expect:
        np.testing.assert_array_equal(after[k], expect[k], err_msg=k)
    assert log.changed == len(plan) > 0
    live.revert(tg, log)
    back = _reading(model)
    for k in before:
        np.testing.assert_array_equal(back[k], before[k], err_msg=k)
    return plan


def test_parametrized_weight_is_flipped_in_its_original():
    torch = require("torch")
    from torch.nn.utils import parametrize

    class Symmetric(torch.nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)

    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    parametrize.register_parametrization(m[0], "weight", Symmetric())
    plan = _agrees(m, count=24, include=["0.*"])
    assert {t.name for t in plan.tensors} == {"0.parametrizations.weight.original", "0.bias"}
    # the flipped original is what the parametrized weight is computed from
    site = fastflip.site(m, "0.parametrizations.weight.original", (0, 3), bits=31)
    w = m[0].weight.detach().clone()
    with fastflip.injected(m, site):
        now = m[0].weight.detach()
        assert float(now[3, 0]) == -float(w[3, 0]) and float(now[0, 3]) == -float(w[0, 3])
    assert torch.equal(m[0].weight, w)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "prune"])
def test_weight_and_spectral_norm_parametrizations_and_pruning(kind):
    torch = require("torch")
    from torch.nn.utils import parametrizations, prune

    if kind == "prune":  # weight_orig and the weight_mask buffer are what the state_dict holds
        m = torch.nn.Sequential(torch.nn.Linear(4, 4))
        prune.l1_unstructured(m[0], "weight", amount=0.5)
    else:
        m = torch.nn.Sequential(getattr(parametrizations, kind)(torch.nn.Linear(4, 4)))
    plan = _agrees(m, count=20)
    assert all(t.name.startswith("0.") for t in plan.tensors)


def test_gpt2_tied_lm_head_is_one_tensor_under_both_names():
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    plan = _agrees(model, count=32, layers=["lm_head"])
    assert {t.name for t in plan.tensors} == {"transformer.wte.weight"}
    _agrees(model, count=64, seed=5)


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "view_of_parameter"])
def test_non_contiguous_parameters(layout):
    torch = require("torch")
    torch.manual_seed(0)
    if layout == "transposed":
        m = torch.nn.Sequential(torch.nn.Linear(3, 4))
        m[0].weight = torch.nn.Parameter(torch.randn(3, 4).t())
    elif layout == "channels_last":
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).to(memory_format=torch.channels_last)
        assert not m[0].weight.is_contiguous()
    else:  # a parameter lying inside another one: flips are logged once, under the one that holds the memory
        m = torch.nn.Module()
        base = torch.randn(6)
        m.a, m.b = torch.nn.Parameter(base), torch.nn.Parameter(base[2:5])
        tg = live.targets(m)
        assert tg.get("b").view_of == "a"
        site = fastflip.site(m, "b", 1, bits=31)
        before, orig = _reading(m), float(base[3])
        with fastflip.injected(m, site):
            assert float(m.a.detach()[3]) == -orig == float(m.b.detach()[1])
        np.testing.assert_array_equal(_reading(m)["a"], before["a"])
        return
    _agrees(m, count=40)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_parameters_and_buffers(dtype):
    torch = require("torch")
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(getattr(torch, dtype))
    plan = _agrees(m, count=20, bits="exponent")
    assert {t.format or t.dtype for t in plan.tensors} <= {dtype, "<f2"}


def test_lazy_module_is_left_out_before_its_first_forward_and_reachable_after():
    torch = require("torch")
    m = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.Linear(4, 2))
    with pytest.warns(UserWarning, match=r"2 tensor\(s\) left out: tensor '0.weight' is an uninitialized parameter"
                                         r" of a lazy module: run one forward first"):
        tg = live.targets(m)
    assert tg.skipped == ["0.weight", "0.bias"]
    with pytest.raises(SelectionError, match=r"no tensors to inject .* \(left out: 0.weight, 0.bias\)"):
        live.targets(torch.nn.Sequential(torch.nn.LazyLinear(4)))
    m(torch.randn(2, 5))
    plan = _agrees(m, count=20)
    assert "0.weight" in {t.name for t in plan.tensors}


def test_module_shared_by_two_parents_is_one_tensor():
    torch = require("torch")
    shared = torch.nn.Linear(4, 4)
    m = torch.nn.Sequential(torch.nn.Sequential(shared), torch.nn.Sequential(shared, torch.nn.Linear(4, 2)))
    tg = live.targets(m)
    assert set(tg.get("0.0.weight").aliases) >= {"1.0.weight"}
    _agrees(m, count=30)


def test_batchnorm_running_statistics_and_integer_counter():
    torch = require("torch")
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    m(torch.randn(8, 4))
    _agrees(m, count=30, roles=["bn-statistic"])
    plan = _agrees(m, count=1, include=["*num_batches_tracked"], bits="0-62")
    assert plan.tensors[0].dtype == "<i8"


def test_expanded_buffer_whose_elements_share_memory_is_left_out():
    torch = require("torch")
    m = torch.nn.Module()
    m.register_buffer("grid", torch.randn(1, 3).expand(4, 3))  # 12 elements over 3 words
    m.register_buffer("position_ids", torch.arange(8).expand((1, -1)), persistent=False)  # HF-style: no overlap
    m.w = torch.nn.Parameter(torch.randn(3))
    with pytest.warns(UserWarning, match=r"tensor 'grid' has elements that share memory"):
        tg = live.targets(m)
    assert tg.skipped == ["grid"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _agrees(m, count=6, bits="0-7")
        with pytest.raises(FastflipError):
            fastflip.site(m, "grid", (1, 0), bits=3)
    with pytest.raises(OptionError, match="'e' has elements that share memory"):
        live.targets({"e": np.broadcast_to(np.ones(3, np.float32), (4, 3))})


@pytest.mark.parametrize("kind", ["sparse", "negated view", "meta"])
def test_tensors_not_read_as_stored_are_left_out_in_one_line(kind):
    torch = require("torch")
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.randn(3))
    if kind == "sparse":
        m.register_buffer("odd", torch.eye(3).to_sparse())
        reason = "has layout torch.sparse_coo: only dense tensors"
    elif kind == "negated view":
        m.register_buffer("odd", torch.randn(4)._neg_view())
        reason = "is a lazily negated view"
    else:
        m.register_buffer("odd", torch.zeros(3, device="meta"))
        reason = "is on device meta"
    with pytest.warns(UserWarning, match=f"tensor 'odd' {reason}"):
        tg = live.targets(m)
    assert tg.skipped == ["odd"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _agrees(m, count=3)


@pytest.mark.parametrize("how", ["new Parameter", ".data =", "load_state_dict(assign=True)", ".half()"])
def test_replaced_storage_after_targets_is_refused_before_any_write(how):
    torch = require("torch")
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    tg = live.targets(m)
    plan = fastflip.site(m, [("0.weight", (0, 0), 31), ("1.weight", (0, 0), 31)])
    if how == "new Parameter":
        m[0].weight = torch.nn.Parameter(torch.randn(3, 3))
    elif how == ".data =":
        m[0].weight.data = torch.randn(3, 3)
    elif how == ".half()":
        m.half()
    else:
        m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)
    before = _reading(m)
    with pytest.raises(StaleTargetError, match="rebuild them"):
        live.inject(tg, plan)
    for k, v in _reading(m).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_compiled_module_is_injected_through_its_original_module():
    torch = require("torch")
    m = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4)))  # not run: compiling is left to the user
    plan = _agrees(m, count=10)
    assert all(t.name.startswith("_orig_mod.") for t in plan.tensors)


def _dynamic(torch, seed=0):
    torch.manual_seed(seed)
    return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(8, 4)),
                                                  {torch.nn.Linear}, dtype=torch.qint8)


def _packed_words(torch, q):
    """The int8 weight as torch reads it: the module's weight() and the state_dict's packed entry."""
    return q[0].weight().int_repr().clone(), q.state_dict()["0._packed_params._packed_params"][0].int_repr().clone()


def test_torch_ao_dynamic_flip_shows_in_weight_and_state_dict_at_once():
    """No forward between inject, the framework's reading and revert: a torch.save of the state_dict after the
    revert must hold the original words."""
    torch = require("torch")
    q = _dynamic(torch)
    w0, s0 = _packed_words(torch, q)
    tg = live.targets(q)
    log = live.inject(tg, fastflip.site(q, "0.weight", (1, 2), bits=6))
    flipped = w0.clone()
    flipped.view(torch.uint8)[1, 2] ^= 1 << 6
    for now in _packed_words(torch, q):
        assert torch.equal(now, flipped)
    live.revert(tg, log)
    for now, then in zip(_packed_words(torch, q), (w0, s0)):
        assert torch.equal(now, then)


def test_torch_ao_dynamic_reloaded_before_inject_takes_the_flip():
    torch = require("torch")
    q, other = _dynamic(torch), _dynamic(torch, seed=1)  # other words under the same names
    tg = live.targets(q)
    q.load_state_dict(other.state_dict())  # no forward before the injection
    x = torch.randn(2, 8)
    log = live.inject(tg, fastflip.site(q, "0.weight", (0, 0), bits=6))
    assert int(log.old_words[0]) == int(other[0].weight().int_repr()[0, 0]) & 0xFF
    assert (q[0].weight().int_repr() != other[0].weight().int_repr()).sum() == 1
    assert not torch.equal(q(x), other(x))
    live.revert(tg, log)
    assert torch.equal(q(x), other(x))


def test_a_plan_naming_a_left_out_tensor_says_why():
    torch = require("torch")
    from fastflip.errors import TensorNotFoundError

    m = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.Linear(4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TensorNotFoundError, match=r"^tensor '0.weight' is an uninitialized parameter of a lazy "
                                                      r"module: run one forward first .*\(left out of these targets\)$"):
            fastflip.site(m, "0.weight", (0, 0), bits=3)


@pytest.mark.parametrize("layout", ["dtype view", "overlapping slices"])
def test_tensors_sharing_memory_with_other_word_widths_or_partly(layout):
    """A buffer that is ``weight.view(torch.int16)``, or two parameters on overlapping slices of one storage: one
    stored byte never takes two sites of one plan (the second flip would make the revert impossible)."""
    torch = require("torch")
    from fastflip.errors import PlanMismatchError

    torch.manual_seed(0)
    m = torch.nn.Module()
    base = torch.randn(6)
    if layout == "dtype view":
        m.a = torch.nn.Parameter(base)
        m.register_buffer("b", m.a.detach().view(torch.int16))
        assert live.targets(m).get("b").view_of == "a"  # one storage: drawn plans sample it once, as `a`
        twice = [("a", 0, 3), ("b", 0, 3)]
    else:
        m.a, m.b = torch.nn.Parameter(base[0:4]), torch.nn.Parameter(base[2:6])
        twice = [("a", 2, 3), ("b", 0, 5)]
    tg = live.targets(m)
    before = _reading(m)
    with pytest.raises(PlanMismatchError, match="hits stored bytes twice"):
        live.inject(tg, fastflip.site(m, twice))
    for seed in range(40):  # drawn plans: each is refused whole or reverts bit for bit
        try:
            log = live.inject(tg, live.plan_for(tg, seed=seed, count=6))
        except PlanMismatchError:
            continue
        live.revert(tg, log)
        for k, v in _reading(m).items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_torch_ao_dynamic_reloaded_with_another_scheme_makes_old_targets_refuse():
    torch = require("torch")
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    def dynamic(qconfig):
        return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(8, 4)),
                                                      {torch.nn.Linear: qconfig}, dtype=torch.qint8)

    q, other = dynamic(default_dynamic_qconfig), dynamic(per_channel_dynamic_qconfig)
    tg = live.targets(q)
    q.load_state_dict(other.state_dict())  # per-tensor -> per-channel: the kept words are another tensor now
    with pytest.raises(StaleTargetError, match="'0.weight' has another storage"):
        live.inject(tg, fastflip.site(q, "0.weight", (0, 0), bits=6))
    assert torch.equal(q[0].weight().int_repr(), other[0].weight().int_repr())
    tg = live.targets(q)  # rebuilt: fine again
    live.revert(tg, live.inject(tg, fastflip.site(q, "0.weight", (0, 0), bits=6)))
    assert torch.equal(q[0].weight().int_repr(), other[0].weight().int_repr())
