"""``-q`` is silent on success for every command that writes files, on every checkpoint format.

Each command runs in-process through :func:`fastflip.cli.main`; stdout and stderr must both stay empty
(no summary line, no notes, no "fastflip: ..." warnings such as the chunk re-encoding fallback).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from format_builders import EXTENSION, write_checkpoint
from fastflip.cli import main


def _keras(path):
    """A real Keras 3 archive: ``model.save`` of a small subclassed model."""
    require("tensorflow")
    require("keras")
    from user_models import keras_subclassed

    keras_subclassed().save(str(path))
    return str(path)


def _make(fmt, d):
    w = np.linspace(-2, 2, 4096, dtype="f4").reshape(64, 64)
    if fmt == "keras":
        return _keras(d / "m.keras")
    if fmt == "hdf5-gzip":  # chunked and compressed: re-encoded chunks, and h5py's fallback (a warning)
        w = np.random.default_rng(0).standard_normal((64, 64)).astype("f4")
        return write_checkpoint("hdf5", d / "m.h5", {"w": w}, chunks=(8, 8), compression="gzip", shuffle=True)
    return write_checkpoint(fmt, d / f"m.{EXTENSION[fmt]}", {"w": w}, compressed=fmt == "npz")


FORMATS = ["hdf5", "hdf5-gzip", "safetensors", "npz", "torch", pytest.param("keras", marks=pytest.mark.framework)]


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
