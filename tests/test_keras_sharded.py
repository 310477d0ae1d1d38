"""Keras 3 sharded weights (``save_weights("m.weights.json", max_shard_size=...)``) judged by Keras itself.

A small model (Conv2D, BatchNormalization, a bfloat16 Dense, a float32 Dense) is saved sharded with a tiny
``max_shard_size`` (three shards, one layer's variables split over two of them) and unsharded. fastflip's
commands (inspect, inject to a new directory and in place, replay, revert, diff) run on the index or its
directory; the judge is ``model.load_weights("m.weights.json")`` into a fresh model, compared variable by variable
(raw words) with Keras's reading of the unsharded file with the logged words written at the logged paths by
h5py. Sets Keras would refuse or read otherwise are refused in one line, nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import h5py
import numpy as np
import pytest

from conftest import assert_refused, require, snapshot
from fastflip.cli import main
from fastflip.files.layout import read_layout
from fastflip.files.log import InjectionLog

pytestmark = pytest.mark.framework

MAX_SHARD = 1030 / 1024**3  # bytes, in Keras's GB: conv + bn | dense kernel | dense bias + dense_1
SHARDS = ["m_00000.weights.h5", "m_00001.weights.h5", "m_00002.weights.h5"]


def _build() -> Any:
    keras = require("keras")
    return keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                             keras.layers.Flatten(), keras.layers.Dense(8, dtype="bfloat16"), keras.layers.Dense(10)])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The model's weights saved sharded (``sharded/m.weights.json``) and unsharded (``m.weights.h5``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    root = tmp_path_factory.mktemp("ksharded")
    model = _build()
    rng = np.random.default_rng(0)
    for v in model.weights:
        a = rng.standard_normal(tuple(v.shape)).astype("f4")
        v.assign(np.abs(a) + 0.5 if "variance" in v.path else a)  # a model whose outputs are finite
    os.mkdir(root / "sharded")
    model.save_weights(str(root / "sharded" / "m.weights.json"), max_shard_size=MAX_SHARD)
    model.save_weights(str(root / "m.weights.h5"))
    assert sorted(os.listdir(root / "sharded")) == ["m.weights.json"] + SHARDS
    return {"root": str(root), "index": str(root / "sharded" / "m.weights.json"),
            "single": str(root / "m.weights.h5"), "words": _words(_loaded(str(root / "m.weights.h5")))}


def _loaded(path: str) -> Any:
    model = _build()
    model.load_weights(path)
    return model


def _words(model: Any) -> list[np.ndarray]:
    """Every variable's raw words, in the model's order."""
    out = []
    for v in model.weights:
        a = np.asarray(v.numpy())
        out.append(a.view(f"u{a.dtype.itemsize}").copy())
    return out


def _expected(saved: dict[str, Any], log: InjectionLog, tmp: str) -> list[np.ndarray]:
    """Keras's reading of the unsharded file with the logged new words written by h5py at the logged paths."""
    path = os.path.join(tmp, "expected.weights.h5")
    shutil.copy(saved["single"], path)
    with h5py.File(path, "r+") as f:
        for k, t in enumerate(log.plan.tensors):
            ds = f[t.name]
            raw = ds[()]
            words = raw.view(f"u{raw.dtype.itemsize}").reshape(-1)
            at = np.flatnonzero(log.plan.tensor == k)
            assert np.array_equal(words[log.plan.index[at]], log.old_words[at].astype(words.dtype))
            words[log.plan.index[at]] = log.new_words[at].astype(words.dtype)
            ds[...] = raw
    return _words(_loaded(path))


def _judge(saved: dict[str, Any], out_index: str, log: InjectionLog, tmp: str) -> None:
    """Keras loads ``out_index`` as the original with exactly the logged words changed."""
    got, want, orig = _words(_loaded(out_index)), _expected(saved, log, tmp), saved["words"]
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    changed = sum(int(np.count_nonzero(g != o)) for g, o in zip(got, orig))
    assert changed == int(np.count_nonzero(log.old_words != log.new_words)) > 0


def _set(tmp: str, saved: dict[str, Any], name: str = "work") -> str:
    d = os.path.join(tmp, name)
    shutil.copytree(os.path.dirname(saved["index"]), d)
    return d


