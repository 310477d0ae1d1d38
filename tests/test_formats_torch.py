"""torch.save zip files: read by a restricted pickle reader, injected on the raw path, checked by torch itself."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import numpy as np
import pytest

from conftest import assert_refused, require, snapshot
from fastflip.cli import main
from fastflip.errors import InputFileError
from fastflip.files.filebytes import sha256_file
from fastflip.files.formats import FormatError, UnsafeInputError, detect_format
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout
from format_contract import check_format
from framework_views import big_endian_archive

pytestmark = pytest.mark.framework


def _words(t):  # a torch tensor's stored words as numpy, whatever the dtype
    torch = require("torch")
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _flat(obj, prefix=""):
    torch = require("torch")
    out = {}
    if hasattr(obj, "__tensor_flatten__"):  # a tensor subclass (torchao): its inner tensors, <key>.<name>
        for name in obj.__tensor_flatten__()[0]:
            out.update(_flat(getattr(obj, name), f"{prefix}.{name}" if prefix else f"/{name}"))
    elif isinstance(obj, torch.Tensor):
        out[prefix] = _words(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}/{i}"))
    return out


def torch_load(path):
    torch = require("torch")
    return _flat(torch.load(path, weights_only=True))


def _model():
    torch = require("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.block = Block()
            self.head = nn.Linear(4, 10)
            self.head.weight = self.emb.weight  # tied

        def forward(self, x):
            return self.head(self.block(x).mean((2, 3)))

    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(4, 3, 6, 6)).sum().backward()
        opt.step()
    return m, opt


def test_checkpoint_roles_layers_aliases(tmp_path):
    torch = require("torch")
    m, opt = _model()
    p = str(tmp_path / "ck.bin")  # the name says nothing: detected by content
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, p)
    assert detect_format(p) == "torch"
    lay = read_layout(p)
    by = {t.path: t for t in lay.tensors}
    assert by["/model/emb.weight"].aliases == ("/model/emb.weight", "/model/head.weight")
    assert "/model/head.weight" not in by
    assert (by["/model/block.bn.running_var"].role, by["/model/block.bn.running_var"].layer) == ("bn-statistic", "block.bn")
    assert by["/model/block.bn.num_batches_tracked"].role == "step-counter"
    assert by["/model/block.bn.num_batches_tracked"].dtype == np.dtype("<i8")
    assert (by["/model/block.conv.weight"].role, by["/model/block.conv.weight"].layer) == ("weight", "block.conv")
    # Adam state: the parameter order of param_groups gives each moment its layer (tied weight listed once)
    assert by["/optimizer/state/0/exp_avg"].layer == "emb"
    assert by["/optimizer/state/1/exp_avg_sq"].layer == "block.conv"
    assert by["/optimizer/state/5/exp_avg"].layer == "head"
    assert by["/optimizer/state/0/step"].role == "step-counter"
    assert lay.skipped == []
    check_format(p, torch_load, str(tmp_path), fmt="torch")


def test_mixed_dtypes_and_views(tmp_path):
    torch = require("torch")
    base = torch.arange(12, dtype=torch.float32)
    sd = {
        "w16": torch.randn(5, 3).half(), "wbf": torch.randn(4, 4).to(torch.bfloat16),
        "f8": torch.randn(6).to(torch.float8_e4m3fn), "f8b": torch.randn(6).to(torch.float8_e5m2),
        "d": torch.randn(3, dtype=torch.float64), "i": torch.arange(5, dtype=torch.int32),
        "u": torch.arange(7, dtype=torch.uint8), "b": torch.tensor([True, False, True]),
        "base": base, "slice": base[4:8], "t": torch.randn(3, 4).t(), "scalar": torch.tensor(2.5),
    }
    p = str(tmp_path / "m.pt")
    torch.save(sd, p)
    lay = read_layout(p)
    by = {t.path: t for t in lay.tensors}
    assert by["/wbf"].dtype == np.dtype("<u2") and by["/f8"].dtype == np.dtype("u1")
    skipped = {s.path: s.reason for s in lay.skipped}
    assert "view inside /base" in skipped["/slice"]
    assert "non-contiguous" in skipped["/t"]

    def load(path):
        d = torch_load(path)
        d.pop("/t")
        return d

    check_format(p, load, str(tmp_path), fmt="torch", count=40, models=["flip", "stuck-at-1", "zero", "random-value"])


def test_big_endian_byteorder_entry(tmp_path):
    torch = require("torch")
    p = str(tmp_path / "le.pt")
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, p)
    # rewrite the archive with byteorder 'big' and big-endian bytes: the reader must honour the entry
    q = str(tmp_path / "be.pt")
    big_endian_archive(p, q)
    t = read_layout(q).tensors[0]
    assert t.dtype == np.dtype(">f4")
    with open(q, "rb") as fh:
        fh.seek(t.offset)
        assert np.frombuffer(fh.read(16), ">f4").tolist() == [0.0, 1.0, 2.0, 3.0]


def _torch_like_zip(path, payload: bytes, extra: dict | None = None):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        for k, v in (extra or {}).items():
            z.writestr(f"archive/data/{k}", v)


class _Touch:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_never_runs(tmp_path):
    torch = require("torch")
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"w": _Touch(marker)}, protocol=2)
    # the payload really would run: plain pickle creates the marker
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()
    p = str(tmp_path / "evil.pt")
    _torch_like_zip(p, payload)
    out = tmp_path / "out.pt"
    for call in (lambda: read_layout(p), lambda: inject_file(p, str(out), seed=1, count=1)):
        with pytest.raises(UnsafeInputError, match="posix.system|os.system"):
            call()
    assert main(["inject", p, "-o", str(out), "--seed", "1"]) == 2
    assert main(["inspect", p]) == 2
    assert not marker.exists() and not out.exists()
    assert not [x for x in os.listdir(tmp_path) if "fastflip-tmp" in x or x.endswith(".fflog")]
    # a whole pickled module (not a state_dict) is refused, not run
    q = str(tmp_path / "module.pt")
    torch.save(torch.nn.Linear(2, 2), q)
    with pytest.raises(UnsafeInputError, match="torch.nn.modules.linear.Linear"):
        read_layout(q)


def test_bad_archives(tmp_path, capsys):
    torch = require("torch")
    p = str(tmp_path / "ok.pt")
    torch.save({"w": torch.ones(256)}, p)
    data = open(p, "rb").read()
    # truncated: the central directory is gone
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError) as ei:
        read_layout(str(cut))
    assert "\n" not in str(ei.value)
    assert main(["inject", str(cut), "-o", str(tmp_path / "o.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not (tmp_path / "o.pt").exists()
    # a tensor record whose storage offset points past its storage entry
    class Storage:  # pickles as the persistent id torch writes
        pass

    buf = io.BytesIO()

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", torch.FloatStorage, "0", "cpu", 4)
            return None

    class Rebuild:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (Storage(), 100, (4,), (1,), False, {}))

    P(buf, protocol=2).dump({"w": Rebuild()})
    bad = str(tmp_path / "outside.pt")
    _torch_like_zip(bad, buf.getvalue(), {"0": np.ones(4, "<f4").tobytes()})
    with pytest.raises(FormatError, match="outside"):
        read_layout(bad)
    # the same record with an offset inside the storage is read fine (the crafted pickle is sound)
    buf2 = io.BytesIO()

    class Rebuild2:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (Storage(), 1, (3,), (1,), False, {}))

    P(buf2, protocol=2).dump({"w": Rebuild2()})
    good = str(tmp_path / "inside.pt")
    _torch_like_zip(good, buf2.getvalue(), {"0": np.arange(4, dtype="<f4").tobytes()})
    t = read_layout(good).tensors[0]
    assert torch.load(good, weights_only=True)["w"].tolist() == [1.0, 2.0, 3.0]
    assert t.shape == (3,) and open(good, "rb").read()[t.offset:t.offset + 4] == np.float32(1).tobytes()


def test_legacy_format_read_without_running_code(tmp_path, capsys):
    """The pre-1.6 non-zip format: pickles read by the restricted reader, storages located by their counts;
    the same contract (exact bits read back by torch.load, revert, replay), roles, aliases and bf16 included."""
    torch = require("torch")
    m, opt = _model()
    sd = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
          "extra": {"bf": torch.randn(5, 3).to(torch.bfloat16), "h": torch.randn(7).half(), "i8": torch.arange(9)}}
    p = str(tmp_path / "old.pt")
    torch.save(sd, p, _use_new_zipfile_serialization=False)
    assert detect_format(p) == "torch-legacy"
    lay = read_layout(p)
    by = {t.path: t for t in lay.tensors}
    assert lay.format == "torch-legacy" and lay.framework == "torch"
    assert by["/model/emb.weight"].aliases == ("/model/emb.weight", "/model/head.weight")
    assert by["/model/block.bn.running_var"].role == "bn-statistic"
    assert by["/extra/bf"].format == "bfloat16" and by["/extra/bf"].dtype == np.dtype("<u2")
    check_format(p, torch_load, str(tmp_path), fmt="torch-legacy", count=40)
    # fastflip convert turns it into the zip format, every bit unchanged
    z = str(tmp_path / "new.pt")
    assert main(["convert", p, "-o", z, "--to", "torch"]) == 0
    assert detect_format(z) == "torch"
    a, b = torch_load(p), torch_load(z)
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    # the same file truncated inside its storages, and with a pickle that would run code: one line, nothing written
    data = open(p, "rb").read()
    bad = tmp_path / "bad"
    bad.mkdir()
    cut = bad / "cut.pt"
    cut.write_bytes(data[: len(data) - 100])
    _refused_in_one_line(bad, capsys, [str(cut)], "past the end of the file")
    evil = bad / "evil.pt"
    with open(evil, "wb") as fh:
        for head in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
            pickle.dump(head, fh, protocol=2)
        pickle.dump({"w": Evil()}, fh, protocol=2)
    _refused_in_one_line(bad, capsys, [str(evil)], ".system, which fastflip does not run")


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cli_inspect_and_inject(tmp_path, capsys):
    torch = require("torch")
    m, opt = _model()
    p = str(tmp_path / "ck.pth")
    torch.save(m.state_dict(), p)
    assert main(["inspect", p]) == 0
    out = capsys.readouterr().out
    assert "/emb.weight" in out and "framework torch" in out
    o = str(tmp_path / "o.pth")
    assert main(["inject", p, "-o", o, "--seed", "4", "--count", "10", "--role", "weight"]) == 0
    back = torch.load(o, weights_only=True)
    diff = sum(int((back[k] != v).sum()) for k, v in m.state_dict().items() if v.dtype.is_floating_point)
    assert 0 < diff <= 20  # emb/head are tied: a flip there shows under both keys
    assert sha256_file(p) != sha256_file(o)


@pytest.mark.parametrize("keep", [0.02, 0.2, 0.5, 0.8, 0.97, 0.999])
def test_truncated_anywhere_is_one_line(tmp_path, keep):
    torch = require("torch")
    from fastflip.errors import FastflipError

    p = str(tmp_path / "ok.pt")
    torch.save({"a": torch.ones(1000), "b": torch.arange(50)}, p)
    data = open(p, "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(FastflipError) as ei:
        inject_file(str(cut), str(tmp_path / "o.pt"), seed=1, count=3)
    assert "\n" not in str(ei.value) and not (tmp_path / "o.pt").exists()


def test_cli_replay_revert_diff(tmp_path, capsys):
    torch = require("torch")
    m, opt = _model()
    p = str(tmp_path / "ck.pt")
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, p)
    before = sha256_file(p)
    o = str(tmp_path / "o.pt")
    assert main(["inject", p, "-o", o, "--seed", "9", "--count", "25", "--role", "optimizer"]) == 0
    assert main(["replay", o + ".fflog", p, "-o", str(tmp_path / "r.pt")]) == 0
    assert sha256_file(str(tmp_path / "r.pt")) == sha256_file(o)
    assert main(["diff", p, o]) == 1
    out = capsys.readouterr().out
    assert "/optimizer/state/" in out
    assert main(["revert", o + ".fflog", o]) == 0
    assert sha256_file(o) == before


def _refused_in_one_line(tmp_path, capsys, args, msg):
    before = snapshot(tmp_path)
    err = assert_refused(capsys, main(["inject", *args, "-o", str(tmp_path / "refused.out")]), tmp_path, before)
    assert msg in err, err


def test_refusals_in_one_line_nothing_written(tmp_path, capsys):
    """The issue's bad inputs for torch.save files, through the CLI: one line, no output, no temporary left."""
    torch = require("torch")
    # a view that shares its storage with a listed tensor is never a second tensor: selecting it is refused
    base = torch.arange(12, dtype=torch.float32)
    p = str(tmp_path / "views.pt")
    torch.save({"base": base, "slice": base[4:8]}, p)
    _refused_in_one_line(tmp_path, capsys, [p, "--include", "/slice"], "view inside /base")
    # a directory record whose local-header offset points outside the file
    p = str(tmp_path / "ok.pt")
    torch.save({"w": torch.ones(64)}, p)
    data = bytearray(open(p, "rb").read())
    k = data.find(b"PK\x01\x02")
    while k >= 0:
        data[k + 42:k + 46] = (len(data) + 1000).to_bytes(4, "little")
        k = data.find(b"PK\x01\x02", k + 4)
    bad = tmp_path / "offsets.pt"
    bad.write_bytes(bytes(data))
    _refused_in_one_line(tmp_path, capsys, [str(bad)], "offsets.pt")
    # a pickle that asks for anything but tensor rebuilds
    p = str(tmp_path / "module.pt")
    torch.save(torch.nn.Linear(2, 2), p)
    _refused_in_one_line(tmp_path, capsys, [p], "torch.nn.modules.linear.Linear")
