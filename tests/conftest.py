"""Shared test helpers: optional extras fail (not skip) when the README set-up promised them."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import an optional extra for a test.

    Under ``make test`` (FASTFLIP_REQUIRE_EXTRAS=1) a missing extra fails the test:
    the README's set-up installs it, so its absence is a broken set-up, not a reason
    to skip. Elsewhere the test is skipped and the skip names the missing module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"optional extra {module!r} is missing but the README set-up installs it: {exc}")
        pytest.skip(f"optional extra {module!r} not installed")
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
