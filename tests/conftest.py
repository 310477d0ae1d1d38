"""Shared test helpers: optional extras fail (not skip) when the README set-up promised them.

Outside ``make test`` (``FASTFLIP_REQUIRE_EXTRAS`` unset, e.g. after ``pip install .[test]`` alone), a test
that needs an optional extra is skipped with the extra's name: either it asks with :func:`require`, or it
fails on importing one of :data:`OPTIONAL_EXTRAS` (directly or through fastflip, which imports extras
lazily), which :func:`pytest_runtest_makereport` turns into a skip. Under ``make test`` both are failures.
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import shutil
import tempfile
from types import ModuleType

import pytest

#: Top-level modules of the package's optional extras (pyproject.toml) and of the test-only peers.
OPTIONAL_EXTRAS = frozenset({
    "numba", "torch", "tensorflow", "keras", "dask", "distributed", "dask_jobqueue", "pyarrow", "matplotlib",
    "sklearn", "scipy", "yaml", "cupy", "safetensors", "pytorchfi", "rich", "chainer", "transformers", "torchao",
    "blake3", "xxhash",
})
# Logs hashed with sha256 unless a test chooses (the suite compares manifest["input"]["sha256"]); the tests of the
# default rule (fastest available) unset it: tests/test_hashing.py.
os.environ.setdefault("FASTFLIP_HASH", "sha256")
# The sha256 cache (fastflip.files.hashcache) of this test session: one temporary folder, not the user's ~/.cache.
_HASH_CACHE = tempfile.mkdtemp(prefix="fastflip-test-hashcache-")
os.environ.setdefault("FASTFLIP_HASH_CACHE", _HASH_CACHE)
atexit.register(shutil.rmtree, _HASH_CACHE, True)
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def extras_required() -> bool:
    """True under ``make test``, where every extra of the README set-up must be present."""
    return os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1"


def _missing_extra(exc: BaseException | None) -> str | None:
    """The optional extra whose absence raised ``exc`` (looked for along its cause chain), if any."""
    seen = 0
    while exc is not None and seen < 10:
        name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        match = _NO_MODULE.search(str(exc))
        for cand in (name, match.group(1) if match else None):
            if cand and cand.split(".")[0] in OPTIONAL_EXTRAS:
                return cand.split(".")[0]
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Outside ``make test``, a failure caused by a missing optional extra is reported as a skip naming it."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed or call.excinfo is None or extras_required():
        return
    extra = _missing_extra(call.excinfo.value)
    if extra is not None:
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: optional extra {extra!r} not installed")


def require(module: str) -> ModuleType:
    """Import an optional extra for a test.

    Under ``make test`` (FASTFLIP_REQUIRE_EXTRAS=1) a missing extra fails the test:
    the README's set-up installs it, so its absence is a broken set-up, not a reason
    to skip. Elsewhere the test is skipped and the skip names the missing module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extras_required():
            pytest.fail(f"optional extra {module!r} is missing but the README set-up installs it: {exc}")
        pytest.skip(f"optional extra {module!r} not installed", allow_module_level=True)
        raise  # unreachable


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.fixture
def require_extra():
    return require
