"""GPU check: verify the GPU kernel against the CPU oracle, then measure its throughput.

Run on a machine with an NVIDIA GPU, CuPy and Numba's CUDA target::

    python bench/gpu_check.py            # about a minute on an H200
    python bench/gpu_check.py --quick    # correctness only

1. Correctness: for every fault model (flip, stuck-at-0/1, random-bits, adjacent, mask,
   random-value, zero, scale) and every dtype (float16/32/64, int/uint 8-64, bool),
   a seeded plan is applied to CuPy arrays through ``fastflip.live.inject`` and to a
   host copy through ``fastflip.core.reference.apply_plan``; the old/new words and every
   byte of every tensor must agree, and ``revert`` must restore the originals. A
   PyTorch CUDA tensor is checked too when torch has CUDA.
2. Throughput: 10^6 and 10^8 single-bit flips on a 1 GiB float32 tensor set (64
   tensors of 4 Mi elements) — the kernel alone (CUDA events) and, for 10^6, the
   whole ``live.inject`` + ``revert`` (plan columns cached on the device).

3. Real trials (``--trials``, needs torch with CUDA): the campaign of ``bench/bench_batched.py``
   (ResNet-18-shaped CNN, 256 images of 3x32x32, cells per layer x {bit 30, mantissa}) with the
   model on the GPU: its rows batched (golden prefix, ``batch_trials`` automatic from free GPU
   memory) must equal the serial ones on a sample; trials/s (goal >= 5,000 on one H200), peak GPU
   memory and flips/s of the bulk kernel (goal >= 1e9) are printed and written with ``--json``.
   ``python bench/gpu_check.py --trials`` runs all three.

Without a GPU, ``NUMBA_ENABLE_CUDASIM=1 python bench/gpu_check.py`` runs the same
kernel in Numba's CUDA simulator on NumPy arrays (small sizes, no timing).

Exit status: 0 all checks passed, 1 a mismatch, 2 the machine lacks what the check needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fastflip.core.dtypes import word_type  # noqa: E402
from fastflip.core.faults import FaultModel  # noqa: E402
from fastflip.core.plan import TensorRef  # noqa: E402
from fastflip.core.reference import apply_plan  # noqa: E402
from fastflip.core.sampling import SiteSpace  # noqa: E402

DTYPES = ["<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"]
MODELS = [FaultModel("flip"), FaultModel("stuck-at-0"), FaultModel("stuck-at-1", n=2), FaultModel("random-bits", n=3),
          FaultModel("adjacent", n=2), FaultModel("mask", mask=0b101, mask_position="random"),
          FaultModel("random-value"), FaultModel("zero"), FaultModel("scale", factor=-2.5)]
SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def random_words(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    wt = word_type(dtype)
    words = rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size=n, dtype=np.uint64)
    words &= np.uint64(wt.full_mask)
    if wt.kind == "f":  # mostly ordinary values so that scale and NaN accounting are exercised
        vals = rng.normal(scale=50.0, size=n).astype(dtype)
        words = np.where(rng.random(n) < 0.9, vals.view(wt.uint).astype(np.uint64), words)
    if wt.kind == "b":
        words &= np.uint64(1)
    return words.astype(wt.uint).view(np.dtype(dtype))


def exact_expected(host: dict[str, np.ndarray], plan, new: np.ndarray) -> dict[str, bytes]:
    """Host tensors holding exactly the oracle's new words (raw bytes: bool elements keep every bit)."""
    out = {k: bytearray(v.tobytes()) for k, v in host.items()}
    for i in range(len(plan)):
        ref = plan.tensors[int(plan.tensor[i])]
        size = np.dtype(ref.dtype).itemsize
        k = int(plan.index[i]) * size
        out[ref.name][k : k + size] = np.array([new[i]], dtype=word_type(ref.dtype).uint).tobytes()
    return {k: bytes(v) for k, v in out.items()}


