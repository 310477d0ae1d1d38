"""Old public names keep working with a DeprecationWarning; errors raised on purpose are FastflipErrors that are
also the built-in exception they replaced."""

from __future__ import annotations

import numpy as np
import pytest

from fastflip.errors import FastflipError, IndexRangeError, LogMismatchError, OptionError


def test_store_outcomes_is_renamed_trial_outcomes():
    import fastflip.campaign.store as store
    from fastflip.campaign.outcomes import TRIAL_OUTCOMES

    with pytest.warns(DeprecationWarning, match="OUTCOMES is renamed TRIAL_OUTCOMES"):
        old = store.OUTCOMES
    assert old is TRIAL_OUTCOMES == ("masked", "sdc", "critical", "due")
    with pytest.raises(AttributeError):
        store.NO_SUCH_NAME  # noqa: B018


def test_experiment_names_are_renamed_run_names():
    import fastflip.experiment.outcomes as eo
    from fastflip.campaign.outcomes import RUN_OUTCOMES, TRIAL_OUTCOMES

    with pytest.warns(DeprecationWarning, match="classify is renamed classify_run"):
        old = eo.classify
    assert old is eo.classify_run
    with pytest.warns(DeprecationWarning, match="OUTCOMES is renamed RUN_OUTCOMES"):
        assert eo.OUTCOMES is RUN_OUTCOMES
    assert set(RUN_OUTCOMES) != set(TRIAL_OUTCOMES)  # why the two names must differ


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
    from fastflip.files.layout import element_byte_offsets, read_layout

    p = tmp_path / "m.h5"
    with h5py.File(p, "w") as f:
        f["w"] = np.arange(6, dtype=np.float32)
    (t,) = read_layout(str(p)).tensors
    assert element_byte_offsets(str(p), t, np.array([5])).shape == (1,)
    with pytest.raises(IndexRangeError, match="out of range") as e:
        element_byte_offsets(str(p), t, np.array([6]))
    assert isinstance(e.value, IndexError)


def test_redo_without_altered_bytes_is_a_log_mismatch(tmp_path):
    from fastflip.files.fileio import ByteUndo

    u = ByteUndo(np.zeros(0, np.int64), np.zeros(0, np.int64), b"", 0, b"", -1)
    with pytest.raises(LogMismatchError) as e:
        u.redo(str(tmp_path / "x"))
    assert isinstance(e.value, ValueError)
