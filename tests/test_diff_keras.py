"""``fastflip diff`` on ``.keras`` archives: the inner weights files are compared (docs/formats.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import h5py
import numpy as np

from fastflip.files.diff import diff_files


def _archive(path: str, value: float, tmp: str) -> str:
    inner = os.path.join(tmp, f"w{value}.h5")
    with h5py.File(inner, "w") as f:
        f["layers/dense/vars/0"] = np.array([value, 2.0, 3.0], "<f4")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
        z.write(inner, "model.weights.h5")
    return path


def test_diff_compares_the_weights_inside_keras_archives(tmp_path):
    a = _archive(str(tmp_path / "a.keras"), 1.0, str(tmp_path))
    b = _archive(str(tmp_path / "b.keras"), -1.0, str(tmp_path))
    r = diff_files(a, b)
    assert (r.a, r.b) == (a, b)
    assert [(t.path, t.n_diff, t.bit_counts()) for t in r.tensors] == [("/layers/dense/vars/0", 1, {31: 1})]
    assert diff_files(a, a).identical
    cli = subprocess.run([sys.executable, "-m", "fastflip", "diff", a, b, "--json"], capture_output=True, text=True)
    assert cli.returncode == 1, cli.stderr
    assert json.loads(cli.stdout)["tensors"][0]["n_diff"] == 1