def check_correctness(n_elem: int, n_sites: int) -> list[str]:
    """Every model x dtype through the GPU path vs the oracle; returns failure messages."""
    failures: list[str] = []
    rng = np.random.default_rng(2026)
    for model in MODELS:
        multi_bit = model.kind in ("scale", "random-bits", "adjacent", "mask") or model.n > 1
        dtypes = [d for d in DTYPES if not (multi_bit and d == "|b1")]  # bool has one allowed bit
        host = {f"t_{np.dtype(d).name}": random_words(d, n_elem + 7 * i, rng) for i, d in enumerate(dtypes)}
        refs = [TensorRef(k, v.dtype.str, v.shape) for k, v in host.items()]
        plan = SiteSpace(refs).plan(seed=7, count=n_sites, model=model)
        oracle = {k: v.copy() for k, v in host.items()}
        exp_old, exp_new = apply_plan(oracle, plan)
        expected = exact_expected(host, plan, exp_new)
        old, new, now, restored = run_on_device(host, plan)
        label = model.describe()
        before = len(failures)
        if old.tolist() != exp_old.tolist() or new.tolist() != exp_new.tolist():
            failures.append(f"{label}: old/new words differ from the oracle")
        for k in host:
            if now[k] != expected[k]:
                failures.append(f"{label}: tensor {k} differs from the oracle after inject")
            if restored[k] != host[k].tobytes():
                failures.append(f"{label}: tensor {k} not restored by revert")
        print(f"  {label:<34} {len(plan):>6} sites over {len(dtypes)} dtypes: "
              f"{'ok' if len(failures) == before else 'FAIL'}", flush=True)
    return failures


def run_on_device(host: dict[str, np.ndarray], plan) -> tuple[np.ndarray, np.ndarray, dict[str, bytes], dict[str, bytes]]:
    if SIM:  # the simulator has no device pointers: lay the tensors out in one span, as on a device
        from fastflip.kernels import gpu as kc

        starts, pos = [], 3
        for v in host.values():
            starts.append(pos)
            pos += v.nbytes + 5
        span = np.zeros(pos, dtype=np.uint8)
        for s, v in zip(starts, host.values()):
            span[s : s + v.nbytes] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        sizes = np.array([v.itemsize for v in host.values()])
        offs = np.array(starts)[plan.tensor] + plan.index * sizes[plan.tensor]
        sites = kc.SiteArrays.from_host(offs, plan.tensor, sizes, [True] * len(host), plan.and_mask, plan.or_mask,
                                        plan.xor_mask, xp=np, scale=plan.scale, dtypes=[v.dtype for v in host.values()])
        old, new = kc.launch_apply(span, sites)
        now = {k: span[s : s + v.nbytes].tobytes() for s, (k, v) in zip(starts, host.items())}
        kc.launch_write(span, sites, old)
        restored = {k: span[s : s + v.nbytes].tobytes() for s, (k, v) in zip(starts, host.items())}
        return np.asarray(old), np.asarray(new), now, restored
    import cupy

    from fastflip import live

    dev = {k: cupy.asarray(v) for k, v in host.items()}
    tg = live.targets(dev)
    log = live.inject(tg, plan)
    now = {k: cupy.asnumpy(v).tobytes() for k, v in dev.items()}
    live.revert(tg, log)
    restored = {k: cupy.asnumpy(v).tobytes() for k, v in dev.items()}
    return log.old_words, log.new_words, now, restored


def check_torch_cuda() -> list[str]:
    try:
        import torch
    except ImportError:
        print("  torch not installed: PyTorch CUDA check skipped")
        return []
    if not torch.cuda.is_available():
        print("  torch has no CUDA: PyTorch CUDA check skipped")
        return []
    from fastflip import live

    rng = np.random.default_rng(5)
    a = random_words("<f4", 1 << 16, rng)
    t = {"w": torch.from_numpy(a.copy()).cuda()}
    plan = SiteSpace([TensorRef("w", "<f4", a.shape)]).plan(seed=3, count=5000, model=FaultModel("random-bits", n=2))
    oracle = {"w": a.copy()}
    _, exp_new = apply_plan(oracle, plan)
    log = live.inject(t, plan)
    ok = log.new_words.tolist() == exp_new.tolist() and t["w"].cpu().numpy().tobytes() == oracle["w"].tobytes()
    live.revert(t, log)
    ok = ok and t["w"].cpu().numpy().tobytes() == a.tobytes()
    print(f"  torch CUDA tensor, 5000 random-bits sites: {'ok' if ok else 'FAIL'}")
    return [] if ok else ["torch CUDA tensor differs from the oracle"]


