"""``-q`` is silent on success for every command that writes files, on every checkpoint format.

Each command runs in-process through :func:`fastflip.cli.main`; stdout and stderr must both stay empty
(no summary line, no notes, no "fastflip: ..." warnings such as the chunk re-encoding fallback).
"""

from __future__ import annotations

import zipfile

import h5py
import numpy as np
import pytest

from conftest import require
from format_builders import EXTENSION, write_checkpoint
from fastflip.cli import main


def _keras_like(path):
    inner = str(path) + ".inner.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.linspace(-1, 1, 64, dtype="f4").reshape(8, 8))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", '{"keras_version": "3"}')
        z.writestr("config.json", '{"class_name": "Sequential"}')
        z.write(inner, "model.weights.h5")
    return str(path)


def _make(fmt, d):
    w = np.linspace(-2, 2, 4096, dtype="f4").reshape(64, 64)
    if fmt == "hdf5-gzip":  # chunked and compressed: re-encoded chunks, and h5py's fallback (a warning)
        w = np.random.default_rng(0).standard_normal((64, 64)).astype("f4")
        return write_checkpoint("hdf5", d / "m.h5", {"w": w}, chunks=(8, 8), compression="gzip", shuffle=True)
    if fmt == "keras":
        return _keras_like(d / "m.keras")
    return write_checkpoint(fmt, d / f"m.{EXTENSION[fmt]}", {"w": w}, compressed=True)


FORMATS = ["hdf5", "hdf5-gzip", "safetensors", "npz", "torch", "keras"]


def _silent(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert (rc, out, err) == (0, "", ""), argv
    return rc


@pytest.mark.parametrize("fmt", FORMATS)
def test_quiet_prints_nothing_on_success(fmt, tmp_path, capsys):
    src = _make(fmt, tmp_path)
    out = src.replace("/m.", "/o.")
    _silent(capsys, "inject", src, "-o", out, "--count", "12", "--seed", "1", "-q")
    _silent(capsys, "replay", out + ".fflog", src, "-o", out + ".again", "--force", "-q")
    _silent(capsys, "revert", out + ".fflog", out, "-q")
    _silent(capsys, "inject", src, "--in-place", "--count", "12", "--seed", "2", "-q")
    _silent(capsys, "revert", src + ".fflog", src, "-q")
    # without -q the same command speaks: the test can fail
    assert main(["inject", src, "-o", out, "--count", "2", "--seed", "1", "--force"]) == 0
    assert capsys.readouterr().out.startswith("wrote ")


def test_quiet_other_writing_commands(tmp_path, capsys):
    src = _make("hdf5", tmp_path)
    _silent(capsys, "hdf5-corrupter", "--hdf5File", src, "--injectionTries", "5", "--injectionType", "count",
            "--useRandomLocations", "--floatPrecision", "32", "--seed", "2", "-q")
    require("safetensors")
    _silent(capsys, "convert", src, "-o", tmp_path / "c.safetensors", "-q")
