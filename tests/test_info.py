"""``fastflip info``: what the installation can use, and under make test, that the set-up installed it all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import extras_required

from fastflip.kernels.environment import EXTRAS, describe


def test_info_json_names_backends_and_extras():
    out = subprocess.run([sys.executable, "-m", "fastflip", "info", "--json"], capture_output=True, text=True,
                         check=True).stdout
    d = json.loads(out)
    assert d["schema_version"] == 1
    assert d["cpu_backends"][-1] == "numpy" and d["default_backend"] == d["cpu_backends"][0]
    assert set(d["extras"]) == set(EXTRAS)
    text = subprocess.run([sys.executable, "-m", "fastflip", "info"], capture_output=True, text=True,
                          check=True).stdout
    assert "CPU backends: " + ", ".join(d["cpu_backends"]) in text


@pytest.mark.skipif(not extras_required(), reason="only under make test (FASTFLIP_REQUIRE_EXTRAS=1)")
def test_make_test_setup_installed_every_cpu_extra():
    d = describe()
    missing = [k for k, v in d["extras"].items() if v is None and k != "cupy"]
    assert not missing, f"the README set-up should have installed {missing}"
    assert d["native_kernels"] and d["cpu_backends"] == ["cython", "numba", "numpy"]
