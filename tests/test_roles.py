"""Framework layout recognition and tensor roles, on hand-built mimics and on real framework files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import h5fixtures as hf
from conftest import require
from fastflip.files.layout import read_layout
from fastflip.files.roles import ROLES, annotate, detect_framework, label_path


def roles_of(path):
    lay = read_layout(path)
    return lay, {t.path: t.role for t in lay.tensors}


def test_keras3_like(tmp_path):
    p = tmp_path / "m.weights.h5"
    want = hf.keras3_like(p)
    lay, got = roles_of(p)
    assert lay.framework == "keras3"
    assert got == want
    layers = {t.path: t.layer for t in lay.tensors}
    assert layers["/layers/dense_1/vars/0"] == "head"  # from the vars group's name attribute
    assert layers["/layers/batch_normalization/vars/2"] == "bn"
    assert layers["/optimizer/vars/3"] is None
    assert {t.framework for t in lay.tensors} == {"keras3"}


def test_keras3_without_file_attrs_uses_group_names(tmp_path):
    p = tmp_path / "m.weights.h5"
    want = hf.keras3_like(p)
    lay = read_layout(p, annotate=False)
    assert all(t.role is None for t in lay.tensors)
    tensors = annotate(lay.tensors)  # a bare list: paths and shapes only
    assert {t.path: t.role for t in tensors} == want
    assert {t.path: t.layer for t in tensors}["/layers/dense_1/vars/0"] == "dense_1"


@pytest.mark.parametrize("suffix", [":0", ""])
def test_keras_legacy_like(tmp_path, suffix):
    p = tmp_path / "m.h5"
    want = hf.keras_legacy_like(p, suffix=suffix)
    lay, got = roles_of(p)
    assert lay.framework == "keras-legacy"
    assert got == want
    assert {t.layer for t in lay.tensors if t.path.startswith("/model_weights")} == {"conv1", "bn1", "dense"}
    # optimizer slots carry their layer when a path component names it
    assert lay.tensor(f"/optimizer_weights/Adam/conv1/kernel/m{suffix}").layer == "conv1"
    assert lay.tensor(f"/optimizer_weights/Adam/dense/bias/v{suffix}").layer == "dense"
    assert lay.tensor(f"/optimizer_weights/Adam/iterations{suffix}").layer is None


def test_tf_save_weights_like(tmp_path):
    p = tmp_path / "w.h5"
    want = hf.tf_save_weights_like(p)
    lay, got = roles_of(p)
    assert lay.framework == "keras-legacy" and got == want
    assert lay.tensor("/bn1/bn1/moving_mean:0").layer == "bn1"


@pytest.mark.parametrize("with_attr", [True, False])
def test_torch_like(tmp_path, with_attr):
    p = tmp_path / "t.h5"
    want = hf.torch_like(p, with_attr=with_attr)
    lay, got = roles_of(p)
    assert lay.framework == "torch" and got == want
    assert lay.tensor("/model/layer1.0.fc.weight").layer == "layer1.0.fc"
    assert lay.tensor("/model/bn1.running_var").layer == "bn1"


@pytest.mark.parametrize("snapshot", [True, False])
def test_chainer_like(tmp_path, snapshot):
    p = tmp_path / "c.h5"
    want = hf.chainer_like(p, snapshot=snapshot)
    lay, got = roles_of(p)
    assert lay.framework == "chainer" and got == want
    layers = {t.path: t.layer for t in lay.tensors}
    pre = "/updater/model:main/predictor" if snapshot else "/predictor"
    assert layers[f"{pre}/conv1/W"] == "conv1" and layers[f"{pre}/bn1/avg_var"] == "bn1"
    if snapshot:
        assert layers["/updater/optimizer:main/predictor/conv1/W/m"] == "conv1"


def test_unknown_layout_guesses_from_names(tmp_path):
    p = tmp_path / "u.h5"
    hf.write_datasets(p, {"net/fc/weight": np.zeros((2, 2), "f4"), "net/fc/bias": np.zeros(2, "f4"),
                          "data": np.zeros(3, "f4"), "counts": np.zeros(3, "i4")})
    lay, got = roles_of(p)
    assert lay.framework is None
    assert got == {"/net/fc/weight": "weight", "/net/fc/bias": "bias", "/data": "other", "/counts": "other"}
    assert lay.tensor("/net/fc/bias").layer == "net/fc" and lay.tensor("/data").layer is None


@pytest.mark.parametrize("name", sorted(hf.FRAMEWORK_BUILDERS))
def test_every_role_is_known(tmp_path, name):
    p = tmp_path / f"{name}.h5"
    want = hf.FRAMEWORK_BUILDERS[name](p)
    lay = read_layout(p)
    assert {t.role for t in lay} <= set(ROLES)
    assert {t.path: t.role for t in lay} == want
    assert lay.framework == {"tf-save-weights": "keras-legacy"}.get(name, name)


def test_torch_optimizer_layers_need_consistent_shapes(tmp_path):
    import json

    p = tmp_path / "t.h5"
    hf.torch_like(p)
    keys = ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
            "bn1.num_batches_tracked", "layer1.0.fc.weight", "layer1.0.fc.bias"]
    with h5py.File(p, "a") as f:
        f["model"].attrs["fastflip_keys"] = json.dumps([[k, "str"] for k in keys])
        f["optimizer"].attrs["param_groups"] = json.dumps([{"lr": 0.1, "params": [0, 1]}])
    # 2 ids but 6 parameters: no mapping is guessed
    assert all(t.layer is None for t in read_layout(p) if t.path.startswith("/optimizer/"))
    with h5py.File(p, "a") as f:
        f["optimizer"].attrs["param_groups"] = json.dumps([{"params": [2, 3]}, {"params": [0, 1, 4, 5]}])
    # ids in order 2, 3, 0, 1, 4, 5 pair with the 6 parameters: 0 -> bn1.weight, 1 -> bn1.bias, both (4,)
    # like the fixture's state tensors: consistent, so labelled
    lay = read_layout(p)
    assert lay.tensor("/optimizer/state/0/exp_avg").layer == "bn1"
    assert lay.tensor("/optimizer/state/1/step").layer == "bn1"
    with h5py.File(p, "a") as f:
        f["optimizer"].attrs["param_groups"] = json.dumps([{"params": [0, 1, 2, 3, 4, 5]}])
    # state 0 -> conv1.weight (4,1,3,3) but exp_avg has shape (4,): shapes disagree, nothing labelled
    assert all(t.layer is None for t in read_layout(p) if t.path.startswith("/optimizer/"))


def test_detect_and_label_path():
    assert detect_framework(["/x"], {"fastflip_layout": b"torch-state-dict/1"}) == "torch"
    assert detect_framework(["/conv/kernel:0"]) == "keras-legacy"
    assert label_path("/optimizer/state/3/step", "torch", 0, "f") == (None, "step-counter")
    assert label_path("/optimizer/state/3/momentum_buffer", "torch", 2, "f") == (None, "optimizer-moment")
    assert label_path("/updater/optimizer:main/t", "chainer", 0, "i") == (None, "step-counter")
    assert label_path("/optimizer_weights/iter", "keras-legacy", 0, "i") == (None, "step-counter")


def test_keras3_weights_of_a_subclassed_model(tmp_path):
    """A file whose datasets are all ``vars/<key>`` entries at any depth (a subclassed model's attribute paths,
    its own ``vars/<i>``) is a Keras 3 weights file: layers from each ``vars`` group's name, roles by siblings.
    One dataset outside a ``vars`` group (which Keras's writer never creates) and it is not."""
    p = str(tmp_path / "sub.weights.h5")
    with h5py.File(p, "w") as f:
        f.create_group("vars").attrs["name"] = "model"
        f["vars/0"] = np.ones((6, 2), "f4")
        f.create_group("l/inner/vars").attrs["name"] = "inner"
        f["l/inner/vars/0"], f["l/inner/vars/1"] = np.ones((6, 3), "f4"), np.zeros(3, "f4")
    lay = read_layout(p)
    assert lay.framework == "keras3"
    assert [(t.path, t.layer, t.role) for t in lay.tensors] == [
        ("/l/inner/vars/0", "inner", "weight"), ("/l/inner/vars/1", "inner", "bias"), ("/vars/0", "model", "weight")]
    with h5py.File(p, "a") as f:
        f["notes"] = np.zeros(2, "f4")
    assert read_layout(p).framework is None
    assert detect_framework(["/vars/0", "/l/inner/vars/k"]) == "keras3"
    assert detect_framework(["/vars/0"], {"layer_names": [b"d"]}) == "keras-legacy"


def test_framework_counts_the_datasets_fastflip_skips(tmp_path):
    """The framework of a file, which decides both how its bfloat16 words are read and how its tensors are
    labelled, comes from every dataset: a skipped string dataset outside ``vars`` makes it no Keras 3 weights file
    (the bfloat16 words stay h5py's raw bytes), though every listed tensor is a ``vars/<key>`` entry."""
    p = str(tmp_path / "w.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("l/vars/0", data=np.array([0x3F80], "<u2").view("V2")).attrs["dtype"] = "bfloat16"
        f["l/vars/1"] = np.zeros(3, "f4")
        f["meta"] = np.array([b"note"], dtype=h5py.string_dtype())
    lay = read_layout(p)
    assert [t.path for t in lay.tensors] == ["/l/vars/1"]
    assert sorted(s.path for s in lay.skipped) == ["/l/vars/0", "/meta"]
    assert lay.framework is None and lay.tensors[0].framework is None


# ------------------------------------------------------------------ real framework files


def _keras_model(keras):
    inputs = keras.Input((6, 6, 1))
    x = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.LayerNormalization(name="ln")(x)
    out = keras.layers.Dense(2, name="head")(x)
    m = keras.Model(inputs, out)
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    m.fit(rng.standard_normal((8, 6, 6, 1)), rng.standard_normal((8, 2)), epochs=1, verbose=0, batch_size=4)
    return m


EXPECT_KERAS = {
    ("conv", 4): "weight", ("conv", 1): "bias", ("head", 2): "weight", ("head", 1): "bias",
}


@pytest.mark.framework
def test_real_keras3_weights_h5(tmp_path):
    keras = require("keras")
    m = _keras_model(keras)
    p = str(tmp_path / "m.weights.h5")
    m.save_weights(p)
    lay = read_layout(p)
    assert lay.framework == "keras3"
    by_layer: dict = {}
    for t in lay.tensors:
        by_layer.setdefault(t.layer, []).append(t)
    roles = {name: [t.role for t in ts] for name, ts in by_layer.items()}
    assert roles["conv"] == ["weight", "bias"]
    assert roles["bn"] == ["weight", "bias", "bn-statistic", "bn-statistic"]
    assert roles["ln"] == ["weight", "bias"]
    assert roles["head"] == ["weight", "bias"]
    opt = by_layer[None]
    n_trainable = len(m.trainable_weights)
    assert [t.role for t in opt].count("optimizer-moment") == 2 * n_trainable  # Adam m and v
    assert [t.role for t in opt].count("step-counter") == 1
    # the step counter is the optimizer's iteration count
    (step,) = [t for t in opt if t.role == "step-counter"]
    with h5py.File(p) as f:
        assert int(f[step.path][()]) == int(m.optimizer.iterations.numpy())
    # bn statistics are exactly the moving mean/variance values
    stats = [t for t in by_layer["bn"] if t.role == "bn-statistic"]
    bn = m.get_layer("bn")
    with h5py.File(p) as f:
        assert np.array_equal(f[stats[0].path][()], np.asarray(bn.moving_mean))
        assert np.array_equal(f[stats[1].path][()], np.asarray(bn.moving_variance))


@pytest.mark.framework
def test_real_keras_legacy_h5(tmp_path):
    keras = require("keras")
    m = _keras_model(keras)
    p = str(tmp_path / "m.h5")
    m.save(p)
    lay = read_layout(p)
    assert lay.framework == "keras-legacy"
    model = [t for t in lay.tensors if t.path.startswith("/model_weights/")]
    got = {(t.layer, t.path.rsplit("/", 1)[-1].split(":")[0]): t.role for t in model}
    assert got == {
        ("conv", "kernel"): "weight", ("conv", "bias"): "bias",
        ("bn", "gamma"): "weight", ("bn", "beta"): "bias",
        ("bn", "moving_mean"): "bn-statistic", ("bn", "moving_variance"): "bn-statistic",
        ("ln", "gamma"): "weight", ("ln", "beta"): "bias",
        ("head", "kernel"): "weight", ("head", "bias"): "bias",
    }
    opt = [t.role for t in lay.tensors if t.path.startswith("/optimizer_weights/")]
    assert opt.count("step-counter") == 1
    assert opt.count("optimizer-moment") == 2 * len(m.trainable_weights)
    # Keras 3 names slots '<model>_<layer>_<var>_momentum': each moment gets its layer, with its shape
    for t in lay.tensors:
        if t.role == "optimizer-moment":
            assert t.layer in {"conv", "bn", "ln", "head"}, t.path
            var = t.path.rsplit("_", 1)[0].rsplit("_", 1)[1]  # kernel, bias, gamma, beta
            (w,) = [x for x in model if x.layer == t.layer and x.path.rsplit("/", 1)[1].split(":")[0] == var]
            assert w.shape == t.shape, t.path


@pytest.mark.framework
def test_real_torch_checkpoint(tmp_path):
    torch = require("torch")
    from fastflip.frameworks.torch_state import save_checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 3)
    )
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1, 6, 6)).sum().backward()
    opt.step()
    p = tmp_path / "t.h5"
    save_checkpoint(p, model, opt, epoch=1)
    lay = read_layout(p)
    assert lay.framework == "torch"
    got = {t.path: t.role for t in lay.tensors}
    assert got["/model/0.weight"] == "weight" and got["/model/0.bias"] == "bias"
    assert got["/model/1.weight"] == "weight" and got["/model/1.running_mean"] == "bn-statistic"
    assert got["/model/1.running_var"] == "bn-statistic" and got["/model/1.num_batches_tracked"] == "step-counter"
    assert got["/model/3.weight"] == "weight" and lay.tensor("/model/3.bias").layer == "3"
    n_params = len(list(model.parameters()))
    opt_roles = [r for p_, r in got.items() if p_.startswith("/optimizer/state/")]
    assert opt_roles.count("optimizer-moment") == 2 * n_params
    assert opt_roles.count("step-counter") == n_params
    # optimizer state is labelled with its parameter's layer (ids follow model.parameters())
    names = [n for n, _ in model.named_parameters()]
    for pid, name in enumerate(names):
        for leaf in ("exp_avg", "exp_avg_sq", "step"):
            t = lay.tensor(f"/optimizer/state/{pid}/{leaf}")
            assert t.layer == name.rpartition(".")[0], (pid, leaf)
            if leaf != "step":
                assert t.shape == lay.tensor(f"/model/{name}").shape


