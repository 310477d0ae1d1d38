"""Same seed => the file-injected checkpoint, once loaded, equals the live-injected model bit for bit.

Keras (``.weights.h5``) and PyTorch (``fastflip.frameworks.torch_state.save_checkpoint``): the file side is
``fastflip.files.inject.inject_file``, the live side ``fastflip.live.injected`` with the same
sampling options. Both draw from the same site space because live tensors carry the
checkpoint's names and are ordered as the checkpoint's layout orders them.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from fastflip import live
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from fastflip.files.select import Selection

pytestmark = pytest.mark.framework

SAMPLING = [
    dict(count=40, model="flip"),
    dict(count=25, model="random-bits:3", bits="exponent"),
    dict(rate=0.02, model="stuck-at-1"),
    dict(count=30, model="scale:-3.0"),
]


def keras_model():
    keras = require("keras")
    keras.utils.set_random_seed(1)
    inp = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3)(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(5)(x)
    out = keras.layers.Dense(2)(x)
    return keras.Model(inp, out)


@pytest.mark.parametrize("opts", SAMPLING, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_keras_file_and_live_injection_agree(tmp_path, opts) -> None:
    model = keras_model()
    src, dst = tmp_path / "m.weights.h5", tmp_path / "faulty.weights.h5"
    model.save_weights(src)
    sel = Selection(include=["layers/**"])
    res = inject_file(src, dst, seed=11, selection=sel, log_path=False, **opts)
    layout_names = [t.path.lstrip("/") for t in read_layout(str(src)).tensors if t.path.startswith("/layers/")]
    # the framework's names (conv2d/kernel) carry the checkpoint's paths as aliases, in the checkpoint's order
    assert [t.aliases[0] for t in live.targets(model).sampled()] == layout_names

    loaded = keras_model()
    loaded.load_weights(dst)
    with live.injected(model, seed=11, **opts) as log:
        assert len(log) == len(res.log) > 0
        for a, b in zip(model.weights, loaded.weights):
            assert np.asarray(a.numpy()).tobytes() == np.asarray(b.numpy()).tobytes(), a.path
    fresh = keras_model()
    for a, b in zip(model.weights, fresh.weights):  # reverted exactly
        assert a.numpy().tobytes() == b.numpy().tobytes()


@pytest.mark.parametrize("opts", SAMPLING, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_torch_file_and_live_injection_agree(tmp_path, opts) -> None:
    torch = require("torch")
    from fastflip.frameworks.torch_state import load_checkpoint, save_checkpoint

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                   torch.nn.Linear(4 * 4 * 4, 3))

    model = make()
    src, dst = tmp_path / "m.h5", tmp_path / "faulty.h5"
    save_checkpoint(src, model)
    sel = Selection(include=["model/**"], dtypes=["float"])
    res = inject_file(src, dst, seed=5, selection=sel, log_path=False, **opts)
    loaded = make()
    load_checkpoint(dst, loaded)
    floats = {k: v for k, v in model.state_dict().items() if v.dtype == torch.float32}
    tg = live.Targets.from_tensors({f"model/{k}": v for k, v in floats.items()})
    layout_names = [t.path.lstrip("/") for t in read_layout(str(src)).tensors if t.path.lstrip("/") in tg.index]
    assert [r.name for r in tg.refs()] == layout_names
    with live.injected(tg, seed=5, **opts) as log:
        assert len(log) == len(res.log) > 0
        for k, v in loaded.state_dict().items():
            assert v.numpy().tobytes() == model.state_dict()[k].numpy().tobytes(), k
    for k, v in make().state_dict().items():
        assert v.numpy().tobytes() == model.state_dict()[k].numpy().tobytes(), k


def test_plan_from_the_checkpoint_log_applies_to_the_live_model(tmp_path) -> None:
    """The file log's plan (dataset paths with a leading '/') applied live gives the same words and tensors."""
    model = keras_model()
    src, dst = tmp_path / "m.weights.h5", tmp_path / "faulty.weights.h5"
    model.save_weights(src)
    res = inject_file(src, dst, seed=2, count=60, model="adjacent:2", selection=Selection(include=["layers/**"]),
                      log_path=False)
    assert res.log.plan.tensors[0].name.startswith("/")
    loaded = keras_model()
    loaded.load_weights(dst)
    log = live.inject(model, res.log.plan)
    assert log.old_words.tolist() == res.log.old_words.tolist()
    assert log.new_words.tolist() == res.log.new_words.tolist()
    for a, b in zip(model.weights, loaded.weights):
        assert a.numpy().tobytes() == b.numpy().tobytes(), a.path
    live.revert(model, log)
