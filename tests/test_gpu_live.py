"""Live injection into GPU memory (CuPy arrays, PyTorch CUDA tensors) against the NumPy oracle.

Needs an NVIDIA GPU, CuPy and Numba's CUDA target; skipped, with the reason, when
none is present. The kernel's logic is also checked without a GPU in
tests/test_gpu_sim.py (CUDA simulator).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available
from fastflip import live
from test_kernels import DTYPES, make_plan, random_array, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="no NVIDIA GPU with CuPy on this machine: GPU tests not run"),
]

NATIVE = [d for d in DTYPES if d[0] in "<|"]  # device arrays are native-order


@pytest.mark.parametrize("scale", [False, True])
def test_cupy_arrays_match_reference(scale: bool) -> None:
    import cupy

    rng = np.random.default_rng(31 + scale)
    host = {f"t{i}": random_array(d, 1000 + i, rng) for i, d in enumerate(NATIVE) if not (scale and d == "|b1")}
    dev = {k: cupy.asarray(v) for k, v in host.items()}
    plan = make_plan(live.tensor_refs(dev), rng, per_tensor=300, scale=scale)
    expected, exp_old, exp_new = reference(host, plan)
    tg = live.targets(dev)
    assert tg.kinds == {"cuda"}
    log = live.inject(tg, plan)
    assert log.old_words.tolist() == exp_old.tolist()
    assert log.new_words.tolist() == exp_new.tolist()
    for k in host:
        assert cupy.asnumpy(dev[k]).tobytes() == expected[k].tobytes(), k
    live.revert(tg, log)
    for k in host:
        assert cupy.asnumpy(dev[k]).tobytes() == host[k].tobytes(), k


def test_torch_cuda_and_cpu_in_one_plan() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA on this machine")
    rng = np.random.default_rng(41)
    a, b = random_array("<f4", 5000, rng), random_array("<f2", 700, rng)
    tensors = {"gpu": torch.from_numpy(a.copy()).cuda(), "cpu": torch.from_numpy(b.copy())}
    plan = make_plan(live.tensor_refs(tensors), rng, per_tensor=100)
    expected, _, exp_new = reference({"gpu": a, "cpu": b}, plan)
    log = live.inject(tensors, plan)
    assert log.new_words.tolist() == exp_new.tolist()
    assert tensors["gpu"].cpu().numpy().tobytes() == expected["gpu"].tobytes()
    assert tensors["cpu"].numpy().tobytes() == expected["cpu"].tobytes()
    live.revert(tensors, log)
    assert tensors["gpu"].cpu().numpy().tobytes() == a.tobytes()
