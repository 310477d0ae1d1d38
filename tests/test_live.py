"""Live-tensor injection (fastflip.live) on NumPy arrays and PyTorch CPU tensors, against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CPU_BACKENDS, require
from fastflip import live
from fastflip.errors import (SelectionError, LogMismatchError, OptionError, PlanMismatchError, ReadOnlyTargetError,
                             TensorNotFoundError)
from fastflip.core.plan import Plan, TensorRef
from test_kernels import DTYPES, make_plan, random_array, reference

BACKENDS = CPU_BACKENDS


def numpy_set(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {f"t{i}": random_array(d, 30 + 7 * i, rng).reshape(-1, 1) for i, d in enumerate(DTYPES)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [False, True])
def test_inject_revert_numpy_matches_reference(backend: str, scale: bool) -> None:
    rng = np.random.default_rng(3 + scale)
    arrays = numpy_set(rng)
    if scale:
        arrays = {k: v for k, v in arrays.items() if v.dtype.kind != "b"}
    original = {k: v.copy() for k, v in arrays.items()}
    refs = live.tensor_refs(arrays)
    assert {r.name: r.shape for r in refs} == {k: v.shape for k, v in arrays.items()}
    assert [r.name for r in refs] == sorted(arrays)  # checkpoint (HDF5 name) order
    plan = make_plan(refs, rng, per_tensor=12, scale=scale)
    expected, exp_old, exp_new = reference(original, plan)
    log = live.inject(arrays, plan, backend=backend)
    assert log.old_words.tolist() == exp_old.tolist()
    assert log.new_words.tolist() == exp_new.tolist()
    for k in arrays:
        assert arrays[k].tobytes() == expected[k].tobytes(), k
    live.revert(arrays, log, backend=backend)
    for k in arrays:
        assert arrays[k].tobytes() == original[k].tobytes(), k


def test_non_contiguous_and_memmap(tmp_path) -> None:
    rng = np.random.default_rng(5)
    base = random_array(">f8", 60, rng).reshape(6, 10)
    other = random_array("<u4", 60, rng).reshape(6, 10)
    mm = np.memmap(tmp_path / "m.bin", dtype="<i2", mode="w+", shape=(50,))
    mm[:] = np.arange(50)
    arrays = {"t": base.T, "s": other[::2, 1::3], "m": mm}
    snap = {k: np.array(v) for k, v in arrays.items()}
    refs = live.tensor_refs(arrays)
    plan = make_plan(refs, rng, per_tensor=8)
    expected_vals = {k: v.copy() for k, v in snap.items()}
    from fastflip.core.reference import apply_plan

    exp_old, exp_new = apply_plan(expected_vals, plan)
    log = live.inject(arrays, plan)
    assert log.new_words.tolist() == exp_new.tolist()
    for k in arrays:
        assert np.array(arrays[k]).tobytes() == expected_vals[k].tobytes(), k
    live.revert(arrays, log)
    for k in arrays:
        assert np.array(arrays[k]).tobytes() == snap[k].tobytes(), k


def test_plan_applied_many_times_with_prepared_targets() -> None:
    rng = np.random.default_rng(9)
    arrays = {"a": rng.normal(size=(40, 5)).astype(np.float32), "b": rng.normal(size=17).astype(np.float64)}
    original = {k: v.copy() for k, v in arrays.items()}
    tg = live.targets(arrays)
    plans = [make_plan(tg.refs(), rng, per_tensor=3) for _ in range(5)]
    for _ in range(20):
        for plan in plans:
            log = live.inject(tg, plan)
            live.revert(tg, log)
    for k in arrays:
        assert arrays[k].tobytes() == original[k].tobytes()
    logs = [live.inject(tg, p) for p in plans[:1]]
    assert logs[0].changed <= len(plans[0])
    live.revert(tg, logs[0])


def test_nan_inf_counts_and_to_dict() -> None:
    w = {"w": np.array([1.0, 2.0, 3.0, 0.0, 5.0], dtype=np.float32)}
    exp = 0xFF << 23
    # site 0: all exponent bits set, mantissa kept -> Inf (1.0 has a zero mantissa); site 1: -> NaN; site 2: plain flip
    plan = Plan.from_sites([TensorRef("w", "<f4", (5,))], [0, 0, 0], [0, 2, 4],
                           or_mask=[exp, exp | 1, 0], xor_mask=[0, 0, 1 << 31])
    with live.injected(w, plan) as log:
        assert np.isinf(w["w"][0]) and np.isnan(w["w"][2]) and w["w"][4] == -5.0
        assert (log.nan_count, log.inf_count) == (1, 1)
        d = log.to_dict()
        assert d["nan_count"] == 1 and d["inf_count"] == 1 and d["index"] == [0, 2, 4]
        assert d["old_words"][0] == 0x3F800000 and d["new_words"][0] == 0x7F800000
    assert w["w"].tolist() == [1.0, 2.0, 3.0, 0.0, 5.0]


def test_injected_reverts_when_body_raises() -> None:
    w = {"w": np.arange(8, dtype=np.int32)}
    plan = Plan.from_sites([TensorRef("w", "<i4", (8,))], [0, 0], [1, 5], and_mask=[0, 0])
    with pytest.raises(RuntimeError, match="boom"):
        with live.injected(w, plan):
            assert w["w"][1] == 0 and w["w"][5] == 0
            raise RuntimeError("boom")
    assert w["w"].tolist() == list(range(8))


def test_injected_samples_a_plan_when_none_given() -> None:
    w = {"a": np.zeros(1000, dtype=np.float32), "b": np.zeros(100, dtype=np.int16)}
    with live.injected(w, seed=4, count=25) as log:
        assert len(log) == 25
        changed = int((w["a"].view(np.uint32) != 0).sum() + (w["b"] != 0).sum())  # -0.0 counts
        assert changed == log.changed == 25  # single flips on zero words always change them
        first = log.new_words.copy()
    assert not w["a"].any() and not w["b"].any()
    with live.injected(w, seed=4, count=25) as log2:  # same seed, same sites
        assert log2.new_words.tolist() == first.tolist()
    with pytest.raises(OptionError):
        with live.injected(w, Plan.from_sites([], [], []), seed=1):
            pass


def test_plan_for_another_model_is_refused_before_any_change() -> None:
    w = {"w": np.zeros((4, 4), dtype=np.float32), "v": np.zeros(3, dtype=np.int8)}
    good = TensorRef("w", "<f4", (4, 4))
    cases = [
        (TensorNotFoundError, [good, TensorRef("missing", "<f4", (2,))], [0, 1], [0, 0]),
        (PlanMismatchError, [good, TensorRef("v", "<i1", (4,))], [0, 1], [0, 0]),  # shape
        (PlanMismatchError, [good, TensorRef("v", "<u1", (3,))], [0, 1], [0, 0]),  # dtype
        (PlanMismatchError, [good, TensorRef("v", "<i1", (3,))], [0, 1], [0, 3]),  # index out of range
        (PlanMismatchError, [good], [0, 0], [5, 5]),  # the same element twice
        (PlanMismatchError, [good], [0, -1], [5, 6]),  # a tensor id the plan does not define
    ]
    for err, refs, tensor, index in cases:
        plan = Plan.from_sites(refs, tensor, index, xor_mask=[1] * len(tensor))
        with pytest.raises(err):
            live.inject(w, plan)
        assert not w["w"].any() and not w["v"].any()


def test_big_endian_plan_applies_to_native_tensor() -> None:
    w = {"w": np.array([1.0, 2.0], dtype="<f4")}
    plan = Plan.from_sites([TensorRef("w", ">f4", (2,))], [0], [1], xor_mask=[1 << 31])  # e.g. from a BE checkpoint
    live.inject(w, plan)
    assert w["w"].tolist() == [1.0, -2.0]


def test_read_only_array_refused() -> None:
    a = np.zeros(4, dtype=np.float32)
    a.flags.writeable = False
    plan = Plan.from_sites([TensorRef("w", "<f4", (4,))], [0], [1], xor_mask=[1])
    with pytest.raises(ReadOnlyTargetError, match="read-only"):
        live.inject({"w": a}, plan)
    assert not a.any()


def test_unsupported_inputs_refused() -> None:
    with pytest.raises(OptionError, match="dtype"):
        live.targets({"c": np.zeros(2, dtype=np.complex64)})
    with pytest.raises(OptionError, match="unsupported type"):
        live.targets({"x": [1.0, 2.0]})
    with pytest.raises(OptionError, match="cannot find tensors"):
        live.targets(42)
    with pytest.raises(OptionError, match="negative strides"):
        live.targets({"r": np.zeros(4, dtype=np.float32)[::-1]})
    with pytest.raises(OptionError, match="plan must be"):
        live.inject({"w": np.zeros(2)}, "not a plan")  # type: ignore[arg-type]


def test_revert_with_mismatching_log_changes_nothing() -> None:
    w = {"w": np.arange(10, dtype=np.float64)}
    plan = Plan.from_sites([TensorRef("w", "<f8", (10,))], [0, 0, 0], [2, 4, 6], xor_mask=[1 << 63] * 3)
    log = live.inject(w, plan)
    w["w"][4] = 99.0  # someone changed one injected element since
    snapshot = w["w"].copy()
    with pytest.raises(LogMismatchError, match="1 of 3 sites"):
        live.revert(w, log)
    assert w["w"].tobytes() == snapshot.tobytes()
    other = {"w": np.arange(10, dtype=np.float64)}  # a log from elsewhere: nothing injected here
    with pytest.raises(LogMismatchError):
        live.revert(other, log)
    assert other["w"].tolist() == list(map(float, range(10)))


def test_torch_module_names_match_checkpoint_and_inject_exactly() -> None:
    torch = require("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5))
    model.eval()
    tg = live.targets(model)
    state = model.state_dict()
    assert sorted(r.name for r in tg.refs()) == sorted(state)  # the framework's own names
    assert {a for t in tg.tensors for a in t.aliases} == {f"model/{k}" for k in state}  # checkpoint paths
    before = {k: v.detach().numpy().copy() for k, v in state.items()}
    rng = np.random.default_rng(1)
    plan = make_plan(tg.refs(), rng, per_tensor=5)
    expected, exp_old, exp_new = reference(before, plan)
    x = torch.randn(2, 3, 8, 8)
    clean = model(x)
    log = live.inject(model, plan)
    assert log.new_words.tolist() == exp_new.tolist()
    for k, v in model.state_dict().items():
        assert v.detach().numpy().tobytes() == expected[k].tobytes(), k
    live.revert(tg, log)
    assert torch.equal(model(x), clean)
    for k, v in model.state_dict().items():
        assert v.detach().numpy().tobytes() == before[k].tobytes(), k


@pytest.mark.parametrize("tdtype", ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"])
def test_torch_tensor_dtypes(tdtype: str) -> None:
    torch = require("torch")
    rng = np.random.default_rng(2)
    npd = {"float16": "f2", "float32": "f4", "float64": "f8", "int8": "i1", "int16": "i2", "int32": "i4",
           "int64": "i8", "uint8": "u1", "bool": "?"}[tdtype]
    arr = random_array(np.dtype(npd).str, 64, rng).reshape(8, 8)
    t = torch.from_numpy(arr.copy()).t()  # non-contiguous view
    refs = live.tensor_refs({"t": t})
    plan = make_plan(refs, rng, per_tensor=20)
    expected, _, exp_new = reference({"t": arr.T.copy()}, plan)
    log = live.inject({"t": t}, plan)
    assert log.new_words.tolist() == exp_new.tolist()
    raw = t.view(torch.uint8) if tdtype == "bool" else t  # a bool copy would normalize bytes to 0/1
    assert raw.contiguous().numpy().tobytes() == expected["t"].tobytes()


def test_torch_bfloat16_is_injected_with_its_own_fields() -> None:
    torch = require("torch")
    lin = torch.nn.Linear(2, 2).to(torch.bfloat16)
    tg = live.targets(lin)
    assert tg.skipped == [] and [(t.name, t.format) for t in tg.tensors] == [("weight", "bfloat16"), ("bias", "bfloat16")]
    words = lin.weight.detach().view(torch.int16).numpy().astype(np.uint16).copy()
    with live.injected(lin, seed=1, count=4, bits="sign") as log:
        flipped = lin.weight.detach().view(torch.int16).numpy().astype(np.uint16)
        assert all(int(b) == 1 << 15 for b in log.plan.bits)
        hit = [int(i) for i, j in zip(log.plan.index, log.plan.tensor) if log.plan.tensors[int(j)].name == "weight"]
        want = words.reshape(-1).copy()
        want[hit] ^= 1 << 15
        assert flipped.reshape(-1).tolist() == want.tolist()
    assert lin.weight.detach().view(torch.int16).numpy().astype(np.uint16).tolist() == words.tolist()
    with pytest.raises(SelectionError, match="left out: w"):  # complex tensors are still left out, and said so
        live.targets(_holder(torch))


def _holder(torch):  # a module whose only tensor is complex
    m = torch.nn.Module()
    m.register_buffer("w", torch.zeros(2, dtype=torch.complex64))
    return m


def test_injected_nan_policy_avoid_reads_live_words() -> None:
    from fastflip.errors import NaNPolicyError

    # exponent-MSB flips: 1.0 (exponent 0x7F) would become Inf, 0.5 (0x7E) stays finite
    w = {"w": np.where(np.arange(200) % 2 == 0, 1.0, 0.5).astype(np.float32)}
    with live.injected(w, seed=8, count=20, bits="exponent-msb", nan_policy="avoid") as log:
        assert len(log) == 20 and log.inf_count == 0 and log.nan_count == 0
        assert np.isfinite(w["w"]).all()
    with live.injected(w, seed=8, count=20, bits="exponent-msb") as log:
        assert log.inf_count > 0  # the same draw without the policy does create Inf values
    ones = {"w": np.ones(50, dtype=np.float32)}
    with pytest.raises(NaNPolicyError):
        with live.injected(ones, seed=1, count=5, bits="exponent-msb", nan_policy="avoid"):
            pass
    assert (ones["w"] == 1).all()


def test_gpu_tensor_without_cupy_is_refused_clearly() -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: the refusal path is not reachable")
    except ImportError:
        pass
    from fastflip.live.adapters import LiveTensor
    from fastflip.live.targets import Targets

    cpu = np.zeros(4, dtype=np.float32)
    fake = LiveTensor("g", np.dtype("<f4"), (4,), "cuda", ptr=0, strides=(4,), device=0)
    tg = Targets([LiveTensor("c", cpu.dtype, (4,), "cpu", cpu.ctypes.data, (4,), obj=cpu), fake])
    plan = Plan.from_sites([TensorRef("c", "<f4", (4,)), TensorRef("g", "<f4", (4,))], [0, 1], [0, 0], xor_mask=[1, 1])
    with pytest.raises(OptionError, match="CuPy"):
        live.inject(tg, plan)
    assert not cpu.any()


@pytest.mark.parametrize("model", ["flip", "stuck-at-0", "stuck-at-1:2", "random-bits:3", "adjacent:2", "mask:0b1011@random",
                                   "mask:0b11", "random-value", "zero", "scale:0.75", "scale:1e39"])
def test_every_fault_model_matches_reference(model: str) -> None:
    from fastflip import Sampling

    rng = np.random.default_rng(61)
    arrays = {f"t{i}": random_array(d, 300 + i, rng) for i, d in enumerate(["<f2", ">f4", "<f8", "|i1", ">i4", "<u8"])}
    original = {k: v.copy() for k, v in arrays.items()}
    plan = Sampling(count=200, model=model).plan(live.tensor_refs(arrays), seed=9)
    expected, exp_old, exp_new = reference(original, plan)
    log = live.inject(arrays, plan)
    assert (log.old_words.tolist(), log.new_words.tolist()) == (exp_old.tolist(), exp_new.tolist())
    for k in arrays:
        assert arrays[k].tobytes() == expected[k].tobytes(), k
    live.revert(arrays, log)
    for k in arrays:
        assert arrays[k].tobytes() == original[k].tobytes(), k


def test_live_tensor_gives_the_one_record_and_the_plan_ref() -> None:
    """A LiveTensor is a view that yields :class:`fastflip.core.records.Tensor` (what selection and roles use)
    and :class:`fastflip.core.plan.TensorRef` (what plans and logs use); a CUDA tensor's record says ``device``."""
    from fastflip.core.plan import TensorRef
    from fastflip.core.records import Tensor
    from fastflip.live.adapters import LiveTensor
    from fastflip.live.targets import Targets

    arrays = {"w": np.zeros((2, 3), ">f4"), "b": np.zeros(3, np.int8)}
    tg = Targets.from_tensors(arrays)
    assert tg.records() == [t.record() for t in tg.sampled()]
    assert {r.name: r for r in tg.refs()} == {"w": TensorRef("w", ">f4", (2, 3)), "b": TensorRef("b", "|i1", (3,))}
    r = next(r for r in tg.records() if r.name == "w")
    assert isinstance(r, Tensor) and (r.name, r.storage, r.dtype.str, r.nbytes, r.in_file) == ("w", "memory", ">f4", 24, False)
    gpu = LiveTensor("x", np.dtype("<u2"), (4,), "cuda", ptr=1 << 40, strides=(2,), device=0, format="bfloat16")
    rec = gpu.record()
    assert (rec.storage, rec.format, rec.aliases) == ("device", "bfloat16", ("/x",))
    assert gpu.ref() == TensorRef("x", "bfloat16", (4,))
