"""Differential fuzzing of every checkpoint reader: fastflip against the framework's own loader.

Real small files of every format are mutated (seeded; 1-3 byte changes, mostly in the structure:
zip headers and central directory, pickles, .npy and safetensors headers, HDF5 metadata — not
only tensor data). For every mutated file:

* fastflip either refuses it with a :class:`~fastflip.errors.FastflipError` (never another exception), or
* it injects, and then the framework's own loader (``torch.load(weights_only=True)``,
  ``safetensors.numpy.load_file``, ``np.load``, ``h5py``; a ``.keras`` archive through ``zipfile`` and
  ``h5py``) sees exactly the logged flips, each from its logged old word, and nothing else (tied or aliased
  tensors as the loader shares them: :mod:`framework_judge`), and the revert gives the original bytes.

A mutated file the framework itself cannot load is only required to be handled in one of these two
ways. The default tier runs a few hundred cases per format; ``-m slow`` runs more.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile

import h5py
import numpy as np
import pytest

from conftest import require
from framework_judge import judge
from framework_views import h5_group_view, h5_view, np_view, st_numpy_view, torch_view
from fastflip.errors import FastflipError
from fastflip.files.inject import inject_checkpoint_file
from fastflip.files.layout import read_layout
from fastflip.files.revert import revert

# cases per format in the default tier: more where a case is cheap (about 15 ms), fewer for HDF5 and torch
N_CHEAP, N_DEAR = (int(x) for x in os.environ.get("FUZZ_DIFF_N", "250,150").split(","))
CHEAP = ("npy", "npz", "npz-deflated", "safetensors")


# --------------------------------------------------------------------------------------------
# base files and the framework's view of them


def _h5_base(path: str) -> None:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("dense/kernel", data=rng.standard_normal((6, 5)).astype("<f4"))
        f.create_dataset("dense/bias", data=np.arange(5, dtype=">f8"))
        f.create_dataset("conv/chunked", data=np.arange(48, dtype="<i2").reshape(6, 8), chunks=(3, 4))
        f.create_dataset("conv/gz", data=rng.integers(0, 4, (8, 8)).astype("<f4"), chunks=(4, 4),
                         compression="gzip", compression_opts=1)
        f["alias"] = f["dense/kernel"]


def _keras_base(path: str, tmp: str) -> None:
    inner = os.path.join(tmp, "inner.h5")
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.linspace(-1, 1, 24, dtype="<f4").reshape(4, 6))
        f.create_dataset("layers/dense/vars/1", data=np.arange(6, dtype="<f4"))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", '{"keras_version": "3.0"}')
        z.writestr("config.json", json.dumps({"class_name": "Sequential", "config": {"layers": []}}))
        z.write(inner, "model.weights.h5")


def _keras_inner(path: str) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read("model.weights.h5")


def _keras_view(path: str) -> dict[str, np.ndarray]:
    """h5py's reading of the archive's weights file (the base is no model Keras could load)."""
    with h5py.File(io.BytesIO(_keras_inner(path)), "r") as f:
        return h5_group_view(f)


def _safetensors_base(path: str) -> None:
    tensors = {"fc.weight": np.linspace(-1, 1, 12, dtype="<f4").reshape(3, 4), "fc.bias": np.arange(3, dtype="<f2"),
               "steps": np.array([7, 9], "<i8")}
    head, data = {}, b""
    for k, a in tensors.items():
        code = {"<f4": "F32", "<f2": "F16", "<i8": "I64"}[a.dtype.str]
        head[k] = {"dtype": code, "shape": list(a.shape), "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    h = json.dumps(head).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + data)


def _torch_base(path: str, legacy: bool) -> None:
    torch = require("torch")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    sd = {"fc.weight": w, "fc.bias": torch.arange(4, dtype=torch.int32), "emb": torch.randn(3, 2, generator=g).half(),
          "opt": {"state": {0: {"exp_avg": torch.randn(5, generator=g).to(torch.bfloat16)}}, "tied": w}}
    torch.save(sd, path, _use_new_zipfile_serialization=not legacy)


# --------------------------------------------------------------------------------------------
# where to mutate: the structure of each format


def _zip_structure(path: str) -> list[tuple[int, int]]:
    """Byte ranges of a zip that are not tensor data: headers, directory, pickles, .npy headers."""
    size = os.path.getsize(path)
    data = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as fh:
        for info in z.infolist():
            fh.seek(info.header_offset + 26)
            nlen, xlen = struct.unpack("<HH", fh.read(4))
            start = info.header_offset + 30 + nlen + xlen
            keep = 128 if info.filename.endswith(".npy") else 0  # the .npy header is structure
            if not info.filename.endswith(("data.pkl", "byteorder", ".json")):
                data.append((start + keep, start + info.compress_size))
    out, at = [], 0
    for b, e in sorted(data):
        if b > at:
            out.append((at, b))
        at = max(at, e)
    out.append((at, size))
    return [(b, e) for b, e in out if e > b]


def _structure(fmt: str, path: str) -> list[tuple[int, int]]:
    size = os.path.getsize(path)
    if fmt in ("torch", "npz", "keras"):
        return _zip_structure(path)
    if fmt == "safetensors":
        (n,) = struct.unpack("<Q", open(path, "rb").read(8))
        return [(0, 8 + n)]
    if fmt == "npy":
        return [(0, 128)]
    if fmt == "torch-legacy":  # the pickles, then each storage's count
        return [(0, size)]
    lay = read_layout(path)  # hdf5: everything but contiguous data
    data = sorted((t.offset, t.offset + t.nbytes) for t in lay.tensors if t.offset is not None)
    out, at = [], 0
    for b, e in data:
        if b > at:
            out.append((at, b))
        at = max(at, e)
    out.append((at, size))
    return out


def _mutate(raw: bytes, regions: list[tuple[int, int]], rng: np.random.Generator) -> bytes:
    buf = bytearray(raw)
    weights = np.array([e - b for b, e in regions], float)
    for _ in range(int(rng.integers(1, 4))):
        if rng.random() < 0.85:
            b, e = regions[int(rng.choice(len(regions), p=weights / weights.sum()))]
            at = int(rng.integers(b, e))
        else:
            at = int(rng.integers(0, len(buf)))
        kind = rng.random()
        if kind < 0.35:
            buf[at] ^= 1 << int(rng.integers(0, 8))
        elif kind < 0.6 and chr(buf[at]).isdigit():  # a declared number changes: shapes, offsets, sizes
            buf[at] = ord(str(int(rng.integers(0, 10))))
        elif kind < 0.7 and chr(buf[at]).isdigit():
            buf[at] = ord("-")
        elif kind < 0.85:
            buf[at] = int(rng.integers(0, 256))
        else:  # a small integer field (a length, a count, a pickle argument) off by a little
            buf[at] = (buf[at] + int(rng.choice([-2, -1, 1, 2, 128]))) % 256
    return bytes(buf)


# --------------------------------------------------------------------------------------------
# the check


class Tally:
    def __init__(self) -> None:
        self.cases = self.refused = self.injected = self.framework_refuses = 0
        self.failures: list[str] = []


def _case(fmt: str, mutated: str, view, work: str, seed: int, tally: Tally) -> None:
    tally.cases += 1
    out = os.path.join(work, "out" + os.path.splitext(mutated)[1])
    back = os.path.join(work, "back" + os.path.splitext(mutated)[1])
    for p in (out, back, out + ".fflog"):
        if os.path.exists(p):
            os.remove(p)
    original = open(mutated, "rb").read()
    try:
        res = inject_checkpoint_file(mutated, out, seed=seed, sampling={"count": 6}, durable=False)
    except FastflipError:
        tally.refused += 1
        return
    except Exception as exc:  # noqa: BLE001 - the finding: another exception type escaped
        tally.failures.append(f"{fmt} seed {seed}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    tally.injected += 1
    try:
        before = view(mutated)
    except Exception:  # noqa: BLE001 - the framework cannot load the mutated file: nothing to compare
        tally.framework_refuses += 1
        before = None
    if before is not None:
        try:
            after = view(out)
        except Exception as exc:  # noqa: BLE001
            tally.failures.append(f"{fmt} seed {seed}: the framework loads the input but not the output "
                                  f"({type(exc).__name__}: {str(exc)[:120]})")
            return
        for p in judge(before, after, res.log, require_change=False):  # aliases as the framework shares them
            tally.failures.append(f"{fmt} seed {seed}: {p}")
    try:
        revert(res.log, out, back)
    except FastflipError as exc:
        tally.failures.append(f"{fmt} seed {seed}: revert refused: {str(exc)[:200]}")
        return
    if fmt == "keras":  # the archive is rewritten: its entries, and the weights file byte for byte, are restored
        if _entries(back) != _entries(mutated):
            tally.failures.append(f"{fmt} seed {seed}: revert does not give the original entries")
    elif open(back, "rb").read() != original:
        tally.failures.append(f"{fmt} seed {seed}: revert does not give the original bytes")


def _entries(path: str) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _fuzz(fmt: str, base: str, view, tmp: str, n: int, seed0: int, keep: str) -> None:
    """Run seeds ``seed0 .. seed0 + n - 1``, printing each case as it goes (``SEED``, then any ``FAIL``, then
    ``CASE``: :meth:`Worker._batch` reads them); a failing case's input is copied into ``keep``."""
    work = os.path.join(tmp, "work")
    os.makedirs(work, exist_ok=True)
    raw = open(base, "rb").read()
    regions = _structure(fmt, base)
    assert not _case_clean(fmt, base, view, work), "the unmutated file must pass"
    for seed in range(seed0, seed0 + n):
        print(f"SEED {seed}", flush=True)
        rng = np.random.default_rng(seed)
        mutated = _work_input(tmp, base)
        with open(mutated, "wb") as fh:
            fh.write(_mutate(raw, regions, rng))
        t = Tally()
        _case(fmt, mutated, view, work, seed, t)
        if t.failures:
            kept = _keep(mutated, keep, fmt, seed)
            for msg in t.failures:
                print(f"FAIL {seed} " + json.dumps(f"{msg} (input kept: {kept})"), flush=True)
        print(f"CASE {seed} " + json.dumps({k: getattr(t, k) for k in _COUNTS}), flush=True)


