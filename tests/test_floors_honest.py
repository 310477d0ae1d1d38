"""Only a test that declares its extra may skip for lack of it: tests/conftest.py, run on a
small suite in which torch is made impossible to import."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INNER = '''
import sys

sys.modules["torch"] = None  # this run has no torch: `import torch` raises ModuleNotFoundError

import pytest

from conftest import require


@pytest.mark.extra("torch")
def test_declared_by_marker():
    import torch  # noqa: F401


def test_declared_by_require():
    require("torch")


def test_undeclared():
    import torch  # noqa: F401


def test_undeclared_through_a_cause_chain():
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("the model could not be built") from exc


@pytest.mark.extra("not_an_extra")
def test_marker_names_an_unknown_extra():
    pass
'''


def _run(tmp_path: Path, require_extras: bool) -> dict[str, str]:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k != "FASTFLIP_REQUIRE_EXTRAS"}
    if require_extras:
        env["FASTFLIP_REQUIRE_EXTRAS"] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "test_inner.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # a failure in set-up (the marker's check) is an ERROR: both count as failing here
    found = re.finditer(r"^test_inner\.py::(\w+) (PASSED|FAILED|SKIPPED|ERROR)", r.stdout, re.M)
    return {m.group(1): m.group(2).replace("ERROR", "FAILED") for m in found}


def test_outside_make_test_only_declared_extras_skip(tmp_path):
    got = _run(tmp_path, require_extras=False)
    assert got == {"test_declared_by_marker": "SKIPPED", "test_declared_by_require": "SKIPPED",
                   "test_undeclared": "FAILED", "test_undeclared_through_a_cause_chain": "FAILED",
                   "test_marker_names_an_unknown_extra": "FAILED"}, got


def test_under_make_test_a_missing_extra_fails_even_when_declared(tmp_path):
    got = _run(tmp_path, require_extras=True)
    assert set(got.values()) == {"FAILED"} and len(got) == 5, got
