"""One contract check for every checkpoint format reader: exact bits against the NumPy oracle,
read back by the format's own library, copy by default, revert and replay verified by the log's hash;
direct in place with region evidence judged by the format's own library against the log alone."""

from __future__ import annotations

import os
from typing import Callable, Mapping

import numpy as np

from fastflip.core import reference
from fastflip.errors import OptionError
from fastflip.files.filebytes import hash_file, sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.layout import read_layout
from framework_judge import assert_judged
from framework_views import assert_valid_zip

MODELS = ["flip", "random-bits:2", "adjacent:3", "stuck-at-1", "zero", "random-value"]
ZIPPED = ("torch", "npz")  # formats in a zip container: every entry's CRC-32 must match its bytes


def check_format(src: str, load: Callable[[str], Mapping[str, np.ndarray]], tmp: str, *, fmt: str,
                 models: list[str] = MODELS, count: int = 25, non_atomic: bool = True,
                 direct: bool | None = None) -> None:
    """``load(path)`` reads a file with the format's own library into {fastflip tensor path: array of words}.

    ``direct`` (default: ``non_atomic``) also runs :func:`check_direct_regions` for every model.
    """
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
        assert_judged(dict(load(src)), load(out), res.log, what=(fmt, model))  # aliases as the library shares them
        if fmt in ZIPPED:
            assert_valid_zip(out)
        rep = replay(res.log_path, src, os.path.join(tmp, f"rep{i}.{fmt}"))
        assert sha256_file(rep.output) == sha256_file(out)
        assert revert(res.log_path, out).digest == before
        assert hash_file(out) == before
    if direct if direct is not None else non_atomic:
        check_direct_regions(src, load, tmp, fmt=fmt, models=models, count=count)
    if not non_atomic:
        return
    # in place, non-atomic (the campaign fast path), then revert
    work = os.path.join(tmp, f"work.{fmt}")
    with open(src, "rb") as a, open(work, "wb") as b:
        b.write(a.read())
    res = inject_file(work, in_place=True, atomic=False, seed=99, count=count)
    assert hash_file(work) != before
    if fmt in ZIPPED:
        assert_valid_zip(work)
    assert revert(res.log_path, work).digest == before


def check_direct_regions(src: str, load: Callable[[str], Mapping[str, np.ndarray]], tmp: str, *, fmt: str,
                         models: list[str] = MODELS, count: int = 25) -> None:
    """Direct in place with region evidence (``in_place=True, atomic=False, hash_files="regions"``; the CLI's
    ``--in-place --direct``), one copy of ``src`` per model, judged by the format's own library (``load``).

    After the inject the library must read exactly the logged sites changed, each from its logged old word to its
    logged new word at its element (:func:`framework_judge.apply_logged` works that out from the log alone), and
    every other element bit-identical; after the revert it must read the original, and the bytes are the original.
    A plan the direct path cannot write (a member or chunk that does not re-encode at its size) must be refused
    in one line with the file untouched; at least one model must go through.
    """
    with open(src, "rb") as fh:
        raw = fh.read()
    done = 0
    for i, model in enumerate(models):
        work = os.path.join(tmp, f"direct{i}.{fmt}")
        with open(work, "wb") as fh:
            fh.write(raw)
        expect = dict(load(src))  # src is never written here: a mapped reading of it stays the input's
        try:
            res = inject_file(work, in_place=True, atomic=False, hash_files="regions", seed=50 + i, count=count,
                              model=model)
        except OptionError as exc:
            assert "\n" not in str(exc) and "drop --direct" in str(exc), (model, str(exc))
            with open(work, "rb") as fh:
                assert fh.read() == raw, (model, "a refused direct inject changed the file")
            continue
        done += 1
        assert res.log.manifest["evidence"] == "regions" and res.log.manifest["input"]["hash"] is None
        assert_judged(expect, load(work), res.log, what=(fmt, model))
        if fmt in ZIPPED:
            assert_valid_zip(work)
        assert revert(res.log_path, work).evidence == "regions"
        with open(work, "rb") as fh:
            assert fh.read() == raw, (fmt, model, "the revert's bytes")
    assert done, f"{fmt}: direct in place refused every model"