#: The per-case counts of a :class:`Tally` the child reports on its ``CASE`` lines.
_COUNTS = ("refused", "injected", "framework_refuses")


def _work_input(tmp: str, base: str) -> str:
    """Where the child writes the mutated file of the case it runs."""
    return os.path.join(tmp, "work", "in" + os.path.splitext(base)[1])


def _keep(mutated: str, keep: str, fmt: str, seed: int) -> str:
    """A copy of a failing case's input in ``keep`` (pytest's temporary folder), to reproduce from."""
    os.makedirs(keep, exist_ok=True)
    kept = os.path.join(keep, f"{fmt}-seed{seed}{os.path.splitext(mutated)[1]}")
    shutil.copyfile(mutated, kept)
    return kept


def _case_clean(fmt: str, base: str, view, work: str) -> list[str]:
    t = Tally()
    _case(fmt, base, view, work, 0, t)
    assert t.injected == 1, t.failures
    return t.failures


FORMATS = {  # format -> (base file name, builder, framework view, extra needed)
    "hdf5": ("m.h5", lambda p, d: _h5_base(p), h5_view, None),
    "keras": ("m.keras", _keras_base, _keras_view, None),
    "npy": ("m.npy", lambda p, d: np.save(p, np.linspace(-3, 3, 40, dtype="<f4").reshape(5, 8)), np_view, None),
    "npz": ("m.npz", lambda p, d: np.savez(p, w=np.linspace(-1, 1, 30, dtype="<f4").reshape(5, 6),
                                           b=np.arange(6, dtype=">i4"), s=np.float64(2.5)), np_view, None),
    "npz-deflated": ("c.npz", lambda p, d: np.savez_compressed(p, w=np.tile(np.arange(8, dtype="<f4"), 8),
                                                               b=np.arange(6, dtype="<i2")), np_view, None),
    "safetensors": ("m.safetensors", lambda p, d: _safetensors_base(p), st_numpy_view, "safetensors"),
    "torch": ("m.pt", lambda p, d: _torch_base(p, False), torch_view, "torch"),
    "torch-legacy": ("l.pt", lambda p, d: _torch_base(p, True), torch_view, "torch"),
}


