"""torchao-quantized state_dicts saved with ``torch.save``, read as ``torch.load(weights_only=True)`` reads them.

Each model is quantized by torchao's own ``quantize_`` on CPU (``nn.Linear`` layers, and a 2-layer GPT-2 built from
its config: no downloads). The framework is the judge: ``torch.load(weights_only=True)``, then
``__tensor_flatten__()`` of each subclass gives the inner tensors (``/<key>.<name>``,
:func:`framework_views.torch_view`).
fastflip's listing must name exactly those tensors, with their dtypes, shapes and stored bytes at the listed offsets;
an injection must change exactly the logged words (:func:`framework_judge.judge`); the loaded model must compute with
them; revert must give back the original bytes.
"""

from __future__ import annotations

import collections
import functools
import io
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import require
from fastflip.cli import main
from fastflip.errors import FormatError, UnsafeInputError
from fastflip.files.layout import read_layout
from fastflip.files.log import InjectionLog
from framework_judge import assert_judged, compare_readings, copy_reading
from framework_views import torch_view

pytestmark = pytest.mark.framework

_OPTS = ["--seed", "5", "--count", "6", "-q"]

# id: (torchao config, its keyword arguments, model dtype, the subclass quantize_ makes)
CONFIGS = {
    "int8-weight-only": ("Int8WeightOnlyConfig", {}, "float32", "Int8Tensor"),
    "int8-dynamic": ("Int8DynamicActivationInt8WeightConfig", {}, "float32", "Int8Tensor"),
    "int8-weight-only-bf16": ("Int8WeightOnlyConfig", {}, "bfloat16", "Int8Tensor"),
    "intx-int4": ("IntxWeightOnlyConfig", {"weight_dtype": "int4"}, "float32", "IntxUnpackedToInt8Tensor"),
    "intx-int4-dynamic": ("Int8DynamicActivationIntxWeightConfig", {"weight_dtype": "int4"}, "float32",
                          "IntxUnpackedToInt8Tensor"),
    "float8-weight-only": ("Float8WeightOnlyConfig", {}, "bfloat16", "Float8Tensor"),
    "gpt2-int8": ("Int8WeightOnlyConfig", {}, "float32", "Int8Tensor"),
}


def _quantized(key, seed=0):
    """A model quantized by ``CONFIGS[key]``, with ``seed`` for its float weights."""
    torch = require("torch")
    ao = require("torchao.quantization")
    name, kw, dtype, _ = CONFIGS[key]
    torch.manual_seed(seed)
    if key.startswith("gpt2"):
        transformers = require("transformers")
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).eval()
    else:
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = model.to(getattr(torch, dtype))
    kw = {k: getattr(torch, v) for k, v in kw.items()}
    ao.quantize_(model, getattr(ao, name)(**kw))
    return model


def _input(key):
    torch = require("torch")
    gen = torch.Generator().manual_seed(3)
    if key.startswith("gpt2"):
        return torch.randint(0, 64, (2, 8), generator=gen)
    return torch.randn(4, 64, generator=gen).to(getattr(torch, CONFIGS[key][2]))


