"""A durable new file is flushed to disk while it is copied (h5apply.copy_apply ``writeback``), not only at the end."""

from __future__ import annotations

import os

import h5py
import numpy as np

from fastflip import Sampling
from fastflip.files import inject as inject_mod
from fastflip.files.inject import inject_file


def test_durable_copy_is_flushed_while_written(tmp_path, monkeypatch):
    src = str(tmp_path / "w.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.arange(1 << 22, dtype="f4"))  # 16 MiB: two or more 8 MiB blocks
    calls = []
    real = getattr(os, "fdatasync", os.fsync)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1], raising=False)
    monkeypatch.setattr(inject_mod, "_WRITEBACK", 1 << 20)
    res = inject_file(src, str(tmp_path / "o.h5"), seed=1, sampling=Sampling(count=3))
    assert len(calls) >= 2  # after every block once 1 MiB is written
    calls.clear()
    inject_file(src, str(tmp_path / "p.h5"), seed=1, sampling=Sampling(count=3), durable=False)
    assert calls == []  # a scratch copy is not flushed
    assert open(str(tmp_path / "p.h5"), "rb").read() == open(res.output, "rb").read()