def test_inspect_lists_what_the_unsharded_file_lists_each_in_its_shard(saved: dict[str, Any]) -> None:
    lay, single = read_layout(saved["index"]), read_layout(saved["single"])
    def rows(layout: Any) -> list[tuple]:
        return [(t.path, t.dtype, t.shape, t.layer, t.role) for t in layout.tensors]

    assert rows(lay) == rows(single)  # a bias split from its kernel is still a bias
    assert all(t.role is None for s in lay.shards.values() for t in s.tensors)  # roles are the set's, made once
    assert set(lay.shard_of.values()) == set(SHARDS)
    with h5py.File(os.path.join(os.path.dirname(saved["index"]), SHARDS[2])) as f:
        assert lay.shard_of["/layers/dense/vars/1"] == SHARDS[2] and "layers/dense/vars/1" in f
    assert lay.shard_of["/layers/dense/vars/0"] == SHARDS[1]  # one layer's variables over two shards
    assert [t.path for t in read_layout(os.path.dirname(saved["index"])).tensors] == [t.path for t in lay.tensors]
    assert main(["inspect", saved["index"]]) == 0


@pytest.mark.parametrize("select", [[], ["--role", "bias"]])
def test_a_seed_draws_the_same_sites_in_the_sharded_and_the_unsharded_save(saved: dict[str, Any], tmp_path: Any,
                                                                            select: list[str]) -> None:
    outs = []
    for src, out in ((saved["index"], tmp_path / "a"), (saved["single"], tmp_path / "b.weights.h5")):
        assert main(["inject", src, "-o", str(out), "--seed", "4", "--count", "30", "-q", *select]) == 0
        outs.append(InjectionLog.load(str(out) + ".fflog"))
    a, b = outs
    assert [t.name for t in a.plan.tensors] == [t.name for t in b.plan.tensors]
    assert np.array_equal(a.plan.index, b.plan.index) and np.array_equal(a.new_words, b.new_words)


def test_inject_to_a_new_directory_is_read_by_keras_with_exactly_the_logged_words_and_reverts(
        saved: dict[str, Any], tmp_path: Any) -> None:
    src = _set(str(tmp_path), saved)
    with open(os.path.join(src, "notes.txt"), "w") as fh:  # not part of the Keras set: not carried
        fh.write("x")
    before = snapshot(src)
    out = str(tmp_path / "out")
    assert main(["inject", os.path.join(src, "m.weights.json"), "-o", out, "--seed", "2", "--count", "40",
                 "-q"]) == 0
    assert snapshot(src) == before and sorted(os.listdir(out)) == ["m.weights.json"] + SHARDS
    log = InjectionLog.load(out + ".fflog")
    assert len({t["shard"] for t in log.manifest["tensors"]}) >= 2  # flips in more than one shard
    _judge(saved, os.path.join(out, "m.weights.json"), log, str(tmp_path))
    untouched = set(SHARDS) - set(log.manifest["checkpoint_dir"]["shards"])
    for name in untouched | {"m.weights.json"}:
        assert snapshot(os.path.join(out, name)) == before[name]
    assert main(["revert", out + ".fflog", out, "-q"]) == 0
    assert snapshot(out) == {k: v for k, v in before.items() if k != "notes.txt"}


def test_in_place_by_directory_replay_and_revert_bit_for_bit(saved: dict[str, Any], tmp_path: Any) -> None:
    src = _set(str(tmp_path), saved)
    before = snapshot(src)
    lp = str(tmp_path / "ip.fflog")
    assert main(["inject", src, "--in-place", "--seed", "9", "--count", "25", "--log", lp, "-q"]) == 0
    log = InjectionLog.load(lp)
    _judge(saved, os.path.join(src, "m.weights.json"), log, str(tmp_path))
    injected = snapshot(src)
    rp = str(tmp_path / "replayed")
    assert main(["replay", lp, _set(str(tmp_path), saved, "fresh"), "-o", rp, "-q"]) == 0
    assert snapshot(rp) == injected
    assert main(["revert", lp, os.path.join(src, "m.weights.json"), "-q"]) == 0
    assert snapshot(src) == before


