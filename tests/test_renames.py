"""The module paths and names CHANGELOG.md lists as renamed are gone (no import hook, no attribute shims); errors
raised on purpose are FastflipErrors that are also the built-in exception they replaced."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fastflip.errors import FastflipError, IndexRangeError, LogMismatchError, OptionError


CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"


def renames(section: str) -> list[tuple[str, str]]:
    """The (old, new) rows of one table of CHANGELOG.md's renames (``#### Module paths`` or ``#### Names``):
    the first dotted name in each cell."""
    text = CHANGELOG.read_text(encoding="utf-8").split(f"#### {section}\n", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| `")]
    return [tuple(re.search(r"`([\w.]+)`", cell).group(1) for cell in row) for row in rows]


def test_the_changelog_lists_the_renames() -> None:
    assert len(renames("Module paths")) >= 40 and len(renames("Names")) == 3


@pytest.mark.parametrize("old, new", renames("Module paths"))
def test_old_module_paths_are_gone(old: str, new: str) -> None:
    import fastflip

    sys.modules.pop(old, None)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    assert not isinstance(getattr(fastflip, old.split(".")[1], None), ModuleType)  # fastflip.select: a function
    assert not any(type(f).__module__.startswith("fastflip") for f in sys.meta_path)  # no import hook
    if new == "fastflip.kernels._cython":  # the compiled kernels: present once built
        pytest.importorskip(new)
    assert importlib.import_module(new).__name__ == new


@pytest.mark.parametrize("old, new", renames("Names"))
def test_old_names_are_gone(old: str, new: str) -> None:
    module, name = old.rsplit(".", 1)
    new_module, new_name = new.rsplit(".", 1)
    assert module == new_module
    module = importlib.import_module(module)
    with pytest.raises(AttributeError):
        getattr(module, name)
    assert getattr(module, new_name) is not None


def test_run_and_trial_outcomes_differ() -> None:
    from fastflip.campaign.outcomes import RUN_OUTCOMES, TRIAL_OUTCOMES
    from fastflip.campaign.store import TRIAL_OUTCOMES as STORED
    from fastflip.experiment.outcomes import RUN_OUTCOMES as RUN

    assert STORED is TRIAL_OUTCOMES == ("masked", "sdc", "critical", "due") and RUN is RUN_OUTCOMES
    assert set(RUN_OUTCOMES) != set(TRIAL_OUTCOMES)  # why the two have their own names


def test_classify_run_mismatch_is_an_option_error():
    from fastflip.experiment.outcomes import classify_run

    with pytest.raises(OptionError, match="2 run points but 1 golden") as e:
        classify_run([{"accuracy": 0.9}, {"accuracy": 0.9}], [{"accuracy": 0.9}], tolerance=0.02)
    assert isinstance(e.value, ValueError)


def test_unknown_gpu_engine_is_an_option_error():
    from fastflip.kernels import gpu

    with pytest.raises(OptionError, match="unknown GPU engine 'fast'") as e:
        gpu._engine(np, "fast")
    assert isinstance(e.value, ValueError) and isinstance(e.value, FastflipError)


def test_element_index_out_of_range_is_an_index_error(tmp_path):
    import h5py
    from fastflip.files.h5offsets import element_byte_offsets
    from fastflip.files.layout import read_layout

    p = tmp_path / "m.h5"
    with h5py.File(p, "w") as f:
        f["w"] = np.arange(6, dtype=np.float32)
    (t,) = read_layout(str(p)).tensors
    assert element_byte_offsets(str(p), t, np.array([5])).shape == (1,)
    with pytest.raises(IndexRangeError, match="out of range") as e:
        element_byte_offsets(str(p), t, np.array([6]))
    assert isinstance(e.value, IndexError)


def test_redo_without_altered_bytes_is_a_log_mismatch(tmp_path):
    from fastflip.files.filebytes import ByteUndo

    u = ByteUndo(np.zeros(0, np.int64), np.zeros(0, np.int64), b"", 0, b"", -1)
    with pytest.raises(LogMismatchError) as e:
        u.redo(str(tmp_path / "x"))
    assert isinstance(e.value, ValueError)
