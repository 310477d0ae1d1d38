"""Hugging Face checkpoint directories that ``from_pretrained`` reads, edited: fastflip agrees element by element with
the model transformers loads, or refuses in one line (tests/attack_check.py).

A tiny GPT-2 (built from its config) is saved once in shards; each case copies the directory and edits its index or
shards. The judge is ``from_pretrained``'s ``state_dict()``, restricted to the tensors the weight files hold (a tied
``lm_head.weight`` is not saved).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from attack_check import verdict
from conftest import require
from format_builders import copy_checkpoint

pytestmark = pytest.mark.framework


def _saved_names(d: str) -> set[str]:
    torch = require("torch")
    from safetensors import safe_open

    names: set[str] = set()
    for f in os.listdir(d):
        p = os.path.join(d, f)
        if f.endswith(".safetensors"):
            with safe_open(p, "np") as s:
                names |= set(s.keys())
        elif f.endswith(".bin"):
            names |= set(torch.load(p, weights_only=True))
    return names


def _view(path: str) -> dict[str, np.ndarray]:
    """``from_pretrained``'s reading of a checkpoint directory (of an index file: of its directory)."""
    import hf_helpers
    from framework_views import state_dict_view

    d = path if os.path.isdir(path) else os.path.dirname(path)
    model = hf_helpers.model_class("gpt2").from_pretrained(d)
    keep = _saved_names(d)
    return {k: v for k, v in state_dict_view(model.state_dict()).items() if k.lstrip("/") in keep}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):  # type: ignore[no-untyped-def]
    """{"safetensors": dir, "bin": dir}: the same tiny GPT-2 saved in 7 shards each way."""
    require("transformers")
    import hf_helpers

    model = hf_helpers.build("gpt2")
    out = {}
    for fmt in ("safetensors", "bin"):
        d = str(tmp_path_factory.mktemp("hf") / fmt)
        hf_helpers.save_sharded(model, d, fmt=fmt, max_shard_size="20KB")
        out[fmt] = d
    return out


def _index(d: str) -> tuple[str, dict]:
    name = next(f for f in os.listdir(d) if f.endswith(".index.json"))
    with open(os.path.join(d, name)) as fh:
        return os.path.join(d, name), json.load(fh)


def _write_index(path: str, index: dict) -> None:
    with open(path, "w") as fh:
        json.dump(index, fh)


def _shards(index: dict) -> list[str]:
    return sorted(set(index["weight_map"].values()))


def _missing_shard(d: str, bins: str) -> None:
    p, ix = _index(d)
    ix["weight_map"][next(iter(ix["weight_map"]))] = "model-nope.safetensors"
    _write_index(p, ix)


def _unlisted_tensor(d: str, bins: str) -> None:
    p, ix = _index(d)
    del ix["weight_map"][next(iter(ix["weight_map"]))]
    _write_index(p, ix)


def _tensor_in_two_shards(d: str, bins: str) -> None:
    from safetensors.numpy import load_file, save_file

    p, ix = _index(d)
    first, second = (os.path.join(d, s) for s in _shards(ix)[:2])
    t0, t1 = load_file(first), load_file(second)
    key = next(iter(t0))
    t1[key] = t0[key]
    save_file(t1, second, metadata={"format": "pt"})


def _shard_in_subfolder(d: str, bins: str) -> None:
    p, ix = _index(d)
    shard = _shards(ix)[0]
    os.makedirs(os.path.join(d, "sub"))
    shutil.move(os.path.join(d, shard), os.path.join(d, "sub", shard))
    ix["weight_map"] = {k: ("sub/" + v if v == shard else v) for k, v in ix["weight_map"].items()}
    _write_index(p, ix)


def _as_bin(d: str, shards: list[str]) -> dict[str, str]:
    """``shards`` of ``d`` rewritten as torch.save files of the same tensors; {old name: new name}."""
    torch = require("torch")
    from safetensors.numpy import load_file

    renamed = {}
    for shard in shards:
        tensors = load_file(os.path.join(d, shard))
        os.unlink(os.path.join(d, shard))
        renamed[shard] = shard.replace(".safetensors", ".bin")
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, os.path.join(d, renamed[shard]))
    return renamed


def _index_lists_bin_shards(d: str, bins: str, every: bool = True) -> None:
    p, ix = _index(d)
    shards = _shards(ix)
    renamed = _as_bin(d, shards if every else shards[:1])
    ix["weight_map"] = {k: renamed.get(v, v) for k, v in ix["weight_map"].items()}
    _write_index(p, ix)


def _both_kinds_present(d: str, bins: str) -> None:
    for f in os.listdir(bins):
        if f.startswith("pytorch_model"):
            shutil.copy(os.path.join(bins, f), d)


def _shard_without_metadata(d: str, bins: str) -> None:
    from safetensors.numpy import load_file, save_file

    _, ix = _index(d)
    shard = os.path.join(d, _shards(ix)[0])
    save_file(load_file(shard), shard)


CASES = {  # case -> (edit of a copy of the safetensors directory, expected verdict)
    "as saved": (lambda d, bins: None, "agrees"),
    "a shard without __metadata__": (_shard_without_metadata, "agrees"),
    "a safetensors index listing .bin shards only": (_index_lists_bin_shards, "agrees"),
    "safetensors and .bin indexes side by side (transformers takes safetensors)": (_both_kinds_present, "agrees"),
    "the index names a missing shard": (_missing_shard, "refused"),
    "a shard holds a tensor the index does not name": (_unlisted_tensor, "refused"),
    "a tensor in two shards": (_tensor_in_two_shards, "refused"),
    "a shard in a sub-folder": (_shard_in_subfolder, "refused"),
    "one .bin shard among safetensors shards": (lambda d, bins: _index_lists_bin_shards(d, bins, every=False),
                                                "refused"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checkpoint_directories(case, saved, tmp_path):
    edit, expected = CASES[case]
    d = copy_checkpoint(saved["safetensors"], tmp_path / "ckpt")
    edit(d, saved["bin"])
    assert verdict(d, _view, str(tmp_path / "w"), expect=expected)


def test_bin_shards_and_the_index_file_itself_agree(saved, tmp_path):
    d = copy_checkpoint(saved["bin"], tmp_path / "bin")
    assert verdict(d, _view, str(tmp_path / "w1"), expect="agrees")
    assert verdict(_index(d)[0], _view, str(tmp_path / "w2"), expect="agrees")
