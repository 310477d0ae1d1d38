"""GPU check: the GPU path against the CPU oracle on every device, then the goals, PASS/FAIL.

Run on a machine with an NVIDIA GPU, CuPy and PyTorch with CUDA (about 3-6 minutes on an H200; the
stages stop at ``--budget`` seconds, 450 by default, so the whole run stays under 8 minutes)::

    python bench/gpu_check.py --json gpu.json   # everything
    python bench/gpu_check.py --quick           # smaller sizes, fewer trials (about a minute)

1. Correctness (``CHECK`` lines): for every fault model (flip, stuck-at-0/1, random-bits, adjacent, mask,
   random-value, zero, scale) and every dtype (float16/32/64, int/uint 8-64, bool), a seeded plan is
   applied to CuPy arrays through ``fastflip.live.inject`` and to a host copy through
   ``fastflip.core.reference.apply_plan``; the old/new words and every byte of every tensor must agree,
   and ``revert`` must restore the originals. Then, on every device (two where present): one plan over
   a CPU tensor and CuPy arrays and PyTorch tensors on each device (the plan split per device, each
   launch inside its device); and stream order: a PyTorch tensor whose new contents are still queued
   on a non-default torch stream (behind ``torch.cuda._sleep``) and a CuPy array likewise on a
   non-default CuPy stream, injected with that stream current: the flip must land after the queued
   copy (a launch on another stream lands first and is overwritten: a mismatch).
2. Bulk throughput (``GOAL`` line, >= 1e9 flips/s): 10^6 and 10^8 single-bit flips on a 1 GiB float32
   tensor set (64 tensors of 4 Mi elements), device-resident sites, the kernel alone (CUDA events);
   ``live.inject`` + ``revert`` of 10^6 flips with its host log is printed beside it.
3. Real trials (``GOAL`` line, >= 5,000 trials/s): a ResNet-18 built in code (torchvision's topology,
   ``tests/user_models.py``, width 64 = the real 11 M parameters, 10 classes; ``--width`` smaller for a
   quick look), 256 random CIFAR-sized images (3x32x32) labelled by its fault-free predictions, the
   built-in classification evaluator, cells per layer x {bit 30, mantissa}; batched trials with the
   golden prefix (``batch_trials`` automatic), rows checked equal to serial ones on a sample.

Without a GPU the script prints ``gpu_check: no GPU: SKIP`` and exits 0 (nothing measured, nothing
passed; ``--require-gpu`` makes that exit 2). ``NUMBA_ENABLE_CUDASIM=1 python bench/gpu_check.py``
runs stage 1's kernel checks in Numba's CUDA simulator on NumPy arrays (small sizes, no timing).

Exit status: 0 every check and goal passed (or SKIP), 1 a mismatch or a goal missed, 2 ``--require-gpu``
on a machine without one.
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
from fastflip.core.spec import Sampling  # noqa: E402
from fastflip.core.plan import TensorRef  # noqa: E402
from fastflip.core.records import TensorTable  # noqa: E402
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


def check_correctness(n_elem: int, n_sites: int, engine: str = "auto") -> list[str]:
    """Every model x dtype through the GPU path vs the oracle; returns failure messages."""
    failures: list[str] = []
    rng = np.random.default_rng(2026)
    for model in MODELS:
        multi_bit = model.kind in ("scale", "random-bits", "adjacent", "mask") or model.n > 1
        dtypes = [d for d in DTYPES if not (multi_bit and d == "|b1")]  # bool has one allowed bit
        host = {f"t_{np.dtype(d).name}": random_words(d, n_elem + 7 * i, rng) for i, d in enumerate(dtypes)}
        refs = [TensorRef(k, v.dtype.str, v.shape) for k, v in host.items()]
        plan = SiteSpace(refs).plan(Sampling(count=n_sites, model=model), seed=7)
        oracle = {k: v.copy() for k, v in host.items()}
        exp_old, exp_new = apply_plan(oracle, plan)
        expected = exact_expected(host, plan, exp_new)
        old, new, now, restored = run_on_device(host, plan, engine)
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


def run_on_device(host: dict[str, np.ndarray], plan, engine: str = "auto"
                  ) -> tuple[np.ndarray, np.ndarray, dict[str, bytes], dict[str, bytes]]:
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
        table = TensorTable.of_words([word_type(v.dtype) for v in host.values()])
        sites = kc.SiteArrays.from_host(offs, plan.tensor, table, plan.and_mask, plan.or_mask, plan.xor_mask, xp=np,
                                        scale=plan.scale)
        old, new = kc.launch_apply(span, sites, engine=engine)
        now = {k: span[s : s + v.nbytes].tobytes() for s, (k, v) in zip(starts, host.items())}
        kc.launch_write(span, sites, old, engine=engine)
        restored = {k: span[s : s + v.nbytes].tobytes() for s, (k, v) in zip(starts, host.items())}
        return np.asarray(old), np.asarray(new), now, restored
    import cupy

    from fastflip import live

    dev = {k: cupy.asarray(v) for k, v in host.items()}
    tg = live.targets(dev)
    log = live.inject(tg, plan, backend=engine)
    now = {k: cupy.asnumpy(v).tobytes() for k, v in dev.items()}
    live.revert(tg, log, backend=engine)
    restored = {k: cupy.asnumpy(v).tobytes() for k, v in dev.items()}
    return log.old_words, log.new_words, now, restored


def check_torch_cuda(engine: str = "auto") -> list[str]:
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
    two_bits = Sampling(count=5000, model=FaultModel("random-bits", n=2))
    plan = SiteSpace([TensorRef("w", "<f4", a.shape)]).plan(two_bits, seed=3)
    oracle = {"w": a.copy()}
    _, exp_new = apply_plan(oracle, plan)
    log = live.inject(t, plan, backend=engine)
    ok = log.new_words.tolist() == exp_new.tolist() and t["w"].cpu().numpy().tobytes() == oracle["w"].tobytes()
    live.revert(t, log, backend=engine)
    ok = ok and t["w"].cpu().numpy().tobytes() == a.tobytes()
    print(f"  torch CUDA tensor, 5000 random-bits sites: {'ok' if ok else 'FAIL'}")
    return [] if ok else ["torch CUDA tensor differs from the oracle"]


def throughput(flips_list: list[int], engine: str = "auto") -> dict[str, float]:
    import cupy

    from fastflip.kernels import gpu as kc
    from fastflip import live

    n_tensors, per = 64, 4 << 20  # 64 x 4 Mi float32 = 1 GiB
    tensors = {f"w{i}": cupy.random.standard_normal(per, dtype=cupy.float32) for i in range(n_tensors)}
    tg = live.targets(tensors)
    span, base = tg._span(0)
    ptrs = cupy.asarray(kc.span_offsets([t.ptr for t in tg.tensors], np.arange(n_tensors), np.zeros(n_tensors), base))
    results: dict[str, float] = {}
    for flips in flips_list:
        # distinct elements drawn on the device (sorted, like the sampler's output)
        elem = cupy.sort(cupy.random.permutation(n_tensors * per)[:flips]).astype(cupy.int64)
        tid = (elem // per).astype(cupy.int32)
        offs = ptrs[tid] + (elem % per) * 4
        xor = cupy.left_shift(cupy.uint64(1), cupy.random.randint(0, 32, size=flips).astype(cupy.uint64))
        table = TensorTable(itemsizes=cupy.full(n_tensors, 4, dtype=cupy.int32), dtypes=[np.dtype("<f4")] * n_tensors,
                            swaps=cupy.full(n_tensors, not np.little_endian, dtype=cupy.uint8), bases=None,
                            extents=None)
        sites = kc.SiteArrays(offsets=offs, tensor=tid, table=table,
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
    plan = space.plan(Sampling(count=1_000_000), seed=1)
    live.revert(tg, live.inject(tg, plan, backend=engine), backend=engine)  # prepare (device columns cached), compile
    t0 = time.perf_counter()
    for _ in range(5):
        live.revert(tg, live.inject(tg, plan, backend=engine), backend=engine)
    dt = (time.perf_counter() - t0) / 5
    results["live_inject_revert_1e6_s"] = dt
    print(f"  live.inject + revert, 1e6 flips (host log included): {dt * 1e3:.2f} ms", flush=True)
    return results


def _devices(n_max: int = 2) -> list[int]:
    import cupy

    return list(range(min(n_max, cupy.cuda.runtime.getDeviceCount())))


def check_devices(engine: str = "auto") -> list[str]:
    """One plan over a CPU tensor and CuPy arrays (+ torch tensors) on each device, against the oracle."""
    import cupy

    from fastflip import live

    rng = np.random.default_rng(17)
    torch = sys.modules.get("torch") if _torch_cuda() else None
    host: dict[str, np.ndarray] = {"cpu": random_words("<f4", 5000, rng)}
    for d in _devices():
        host[f"cupy{d}"] = random_words("<f2", 70_000 + d, rng)
        if torch is not None:
            host[f"torch{d}"] = random_words("<f4", 90_000 + d, rng)
    tensors: dict[str, object] = {"cpu": host["cpu"].copy()}
    for k, v in host.items():
        if k.startswith("cupy"):
            with cupy.cuda.Device(int(k[4:])):
                tensors[k] = cupy.asarray(v)
        elif k.startswith("torch"):
            tensors[k] = torch.from_numpy(v.copy()).to(f"cuda:{k[5:]}")
    refs = [TensorRef(k, v.dtype.str, v.shape) for k, v in host.items()]
    plan = SiteSpace(refs).plan(Sampling(count=20_000, model=FaultModel("random-bits", n=2)), seed=9)
    oracle = {k: v.copy() for k, v in host.items()}
    exp_old, exp_new = apply_plan(oracle, plan)
    tg = live.targets(tensors)
    log = live.inject(tg, plan, backend=engine)
    ok = log.old_words.tolist() == exp_old.tolist() and log.new_words.tolist() == exp_new.tolist()
    ok = ok and all(_bytes(tensors[k]) == oracle[k].tobytes() for k in host)
    live.revert(tg, log, backend=engine)
    ok = ok and all(_bytes(tensors[k]) == host[k].tobytes() for k in host)
    print(f"  one plan over CPU + {len(_devices())} device(s) {sorted(k for k in host if k != 'cpu')}: "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    return [] if ok else ["a plan over several devices differs from the oracle"]


def _bytes(t: object) -> bytes:
    if isinstance(t, np.ndarray):
        return t.tobytes()
    if type(t).__module__.startswith("cupy"):
        import cupy

        return cupy.asnumpy(t).tobytes()
    return t.cpu().numpy().tobytes()  # type: ignore[attr-defined]


def check_streams(engine: str = "auto") -> list[str]:
    """The flip is ordered after work queued on the current non-default stream (torch's, CuPy's)."""
    import cupy

    from fastflip import live

    failures = []
    rng = np.random.default_rng(23)
    n = 1 << 22
    src = random_words("<f4", n, rng)
    plan = SiteSpace([TensorRef("x", "<f4", (n,))]).plan(Sampling(count=50_000), seed=4)
    oracle = {"x": src.copy()}
    _, exp_new = apply_plan(oracle, plan)
    for d in _devices():
        cases = []
        if _torch_cuda():
            import torch

            def torch_case(d: int = d) -> bool:
                x = torch.zeros(n, dtype=torch.float32, device=f"cuda:{d}")
                y = torch.from_numpy(src.copy()).to(f"cuda:{d}")
                s = torch.cuda.Stream(device=d)
                s.wait_stream(torch.cuda.current_stream(d))
                with torch.cuda.device(d), torch.cuda.stream(s):
                    torch.cuda._sleep(50_000_000)  # ~25 ms of queued work, then the copy the flip must follow
                    x.copy_(y)
                    log = live.inject({"x": x}, plan, backend=engine)
                    good = log.new_words.tolist() == exp_new.tolist() and _bytes(x) == oracle["x"].tobytes()
                    live.revert({"x": x}, log, backend=engine)
                    return good and _bytes(x) == src.tobytes()

            cases.append(("torch stream", torch_case))

        def cupy_case(d: int = d) -> bool:
            with cupy.cuda.Device(d):
                x = cupy.zeros(n, dtype=cupy.float32)
                y = cupy.asarray(src)
                busy = cupy.ones(1 << 26, dtype=cupy.float32)
                cupy.cuda.get_current_stream().synchronize()
                with cupy.cuda.Stream(non_blocking=True):
                    for _ in range(40):  # queued work on this stream only, then the copy the flip must follow
                        busy = cupy.sqrt(busy * busy)
                    x[...] = y
                    log = live.inject({"x": x}, plan, backend=engine)
                    good = log.new_words.tolist() == exp_new.tolist() and _bytes(x) == oracle["x"].tobytes()
                    live.revert({"x": x}, log, backend=engine)
                    return good and _bytes(x) == src.tobytes()

        cases.append(("CuPy stream", cupy_case))
        for label, case in cases:
            ok = case()
            print(f"  device {d}, non-default {label}, flip after queued copy: {'ok' if ok else 'FAIL'}", flush=True)
            if not ok:
                failures.append(f"device {d}: the flip was not ordered on the current {label}")
    return failures


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


WIDTH = int(os.environ.get("FASTFLIP_GPU_CHECK_WIDTH", "64"))  # set by --width (read by the factories)


def _resnet18():  # torchvision's ResNet-18 topology built in code (tests/user_models.py), CIFAR-sized use
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import batch_helpers

    return batch_helpers.resnet18(WIDTH)


def cuda_model():  # the factory of the real-trials campaign: the ResNet-18, on the GPU
    return _resnet18().cuda()


def data() -> tuple[np.ndarray, np.ndarray]:  # 256 random CIFAR-sized images, labelled by the fault-free model
    import torch

    x = np.random.default_rng(5).standard_normal((256, 3, 32, 32), dtype=np.float32)
    with torch.no_grad():
        y = cuda_model()(torch.from_numpy(x).cuda()).argmax(1).cpu().numpy()
    return x, y


def real_trials(per_cell: int = 64) -> tuple[dict[str, float], list[str]]:
    """Batched + prefix real trials on the GPU vs serial on a sample (see the module docstring)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    c = Campaign.from_dict({
        "name": "gpu", "seed": 3, "paths": [str(Path(__file__).resolve().parent)],
        "target": {"factory": "gpu_check:cuda_model"},
        "evaluator": {"builtin": "classification", "data": "gpu_check:data", "critical": 0.05},
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


BULK_GOAL, TRIALS_GOAL = 1e9, 5000.0


def _goal(label: str, value: float | None, goal: float, unit: str) -> bool:
    """One ``GOAL`` line; True when met."""
    if value is None:
        print(f"GOAL {label} >= {goal:,.0f} {unit}: FAIL (not measured)")
        return False
    ok = value >= goal
    print(f"GOAL {label} >= {goal:,.0f} {unit}: {'PASS' if ok else 'FAIL'} ({value:,.3g} {unit})")
    return ok


def _no_gpu() -> str | None:
    """Why this machine cannot run the check (None: CuPy sees a device)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # ImportError, CUDARuntimeError
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no CuPy'}"
    return None


def main(argv: list[str] | None = None) -> int:
    global WIDTH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer trials (about a minute)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--trials", action="store_true", help="(kept for old commands: the real trials always run)")
    ap.add_argument("--no-trials", action="store_true", help="skip the real-trials campaign")
    ap.add_argument("--width", type=int, default=WIDTH, help="ResNet-18 width (64 = the real model)")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds after which remaining stages are skipped")
    ap.add_argument("--require-gpu", action="store_true", help="exit 2 instead of SKIP when there is no GPU")
    args = ap.parse_args(argv)
    WIDTH = args.width
    os.environ["FASTFLIP_GPU_CHECK_WIDTH"] = str(args.width)  # the campaign's factories read it
    if not SIM:
        why = _no_gpu()
        if why is not None:
            print(f"gpu_check: no GPU: SKIP ({why}); nothing was checked or measured, no goal passed")
            return 2 if args.require_gpu else 0
    from fastflip.kernels import gpu as kc

    t0 = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - t0)  # noqa: E731
    failures: list[str] = []
    figures: dict[str, float] = {}
    if SIM:
        print("Numba CUDA simulator: correctness on small sizes, no timing")
        engines = ["numba-cuda"]
    else:
        import cupy

        names = [cupy.cuda.runtime.getDeviceProperties(d)["name"].decode() for d in _devices(8)]
        print(f"GPU: {names[0]} ({len(names)} device(s); checking {len(_devices())})")
        engines = ["cuda-raw"]
        try:
            from numba import cuda

            if cuda.is_available():
                engines.append("numba-cuda")
            else:
                print("Numba's CUDA target is unavailable (it needs the CUDA toolkit's NVVM): numba engine not checked")
        except ImportError:
            print("numba is not installed: numba engine not checked")
    for engine in engines:  # passed to every live call (backend=) and launch (engine=) of the checks
        print(f"[engine {engine}] correctness vs the NumPy oracle:")
        try:
            failures += [f"{engine}: {f}" for f in check_correctness(n_elem=40 if SIM else 100_000, engine=engine,
                                                                     n_sites=120 if SIM else 3000)]
            if not SIM:
                failures += [f"{engine}: {f}" for f in check_torch_cuda(engine)]
                failures += [f"{engine}: {f}" for f in check_devices(engine)]
                failures += [f"{engine}: {f}" for f in check_streams(engine)]
        except Exception as exc:  # a compile or launch failure is a failed check, reported in one line
            failures.append(f"{engine}: {type(exc).__name__}: {exc}")
    print(f"CHECK exact vs fastflip.core.reference on every device and stream: {'FAIL' if failures else 'PASS'}")
    bulk = trials = None
    if not SIM:
        if failures:
            print("[throughput] not measured: the kernels are not exact here")
        elif left() < 60:
            print("[throughput] SKIP: out of time budget")
        else:
            print("[throughput] raw engine:")
            figures.update({f"raw_{k}": v for k, v in throughput([10**6] if args.quick else [10**6, 10**8]).items()})
            bulk = figures.get("raw_kernel_1e+06_flips_per_s" if args.quick else "raw_kernel_1e+08_flips_per_s")
        if args.no_trials:
            print("[real trials] not run (--no-trials)")
        elif not _torch_cuda():
            print("[real trials] not run: torch has no CUDA here")
        elif left() < 90:
            print("[real trials] SKIP: out of time budget")
        else:
            print(f"[real trials] ResNet-18 (width {WIDTH}), batched + golden prefix on the GPU:")
            try:
                more, bad = real_trials(per_cell=16 if args.quick else 64)
                figures.update(more)
                failures += bad
                trials = more.get("real_trials_per_s")
            except Exception as exc:
                failures.append(f"real trials: {type(exc).__name__}: {exc}")
        goals = [_goal("bulk flips/s" + (" (10^6, --quick)" if args.quick else " (10^8)"), bulk, BULK_GOAL, "flips/s")]
        if not args.no_trials:
            goals.append(_goal(f"real trials/s, ResNet-18 width {WIDTH}", trials, TRIALS_GOAL, "trials/s"))
        if not all(goals):
            failures.append("a goal was missed (GOAL lines above)")
    figures["seconds"] = time.perf_counter() - t0
    if args.json:
        args.json.write_text(json.dumps({"failures": failures, **figures}, indent=2))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print(f"PASS: all checks{'' if SIM else ' and goals'} passed in {figures['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
