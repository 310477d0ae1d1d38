"""The CUDA C source of the 'cuda-raw' GPU engine, compiled for the host, against the NumPy oracle.

fastflip.kernels.gpu_kernels.CUDA_SOURCE is what CuPy compiles for the GPU; with -DFF_HOST
its grid-stride loop becomes a plain loop and the host C compiler builds it, so its
word logic (byte order, widths, masks) is checked here on any machine with a C compiler.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from fastflip.kernels import gpu as kc
from fastflip.kernels import gpu_kernels
from fastflip import live
from fastflip.core.dtypes import word_type
from test_kernels import DTYPES, make_plan, random_array, reference


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler on this machine: the CUDA source's host build is not checked")
    lib = gpu_kernels.build_host_library(str(tmp_path_factory.mktemp("ffsrc")), compiler)
    for name, nargs in (("ff_apply", 10), ("ff_read", 6), ("ff_write", 6)):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_longlong]
        fn.restype = None
    return lib


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


@pytest.mark.parametrize("scale", [False, True])
def test_cuda_source_matches_reference(lib, scale: bool) -> None:
    rng = np.random.default_rng(51 + scale)
    dtypes = [d for d in DTYPES if not (scale and np.dtype(d).kind == "b")]
    arrays = {f"t{i}": random_array(d, 50 + 3 * i, rng) for i, d in enumerate(dtypes)}
    refs = live.tensor_refs(arrays)
    plan = make_plan(refs, rng, per_tensor=30, scale=scale)
    expected, exp_old, exp_new = reference(arrays, plan)
    names = [r.name for r in refs]
    # one span holding every tensor at odd starts (unaligned words), as device_span lays them out
    starts, pos = {}, 1
    for k in names:
        starts[k] = pos
        pos += arrays[k].nbytes + 3
    span = np.zeros(pos, dtype=np.uint8)
    for k in names:
        span[starts[k] : starts[k] + arrays[k].nbytes] = np.frombuffer(arrays[k].tobytes(), dtype=np.uint8)
    sizes = np.array([arrays[k].itemsize for k in names], dtype=np.int32)
    swaps = np.array([word_type(arrays[k].dtype).swapped for k in names], dtype=np.uint8)
    offs = np.ascontiguousarray(np.array([starts[k] for k in names])[plan.tensor] + plan.index * sizes[plan.tensor])
    tid = np.ascontiguousarray(plan.tensor, dtype=np.int32)
    old = np.empty(len(plan), np.uint64)
    new = np.empty(len(plan), np.uint64)
    lib.ff_apply(ptr(span), ptr(offs), ptr(tid), ptr(sizes), ptr(swaps), ptr(plan.and_mask), ptr(plan.or_mask),
                 ptr(plan.xor_mask), ptr(old), ptr(new), len(plan))
    if scale:  # the engine's scale step: host scale_words, then the write kernel (as launch_apply does)
        from fastflip.core.wordrule import scale_words

        s = np.flatnonzero(~np.isnan(plan.scale))
        for t in np.unique(tid[s]):
            sel = s[tid[s] == t]
            new[sel] = scale_words(old[sel], plan.scale[sel], arrays[names[t]].dtype)
        so, st, sw = (np.ascontiguousarray(a[s]) for a in (offs, tid, new))
        lib.ff_write(ptr(span), ptr(so), ptr(st), ptr(sizes), ptr(swaps), ptr(sw), len(s))
    assert old.tolist() == exp_old.tolist()
    assert new.tolist() == exp_new.tolist()
    for k in names:
        assert span[starts[k] : starts[k] + arrays[k].nbytes].tobytes() == expected[k].tobytes(), k
    out = np.empty(len(plan), np.uint64)
    lib.ff_read(ptr(span), ptr(offs), ptr(tid), ptr(sizes), ptr(swaps), ptr(out), len(plan))
    assert out.tolist() == exp_new.tolist()
    lib.ff_write(ptr(span), ptr(offs), ptr(tid), ptr(sizes), ptr(swaps), ptr(old), len(plan))
    for k in names:
        assert span[starts[k] : starts[k] + arrays[k].nbytes].tobytes() == arrays[k].tobytes(), k


def test_engine_names() -> None:
    assert kc._engine(np, "auto") == "numba-cuda" and kc.ENGINES == ("cuda-raw", "numba-cuda")
    for name in ("opencl", "raw", "numba"):  # one naming scheme: the registry's
        with pytest.raises(ValueError, match="use 'auto', 'cuda-raw', 'numba-cuda'"):
            kc._engine(np, name)
