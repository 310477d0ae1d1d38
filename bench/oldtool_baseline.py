"""The older tool's injection loop (hdf5_corrupter), as a baseline for end-to-end CLI timings.

The older tool is not installed here; this script reproduces the cost structure of its loop (DESIGN.md,
"Peers"): the checkpoint is opened ``r+`` with h5py and changed in place, and every flip is per-element Python —
pick a dataset uniformly from the list of datasets, pick an element uniformly inside it, read it through h5py
indexing, pack it as a float64 with ``struct``, flip one bit through the value's bit string, unpack, and write
the element back through h5py indexing. A flip that gives NaN or Inf is drawn again, as the older tool did.
Bits are numbered sign first, ``--first-bit``..``--last-bit`` (default 1..8, as in the shipped config).

It keeps none of the older tool's other work (YAML config, logging to a file, the saved injection sequence),
so it is, if anything, faster than the tool it stands for.

Run::

    python bench/oldtool_baseline.py model.h5 --flips 20000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import random
import struct
import sys
import warnings

import h5py


def datasets(f: h5py.File) -> list[str]:
    """Every dataset's path, in the file's order (the older tool's location list)."""
    out: list[str] = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def flip_bit(value: float, bit: int) -> float:
    """``value`` packed as a big-endian float64, bit ``bit`` (0 = sign) flipped through its bit string."""
    bits = "".join(f"{b:08b}" for b in struct.pack(">d", value))
    bits = bits[:bit] + ("0" if bits[bit] == "1" else "1") + bits[bit + 1 :]
    return struct.unpack(">d", int(bits, 2).to_bytes(8, "big"))[0]


def corrupt(path: str, flips: int, seed: int, first_bit: int = 1, last_bit: int = 8) -> int:
    """Flip ``flips`` bits in the file at ``path`` in place, one element at a time; return the flips done."""
    rng = random.Random(seed)
    warnings.simplefilter("ignore", RuntimeWarning)  # float64 -> float32 overflow to Inf, as the older tool wrote it
    with h5py.File(path, "r+") as f:
        names = datasets(f)
        for _ in range(flips):
            ds = f[rng.choice(names)]
            index = tuple(rng.randrange(n) for n in ds.shape)
            if ds.dtype.kind in "iu":  # integers: one binary digit of |v| (leading zeros excluded), sign kept
                v = int(ds[index])
                digits = bin(abs(v))[2:]
                k = rng.randrange(len(digits))
                flipped = int(digits[:k] + ("0" if digits[k] == "1" else "1") + digits[k + 1 :], 2)
                ds[index] = -flipped if v < 0 else flipped
                continue
            value = float(ds[index])
            for _ in range(1000):
                new = flip_bit(value, rng.randint(first_bit, last_bit))
                if math.isfinite(new):
                    break
            ds[index] = new
    return flips


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--flips", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--first-bit", type=int, default=1)
    p.add_argument("--last-bit", type=int, default=8)
    a = p.parse_args(argv)
    corrupt(a.file, a.flips, a.seed, a.first_bit, a.last_bit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
