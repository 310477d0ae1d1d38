"""The backend registry (fastflip.kernels.registry): names, choice, registration, and that every front end
goes through it; the word rule written once per dialect (ff_word.h for C, Cython and CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import require
from fastflip.core.dtypes import word_type
from fastflip.core.plan import TensorRef
from fastflip.core.records import SiteArrays, TensorTable
from fastflip.errors import OptionError
from fastflip.kernels import dispatch, registry
from fastflip.kernels.engines import NumpyBackend
from fastflip.kernels.gpu_kernels import CUDA_SOURCE
from test_kernels import DTYPES, make_plan, random_array, reference

ROOT = Path(__file__).resolve().parent.parent


class Spy(NumpyBackend):
    """The NumPy engine, counting the kernel calls that reach it."""

    name = "spy"
    calls: list[str] = []

    def apply_words(self, *args):  # type: ignore[no-untyped-def]
        self.calls.append("apply_words")
        return super().apply_words(*args)

    def apply_ptrs(self, table, sites):  # type: ignore[no-untyped-def]
        assert isinstance(sites, SiteArrays) and isinstance(table, TensorTable)  # the record, not loose columns
        self.calls.append("apply_ptrs")
        return super().apply_ptrs(table, sites)


@pytest.fixture
def spy():
    registry.register_backend(Spy)
    Spy.calls = []
    yield Spy
    registry._REGISTRY.pop("spy", None)
    registry._LOADED.pop("spy", None)


def test_names_and_auto() -> None:
    assert registry.registered_backends()[:5] == ["cython", "numba", "numpy", "cuda-raw", "numba-cuda"]
    assert registry.get_backend("numpy").name == "numpy"
    assert registry.get_backend("auto").name == registry.available_backends()[0]
    assert not hasattr(dispatch, "available_backends")  # the registry's is the one list
    with pytest.raises(OptionError, match="unknown backend 'fortran'"):
        registry.get_backend("fortran")


def test_auto_is_cython_when_built() -> None:
    require("fastflip.kernels._cython")
    require("numba")
    assert registry.resolve_backend("auto") == "cython"
    assert registry.available_backends("cpu") == ["cython", "numba", "numpy"]


def test_gpu_backend_without_a_gpu_is_one_clear_error() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(OptionError, match="backend 'cuda-raw' is not available"):
            registry.get_backend("cuda-raw")
    else:  # pragma: no cover - a machine with CuPy
        pytest.skip("CuPy is installed here")


def test_registration_rules(spy) -> None:
    with pytest.raises(OptionError, match="already registered"):

        class Other(NumpyBackend):
            name = "spy"

        registry.register_backend(Other)
    registry.register_backend(Spy, replace=True)  # the same class again is fine
    with pytest.raises(OptionError):
        registry.register_backend(NumpyBackend, name="auto")


def test_file_and_buffer_kernels_go_through_the_registry(spy) -> None:
    rng = np.random.default_rng(5)
    arr = random_array(">f4", 50, rng)
    plan = make_plan([TensorRef("w", ">f4", arr.shape)], rng, per_tensor=20)
    expected, exp_old, exp_new = reference({"w": arr}, plan)
    buf = np.frombuffer(arr.tobytes(), np.uint8).copy()
    old, new = dispatch.apply_at_offsets(buf, plan.index * 4, 4, word_type(">f4").swapped, plan.and_mask,
                                         plan.or_mask, plan.xor_mask, backend="spy")
    assert spy.calls == ["apply_words"]
    assert old.tolist() == exp_old.tolist() and new.tolist() == exp_new.tolist()
    assert buf.tobytes() == expected["w"].tobytes()


def test_live_targets_go_through_the_registry(spy) -> None:
    from fastflip.live import targets

    rng = np.random.default_rng(6)
    arrays = {"a": random_array("<f8", 30, rng), "b": random_array(">i2", 20, rng)}
    originals = {k: v.copy() for k, v in arrays.items()}
    t = targets(arrays)
    plan = make_plan([TensorRef(k, v.dtype.str, v.shape) for k, v in arrays.items()], rng, per_tensor=8)
    expected, exp_old, exp_new = reference(originals, plan)
    old, new = t.apply(plan, t.prepare(plan), backend="spy")
    assert spy.calls == ["apply_ptrs"]
    assert old.tolist() == exp_old.tolist() and new.tolist() == exp_new.tolist()
    assert all(arrays[k].tobytes() == expected[k].tobytes() for k in arrays)


# ------------------------------------------------------------------------------ one word rule per dialect


def test_c_dialects_share_one_header() -> None:
    header = (ROOT / "src" / "fastflip" / "kernels" / "ff_word.h").read_text()
    assert CUDA_SOURCE.startswith(header)
    assert CUDA_SOURCE.count("ff_u64 ff_rule(") == 1
    pyx = (ROOT / "ext" / "_kernels.pyx").read_text()
    assert 'cdef extern from "ff_word.h"' in pyx and "ff_rule(old, and_mask[i]" in pyx
    sys.path.insert(0, str(ROOT / "tools"))
    import archstats

    sites = {s.rsplit(":", 1)[0] for s in archstats.rule_sites(ROOT)}
    assert sites == {"src/fastflip/kernels/ff_word.h", "src/fastflip/kernels/numba_cpu.py",
                     "src/fastflip/core/wordrule.py", "src/fastflip/core/reference.py"}


SIM = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_kernels import DTYPES, make_plan, random_array, reference
from fastflip.core.dtypes import word_type
from fastflip.core.plan import TensorRef
from fastflip.core.records import SiteArrays, TensorTable
from fastflip.kernels import dispatch

rng = np.random.default_rng(3)
for dtype in DTYPES:
    arr = random_array(dtype, 31, rng)
    wt = word_type(dtype)
    plan = make_plan([TensorRef("w", dtype, arr.shape)], rng, per_tensor=12, scale=np.dtype(dtype).kind in "fiu")
    expected, exp_old, exp_new = reference({"w": arr}, plan)
    buf = np.zeros(arr.nbytes + 3, np.uint8)
    buf[1:1 + arr.nbytes] = np.frombuffer(arr.tobytes(), np.uint8)  # unaligned words
    offs = plan.index * wt.itemsize + 1
    old, new = dispatch.apply_at_offsets(buf, offs, wt.itemsize, wt.swapped, plan.and_mask, plan.or_mask,
                                         plan.xor_mask, backend="numba-cuda", scale=plan.scale, dtype=dtype)
    assert old.tolist() == exp_old.tolist() and new.tolist() == exp_new.tolist(), dtype
    assert buf[1:1 + arr.nbytes].tobytes() == expected["w"].tobytes(), dtype
    dispatch.write_at_offsets(buf, offs, wt.itemsize, wt.swapped, old, backend="numba-cuda")
    assert buf[1:1 + arr.nbytes].tobytes() == arr.tobytes(), dtype
print("REGISTRY-SIM-OK", len(DTYPES))
"""


@pytest.mark.slow
def test_numba_cuda_backend_in_the_simulator_matches_reference() -> None:
    """The 'numba-cuda' registry backend (Numba's CUDA simulator) against the oracle, every dtype and byte order."""
    require("numba")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", SIM, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"REGISTRY-SIM-OK {len(DTYPES)}" in proc.stdout
