"""The CLI's new-file and in-place paths at their floor: the copy done in the kernel where nothing changes, and
in-place revert/replay reading the file once.

The figures are in bench/test_cli_floor_bench.py; these tests check what the faster paths write and read.
"""

from __future__ import annotations

import errno
import os

import h5py
import numpy as np
import pytest

from fastflip import Sampling
from fastflip.files import fileio, h5apply
from fastflip.files.h5apply import copy_apply, route_sites
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout


def _h5(path, n=1 << 16):
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=np.linspace(-2, 2, n, dtype="f4"))
        f.create_dataset("b", data=np.linspace(-1, 1, n // 4, dtype="f8"))
    return str(path)


def _copy(src, dst, count=3, block=4096):
    """copy_apply of a plan of ``count`` flips; returns (output digest, old words, new words, plan's reference)."""
    ref = inject_file(src, dst + ".ref", sampling=Sampling(count=count), seed=5, log_path=False)
    by = {t.path: t for t in read_layout(src).tensors}
    routes = route_sites(src, ref.log.plan, by)
    _, h_out, old, new = copy_apply(src, dst, ref.log.plan, routes, block=block)
    return h_out, old, new, ref


def _counting(monkeypatch, fail: int | None = None) -> list[int]:
    calls: list[int] = []
    real = os.copy_file_range

    def fake(fd_in, fd_out, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if fail is not None:
            raise OSError(fail, os.strerror(fail))
        return real(fd_in, fd_out, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", fake)
    return calls


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no os.copy_file_range on this system")
def test_untouched_blocks_are_copied_in_the_kernel(tmp_path, monkeypatch):
    """Blocks no flip touches go file to file (copy_file_range); the output is the one the buffered copy writes."""
    src = _h5(tmp_path / "a.h5")
    calls = _counting(monkeypatch)
    h_out, old, new, ref = _copy(src, str(tmp_path / "b.h5"))
    blocks = -(-os.path.getsize(src) // 4096)
    assert 0 < len(calls) < blocks  # most blocks in the kernel, the touched ones written from the buffer
    assert open(tmp_path / "b.h5", "rb").read() == open(str(tmp_path / "b.h5.ref"), "rb").read()
    assert h_out == fileio.hash_file(str(tmp_path / "b.h5"), "sha256", cache=False)
    assert np.array_equal(old, ref.log.old_words) and np.array_equal(new, ref.log.new_words)


@pytest.mark.parametrize("err", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP])
def test_kernel_copy_falls_back_to_a_buffer(tmp_path, monkeypatch, err):
    """Another file system or an old kernel (copy_file_range refused): the same bytes through a buffer."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this system")
    src = _h5(tmp_path / "a.h5")
    calls = _counting(monkeypatch, fail=err)
    h_out, *_ = _copy(src, str(tmp_path / "b.h5"))
    assert calls
    assert open(tmp_path / "b.h5", "rb").read() == open(str(tmp_path / "b.h5.ref"), "rb").read()
    assert h_out == fileio.hash_file(str(tmp_path / "b.h5"), "sha256", cache=False)


def test_kernel_copy_other_errors_are_not_swallowed(tmp_path, monkeypatch):
    """A real I/O failure while copying is not retried through a buffer: it surfaces."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this system")
    src = _h5(tmp_path / "a.h5")
    _counting(monkeypatch, fail=errno.EIO)
    with pytest.raises(OSError):
        _copy(src, str(tmp_path / "b.h5"))


def test_length_changing_patches_keep_the_buffered_copy():
    """A patch that changes a length (a re-deflated zip member) moves every later byte: no kernel copy then."""
    assert h5apply._kernel_copy_ok(np.array([False, False])) == hasattr(os, "copy_file_range")
    assert not h5apply._kernel_copy_ok(np.array([False, True]))
