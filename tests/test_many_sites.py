"""Many sites in one injection (the 20,000-flip path): the byte delta, the fingerprint and the log built from
arrays give exactly what the per-site construction gives, and the injected file holds exactly the logged words."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from fastflip.files.filebytes import ByteUndo
from fastflip.files.fingerprint import WINDOW, fingerprints
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from fastflip.files.log import InjectionLog
from fastflip.files.patches import delta_patches, patch_undo, word_patches, word_undo
from fastflip.files.routes import SiteRoute

DTYPES = {"a": "<f4", "b": ">f8", "c": "<f2", "d": "i1", "e": ">u2", "f": "<f4"}


def _file(path, n=3000):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for name, dt in DTYPES.items():
            f.create_dataset(name, data=(rng.standard_normal(n) * 50).astype(dt))
    return str(path)


def _routes(path, rng):
    """Routes of every dataset, listed out of file order, with unsorted offsets and some hdf5-path (-1) sites."""
    lay = read_layout(path)
    routes, start = [], 0
    for t in reversed(lay.tensors):
        idx = rng.choice(t.size, 200, replace=False)
        offs = (t.offset + idx * t.itemsize).astype(np.int64)
        offs[::17] = -1
        routes.append(SiteRoute(t, np.arange(start, start + len(idx)), offs))
        start += len(idx)
    return routes, start


def _as_tuple(u: ByteUndo):
    return u.offsets.tolist(), u.lengths.tolist(), u.data, u.size, u.new_data, u.new_size


def test_word_undo_is_the_per_site_delta(tmp_path):
    path = _file(tmp_path / "m.h5")
    rng = np.random.default_rng(1)
    routes, n = _routes(path, rng)
    widths = np.zeros(n, np.int64)
    for r in routes:
        widths[r.positions] = 8 * r.tensor.itemsize
    mask = np.where(widths == 64, np.uint64(2**64 - 1), (np.uint64(1) << widths.astype(np.uint64)) - np.uint64(1))
    old = rng.integers(0, 2**63, n, dtype=np.uint64) & mask
    new = rng.integers(0, 2**63, n, dtype=np.uint64) & mask
    # same-size patches that lie between the words (zip CRC fields, re-encoded chunks stand in here)
    extra = [(5, b"\x01\x02\x03", b"\x04\x05\x06"), (routes[0].tensor.offset - 2, b"xy", b"zw"), (1, b"q", b"r")]
    got = word_undo(routes, old, new, extra, 123456)
    want = patch_undo(extra + word_patches(routes, old, new), 123456)
    assert len(got.offsets) == sum(int((r.offsets >= 0).sum()) for r in routes) + len(extra)
    assert _as_tuple(got) == _as_tuple(want)
    assert _as_tuple(word_undo(routes, old, new, [], 9)) == _as_tuple(patch_undo(word_patches(routes, old, new), 9))
    assert _as_tuple(word_undo([], old, new, [], 9)) == _as_tuple(patch_undo([], 9))


def test_fingerprints_of_a_delta_are_those_of_its_patches(tmp_path):
    path = tmp_path / "big.bin"
    size = 3 * WINDOW + 100
    path.write_bytes(np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8).tobytes())
    # ranges in the head window, across its end, in the middle (outside both windows), across the tail's start
    offs = [0, 10, WINDOW - 2, WINDOW + 7, 2 * WINDOW, size - WINDOW - 1, size - 3]
    data = path.read_bytes()
    patches = [(o, data[o:o + 3], bytes(b ^ 0xFF for b in data[o:o + 3])) for o in offs]
    undo = patch_undo(patches, size)
    assert fingerprints(str(path), "sha256", undo) == fingerprints(str(path), "sha256", patches)
    assert delta_patches(undo, forward=True) == sorted(patches)


@pytest.mark.parametrize("hash_files", ["regions", True])
def test_many_flips_in_place_hold_the_logged_bytes(tmp_path, hash_files):
    path = _file(tmp_path / "m.h5", n=20000)
    before = open(path, "rb").read()
    res = inject_file(path, in_place=True, atomic=False, count=5000, seed=3, hash_files=hash_files,
                      log_path=str(tmp_path / "m.fflog"))
    lg = InjectionLog.load(res.log_path)
    after = open(path, "rb").read()
    changed = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8))
    lay = {t.path: t for t in read_layout(path).tensors}
    offs, want_old, want_new = [], bytearray(), bytearray()
    for i in range(len(lg)):
        t = lay[lg.plan.tensors[int(lg.plan.tensor[i])].name]
        o = t.offset + int(lg.plan.index[i]) * t.itemsize
        offs.append(o)
        u = np.dtype(f"u{t.itemsize}")
        word = lambda w: np.array([w], u).astype(u.newbyteorder(t.dtype.byteorder if t.itemsize > 1 else "=")).tobytes()
        assert before[o:o + t.itemsize] == word(lg.old_words[i])
        assert after[o:o + t.itemsize] == word(lg.new_words[i])
    covered = np.concatenate([np.arange(o, o + lay[lg.plan.tensors[int(lg.plan.tensor[i])].name].itemsize)
                              for i, o in enumerate(offs)])
    assert set(changed.tolist()) <= set(covered.tolist())  # nothing outside the logged words changed
    if hash_files == "regions":  # the logged ranges are the words, old and new bytes as the file had them
        u = lg.undo
        assert u is not None and sorted(offs) == u.offsets.tolist()
        pos = np.cumsum(u.lengths) - u.lengths
        for o, ln, p in zip(u.offsets.tolist(), u.lengths.tolist(), pos.tolist()):
            assert u.data[p:p + ln] == before[o:o + ln] and u.new_data[p:p + ln] == after[o:o + ln]


def test_prefault_changes_no_byte_and_steps_aside_where_refused(tmp_path, monkeypatch):
    import mmap

    from fastflip.files import h5apply

    data = np.random.default_rng(4).integers(0, 256, 64 << 10, dtype=np.uint8).tobytes()
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    offs = np.array([5, 4096 + 7, 3 * 4096, 3 * 4096 + 9, len(data) - 1], np.int64)
    with open(p, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), len(data) - 100, flags=mmap.MAP_SHARED)  # not a whole number of pages
        try:
            h5apply.prefault_writable(mm, offs[offs < len(mm)])
            monkeypatch.setattr(h5apply, "_POPULATE_WRITE", 1 << 20)  # advice the kernel refuses (EINVAL)
            h5apply.prefault_writable(mm, offs[offs < len(mm)])
            assert h5apply._POPULATE_WRITE is None
            h5apply.prefault_writable(mm, offs[offs < len(mm)])  # skipped from now on
        finally:
            mm.close()
    assert p.read_bytes() == data


def test_manifest_text_reads_back_and_logs_written_before_still_load(tmp_path):
    import json
    import zipfile

    from fastflip.files.log import manifest_json

    path = _file(tmp_path / "m.h5")
    res = inject_file(path, in_place=True, atomic=False, count=300, seed=5, hash_files="regions",
                      log_path=str(tmp_path / "m.fflog"))
    with zipfile.ZipFile(res.log_path) as z:
        text = z.read("manifest.json").decode()
        members = {n: z.read(n) for n in z.namelist()}
    assert json.loads(text) == json.loads(json.dumps(res.log.manifest, default=str))
    assert text.count("\n") > len(res.log.manifest["tensors"])  # a tensor a line: readable as text
    assert json.loads(manifest_json({})) == {} and json.loads(manifest_json({"a": [], "b": [1, {"c": 2}]})) == {
        "a": [], "b": [1, {"c": 2}]}
    # the same log as earlier versions wrote it (manifest indented by json.dumps): read alike
    old = tmp_path / "old.fflog"
    with zipfile.ZipFile(old, "w") as z:
        for name, data in members.items():
            z.writestr(name, json.dumps(json.loads(text), indent=2) if name == "manifest.json" else data)
    a, b = InjectionLog.load(res.log_path), InjectionLog.load(old)
    assert a.manifest == b.manifest and a.records() == b.records() and _as_tuple(a.undo) == _as_tuple(b.undo)


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_prefault_asks_once_per_run_of_pages(monkeypatch, order):
    import mmap

    from fastflip.files import h5apply

    pg = mmap.PAGESIZE
    offs = np.array([1, 2, pg + 5, 3 * pg, 3 * pg + 1, 4 * pg + 8, 9 * pg, 16 * pg - 1], np.int64)
    if order == "shuffled":
        offs = offs[[5, 0, 7, 2, 1, 4, 6, 3]]
    asked = []

    class Mapping:  # records the advice instead of giving it
        def __len__(self):
            return 16 * pg - 100  # the last page is cut short

        def madvise(self, advice, start, length):
            asked.append((advice, start, length))

    monkeypatch.setattr(h5apply, "_POPULATE_WRITE", 23)
    h5apply.prefault_writable(Mapping(), offs)
    # pages 0-1, 3-4, 9, 15 (to the mapping's end): a call per run of pages, no page twice
    assert asked == [(23, 0, 2 * pg), (23, 3 * pg, 2 * pg), (23, 9 * pg, pg), (23, 15 * pg, pg - 100)]