def _fuzz_format(fmt: str, tmp: str, n: int, seed0: int, keep: str) -> None:
    name, build, view, extra = FORMATS[fmt]
    base = os.path.join(tmp, name)
    if not os.path.exists(base):
        build(base, tmp)
    kind = fmt.split("-")[0] if fmt != "torch-legacy" else fmt
    _fuzz(kind, base, view, tmp, n, seed0, keep)


def _serve() -> None:  # the child process of Worker: one batch of cases per line on stdin
    for line in sys.stdin:
        _fuzz_format(*json.loads(line))
        print("END", flush=True)


class Worker:
    """Runs batches of cases in one child process, kept for the module (one import of fastflip and the frameworks,
    not one a format and tier): a library that crashes on a mutated file (HDF5 can) fails its case, not the test
    session; a fresh child goes on from the next seed. Failing cases' inputs are copied into ``keep``."""

    #: Seconds a batch may run before its child is killed.
    LIMIT = 900

    def __init__(self, tmp: str, keep: str) -> None:
        self.tmp, self.keep, self.proc, self.log = tmp, keep, None, os.path.join(tmp, "worker.stderr")

    def _start(self) -> subprocess.Popen:
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + sys.path))
        with open(self.log, "wb") as err:  # not a pipe: warnings never block the child
            return subprocess.Popen([sys.executable, "-c", "import test_fuzz_differential as T; T._serve()"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env)

    def _batch(self, fmt: str, tmp: str, n: int, seed0: int, total: Tally) -> tuple[list[int], str]:
        """Run seeds ``seed0 ..`` in the child, adding each case's counts and failures to ``total`` as it reports
        them: (the seeds begun, ``"end"``, ``"died"`` or ``"timeout"`` where it ran past :attr:`LIMIT`)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc, timed_out = self.proc, threading.Event()

        def _expire() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(self.LIMIT, _expire)
        watchdog.start()
        try:
            proc.stdin.write(json.dumps([fmt, tmp, n, seed0, self._keep_dir(tmp)]) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        done: list[int] = []
        try:
            for line in proc.stdout:
                word, _, rest = line.rstrip("\n").partition(" ")
                if word == "SEED":
                    done.append(int(rest))
                elif word == "FAIL":
                    total.failures.append(json.loads(rest.split(" ", 1)[1]))
                elif word == "CASE":
                    total.cases += 1
                    for k, v in json.loads(rest.split(" ", 1)[1]).items():
                        setattr(total, k, getattr(total, k) + v)
                elif word == "END":
                    return done, "end"
        finally:
            watchdog.cancel()
        proc.wait()
        return done, "timeout" if timed_out.is_set() else "died"

    def _keep_dir(self, tmp: str) -> str:
        """Where the inputs of the failing cases run in ``tmp`` (one format and tier) are kept."""
        return os.path.join(self.keep, os.path.basename(tmp))

    def _stderr(self) -> bytes:
        with open(self.log, "rb") as fh:
            return fh.read()[-600:]

    def run(self, fmt: str, tmp: str, n: int, seed0: int) -> Tally:
        """Seeds ``seed0 .. seed0 + n - 1`` of ``fmt``; a child that dies part-way fails the seed it ran and a fresh
        one goes on from the next."""
        total, seed, end = Tally(), seed0, seed0 + n
        while seed < end:
            done, how = self._batch(fmt, tmp, end - seed, seed, total)
            if how == "end":
                break
            if how == "timeout":
                at = done[-1] if done else seed - 1
                total.failures.append(f"{fmt}: the batch ran past {self.LIMIT} s and was killed (the last seed begun: "
                                      f"{at}; seeds {at + 1} to {end - 1} not run)")
                break
            if not done:  # before its first case: an import, or the unmutated file, failed
                total.failures.append(f"{fmt}: the process died before its first case "
                                      f"(rc {self.proc.returncode}): {self._stderr()!r}")
                break
            last = done[-1]
            total.cases += 1
            mutated = _work_input(tmp, FORMATS[fmt][0])
            kept = _keep(mutated, self._keep_dir(tmp), fmt, last) if os.path.exists(mutated) else "none"
            total.failures.append(f"{fmt} seed {last}: the process died (rc {self.proc.returncode}; input kept: "
                                  f"{kept}): {self._stderr()[-300:]!r}")
            seed = last + 1
        return total

    def close(self) -> None:
        """End the child: its stdin closed, it leaves its loop and exits (killed only if it has not within a
        minute)."""
        if self.proc is None:
            return
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """The module's :class:`Worker`, its files in memory (``/dev/shm``) where the system has it: the cases judge
    readers, not a disk, and a disk's fsyncs, renames and removals cost more than a case's reading. The inputs of
    failing cases are kept in pytest's temporary folder (``fuzz-failed``)."""
    shm = "/dev/shm"
    keep = str(tmp_path_factory.mktemp("fuzz-failed"))
    root = (tempfile.mkdtemp(prefix="fastflip-fuzz-", dir=shm) if os.path.isdir(shm) and os.access(shm, os.W_OK)
            else str(tmp_path_factory.mktemp("fuzz")))
    w = Worker(root, keep)
    try:
        yield w
    finally:
        w.close()
        shutil.rmtree(root, ignore_errors=True)


def _run(worker: Worker, fmt: str, n: int, seed0: int) -> Tally:
    if FORMATS[fmt][3]:
        require(FORMATS[fmt][3])
    tmp = os.path.join(worker.tmp, f"{fmt}-{seed0}")
    os.makedirs(tmp)
    tally = worker.run(fmt, tmp, n, seed0)
    assert not tally.failures, (f"{len(tally.failures)} of {tally.cases} cases failed:\n"
                                + "\n".join(tally.failures[:20]))
    assert tally.refused > 0 and tally.injected > 0  # the mutations reached both answers
    return tally


def _params(formats):
    """The formats as parameters; those read by PyTorch are framework tests."""
    return [pytest.param(f, marks=pytest.mark.framework) if FORMATS[f][3] == "torch" else f for f in sorted(formats)]


@pytest.mark.parametrize("fmt", _params(FORMATS))
def test_differential_fuzz(fmt, worker):
    _run(worker, fmt, N_CHEAP if fmt in CHEAP else N_DEAR, seed0=1)


# HDF5 itself can crash on crafted metadata (a segfault in its chunk write path, seed 100610 of "hdf5"):
# the large tier covers the formats whose readers and loaders are fastflip's and the frameworks' own.
@pytest.mark.slow
@pytest.mark.parametrize("fmt", _params(f for f in FORMATS if f not in ("hdf5", "keras")))
def test_differential_fuzz_large(fmt, worker):
    _run(worker, fmt, 1000, seed0=100_000)
