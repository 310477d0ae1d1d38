"""fastflip convert: HDF5 (torch layout) ↔ torch.save ↔ safetensors, every tensor's bits unchanged."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest

from conftest import require
from fastflip.cli import main
from fastflip.frameworks.convert import convert, load_any
from fastflip.files.formats import UnsafeInputError, detect_format
from fastflip.files.layout import read_layout

pytestmark = pytest.mark.framework


def _same_bits(a, b, path=""):
    torch = require("torch")
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.reshape(-1).contiguous().view(torch.uint8).equal(b.reshape(-1).contiguous().view(torch.uint8)), path
    elif isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            _same_bits(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b) and all(_same_bits(x, y, path) is None for x, y in zip(a, b))
    else:
        assert a == b, path


def _checkpoint():
    torch = require("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3)
            self.bn = nn.BatchNorm2d(3)
            self.fc = nn.Linear(3, 4)

        def forward(self, x):
            return self.fc(self.bn(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 2, 5, 5)).sum().backward()
    opt.step()
    extra = {"bf": torch.randn(3, 3).to(torch.bfloat16), "f8": torch.randn(4).to(torch.float8_e5m2)}
    return m, opt, {"model": m.state_dict(), "optimizer": opt.state_dict(), "extra": extra, "epoch": 7}


def test_round_trip_all_formats(tmp_path):
    torch = require("torch")
    require("safetensors")
    m, opt, state = _checkpoint()
    p = str(tmp_path / "a.pt")
    torch.save(state, p)
    chain = [("b.safetensors", "safetensors"), ("c.h5", "hdf5"), ("d.pth", "torch"), ("e.h5", "hdf5"),
             ("f.safetensors", "safetensors"), ("g.pt", "torch")]
    prev = p
    for name, fmt in chain:
        out = str(tmp_path / name)
        assert convert(prev, out) == fmt and detect_format(out) == fmt
        read_layout(out)  # fastflip can inject into every result
        prev = out
    back = torch.load(prev, weights_only=True)
    # param_groups' tuples come back as lists through JSON: compare values, then tensors bit for bit
    assert back["optimizer"]["param_groups"][0]["betas"] == list(state["optimizer"]["param_groups"][0]["betas"])
    back["optimizer"]["param_groups"] = state["optimizer"]["param_groups"]
    _same_bits(state, back)
    m2 = type(m)()
    m2.load_state_dict(back["model"])
    opt2 = torch.optim.Adam(m2.parameters())
    opt2.load_state_dict(back["optimizer"])
    assert set(opt2.state_dict()["state"]) == set(state["optimizer"]["state"])  # int keys kept


def test_plain_safetensors_and_cli(tmp_path, capsys):
    torch = require("torch")
    st = require("safetensors.torch")
    sd = {"a.weight": torch.randn(3, 2), "a.bias": torch.randn(3).half()}
    p = str(tmp_path / "w.safetensors")
    st.save_file(sd, p)
    assert main(["convert", p, "-o", str(tmp_path / "w.out"), "--to", "torch"]) == 0
    _same_bits(sd, torch.load(str(tmp_path / "w.out"), weights_only=True))
    assert main(["convert", p, "-o", str(tmp_path / "w.xyz")]) == 2
    assert "--to" in capsys.readouterr().err


@pytest.mark.extra("torch")
def test_convert_refuses_code(tmp_path, capsys):
    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    p = str(tmp_path / "evil.pt")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": Touch()}, protocol=2))
        z.writestr("archive/version", "3\n")
    with pytest.raises(UnsafeInputError):
        load_any(p)
    assert main(["convert", p, "-o", str(tmp_path / "out.safetensors")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out.safetensors").exists()


def test_convert_an_hdf5_file_fastflip_did_not_write_keeps_every_dataset(tmp_path, capsys):
    """A weights file another tool wrote (Keras's layout: groups with plain string attributes, datasets under
    vars/) converts to safetensors with every dataset bit for bit; its string attributes are not JSON and used to
    end in an internal error."""
    import h5py
    import numpy as np

    st = require("safetensors.numpy")
    p, out = str(tmp_path / "m.weights.h5"), str(tmp_path / "m.safetensors")
    rng = np.random.default_rng(0)
    want = {"layers/dense/vars/0": rng.standard_normal((4, 3)).astype("<f4"),
            "layers/dense/vars/1": rng.standard_normal(3).astype("<f4")}
    with h5py.File(p, "w") as f:
        for k, v in want.items():
            f[k] = v
        f["layers/dense"].attrs["name"] = "dense"
        f.attrs["keras_version"] = "3.15.1"
    assert main(["convert", p, "-o", out]) == 0, capsys.readouterr().err
    got = st.load_file(out)
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k


def test_convert_refuses_a_listed_value_that_is_not_json_in_one_line(tmp_path, capsys):
    """A file in fastflip's torch layout whose value attribute is not the JSON fastflip writes is refused in one
    line naming the attribute; nothing is written."""
    import h5py

    torch = require("torch")
    from fastflip.frameworks.torch_state import save_state_dict

    p, out = str(tmp_path / "s.h5"), str(tmp_path / "s.safetensors")
    save_state_dict({"w": torch.zeros(2), "epoch": 7}, p)
    with h5py.File(p, "r+") as f:
        f.attrs["epoch"] = "{not json"
    assert main(["convert", p, "-o", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'epoch'" in err and "internal error" not in err, err
    assert not os.path.exists(out)