def _forward(model, x):
    torch = require("torch")
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``torch.save(model.state_dict())`` of each quantized model, made once on first use: {id: path}."""
    root = tmp_path_factory.mktemp("torchao")
    torch = require("torch")

    @functools.cache
    def get(key):
        state = _quantized(key).state_dict()
        assert any(type(v).__name__ == CONFIGS[key][3] for v in state.values())  # torchao made its subclass
        torch.save(state, root / f"{key}.pt")
        return str(root / f"{key}.pt")

    return get


def _bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_listing_is_what_torch_load_flattens(key, saved):
    """fastflip lists exactly the tensors torch.load + __tensor_flatten__ give (plain ones too), each with the
    framework's dtype width, shape and stored bytes at the listed offset; qdata is role weight, scale scale,
    zero_point zero, all in the module's layer."""
    path = saved(key)
    reading = torch_view(path)
    layout = read_layout(path)
    assert {t.path for t in layout.tensors} == set(reading) and not layout.skipped
    inner = [t for t in layout.tensors if t.path.rpartition(".")[2] in ("qdata", "scale", "zero_point")]
    assert inner and all(t.path.rsplit(".", 2)[-2] == "weight" for t in inner)
    data = _bytes(path)
    for t in layout.tensors:
        want = np.ascontiguousarray(reading[t.path])
        assert t.shape == want.shape and t.dtype.itemsize == want.dtype.itemsize, t.path
        assert data[t.offset:t.offset + t.nbytes] == want.astype(want.dtype.newbyteorder("<")).tobytes(), t.path
    roles = {t.path.rpartition(".")[2]: t.role for t in inner}
    assert roles.pop("qdata") == "weight" and roles.pop("scale") == "scale"
    assert roles in ({}, {"zero_point": "zero"})
    layers = {t.layer for t in inner}
    assert layers == ({"lm_head"} if key.startswith("gpt2") else {"0", "2"})
    qdata = next(t for t in inner if t.path.endswith(".qdata"))
    assert qdata.format == ("float8_e4m3fn" if key.startswith("float8") else None)
    assert qdata.dtype.str == ("|u1" if key.startswith("float8") else "|i1")


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_inject_judged_by_torch_load_and_reverted(key, saved, tmp_path):
    """A new file, then the same file changed in place with --direct: torch.load(weights_only=True) reads exactly
    the logged words in the subclasses' inner tensors, nothing else; revert gives back the bytes."""
    src = saved(key)
    before = _bytes(src)
    out = str(tmp_path / "out.pt")
    assert main(["inject", src, "-o", out, "--role", "weight", "--include", "*.qdata", *_OPTS]) == 0
    log = InjectionLog.load(out + ".fflog")
    assert {r["tensor"].rpartition(".")[2] for r in log.records()} == {"qdata"}
    assert_judged(torch_view(src), torch_view(out), log)
    assert _bytes(src) == before
    work = str(tmp_path / "work.pt")
    shutil.copyfile(src, work)
    assert main(["inject", work, "--in-place", "--direct", "--role", "scale", *_OPTS]) == 0
    log = InjectionLog.load(work + ".fflog")
    assert {r["tensor"].rpartition(".")[2] for r in log.records()} == {"scale"}
    assert_judged(torch_view(src), torch_view(work), log)
    for changed, log_path in ((out, out + ".fflog"), (work, work + ".fflog")):
        assert main(["revert", log_path, changed, "-q"]) == 0
        assert _bytes(changed) == before


@pytest.mark.parametrize("key", ["int8-weight-only", "int8-dynamic", "intx-int4", "float8-weight-only", "gpt2-int8"])
def test_loaded_model_computes_with_the_flipped_word(key, saved, tmp_path):
    """A high bit of one qdata word flipped in the file: the model of the same config loaded from it
    (load_state_dict(assign=True)) computes exactly what the clean model computes with that word set by hand,
    which differs from the clean output; revert gives back the original bytes."""
    torch = require("torch")
    src = saved(key)
    out = str(tmp_path / "out.pt")
    bits = "6" if key.startswith("float8") else "7"  # float8_e4m3fn bit 6: the exponent's top bit
    assert main(["inject", src, "-o", out, "--include", "*.qdata", "--bits", bits, "--seed", "2", "--count", "1",
                 "-q"]) == 0
    (rec,) = InjectionLog.load(out + ".fflog").records()
    clean, faulty = _quantized(key, seed=9), _quantized(key, seed=9)
    clean.load_state_dict(torch.load(src, weights_only=True), assign=True)
    faulty.load_state_dict(torch.load(out, weights_only=True), assign=True)
    x = _input(key)
    want_clean = _forward(clean, x)
    got = _forward(faulty, x)
    assert not torch.equal(got, want_clean)
    key_path, _, inner = rec["tensor"].lstrip("/").rpartition(".")
    words = getattr(clean.state_dict()[key_path], inner).view(-1).view(torch.uint8)
    assert int(words[rec["index"]]) == rec["old_word"]
    words[rec["index"]] = rec["new_word"]  # by hand, in memory
    assert torch.equal(_forward(clean, x), got)
    assert main(["revert", out + ".fflog", out, "-q"]) == 0
    assert _bytes(out) == _bytes(src)