CHAINER_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, chainer, chainer.links as L, chainer.functions as F
    from chainer import serializers, optimizers
    class Net(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.conv1 = L.Convolution2D(1, 2, 3)
                self.bn1 = L.BatchNormalization(2)
                self.fc = L.Linear(None, 3)
        def forward(self, x):
            return self.fc(self.bn1(self.conv1(x)))
    model = L.Classifier(Net())
    opt = optimizers.Adam(); opt.setup(model)
    x = np.random.RandomState(0).randn(4, 1, 6, 6).astype('f4'); y = np.array([0, 1, 2, 0], 'i4')
    opt.update(model, x, y)
    serializers.save_hdf5(sys.argv[1], model)
    serializers.save_hdf5(sys.argv[2], opt)
    from chainer import training, iterators, datasets
    it = iterators.SerialIterator(datasets.TupleDataset(x, y), 2)
    updater = training.updaters.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (2, "iteration"), out=sys.argv[4])
    trainer.run()
    serializers.save_hdf5(sys.argv[3], trainer)
    """
)


@pytest.mark.framework
def test_real_chainer_save_hdf5(tmp_path):
    py = os.environ.get("FASTFLIP_CHAINER_PYTHON")
    if not py:
        if os.environ.get("FASTFLIP_REQUIRE_EXTRAS") == "1":
            pytest.fail("FASTFLIP_CHAINER_PYTHON is not set but make test promised a Chainer venv")
        pytest.skip("Chainer runs in its own venv: set FASTFLIP_CHAINER_PYTHON (make test does)")
    model_p, opt_p, snap_p = (str(tmp_path / n) for n in ("model.h5", "opt.h5", "snapshot.h5"))
    script = tmp_path / "mk.py"
    script.write_text(CHAINER_SCRIPT)
    subprocess.run([py, str(script), model_p, opt_p, snap_p, str(tmp_path / "out")], check=True, timeout=300)
    lay = read_layout(model_p)
    assert lay.framework == "chainer"
    got = {t.path: (t.layer, t.role) for t in lay.tensors}
    assert got["/predictor/conv1/W"] == ("conv1", "weight")
    assert got["/predictor/conv1/b"] == ("conv1", "bias")
    assert got["/predictor/bn1/gamma"] == ("bn1", "weight")
    assert got["/predictor/bn1/avg_mean"] == ("bn1", "bn-statistic")
    assert got["/predictor/bn1/avg_var"] == ("bn1", "bn-statistic")
    assert got["/predictor/fc/W"] == ("fc", "weight")
    assert got["/predictor/bn1/N"] == ("bn1", "step-counter")
    assert {r for _, r in got.values()} == {"weight", "bias", "bn-statistic", "step-counter"}
    # an optimizer saved on its own: /t, /epoch, /<param path>/{m,v,t}
    olay = read_layout(opt_p)
    assert olay.framework == "chainer"
    for t in olay.tensors:
        leaf = t.path.rsplit("/", 1)[-1]
        want = "optimizer-moment" if leaf in ("m", "v") else "step-counter"
        assert t.role == want, t.path
    assert olay.tensor("/predictor/conv1/W/m").layer == "conv1"
    # a trainer snapshot: the model under updater/model:main, the optimizer under updater/optimizer:main
    slay = read_layout(snap_p)
    sroles = {t.path: (t.layer, t.role) for t in slay.tensors}
    assert sroles["/updater/model:main/predictor/conv1/W"] == ("conv1", "weight")
    assert sroles["/updater/model:main/predictor/bn1/avg_var"] == ("bn1", "bn-statistic")
    assert sroles["/updater/optimizer:main/t"] == (None, "step-counter")
    assert sroles["/updater/optimizer:main/predictor/fc/W/v"] == ("fc", "optimizer-moment")
    moments = [p for p, (_, r) in sroles.items() if r == "optimizer-moment"]
    assert len(moments) == 2 * 6  # m and v for 6 parameters


def test_roles_import_no_framework():
    code = ("import sys, fastflip.files.layout, fastflip.files.roles, fastflip.files.select, fastflip.files.diff; "
            "print(sorted(m for m in ('torch', 'keras', 'tensorflow', 'chainer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
