""".keras archives (keras_io) and real Keras save -> alter -> load round trips."""

from __future__ import annotations

import os
import zipfile

import h5py
import numpy as np
import pytest

from flip_helper import flip_bits, words_of
from fastflip.errors import InputFileError
from fastflip.files.keras_archive import UnsafeArchiveError, check_archive, edit_archive, read_archive


def _archive(path, entries):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries:
            z.writestr(name, data)
    return path


def _h5_bytes(tmp_path):
    p = tmp_path / "inner.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.arange(6, dtype="f4").reshape(2, 3))
    return p.read_bytes()


@pytest.mark.parametrize("bad", ["../evil.txt", "/etc/passwd", "a/../../b", "C:/x", "a\\..\\b", "\\abs"])
def test_unsafe_entry_names_are_refused(tmp_path, bad):
    p = _archive(tmp_path / "m.keras", [("model.weights.h5", _h5_bytes(tmp_path)), (bad, "x")])
    with pytest.raises(UnsafeArchiveError, match="unsafe entry name"):
        check_archive(p)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UnsafeArchiveError):
        with edit_archive(p, tmp_path / "out.keras"):
            pass
    assert sorted(os.listdir(tmp_path)) == before  # nothing extracted, nothing written


def test_not_an_archive_and_missing_weights(tmp_path):
    (tmp_path / "x.keras").write_bytes(b"nope")
    with pytest.raises(InputFileError, match="not a .keras archive"):
        check_archive(tmp_path / "x.keras")
    with pytest.raises(InputFileError, match="no such file"):
        check_archive(tmp_path / "missing.keras")
    p = _archive(tmp_path / "y.keras", [("config.json", "{}")])
    with pytest.raises(InputFileError, match="exactly one model.weights.h5"):
        check_archive(p)


def test_check_archive_reads_the_central_directory_once(tmp_path, monkeypatch):
    """The kind, the entry checks and the local-header checks share one reading of the zip directory;
    other zips and damaged ones are refused as before."""
    p = _archive(tmp_path / "m.keras", [("config.json", "{}"), ("model.weights.h5", _h5_bytes(tmp_path))])
    npz = tmp_path / "a.npz"
    np.savez(npz, x=np.ones(3))
    damaged = tmp_path / "d.keras"
    damaged.write_bytes(p.read_bytes().replace(b"PK\x01\x02", b"XX\x01\x02"))  # no central directory record
    reads = []
    real = zipfile.ZipFile._RealGetContents

    def counting(self):
        reads.append(self.filename)
        return real(self)

    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", counting)
    assert [i.filename for i in check_archive(p)] == ["config.json", "model.weights.h5"]
    assert reads == [str(p)]
    with pytest.raises(InputFileError, match="not a .keras archive"):
        check_archive(npz)
    with pytest.raises(InputFileError, match="damaged .keras archive"):
        check_archive(damaged)


def test_edit_keeps_other_entries_and_is_atomic(tmp_path):
    src = _archive(tmp_path / "m.keras", [("metadata.json", '{"a": 1}'), ("model.weights.h5", _h5_bytes(tmp_path)),
                                          ("config.json", '{"b": 2}')])
    original = src.read_bytes()
    out = tmp_path / "o.keras"
    with edit_archive(src, out) as w:
        with h5py.File(w, "r+") as f:
            f["layers/dense/vars/0"][0, 0] = 42.0
    assert src.read_bytes() == original  # the input is untouched
    with zipfile.ZipFile(out) as z:
        assert z.namelist() == ["metadata.json", "model.weights.h5", "config.json"]
        assert z.read("config.json") == b'{"b": 2}' and z.read("metadata.json") == b'{"a": 1}'
    with read_archive(out) as w, h5py.File(w) as f:
        assert f["layers/dense/vars/0"][0, 0] == 42.0
    with pytest.raises(RuntimeError):  # an error inside the block writes nothing
        with edit_archive(src, tmp_path / "never.keras"):
            raise RuntimeError("boom")
    assert not (tmp_path / "never.keras").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------------------- real Keras


def _model(keras):
    keras.utils.set_random_seed(1)
    m = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    m.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((16, 8, 8, 1)).astype("f4")
    m.fit(x, np.arange(16) % 10, epochs=1, verbose=0)
    return m


def _datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def _assert_same_words(a, b, names=None):
    names = names or sorted(set(a) | set(b))
    for n in names:
        assert np.array_equal(words_of(a[n]), words_of(b[n])), n


@pytest.mark.framework
def test_keras3_weights_h5_round_trip(keras, tmp_path):
    m = _model(keras)
    p = tmp_path / "m.weights.h5"
    m.save_weights(p)
    names = ["layers/conv2d/vars/0", "layers/batch_normalization/vars/2", "optimizer/vars/3", "optimizer/vars/0"]
    flipped = flip_bits(p, names, seed=3)
    m2 = _model(keras)
    m2.load_weights(p)
    m2.save_weights(tmp_path / "again.weights.h5")
    altered, reloaded = _datasets(p), _datasets(tmp_path / "again.weights.h5")
    _assert_same_words(altered, reloaded)
    for n, words in flipped.items():
        assert np.array_equal(words_of(reloaded[n]), words), n


@pytest.mark.framework
def test_keras_archive_round_trip(keras, tmp_path):
    m = _model(keras)
    src = tmp_path / "m.keras"
    m.save(src)
    with read_archive(src) as w:
        before = _datasets(w)
    with edit_archive(src, tmp_path / "alt.keras") as w:
        flipped = flip_bits(w, ["layers/dense/vars/0", "optimizer/vars/5"], seed=9)
    loaded = keras.models.load_model(tmp_path / "alt.keras")
    loaded.save(tmp_path / "again.keras")
    with read_archive(tmp_path / "again.keras") as w:
        after = _datasets(w)
    for n, words in flipped.items():
        assert np.array_equal(words_of(after[n]), words), n
        assert not np.array_equal(words_of(before[n]), words)
    _assert_same_words(before, after, [n for n in before if n not in flipped])


@pytest.mark.framework
def test_legacy_h5_model_save_round_trip(keras, tmp_path):
    m = _model(keras)
    p = tmp_path / "legacy.h5"
    m.save(p)  # legacy HDF5 format (model_weights/..., config in attributes)
    with h5py.File(p) as f:
        assert "model_weights" in f
        kernels = []
        f["model_weights"].visititems(lambda n, o: kernels.append("model_weights/" + n)
                                      if isinstance(o, h5py.Dataset) else None)
    flipped = flip_bits(p, kernels[:3], seed=4)
    loaded = keras.models.load_model(p, compile=False)
    loaded.save(tmp_path / "again.h5")
    after = _datasets(tmp_path / "again.h5")
    for n, words in flipped.items():
        assert np.array_equal(words_of(after[n]), words), n
