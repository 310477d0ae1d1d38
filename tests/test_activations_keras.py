"""Activation faults in a Keras 3 subclassed model (nested layers, BatchNormalization)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip.errors import OptionError, SelectionError
from fastflip.core.plan import TensorRef
from fastflip.core.reference import apply_plan
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling

pytestmark = pytest.mark.framework
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def subclassed_model():  # noqa: ANN201 - a keras.Model
    keras = require("keras")

    class Block(keras.layers.Layer):
        def __init__(self, **kw):  # noqa: ANN003
            super().__init__(**kw)
            self.d1 = keras.layers.Dense(16, activation="relu", name="b_dense1")
            self.d2 = keras.layers.Dense(16, name="b_dense2")

        def call(self, x):  # noqa: ANN001, ANN201
            return self.d2(self.d1(x))

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block(name="block")
            self.bn = keras.layers.BatchNormalization(name="bn")
            self.head = keras.layers.Dense(3, name="head")
            self.spare = keras.layers.Dense(2, name="spare")  # never called

        def call(self, x, training=False):  # noqa: ANN001, ANN201
            return self.head(self.bn(self.block(x), training=training))

    keras.utils.set_random_seed(0)
    model = Net()
    model(np.zeros((1, 8), np.float32))
    return model


def instance_calls(model) -> list[bool]:  # noqa: ANN001
    return ["call" in model.__dict__] + ["call" in layer.__dict__ for layer in model._flatten_layers(include_self=False)]


@pytest.mark.parametrize("fault", ["flip", "random-bits:2", "stuck-at-1", "scale:3.0"])
def test_keras_per_sample_faults_match_reference(fault: str) -> None:
    model = subclassed_model()
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    golden = np.array(model(x))
    with fastflip.injected_activations(model, seed=2, count=1, model=fault, per_sample=True,
                                       selection=fastflip.Selection(layers=["head"])) as log:
        faulted = np.array(model(x))
        predicted = model.predict(x, verbose=0)  # predict runs the wrapped calls too
    assert np.array_equal(faulted.view(np.uint32), predicted.view(np.uint32))
    assert log.layers == ["head"] and log.forwards == 2 and len(log) == 10
    space = SiteSpace([TensorRef("head", "<f4", (3,))])
    for b in range(5):
        arrays = {"head": golden[b].copy()}
        apply_plan(arrays, space.plan(Sampling(count=1, model=fault), seed=2, stream=(b,)))
        assert np.array_equal(arrays["head"].view(np.uint32), faulted[b].view(np.uint32))
    assert not any(instance_calls(model))  # every wrapped call restored
    assert np.array_equal(np.array(model(x)), golden)
    assert np.array_equal(model.predict(x, verbose=0), golden)


def test_keras_nested_layers_every_sample_and_restore_on_error() -> None:
    model = subclassed_model()
    x = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    golden = np.array(model(x))
    with pytest.raises(RuntimeError, match="boom"):
        with fastflip.injected_activations(model, seed=3, count=2, bits="30",
                                           selection=fastflip.Selection(layers=["b_dense*"])) as log:
            faulted = np.array(model(x))
            raise RuntimeError("boom")
    assert log.layers == ["b_dense1", "b_dense2"] and log.shapes == [(16,), (16,)]
    assert not np.array_equal(faulted, golden)
    assert not any(instance_calls(model))
    assert np.array_equal(np.array(model(x)), golden)
    rows = [sorted(zip(log.layer[log.sample == b].tolist(), log.index[log.sample == b].tolist())) for b in range(4)]
    assert all(r == rows[0] for r in rows)  # per_sample=False: the same neurons in every sample


def test_keras_bad_input() -> None:
    model = subclassed_model()
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(SelectionError, match="matches no layer of this Net; its layers: block, .*head, spare"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["dense_9"])):
            model(x)
    with pytest.raises(OptionError, match=r"spare never ran in the forward"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["spare"])):
            model(x)
    assert not any(instance_calls(model))


def test_keras_tuple_outputs_fault_the_chosen_element_and_functional_targets_are_refused() -> None:
    keras = require("keras")

    class Split(keras.layers.Layer):
        def call(self, x):  # noqa: ANN001, ANN201
            return x * 2.0, x + 1.0

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.split = Split(name="split")
            self.head = keras.layers.Dense(3, name="head")

        def call(self, x):  # noqa: ANN001, ANN201
            a, b = self.split(x)
            return self.head(a - b)

    keras.utils.set_random_seed(0)
    model = Net()
    x = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    model(x)
    for what, sign in (("split", 1.0), ("split:out.1", -1.0)):
        with fastflip.injected_activations(model, seed=3, count=1, model="scale:3.0", per_sample=True,
                                           selection=fastflip.Selection(layers=[what])) as log:
            got = np.array(model(x))
        assert log.layers == (["split:out.0"] if what == "split" else ["split:out.1"])
        a, b = x * 2.0, x + 1.0
        hit = b if sign < 0 else a
        hit[log.sample, log.index] *= 3.0  # by hand: the chosen element of each sample, scaled
        np.testing.assert_array_equal(got, np.array(model.head(a - b)))
    with pytest.raises(OptionError, match="functional targets .* need a PyTorch model"):
        with fastflip.injected_activations(model, seed=3, count=1, selection=fastflip.Selection(layers=["split:softmax"])):
            model(x)
