"""Shared test helpers: optional extras fail (not skip) when the README set-up promised them.

A test that needs an optional extra says so explicitly, in one of two ways:

- ``@pytest.mark.extra("torch", ...)`` on the test (or ``pytestmark = pytest.mark.extra(...)`` for a whole
  file): checked before the test runs;
- ``require("torch")`` in the test body (or at module level), which also returns the module.

Outside ``make test`` (``FASTFLIP_REQUIRE_EXTRAS`` unset: ``make test-floors``, or ``pip install .[test]``
alone) a declared extra that is missing skips the test and the skip names it. Nothing else skips: a test that
fails because an undeclared extra is missing fails (``make test-floors`` shows it). Under ``make test`` a
missing declared extra is a failure too (the README set-up installs every extra).
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
from functools import lru_cache
from types import ModuleType

import pytest

from fastflip.files.hashing import logged_hash

#: Top-level modules of the package's optional extras (pyproject.toml) and of the test-only peers: the names
#: ``pytest.mark.extra`` and :func:`require` accept.
OPTIONAL_EXTRAS = frozenset({
    "numba", "torch", "tensorflow", "keras", "dask", "distributed", "dask_jobqueue", "pyarrow", "matplotlib",
    "sklearn", "scipy", "yaml", "cupy", "safetensors", "pytorchfi", "rich", "chainer", "transformers", "torchao",
    "blake3", "xxhash",
})
# The hash cache (fastflip.files.hashcache) of this test session: one temporary folder, not the user's ~/.cache,
# made only where none is set (a child process the tests start inherits its parent's, and leaves no folder).
if "FASTFLIP_HASH_CACHE" not in os.environ:
    _HASH_CACHE = tempfile.mkdtemp(prefix="fastflip-test-hashcache-")
    os.environ["FASTFLIP_HASH_CACHE"] = _HASH_CACHE
    atexit.register(shutil.rmtree, _HASH_CACHE, True)


def log_hash(entry: dict) -> str | None:
    """The digest a log's ``input``/``output`` entry holds, whatever its algorithm (``hash_algorithm``; the
    default one unless a test chooses): compare it with ``fastflip.files.filebytes.hash_file(path)``."""
    return logged_hash(entry)[1]


#: The CPU kernel backends, for ``@pytest.mark.parametrize("backend", CPU_BACKENDS)``: Numba is an extra.
CPU_BACKENDS = ["cython", pytest.param("numba", marks=pytest.mark.extra("numba")), "numpy"]


def extras_required() -> bool:
    """True under ``make test``, where every extra of the README set-up must be present."""
    return os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "extra(*modules): the test needs these optional extras (top-level module "
                                       "names); outside make test it skips, naming them, when one is missing")


@lru_cache(maxsize=None)
def _import_error(module: str) -> str | None:
    """Why ``module`` does not import (None when it does)."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return str(exc) or type(exc).__name__
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, under ``make test``, fail) a test whose declared extras are missing."""
    for mark in item.iter_markers("extra"):
        for module in mark.args:
            if module not in OPTIONAL_EXTRAS:
                pytest.fail(f"pytest.mark.extra({module!r}): not an optional extra "
                            f"({', '.join(sorted(OPTIONAL_EXTRAS))})", pytrace=False)
            why = _import_error(module)
            if why is not None:
                if extras_required():
                    pytest.fail(f"optional extra {module!r} is missing but the README set-up installs it: {why}",
                                pytrace=False)
                pytest.skip(f"optional extra {module!r} not installed")


def require(module: str) -> ModuleType:
    """Import an optional extra for a test (the in-body form of ``pytest.mark.extra``).

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



@pytest.fixture(scope="session")
def keras() -> ModuleType:
    """Keras, with TensorFlow's start-up chatter off (a test needing it takes this fixture)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return require("keras")


def snapshot(path: str | os.PathLike[str]) -> bytes | dict[str, bytes]:
    """A file's bytes, or every file under a directory (relative path -> bytes): compare one taken before a
    command with one taken after to show that nothing was written, renamed or left behind."""
    p = os.fspath(path)
    if not os.path.isdir(p):
        with open(p, "rb") as fh:
            return fh.read()
    out = {}
    for root, _, names in os.walk(p):
        for n in names:
            full = os.path.join(root, n)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, p)] = fh.read()
    return out


def assert_refused(capsys: pytest.CaptureFixture, rc: int, where: str | os.PathLike[str],
                   before: bytes | dict[str, bytes], command: str = "inject") -> str:
    """A CLI command refused as a user error: exit 2, one line on stderr (``fastflip COMMAND: error: ...``), and
    ``where`` (the input, or the directory holding it and the asked-for outputs) as :func:`snapshot` found it
    ``before``: input untouched, no output, no log, no temporary. Returns the line."""
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith(f"fastflip {command}: error: "), (rc, err)
    assert_unchanged(where, before)
    return err


def assert_unchanged(where: str | os.PathLike[str], before: bytes | dict[str, bytes], what: object = None) -> None:
    """Assert that :func:`snapshot` finds ``where`` as it found it ``before`` (naming the files added, removed or
    changed, after ``what`` if given)."""
    after = snapshot(where)
    if isinstance(before, dict) and isinstance(after, dict):
        diff = (f"{where} changed: {sorted(set(after) ^ set(before))} added or removed, "
                f"{sorted(k for k in set(after) & set(before) if after[k] != before[k])} changed")
    else:
        diff = f"{where} changed"
    assert after == before, diff if what is None else (what, diff)
