"""Measure the older tool's float64 path on float32 weights (figures quoted in docs/oldtool.md).

Run: ``python bench/oldtool_artefact.py [attempts] [seed]``

Weights: 1,000,000 float32 values ~ N(0, 0.05) (a typical conv/dense initialisation), one dataset, so that
repeated hits are rare. Settings: the older tool's defaults for a config without a bit range (every bit
of the packed word, burst 1), ``allow_NaN_values`` false; ``float_precision`` 64 (its default packing)
against 32 (exact float32 flips). Prints per precision: the share of attempts that changed the stored
float32, that turned a non-zero value into one below 1e-30 in magnitude (``about 0``), and the Infs
written although NaN/Inf were to be avoided.
"""

from __future__ import annotations

import sys

import numpy as np

from fastflip.compat.oldtool import array_reader, old_tool_plan
from fastflip.compat.oldconfig import OldSettings
from fastflip.core.plan import TensorRef


def measure(precision: int, attempts: int, seed: int) -> dict[str, float]:
    vals = (np.random.default_rng(seed).standard_normal(1_000_000) * 0.05).astype("<f4")
    s = OldSettings(tries=attempts, precision=precision, allow_nan=False, allow_sign_change=False)
    run = old_tool_plan(s, [TensorRef("/w", "<f4", vals.shape)], array_reader([vals]), seed=seed)
    p = run.plan
    old = vals[p.index]
    new = (old.view("u4") ^ p.xor_mask.astype("u4")).view("f4")
    with np.errstate(all="ignore"):
        return {"attempts": run.attempts, "elements": len(p),
                "changed": float((p.xor_mask != 0).sum()) / len(p),
                "to_about_0": float(((np.abs(new) < 1e-30) & (old != 0)).sum()) / len(p),
                "inf_written": int(np.isinf(new).sum()), "nan_written": int(np.isnan(new).sum()),
                "nan_redraws": run.nan_redraws}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for prec in (64, 32):
        r = measure(prec, n, seed)
        print(f"float_precision {prec}: {r['attempts']} attempts on {r['elements']} elements: "
              f"changed {100 * r['changed']:.1f}%, to about 0 {100 * r['to_about_0']:.1f}%, "
              f"Inf written {r['inf_written']} ({100 * r['inf_written'] / r['elements']:.2f}%), "
              f"NaN written {r['nan_written']}, NaN re-draws {r['nan_redraws']}")
