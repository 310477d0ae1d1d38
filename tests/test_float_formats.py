"""bfloat16, float8_e4m3fn and float8_e5m2: fields, values, NaN/Inf rules, live models and checkpoints.

The independent side is PyTorch's own conversions (every word decoded by torch, values
rounded by torch), bit arithmetic written out here, and the pure-Python oracle of
:mod:`fastflip.core.reference` for scaling.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip import live
from fastflip.core.dtypes import word_type
from fastflip.core.floatformats import FORMATS, decode, encode, nonfinite_words
from fastflip.core.plan import TensorRef
from fastflip.core.reference import apply_plan, format_scale_word, format_value
from fastflip.core.spec import Sampling
from fastflip.files.select import Selection, select
from fastflip.core.wordrule import nonfinite, scale_words, words_to_values
from user_models import torch_classes

FMT = list(FORMATS)
UNSIGNED = {8: np.uint8, 16: np.uint16}


def torch_words(torch, values: np.ndarray, fmt: str) -> np.ndarray:
    """torch's rounding of float64 values to the format, as words."""
    t = torch.from_numpy(np.asarray(values, np.float64)).to(getattr(torch, fmt))
    return t.view(torch.uint8 if FORMATS[fmt].bits == 8 else torch.int16).numpy().astype(np.int64) & (
        (1 << FORMATS[fmt].bits) - 1)


@pytest.mark.parametrize("fmt", FMT)
def test_fields_of_each_format(fmt: str) -> None:
    wt = word_type(fmt)
    exp = {"bfloat16": (7, 14), "float8_e4m3fn": (3, 6), "float8_e5m2": (2, 6)}[fmt]
    assert wt.kind == "f" and wt.format == fmt and wt.bits == FORMATS[fmt].bits
    assert wt.fields["sign"] == (wt.bits - 1,)
    assert wt.fields["exponent"] == tuple(range(exp[0], exp[1] + 1)) and wt.fields["exponent-msb"] == (exp[1],)
    assert wt.fields["mantissa"] == tuple(range(exp[0]))
    assert fastflip.BitSpec.parse("exponent-msb").resolve(wt) == (exp[1],)


@pytest.mark.framework
@pytest.mark.parametrize("fmt", FMT)
def test_every_word_decodes_as_torch_decodes_it(fmt: str) -> None:
    torch = require("torch")
    f = FORMATS[fmt]
    words = np.arange(1 << f.bits, dtype=np.uint64)
    t = torch.from_numpy(words.astype(UNSIGNED[f.bits]).view(np.int16 if f.bits == 16 else np.uint8))
    want = t.view(getattr(torch, fmt)).double().numpy()
    got = decode(words, f)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    nan, inf = nonfinite(words, word_type(fmt))
    assert np.array_equal(nan, np.isnan(want)) and np.array_equal(inf, np.isinf(want))
    py = np.array([format_value(int(w), fmt) for w in words])  # the pure-Python oracle agrees too
    assert np.array_equal(np.isnan(py), np.isnan(want)) and np.array_equal(py[~np.isnan(py)], want[~np.isnan(want)])


def test_nan_inf_rules() -> None:
    e4 = FORMATS["float8_e4m3fn"]
    nan, inf = nonfinite_words(np.arange(256, dtype=np.uint64), e4)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF] and not inf.any()  # no Inf; NaN only at S.1111.111
    assert decode(np.array([0x78, 0x7E]), e4).tolist() == [256.0, 448.0]  # exponent 1111 holds normal numbers
    e5 = FORMATS["float8_e5m2"]
    nan, inf = nonfinite_words(np.arange(256, dtype=np.uint64), e5)
    assert np.flatnonzero(inf).tolist() == [0x7C, 0xFC] and np.flatnonzero(nan).tolist() == [0x7D, 0x7E, 0x7F, 0xFD,
                                                                                              0xFE, 0xFF]
    bf = word_type("bfloat16")
    assert nonfinite(np.array([0x7F80, 0xFFC1, 0x7F7F]), bf)[1].tolist() == [True, False, False]
    assert words_to_values(np.array([0x4049]), bf).tolist() == [3.140625]


