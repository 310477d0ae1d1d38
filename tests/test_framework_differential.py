"""Copy mode against ``--in-place --direct``, both read back by the framework that wrote the file.

Small files written by the frameworks themselves (``torch.save`` of a state dict with tied weights, a view into a
shared storage and bfloat16; the legacy torch format; an archive marked big-endian; ``safetensors.torch`` with
bfloat16 and ``safetensors.numpy``; ``np.save``, ``np.savez``, ``np.savez_compressed``; ``h5py`` contiguous with a
hard link and gzip-chunked; a Keras ``model.save`` archive) are injected through the CLI with the same options and
seed twice: into a new file, and in place with ``--direct``. For drawn seeds, counts, bit fields and fault models
(hypothesis, derandomized: the same examples on every run):

* both runs log the same plan, the same old and new words;
* the framework reads both results identically (a zip container's entry CRCs all valid), and as its reading of
  the input with exactly the logged sites at their logged new words, worked out from the log alone
  (:mod:`framework_judge`);
* the direct run's revert gives back the input's bytes and reading;
* where ``--direct`` refuses (a member or chunk that does not re-encode at its size; a ``.keras`` archive; a
  checkpoint directory), the refusal is one line and the file is untouched, with no log (also run as a program).

The formats PyTorch writes and Keras are ``framework`` tests; NumPy, h5py and safetensors.numpy need none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from conftest import assert_refused, require, snapshot
from format_builders import write_checkpoint_dir
from fastflip.cli import main
from fastflip.files.log import InjectionLog
from framework_judge import assert_judged, changed_sites, judge
from framework_views import (assert_valid_zip, big_endian_archive, h5_view, keras_view, np_view, st_numpy_view,
                             st_torch_view, torch_view)

MODELS = ["flip", "random-bits:2", "adjacent:2", "stuck-at-0", "stuck-at-1", "stuck-at-0:2", "zero", "random-value",
          "mask:0b101@random", "scale:2.0", "scale:-0.37"]
BITS = [None, "sign", "exponent", "mantissa", "0-7"]
EXAMPLES = settings(max_examples=int(os.environ.get("FW_DIFF_EXAMPLES", "12")), derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _torch_sd(legacy):
    torch = require("torch")

    def build(path):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(16, 4)
        head = torch.nn.Linear(4, 16)
        head.weight = emb.weight  # tied: one storage under two keys
        sd = {**{"emb." + k: v for k, v in emb.state_dict().items()},
              **{"head." + k: v for k, v in head.state_dict().items()}}
        sd["window"] = sd["emb.weight"].view(-1)[8:24]  # a view into the tied storage
        sd["bf"] = torch.randn(24).to(torch.bfloat16)
        sd["half"] = torch.randn(3, 5).half()
        sd["steps"] = torch.arange(6)
        torch.save({"model": sd, "epoch": 3}, path, _use_new_zipfile_serialization=not legacy)
    return build


def _torch_big_endian(path):
    """A torch.save archive whose ``byteorder`` entry says ``big`` (as on a big-endian machine), storages
    byte-swapped: torch.load swaps them back (float32 only: every storage's word width is known)."""
    torch = require("torch")
    torch.manual_seed(2)
    w = torch.randn(6, 8)
    little = path + ".le"
    torch.save({"w": w, "tied": w, "rows": w[2:4], "b": torch.randn(7)}, little)
    big_endian_archive(little, path)
    os.remove(little)


def _st_torch(path):
    torch = require("torch")
    st = require("safetensors.torch")
    torch.manual_seed(1)
    st.save_file({"w": torch.randn(6, 5), "bf": torch.randn(4, 8).to(torch.bfloat16), "h": torch.randn(9).half(),
                  "i": torch.arange(5)}, path)


def _st_numpy(path):
    st = require("safetensors.numpy")
    rng = np.random.default_rng(2)
    st.save_file({"w": rng.standard_normal((6, 5)).astype("f4"), "h": rng.standard_normal(9).astype("f2"),
                  "i": np.arange(7, dtype="i4"), "u": np.arange(11, dtype="u1")}, path)


def _arrays():
    rng = np.random.default_rng(3)
    return {"conv.weight": rng.standard_normal((4, 3, 2)).astype("<f4"),
            "fc.weight": rng.standard_normal(12).astype(">f8"), "fc.bias": rng.standard_normal(7).astype("<f2"),
            "steps": np.arange(5, dtype="<i8"), "scale": np.float32(2.5)}


def _smooth():  # compresses well: a re-deflated member or chunk mostly fits its old size
    return {"w": np.linspace(-1, 1, 2048, dtype="<f4").reshape(64, 32), "b": np.repeat(np.arange(8, dtype="<f4"), 16)}


def _h5(gzip):
    def build(path):
        rng = np.random.default_rng(4)
        with h5py.File(path, "w") as f:
            f.create_dataset("dense/kernel", data=rng.standard_normal((8, 6)).astype("<f4"))
            f.create_dataset("dense/bias", data=np.arange(6, dtype=">f8"))
            f.create_dataset("steps", data=np.arange(9, dtype="<i2"))
            if gzip:  # noise-like weights with shuffle, and a smooth ramp without
                f.create_dataset("gz/w", data=(rng.standard_normal((64, 32)) * 0.05).astype("<f4"), chunks=(16, 16),
                                 compression="gzip", shuffle=True)
                f.create_dataset("gz/b", data=_smooth()["w"], chunks=(32, 32), compression="gzip")
            else:
                f["dense/alias"] = f["dense/kernel"]  # a hard link: one dataset under two names
    return build


FORMATS = {  # name -> (file name, builder, the framework's view, the extra that writes it)
    "torch": ("m.pt", _torch_sd(False), torch_view, "torch"),
    "torch-legacy": ("l.pt", _torch_sd(True), torch_view, "torch"),
    "torch-big-endian": ("b.pt", _torch_big_endian, torch_view, "torch"),
    "safetensors-torch": ("t.safetensors", _st_torch, st_torch_view, "safetensors"),
    "safetensors-numpy": ("n.safetensors", _st_numpy, st_numpy_view, "safetensors"),
    "npy": ("a.npy", lambda p: np.save(p, np.linspace(-2, 2, 60, dtype=">f4").reshape(6, 10)), np_view, None),
    "npz": ("a.npz", lambda p: np.savez(p, **_arrays()), np_view, None),
    "npz-compressed": ("c.npz", lambda p: np.savez_compressed(p, **_smooth()), np_view, None),
    "hdf5": ("m.h5", _h5(False), h5_view, None),
    "hdf5-gzip": ("g.h5", _h5(True), h5_view, None),
}


TORCH = {"torch", "torch-legacy", "torch-big-endian", "safetensors-torch"}  # written by PyTorch: framework tier
FORMAT_PARAMS = [pytest.param(f, marks=pytest.mark.framework) if f in TORCH else f for f in sorted(FORMATS)]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return {"dir": str(tmp_path_factory.mktemp("bases"))}


def _base(bases, fmt):
    if fmt not in bases:
        name, build, _, extra = FORMATS[fmt]
        if extra:
            require(extra)
        path = os.path.join(bases["dir"], name)
        build(path)
        bases[fmt] = path
    return bases[fmt]


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def _same_plan(a, b):
    """Two logs of one plan: the same tensors, sites, masks, and old and new words."""
    pa, pb = a.plan, b.plan
    assert [t.as_dict() for t in pa.tensors] == [t.as_dict() for t in pb.tensors]
    for col in ("tensor", "index", "and_mask", "or_mask", "xor_mask"):
        assert np.array_equal(getattr(pa, col), getattr(pb, col)), col
    assert np.array_equal(a.old_words, b.old_words) and np.array_equal(a.new_words, b.new_words)


def _differential(fmt, bases, capsys, seed, count, model, bits):
    view = FORMATS[fmt][2]
    base = _base(bases, fmt)
    raw = _read(base)
    zipped = zipfile.is_zipfile(base)  # then both results are zips whose entries match their CRC-32
    d = tempfile.mkdtemp(dir=bases["dir"])
    try:
        ext = os.path.splitext(base)[1]
        src, out, work = (os.path.join(d, n + ext) for n in ("in", "out", "work"))
        for p in (src, work):
            shutil.copyfile(base, p)
        opts = ["--seed", str(seed), "--count", str(count), "--model", model, "-q"] + (["--bits", bits] if bits else [])
        capsys.readouterr()
        before = snapshot(d)
        rc = main(["inject", src, "-o", out, *opts])
        if rc != 0:  # options this file cannot take (a bit field no tensor has): refused the same way in place
            err = assert_refused(capsys, rc, d, before)
            assert assert_refused(capsys, main(["inject", work, "--in-place", "--direct", *opts]), d, before) == err
            reject()
        copy_log = InjectionLog.load(out + ".fflog")
        copied = view(out)
        if zipped:
            assert_valid_zip(out)
        assert_judged(view(base), copied, copy_log, require_change=False)
        assert _read(src) == raw
        before = snapshot(d)
        rc = main(["inject", work, "--in-place", "--direct", *opts])
        if rc != 0:
            assert "drop --direct" in assert_refused(capsys, rc, d, before)
            return "refused"
        direct_log = InjectionLog.load(work + ".fflog")
        assert direct_log.manifest["evidence"] == "regions"
        _same_plan(copy_log, direct_log)
        direct = view(work)
        if zipped:
            assert_valid_zip(work)
        # one plan (_same_plan) judged against one reading of the input: the framework reads both results alike
        assert_judged(view(base), direct, direct_log, require_change=False)
        assert (_read(work) != raw) == (changed_sites(direct_log) > 0)
        assert main(["revert", work + ".fflog", work, "-q"]) == 0
        assert _read(work) == raw
        return "direct"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
@EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 12), model=st.sampled_from(MODELS),
       bits=st.sampled_from(BITS))
