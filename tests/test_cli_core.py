"""The inject / replay / revert / log commands and old hdf5_corrupter configs, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from fastflip.cli import main
from fastflip.errors import OptionError
from fastflip.files.filebytes import sha256_file
from fastflip.files.log import InjectionLog
from h5fixtures import keras_legacy_like


@pytest.fixture
def ckpt(tmp_path):
    p = str(tmp_path / "model.h5")
    keras_legacy_like(p)
    return p


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inject_log_diff_replay_revert(ckpt, tmp_path, capsys):
    out = str(tmp_path / "out.h5")
    before = sha256_file(ckpt)
    rc, o, _ = run(capsys, "inject", ckpt, "-o", out, "--count", "12", "--bits", "exponent-msb", "--seed", "4",
                   "--role", "weight", "--json")
    assert rc == 0 and sha256_file(ckpt) == before
    summary = json.loads(o)
    assert summary["flips"] == 12 and summary["seed"] == 4 and os.path.exists(out + ".fflog")
    log = InjectionLog.load(out + ".fflog")
    assert {r["bit_positions"][0] for r in log.records()} == {30}
    rc, o, _ = run(capsys, "log", out + ".fflog", "--csv")
    assert rc == 0 and len(o.strip().splitlines()) == 1 + len(log)
    rc, o, _ = run(capsys, "diff", ckpt, out)
    assert rc == 1
    rc, o, _ = run(capsys, "replay", out + ".fflog", ckpt, "-o", str(tmp_path / "again.h5"))
    assert rc == 0 and sha256_file(str(tmp_path / "again.h5")) == sha256_file(out)
    rc, o, _ = run(capsys, "revert", out + ".fflog", out)
    assert rc == 0 and sha256_file(out) == before
    rc, o, _ = run(capsys, "diff", ckpt, out)
    assert rc == 0


def test_errors_are_one_line_with_exit_2(ckpt, tmp_path, capsys):
    cases = [
        ("inject", str(tmp_path / "missing.h5"), "-o", str(tmp_path / "o.h5")),
        ("inject", ckpt, "-o", str(tmp_path / "o.h5"), "--include", "nothing/*"),
        ("inject", ckpt, "-o", str(tmp_path / "o.h5"), "--bits", "99"),
        ("inject", ckpt, "-o", str(tmp_path / "o.h5"), "--count", str(10**9)),
        ("inject", ckpt),
        ("inject", ckpt, "-o", str(tmp_path / "no" / "o.h5")),
        ("revert", str(tmp_path / "missing.fflog"), ckpt),
    ]
    for argv in cases:
        rc, o, e = run(capsys, *argv)
        assert rc == 2, argv
        assert e.count("\n") == 1 and e.startswith("fastflip "), (argv, e)
        assert "Traceback" not in e
    assert not os.path.exists(tmp_path / "o.h5")


def test_same_seed_same_bytes_via_cli(ckpt, tmp_path, capsys):
    for name in ("a.h5", "b.h5"):
        assert run(capsys, "inject", ckpt, "-o", str(tmp_path / name), "--count", "50", "--seed", "9")[0] == 0
    assert sha256_file(str(tmp_path / "a.h5")) == sha256_file(str(tmp_path / "b.h5"))


def test_distribution_and_models_via_cli(ckpt, tmp_path, capsys):
    with h5py.File(ckpt) as f:
        names = []
        f.visititems(lambda n, o: names.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    target = [n for n in names if n.endswith("kernel:0")][0]
    rc, o, _ = run(capsys, "inject", ckpt, "-o", str(tmp_path / "w.h5"), "--count", "5", "--seed", "1",
                   "--distribution", f"{target}=1", "--model", "stuck-at-1", "--json")
    assert rc == 0
    log = InjectionLog.load(str(tmp_path / "w.h5.fflog"))
    assert {log.plan.tensors[t].name for t in log.plan.tensor} == {target}


def test_old_config(ckpt, tmp_path, capsys):
    cfg = tmp_path / "old.yaml"
    cfg.write_text(
        f"hdf5_file: {ckpt}\ninjection_probability: 1.0\ninjection_type: count\ninjection_tries: 7\n"
        "float_precision: 64\nfirst_bit: 1\nlast_bit: 8\nallow_sign_change: false\nallow_NaN_values: false\n"
        "use_random_locations: true\nsave_injection_sequence: true\nlog_file_path: logs-\n"
        f"injection_sequence_path: {tmp_path / 'seq'}\nlocations_to_corrupt: []\n")
    # fastflip's design: the stored float32 words, elements uniform, distinct sites
    rc, o, e = run(capsys, "inject", "--config", str(cfg), "-o", str(tmp_path / "o.h5"), "--seed", "2",
                   "--dtype", "float32", "--design", "fastflip")
    assert rc == 0, e
    assert "float_precision 64 on 32-bit floats" in e  # warned, real dtype used
    log = InjectionLog.load(str(tmp_path / "o.h5.fflog"))
    assert log.manifest["counts"]["flips"] == 7 and log.manifest["counts"]["nan_created"] == 0
    # sign-first 1..8 = the exponent of float32 (LSB numbering 30..23)
    assert all(23 <= b <= 30 for r in log.records() for b in r["bit_positions"])
    # the older tool's design (default): 7 attempts, their sequence saved as its JSON
    rc, o, e = run(capsys, "inject", "--config", str(cfg), "-o", str(tmp_path / "p.h5"), "--seed", "2", "--json")
    assert rc == 0, e
    assert json.loads(o)["attempts"] == 7
    seq = json.loads((tmp_path / "seq.json").read_text())
    assert sum(len(v) for v in seq.values()) == 7 and all(1 <= b <= 8 for v in seq.values() for _, bb in v for b in bb)


def test_old_config_percentage_and_probability(ckpt, tmp_path, capsys):
    from fastflip.compat.oldconfig import map_old_config

    m = map_old_config({"injection_type": "percentage", "injection_tries": 10, "injection_probability": 1.0},
                       ["<f4"], total_elements=1000)
    assert m.kwargs["count"] == 100
    m2 = map_old_config({"injection_type": "count", "injection_tries": 1000, "injection_probability": 0.25},
                        ["<f4"], seed=3)
    assert 180 < m2.kwargs["count"] < 320 and m2.kwargs["count"] == map_old_config(
        {"injection_type": "count", "injection_tries": 1000, "injection_probability": 0.25}, ["<f4"], seed=3).kwargs["count"]
    m3 = map_old_config({"bit_mask": "11", "float_precision": 32}, ["<f4"])
    assert m3.kwargs["model"] == "mask:0b11@random"  # the older tool placed the mask at a random offset
    m4 = map_old_config({"burst": 3, "float_precision": 32}, ["<f4"])
    assert m4.kwargs["model"] == "random-bits:3"  # its burst: distinct random bits, not adjacent ones
    m5 = map_old_config({"use_random_locations": False, "locations_to_corrupt": ["a/"]}, ["<f4"],
                        names=["/a/b", "/a/c", "/b/a"])
    assert m5.kwargs["selection"].regex == ("^/a/b$", "^/a/c$")  # prefixes expand to every dataset below
    with pytest.raises(OptionError, match="are incompatible settings; keep one"):
        map_old_config({"burst": 3, "scaling_factor": 2}, ["<f4"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("hdf5_file: x\nnot_a_key: 1\n")
    rc, o, e = run(capsys, "inject", "--config", str(bad), "-o", str(tmp_path / "z.h5"))
    assert rc == 2 and "unknown key 'not_a_key'" in e


def test_help_imports_no_framework():
    code = ("import sys; from fastflip.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('torch', 'tensorflow', 'keras', 'numba', 'cupy', 'dask', 'matplotlib') if m in sys.modules]\n"
            "print('LOADED', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out  # speed is measured in bench/, not here


@pytest.mark.framework
def test_keras_archive_via_cli(tmp_path, capsys):
    """`fastflip inspect/inject` on a real .keras archive: the inner weights change, Keras loads the result."""
    from conftest import require

    keras = require("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense")])
    src = str(tmp_path / "m.keras")
    model.save(src)
    rc, o, _ = run(capsys, "inspect", src)
    assert rc == 0 and "layers/dense/vars/0" in o
    out = str(tmp_path / "o.keras")
    rc, o, e = run(capsys, "inject", src, "-o", out, "--count", "3", "--bits", "sign", "--seed", "1",
                   "--include", "layers/dense/vars/0")
    assert rc == 0, e
    log = InjectionLog.load(out + ".fflog")
    loaded = keras.saving.load_model(out)
    kernel = np.asarray(loaded.get_layer("dense").kernel.numpy()).reshape(-1)
    original = np.asarray(model.get_layer("dense").kernel.numpy()).reshape(-1)
    changed = np.flatnonzero(kernel.view(np.uint32) != original.view(np.uint32))
    assert sorted(changed.tolist()) == sorted(log.plan.index.tolist())
    assert np.array_equal(kernel.view(np.uint32)[log.plan.index], log.new_words.astype(np.uint32))
