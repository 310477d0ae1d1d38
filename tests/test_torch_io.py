"""fastflip.frameworks.torch_state: state_dict <-> HDF5, bit-exact, with the documented layout."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import require
from flip_helper import flip_bits

pytestmark = pytest.mark.framework


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )


def _trained(torch, opt_name="adam"):
    net = _net(torch)
    opt = (torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.99))
           if opt_name == "adam" else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    x = torch.randn(8, 1, 8, 8)
    y = torch.randint(0, 10, (8,))
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net, opt


def _bits_equal(a, b, torch):
    if a.dtype == torch.bfloat16:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.atleast_1d(a.numpy()).view(np.uint8), np.atleast_1d(b.numpy()).view(np.uint8))


def test_checkpoint_round_trip_is_bit_exact(torch, tmp_path):
    from fastflip.frameworks.torch_state import load_state_dict, save_checkpoint

    net, opt = _trained(torch)
    p = save_checkpoint(tmp_path / "ck.h5", net, opt, epoch=3, note="x")
    back = load_state_dict(p)
    assert back["epoch"] == 3 and back["note"] == "x"
    for k, v in net.state_dict().items():
        assert _bits_equal(v, back["model"][k], torch), k
    ostate = opt.state_dict()
    assert back["optimizer"]["param_groups"] == ostate["param_groups"]
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)  # tuple survives
    assert list(back["optimizer"]["state"]) == list(ostate["state"])  # int keys, same order
    for pid, st in ostate["state"].items():
        for name, v in st.items():
            assert _bits_equal(v, back["optimizer"]["state"][pid][name], torch), (pid, name)


def test_documented_layout(torch, tmp_path):
    import json

    from fastflip.frameworks.torch_state import save_checkpoint, save_state_dict

    net, opt = _trained(torch)
    p = save_checkpoint(tmp_path / "ck.h5", net, opt)
    with h5py.File(p) as f:
        assert f.attrs["fastflip_layout"] == "torch-state-dict/1"
        assert f["/model/0.weight"].shape == (4, 1, 3, 3) and f["/model/0.weight"].dtype == np.float32
        nbt = f["/model/1.num_batches_tracked"]
        assert nbt.shape == () and nbt.dtype == np.int64 and int(nbt[()]) == 2
        keys = json.loads(f["/model"].attrs["fastflip_keys"])
        kinds = dict(zip([k[0] for k in keys], json.loads(f["/model"].attrs["fastflip_kinds"])))
        assert ["1.running_var", "str"] in keys and kinds["1.running_var"] == "float32"
        assert kinds["1.num_batches_tracked"] == "int64"
        assert "torch_dtype" not in f["/model/1.running_var"].attrs  # the stored dtype says it
        assert [k[:2] for k in json.loads(f["/optimizer/state"].attrs["fastflip_keys"])][0] == ["0", "int"]
        assert f["/optimizer/state/0/exp_avg"].shape == (4, 1, 3, 3)
        assert f["/optimizer/state/0/step"].shape == ()
        assert "param_groups" in f["/optimizer"].attrs
        # contiguous storage by default, so injection can patch bytes in place
        assert f["/model/4.weight"].chunks is None
    p = save_state_dict({"b": torch.ones(2, dtype=torch.bfloat16), "a": np.ones(2)}, tmp_path / "x.h5")
    with h5py.File(p) as f:
        assert f["b"].attrs["torch_dtype"] == "bfloat16" and f["b"].dtype == np.uint16
        assert f["a"].attrs["torch_dtype"] == "ndarray"


def test_dtypes_nested_and_odd_values(torch, tmp_path):
    from fastflip.frameworks.torch_state import load_state_dict, save_state_dict

    state = {
        "a": {"bf": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "h": torch.tensor([0.1], dtype=torch.float16),
              "d": torch.tensor(3.25, dtype=torch.float64), "b": torch.tensor([True, False]),
              "i8": torch.tensor([-3], dtype=torch.int8)},
        "arr": np.arange(4, dtype=">f4"),
        "none": None, "nan": float("nan"), "lst": [1, (2, 3), {"k": [4.5]}],
        7: {"deep": {"deeper": torch.zeros(2, 0)}},
    }
    back = load_state_dict(save_state_dict(state, tmp_path / "s.h5"))
    for k in state["a"]:
        assert _bits_equal(state["a"][k], back["a"][k], torch), k
    assert back["arr"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert back["none"] is None and np.isnan(back["nan"])
    assert back["lst"] == [1, (2, 3), {"k": [4.5]}]
    assert back[7]["deep"]["deeper"].shape == (0,) * 0 + (2, 0)


def test_non_contiguous_and_grad_tensors(torch, tmp_path):
    from fastflip.frameworks.torch_state import load_state_dict, save_state_dict

    t = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous view
    w = torch.nn.Parameter(torch.ones(2))
    back = load_state_dict(save_state_dict({"t": t, "w": w}, tmp_path / "s.h5"))
    assert torch.equal(back["t"], t) and torch.equal(back["w"], w.detach())


def test_bad_values_and_keys_are_refused(torch, tmp_path):
    from fastflip.errors import OptionError
    from fastflip.frameworks.torch_state import save_state_dict

    with pytest.raises(OptionError, match="cannot store a object"):
        save_state_dict({"x": object()}, tmp_path / "a.h5")
    with pytest.raises(OptionError, match="contains '/'"):
        save_state_dict({"a/b": torch.zeros(1)}, tmp_path / "a.h5")
    with pytest.raises(OptionError, match="reserved"):
        save_state_dict({"fastflip_keys": 1}, tmp_path / "a.h5")
    assert not (tmp_path / "a.h5").exists()  # nothing half-written left behind
    assert list(tmp_path.iterdir()) == []


def test_shape_mismatch_names_the_tensor(torch, tmp_path):
    from fastflip.frameworks.torch_state import CheckpointMismatchError, load_checkpoint, save_checkpoint

    net, opt = _trained(torch)
    p = save_checkpoint(tmp_path / "ck.h5", net, opt)
    other = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    with pytest.raises(CheckpointMismatchError, match=r"/model/4\.weight has shape \(10, 144\).*\(5, 144\)"):
        load_checkpoint(p, other)
    smaller = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with pytest.raises(CheckpointMismatchError, match=r"/model/0\.weight has shape \(4, 1, 3, 3\)"):
        load_checkpoint(p, smaller)
    with pytest.raises(CheckpointMismatchError, match=r"/model/2\.weight is missing"):
        load_checkpoint(p, torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 4, 1)))
    with pytest.raises(CheckpointMismatchError, match="no /optimizer"):
        load_checkpoint(save_checkpoint(tmp_path / "m.h5", net), net, opt)


def test_optimizer_state_shape_mismatch(torch, tmp_path):
    from fastflip.frameworks.torch_state import CheckpointMismatchError, load_checkpoint, load_state_dict, save_state_dict

    net, opt = _trained(torch)
    from fastflip.frameworks.torch_state import save_checkpoint

    state = load_state_dict(save_checkpoint(tmp_path / "ck.h5", net, opt))
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2, 2)
    p = save_state_dict(state, tmp_path / "bad.h5")
    with pytest.raises(CheckpointMismatchError, match=r"/optimizer/state/0/exp_avg has shape \(2, 2\)"):
        load_checkpoint(p, net, opt)


def test_flipped_bits_load_exactly(torch, tmp_path):
    """Save with torch -> flip stored bits in the HDF5 file -> load with torch: exactly the new words."""
    from fastflip.frameworks.torch_state import load_checkpoint, save_checkpoint

    net, opt = _trained(torch)
    p = save_checkpoint(tmp_path / "ck.h5", net, opt)
    # flip through the file, independently of fastflip's reader
    expected = flip_bits(p, ["model/0.weight", "model/1.running_mean", "optimizer/state/2/exp_avg_sq",
                             "model/1.num_batches_tracked"], seed=5)
    net2, _ = _trained(torch)
    opt2 = torch.optim.Adam(net2.parameters())
    load_checkpoint(p, net2, opt2)
    sd, osd = net2.state_dict(), opt2.state_dict()
    got = {
        "model/0.weight": sd["0.weight"], "model/1.running_mean": sd["1.running_mean"],
        "optimizer/state/2/exp_avg_sq": osd["state"][2]["exp_avg_sq"],
        "model/1.num_batches_tracked": sd["1.num_batches_tracked"],
    }
    for name, words in expected.items():
        g = got[name].numpy()
        assert np.array_equal(np.atleast_1d(g).view(words.dtype).reshape(words.shape), words), name


def test_missing_and_foreign_files(torch, tmp_path):
    from fastflip.errors import InputFileError, NotHDF5Error
    from fastflip.frameworks.torch_state import load_state_dict

    with pytest.raises(InputFileError, match="no such file"):
        load_state_dict(tmp_path / "nope.h5")
    (tmp_path / "t.h5").write_bytes(b"not hdf5")
    with pytest.raises(NotHDF5Error):
        load_state_dict(tmp_path / "t.h5")
    with h5py.File(tmp_path / "k.h5", "w") as f:
        f.attrs["fastflip_layout"] = "something-else/1"
    with pytest.raises(InputFileError, match="not a torch state file"):
        load_state_dict(tmp_path / "k.h5")


def test_damaged_and_older_key_lists(torch, tmp_path):

    from fastflip.errors import InputFileError
    from fastflip.frameworks.torch_state import load_state_dict, save_state_dict

    state = {"m": {"w": torch.arange(4.0), "n": torch.tensor(3)}, "epoch": 5}
    p = save_state_dict(state, tmp_path / "s.h5")
    with h5py.File(p, "r+") as f:  # no kinds list (another writer): entries are looked up
        for g in (f, f["m"]):
            del g.attrs["fastflip_kinds"]
    back = load_state_dict(p)
    assert back["epoch"] == 5 and torch.equal(back["m"]["w"], state["m"]["w"]) and back["m"]["n"].dtype == torch.int64
    with h5py.File(p, "r+") as f:
        del f["m/w"]
    with pytest.raises(InputFileError, match="/m: entry 'w' is listed but missing"):
        load_state_dict(p)
    p2 = save_state_dict(state, tmp_path / "t.h5")
    with h5py.File(p2, "r+") as f:
        del f["m/n"]
        f["m/n"] = np.float32(1.0)  # replaced by a dataset of another dtype
    with pytest.raises(InputFileError, match="stored as float32 but labelled torch.int64"):
        load_state_dict(p2)
