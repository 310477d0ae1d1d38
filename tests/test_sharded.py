"""Hugging Face checkpoint directories (index + shards, or one weight file) as one model: inspect, inject,
replay, revert, diff; checked against transformers' own loader and the safetensors / torch readers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import require
from hf_helpers import build, check_loaded, model_class, same_tree, save_sharded, words
from fastflip import Sampling, Selection
from fastflip.errors import FastflipError, LogMismatchError, OutputError
from fastflip.files.formats import FormatError
from fastflip.files.formats.hfdir import read_sharded_layout
from fastflip.files.log import InjectionLog
from fastflip.files.sharded import inject_dir, replay_dir, revert_dir
from fastflip.files.sharecopy import share_copy

CASES = [("gpt2", "safetensors"), ("gpt2", "bin"), ("bert", "safetensors"), ("vit", "safetensors"), ("vit", "bin")]


class _Saved(dict):
    """{(model, format): (model, directory)}, each saved in >= 3 shards on first use, kept for the module."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def __missing__(self, case):
        name, fmt = case
        model = build(name)
        d = str(self.base / f"{name}-{fmt}")
        shards = save_sharded(model, d, fmt)
        assert len(shards) >= 3, shards
        self[case] = (model, d)
        return self[case]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    require("torch")
    require("transformers")
    return _Saved(tmp_path_factory.mktemp("hf"))


def _shard_words(path: str, key: str) -> np.ndarray:
    """A tensor's words as the framework's own reader for the shard reads them."""
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(path)[key].reshape(-1).view(np.uint32)
    import torch

    return words(torch.load(path, weights_only=True)[key])


