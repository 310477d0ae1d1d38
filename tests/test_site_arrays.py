"""The one site type: files, live tensors and GPU arrays hold ``core.records.SiteArrays``, and
every CPU backend of the registry applied to those columns gives the reference's words."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import CPU_BACKENDS
from fastflip import live
from fastflip.core.records import SiteArrays, TensorTable
from fastflip.files.h5apply import RawSites, route_sites
from fastflip.files.layout import read_layout
from fastflip.kernels import gpu
from fastflip.kernels.dispatch import PtrTable, apply_at_offsets
from fastflip.kernels.registry import get_backend
from test_kernels import DTYPES, make_plan, random_array, reference

BACKENDS = CPU_BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_live_sites_through_the_registry_match_reference(backend: str) -> None:
    rng = np.random.default_rng(12)
    arrays = {f"t{i}": random_array(d, 20 + i, rng) for i, d in enumerate(DTYPES)}
    original = {k: v.copy() for k, v in arrays.items()}
    tg = live.targets(arrays)
    plan = make_plan(live.tensor_refs(arrays), rng, per_tensor=7)
    sites = tg.prepare(plan).sites
    assert isinstance(sites, SiteArrays) and isinstance(tg.table, PtrTable) and isinstance(tg.table, TensorTable)
    assert len(sites) == len(plan) and sites.xor_mask is plan.xor_mask
    assert not hasattr(tg.prepare(plan), "tid") and not hasattr(tg.table, "ptrs")  # one name a column
    expected, exp_old, exp_new = reference(original, plan)
    old, new = get_backend(backend).apply_ptrs(tg.table, sites)  # the record itself: table + sites
    assert old.tolist() == exp_old.tolist() and new.tolist() == exp_new.tolist()
    for k in arrays:
        assert arrays[k].tobytes() == expected[k].tobytes(), k


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_sites_through_the_registry_match_reference(tmp_path, backend: str) -> None:
    rng = np.random.default_rng(13)
    arrays = {f"t{i}": random_array(d, 16 + i, rng) for i, d in enumerate(DTYPES) if np.dtype(d).kind != "b"}
    path = str(tmp_path / "m.h5")
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
    layout = read_layout(path)
    tensors = {t.path: t for t in layout}
    refs = [tensors["/" + k].ref() for k in sorted(arrays)]
    plan = make_plan(refs, rng, per_tensor=5)
    raw = RawSites.from_routes(route_sites(path, plan, tensors), plan)
    assert isinstance(raw.sites, SiteArrays) and isinstance(raw.table, TensorTable) and len(raw) == len(plan)
    assert not any(hasattr(raw, a) for a in ("site", "offs", "dcode", "cols", "size", "dtypes"))  # one name a column
    assert bool((np.diff(raw.sites.offsets) > 0).all())  # file-offset order
    _, exp_old, exp_new = reference({"/" + k: v.copy() for k, v in arrays.items()}, plan)
    buf = np.fromfile(path, dtype=np.uint8)
    s = raw.sites
    t = raw.table
    for code in range(len(t)):  # the tensor column indexes the table of word types
        at = np.flatnonzero(s.tensor == code)
        assert t.swaps[code] == (t.dtypes[code].dtype.byteorder == (">" if np.little_endian else "<"))
        old, new = apply_at_offsets(buf, s.offsets[at], int(t.itemsizes[code]), bool(t.swaps[code]), s.and_mask[at],
                                    s.or_mask[at], s.xor_mask[at], backend=backend, dtype=t.dtypes[code])
        assert old.tolist() == exp_old[s.positions[at]].tolist()
        assert new.tolist() == exp_new[s.positions[at]].tolist()


def test_gpu_site_arrays_are_the_one_site_type() -> None:
    from fastflip.core.dtypes import word_type

    host = TensorTable.of_words([word_type(">f4")])
    g = gpu.SiteArrays.from_host(offsets=[0, 4], tensor=[0, 0], table=host, and_mask=[1, 1],
                                 or_mask=[0, 0], xor_mask=[1, 2], xp=np, positions=[3, 5])
    assert isinstance(g, SiteArrays) and len(g) == 2 and g.positions.tolist() == [3, 5]
    # the per-tensor columns are the record's TensorTable (no sizes/little of its own), one byte-order flag
    assert isinstance(g.table, TensorTable) and g.table.itemsizes.tolist() == [4]
    assert g.table.swaps.tolist() == [np.little_endian] and g.table.dtypes[0].name == "float32"
    assert not any(hasattr(g, a) for a in ("sizes", "little", "scale_dtypes"))
    with pytest.raises(AttributeError):
        g.offsets = np.zeros(2)  # frozen: a plan's device columns are shared by every trial
