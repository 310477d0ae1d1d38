"""Tied tensors: one tensor under several names; any name's layer selects it, live and in files, and the
primary name is the same live and in the saved state_dict (the first in ``state_dict()`` order)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import require
from hf_helpers import build, save_sharded, words
from fastflip import Sampling, Selection
from fastflip.core.records import Tensor
from fastflip.errors import SelectionError
from fastflip.files.layout import read_layout
from fastflip.files.select import select


def test_a_layer_glob_matches_through_any_alias():
    t = Tensor("/transformer.wte.weight", ("/lm_head.weight", "/transformer.wte.weight"), np.dtype("<f4"), (4, 2), 8,
               "contiguous", 0, framework="torch", layer="transformer.wte", role="weight")
    other = Tensor("/h.0.w", ("/h.0.w",), np.dtype("<f4"), (2,), 2, "contiguous", 0, framework="torch", layer="h.0")
    for layers in (["lm_head"], ["transformer.wte"], ["lm_*"]):
        assert [x.path for x in select([t, other], Selection(layers=layers))] == ["/transformer.wte.weight"]
    with pytest.raises(SelectionError):
        select([t, other], Selection(layers=["lm_head.weight"]))


@pytest.fixture(scope="module")
def gpt2():
    require("torch")
    require("transformers")
    return build("gpt2")


@pytest.mark.framework
def test_live_lm_head_selects_the_tied_matrix(gpt2):
    from fastflip.live.api import injected, plan_for, select_live, targets

    tg = targets(gpt2)
    (rec,) = select_live(tg, Selection(layers=["lm_head"]))
    assert rec.path == "transformer.wte.weight" == next(iter(gpt2.state_dict()))
    before = words(gpt2.lm_head.weight).copy()
    plan = plan_for(tg, seed=1, sampling=Sampling(count=5, bits="sign"), selection=Selection(layers=["lm_head"]))
    with injected(tg, plan):
        assert (words(gpt2.lm_head.weight) != before).sum() == 5
        assert np.array_equal(words(gpt2.lm_head.weight), words(gpt2.transformer.wte.weight))
    assert np.array_equal(words(gpt2.lm_head.weight), before)


@pytest.mark.framework
def test_files_primary_name_is_the_live_one_and_any_alias_selects_it(gpt2, tmp_path):
    import torch

    pt = str(tmp_path / "g.pt")
    torch.save(gpt2.state_dict(), pt)  # both keys, one storage
    (t,) = [t for t in read_layout(pt).tensors if "/lm_head.weight" in t.aliases]
    assert t.path == "/transformer.wte.weight" and t.layer == "transformer.wte"
    for layer in ("transformer.wte", "lm_head"):
        assert [x.path for x in select(read_layout(pt).tensors, Selection(layers=[layer]))] == [t.path]
    out = str(tmp_path / "o.pt")
    r = subprocess.run([sys.executable, "-m", "fastflip", "inject", pt, "-o", out, "--layer", "transformer.wte",
                        "--count", "4", "--bits", "sign", "--seed", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sd = torch.load(out, weights_only=True)
    assert (words(sd["lm_head.weight"]) != words(gpt2.lm_head.weight)).sum() == 4
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()
    # save_pretrained keeps one of the tied names: the live one
    d = str(tmp_path / "hf")
    save_sharded(gpt2, d)
    names = [x.path for x in read_layout(d).tensors]
    assert "/transformer.wte.weight" in names and "/lm_head.weight" not in names
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
