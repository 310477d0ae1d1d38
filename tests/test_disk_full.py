"""Disk full (ENOSPC): one line that says so, nothing half-written.

Each case runs twice: on a real 1 MiB tmpfs (mounted as root; skipped where mounting is not
allowed) and with ENOSPC simulated at Python's file writes (always runs).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import zipfile

import h5py
import numpy as np
import pytest

from fastflip.cli import main
from fastflip.files.filebytes import sha256_file


@pytest.fixture(params=["tmpfs", "simulated"])
def disk(request):
    return request.param


@contextlib.contextmanager
def small_disk(path, kind, size="1m"):
    """Yield (directory, simulated): a real tmpfs of ``size`` mounted at ``path`` (kind 'tmpfs'; skipped
    where mounting is not allowed, e.g. without root), or a plain folder where the caller simulates ENOSPC."""
    os.makedirs(path, exist_ok=True)
    if kind == "simulated":
        yield str(path), True
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); the simulated variant runs instead")
    try:
        yield str(path), False
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def _simulate_enospc(monkeypatch, directory):
    """Make writes to files under ``directory`` fail with ENOSPC once 64 KiB are written."""
    import builtins

    real_open = builtins.open

    class Full:
        def __init__(self, fh):
            self._fh, self._n = fh, 0

        def write(self, b):
            self._n += len(b)
            if self._n > 64 << 10:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self._fh.write(b)

        def __getattr__(self, name):
            return getattr(self._fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self._fh.close()

    def fake_open(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if isinstance(file, (str, os.PathLike)) and str(file).startswith(str(directory)) and ("w" in mode or "+" in mode):
            return Full(fh)
        return fh

    import io

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)  # zipfile opens through io.open
    # writes at an offset (os.pwrite) and blocks copied file to file in the kernel (os.copy_file_range) count too
    written: dict[int, int] = {}

    def count(fd, n):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
            written[fd] = written.get(fd, 0) + n
            if written[fd] > 64 << 10:
                raise OSError(errno.ENOSPC, "No space left on device")

    real_pwrite = os.pwrite

    def fake_pwrite(fd, data, offset):
        count(fd, len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", fake_pwrite)
    if hasattr(os, "copy_file_range"):
        real_copy = os.copy_file_range

        def fake_copy(src, dst, n, *a, **k):
            count(dst, n)
            return real_copy(src, dst, n, *a, **k)

        monkeypatch.setattr(os, "copy_file_range", fake_copy)


def _big_h5(path):
    with h5py.File(path, "w") as f:
        f.create_dataset("w", data=np.random.default_rng(0).random(600_000).astype("f4"))  # 2.4 MB
        f.create_dataset("g", data=np.random.default_rng(1).random(50_000).astype("f4"), chunks=(5000,),
                         compression="gzip")
    return str(path)


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_disk_full_inject_output(tmp_path, capsys, monkeypatch, disk):
    src = _big_h5(tmp_path / "in.h5")
    before = sha256_file(src)
    with small_disk(tmp_path / "small", disk) as (d, simulated):
        if simulated:
            _simulate_enospc(monkeypatch, d)
        rc, out, err = _cli(capsys, "inject", src, "-o", os.path.join(d, "o.h5"), "--count", "5")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "disk full" in err, err
        assert os.listdir(d) == []  # no output, no log, no temporary
    assert sha256_file(src) == before


def test_disk_full_in_place_leaves_the_file_and_no_log(tmp_path, capsys, monkeypatch, disk):
    with small_disk(tmp_path / "small", disk, size="3m") as (d, simulated):
        src = _big_h5(os.path.join(d, "m.h5"))  # 2.4 MB of 3 MB: the atomic copy cannot fit
        before = sha256_file(src)
        if simulated:
            _simulate_enospc(monkeypatch, d)
        rc, out, err = _cli(capsys, "inject", src, "--in-place", "--count", "5", "--include", "g")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "disk full" in err, err
        assert sorted(os.listdir(d)) == ["m.h5"] and sha256_file(src) == before


def test_disk_full_keras_archive(tmp_path, capsys, monkeypatch, disk):
    inner = tmp_path / "inner.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.random.default_rng(0).random(400_000).astype("f4"))
    src = str(tmp_path / "m.keras")
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("config.json", "{}")
        z.write(inner, "model.weights.h5")
    with small_disk(tmp_path / "small", disk) as (d, simulated):
        if simulated:
            _simulate_enospc(monkeypatch, d)
        rc, out, err = _cli(capsys, "inject", src, "-o", os.path.join(d, "o.keras"), "--count", "5")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "disk full" in err, err
        assert os.listdir(d) == []