@pytest.mark.framework
@pytest.mark.parametrize("fmt", FMT)
def test_rounding_and_scaling_match_torch(fmt: str) -> None:
    torch = require("torch")
    f = FORMATS[fmt]
    rng = np.random.default_rng(3)
    x = (rng.normal(size=4000) * np.exp(rng.uniform(-20, 20, 4000))).astype(np.float32).astype(np.float64)
    x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, 448, 464, 470, 57344, 61440, 3e38]])
    assert np.array_equal(encode(x, f).astype(np.int64), torch_words(torch, x, fmt))
    old = rng.integers(0, 1 << f.bits, 300).astype(np.uint64)
    old = old[~np.isnan(decode(old, f))]
    factors = rng.choice([-3.0, 0.5, 2.0, 1e3, 1.7], len(old))
    new = scale_words(old, factors, word_type(fmt))
    assert np.array_equal(new.astype(np.int64), torch_words(torch, decode(old, f) * factors, fmt))
    oracle = [format_scale_word(int(o), float(s), fmt) for o, s in zip(old[:60], factors[:60])]
    assert new[:60].tolist() == oracle


@pytest.mark.framework
@pytest.mark.parametrize("fmt", FMT)
def test_plans_on_formats_match_the_reference_oracle(fmt: str) -> None:
    torch = require("torch")
    f = FORMATS[fmt]
    rng = np.random.default_rng(5)
    arr = rng.integers(0, 1 << f.bits, 64).astype(f.storage)
    ref = TensorRef("w", fmt, (64,))
    assert ref.format == fmt and np.dtype(ref.dtype).newbyteorder("=") == f.storage.newbyteorder("=")
    space = fastflip.SiteSpace([ref], bits="exponent")
    for model in ("flip", "adjacent:2", "stuck-at-1", "scale:-2.5"):
        plan = space.plan(Sampling(count=10, model=model), seed=1)
        a = {"w": arr.copy()}
        old, new = apply_plan(a, plan)
        words = arr.copy()
        b = {"w": torch.from_numpy(words.view(np.int16) if f.bits == 16 else words).view(getattr(torch, fmt))}
        log = live.inject(b, plan)  # a torch tensor of the format
        assert log.old_words.tolist() == old.tolist() and log.new_words.tolist() == new.tolist(), model
        assert words.tobytes() == a["w"].tobytes()
        if model != "scale:-2.5":  # plain words take bitwise plans of a format; scaling needs the format's tensor
            c = {"w": arr.copy()}
            live.inject(c, plan)
            assert c["w"].tobytes() == a["w"].tobytes()


@pytest.mark.framework
def test_bf16_language_model_with_tied_weights_live() -> None:
    torch = require("torch")
    torch.manual_seed(0)
    lm = torch_classes()["TinyLM"]().to(torch.bfloat16)
    tg = live.targets(lm)
    assert {t.format for t in tg.tensors} == {"bfloat16"} and tg.skipped == []
    before = {k: v.view(torch.int16).numpy().astype(np.uint16).copy() for k, v in lm.state_dict().items()}
    ids = torch.tensor([[1, 2, 3, 4]])
    clean = lm(ids).float().clone()
    with fastflip.injected(lm, seed=2, count=25, bits="exponent-msb") as log:
        assert all(int(b) == 1 << 14 for b in log.plan.bits)
        want = {k: v.reshape(-1).copy() for k, v in before.items()}
        for i in range(len(log)):
            name = log.plan.tensors[int(log.plan.tensor[i])].name
            for key in {name, "lm_head.weight"} if name == "embed.weight" else {name}:
                want[key][int(log.plan.index[i])] ^= 1 << 14
        for k, v in lm.state_dict().items():
            assert v.view(torch.int16).numpy().astype(np.uint16).reshape(-1).tolist() == want[k].tolist(), k
        became_inf = sum(bool(np.isinf(decode(np.array([w]), FORMATS["bfloat16"]))[0]) for w in log.new_words)
        assert log.inf_count == became_inf
        out = lm(ids).float()
        assert not torch.equal(out, clean)
    for k, v in lm.state_dict().items():
        assert v.view(torch.int16).numpy().astype(np.uint16).tolist() == before[k].tolist(), k


