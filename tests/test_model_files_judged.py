"""The files researchers inject into, judged by the framework that wrote them.

Real architectures built from tiny configs (no downloads): GPT-2 (lm_head tied to wte), BERT and ViT saved by
``save_pretrained`` (safetensors; GPT-2 in shards, in float32 and bfloat16, and in ``pytorch_model-*.bin`` shards
as transformers 4 wrote them), a transformers ResNet and a GPT-2 ``torch.save(model.state_dict())`` in float32 and
bfloat16, and a torchao int8 weight-only ``state_dict`` (its ``Int8Tensor`` weights read as torch.load's
``__tensor_flatten__`` gives them). Each is injected through the real CLI (a new file or
directory with whole-file evidence, a new file with region evidence, in place, in place with ``--direct``) and
judged only by the framework's reading: ``from_pretrained`` and ``safetensors`` for a directory,
``torch.load(weights_only=True)`` for a ``.pt`` or ``.bin``. Exactly the logged sites change, from their logged
old word to their logged new word (:func:`framework_judge.judge`); tied weights change together as the framework
shows them; ``fastflip revert`` gives back the original bytes.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import assert_refused, require, snapshot
from fastflip.cli import main
from fastflip.files.log import InjectionLog
from framework_judge import assert_judged, copy_reading
from format_builders import copy_checkpoint
from framework_views import dir_view, state_dict_view, torch_view
from hf_helpers import build, model_class, save_sharded

pytestmark = pytest.mark.framework

_OPTS = ["--seed", "5", "--count", "6", "-q"]


def _distinct(model, dtype):
    """``model`` in ``dtype`` with every floating tensor drawn afresh, so that no two untied tensors hold the same
    words (LayerNorm's ones and zeros otherwise do) and a file tensor names its live tensor by content."""
    torch = require("torch")
    torch.manual_seed(1)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn_like(t) * 0.05)
    return model.to(dtype)


def _hf_dir(name, dtype, sharded, d):
    torch = require("torch")
    require("transformers")
    model = _distinct(build(name), getattr(torch, dtype))
    if sharded:
        assert len(save_sharded(model, d, sharded)) >= 2
    else:
        model.save_pretrained(d)
    return d


def _torch_file(name, dtype, path):
    torch = require("torch")
    transformers = require("transformers")
    if name == "resnet":
        torch.manual_seed(0)
        model = transformers.ResNetForImageClassification(transformers.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            num_labels=4)).eval()
    else:
        model = build(name)
    torch.save(_distinct(model, getattr(torch, dtype)).state_dict(), path)
    return path


# id: (model, dtype, sharded) for save_pretrained directories; (model, dtype) for torch.save files
DIRS = {"gpt2-sharded": ("gpt2", "float32", "safetensors"), "gpt2-bf16-sharded": ("gpt2", "bfloat16", "safetensors"),
        "gpt2-bin-sharded": ("gpt2", "float32", "bin"),
        "bert": ("bert", "float32", False), "vit": ("vit", "float32", False)}
FILES = {"resnet": ("resnet", "float32"), "resnet-bf16": ("resnet", "bfloat16"), "gpt2-tied": ("gpt2", "float32"),
         "gpt2-tied-bf16": ("gpt2", "bfloat16")}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The saved models, built once per module on first use: {id: path}."""
    root = tmp_path_factory.mktemp("models")
    cache = {}

    def get(key):
        if key not in cache:
            if key in DIRS:
                cache[key] = _hf_dir(*DIRS[key], str(root / key))
            else:
                cache[key] = _torch_file(*FILES[key], str(root / f"{key}.pt"))
        return cache[key]

    return get


def _load(name, d):
    """``from_pretrained``'s state_dict of ``d`` as a reading in live names (tied tensors share memory)."""
    model = model_class(name).from_pretrained(d, dtype="auto").eval()
    if name == "gpt2":
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return state_dict_view(model.state_dict())


def _live_names(name, d, files):
    """{live name: reading name} for the model in ``d``: each live tensor named by the file tensor of ``files``
    (``d``'s safetensors reading) holding its words; a live tensor no file tensor names alone (lm_head, tied to
    wte) keeps its live name after ``=``. transformers renames some keys on load (ViT), hence by content."""
    live = _load(name, d)
    by_words, names = {}, {}
    for fname, a in files.items():
        by_words.setdefault((a.shape, a.dtype.str, a.tobytes()), []).append(fname)
    for key in sorted(live, key=lambda k: (k not in files, k)):  # a live name equal to a file name claims it first
        a = live[key]
        hits = [f for f in by_words.get((a.shape, a.dtype.str, a.tobytes()), []) if f not in names.values()]
        names[key] = key if key in hits else (hits[0] if len(hits) == 1 else "=" + key)
    missing = set(files) - set(names.values())
    assert not missing, f"file tensors from_pretrained does not load: {sorted(missing)[:6]}"
    return names


def _pretrained_view(name, d, names):
    """``from_pretrained``'s reading of ``d``, named by :func:`_live_names` of the original."""
    return {names[k]: a for k, a in _load(name, d).items()}


def _revert_and_check(log_path, target, original):
    """``fastflip revert`` gives back ``original``'s bytes (so every framework reads it as it read ``original``)."""
    assert main(["revert", log_path, target, "-q"]) == 0
    assert snapshot(target) == snapshot(original)