def test_copy_and_direct_read_back_alike(fmt, bases, capsys, seed, count, model, bits):
    _differential(fmt, bases, capsys, seed, count, model, bits)


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_direct_goes_through_on_every_format(fmt, bases, capsys):
    """The drawn examples above may all be refused in place: a fixed plan that --direct writes, per format."""
    assert _differential(fmt, bases, capsys, 7, 3, "flip", "mantissa") == "direct"


@pytest.mark.parametrize("kind", ["hdf5-noise", pytest.param("keras", marks=pytest.mark.framework), "directory"])
def test_direct_refusal_is_one_line_in_a_process(kind, bases, request):
    """Run as a program (warnings and all): a plan --direct cannot write (a gzip chunk that does not re-deflate
    into its old size, a ``.keras`` archive, a checkpoint directory) leaves exit 2, nothing on stdout, one line on
    stderr naming the fix, and the files and their directory as they were (no log, no temporary)."""
    d = tempfile.mkdtemp(dir=bases["dir"])
    if kind == "hdf5-noise":
        p = os.path.join(d, "noise.h5")
        with h5py.File(p, "w") as f:  # noise does not re-deflate into its old size
            f.create_dataset("g", data=np.random.default_rng(0).random((64, 64)).astype("f4"), chunks=(16, 16),
                             compression="gzip")
    elif kind == "keras":
        p = os.path.join(d, "m.keras")
        shutil.copyfile(request.getfixturevalue("keras_file")[0], p)
    else:
        p = write_checkpoint_dir(os.path.join(d, "m"))
    before = snapshot(d)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # TensorFlow's warnings too
    r = subprocess.run([sys.executable, "-m", "fastflip", "inject", p, "--in-place", "--direct", "--seed", "1",
                        "--count", "20"], capture_output=True, text=True, timeout=300, env=env)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("fastflip inject: error: "), r.stderr
    assert "drop --direct" in r.stderr and snapshot(d) == before


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keras = require("keras")
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3)])
    m.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).random((8, 6)).astype("f4")
    m.fit(x, np.zeros((8, 3), "f4"), epochs=1, verbose=0)
    d = tmp_path_factory.mktemp("keras")
    p = str(d / "m.keras")
    m.save(p)
    return p, str(d)