@pytest.mark.framework
def test_fp8_model_live_and_mixed_selection() -> None:
    torch = require("torch")
    torch.manual_seed(1)

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = torch.nn.Linear(8, 8).to(torch.float8_e4m3fn)  # quantised weights
            self.k = torch.nn.Linear(8, 8).to(torch.float8_e5m2)
            self.norm = torch.nn.LayerNorm(8)  # float32
            self.register_buffer("steps", torch.tensor(3, dtype=torch.int64))

    m = Mixed()
    tg = live.targets(m)
    fmts = {t.name: t.format for t in tg.tensors}
    assert fmts["q.weight"] == "float8_e4m3fn" and fmts["k.bias"] == "float8_e5m2" and fmts["norm.weight"] is None
    recs = tg.records()
    assert {t.name for t in select(recs, Selection(dtypes=["float8_e4m3fn"]))} == {"q.weight", "q.bias"}
    assert "q.weight" not in {t.name for t in select(recs, Selection(dtypes=["uint8", "int"]))}
    assert len(select(recs, Selection(dtypes=["float"]))) == 6
    raw = {k: v.view(torch.uint8).numpy().copy() for k, v in m.state_dict().items() if v.dtype.itemsize == 1}
    with fastflip.injected(m, seed=3, count=30, bits="exponent-msb", dtypes=["float8_e4m3fn", "float8_e5m2"]) as log:
        assert log.plan.meta.get("left_out") is None
        for i in range(len(log)):
            ref = log.plan.tensors[int(log.plan.tensor[i])]
            msb = 1 << (6 if ref.format else 0)
            assert int(log.plan.bits[i]) == msb and int(log.old_words[i]) ^ int(log.new_words[i]) == msb
            assert m.state_dict()[ref.name].view(torch.uint8).reshape(-1)[int(log.plan.index[i])] == log.new_words[i]
        assert log.inf_count == sum(  # e4m3fn never becomes Inf; e5m2 does when the exponent fills
            1 for i in range(len(log)) if log.plan.tensors[int(log.plan.tensor[i])].format == "float8_e5m2"
            and (int(log.new_words[i]) & 0x7F) == 0x7C)
    for k, v in raw.items():
        assert m.state_dict()[k].view(torch.uint8).numpy().tobytes() == v.tobytes(), k
    with fastflip.injected(m, seed=3, count=4, bits="exponent-msb") as log:  # the int64 buffer is left out
        assert log.plan.meta["left_out"]["tensors"] == ["steps"]


