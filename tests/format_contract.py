"""One contract check for every checkpoint format reader: exact bits against the NumPy oracle,
read back by the format's own library, copy by default, revert and replay verified by the log's hash."""

from __future__ import annotations

import os
from typing import Callable, Mapping

import numpy as np

from fastflip.core import reference
from fastflip.files.filebytes import hash_file, sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout

MODELS = ["flip", "random-bits:2", "adjacent:3", "stuck-at-1", "zero", "random-value"]


def check_format(src: str, load: Callable[[str], Mapping[str, np.ndarray]], tmp: str, *, fmt: str,
                 models: list[str] = MODELS, count: int = 25, non_atomic: bool = True) -> None:
    """``load(path)`` reads a file with the format's own library into {fastflip tensor path: array of words}."""
    lay = read_layout(src)
    assert lay.format == fmt
    before = hash_file(src)
    original = {k: np.array(v) for k, v in load(src).items()}
    # the layout's offsets hold exactly the bytes the library reads
    with open(src, "rb") as fh:
        for t in lay.tensors:
            if t.storage != "contiguous":  # a deflated .npz member: compared through the library below
                continue
            fh.seek(t.offset)
            got = np.frombuffer(fh.read(t.nbytes), t.dtype).reshape(t.shape)
            assert np.array_equal(got.view(f"u{t.itemsize}") if t.dtype.kind != "b" else got,
                                  original[t.path].view(f"u{t.itemsize}") if t.dtype.kind != "b" else original[t.path]), t.path
    for i, model in enumerate(models):
        out = os.path.join(tmp, f"out{i}.{fmt}")
        res = inject_file(src, out, seed=10 + i, count=count, model=model)
        assert hash_file(src) == before  # the input is untouched
        want = {t.path: original[t.path].astype(t.dtype).copy() for t in lay.tensors}
        old, new = reference.apply_plan(want, res.log.plan)
        assert np.array_equal(old, res.log.old_words) and np.array_equal(new, res.log.new_words)
        got = load(out)
        if fmt in ("torch", "npz"):  # a valid archive: every entry's CRC-32 matches its bytes
            import zipfile

            with zipfile.ZipFile(out) as z:
                assert z.testzip() is None
        for t in lay.tensors:
            a, b = got[t.path], want[t.path]
            assert a.shape == b.shape and a.tobytes() == b.astype(a.dtype).tobytes(), (model, t.path)
            for alias in t.aliases:  # every key of a shared storage sees the flips
                assert got[alias].tobytes() == a.tobytes()
        rep = replay(res.log_path, src, os.path.join(tmp, f"rep{i}.{fmt}"))
        assert sha256_file(rep.output) == sha256_file(out)
        assert revert(res.log_path, out).digest == before
        assert hash_file(out) == before
    if not non_atomic:
        return
    # in place, non-atomic (the campaign fast path), then revert
    work = os.path.join(tmp, f"work.{fmt}")
    with open(src, "rb") as a, open(work, "wb") as b:
        b.write(a.read())
    res = inject_file(work, in_place=True, atomic=False, seed=99, count=count)
    assert hash_file(work) != before
    if fmt in ("torch", "npz"):
        import zipfile

        with zipfile.ZipFile(work) as z:
            assert z.testzip() is None
    assert revert(res.log_path, work).digest == before