@pytest.mark.parametrize("key", sorted(DIRS))
def test_save_pretrained_directory_new_copy_judged_by_from_pretrained(key, made, tmp_path, capsys):
    """A new directory: safetensors and from_pretrained read exactly the logged changes (lm_head with wte where
    the model ties them); regions evidence is refused in one line; revert restores the bytes. (``--direct`` of a
    directory: test_framework_differential.test_direct_refusal_is_one_line_in_a_process.)"""
    name = DIRS[key][0]
    src = made(key)
    original = snapshot(src)
    files = dir_view(src)
    names = _live_names(name, src, files)
    out = str(tmp_path / "out")
    wte = ["--include", "*wte*"] if name == "gpt2" else []  # reach the tied tensor on every GPT-2 run
    for extra in ([], wte) if wte else ([],):
        shutil.rmtree(out, ignore_errors=True)
        assert main(["inject", src, "-o", out, *extra, *_OPTS, "--force"]) == 0
        log = InjectionLog.load(out + ".fflog")
        assert_judged(copy_reading(files), dir_view(out), log)
        expect = _pretrained_view(name, src, names)
        assert_judged(expect, _pretrained_view(name, out, names), log)
        if extra:
            hit = {r["tensor"] for r in log.records()}
            assert hit == {"/transformer.wte.weight"} and "=/lm_head.weight" in expect
        assert snapshot(src) == original
        _revert_and_check(out + ".fflog", out, src)
    work = copy_checkpoint(src, tmp_path / "work")
    before = snapshot(tmp_path)
    capsys.readouterr()
    rc = main(["inject", work, "-o", str(tmp_path / "r"), "--evidence", "regions", *_OPTS])
    err = assert_refused(capsys, rc, tmp_path, before)
    assert "drop --evidence regions" in err, err  # the library's line may name the API option after the fix


@pytest.mark.parametrize("key", ["gpt2-sharded", "gpt2-bin-sharded", "vit"])
def test_save_pretrained_directory_in_place_judged_by_from_pretrained(key, made, tmp_path):
    """In place (through copies): the directory reads as logged, and revert gives back every file's bytes."""
    name = DIRS[key][0]
    src = made(key)
    files = dir_view(src)
    names = _live_names(name, src, files)
    work = copy_checkpoint(src, tmp_path / "work")
    assert main(["inject", work, "--in-place", *_OPTS]) == 0
    log = InjectionLog.load(work + ".fflog")
    assert_judged(copy_reading(files), dir_view(work), log)
    assert_judged(_pretrained_view(name, src, names), _pretrained_view(name, work, names), log)
    _revert_and_check(work + ".fflog", work, src)


@pytest.mark.parametrize("key", sorted(FILES))
@pytest.mark.parametrize("mode", ["copy", "regions", "direct"])
def test_torch_save_state_dict_judged_by_torch_load(key, mode, made, tmp_path):
    """A state_dict file: torch.load(weights_only=True) reads exactly the logged changes (GPT-2's lm_head with wte:
    one storage), in every mode; revert restores the bytes."""
    src = made(key)
    before = snapshot(src)
    if mode == "direct":
        out = copy_checkpoint(src, tmp_path / "work.pt")
        args = [out, "--in-place", "--direct"]
    else:
        out = str(tmp_path / "out.pt")
        args = [src, "-o", out] + (["--evidence", "regions"] if mode == "regions" else [])
    wte = ["--include", "*wte*"] if key.startswith("gpt2") else []
    assert main(["inject", *args, *wte, *_OPTS]) == 0
    log = InjectionLog.load(out + ".fflog")
    assert log.manifest.get("evidence") == (None if mode == "copy" else "regions")  # None: whole-file hashes
    expect = torch_view(src)
    if wte:
        assert np.shares_memory(expect["/lm_head.weight"], expect["/transformer.wte.weight"])
    assert_judged(expect, torch_view(out), log)
    assert snapshot(src) == before
    _revert_and_check(out + ".fflog", out, src)


@pytest.mark.parametrize("mode", ["copy", "regions", "in-place", "direct"])
def test_torchao_int8_state_dict_judged_by_torch_load(mode, tmp_path):
    """torchao's int8 weight-only state_dict (Int8Tensor weights): torch.load(weights_only=True), then each
    subclass's __tensor_flatten__, reads exactly the logged words in qdata, scale and zero_point, in every mode;
    revert restores the bytes."""
    torch = require("torch")
    ao = require("torchao.quantization")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    ao.quantize_(m, ao.Int8WeightOnlyConfig())
    src = str(tmp_path / "ao.pt")
    torch.save(m.state_dict(), src)
    loaded = torch.load(src, weights_only=True)
    assert type(loaded["0.weight"]).__name__ == "Int8Tensor" and loaded["0.weight"].qdata.dtype == torch.int8
    before = snapshot(src)
    if mode in ("in-place", "direct"):
        out = copy_checkpoint(src, tmp_path / "work.pt")
        args = [out, "--in-place"] + (["--direct"] if mode == "direct" else [])
    else:
        out = str(tmp_path / "out.pt")
        args = [src, "-o", out] + (["--evidence", "regions"] if mode == "regions" else [])
    assert main(["inject", *args, "--seed", "5", "--count", "24", "-q"]) == 0
    log = InjectionLog.load(out + ".fflog")
    hit = {r["tensor"].rpartition(".")[2] for r in log.records()}
    assert "qdata" in hit and hit <= {"qdata", "scale", "zero_point", "bias"}, hit
    assert_judged(torch_view(src), torch_view(out), log)
    assert snapshot(src) == before  # the in-place modes worked on a copy
    _revert_and_check(out + ".fflog", out, src)