@pytest.mark.framework
def test_bf16_and_fp8_checkpoints_fields_values_nan_and_diff(tmp_path) -> None:
    torch = require("torch")
    from fastflip.files.diff import diff_files
    from fastflip.files.inject import inject_file
    from fastflip.files.layout import read_layout
    from fastflip.frameworks.torch_state import load_state_dict, save_state_dict

    state = {"bf": torch.tensor([1.0, -2.0, 0.5, 3.0] * 4, dtype=torch.bfloat16),
             "e4": torch.full((16,), 1.0).to(torch.float8_e4m3fn), "e5": torch.full((16,), 1.0).to(torch.float8_e5m2),
             "n": torch.tensor(7, dtype=torch.int64)}
    src = save_state_dict(state, tmp_path / "m.h5")
    lay = read_layout(src)
    assert {t.path: t.format for t in lay.tensors} == {"/bf": "bfloat16", "/e4": "float8_e4m3fn",
                                                       "/e5": "float8_e5m2", "/n": None}
    res = inject_file(src, tmp_path / "f.h5", seed=1, count=48, bits="exponent-msb", log_path=tmp_path / "f.fflog")
    assert res.log.plan.meta["left_out"]["tensors"] == ["/n"]
    back = load_state_dict(tmp_path / "f.h5")
    for name, bit in (("bf", 14), ("e4", 6), ("e5", 6)):
        a = state[name].view(torch.int16 if name == "bf" else torch.uint8).numpy().astype(np.int64) & 0xFFFF
        b = back[name].view(torch.int16 if name == "bf" else torch.uint8).numpy().astype(np.int64) & 0xFFFF
        assert back[name].dtype == state[name].dtype
        assert set((a ^ b).tolist()) == {1 << bit}  # 48 sites over 3 x 16 elements: every element once
    # values in the log are the format's values, not the integers of the words
    from fastflip.files.log import InjectionLog, values_of

    log = InjectionLog.load(tmp_path / "f.fflog")
    assert {t.format for t in log.plan.tensors} == {"bfloat16", "float8_e4m3fn", "float8_e5m2"}
    vals = values_of(log.plan, log.old_words)
    assert set(vals.tolist()) <= {1.0, -2.0, 0.5, 3.0}
    # 1.0 in e5m2 (0x3C) with the exponent MSB set is 0x7C = Inf; in e4m3fn 0x38 -> 0x78 = 256 (no Inf)
    # Inf created: bf16 1.0 (exponent 0x7F -> 0xFF) x4, e5m2 1.0 (0x3C -> 0x7C) x16; e4m3fn 1.0 -> 256.0 (no Inf)
    assert res.counts["inf_created"] == 4 + 16 and res.counts["nan_created"] == 0
    d = {t.path: t for t in diff_files(src, tmp_path / "f.h5").tensors}
    assert d["/bf"].dtype == "bfloat16" and d["/e4"].new_inf == 0 and d["/e5"].new_inf == 16
    assert d["/e4"].max_abs == 255.0  # 1.0 -> 256.0: printed as values of the format


@pytest.mark.framework
def test_keras_bfloat16_variables() -> None:
    keras = require("keras")
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, dtype="bfloat16", name="hidden")])
    tg = live.targets(model)
    assert [(t.name, t.format) for t in tg.tensors] == [("hidden/kernel", "bfloat16"), ("hidden/bias", "bfloat16")]
    before = {v.path: np.array(v.numpy()).view(np.uint16).copy() for v in model.weights}
    with fastflip.injected(model, seed=1, count=6, bits="exponent-msb") as log:
        for i in range(len(log)):
            name = f"{model.name}/" + log.plan.tensors[int(log.plan.tensor[i])].name  # sequential, sequential_1...
            now = np.array(model.get_layer("hidden").kernel.numpy() if name.endswith("kernel")
                           else model.get_layer("hidden").bias.numpy()).view(np.uint16).reshape(-1)
            k = int(log.plan.index[i])
            assert int(now[k]) == int(before[name].reshape(-1)[k]) ^ (1 << 14) == int(log.new_words[i])
    for v in model.weights:
        assert np.array(v.numpy()).view(np.uint16).tobytes() == before[v.path].tobytes()


@pytest.mark.framework
@pytest.mark.parametrize("kind", ["torch.save", "safetensors"])
def test_torch_save_and_safetensors_files_carry_the_format(tmp_path, kind: str) -> None:
    torch = require("torch")
    from fastflip.files.inject import inject_file
    from fastflip.files.layout import read_layout

    sd = {"bf": torch.ones(8, dtype=torch.bfloat16), "e4": torch.ones(8).to(torch.float8_e4m3fn),
          "e5": torch.ones(8).to(torch.float8_e5m2), "n": torch.tensor(3)}
    if kind == "torch.save":
        src = tmp_path / "m.pt"
        torch.save(sd, src)
    else:
        require("safetensors")
        from safetensors.torch import save_file

        src = tmp_path / "m.safetensors"
        save_file(sd, src)
    lay = read_layout(src)
    assert {t.path: t.format for t in lay.tensors} == {"/bf": "bfloat16", "/e4": "float8_e4m3fn",
                                                       "/e5": "float8_e5m2", "/n": None}
    res = inject_file(src, tmp_path / ("out" + src.suffix), seed=2, count=24, bits="exponent-msb", log_path=False)
    # 1.0 everywhere: bf16 and e5m2 become Inf (exponent fills up), e4m3fn becomes 256 (it has no Inf)
    assert res.counts["inf_created"] == 16 and res.log.plan.meta["left_out"]["tensors"] == ["/n"]