def test_diff_counts_the_logged_flips(saved: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    out = str(tmp_path / "out")
    assert main(["inject", saved["index"], "-o", out, "--seed", "3", "--count", "12", "-q"]) == 0
    log = InjectionLog.load(out + ".fflog")
    capsys.readouterr()
    main(["diff", saved["index"], os.path.join(out, "m.weights.json"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["elements_differing"] == int(np.count_nonzero(log.old_words != log.new_words))


def _edit_index(d: str, edit: Any) -> None:
    p = os.path.join(d, "m.weights.json")
    with open(p) as fh:
        data = json.load(fh)
    edit(data["weight_map"])
    with open(p, "w") as fh:
        json.dump(data, fh)


def _missing_shard(d: str) -> None:
    os.unlink(os.path.join(d, SHARDS[2]))


def _outside(d: str) -> None:
    _edit_index(d, lambda wm: wm.update({"/layers/dense_1/vars": ["../m_00002.weights.h5"]}))


def _extra_dataset(d: str) -> None:
    with h5py.File(os.path.join(d, SHARDS[0]), "r+") as f:
        f["layers/dense_1/vars/0"] = np.ones(3, "f4")  # dense_1 is listed in shard 2 only: Keras never reads it


def _two_shards(d: str) -> None:
    with h5py.File(os.path.join(d, SHARDS[2]), "r+") as f:
        f["layers/dense/vars/0"] = np.ones((64, 8), "f4")
    _edit_index(d, lambda wm: wm.update({"/layers/dense/vars": [SHARDS[1], SHARDS[2]]}))


def _dup_listed(d: str) -> None:
    _edit_index(d, lambda wm: wm.update({"/layers/dense_1/vars": [SHARDS[2], SHARDS[2]]}))


def _not_listed_there(d: str) -> None:
    _edit_index(d, lambda wm: wm.update({"/layers/conv2d/vars": [SHARDS[0], SHARDS[1]]}))


def _renamed_index(d: str) -> None:  # Keras opens other_00000.weights.h5 first: missing
    os.rename(os.path.join(d, "m.weights.json"), os.path.join(d, "other.weights.json"))


def _no_weight_map(d: str) -> None:
    with open(os.path.join(d, "m.weights.json"), "w") as fh:
        json.dump({"metadata": {}}, fh)


def _not_a_group(d: str) -> None:
    _edit_index(d, lambda wm: wm.update({"layers/conv2d": wm.pop("/layers/conv2d/vars")}))


@pytest.mark.parametrize("damage, keras, why", [  # keras: what load_weights does with the damaged set
    (_missing_shard, "otherwise", "shard missing (listed by"), (_outside, "raises", "not a file name beside the index"),
    (_renamed_index, "raises", "Keras opens it first"), (_no_weight_map, "raises", "no weight_map"),
    (_extra_dataset, "loads", "does not list in this shard"), (_two_shards, "raises", "also in"),
    (_not_listed_there, "loads", "holds no variable of"), (_not_a_group, "loads", "not a variables group"),
    (_dup_listed, "raises", "lists a shard twice")])
def test_what_keras_refuses_or_reads_otherwise_is_refused_in_one_line(
        saved: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture, damage: Any, keras: str,
        why: str) -> None:
    d = _set(str(tmp_path), saved)
    damage(d)
    index = os.path.join(d, [n for n in os.listdir(d) if n.endswith(".json")][0])
    if keras == "raises":
        with pytest.raises(Exception):
            _loaded(index)
    else:  # Keras loads without an error: the saved words ("loads"), or other ones ("otherwise")
        model = _build()
        initial = _words(model)
        model.load_weights(index)
        got = _words(model)
        same = all(np.array_equal(a, b) for a, b in zip(got, saved["words"]))
        assert same == (keras == "loads")
        if damage is _missing_shard:  # dense and dense_1 (partly or wholly in that shard) keep the fresh values
            assert all(np.array_equal(a, b) for a, b in zip(got[-4:], initial[-4:]))
            assert all(np.array_equal(a, b) for a, b in zip(got[:-4], saved["words"][:-4]))
    before = snapshot(str(tmp_path))
    for args in (["inspect", index], ["inject", index, "-o", str(tmp_path / "out"), "--count", "3"],
                 ["inject", d, "--in-place", "--count", "3"]):
        assert why in assert_refused(capsys, main(args), str(tmp_path), before, command=args[0])


def test_a_json_not_named_weights_json_is_no_keras_index(saved: dict[str, Any], tmp_path: Any,
                                                         capsys: pytest.CaptureFixture) -> None:
    from fastflip.files.formats.hfdir import is_checkpoint_dir

    d = _set(str(tmp_path), saved)
    other = os.path.join(d, "fooweights.json")  # Keras's load_weights takes only names ending in .weights.json
    shutil.copy(os.path.join(d, "m.weights.json"), other)
    assert not is_checkpoint_dir(other)
    before = snapshot(str(tmp_path))
    why = assert_refused(capsys, main(["inspect", other]), str(tmp_path), before, command="inspect")
    assert "not an HDF5 file nor another known checkpoint format" in why
    assert main(["inspect", d]) == 0  # the directory's one index is still m.weights.json


def test_outputs_and_directories_that_name_no_one_set_are_refused(saved: dict[str, Any], tmp_path: Any,
                                                                   capsys: pytest.CaptureFixture) -> None:
    d = _set(str(tmp_path), saved)
    shutil.copy(os.path.join(d, "m.weights.json"), os.path.join(d, "n.weights.json"))
    before = snapshot(str(tmp_path))
    assert "several Keras sharded indexes" in assert_refused(capsys, main(["inspect", d]), str(tmp_path), before,
                                                              command="inspect")
    why = assert_refused(capsys, main(["inject", os.path.join(d, "m.weights.json"), "-o",
                                       str(tmp_path / "x.weights.json"), "--count", "2"]), str(tmp_path), before)
    assert "the output of a checkpoint directory (or sharded Keras save) is a directory" in why


def test_campaign_trial_path_copies_only_the_set_flips_where_words_lie_and_restores(saved: dict[str, Any],
                                                                                   tmp_path: Any) -> None:
    from fastflip.files.sharded import copy_checkpoint_dir, inject_dir, restore_dir

    src = _set(str(tmp_path), saved)
    os.mkdir(os.path.join(src, "logs"))  # beside the set, never part of it
    before = snapshot(os.path.join(src, "m.weights.json"))
    work = copy_checkpoint_dir(src, str(tmp_path / "trial"))
    assert sorted(os.listdir(work)) == ["m.weights.json"] + SHARDS
    original = snapshot(work)
    res = inject_dir(work, in_place=True, atomic=False, log_path=False, seed=6, count=15)
    _judge(saved, os.path.join(work, "m.weights.json"), res.log, str(tmp_path))
    restore_dir(work, res.log)
    assert snapshot(work) == original and snapshot(os.path.join(src, "m.weights.json")) == before


def evaluate(path: str) -> tuple[Any, float]:
    """A campaign evaluator: the model's outputs on fixed inputs after ``load_weights(path)``, and their mean."""
    x = np.linspace(-1, 1, 2 * 36, dtype="f4").reshape(2, 6, 6, 1)
    y = np.asarray(_loaded(path)(x)).astype("f8")
    return y, float(np.mean(y))


def test_a_checkpoint_campaign_on_the_index_restores_every_shard(saved: dict[str, Any], tmp_path: Any) -> None:
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    src = os.path.join(_set(str(tmp_path), saved), "m.weights.json")
    c = Campaign.from_dict({
        "name": "ks", "seed": 1, "mode": "checkpoint", "target": {"checkpoint": src},
        "paths": [os.path.dirname(os.path.abspath(__file__))], "cells": {"bits": ["sign"], "group_by": "tensor"},
        "select": {"include": ["/layers/dense/*"]}, "trials": {"per_cell": 2},
        "evaluator": {"function": "test_keras_sharded:evaluate"}}, base_dir=str(tmp_path))
    cells, hashes = campaign_cells(c, with_hashes=True)
    assert len(hashes) == 1 and len(cells) == 2  # the kernel (shard 1) and the bias (shard 2)
    runner = TrialRunner(c, cells)
    copy = runner.targets[None]
    assert copy.endswith("m.weights.json") and os.path.isfile(copy)
    original = snapshot(os.path.dirname(copy))
    rows = [runner.run(cid, t) for cid in range(len(cells)) for t in range(2)]
    assert snapshot(os.path.dirname(copy)) == original
    assert all(r.message is None for r in rows) and any(r.outcome != 0 for r in rows), rows
    runner.close()