@pytest.mark.framework
@pytest.mark.parametrize("seed,model", [(1, "flip"), (2, "stuck-at-1"), (3, "random-value")])
def test_keras_archive_copy_read_by_keras_and_direct_refused(keras_file, capsys, tmp_path, seed, model):
    """A ``.keras`` archive from ``model.save``: a new archive, loaded by Keras, holds exactly the logged changes
    (as Keras saves its weights again); ``--direct`` is refused in one line and the archive is untouched."""
    base, kdir = keras_file
    raw = _read(base)
    out = str(tmp_path / "out.keras")
    opts = ["--seed", str(seed), "--count", "6", "--model", model, "-q"]
    assert main(["inject", base, "-o", out, *opts]) == 0
    log = InjectionLog.load(out + ".fflog")
    assert_judged(keras_view(base, kdir), keras_view(out, kdir), log)
    work = str(tmp_path / "work.keras")
    shutil.copyfile(base, work)
    capsys.readouterr()
    before = snapshot(tmp_path)
    err = assert_refused(capsys, main(["inject", work, "--in-place", "--direct", *opts]), tmp_path, before)
    assert "drop --direct" in err and _read(base) == raw


@pytest.mark.framework
@pytest.mark.parametrize("model", ["scale:-0.37", "scale:1e36"])
def test_scaled_words_of_formats_numpy_lacks(model, tmp_path):
    """bfloat16 and float8 tensors under the scale model, read by safetensors.torch: each new word is the documented
    rule's (the value decoded by ml_dtypes times the factor, rounded once; overflow Inf, or 448 in float8_e4m3fn);
    a stored new word one bit off the rule is caught even where the log agrees with the file."""
    from fastflip.files.inject import inject_file

    torch = require("torch")
    st = require("safetensors.torch")
    torch.manual_seed(5)
    src, out = str(tmp_path / "f.safetensors"), str(tmp_path / "o.safetensors")
    st.save_file({"bf": torch.randn(64).to(torch.bfloat16), "e4": (torch.randn(64) * 100).to(torch.float8_e4m3fn),
                  "e5": torch.randn(64).to(torch.float8_e5m2)}, src)
    res = inject_file(src, out, seed=1, count=60, model=model)
    assert {t.format for t in res.log.plan.tensors} == {"bfloat16", "float8_e4m3fn", "float8_e5m2"}
    assert_judged(st_torch_view(src), st_torch_view(out), res.log)
    got = st_torch_view(out)
    site = res.log.plan.tensors[int(res.log.plan.tensor[0])].name
    got[site].reshape(-1)[int(res.log.plan.index[0])] ^= 1  # the file and the log agree on a word the rule does not give
    res.log.new_words[0] ^= 1
    assert any("is not the rule's" in x for x in judge(st_torch_view(src), got, res.log))
