"""Filtered chunks of an HDF5 file with a user block: the user-block base is added to every
chunk address, so gzip, lzf and shuffle-only chunks are patched where h5py reads them.

HDF5 before 1.14.4 (h5py 3.11, the declared floor) reports chunk addresses without the user block; newer
versions report file offsets. Under ``make test-floors`` the plain cases run on the old HDF5 itself; on a
newer HDF5 the ``old-hdf5`` cases make the chunk queries answer as the old one does. Pure h5py/NumPy.
"""

from __future__ import annotations

import types
import warnings

import h5py
import numpy as np
import pytest

from framework_judge import assert_judged
from framework_views import h5_view
from fastflip.files import h5chunks, h5index
from fastflip.files.filebytes import sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout

NEW_HDF5 = h5py.version.hdf5_version_tuple >= (1, 14, 4)
# level 1: the re-encoded chunks (at the best level that fits) fit in the stored size, so none falls back to h5py
FILTERS = {"gz": dict(compression="gzip", compression_opts=1), "lzf": dict(compression="lzf"),
           "shuf": dict(shuffle=True), "gzshuf": dict(compression="gzip", compression_opts=1, shuffle=True)}


def _file(path: str) -> None:
    rng = np.random.default_rng(3)
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, kw in FILTERS.items():
            data = rng.integers(0, 4, (16, 24)).astype("<f4")  # compressible: lzf and gzip store every chunk
            f.create_dataset(name, data=data, chunks=(8, 8), **kw)
    with open(path, "r+b") as fh:  # something in the user block, as tools that use it write
        fh.write(b"fastflip user block test\n")


class _OldChunkQueries:
    """A dataset id whose chunk queries answer as HDF5 < 1.14.4 does (addresses without the user block)."""

    def __init__(self, dsid, userblock: int) -> None:
        self._id, self._ub = dsid, userblock

    def __getattr__(self, name):
        return getattr(self._id, name)

    def get_chunk_info_by_coord(self, coord):
        info = self._id.get_chunk_info_by_coord(coord)
        off = None if info.byte_offset is None else info.byte_offset - self._ub
        return types.SimpleNamespace(chunk_offset=info.chunk_offset, filter_mask=info.filter_mask, byte_offset=off,
                                     size=info.size)


def _simulate_old_hdf5(monkeypatch, how: str = "h5py") -> None:
    """Make this HDF5 answer chunk queries as HDF5 < 1.14.4 does (addresses without the user block).

    ``how="h5py"``: h5py's chunk queries (``FASTFLIP_H5_NATIVE=0``) through a dataset id that answers the old
    way; ``how="native"``: the chunk index read from the file by :mod:`fastflip.files.h5index`, set to the old
    convention (skipped where the compiled module is not built).
    """
    monkeypatch.setattr(h5py.version, "hdf5_version_tuple", (1, 14, 3))
    if how == "native":
        if not h5index.native_available()[0]:
            pytest.skip("fastflip.kernels._h5chunks is not built here: the h5py case covers the fallback")
        monkeypatch.setattr(h5index, "_ABSOLUTE", False)
        return
    monkeypatch.setenv("FASTFLIP_H5_NATIVE", "0")
    real_open = h5chunks.open_dataset

    def old_open(fid, path):
        return _OldChunkQueries(real_open(fid, path), fid.get_create_plist().get_userblock())

    monkeypatch.setattr(h5chunks, "open_dataset", old_open)


@pytest.mark.parametrize("old", [None, "h5py", "native"], ids=["this-hdf5", "old-hdf5-h5py", "old-hdf5-native"])
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_user_block_chunks_patched_where_h5py_reads_them(tmp_path, monkeypatch, old, name):
    if old and not NEW_HDF5:
        pytest.skip("this HDF5 is older than 1.14.4 itself: the this-hdf5 case covers it")
    src, out = str(tmp_path / "ub.h5"), str(tmp_path / "out.h5")
    _file(src)
    if old:
        _simulate_old_hdf5(monkeypatch, old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no chunk may fall back to h5py: the chunk path is the one under test
        monkeypatch.setattr(h5chunks, "_SAID", set())
        res = inject_file(src, out, seed=1, sampling={"count": 6, "bits": "0-31"}, selection={"include": [name]})
    assert len(res.log.plan.index) >= 5
    assert_judged(h5_view(src), h5_view(out), res.log)
    assert open(out, "rb").read(512) == open(src, "rb").read(512)  # the user block is untouched
    back = str(tmp_path / "back.h5")
    revert(res.log, out, back)
    assert sha256_file(back) == sha256_file(src)


@pytest.mark.parametrize("how", ["h5py", "native"])
def test_chunk_patches_use_the_user_block_base(tmp_path, monkeypatch, how):
    """The patches land at the chunk's file offset: the raw bytes there are the chunk HDF5 reads."""
    src = str(tmp_path / "ub.h5")
    _file(src)
    if NEW_HDF5:
        _simulate_old_hdf5(monkeypatch, how)
    from fastflip.core.plan import Plan, TensorRef
    from fastflip.files.h5apply import route_sites

    lay = read_layout(src)
    t = next(x for x in lay.tensors if x.path == "/shuf")
    plan = Plan(tensors=(TensorRef(t.path, t.dtype.str, t.shape),), tensor=np.zeros(2, np.int32),
                index=np.array([0, 12 * 24 + 20], np.int64), and_mask=np.full(2, 2**64 - 1, np.uint64),
                or_mask=np.zeros(2, np.uint64), xor_mask=np.ones(2, np.uint64))
    routes = route_sites(src, plan, {t.path: t})
    cp = h5chunks.chunk_patches(src, plan, routes)
    assert cp.chunks == 2
    with h5py.File(src, "r") as f:
        real = {f["shuf"].id.get_chunk_info_by_coord(c).byte_offset for c in [(0, 0), (8, 16)]}
    ub = 512 if not NEW_HDF5 else 0  # on an old HDF5 the reported address lacks the user block
    assert {at for at, _, _ in cp.patches} == {r + ub for r in real}