def throughput(flips_list: list[int]) -> dict[str, float]:
    import cupy

    from fastflip.kernels import gpu as kc
    from fastflip import live

    n_tensors, per = 64, 4 << 20  # 64 x 4 Mi float32 = 1 GiB
    tensors = {f"w{i}": cupy.random.standard_normal(per, dtype=cupy.float32) for i in range(n_tensors)}
    tg = live.targets(tensors)
    span, base = tg._span(0)
    ptrs = cupy.asarray(np.array([t.ptr for t in tg.tensors], dtype=np.int64) - base)
    results: dict[str, float] = {}
    for flips in flips_list:
        # distinct elements drawn on the device (sorted, like the sampler's output)
        elem = cupy.sort(cupy.random.permutation(n_tensors * per)[:flips]).astype(cupy.int64)
        tid = (elem // per).astype(cupy.int32)
        offs = ptrs[tid] + (elem % per) * 4
        xor = cupy.left_shift(cupy.uint64(1), cupy.random.randint(0, 32, size=flips).astype(cupy.uint64))
        sites = kc.SiteArrays(offsets=offs, tensor=tid, sizes=cupy.full(n_tensors, 4, dtype=cupy.int32),
                              little=cupy.ones(n_tensors, dtype=cupy.bool_),
                              and_mask=cupy.full(flips, 0xFFFFFFFFFFFFFFFF, dtype=cupy.uint64),
                              or_mask=cupy.zeros(flips, dtype=cupy.uint64), xor_mask=xor, xp=cupy)
        kc.launch_apply(span, sites)  # compile + warm up (and flip), then flip back below
        best = float("inf")
        for _ in range(5):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            kc.launch_apply(span, sites, sync=False)
            stop.record()
            stop.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        results[f"kernel_{flips:.0e}_s"] = best
        results[f"kernel_{flips:.0e}_flips_per_s"] = flips / best
        print(f"  kernel, {flips:.0e} flips on 1 GiB: {best * 1e3:.3f} ms = {flips / best:.3e} flips/s", flush=True)
        del elem, tid, offs, xor, sites
        cupy.get_default_memory_pool().free_all_blocks()
    space = SiteSpace(tg.refs())
    plan = space.plan(seed=1, count=1_000_000)
    live.revert(tg, live.inject(tg, plan))  # prepare (device columns cached), compile
    t0 = time.perf_counter()
    for _ in range(5):
        live.revert(tg, live.inject(tg, plan))
    dt = (time.perf_counter() - t0) / 5
    results["live_inject_revert_1e6_s"] = dt
    print(f"  live.inject + revert, 1e6 flips (host log included): {dt * 1e3:.2f} ms", flush=True)
    return results


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cuda_model():  # the factory of the --trials campaign: bench_batched's CNN, on the GPU
    import bench_batched

    return bench_batched.model().cuda()


def real_trials(per_cell: int = 64) -> tuple[dict[str, float], list[str]]:
    """Batched + prefix real trials on the GPU vs serial on a sample (see the module docstring)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    c = Campaign.from_dict({
        "name": "gpu", "seed": 3, "paths": [str(Path(__file__).resolve().parent)],
        "target": {"factory": "gpu_check:cuda_model"},
        "evaluator": {"builtin": "classification", "data": "bench_batched:data", "critical": 0.05},
        "cells": {"bits": ["30", "mantissa"], "group_by": "layer"}, "trials": {"per_cell": per_cell}})
    cells = campaign_cells(c)
    runner = TrialRunner(c, cells)
    failures = []
    sample = [(cid, t) for cid in range(0, len(cells), max(1, len(cells) // 12)) for t in range(min(3, per_cell))]
    serial = {(cid, t): tuple(runner.run(cid, t)[:6]) for cid, t in sample}
    torch.cuda.reset_peak_memory_stats()
    rows = [r for cid in range(len(cells)) for r in runner.run_many(cid, range(4))]  # warm-up: probes, prefixes
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    rows = [r for cid in range(len(cells)) for r in runner.run_many(cid, range(per_cell))]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    got = {(r.cell_id, r.trial): tuple(r[:6]) for r in rows}
    bad = [k for k in serial if got[k] != serial[k]]
    if bad:
        failures.append(f"batched rows differ from serial ones at (cell, trial) {bad[:5]}")
    batcher = runner._batcher
    out = {"real_trials": float(len(rows)), "real_trials_per_s": len(rows) / dt,
           "batch_trials": float(batcher.batch if batcher else 1),
           "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}
    print(f"  {len(rows)} real trials in {dt:.2f} s: {out['real_trials_per_s']:,.0f} trials/s (goal >= 5,000), "
          f"B = {out['batch_trials']:.0f}, peak GPU memory {out['peak_gpu_mib']:.0f} MiB; "
          f"{len(serial) - len(bad)}/{len(serial)} sampled rows equal serial", flush=True)
    return out, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="correctness only, no throughput")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--trials", action="store_true", help="also run the real-trials campaign on the GPU")
    args = ap.parse_args()
    from fastflip.kernels import gpu as kc

    engines = ["numba"]
    if SIM:
        print("Numba CUDA simulator: correctness on small sizes, no timing")
    else:
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        except Exception as exc:  # ImportError, CUDARuntimeError
            print(f"no usable GPU/CuPy here ({exc}); install cupy-cuda12x, or run with NUMBA_ENABLE_CUDASIM=1")
            if args.trials and _torch_cuda():  # the real-trials check needs torch with CUDA only
                print("[real trials] batched + golden prefix on the GPU (torch with CUDA, no CuPy):")
                try:
                    figures, bad = real_trials()
                except Exception as err:
                    figures, bad = {}, [f"real trials: {type(err).__name__}: {err}"]
                if args.json:
                    args.json.write_text(json.dumps({"failures": bad, **figures}, indent=2))
                print("FAILED:\n  " + "\n  ".join(bad) if bad else "real-trials check passed")
                return 1 if bad else 0
            return 2
        print(f"GPU: {name} ({n} device(s))")
        engines = ["raw"]
        try:
            from numba import cuda

            if cuda.is_available():
                engines.append("numba")
            else:
                print("Numba's CUDA target is unavailable (it needs the CUDA toolkit's NVVM): numba engine not checked")
        except ImportError:
            print("numba is not installed: numba engine not checked")
    t0 = time.perf_counter()
    failures: list[str] = []
    figures: dict[str, float] = {}
    for engine in engines:
        kc.DEFAULT_ENGINE = engine
        print(f"[engine {engine}] correctness vs the NumPy oracle:")
        try:
            failures += [f"{engine}: {f}" for f in check_correctness(n_elem=40 if SIM else 100_000,
                                                                     n_sites=120 if SIM else 3000)]
            if not SIM:
                failures += [f"{engine}: {f}" for f in check_torch_cuda()]
        except Exception as exc:  # a compile or launch failure is a failed check, reported in one line
            failures.append(f"{engine}: {type(exc).__name__}: {exc}")
            continue
        if not SIM and not args.quick and not failures:
            print(f"[engine {engine}] throughput:")
            figures.update({f"{engine}_{k}": v for k, v in throughput([10**6, 10**8]).items()})
    for k in [k for k in figures if k.endswith("kernel_1e+08_flips_per_s")]:
        print(f"  {k}: {figures[k]:.3g} flips/s (goal >= 1e9)")
    if args.trials and not SIM:
        print("[real trials] batched + golden prefix on the GPU:")
        try:
            more, bad = real_trials()
            figures.update(more)
            failures += bad
        except Exception as exc:
            failures.append(f"real trials: {type(exc).__name__}: {exc}")
    figures["seconds"] = time.perf_counter() - t0
    if args.json:
        args.json.write_text(json.dumps({"failures": failures, **figures}, indent=2))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"all checks passed in {figures['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
