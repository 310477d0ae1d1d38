"""Live injection into TensorFlow/Keras variables, and mixed tensor kinds in one plan."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from conftest import require
from fastflip import live
from fastflip.errors import LogMismatchError
from test_kernels import make_plan, random_array, reference

pytestmark = pytest.mark.framework
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TF_DTYPES = ["<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"]


def keras_model():
    keras = require("keras")
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, name="c1")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    sub = keras.Sequential([keras.layers.Dense(4, name="d1"), keras.layers.Dense(2, name="d2")], name="sub")
    model = keras.Model(inp, sub(x))
    model.compile("adam", "mse")
    return model


@pytest.mark.parametrize("scale", [False, True])
def test_tf_variables_match_reference(scale: bool) -> None:
    tf = require("tensorflow")
    rng = np.random.default_rng(12 + scale)
    dtypes = [d for d in TF_DTYPES if not (scale and d == "|b1")]
    arrays = {f"v{i}": random_array(d, 12 + i, rng).reshape(-1, 2) if (12 + i) % 2 == 0 else random_array(d, 12 + i, rng)
              for i, d in enumerate(dtypes)}
    arrays["scalar"] = np.array(3.5, dtype=np.float32)
    variables = {k: tf.Variable(v) for k, v in arrays.items()}
    plan = make_plan(live.tensor_refs(variables), rng, per_tensor=5, scale=scale)
    has_bool = any(v.dtype.kind == "b" for v in arrays.values())
    if has_bool:  # TF stores bools as 0/1: keep bool sites to bit 0 rules that produce 0/1
        bool_ids = [j for j, t in enumerate(plan.tensors) if np.dtype(t.dtype).kind == "b"]
        sel = np.isin(plan.tensor, bool_ids)
        a, o, x = plan.and_mask.copy(), plan.or_mask.copy(), plan.xor_mask.copy()  # a plan's columns are read-only
        a[sel] = np.uint64(0)
        o[sel] = rng.integers(0, 2, size=int(sel.sum())).astype(np.uint64)
        x[sel] = np.uint64(0)
        plan = dataclasses.replace(plan, and_mask=a, or_mask=o, xor_mask=x, bits=None)
    expected, exp_old, exp_new = reference(arrays, plan)
    log = live.inject(variables, plan)
    assert log.old_words.tolist() == exp_old.tolist()
    assert log.new_words.tolist() == exp_new.tolist()
    for k, v in variables.items():
        assert v.numpy().tobytes() == expected[k].tobytes(), k
    live.revert(variables, log)
    for k, v in variables.items():
        assert v.numpy().tobytes() == arrays[k].tobytes(), k


def test_keras_names_are_layer_paths_with_weights_h5_aliases(tmp_path) -> None:
    h5py = require("h5py")
    model = keras_model()
    path = tmp_path / "m.weights.h5"
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        stored = {}
        f.visititems(lambda n, o: stored.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    tg = live.targets(model)
    names = [t.name for t in tg.tensors]
    assert names == [v.path for v in model.weights]  # Keras's own paths, with the user's layer names
    assert names[:3] == ["c1/kernel", "c1/bias", "bn/gamma"] and "sub/d2/kernel" in names  # nested Sequential
    aliases = {t.aliases[0] for t in tg.tensors}
    assert aliases == {n for n in stored if not n.startswith("optimizer/")}  # the .weights.h5 paths
    for t in tg.tensors:
        assert t.obj.numpy().tobytes() == stored[t.aliases[0]].tobytes(), t.name
    roles = {t.name: t.role for t in tg.tensors}
    assert roles["c1/kernel"] == "weight" and roles["c1/bias"] == "bias" and roles["bn/gamma"] == "weight"
    assert roles["bn/moving_variance"] == "bn-statistic"
    assert {t.layer for t in tg.tensors} == {"c1", "bn", "sub/d1", "sub/d2"}
    with_opt = live.targets(model, include_optimizer=True)
    extra = {t.name: t.role for t in with_opt.tensors if t.name not in roles}
    assert extra == {"optimizer/iteration": "step-counter", "optimizer/learning_rate": "other"}


def test_keras_model_inject_changes_outputs_and_reverts() -> None:
    model = keras_model()
    x = np.random.default_rng(0).normal(size=(3, 6, 6, 2)).astype(np.float32)
    clean = model.predict(x, verbose=0)
    refs = live.tensor_refs(model)
    kernel = [j for j, r in enumerate(refs) if r.name == "c1/kernel"][0]
    from fastflip.core.plan import Plan

    plan = Plan.from_sites(refs, [kernel], [0], xor_mask=[1 << 30])  # exponent MSB of one conv weight
    with live.injected(model, plan) as log:
        hit = model.predict(x, verbose=0)
        assert not np.array_equal(hit, clean)
        assert log.changed == 1
    assert np.array_equal(model.predict(x, verbose=0), clean)


def test_mixed_kinds_in_one_plan() -> None:
    tf = require("tensorflow")
    torch = require("torch")
    rng = np.random.default_rng(21)
    a = random_array("<f4", 20, rng)
    b = random_array("<i2", 15, rng)
    c = random_array("<f8", 9, rng)
    tensors = {"np": a.copy(), "tf": tf.Variable(b), "torch": torch.from_numpy(c.copy())}
    plan = make_plan(live.tensor_refs(tensors), rng, per_tensor=6)
    expected, _, exp_new = reference({"np": a, "tf": b, "torch": c}, plan)
    tg = live.targets(tensors)
    assert tg.kinds == {"cpu", "tf"}
    log = live.inject(tg, plan)
    assert log.new_words.tolist() == exp_new.tolist()
    assert tensors["np"].tobytes() == expected["np"].tobytes()
    assert tensors["tf"].numpy().tobytes() == expected["tf"].tobytes()
    assert tensors["torch"].numpy().tobytes() == expected["torch"].tobytes()
    tensors["tf"].assign(tf.zeros_like(tensors["tf"]))  # the TF tensor changed since: refuse, change nothing
    with pytest.raises(LogMismatchError):
        live.revert(tg, log)
    assert tensors["np"].tobytes() == expected["np"].tobytes()
