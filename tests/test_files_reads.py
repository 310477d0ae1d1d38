"""How often the file writers read, hash and parse a file: counted through a wrapper of ``open`` in the module
that reads (bytes read from the watched file) or a spy on the one routine that parses. Each writer reads its
input once; what it writes is unchanged (checked byte for byte or by the frameworks' loaders)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import h5py
import numpy as np
import pytest

from conftest import require
from test_copy_floor import count_reads
from fastflip import Sampling
from fastflip.files import filebytes
from fastflip.files.inject import inject_file

SMP = Sampling(count=6, bits="sign")


def _sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_direct_in_place_without_a_log_file_hashes_the_file_in_one_read(tmp_path, monkeypatch):
    src = str(tmp_path / "w.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.arange(1 << 16, dtype="f4"))
    before, size = _sha(src), os.path.getsize(src)
    seen = count_reads(monkeypatch, filebytes, src)
    res = inject_file(src, in_place=True, atomic=False, log_path=False, hash_files=True, hash_algorithm="sha256",
                      seed=1, sampling=SMP)
    assert seen["bytes"] == size  # the hash now and the hash it will have, from one read
    m = res.log.manifest
    assert m["input"]["hash"] == before and m["output"]["hash"] == _sha(src) != before


def _zip_parses(monkeypatch: pytest.MonkeyPatch, path: str) -> list:
    """Each parse of the central directory of the zip at ``path`` (zipfile's own reading of it), from now on."""
    import zipfile

    seen: list = []
    real = zipfile.ZipFile._RealGetContents
    want = os.path.realpath(path)

    def spy(self: Any) -> None:
        if isinstance(self.filename, str) and os.path.realpath(self.filename) == want:
            seen.append(1)
        return real(self)

    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", spy)
    return seen


def _zip_checkpoint(path: str, kind: str) -> str:
    a, b = np.linspace(-1, 1, 3000, dtype="f4"), np.arange(200, dtype="f8")
    if kind == "npz":
        np.savez(path, a=a, b=b)
    elif kind == "npz-deflated":
        np.savez_compressed(path, a=np.random.default_rng(1).standard_normal(3000).astype("f4"), b=b)
    else:
        require("torch")
        import torch

        torch.save({"a": torch.from_numpy(a), "b": torch.from_numpy(b)}, path)
    return path


@pytest.mark.parametrize("kind", ["npz", "npz-deflated", "torch"])
@pytest.mark.parametrize("mode", ["copy", "in-place", "direct"])
def test_an_inject_parses_the_zip_directory_once(tmp_path, monkeypatch, kind, mode):
    """Format check, layout read, member patches and CRC fix-up of one inject share one parse of the central
    directory (formats/zipraw.directory); the output changed, and its revert gives the input back byte for byte."""
    src = _zip_checkpoint(str(tmp_path / ("w.pt" if kind == "torch" else "w.npz")), kind)
    before = open(src, "rb").read()
    parses = _zip_parses(monkeypatch, src)
    kw: dict = {"copy": {}, "in-place": {"in_place": True}, "direct": {"in_place": True, "atomic": False}}[mode]
    out = None if kw else str(tmp_path / ("o.pt" if kind == "torch" else "o.npz"))
    res = inject_file(src, out, seed=2, sampling=SMP, log_path=False, **kw)
    assert parses == [1]
    assert open(res.output, "rb").read() != before
    from fastflip.files.revert import revert

    revert(res.log, res.output, str(tmp_path / "back"))
    assert open(str(tmp_path / "back"), "rb").read() == before


def test_the_directory_parse_follows_the_bytes_not_the_time_stamps(tmp_path):
    """A zip rewritten to the same size with another directory (a member renamed, the time stamps kept) is parsed
    again: the last parse is given back only while the directory's bytes are unchanged."""
    import zipfile

    from fastflip.files.formats import zipraw

    p = str(tmp_path / "z.zip")
    for name in ("a.npy", "b.npy"):
        with zipfile.ZipFile(p, "w") as z:
            z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), b"x" * 64)
        os.utime(p, ns=(1, 1))
        assert [i.filename for i in zipraw.directory(p)[0]] == [name]
