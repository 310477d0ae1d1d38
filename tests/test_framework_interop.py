"""Save with the framework -> fastflip inject -> load with the framework: exactly the logged words, nothing else."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import require
from flip_helper import words_of

pytestmark = pytest.mark.framework


def _all_words(path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__("/" + n, words_of(o[()]).reshape(-1).copy())
                     if isinstance(o, h5py.Dataset) and o.dtype.kind in "fiub" else None)
    return out


def _expected(before: dict[str, np.ndarray], log) -> dict[str, np.ndarray]:
    exp = {k: v.copy() for k, v in before.items()}
    for rec in log.records():
        w = exp[rec["tensor"]]
        assert int(w[rec["index"]]) == rec["old_word"], rec  # the log saw the stored word
        w[rec["index"]] = rec["new_word"]
    return exp


def _assert_words(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], names=None) -> None:
    for name in names or expected:
        assert np.array_equal(got[name], expected[name]), name


# ---------------------------------------------------------------------------- PyTorch


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _torch_trained(torch):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(144, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net, opt


def _torch_loaded_words(torch, path) -> dict[str, np.ndarray]:
    from fastflip.frameworks.torch_state import load_checkpoint

    net, opt = _torch_trained(torch)
    torch.manual_seed(99)  # a different model state, overwritten by the load
    for p in net.parameters():
        torch.nn.init.normal_(p)
    load_checkpoint(path, net, opt)
    out = {f"/model/{k}": words_of(v.numpy()).reshape(-1) for k, v in net.state_dict().items()}
    for pid, st in opt.state_dict()["state"].items():
        for name, v in st.items():
            out[f"/optimizer/state/{pid}/{name}"] = words_of(v.numpy()).reshape(-1)
    return out


@pytest.mark.parametrize("selection, bits", [
    (None, "all"),
    ({"roles": ["optimizer-moment"]}, "exponent-msb"),
    ({"layers": ["4"], "roles": ["weight"]}, "0-22"),
    ({"roles": ["step-counter"]}, "all"),
])
def test_torch_save_inject_load(torch, tmp_path, selection, bits):
    from fastflip.files.inject import inject_file
    from fastflip.frameworks.torch_state import save_checkpoint

    net, opt = _torch_trained(torch)
    src = save_checkpoint(tmp_path / "ck.h5", net, opt)
    before = _all_words(src)
    res = inject_file(src, tmp_path / "alt.h5", seed=5, count=12, bits=bits, selection=selection)
    after_src = _all_words(src)
    assert all(np.array_equal(after_src[k], v) for k, v in before.items())  # the input is untouched
    tensors = {r["tensor"] for r in res.log.records()}
    if selection == {"roles": ["optimizer-moment"]}:
        assert all("/exp_avg" in t for t in tensors)
    if selection and "layers" in selection:
        assert tensors == {"/model/4.weight"}
    if selection == {"roles": ["step-counter"]}:
        assert tensors <= {"/model/1.num_batches_tracked"} | {f"/optimizer/state/{i}/step" for i in range(6)}
    expected = _expected(before, res.log)
    got = _torch_loaded_words(torch, tmp_path / "alt.h5")
    _assert_words(got, expected)


# ---------------------------------------------------------------------------- Keras


def _keras_model(keras):
    from fastflip.frameworks.trainers.keras_trainer import digits_cnn

    keras.utils.set_random_seed(2)
    m = digits_cnn()
    x = np.random.default_rng(0).random((32, 8, 8, 1)).astype("f4")
    m.fit(x, np.arange(32) % 10, epochs=1, verbose=0)
    return m


def test_keras_weights_h5_save_inject_load(keras, tmp_path):
    from fastflip.files.inject import inject_file

    m = _keras_model(keras)
    src = tmp_path / "m.weights.h5"
    m.save_weights(src)
    before = _all_words(src)
    res = inject_file(src, tmp_path / "alt.weights.h5", seed=8, count=15, bits="all")
    m2 = _keras_model(keras)
    m2.load_weights(tmp_path / "alt.weights.h5")
    m2.save_weights(tmp_path / "again.weights.h5")
    _assert_words(_all_words(tmp_path / "again.weights.h5"), _expected(before, res.log))


def test_keras_archive_save_inject_load(keras, tmp_path):
    from fastflip.files.inject import inject_checkpoint_file
    from fastflip.files.keras_archive import read_archive

    m = _keras_model(keras)
    src = tmp_path / "m.keras"
    m.save(src)
    with read_archive(src) as inner:
        before = _all_words(inner)
    res = inject_checkpoint_file(src, tmp_path / "alt.keras", seed=3, count=10, bits="exponent",
                                 selection={"roles": ["weight", "optimizer-moment"]}, log_path=tmp_path / "l.fflog")
    loaded = keras.models.load_model(tmp_path / "alt.keras")
    loaded.save(tmp_path / "again.keras")
    with read_archive(tmp_path / "again.keras") as inner:
        got = _all_words(inner)
    _assert_words(got, _expected(before, res.log))


def test_keras_legacy_h5_save_inject_load(keras, tmp_path):
    from fastflip.files.inject import inject_file

    m = _keras_model(keras)
    src = tmp_path / "legacy.h5"
    m.save(src)
    before = _all_words(src)
    res = inject_file(src, tmp_path / "alt.h5", seed=4, count=10, bits="all", selection={"include": ["model_weights/**"]})
    assert all(r["tensor"].startswith("/model_weights/") for r in res.log.records())
    loaded = keras.models.load_model(tmp_path / "alt.h5", compile=False)
    loaded.save(tmp_path / "again.h5")
    got = _all_words(tmp_path / "again.h5")
    exp = _expected(before, res.log)
    _assert_words(got, exp, [k for k in exp if k.startswith("/model_weights/")])


def test_tf_keras_legacy_save_weights_file(keras, tmp_path):
    """The tf.keras ``save_weights('x.h5')`` layout (root attributes layer_names / weight_names)."""
    from keras.src.legacy.saving import legacy_h5_format

    from fastflip.files.inject import inject_file
    from fastflip.files.layout import read_layout

    m = _keras_model(keras)
    src = tmp_path / "w.h5"
    with h5py.File(src, "w") as f:  # what tf.keras Model.save_weights wrote for an .h5 name
        legacy_h5_format.save_weights_to_hdf5_group(f, m)
        assert "layer_names" in f.attrs
    assert {t.framework for t in read_layout(src).tensors} == {"keras-legacy"}
    before = _all_words(src)
    res = inject_file(src, tmp_path / "alt.h5", seed=6, count=10, bits="all", selection={"roles": ["weight"]})
    m2 = _keras_model(keras)
    m2.load_weights(tmp_path / "alt.h5")  # Keras 3 reads the legacy layout through its public API
    with h5py.File(tmp_path / "again.h5", "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, m2)
    _assert_words(_all_words(tmp_path / "again.h5"), _expected(before, res.log))
