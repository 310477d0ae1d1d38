"""Chainer interop in its own virtual environment (Chainer 7.8.1 needs numpy<2).

Real ``chainer.serializers.save_hdf5`` (gzip-compressed datasets, integer ``N``/``t``
counters) -> fastflip ``inject_file`` in this environment -> real ``load_hdf5`` into a
differently initialised model and optimizer -> ``save_hdf5`` again: the re-saved words
are exactly the logged new words, and every other word is unchanged.

The environment is ``make chainer-venv``; ``make test`` points FASTFLIP_CHAINER_PYTHON at
its interpreter. Under FASTFLIP_REQUIRE_EXTRAS=1 a missing environment fails the test.
"""

from __future__ import annotations

import os
import subprocess

import h5py
import numpy as np
import pytest

from chainer_helpers import chainer_script
from flip_helper import words_of

pytestmark = pytest.mark.framework

SCRIPT = chainer_script({"conv1": "L.Convolution2D(1, 4, 3)", "bn1": "L.BatchNormalization(4)",
                         "fc": "L.Linear(144, 10)"}, '''
        def forward(self, x):
            return self.fc(F.relu(self.bn1(self.conv1(x))))

    def make(seed):
        np.random.seed(seed)
        model = L.Classifier(Net())
        opt = chainer.optimizers.Adam()
        opt.setup(model)
        x = np.random.rand(8, 1, 8, 8).astype("f4")
        y = np.random.randint(0, 10, 8).astype("i4")
        for _ in range(seed % 3 + 2):
            opt.update(model, x, y)
        return model, opt

    mode, model_h5, opt_h5 = sys.argv[1:4]
    if mode == "save":
        model, opt = make(0)
        chainer.serializers.save_hdf5(model_h5, model)
        chainer.serializers.save_hdf5(opt_h5, opt)
    else:  # load into another model and optimizer, then save what they now hold
        model, opt = make(7)
        chainer.serializers.load_hdf5(model_h5, model)
        chainer.serializers.load_hdf5(opt_h5, opt)
        chainer.serializers.save_hdf5(sys.argv[4], model)
        chainer.serializers.save_hdf5(sys.argv[5], opt)
    print("chainer", chainer.__version__, "numpy", np.__version__)
''')


@pytest.fixture(scope="module")
def chainer_python():
    exe = os.environ.get("FASTFLIP_CHAINER_PYTHON")
    problem = None
    if not exe:
        problem = "FASTFLIP_CHAINER_PYTHON is not set (make chainer-venv; make test sets it)"
    elif not os.access(exe, os.X_OK):
        problem = f"FASTFLIP_CHAINER_PYTHON={exe} is not an executable"
    else:
        r = subprocess.run([exe, "-c", "import chainer, h5py"], capture_output=True, text=True, timeout=120)
        if r.returncode:
            problem = f"chainer does not import in {exe}: {r.stderr.strip().splitlines()[-1:]}"
    if problem:
        if os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"Chainer environment missing but the README set-up builds it: {problem}")
        pytest.skip(problem)
    return exe


def _run(exe, tmp_path, *args):
    script = tmp_path / "chainer_io.py"
    script.write_text(SCRIPT)
    r = subprocess.run([exe, str(script), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("chainer 7.8.1")
    return r.stdout


def _words(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__("/" + n, words_of(o[()]).reshape(-1).copy())
                     if isinstance(o, h5py.Dataset) else None)
    return out


def _expected(before, log):
    exp = {k: v.copy() for k, v in before.items()}
    for rec in log.records():
        assert int(exp[rec["tensor"]][rec["index"]]) == rec["old_word"]
        exp[rec["tensor"]][rec["index"]] = rec["new_word"]
    return exp


def test_chainer_save_inject_load(chainer_python, tmp_path):
    from fastflip.files.inject import inject_file
    from fastflip.files.layout import read_layout

    model_h5, opt_h5 = tmp_path / "model.h5", tmp_path / "opt.h5"
    _run(chainer_python, tmp_path, "save", model_h5, opt_h5)
    with h5py.File(model_h5) as f:
        assert f["predictor/conv1/W"].compression == "gzip"
        assert f["predictor/bn1/N"].dtype == np.int64
    layout = {t.path: t for t in read_layout(model_h5).tensors}
    assert layout["/predictor/conv1/W"].framework == "chainer"
    assert layout["/predictor/bn1/N"].role == "step-counter"

    m_before, o_before = _words(model_h5), _words(opt_h5)
    m_res = inject_file(model_h5, tmp_path / "model.alt.h5", seed=1, count=25, bits="all")
    o_res = inject_file(opt_h5, tmp_path / "opt.alt.h5", seed=2, count=12, bits="exponent-msb",
                        selection={"roles": ["optimizer-moment"]})
    n_res = inject_file(tmp_path / "model.alt.h5", tmp_path / "model.alt2.h5", seed=3, count=1, bits="0-3",
                        selection={"include": ["predictor/bn1/N"]})
    assert {r["tensor"] for r in o_res.log.records()} <= {p for p in o_before if p.endswith(("/m", "/v"))}
    assert any(r["tensor"] == "/predictor/fc/W" for r in m_res.log.records())  # a gzip dataset was hit

    _run(chainer_python, tmp_path, "load", tmp_path / "model.alt2.h5", tmp_path / "opt.alt.h5",
         tmp_path / "model.again.h5", tmp_path / "opt.again.h5")
    exp_m = _expected(_expected(m_before, m_res.log), n_res.log)
    exp_o = _expected(o_before, o_res.log)
    got_m, got_o = _words(tmp_path / "model.again.h5"), _words(tmp_path / "opt.again.h5")
    assert set(got_m) == set(exp_m) and set(got_o) == set(exp_o)
    for name in exp_m:
        assert np.array_equal(got_m[name], exp_m[name]), name
    for name in exp_o:
        assert np.array_equal(got_o[name], exp_o[name]), name
    assert not np.array_equal(got_m["/predictor/bn1/N"], m_before["/predictor/bn1/N"])  # the counter was altered