def _sha(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.framework
@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{f}" for m, f in CASES])
def test_inject_changes_exactly_the_logged_bits_and_revert_restores_every_shard(saved, tmp_path, case):
    model, src = saved[case]
    out = str(tmp_path / "out")
    res = inject_dir(src, out, seed=5, sampling=Sampling(count=40, bits="0-31"))
    log = InjectionLog.load(res.log_path)
    assert res.counts["flips"] == 40 and res.counts["bits_changed"] == 40 and res.log_path == out + ".fflog"
    # one log for the whole model: each tensor's shard, each touched shard's hashes
    shard_of = {t["name"]: t["shard"] for t in log.manifest["tensors"]}
    touched = log.manifest["checkpoint_dir"]["shards"]
    assert len(touched) >= 2 and set(shard_of.values()) == set(touched)
    for name, rec in touched.items():
        assert rec["input_sha256"] == _sha(os.path.join(src, name))
        assert rec["output_sha256"] == _sha(os.path.join(out, name))
    # read back by the shard's own reader: the logged new words at the logged sites
    for r in log.records():
        got = _shard_words(os.path.join(out, shard_of[r["tensor"]]), r["tensor"].lstrip("/"))
        assert int(got[r["index"]]) == r["new_word"]
    # read back by from_pretrained: the state_dict differs from the original exactly at the logged sites
    check_loaded(model.state_dict(), model_class(case[0]).from_pretrained(out).state_dict(), log)
    # every other file carried over byte for byte, as a real file of its own (never a link)
    for f in os.listdir(src):
        if f not in touched:
            assert open(os.path.join(src, f), "rb").read() == open(os.path.join(out, f), "rb").read()
        assert not os.path.islink(os.path.join(out, f))
        assert not os.path.samefile(os.path.join(src, f), os.path.join(out, f))
    assert not same_tree(src, out)
    r = revert_dir(res.log_path, out)
    assert r.sites == len(log) and same_tree(src, out)


def _injected_copy(saved, case, tmp_path, seed):
    """(original directory, a copy injected in place with 30 flips, the result)."""
    _, src = saved[case]
    d = str(tmp_path / "m")
    shutil.copytree(src, d)
    return src, d, inject_dir(d, in_place=True, seed=seed, sampling=Sampling(count=30))


@pytest.mark.framework
def test_in_place_inject_and_revert_of_a_directory(saved, tmp_path):
    src, d, res = _injected_copy(saved, ("gpt2", "bin"), tmp_path, 2)
    assert res.log_path == d + ".fflog" and not same_tree(src, d)
    assert not [f for f in os.listdir(d) if ".fastflip-" in f]  # no temporaries left
    import torch  # the .bin shards still load (their zip CRCs follow the words)

    for f in os.listdir(d):
        if f.endswith(".bin"):
            torch.load(os.path.join(d, f), weights_only=True)
    res2 = inject_dir(d, in_place=True, seed=3, sampling=Sampling(count=5))
    assert res2.log_path == d + ".2.fflog"  # the log of the first injection is kept
    revert_dir(res2.log_path, d)
    revert_dir(res.log_path, d)
    assert same_tree(src, d)


@pytest.mark.framework
def test_revert_after_a_partial_in_place_commit(saved, tmp_path):
    """A kill between the shard renames leaves some shards new, some old: revert restores the new ones."""
    src, d, res = _injected_copy(saved, ("gpt2", "safetensors"), tmp_path, 9)
    touched = sorted(res.log.manifest["checkpoint_dir"]["shards"])
    shutil.copyfile(os.path.join(src, touched[0]), os.path.join(d, touched[0]))  # as if never renamed
    first = res.log.manifest["checkpoint_dir"]["shards"][touched[0]]["sites"]
    assert revert_dir(res.log_path, d).sites == len(res.log) - first
    assert same_tree(src, d)
    assert revert_dir(res.log_path, d).sites == 0  # the original already: nothing to restore
    with open(os.path.join(d, touched[-1]), "r+b") as fh:  # a shard that is neither logged state
        fh.seek(-1, 2)
        fh.write(b"\x01")
    with pytest.raises(LogMismatchError, match="not the shard this log describes"):
        revert_dir(res.log_path, d)


@pytest.mark.framework
def test_sites_are_drawn_across_shards_as_for_one_file(saved, tmp_path):
    """One SiteSpace over the whole model: the same seed draws the same sites sharded or in one file."""
    model, src = saved[("bert", "safetensors")]
    single = str(tmp_path / "single")
    assert save_sharded(model, single, max_shard_size="10GB") == ["model.safetensors"]
    a = inject_dir(src, str(tmp_path / "a"), seed=11, sampling=Sampling(count=50), log_path=False)
    b = inject_dir(single, str(tmp_path / "b"), seed=11, sampling=Sampling(count=50), log_path=False)
    assert [(r["tensor"], r["index"], r["new_word"]) for r in a.log.records()] == \
           [(r["tensor"], r["index"], r["new_word"]) for r in b.log.records()]


@pytest.mark.framework
def test_replay_gives_the_logged_directory(saved, tmp_path):
    _, src = saved[("vit", "bin")]
    res = inject_dir(src, str(tmp_path / "a"), seed=4, sampling=Sampling(count=12), selection=Selection(roles=["weight"]))
    again = replay_dir(res.log_path, src, str(tmp_path / "b"))
    assert same_tree(res.output, again.output)
    with pytest.raises(LogMismatchError):  # the altered directory is not the logged input
        replay_dir(res.log_path, res.output, str(tmp_path / "c"))
    assert not os.path.exists(tmp_path / "c")


@pytest.mark.framework
@pytest.mark.slow
def test_cli_inspect_inject_diff_revert_on_a_directory_and_its_index(saved, tmp_path):
    _, src = saved[("gpt2", "safetensors")]
    run = lambda *a: subprocess.run([sys.executable, "-m", "fastflip", *a], capture_output=True, text=True)  # noqa: E731
    index = os.path.join(src, "model.safetensors.index.json")
    with open(index) as fh:
        names = set(json.load(fh)["weight_map"])
    r = run("inspect", src, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {t["path"].lstrip("/") for t in d["tensors"]} == names and all(t["shard"] for t in d["tensors"])
    out = str(tmp_path / "out")
    r = run("inject", index, "-o", out, "--count", "7", "--seed", "1", "--layer", "transformer.h.*")
    assert r.returncode == 0, r.stderr
    r = run("inject", src, "-o", out, "--count", "7")
    assert r.returncode == 2 and "--force" in r.stderr and "Traceback" not in r.stderr
    r = run("diff", src, out, "--json")
    assert r.returncode == 1 and sum(t["n_diff"] for t in json.loads(r.stdout)["tensors"]) == 7
    r = run("revert", out + ".fflog", out)
    assert r.returncode == 0, r.stderr
    assert same_tree(src, out)
    assert run("diff", src, out).returncode == 0
    r = run("inspect", str(tmp_path))
    assert r.returncode == 2 and "without a Hugging Face index" in r.stderr


def _write_st(path: str, tensors: dict) -> None:
    head, blob = {}, b""
    for k, v in tensors.items():
        v = np.asarray(v, "<f4")
        head[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [len(blob), len(blob) + v.nbytes]}
        blob += v.tobytes()
    h = json.dumps(head).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + blob)


@pytest.mark.parametrize("weight_map, shards, match", [
    ({"a": "../x.safetensors"}, {}, "not a file name in the checkpoint directory"),
    ({"a": "s1.safetensors", "b": "s2.safetensors"}, {"s1.safetensors": ["a"]}, "missing"),
    ({"a": "s1.safetensors"}, {"s1.safetensors": ["a", "b"]}, "holds 'b', which the index does not list"),
    ({"a": "s1.safetensors", "b": "s1.safetensors"}, {"s1.safetensors": ["a"]}, "lacks 'b'"),
    ({"a": "s1.safetensors", "b": "s2.safetensors"}, {"s1.safetensors": ["a"], "s2.safetensors": ["a", "b"]},
     "holds 'a', which the index does not list there"),
])
def test_an_index_that_disagrees_with_its_shards_is_refused(tmp_path, weight_map, shards, match):
    for name, keys in shards.items():
        _write_st(str(tmp_path / name), {k: [1.0, 2.0] for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(FormatError, match=match):
        read_sharded_layout(str(tmp_path))


def test_output_is_never_a_link_to_the_input(tmp_path):
    """An injection into the output never writes through to the input (no hard or symbolic links)."""
    src = tmp_path / "src"
    src.mkdir()
    _write_st(str(src / "model.safetensors"), {"a": np.arange(64), "b": np.ones(8)})
    (src / "config.json").write_text("{}")
    res = inject_dir(str(src), str(tmp_path / "out"), seed=1, sampling=Sampling(count=1), selection={"include": ["a"]})
    before = {f: open(src / f, "rb").read() for f in os.listdir(src)}
    for f in os.listdir(res.output):
        st = os.lstat(os.path.join(res.output, f))
        assert st.st_nlink == 1 and not os.path.islink(os.path.join(res.output, f))
    inject_dir(res.output, in_place=True, seed=2, sampling=Sampling(count=20))  # touches b too, in place
    assert {f: open(src / f, "rb").read() for f in os.listdir(src)} == before
    a = str(tmp_path / "x")
    assert share_copy(str(src / "config.json"), a) in ("reflink", "copy")
    with open(a, "w") as fh:
        fh.write("changed")
    assert (src / "config.json").read_text() == "{}"


def test_outputs_and_logs_are_checked(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write_st(str(src / "model.safetensors"), {"a": np.arange(8)})
    smp = Sampling(count=1)
    with pytest.raises(OutputError, match="inside"):
        inject_dir(str(src), str(src / "sub"), sampling=smp)
    with pytest.raises(FastflipError, match="in-place"):
        inject_dir(str(src), None, sampling=smp)
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputError, match="--force"):
        inject_dir(str(src), str(tmp_path / "out"), sampling=smp, overwrite=False)
    res = inject_dir(str(src), str(tmp_path / "out"), sampling=smp, overwrite=True)
    assert os.listdir(res.output) == ["model.safetensors"]
    res = inject_dir(str(src), str(tmp_path / "out"), sampling=smp, overwrite=True)  # a checkpoint: replaced
    assert os.listdir(res.output) == ["model.safetensors"]
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a checkpoint directory"):  # --force never removes another folder
        inject_dir(str(src), str(tmp_path / "folder"), sampling=smp, overwrite=True)
    assert (tmp_path / "folder" / "notes.txt").read_text() == "mine"
    assert not [f for f in os.listdir(tmp_path) if ".fastflip-" in f]
    with pytest.raises(OutputError, match="inside the output"):
        inject_dir(str(src), str(tmp_path / "o2"), sampling=smp, log_path=str(tmp_path / "o2" / "x.fflog"))
    assert not os.path.exists(tmp_path / "o2")


@pytest.mark.framework
def test_convert_a_directory_into_one_file(saved, tmp_path):
    import torch

    model, src = saved[("gpt2", "safetensors")]
    from fastflip.frameworks.convert import convert

    out = str(tmp_path / "m.pt")
    assert convert(src, out) == "torch"
    sd = torch.load(out, weights_only=True)
    names = [t.path.lstrip("/") for t in read_sharded_layout(src).tensors]
    assert sorted(sd) == sorted(names)
    for k in names:
        assert np.array_equal(words(sd[k]), words(model.state_dict()[k])), k


@pytest.mark.framework
@pytest.mark.slow
def test_the_sharded_checkpoint_example_runs(tmp_path):
    require("transformers")
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "sharded_checkpoint.py")
    r = subprocess.run([sys.executable, example, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "in 7 shards" in r.stdout and "20 bits changed" in r.stdout and "reverted: every file" in r.stdout


@pytest.mark.framework
@pytest.mark.slow
def test_a_checkpoint_campaign_on_a_directory_restores_every_shard(saved, tmp_path):
    from fastflip.campaign.config import Campaign
    from fastflip.campaign.sweep import campaign_cells
    from fastflip.campaign.trials import TrialRunner

    _, src = saved[("gpt2", "bin")]
    here = os.path.dirname(os.path.abspath(__file__))
    c = Campaign.from_dict({
        "name": "hf", "seed": 1, "mode": "checkpoint", "target": {"checkpoint": src}, "paths": [here],
        "cells": {"bits": ["30"], "group_by": "tensor"}, "select": {"include": ["transformer.wte.weight", "*.c_fc.*"]},
        "trials": {"per_cell": 3}, "evaluator": {"function": "hf_helpers:evaluate_gpt2_dir"}}, base_dir=str(tmp_path))
    cells, hashes = campaign_cells(c, with_hashes=True)
    assert len(hashes) == 1 and len(cells) >= 2
    runner = TrialRunner(c, cells)
    copy = runner.targets[None]
    assert os.path.isdir(copy) and same_tree(src, copy)
    rows = [runner.run(cid, t) for cid in range(len(cells)) for t in range(3)]
    assert same_tree(src, copy)  # every trial restored every shard it touched (zip CRCs of .bin shards too)
    assert any(r.outcome != 0 for r in rows) and all(r.message is None or "Error" not in r.message for r in rows)
    runner.close()
    assert not os.path.exists(copy)


def test_the_single_file_api_points_to_the_directory_one(tmp_path):
    import fastflip

    src = tmp_path / "src"
    src.mkdir()
    _write_st(str(src / "model.safetensors"), {"a": np.arange(8)})
    with pytest.raises(FastflipError, match="inject_dir"):
        fastflip.inject_file(str(src), str(tmp_path / "o"), sampling=Sampling(count=1))
    res = fastflip.inject_dir(str(src), str(tmp_path / "out"), seed=1, sampling=Sampling(count=1))
    with pytest.raises(FastflipError, match="revert_dir"):
        fastflip.revert(res.log_path, os.path.join(res.output, "model.safetensors"))
    assert fastflip.revert_dir(res.log_path, res.output).sites == 1


def test_in_place_replaces_a_linked_shard_and_leaves_its_blob(tmp_path):
    """A Hugging Face cache snapshot links its shards to blobs: in place, the link becomes the altered file."""
    blob = tmp_path / "blob"
    _write_st(str(blob), {"a": np.arange(16)})
    before = blob.read_bytes()
    snap = tmp_path / "snapshot"
    snap.mkdir()
    os.symlink(blob, snap / "model.safetensors")
    res = inject_dir(str(snap), in_place=True, seed=1, sampling=Sampling(count=3))
    assert blob.read_bytes() == before and not os.path.islink(snap / "model.safetensors")
    assert (snap / "model.safetensors").read_bytes() != before
    revert_dir(res.log_path, str(snap))
    assert (snap / "model.safetensors").read_bytes() == before
