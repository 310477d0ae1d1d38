"""The native entry points refuse what would write out of bounds: offsets against the
table's extents in kernels.dispatch, column lengths, item sizes and offsets in the Cython kernels themselves,
a negative ``extra`` in ``_lzf.grow``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import require
from fastflip.errors import OptionError
from fastflip.kernels import dispatch
from fastflip.kernels.registry import available_backends

ONES = ~np.uint64(0)
CPU = available_backends("cpu")


def _guarded(n_inside: int = 4):
    """A float32 tensor of ``n_inside`` elements at the start of a larger array (what lies past it must stay)."""
    big = np.arange(64, dtype=np.float32)
    table = dispatch.PtrTable([big.ctypes.data], [4], [False], [4 * n_inside], [np.dtype("<f4")])
    return big, table


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("offset", [160, 16, 13, -4])
def test_ptr_sites_outside_the_extent_are_refused(backend, offset):
    big, table = _guarded()
    before = big.copy()
    with pytest.raises(OptionError, match="outside"):
        dispatch.apply_ptrs(table, [0, 0], [0, offset], [ONES] * 2, [0, 0], [1 << 31] * 2, backend)
    with pytest.raises(OptionError, match="outside"):
        dispatch.write_ptrs(table, [0], [offset], [0xFFFFFFFF], backend)
    with pytest.raises(OptionError, match="outside"):
        dispatch.read_ptrs(table, [0], [offset], backend)
    assert big.tobytes() == before.tobytes()


@pytest.mark.parametrize("backend", CPU)
def test_ptr_sites_inside_the_extent_still_apply(backend):
    big, table = _guarded()
    old, new = dispatch.apply_ptrs(table, [0], [12], [ONES], [0], [1 << 31], backend)
    assert big[:5].tolist() == [0.0, 1.0, 2.0, -3.0, 4.0]
    assert dispatch.read_ptrs(table, [0], [12], backend).tolist() == new.tolist()


# ---------------------------------------------------------------------------------- the Cython kernels alone


@pytest.fixture
def cy():
    return require("fastflip.kernels._cython")


def _words_args(n_offsets=1, n_cols=1):
    big = np.zeros(64, np.uint8)
    buf = big[:16]  # a view: past its end lies more of `big`, which must stay zero
    offs = np.zeros(n_offsets, np.int64)
    cols = [np.zeros(n_cols, np.uint64) for _ in range(5)]
    cols[0][:] = ONES
    cols[2][:] = 0xFF
    return big, buf, offs, cols


WORD_CASES = [  # (itemsize, offsets, entries per other column, what the refusal says)
    *[(size, [0], 1, "itemsize") for size in (0, 3, 16, -1)],
    (4, [0, 4, 8, 12], 1, "one entry per offset"),
    *[(4, [off], 1, "outside the buffer") for off in (13, 16, 40, -1)],
]


@pytest.mark.parametrize("itemsize, offsets, n_cols, says", WORD_CASES)
def test_cython_word_kernels_refuse_bad_calls(cy, itemsize, offsets, n_cols, says):
    big, buf, offs, (a, o, x, old, new) = _words_args(n_offsets=len(offsets), n_cols=n_cols)
    offs[:] = offsets
    for call in (lambda: cy.apply_words(buf, offs, itemsize, False, a, o, x, old, new),
                 lambda: cy.read_words(buf, offs, itemsize, False, old),
                 lambda: cy.write_words(buf, offs, itemsize, False, x)):
        with pytest.raises(ValueError, match=says):
            call()
    assert not big.any()


def test_cython_pointer_kernels_check_ids_extents_and_columns(cy):
    big, table = _guarded()
    before = big.tobytes()
    ptrs, sizes, swaps, ext = table.bases, table.itemsizes, table.swaps, table.extents
    one = np.ones(1, np.uint64)
    for tid, off in [(0, 160), (0, 13), (0, -4), (1, 0), (-1, 0)]:
        t, o = np.array([tid], np.int32), np.array([off], np.int64)
        with pytest.raises(ValueError, match="outside the table"):
            cy.apply_ptrs(ptrs, sizes, swaps, ext, t, o, one, one, one, one.copy(), one.copy())
        with pytest.raises(ValueError, match="outside the table"):
            cy.write_ptrs(ptrs, sizes, swaps, ext, t, o, one)
        with pytest.raises(ValueError, match="outside the table"):
            cy.read_ptrs(ptrs, sizes, swaps, ext, t, o, one.copy())
    t, o = np.zeros(2, np.int32), np.array([0, 4], np.int64)
    with pytest.raises(ValueError, match="one entry per offset"):
        cy.write_ptrs(ptrs, sizes, swaps, ext, t, o, one)
    with pytest.raises(ValueError, match="itemsize"):
        cy.read_ptrs(ptrs, np.array([3], np.int32), swaps, ext, t[:1], o[:1], one.copy())
    with pytest.raises(ValueError, match="different lengths"):
        cy.read_ptrs(ptrs, sizes, swaps, np.zeros(2, np.int64), t[:1], o[:1], one.copy())
    assert big.tobytes() == before


# ---------------------------------------------------------------------------------- LZF


def test_lzf_grow_with_a_negative_extra_raises_instead_of_aborting():
    require("fastflip.kernels._lzf")
    code = ("from fastflip.kernels import _lzf\n"
            "data = bytes(range(200)) * 4\n"
            "z = _lzf.compress(data)\n"
            "for extra in (-1, -len(z), -len(z) - 64, -(1 << 40)):\n"
            "    try:\n"
            "        _lzf.grow(z, data, extra)\n"
            "    except ValueError as exc:\n"
            "        assert 'extra' in str(exc), exc\n"
            "    else:\n"
            "        raise SystemExit(f'grow accepted extra={extra}')\n"
            "print('refused')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "refused", (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("backend", CPU)
def test_extents_checked_once_per_call(backend, monkeypatch):
    """A call checks its sites against the extents once: in dispatch, or, for a backend whose kernels refuse
    such sites themselves (Cython), in those kernels alone; a refusal still names the site, nothing changed."""
    from fastflip.kernels.registry import get_backend

    big, table = _guarded()
    buf = np.zeros(16, np.uint8)
    calls = []
    for name in ("_check_extents", "_check_span"):
        real = getattr(dispatch, name)
        monkeypatch.setattr(dispatch, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    dispatch.apply_ptrs(table, [0], [12], [ONES], [0], [1 << 31], backend)
    dispatch.read_ptrs(table, [0], [12], backend)
    dispatch.write_ptrs(table, [0], [12], [0], backend)
    dispatch.apply_at_offsets(buf, [4], 4, False, [ONES], [0], [1], backend)
    dispatch.read_at_offsets(buf, [4], 4, False, backend)
    dispatch.write_at_offsets(buf, [4], 4, False, [0], backend)
    native = get_backend(backend).checks_bounds
    assert calls == ([] if native else ["_check_extents"] * 3 + ["_check_span"] * 3)
    before = big.copy()
    with pytest.raises(OptionError, match="site 1: byte offset 16 of tensor 0 lies outside its 16 bytes"):
        dispatch.apply_ptrs(table, [0, 0], [0, 16], [ONES] * 2, [0, 0], [1 << 31] * 2, backend)
    with pytest.raises(OptionError, match=r"span \[4, 20\) outside the buffer of 16 bytes"):
        dispatch.apply_at_offsets(buf, [4, 16], 4, False, [ONES] * 2, [0, 0], [1, 1], backend)
    assert big.tobytes() == before.tobytes() and not buf.any()
