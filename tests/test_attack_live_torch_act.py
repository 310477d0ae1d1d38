"""Activation faults in PyTorch models as people write them, judged against a forward hook written by hand.

Each case faults one target with ``injected_activations`` and replays the logged faults with a plain
``register_forward_hook`` that writes the logged new words at the logged (sample, index) of the same call's
output, in a copy: the model outputs must be bit-identical, the logged old words must be the clean
output's words, and after the block the model (its outputs and every ``state_dict`` tensor) must be as before.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import fastflip
from conftest import require

pytestmark = pytest.mark.framework


def _bits(t):
    torch = require("torch")
    return t.detach().reshape(-1).contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _tensors(y):
    torch = require("torch")
    if isinstance(y, torch.Tensor):
        return [y]
    if isinstance(y, dict):
        y = list(y.values())
    return [t for v in y for t in _tensors(v)] if isinstance(y, (tuple, list)) else []


def _first(out):
    return _tensors(out)[0]


def _by_hand(model, module, call, records, runs, setter):
    """The model's outputs on ``runs`` with a hand-written hook writing the logged words into call ``call``."""
    torch = require("torch")
    count = {"k": 0}

    def hook(_m, _a, out):
        k = count["k"]
        count["k"] += 1
        if k != call:
            return None
        t = _first(out).detach().clone()
        words, per = _bits(t), t[0].numel()
        for r in records:
            new = np.array([r["new"]], np.uint64).astype(f"u{t.element_size()}").view(f"i{t.element_size()}")[0]
            words[r["sample"] * per + r["index"]] = int(new)
        return setter(out, t)

    outs = []
    for x in runs:
        count["k"] = 0
        h = module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                outs.append(model(x))
        finally:
            h.remove()
    return outs


def _agrees(model, target, setter=lambda out, t: t, *, call=0, forwards=1, x=None, **options):
    torch = require("torch")
    x = torch.randn(4, 6) if x is None else x
    with torch.no_grad():
        clean = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    module = dict(model.named_modules())[target.split(":")[0].split("#")[0]]
    got = []
    with torch.no_grad(), fastflip.injected_activations(model, seed=7, count=3, bits="30", selection=fastflip.Selection(
            layers=[target]), **options) as log:
        for _ in range(forwards):
            got.append(model(x))
    records = log.records()
    assert len(records) == 3 * 4 * forwards and len(log.layers) == 1
    per_forward = [[r for r in records if r["forward"] == f] for f in range(forwards)]
    for f, recs in enumerate(per_forward):
        ref = _by_hand(model, module, call, recs, [x], setter)[0]
        for a, b in zip(_tensors(got[f]), _tensors(ref)):
            assert torch.equal(_bits(a), _bits(b)), f"forward {f}"
    # the logged old words are the clean output's words at those elements
    count = {"k": 0}
    seen = []

    def keep(_m, _a, out):
        if count["k"] == call:
            seen.append(_bits(_first(out)).clone())
        count["k"] += 1

    h = module.register_forward_hook(keep)
    with torch.no_grad():
        again = model(x)
    h.remove()
    per = int(np.prod(log.shapes[0]))
    for r in records:
        assert int(seen[0][r["sample"] * per + r["index"]]) & (2 ** 32 - 1) == r["old"]
    for a, b in zip(_tensors(again), _tensors(clean)):
        assert torch.equal(_bits(a), _bits(b))
    for k, v in model.state_dict().items():
        assert torch.equal(_bits(v), _bits(state[k])), k
    return log


def _net(torch, first, second=None):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = first
            self.b = torch.nn.Linear(6, 2) if second is None else second

        def forward(self, x):
            return self.b(first.use(self.a(x), x))

    return Net().eval()


def test_tuple_with_none_dict_and_namedtuple_outputs():
    torch = require("torch")
    nt = collections.namedtuple("NT", "h aux")

    class TupleNone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x):
            return None, self.lin(x), x

    class Dict(TupleNone):
        def forward(self, x):
            return {"mask": None, "h": self.lin(x)}

    class Named(TupleNone):
        def forward(self, x):
            y = self.lin(x)
            return nt(y, y.sum(1))

    for module, pick, setter, name in [
        (TupleNone(), lambda o, x: o[1] + o[2], lambda o, t: (None, t, o[2]), "a:out.1"),
        (Dict(), lambda o, x: o["h"], lambda o, t: {"mask": None, "h": t}, "a:out.h"),
        (Named(), lambda o, x: o.h + o.aux[:, None], lambda o, t: nt(t, o.aux), "a:out.0"),
    ]:
        module.use = pick
        log = _agrees(_net(torch, module), "a", setter)
        assert log.layers == [name]


