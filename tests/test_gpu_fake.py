"""The live CUDA path's device, stream and compile choices, checked with a fake CuPy (tests/fake_cupy.py).

The fake runs the real CUDA C source compiled for the host on host memory, so every injection is also
checked against the NumPy oracle; it records (and refuses, as a GPU would) launches on the wrong device, and
records the stream of every launch and when the kernels were compiled. A real GPU run of the same path is
tests/test_gpu_live.py and bench/gpu_check.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fake_cupy
from fastflip import live
from fastflip.errors import DeviceError, FastflipError
from test_kernels import make_plan, random_array, reference

DTYPES = ["<f4", "<f2", "<i8", "|u1", "<f8"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler on this machine: the fake CuPy runs the CUDA source built for the host")
    return fake_cupy.host_library(str(tmp_path_factory.mktemp("fakecupy")), compiler)


@pytest.fixture
def fake(monkeypatch, lib):
    return fake_cupy.install(monkeypatch, lib, n_devices=2)


def on_devices(fake, host: dict[str, np.ndarray], where: dict[str, int | str]) -> dict:
    """The tensors of ``host`` placed as ``where`` says: 'cpu' (NumPy), a device number (CuPy array), or
    'torch:<device>' (a PyTorch CUDA tensor)."""
    out = {}
    for k, v in host.items():
        w = where[k]
        if w == "cpu":
            out[k] = v.copy()
        elif isinstance(w, str):
            out[k] = fake_cupy.TorchCudaTensor(v.copy(), int(w.split(":")[1]))
        else:
            with fake.cuda.Device(w):
                out[k] = fake.asarray(v)
    return out


def as_bytes(fake, tensors: dict) -> dict[str, bytes]:
    return {k: (t if isinstance(t, np.ndarray) else t._a).tobytes() for k, t in tensors.items()}


def mixed(fake, seed: int, where: dict[str, int | str], per_tensor: int = 40, scale: bool = False):
    rng = np.random.default_rng(seed)
    host = {k: random_array(DTYPES[i % len(DTYPES)], 300 + 7 * i, rng) for i, k in enumerate(where)}
    tensors = on_devices(fake, host, where)
    plan = make_plan(live.tensor_refs(tensors), rng, per_tensor=per_tensor, scale=scale)
    return host, tensors, plan


@pytest.mark.parametrize("scale", [False, True])
def test_each_device_launches_inside_itself_and_matches_the_oracle(fake, scale: bool) -> None:
    host, tensors, plan = mixed(fake, 3 + scale, {"c": "cpu", "a0": 0, "b0": 0, "a1": 1, "b1": 1}, scale=scale)
    expected, exp_old, exp_new = reference(host, plan)
    tg = live.targets(tensors)
    log = live.inject(tg, plan)
    assert log.old_words.tolist() == exp_old.tolist() and log.new_words.tolist() == exp_new.tolist()
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in expected.items()}
    launches = fake.launches()
    assert {dev for _, _, dev, _ in launches} == {0, 1}  # one plan, split per device
    live.revert(tg, log)
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}


def test_kernels_compiled_once_per_device_when_the_plan_is_prepared(fake) -> None:
    _, tensors, plan = mixed(fake, 5, {"a0": 0, "a1": 1})
    tg = live.targets(tensors)
    tg.prepare(plan)
    compiled = [e for e in fake.log if e[0] == "compile"]
    assert sorted((name, dev) for _, name, dev in compiled) == sorted(
        (f"ff_{k}", d) for k in ("apply", "read", "write") for d in (0, 1))
    assert not fake.launches()  # compiled, nothing launched yet
    live.revert(tg, live.inject(tg, plan))
    other = make_plan(live.tensor_refs(tensors), np.random.default_rng(6), per_tensor=10)
    live.revert(tg, live.inject(tg, other))
    assert [e for e in fake.log if e[0] == "compile"] == compiled  # the per-device cache is reused


def test_launches_follow_torchs_current_stream(fake, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    streams = {0: 0x7000, 1: 0x7100}
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: type("S", (), {"cuda_stream": streams[device]}))
    host, tensors, plan = mixed(fake, 7, {"t0": "torch:0", "t1": "torch:1", "c": "cpu"})
    expected, _, _ = reference(host, plan)
    tg = live.targets(tensors)
    log = live.inject(tg, plan)
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in expected.items()}
    live.revert(tg, log)
    launches = fake.launches()
    assert launches and all(stream == streams[dev] for _, _, dev, stream in launches), launches
    assert {dev for _, _, dev, _ in launches} == {0, 1}
    for dev in (0, 1):  # each device's words are complete (its stream synchronised) before inject returns
        assert ("sync", dev, streams[dev]) in fake.log
    # uploads of the words revert writes went on torch's stream of the device too
    copies = [e for e in fake.log[fake.log.index(launches[-1]) - 3:] if e[0] == "copy"]
    assert copies and all(ptr == streams[dev] for _, dev, ptr in copies)


def test_launches_follow_cupys_current_stream_and_wait_for_it_beside_torch(fake, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    host, tensors, plan = mixed(fake, 9, {"a": 0, "b": 0})
    tg = live.targets(tensors)
    with fake.cuda.Stream() as s:  # CuPy arrays: CuPy's current (non-default) stream
        live.revert(tg, live.inject(tg, plan))
    assert fake.launches() and all(e[3] == s.ptr for e in fake.launches())
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}
    # a device holding a torch tensor and a CuPy array: torch's stream, after CuPy's current stream
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0x7700}))
    fake.log.clear()
    host, tensors, plan = mixed(fake, 10, {"t": "torch:1", "c": 1})
    tg = live.targets(tensors)
    with fake.cuda.Device(1), fake.cuda.Stream() as s:
        live.inject(tg, plan)
    first = fake.log.index(fake.launches()[0])
    assert ("record", 1, s.ptr) in fake.log[:first] and ("wait", 1, 0x7700, s.ptr) in fake.log[:first]
    assert all(e[3] == 0x7700 for e in fake.launches())


def test_missing_nvrtc_is_one_line_before_anything_is_flipped(fake) -> None:
    fake.fail_compile = True
    host, tensors, plan = mixed(fake, 11, {"c": "cpu", "a0": 0, "a1": 1})
    with pytest.raises(DeviceError) as err:
        live.inject(tensors, plan)
    msg = str(err.value)
    assert "\n" not in msg and "NVRTC" in msg and "libnvrtc" in msg and "nothing was flipped" in msg
    assert not fake.launches()
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}  # the CPU tensor too


def test_a_failed_launch_on_the_second_device_rolls_back_the_first_and_the_cpu(fake) -> None:
    fake.fail_launch = lambda name, dev: name == "ff_apply" and dev == 1
    host, tensors, plan = mixed(fake, 13, {"c": "cpu", "a0": 0, "b0": 0, "a1": 1})
    with pytest.raises(DeviceError) as err:
        live.inject(tensors, plan)
    msg = str(err.value)
    assert "\n" not in msg and "CUDA device 1" in msg and "written back" in msg
    assert {dev for _, name, dev, _ in fake.launches() if name == "ff_apply"} == {0, 1}  # device 0 had flipped
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}


def test_a_failed_rollback_says_the_state_is_unknown(fake) -> None:
    fake.fail_launch = lambda name, dev: dev == 1 or name == "ff_write"
    _, tensors, plan = mixed(fake, 15, {"a0": 0, "a1": 1})
    with pytest.raises(FastflipError, match="unknown state"):
        live.inject(tensors, plan)


def test_gpu_check_skips_cleanly_without_a_gpu() -> None:
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU: SKIP" in proc.stdout and "PASS" not in proc.stdout
    proc = subprocess.run([sys.executable, str(script), "--quick", "--require-gpu"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no GPU" in proc.stdout


def test_registry_backend_launches_on_the_buffers_device(fake) -> None:
    from fastflip.kernels.registry import get_backend

    rng = np.random.default_rng(17)
    host = rng.integers(0, 256, size=4096, dtype=np.uint8)
    offsets = np.sort(rng.choice(4096 // 4, size=100, replace=False)).astype(np.int64) * 4
    flips = np.uint64(1) << rng.integers(0, 32, 100).astype(np.uint64)
    masks = [np.full(100, 2**64 - 1, np.uint64), np.zeros(100, np.uint64), flips]
    cpu = host.copy()
    exp_old, exp_new = get_backend("numpy").apply_words(cpu, offsets, 4, False, *masks)
    with fake.cuda.Device(1):
        buf = fake.asarray(host)
    be = get_backend("cuda-raw")
    old, new = be.apply_words(buf, offsets, 4, False, *masks)  # called from device 0
    assert fake.asnumpy(old).tolist() == exp_old.tolist() and fake.asnumpy(new).tolist() == exp_new.tolist()
    assert buf._a.tobytes() == cpu.tobytes()
    assert {dev for _, _, dev, _ in fake.launches()} == {1}


def test_a_failed_launch_on_the_first_part_says_nothing_was_flipped(fake) -> None:
    fake.fail_launch = lambda name, dev: dev == 0
    host, tensors, plan = mixed(fake, 19, {"a0": 0, "a1": 1})
    with pytest.raises(DeviceError, match="CUDA device 0 failed .*; no other part was flipped$"):
        live.inject(tensors, plan)
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}


def test_a_gpu_backend_named_by_backend_serves_the_cuda_tensors_and_the_cpu_ones_take_auto(fake) -> None:
    host, tensors, plan = mixed(fake, 23, {"c": "cpu", "a0": 0, "a1": 1})
    expected, exp_old, exp_new = reference(host, plan)
    tg = live.targets(tensors)
    log = live.inject(tg, plan, backend="cuda-raw")  # the engine is a parameter, not a module-wide setting
    assert log.old_words.tolist() == exp_old.tolist() and log.new_words.tolist() == exp_new.tolist()
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in expected.items()}
    assert sorted(dev for _, _, dev, _ in fake.launches()) == [0, 1]  # one launch per device, none for the CPU tensor
    live.revert(tg, log, backend="cuda-raw")
    assert as_bytes(fake, tensors) == {k: v.tobytes() for k, v in host.items()}


@pytest.mark.parametrize("old", ["raw", "numba"])
def test_the_old_gpu_engine_names_are_refused_naming_the_new_ones(fake, old: str) -> None:
    from fastflip.errors import OptionError
    from fastflip.kernels import gpu

    with pytest.raises(OptionError, match=f"unknown GPU engine '{old}': use 'auto', 'cuda-raw', 'numba-cuda'"):
        gpu.gpu_backend(fake, old)
    assert not hasattr(gpu, "DEFAULT_ENGINE") and gpu.gpu_backend(fake).name == "cuda-raw"


def carved(rng: np.random.Generator, gap: int = 40) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Tensors of every dtype of :data:`DTYPES` carved out of one host buffer with gaps between them (a span over
    them covers bytes that belong to no tensor), and the buffer that holds them."""
    arrays = [random_array(d, 50 + 13 * i, rng) for i, d in enumerate(DTYPES)]
    buf = np.zeros(sum(a.nbytes + gap + 8 for a in arrays) + gap, np.uint8)
    views, at = {}, gap
    for i, a in enumerate(arrays):
        at = -(-at // 8) * 8  # every dtype's alignment
        views[f"t{i}"] = v = buf[at: at + a.nbytes].view(a.dtype)
        v[...] = a
        at += a.nbytes + gap
    return buf, views


def test_span_offsets_are_the_numpy_references_sites_in_a_span(fake) -> None:
    """``span_offsets`` (the one routine behind every device span) puts each site of a plan on the bytes of the
    element the NumPy oracle changes; the GPU engine's ``*_ptrs`` entries, which build their span with it, give the
    oracle's words and tensors on a fake device."""
    import ctypes

    from fastflip.core.records import SiteArrays
    from fastflip.kernels import gpu
    from fastflip.kernels.dispatch import PtrTable
    from fastflip.kernels.registry import get_backend

    rng = np.random.default_rng(29)
    _, views = carved(rng)
    host = {k: v.copy() for k, v in views.items()}
    plan = make_plan(live.tensor_refs(host), rng, per_tensor=30)
    expected, exp_old, exp_new = reference(host, plan)
    tensors = list(views.values())
    ptrs = [t.ctypes.data for t in tensors]
    sizes = np.array([t.itemsize for t in tensors], np.int64)
    base, end = min(ptrs), max(p + t.nbytes for p, t in zip(ptrs, tensors))
    in_tensor = plan.index * sizes[plan.tensor]
    offs = gpu.span_offsets(ptrs, plan.tensor, in_tensor, base)
    span = np.ctypeslib.as_array((ctypes.c_uint8 * (end - base)).from_address(base))
    for t, i, o in zip(plan.tensor.tolist(), plan.index.tolist(), offs.tolist()):
        assert span[o: o + sizes[t]].tobytes() == tensors[t][i: i + 1].tobytes()

    table = PtrTable(ptrs, sizes.tolist(), [False] * len(tensors), [t.nbytes for t in tensors],
                     [t.dtype for t in tensors])
    sites = SiteArrays(tensor=plan.tensor, offsets=in_tensor, and_mask=plan.and_mask, or_mask=plan.or_mask,
                       xor_mask=plan.xor_mask)
    be = get_backend("cuda-raw")
    with fake.cuda.Device(1):  # a pointer table's device is the current one
        old, new = be.apply_ptrs(table, sites)
        assert old.tolist() == exp_old.tolist() and new.tolist() == exp_new.tolist()
        assert {k: v.tobytes() for k, v in views.items()} == {k: v.tobytes() for k, v in expected.items()}
        assert be.read_ptrs(table, sites).tolist() == exp_new.tolist()
        be.write_ptrs(table, sites, old)
    assert {k: v.tobytes() for k, v in views.items()} == {k: v.tobytes() for k, v in host.items()}
    assert {dev for _, _, dev, _ in fake.launches()} == {1}