def test_replay_and_diff_see_the_logged_words(saved, tmp_path):
    """replay rebuilds the output bit for bit; diff compares the inner tensors by name and counts the logged
    changes."""
    src = saved("int8-dynamic")
    out, again = str(tmp_path / "out.pt"), str(tmp_path / "again.pt")
    assert main(["inject", src, "-o", out, "--role", "weight", "--bits", "6-7", *_OPTS]) == 0
    assert main(["replay", out + ".fflog", src, "-o", again, "-q"]) == 0
    assert _bytes(again) == _bytes(out)
    log = InjectionLog.load(out + ".fflog")
    r = subprocess.run([sys.executable, "-m", "fastflip", "diff", "--json", src, out], capture_output=True,
                       text=True)
    assert r.returncode == 1, r.stderr
    import json

    got = {t["path"]: t["n_diff"] for t in json.loads(r.stdout)["tensors"] if t["n_diff"]}
    want: dict[str, int] = {}
    for rec in log.records():
        want[rec["tensor"]] = want.get(rec["tensor"], 0) + 1
    assert got == want and all(p.endswith(".qdata") for p in got)


def _with_pickle(src, dst, edit):
    """``src`` with its data.pkl replaced by ``edit(data.pkl)`` (the other entries as they are)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, edit(data) if info.filename.endswith("/data.pkl") else data)
    return dst


@pytest.mark.parametrize("cls", [b"torchao.quantization\nInt4Tensor", b"mypackage.tensors\nMy8Tensor"])
def test_other_subclass_refused_in_one_line_naming_it(cls, saved, tmp_path):
    """A tensor subclass fastflip does not read (another torchao class, a user's class) is refused in one line
    naming the class and the fix, with nothing written."""
    src = saved("int8-weight-only")
    bad = _with_pickle(src, str(tmp_path / "bad.pt"),
                       lambda d: d.replace(b"torchao.quantization\nInt8Tensor", cls))
    before = _bytes(bad)
    r = subprocess.run([sys.executable, "-m", "fastflip", "inject", bad, "-o", str(tmp_path / "o.pt"), *_OPTS],
                       capture_output=True, text=True)
    name = cls.decode().replace("\n", ".")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"tensor subclass {name}" in r.stderr and "fastflip.live" in r.stderr, r.stderr
    assert _bytes(bad) == before and sorted(os.listdir(tmp_path)) == ["bad.pt"]


def test_other_torchao_subclass_after_a_read_one_refused_by_name(tmp_path):
    """An NF4Tensor saved after an Int8Tensor (its wrapper rebuild then comes from the pickle's memo, not named
    before the class): still refused in one line naming it."""
    torch = require("torch")
    require("torchao.quantization")
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    sd = _quantized("int8-weight-only").state_dict()
    sd["nf4.weight"] = to_nf4(torch.randn(64, 64), 64, 64)
    path = str(tmp_path / "mixed.pt")
    torch.save(sd, path)
    assert type(torch.load(path, weights_only=True)["nf4.weight"]).__name__ == "NF4Tensor"
    with pytest.raises(UnsafeInputError, match=r"tensor subclass torchao\..*\.NF4Tensor, .*fastflip\.live"):
        read_layout(path)


def test_tensor_the_class_does_not_flatten_is_refused(tmp_path):
    """An Int8Tensor carrying an extra tensor attribute: torch.load sets it, __tensor_flatten__ does not return it;
    fastflip refuses the file (naming the class and the attribute) instead of listing a tensor the subclass
    does not use."""
    torch = require("torch")
    model = _quantized("int8-weight-only")
    sd = model.state_dict()
    sd["0.weight"].extra = torch.zeros(3)
    path = str(tmp_path / "extra.pt")
    torch.save(sd, path)
    loaded = torch.load(path, weights_only=True)["0.weight"]
    assert torch.equal(loaded.extra, torch.zeros(3)) and "extra" not in loaded.__tensor_flatten__()[0]
    with pytest.raises(FormatError, match=r"torchao\.quantization\.Int8Tensor record holds tensor 'extra'"):
        read_layout(path)


def test_without_torchao_refused_as_the_framework_refuses(saved, monkeypatch):
    """Where torchao is not installed, torch.load(weights_only=True) refuses the class (torchao registers it as
    safe when imported): fastflip refuses the file too, in one line that says to install torchao."""
    from fastflip.files.formats import torchsub

    monkeypatch.setattr(torchsub, "_torchao_installed", lambda: False)
    with pytest.raises(UnsafeInputError, match=r"torchao\.quantization\.Int8Tensor.*install torchao"):
        read_layout(saved("int8-weight-only"))


def test_read_classes_are_the_frameworks_safe_globals():
    """Every class the reader accepts is one torch.load(weights_only=True) accepts once torchao is imported
    (torch.serialization.get_safe_globals), a torchao base tensor whose __setstate__ sets the state verbatim, and
    whose data tensor names are the reader's."""
    torch = require("torch")
    require("torchao.quantization")
    require("torchao.prototype.mx_formats")  # registers its subclasses on import
    from torchao.utils import TorchAOBaseTensor, _torchao_base_tensor__setstate__

    from fastflip.files.formats.torchsub import ATTRIBUTE_CLASSES, OTHER_SUBCLASSES, READ_CLASSES

    safe = {f"{g.__module__}.{g.__qualname__}": g for g in torch.serialization.get_safe_globals()
            if isinstance(g, type)}
    accepted = set(READ_CLASSES) | ATTRIBUTE_CLASSES
    assert accepted <= set(safe), sorted(accepted - set(safe))
    subclasses = {name for name, g in safe.items() if issubclass(g, torch.Tensor)}  # as registered so far
    assert subclasses <= set(READ_CLASSES) | OTHER_SUBCLASSES, subclasses - set(READ_CLASSES) - OTHER_SUBCLASSES
    for name, (required, optional) in READ_CLASSES.items():
        cls = safe[name]
        # torch.load calls __setstate__: torchao's sets each state entry with setattr (torch._utils._set_obj_state)
        assert issubclass(cls, TorchAOBaseTensor) and cls.__setstate__ is _torchao_base_tensor__setstate__
        assert tuple(cls.tensor_data_names) == required
        assert tuple(getattr(cls, "optional_tensor_data_names", ())) == optional


def test_quantized_checkpoint_dict_nested_names(tmp_path):
    """A checkpoint dict holding the quantized state_dict: inner tensors are named under its key
    (/model/0.weight.qdata), and the framework's reading agrees word for word after an injection."""
    torch = require("torch")
    model = _quantized("int8-weight-only")
    path = str(tmp_path / "ckpt.pt")
    torch.save({"model": model.state_dict(), "step": 3}, path)
    assert "/model/0.weight.qdata" in {t.path for t in read_layout(path).tensors}
    out = str(tmp_path / "out.pt")
    assert main(["inject", path, "-o", out, "--evidence", "regions", *_OPTS]) == 0
    assert_judged(copy_reading(torch_view(path)), torch_view(out), InjectionLog.load(out + ".fflog"))
    assert main(["revert", out + ".fflog", out, "-q"]) == 0
    assert not compare_readings(torch_view(path), torch_view(out))


def test_legacy_format_file_judged_by_torch_load(tmp_path):
    """The legacy (non-zip) torch.save format holds the same subclass records: listed and judged the same way."""
    torch = require("torch")
    path = str(tmp_path / "legacy.pt")
    torch.save(_quantized("int8-dynamic").state_dict(), path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path)
    assert {t.path for t in read_layout(path).tensors} == set(torch_view(path))
    out = str(tmp_path / "out.pt")
    assert main(["inject", path, "-o", out, "--role", "weight", *_OPTS]) == 0
    assert_judged(torch_view(path), torch_view(out), InjectionLog.load(out + ".fflog"))


def test_optional_activation_tensors_listed_with_their_roles(tmp_path):
    """An Int8Tensor's optional tensors (act_pre_scale, as smoothing flows set it) are flattened by the framework
    once set: fastflip lists them too, act_pre_scale with role scale."""
    torch = require("torch")
    sd = _quantized("int8-weight-only").state_dict()
    sd["0.weight"].act_pre_scale = torch.linspace(0.5, 1.5, 64)
    path = str(tmp_path / "smooth.pt")
    torch.save(sd, path)
    assert "act_pre_scale" in torch.load(path, weights_only=True)["0.weight"].__tensor_flatten__()[0]
    by = {t.path: t for t in read_layout(path).tensors}
    assert set(by) == set(torch_view(path))
    assert (by["/0.weight.act_pre_scale"].role, by["/0.weight.act_pre_scale"].layer) == ("scale", "0")


def _no_scale(sd, torch):
    del sd["0.weight"].__dict__["scale"]


def _tensor_in_attribute(sd, torch):
    sd["0.weight"].block_size = [1, torch.zeros(2)]


def _name_taken(sd, torch):
    sd["0.weight.qdata"] = torch.zeros(2)


@pytest.mark.parametrize("change, match", [
    (_no_scale, r"Int8Tensor record lacks its tensor 'scale'"),
    (_tensor_in_attribute, r"Int8Tensor record holds list in attribute 'block_size'.*fastflip\.live"),
    (_name_taken, r"two different tensors are saved under the key path '/0\.weight\.qdata'"),
])
def test_state_fastflip_cannot_mirror_is_refused(change, match, tmp_path):
    """A state torch.load still reads but whose inner tensors fastflip could not name as __tensor_flatten__ does
    (a required tensor missing, a tensor inside a non-tensor attribute, an inner name taken by another key) is
    refused in one line, never listed wrongly."""
    torch = require("torch")
    sd = _quantized("int8-weight-only").state_dict()
    change(sd, torch)
    path = str(tmp_path / "odd.pt")
    torch.save(sd, path)
    torch.load(path, weights_only=True)  # the framework reads it
    with pytest.raises(FormatError, match=match):
        read_layout(path)


def test_non_strided_wrapper_refused(saved, tmp_path):
    """A wrapper of another layout than torch.strided is refused, not read as a strided one."""
    bad = _with_pickle(saved("int8-weight-only"), str(tmp_path / "bad.pt"),
                       lambda d: d.replace(b"torch.strided", b"torch._mkldnn"))
    with pytest.raises(FormatError, match=r"Int8Tensor record with layout"):
        read_layout(bad)


def test_one_subclass_under_two_keys_is_one_tensor_with_aliases(tmp_path):
    """One quantized weight saved under two keys (the pickle's memo): its inner tensors are listed once with both
    names as aliases, and the framework, whose two keys are one object, reads the change through both."""
    torch = require("torch")
    sd = _quantized("int8-weight-only").state_dict()
    sd["tied.weight"] = sd["0.weight"]
    path = str(tmp_path / "tied.pt")
    torch.save(sd, path)
    by = {t.path: t for t in read_layout(path).tensors}
    assert by["/0.weight.qdata"].aliases == ("/0.weight.qdata", "/tied.weight.qdata") and "/tied.weight.qdata" not in by
    out = str(tmp_path / "out.pt")
    assert main(["inject", path, "-o", out, "--include", "*0.weight.qdata", *_OPTS]) == 0
    expect = torch_view(path)
    assert np.shares_memory(expect["/0.weight.qdata"], expect["/tied.weight.qdata"])
    assert_judged(expect, torch_view(out), InjectionLog.load(out + ".fflog"))


def test_self_referencing_attribute_read_once(saved, tmp_path):
    """A non-tensor attribute (block_size) made a list holding itself 1,000 times: fastflip looks for hidden tensors
    in each container once, so it lists the same tensors as for the original file instead of walking 1000**k paths."""
    import re

    src = saved("int8-weight-only")

    def itself(m):  # EMPTY_LIST, BINPUT i, MARK, then BINGET i 1000 times, APPENDS
        return b"]q" + m[1] + b"(" + (b"h" + m[1]) * 1000 + b"e"

    bad = _with_pickle(src, str(tmp_path / "self.pt"), lambda d: re.sub(rb"\]q(.)\(K\x01K@e", itself, d, count=1))
    assert _bytes(bad) != _bytes(src)
    assert [t.path for t in read_layout(bad).tensors] == [t.path for t in read_layout(src).tensors]


class _Inert:
    """Whatever the pickle builds, for :func:`_storage_types` (which only wants the persistent ids)."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


def _storage_types(pkl):
    """{storage key: storage class name} of a torch.save pickle we wrote ourselves (stdlib unpickler, nothing run)."""
    import pickle

    types = {}

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            return name if name.endswith("Storage") else _Inert

        def persistent_load(self, pid):
            types[pid[2]] = pid[1]

    Reader(io.BytesIO(pkl)).load()
    return types


def test_big_endian_archive_judged_by_torch_load(saved, tmp_path):
    """The archive as a big-endian machine writes it (byteorder 'big', each storage's words swapped at its own
    width: int8 qdata as is, float32 scales and biases swapped): scales are listed as '>f4', and torch.load, which
    swaps them back, reads exactly the logged changes."""
    src = saved("int8-dynamic")
    big = str(tmp_path / "big.pt")
    widths = {"FloatStorage": 4, "CharStorage": 1}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(big, "w") as zout:
        pkl = next(n for n in zin.namelist() if n.endswith("/data.pkl"))
        types = _storage_types(zin.read(pkl))
        assert set(types.values()) == set(widths)
        for info in zin.infolist():
            data = zin.read(info)
            head, _, key = info.filename.rpartition("/")
            if key == "byteorder":
                data = b"big"
            elif head.endswith("/data") and key in types:
                w = widths[types[key]]
                data = np.frombuffer(data, f"<u{w}").astype(f">u{w}").tobytes()
            zout.writestr(info, data)
    by = {t.path: t for t in read_layout(big).tensors}
    assert by["/0.weight.scale"].dtype.str == ">f4" and by["/0.weight.qdata"].dtype.str == "|i1"
    assert not compare_readings(torch_view(src), torch_view(big))
    out = str(tmp_path / "out.pt")
    assert main(["inject", big, "-o", out, "--role", "scale", *_OPTS]) == 0  # float32 words, swapped in the file
    assert_judged(torch_view(big), torch_view(out), InjectionLog.load(out + ".fflog"))


def test_mutated_files_read_as_torch_load_reads_them_or_refused(tmp_path):
    """The fuzz differential's mutations (1-3 bytes, mostly in the zip structure and the pickle) of a torchao file:
    fastflip refuses each in one FastflipError, or injects and torch.load + __tensor_flatten__ of the input and
    output see exactly the logged words changed, and revert gives the mutated bytes back."""
    import test_fuzz_differential as fuzz

    torch = require("torch")
    ao = require("torchao.quantization")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    ao.quantize_(model, ao.Int8DynamicActivationInt8WeightConfig())
    base = str(tmp_path / "small.pt")
    torch.save(model.state_dict(), base)
    raw, regions = _bytes(base), fuzz._zip_structure(base)
    work = str(tmp_path / "work")
    os.makedirs(work)
    tally = fuzz.Tally()
    for seed in range(1, 61):  # 4,000 seeds ran clean when this was written
        mutated = os.path.join(work, "in.pt")
        with open(mutated, "wb") as fh:
            fh.write(fuzz._mutate(raw, regions, np.random.default_rng(seed)))
        fuzz._case("torch", mutated, torch_view, work, seed, tally)
    assert not tally.failures, tally.failures[:10]
    assert tally.refused and tally.injected > tally.framework_refuses  # both answers reached, mostly judged
