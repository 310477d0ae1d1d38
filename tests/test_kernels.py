"""Every word-kernel backend against the NumPy oracle (fastflip.core.reference.apply_plan)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CPU_BACKENDS, require
from fastflip.kernels import dispatch as native
from fastflip.core.dtypes import word_type
from fastflip.errors import OptionError, ReadOnlyTargetError
from fastflip.core.plan import Plan, TensorRef
from fastflip.core.reference import apply_plan

BACKENDS = CPU_BACKENDS
BASE_DTYPES = ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "?"]
DTYPES = sorted({np.dtype(d).newbyteorder(o).str for d in BASE_DTYPES for o in "<>"})
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def random_array(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    wt = word_type(dtype)
    words = rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size=n, dtype=np.uint64)
    words &= np.uint64(wt.full_mask)
    if wt.kind == "f":  # mostly ordinary values, some raw words (NaN/Inf/subnormals)
        vals = rng.normal(scale=100.0, size=n).astype(np.dtype(dtype).newbyteorder("="))
        raw = vals.view(wt.uint).astype(np.uint64)
        words = np.where(rng.random(n) < 0.8, raw, words)
    if wt.kind == "b":
        words &= np.uint64(1)
    native_dtype = np.dtype(dtype).newbyteorder("=") if wt.itemsize > 1 else np.dtype(dtype)
    return words.astype(wt.uint).view(native_dtype).astype(dtype)


def random_masks(n: int, bits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks of every bitwise fault rule: flip, stuck-at-0/1, burst, zero, set-value, random triples."""
    width = (1 << bits) - 1
    kind = rng.integers(0, 7, size=n)
    bit = np.uint64(1) << rng.integers(0, bits, size=n).astype(np.uint64)
    rnd = lambda: rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # noqa: E731
    a, o, x = np.full(n, ALL), np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    value = rnd() & np.uint64(width)
    x = np.where(kind == 0, bit, x)  # flip
    a = np.where(kind == 1, ~bit, a)  # stuck-at-0
    o = np.where(kind == 2, bit, o)  # stuck-at-1
    x = np.where(kind == 3, rnd() & np.uint64(width), x)  # burst / mask
    a = np.where((kind == 4) | (kind == 5), np.uint64(0), a)  # zero / set value
    o = np.where(kind == 5, value, o)
    r = kind == 6  # arbitrary AND/OR/XOR words (bits above the width must be ignored)
    a, o, x = np.where(r, rnd(), a), np.where(r, rnd(), o), np.where(r, rnd(), x)
    return a, o, x


def make_plan(refs: list[TensorRef], rng: np.random.Generator, per_tensor: int, scale: bool = False) -> Plan:
    tensor, index = [], []
    for t, ref in enumerate(refs):
        k = min(per_tensor, ref.size)
        tensor += [t] * k
        index += list(rng.choice(ref.size, size=k, replace=False))
    tensor_a = np.array(tensor, dtype=np.int32)
    a, o, x = random_masks(len(tensor), 64, rng)  # bits above a word's width must be ignored
    factors = None
    if scale:
        choices = np.array([2.0, -0.5, 1e300, -1e300, 0.0, 1.5, -1.5, 0.5, 1e20, np.nan, np.nan, np.nan])
        factors = rng.choice(choices, size=len(tensor))
    return Plan(tuple(refs), tensor_a, np.array(index, dtype=np.int64), a, o, x, scale=factors)


