"""Live injection into Keras 3 models as people write them, judged by Keras's own reading.

Weights: after ``live.inject`` the model's ``model.weights`` (``variable.numpy()``) and every layer's
``get_weights()`` must show exactly the logged words at the logged elements and nothing else; the revert
must give back every variable bit for bit. Activations: the model's output under ``injected_activations``
must be bit-identical to the output with a hand-written wrapper of the same layer call that writes the
logged new words into the same elements; after the block the model computes as before.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip import live

pytestmark = pytest.mark.framework
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
X = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")


def _words(a):
    a = np.ascontiguousarray(np.asarray(a)).reshape(-1)
    return a.view(UINT[a.dtype.itemsize]).copy()


def _reading(model):
    """Keras's view of the model: every variable by path, every layer's get_weights(), as raw words."""
    out = {f"var:{v.path}": _words(v.numpy()) for v in model.weights}
    for layer in model._flatten_layers(include_self=False):
        for v, a in zip(layer.weights, layer.get_weights(), strict=True):
            out[f"get_weights:{layer.name}:{v.path}"] = _words(a)
    return out


def _weights_agree(model, *, count=24, **options):
    before = _reading(model)
    tg = live.targets(model)
    plan = live.plan_for(tg, seed=3, count=count, **options)
    log = live.inject(tg, plan)
    after = _reading(model)
    path_of = {id(getattr(v, "_value", v)): v.path for v in model.weights}
    expect = {}
    for j in range(len(plan)):
        path = f"var:{path_of[id(tg.get(plan.tensors[int(plan.tensor[j])].name).obj)]}"
        w = expect.setdefault(path, before[path].copy())
        assert w[int(plan.index[j])] == log.old_words[j]
        w[int(plan.index[j])] = log.new_words[j]
    for k in before:  # model.weights and every layer's get_weights() show exactly the logged changes
        path = "var:" + k.rpartition(":")[2]
        np.testing.assert_array_equal(after[k], expect.get(path, before[k]), err_msg=k)
    assert log.changed == len(plan) > 0
    live.revert(tg, log)
    for k, v in _reading(model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    return {plan.tensors[int(i)].name for i in plan.tensor}


@contextlib.contextmanager
def _policy(name):
    keras = require("keras")
    old = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def _dense_pair(keras, units, twice=False):
    """A subclassed model: Dense ``d`` (``units`` wide; called twice when ``twice``), then Dense ``o``."""
    class Pair(keras.Model):
        def __init__(self):
            super().__init__()
            self.d, self.o = keras.layers.Dense(units, name="d"), keras.layers.Dense(2, name="o")

        def call(self, x):
            h = self.d(x)
            return self.o(self.d(h) if twice else h)

    return Pair()


def _functional_shared(keras):
    inp = keras.Input((5,))
    shared = keras.layers.Dense(5, name="shared")
    a, b = shared(inp), shared(keras.layers.Dense(5, name="pre")(inp))
    out = keras.layers.Dense(2, name="head")(keras.layers.Concatenate()([a, b]))
    return keras.Model(inp, out), shared


def _nested(keras):
    inner = keras.Sequential([keras.layers.Dense(4, name="i1"), keras.layers.BatchNormalization(name="ibn")],
                             name="inner")
    outer = keras.Sequential([keras.Input((5,)), inner, keras.layers.Dense(2, name="o")], name="outer")
    outer.compile("adam", "mse")
    outer.fit(X, np.ones((4, 2), "float32"), epochs=1, verbose=0)  # moving statistics move
    return outer, inner


def test_functional_model_with_a_layer_shared_by_two_branches():
    keras = require("keras")
    keras.utils.set_random_seed(0)
    model, _ = _functional_shared(keras)
    hit = _weights_agree(model, count=30)
    assert {"shared/kernel", "pre/kernel"} <= hit


def test_nested_model_batchnorm_statistics_and_frozen_layers():
    keras = require("keras")
    keras.utils.set_random_seed(0)
    outer, inner = _nested(keras)
    assert _weights_agree(outer, count=10, roles=["bn-statistic"]) == {"inner/ibn/moving_mean",
                                                                      "inner/ibn/moving_variance"}
    inner.trainable = False  # non-trainable variables are the model's weights too
    assert "inner/i1/kernel" in _weights_agree(outer, count=40)


@pytest.mark.parametrize("policy", ["mixed_float16", "bfloat16"])
def test_mixed_precision_variables(policy):
    keras = require("keras")
    keras.utils.set_random_seed(0)
    with _policy(policy):
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="d"),
                                  keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2, name="o")])
    stored = {v.path.rpartition("/")[2]: str(v.dtype) for v in model.weights}
    assert stored["kernel"] == ("float32" if policy == "mixed_float16" else "bfloat16")
    _weights_agree(model, count=30, bits="exponent")


BF16_EXPONENT = sum(1 << b for b in range(7, 15))


@pytest.mark.parametrize("how", ["layer-dtype", "bfloat16-policy", "mixed_bfloat16-policy"])
def test_bfloat16_variables_are_flipped_in_the_words_keras_holds(how):
    """A bfloat16 variable (a layer's ``dtype="bfloat16"``, the ``"bfloat16"`` policy) is listed as bfloat16 words:
    ``bits="exponent"`` flips bfloat16's exponent bits (7-14), ``variable.numpy()`` shows exactly the logged words,
    the revert gives every variable back bit for bit. Under ``mixed_bfloat16`` the variables stay float32."""
    keras = require("keras")
    keras.utils.set_random_seed(0)
    with _policy({"layer-dtype": "float32", "bfloat16-policy": "bfloat16",
                  "mixed_bfloat16-policy": "mixed_bfloat16"}[how]):
        model = keras.Sequential([keras.Input((5,)),
                                  keras.layers.Dense(4, name="d", dtype="bfloat16" if how == "layer-dtype" else None),
                                  keras.layers.Dense(2, name="o")])
    bf16 = {v.path.split("/", 1)[-1] for v in model.weights if str(v.dtype) == "bfloat16"}
    assert bf16 == {"layer-dtype": {"d/kernel", "d/bias"}, "bfloat16-policy": {"d/kernel", "d/bias", "o/kernel",
                                                                               "o/bias"},
                    "mixed_bfloat16-policy": set()}[how]
    tg = live.targets(model)
    plan = live.plan_for(tg, seed=3, count=40, bits="exponent")
    assert {t.name: t.format for t in plan.tensors} == {n: "bfloat16" if n in bf16 else None
                                                        for n in ("d/kernel", "d/bias", "o/kernel", "o/bias")}
    for j in range(len(plan)):
        if plan.tensors[int(plan.tensor[j])].format:
            assert int(plan.bits[j]) & ~BF16_EXPONENT == 0, hex(int(plan.bits[j]))
    assert _weights_agree(model, count=40, bits="exponent") >= bf16


def test_subclassed_model_calling_one_layer_twice():
    keras = require("keras")
    keras.utils.set_random_seed(0)

    model = _dense_pair(keras, 5, twice=True)
    model(X)
    assert _weights_agree(model, count=20) == {"d/kernel", "d/bias", "o/kernel", "o/bias"}


# ------------------------------------------------------------------------------------------- activations


def _by_hand(model, layer, call, records, element=None):
    """The model's output with ``layer.call`` wrapped by hand: call ``call`` gets the logged new words (in
    ``element`` of a tuple output when given)."""
    keras = require("keras")
    original = layer.call
    count = {"k": 0}

    def wrapped(*a, **k):
        out = original(*a, **k)
        i = count["k"]
        count["k"] += 1
        if i != call:
            return out
        t = out if element is None else out[element]
        arr = np.array(keras.ops.convert_to_numpy(t))
        words, per = arr.reshape(-1).view(UINT[arr.dtype.itemsize]), arr[0].size
        for r in records:
            words[r["sample"] * per + r["index"]] = r["new"]
        new = keras.ops.convert_to_tensor(arr, dtype=t.dtype)
        return new if element is None else tuple(new if j == element else o for j, o in enumerate(out))

    layer.call = wrapped
    try:
        return keras.ops.convert_to_numpy(model(X, training=False))
    finally:
        del layer.call


def _activations_agree(model, target, layer, call=0, element=None, count=3):
    keras = require("keras")

    def bits(a):
        return a.view(UINT[a.dtype.itemsize])

    clean = keras.ops.convert_to_numpy(model(X, training=False))
    before = [v.numpy().copy() for v in model.weights]
    sel = fastflip.Selection(layers=[target])
    with fastflip.injected_activations(model, seed=7, count=count, bits="exponent-msb", selection=sel) as log:
        got = keras.ops.convert_to_numpy(model(X, training=False))
    assert len(log) == 4 * count and len(log.layers) == 1
    np.testing.assert_array_equal(bits(got), bits(_by_hand(model, layer, call, log.records(), element)))
    np.testing.assert_array_equal(bits(keras.ops.convert_to_numpy(model(X, training=False))), bits(clean))
    for v, b in zip(model.weights, before):
        np.testing.assert_array_equal(_words(v.numpy()), _words(b))
    return log


def test_activation_in_a_shared_layer_faults_the_call_named():
    keras = require("keras")
    keras.utils.set_random_seed(0)
    model, shared = _functional_shared(keras)
    assert _activations_agree(model, "shared#0", shared).layers == ["shared"]
    assert _activations_agree(model, "shared#1", shared, call=1).layers == ["shared#1"]


@pytest.mark.parametrize("which", ["i1", "ibn", "inner"])
def test_activation_inside_a_nested_model(which):
    keras = require("keras")
    keras.utils.set_random_seed(0)
    outer, inner = _nested(keras)
    layer = {"i1": inner.layers[0], "ibn": inner.layers[1], "inner": inner}[which]
    _activations_agree(outer, which, layer)


def test_activation_of_a_float16_layer_under_mixed_precision():
    keras = require("keras")
    keras.utils.set_random_seed(0)
    with _policy("mixed_float16"):
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="d"),
                                  keras.layers.Dense(2, name="o", dtype="float32")])
    log = _activations_agree(model, "d", model.layers[0])
    assert log.dtypes == ["<f2"]


def test_activation_of_a_bfloat16_layer():
    """A bfloat16 layer's output (a layer's ``dtype="bfloat16"``) is faulted in its bfloat16 words."""
    keras = require("keras")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="d", dtype="bfloat16"),
                              keras.layers.Dense(2, name="o")])
    log = _activations_agree(model, "d", model.layers[0])
    assert log.dtypes == ["bfloat16"]


def test_activation_in_an_element_of_a_tuple_output_and_attention_scores():
    keras = require("keras")
    keras.utils.set_random_seed(0)

    class Pair(keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.d = keras.layers.Dense(5, name="pd")

        def call(self, x):
            y = self.d(x)
            return y, y * 2

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.pair = Pair(name="pair")
            self.mha = keras.layers.MultiHeadAttention(2, 4, name="mha")
            self.o = keras.layers.Dense(2, name="o")

        def call(self, x):
            a, b = self.pair(keras.ops.reshape(x, (-1, 1, 5)))
            h, w = self.mha(a, b, return_attention_scores=True)
            return self.o(keras.ops.reshape(h + a, (-1, 5))) + keras.ops.mean(w)

    model = Net()
    model(X)
    assert _activations_agree(model, "pair:out.1", model.pair, element=1).layers == ["pair:out.1"]
    assert _activations_agree(model, "pair", model.pair, element=0).layers == ["pair:out.0"]
    log = _activations_agree(model, "mha:out.1", model.mha, element=1, count=2)
    assert log.shapes == [(2, 1, 1)]


def test_errors_raised_inside_a_layer_call_stay_one_line():
    """Keras rewrites exceptions crossing a layer call into several lines; fastflip's own stay as raised."""
    keras = require("keras")
    from fastflip.errors import CapacityError, OptionError

    keras.utils.set_random_seed(0)
    model = _dense_pair(keras, 2)
    with pytest.raises(CapacityError) as info:
        with fastflip.injected_activations(model, seed=1, count=3, bits="31", selection=fastflip.Selection(
                layers=["d"])):
            model(X)
    assert "\n" not in str(info.value) and "only 2" in str(info.value)
    sel = fastflip.Selection(layers=["d"])
    with pytest.raises(OptionError) as info:  # a changed output shape, found in a layer's call
        with fastflip.injected_activations(model, seed=1, count=1, bits="31", selection=sel):
            model(X)
            model(X[:, None, :])
    assert "\n" not in str(info.value) and "fixed output shapes" in str(info.value)