def test_in_place_relu_after_and_as_the_faulted_module():
    torch = require("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.relu, self.out = torch.nn.Linear(6, 6), torch.nn.ReLU(inplace=True), torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.out(self.relu(self.lin(x)))

    _agrees(Net().eval(), "lin")
    _agrees(Net().eval(), "relu")


def test_module_called_twice_faults_the_call_named_and_modulelist_blocks():
    torch = require("torch")

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.out = torch.nn.Linear(6, 6), torch.nn.Linear(6, 2)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = torch.tanh(b(x))
            return self.out(self.lin(torch.tanh(self.lin(x))))

    assert _agrees(Twice().eval(), "lin#0").layers == ["lin"]
    assert _agrees(Twice().eval(), "lin#1", call=1).layers == ["lin#1"]
    _agrees(Twice().eval(), "blocks.1", forwards=2)


@pytest.mark.parametrize("held", ["parameter slice", "parameter", "buffer slice", "buffer", "attribute slice",
                                  "attribute", "dict slice"])
def test_output_that_is_the_models_own_tensor_is_faulted_in_a_copy(held):
    """A module returning (a view of) its own parameter or buffer (learned positions, a cached rotary table):
    the fault must not be written into the model, and each forward is faulted afresh."""
    torch = require("torch")

    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if held.startswith("parameter"):
                self.table = torch.nn.Parameter(torch.randn(4, 6))
            elif held.startswith("buffer"):
                self.register_buffer("table", torch.randn(4, 6))
            elif held.startswith("attribute"):  # a plain attribute: a table cached without register_buffer
                self.table = torch.randn(4, 6)
            else:  # a cache kept in a dict: only its views' _base tells that they are not the call's own memory
                self.cache = {"table": torch.randn(4, 6)}

        def forward(self, x):
            table = self.cache["table"] if held.startswith("dict") else self.table
            return table[: x.shape[0]].to(x.dtype) if held.endswith("slice") else table

        @staticmethod
        def use(out, x):
            return x * out

    _agrees(_net(torch, Table()), "a", forwards=2)


def test_models_storages_are_gathered_once_per_block_and_afresh_in_the_next():
    """The storages an output is compared with (the model's parameters and buffers) are gathered once per block,
    not in every forward; a parameter replaced between blocks is still caught (its fault is in a copy)."""
    torch = require("torch")

    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(4, 6))

        def forward(self, x):
            return self.table

        @staticmethod
        def use(out, x):
            return x * out

    model = _net(torch, Table())
    calls = {"n": 0}
    buffers = model.buffers

    def counted(*a, **k):
        calls["n"] += 1
        return buffers(*a, **k)

    model.buffers = counted
    _agrees(model, "a", forwards=3)
    assert calls["n"] == 1
    model.a.table = torch.nn.Parameter(torch.randn(4, 6))
    _agrees(model, "a", forwards=2)
    assert calls["n"] == 2


def test_user_forward_hooks_see_only_the_users_forwards_and_their_changes_are_faulted():
    torch = require("torch")
    model = _net(torch, torch.nn.Linear(6, 6))
    model.a.use = lambda out, x: out
    seen = []
    model.a.register_forward_hook(lambda _m, _a, out: seen.append(out.device.type))
    _agrees(model, "a")
    assert seen == ["cpu"] * 4  # clean, faulted, again, by hand: the shape probe is not one of them
    doubled = _net(torch, torch.nn.Linear(6, 6))
    doubled.a.use = lambda out, x: out
    doubled.a.register_forward_hook(lambda _m, _a, out: out * 2)  # runs first; the fault lands in its output
    _agrees(doubled, "a")


@pytest.mark.parametrize("how", ["torch.compile(model)", "submodule.compile()"])
def test_targets_inside_a_compiled_module_are_refused_before_any_forward(how):
    """A compiled graph skips the hooks: the block would run fault-free with an empty log."""
    torch = require("torch")
    from fastflip.errors import OptionError

    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)).eval()
    if how == "torch.compile(model)":
        model, target = torch.compile(model), "_orig_mod.0"
    else:
        model[0].compile()
        target = "0"
    with pytest.raises(OptionError, match=r"^activation target .* runs inside the torch.compile'd .*whose graph skips "
                                          r"the hooks that fault it: fault the module before compiling it"):
        with fastflip.injected_activations(model, seed=1, count=1, bits="30",
                                           selection=fastflip.Selection(layers=[target])):
            pytest.fail("the block must not run")


def test_nested_blocks_on_one_model_each_log_the_users_forwards_only():
    """The inner block's shape probe is not a forward of the outer block (and the other way round)."""
    torch = require("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6), torch.nn.Tanh(),
                                torch.nn.Linear(6, 2)).eval()
    x = torch.randn(4, 6)

    def block(layer, seed):
        return fastflip.injected_activations(model, seed=seed, count=2, bits="30",
                                             selection=fastflip.Selection(layers=[layer]))

    with torch.no_grad(), block("0", 1) as outer, block("2", 2) as inner:
        got = model(x)
    assert (outer.forwards, len(outer), inner.forwards, len(inner)) == (1, 8, 1, 8)
    hooks = []
    for layer, log in ((0, outer), (2, inner)):
        records = log.records()

        def hook(_m, _a, out, records=records):
            out = out.clone()
            for r in records:
                _bits(out)[r["sample"] * 6 + r["index"]] = int(np.array([r["new"]], np.uint32).view(np.int32)[0])
            return out

        hooks.append(model[layer].register_forward_hook(hook))
    with torch.no_grad():
        by_hand = model(x)
    for h in hooks:
        h.remove()
    assert torch.equal(_bits(got), _bits(by_hand))


@pytest.mark.parametrize("target", ["layers.0.linear1", "layers.1.self_attn", "layers.0"])
def test_torch_transformer_encoder_layers_and_native_attention(target):
    """nn.TransformerEncoder in eval mode (its fused fast path when no hook is present) and nn.MultiheadAttention
    returning ``(out, None)``: the faulted output equals a hand-written hook's."""
    torch = require("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    setter = (lambda out, t: (t, out[1])) if target.endswith("self_attn") else (lambda out, t: t)
    log = _agrees(model, target, setter, x=torch.randn(4, 5, 8))
    assert log.layers == [target + (":out.0" if target.endswith("self_attn") else "")]