def reference(arrays: dict[str, np.ndarray], plan: Plan) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The oracle's old/new words, and the arrays holding exactly the oracle's new words.

    The stored arrays are rebuilt from the oracle's words through a raw view (not taken
    from ``apply_plan``'s arrays): assigning a bool element through NumPy normalizes any
    non-zero byte to 1, while the word rule (and every backend) stores the exact byte.
    """
    copies = {k: v.copy() for k, v in arrays.items()}
    old, new = apply_plan(copies, plan)
    exact = {}
    for name, arr in arrays.items():
        raw = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
        exact[name] = raw
    for i in range(len(plan)):
        ref = plan.tensors[int(plan.tensor[i])]
        wt = word_type(ref.dtype)
        word = np.array([new[i]], dtype=wt.uint)
        if wt.swapped:
            word = word.byteswap()
        k = int(plan.index[i]) * wt.itemsize
        exact[ref.name][k : k + wt.itemsize] = word.view(np.uint8)
    for name, arr in arrays.items():
        if arr.dtype.kind != "b":  # cross-check the raw rebuild against the oracle's arrays
            assert exact[name].tobytes() == copies[name].tobytes()
    return exact, old, new


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shift", [0, 3])
def test_apply_at_offsets_matches_reference(backend: str, dtype: str, shift: int) -> None:
    # A seed from the parameters that is the same in every process (str hash() is salted per process).
    rng = np.random.default_rng(zlib.crc32(f"{backend}/{dtype}/{shift}".encode()))
    arr = random_array(dtype, 97, rng)
    ref = TensorRef("w", dtype, arr.shape)
    scalable = np.dtype(dtype).kind in "fiu"
    plan = make_plan([ref], rng, per_tensor=60, scale=scalable)
    expected, exp_old, exp_new = reference({"w": arr}, plan)

    buf = np.zeros(arr.nbytes + shift + 5, dtype=np.uint8)  # ``shift`` makes every word unaligned
    buf[shift : shift + arr.nbytes] = np.frombuffer(arr.tobytes(), dtype=np.uint8)
    wt = word_type(dtype)
    old, new = native.apply_at_offsets(
        buf, plan.index * wt.itemsize + shift, wt.itemsize, wt.swapped,
        plan.and_mask, plan.or_mask, plan.xor_mask, backend=backend, scale=plan.scale, dtype=dtype,
    )
    assert old.tolist() == exp_old.tolist()
    assert new.tolist() == exp_new.tolist()
    assert buf[shift : shift + arr.nbytes].tobytes() == expected["w"].tobytes()
    assert not buf[:shift].any() and not buf[shift + arr.nbytes :].any()

    words = native.read_at_offsets(buf, plan.index * wt.itemsize + shift, wt.itemsize, wt.swapped, backend=backend)
    assert words.tolist() == exp_new.tolist()
    native.write_at_offsets(buf, plan.index * wt.itemsize + shift, wt.itemsize, wt.swapped, old, backend=backend)
    assert buf[shift : shift + arr.nbytes].tobytes() == arr.tobytes()  # restored bit for bit


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [False, True])
def test_apply_ptrs_over_mixed_tensors(backend: str, scale: bool) -> None:
    rng = np.random.default_rng(7 + scale)
    arrays = {f"t{i}": random_array(d, 40 + i, rng) for i, d in enumerate(DTYPES)}
    if scale:  # scale sites only on numeric dtypes
        arrays = {k: v for k, v in arrays.items() if v.dtype.kind != "b"}
    refs = [TensorRef(k, v.dtype.str, v.shape) for k, v in arrays.items()]
    plan = make_plan(refs, rng, per_tensor=25, scale=scale)
    expected, exp_old, exp_new = reference(arrays, plan)
    table = native.PtrTable(
        [v.ctypes.data for v in arrays.values()],
        [v.itemsize for v in arrays.values()],
        [word_type(v.dtype).swapped for v in arrays.values()],
        [v.nbytes for v in arrays.values()],
        [v.dtype for v in arrays.values()],
    )
    itemsizes = table.itemsizes[plan.tensor].astype(np.int64)
    old, new = native.apply_ptrs(table, plan.tensor, plan.index * itemsizes, plan.and_mask, plan.or_mask,
                                 plan.xor_mask, backend=backend, scale=plan.scale)
    assert old.tolist() == exp_old.tolist()
    assert new.tolist() == exp_new.tolist()
    for k in arrays:
        assert arrays[k].tobytes() == expected[k].tobytes(), k
    assert native.read_ptrs(table, plan.tensor, plan.index * itemsizes, backend=backend).tolist() == exp_new.tolist()
    native.write_ptrs(table, plan.tensor, plan.index * itemsizes, old, backend=backend)
    _, back_old, _ = reference(arrays, plan)
    assert back_old.tolist() == exp_old.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["<f2", ">f4", "<f8", "<i1", ">i2", "<i4", ">i8", "<u1", ">u2", "<u4", ">u8"])
def test_scale_edge_cases(backend: str, dtype: str) -> None:
    kind = np.dtype(dtype).kind
    if kind == "f":
        info = np.finfo(dtype)
        values = [1.0, -2.5, float(info.max), float(info.tiny), 0.0, -0.0, np.inf, np.nan, 3.0]
        factors = [2.0, 4.0, 2.0, 0.25, 1e300, -1.0, -1.0, 2.0, 1e308]  # overflow → inf, underflow, sign
    else:
        info = np.iinfo(dtype)
        values = [1, -1 if kind == "i" else 3, int(info.max), int(info.min), 5, 2, 7, 0, 100]
        factors = [0.5, 0.5, 2.0, 2.0, -1.0, 1.5, 1e30, 1e30, -1e30]  # half away from zero, saturation
    arr = np.array(values, dtype=dtype)
    plan = Plan.from_sites([TensorRef("w", dtype, arr.shape)], [0] * len(arr), range(len(arr)), scale=factors)
    expected, exp_old, exp_new = reference({"w": arr}, plan)
    buf = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
    wt = word_type(dtype)
    old, new = native.apply_at_offsets(buf, plan.index * wt.itemsize, wt.itemsize, wt.swapped, plan.and_mask,
                                       plan.or_mask, plan.xor_mask, backend=backend, scale=plan.scale, dtype=dtype)
    assert new.tolist() == exp_new.tolist()
    assert buf.tobytes() == expected["w"].tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data())
def test_arbitrary_masks_hypothesis(backend: str, dtype: str, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 20))
    arr = np.frombuffer(data.draw(st.binary(min_size=n * np.dtype(dtype).itemsize, max_size=n * np.dtype(dtype).itemsize)),
                        dtype=dtype).copy()
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    u64 = st.integers(0, 2**64 - 1)
    masks = [data.draw(st.lists(u64, min_size=len(idx), max_size=len(idx))) for _ in range(3)]
    plan = Plan.from_sites([TensorRef("w", dtype, arr.shape)], [0] * len(idx), idx,
                           and_mask=masks[0], or_mask=masks[1], xor_mask=masks[2])
    expected, exp_old, exp_new = reference({"w": arr}, plan)
    buf = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
    wt = word_type(dtype)
    old, new = native.apply_at_offsets(buf, plan.index * wt.itemsize, wt.itemsize, wt.swapped, plan.and_mask,
                                       plan.or_mask, plan.xor_mask, backend=backend)
    assert (old.tolist(), new.tolist()) == (exp_old.tolist(), exp_new.tolist())
    assert buf.tobytes() == expected["w"].tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_memmap_buffer(tmp_path, backend: str) -> None:
    path = tmp_path / "data.bin"
    arr = np.arange(10, dtype=">f8")
    path.write_bytes(b"HDR" + arr.tobytes())
    mm = np.memmap(path, dtype=np.uint8, mode="r+")
    native.apply_at_offsets(mm, [3 + 8 * 2], 8, np.little_endian, [~0], [0], [1 << 63], backend=backend)
    mm.flush()
    del mm
    out = np.frombuffer(path.read_bytes()[3:], dtype=">f8")
    assert out.tolist() == [0.0, 1.0, -2.0] + list(range(3, 10))
    ro = np.memmap(path, dtype=np.uint8, mode="r")
    with pytest.raises(ReadOnlyTargetError):
        native.apply_at_offsets(ro, [3], 8, False, [~0], [0], [1], backend=backend)
    assert native.read_at_offsets(ro, [3 + 16], 8, np.little_endian, backend=backend)[0] == np.float64(-2.0).view(np.uint64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_change_nothing(backend: str) -> None:
    buf = np.zeros(16, dtype=np.uint8)
    cases = [
        dict(offsets=[13], itemsize=4),  # runs past the end
        dict(offsets=[-1], itemsize=1),
        dict(offsets=[0], itemsize=3),
        dict(offsets=[0, 4], itemsize=4),  # masks have one entry
    ]
    for case in cases:
        with pytest.raises(OptionError):
            native.apply_at_offsets(buf, case["offsets"], case["itemsize"], False, [0], [0xFF], [0], backend=backend)
    assert not buf.any()
    with pytest.raises(OptionError):
        native.apply_at_offsets(buf.reshape(4, 4), [0], 1, False, [0], [0], [0], backend=backend)
    with pytest.raises(OptionError):
        native.apply_at_offsets(buf.view(np.int32), [0], 1, False, [0], [0], [0], backend=backend)
    with pytest.raises(OptionError):
        native.apply_at_offsets(buf[::2], [0], 1, False, [0], [0], [0], backend=backend)
    with pytest.raises(OptionError):
        native.apply_at_offsets(buf, [0.5], 1, False, [0], [0], [0], backend=backend)
    with pytest.raises(OptionError):
        native.apply_at_offsets(buf, [0], 1, False, [0], [0], [0], backend=backend, scale=[2.0])  # no dtype
    assert not buf.any()


def test_backend_choice() -> None:
    require("numba")
    require("fastflip.kernels._cython")
    from fastflip.kernels.registry import available_backends

    assert native.resolve_backend("auto") == available_backends("cpu")[0] == "cython"
    assert available_backends("cpu") == list(native.BACKENDS)
    with pytest.raises(OptionError, match="unknown backend"):
        native.resolve_backend("fortran")


def test_ptr_table_rejects_bad_ids() -> None:
    a = np.zeros(4, dtype=np.float32)
    table = native.PtrTable([a.ctypes.data], [4], [False], [a.nbytes], [a.dtype])
    with pytest.raises(OptionError):
        native.apply_ptrs(table, [1], [0], [0], [0], [0])
    with pytest.raises(OptionError):
        native.PtrTable([a.ctypes.data], [3], [False], [a.nbytes], [a.dtype])
    assert not a.any()
