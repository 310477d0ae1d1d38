"""The GPU kernel (fastflip.kernels.gpu) run in Numba's CUDA simulator against the NumPy oracle.

The simulator is chosen when Numba is first imported, so the check runs in a fresh
interpreter with NUMBA_ENABLE_CUDASIM=1. The kernel and the launch code are the ones
used on a real GPU; only the arrays are NumPy arrays instead of CuPy arrays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require

SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from numba import cuda
assert cuda.simulator_enabled if hasattr(cuda, "simulator_enabled") else True
from numba.core import config
assert config.ENABLE_CUDASIM, "simulator not enabled"
from test_kernels import DTYPES, random_array, make_plan, reference
from fastflip.core.dtypes import word_type
from fastflip.core.plan import TensorRef
from fastflip.core.records import TensorTable
from fastflip.kernels import gpu as kc

rng = np.random.default_rng(11)
for scale in (False, True):
    dtypes = [d for d in DTYPES if not (scale and np.dtype(d).kind == "b")]
    arrays = {f"t{i}": random_array(d, 9 + i, rng) for i, d in enumerate(dtypes)}
    refs = [TensorRef(k, v.dtype.str, v.shape) for k, v in arrays.items()]
    plan = make_plan(refs, rng, per_tensor=4, scale=scale)
    expected, exp_old, exp_new = reference(arrays, plan)
    # one span holding every tensor at an odd start (unaligned words), like device memory
    starts, pos = [], 1
    for v in arrays.values():
        starts.append(pos)
        pos += v.nbytes + 3
    span = np.zeros(pos, dtype=np.uint8)
    for s, v in zip(starts, arrays.values()):
        span[s : s + v.nbytes] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    sizes = [v.itemsize for v in arrays.values()]
    swaps = [word_type(v.dtype).swapped for v in arrays.values()]
    offs = np.array(starts)[plan.tensor] + plan.index * np.array(sizes)[plan.tensor]
    table = TensorTable.of_words([word_type(v.dtype) for v in arrays.values()])
    assert table.itemsizes.tolist() == sizes and table.swaps.tolist() == swaps
    sites = kc.SiteArrays.from_host(offs, plan.tensor, table, plan.and_mask, plan.or_mask, plan.xor_mask,
                                    xp=np, scale=plan.scale)
    # the launch functions, then the same sites through the registry, as the live CUDA path calls them
    be = kc.gpu_backend(np)
    assert be.name == "numba-cuda" and be.device == "gpu"
    for apply, read, write in ((kc.launch_apply, kc.launch_read, kc.launch_write),
                               (be.apply_sites, be.read_sites, be.write_sites)):
        old, new = apply(span, sites)
        assert old.tolist() == exp_old.tolist(), "old words differ"
        assert new.tolist() == exp_new.tolist(), "new words differ"
        for s, (k, v) in zip(starts, arrays.items()):
            assert span[s : s + v.nbytes].tobytes() == expected[k].tobytes(), k
        assert read(span, sites).tolist() == exp_new.tolist()
        write(span, sites, old)
        for s, v in zip(starts, arrays.values()):
            assert span[s : s + v.nbytes].tobytes() == v.tobytes()
print("GPU-SIM-OK", len(plan))
"""


@pytest.mark.slow
def test_gpu_kernel_in_cuda_simulator() -> None:
    require("numba")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    tests_dir = str(Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, tests_dir], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GPU-SIM-OK" in proc.stdout


@pytest.mark.slow
def test_gpu_check_script_passes_in_simulator(tmp_path) -> None:
    """bench/gpu_check.py (run later on a GPU machine) checks every fault model x dtype; here in the simulator."""
    require("numba")
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
    out = tmp_path / "figures.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(script), "--json", str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(": ok") == 9 and "all checks passed" in proc.stdout
    import json

    assert json.loads(out.read_text())["failures"] == []
