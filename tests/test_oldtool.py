"""The older tool (hdf5_corrupter) reproduced: configs as it ships them, its sampling and value rules, its
float64 path, its comparator, the drop-in command; checked against an independent re-implementation of
each rule (struct packing and bit strings, as the older tool itself worked) and against distributions."""

from __future__ import annotations

import json
import math
import struct

import h5py
import numpy as np
import pytest

from conftest import require
from fastflip.cli import main
from fastflip.compat.oldtool import draw_slots
from fastflip.compat.run import run_old_settings
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.log import InjectionLog
from fastflip.compat.oldconfig import OldSettings, load_old_config, settings_from_config
from fastflip.core.sampling import generator

SIZES = {"a": 8, "b": 64, "c": 1024, "d": 4096}


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def ckpt(tmp_path):
    """Four float32 datasets of 8/64/1024/4096 values under /predictor/<x>/W, plus integers."""
    p = tmp_path / "m.h5"
    rng = np.random.default_rng(0)
    data = {}
    with h5py.File(p, "w") as f:
        for k, n in SIZES.items():
            v = (rng.standard_normal(n) * 0.05).astype("<f4")
            f[f"predictor/{k}/W"] = v
            data[f"/predictor/{k}/W"] = v
    return p, data


def write_yaml(path, text):
    path.write_text(text)
    return path


def base_cfg(h5, **kw):
    cfg = {"hdf5_file": str(h5), "log_file_path": "log-", "injection_probability": 1, "injection_type": "count",
           "injection_tries": 10, "allow_sign_change": True, "allow_NaN_values": True,
           "use_random_locations": True, "locations_to_corrupt": [], "save_injection_sequence": False,
           "float_precision": 32}
    cfg.update(kw)
    return settings_from_config(cfg)


def seq_of(s: OldSettings, h5, tmp_path, seed=1, name="o.h5"):
    """Run the oldtool design and return (result, the per-attempt sequence)."""
    r = run_old_settings(s, str(h5), str(tmp_path / name), seed=seed)
    return r, r.run.sequence


# -- an independent re-implementation of the older tool's rules (bit strings, struct) ------------------------

_CODE = {16: ">e", 32: ">f", 64: ">d"}


def ref_bits(x: float, w: int) -> str:
    return "".join(f"{c:08b}" for c in struct.pack(_CODE[w], x))


def ref_value(bits: str, w: int) -> float:
    return struct.unpack(_CODE[w], int(bits, 2).to_bytes(w // 8, "big"))[0]


def ref_flip(bits: str, i: int) -> str:
    return bits[:i] + ("1" if bits[i] == "0" else "0") + bits[i + 1:]


def ref_slots(rng, start, end, length, sign):
    m = end - start + 1
    chunk = max(m - 1, 1)
    out = []
    while length > 0:
        take = chunk if length > chunk else length
        out += [int(x) + start for x in rng.choice(m, size=take, replace=False)] if m > 1 else [start] * take
        length -= take
    return [0 if sign and s == start else s for s in out]


def reference_run(cfg: dict, data: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The older tool's loop on in-memory arrays, written from its description, drawing from fastflip's
    generator in the documented order (location, element, probability; then per attempt its bits)."""
    rng = generator(seed)
    data = {k: v.copy() for k, v in data.items()}
    names = list(data)
    if not cfg.get("use_random_locations", True):
        names = [n for p in cfg["locations_to_corrupt"] for n in data if n.startswith(p)]
    n = int(cfg["injection_tries"])
    pick = rng.integers(0, len(names), size=n) if len(names) > 1 else np.zeros(n, np.int64)
    sizes = np.array([data[names[i]].size for i in pick], np.int64)
    elem = (rng.random(n) * sizes).astype(np.int64)
    passed = rng.random(n) < float(cfg.get("injection_probability", 1))
    w = int(cfg.get("float_precision", 64))
    first, last = cfg.get("first_bit", 0), cfg.get("last_bit", w - 1)
    sign = bool(cfg.get("allow_sign_change", True))
    if sign and first > 0:
        first -= 1
    allow_nan = bool(cfg.get("allow_NaN_values", False))
    for i in range(n):
        if not passed[i]:
            continue
        if data[names[pick[i]]].ndim > 4:  # its corrupt_dataset handled 0..4 dimensions: the try is spent
            continue
        arr = data[names[pick[i]]].reshape(-1)
        v = arr[elem[i]]
        if arr.dtype.kind in "iu":
            a = abs(int(v))
            s = bin(a)[2:]
            k = int(rng.integers(0, len(s)))
            new = int(ref_flip(s, k), 2)
            arr[elem[i]] = -new if int(v) < 0 else new
            continue
        bits = ref_bits(float(v), w)
        if cfg.get("bit_mask"):
            mask = cfg["bit_mask"]
            while True:
                off = int(rng.integers(0, w - len(mask) + 1))
                full = "0" * off + mask + "0" * (w - len(mask) - off)
                cand = "".join(str(int(x) ^ int(y)) for x, y in zip(bits, full))
                if allow_nan or math.isfinite(ref_value(cand, w)):
                    bits = cand
                    break
        else:
            pending = ref_slots(rng, first, last, int(cfg.get("burst", 1)), sign)
            while pending:
                failed = 0
                for b in pending:
                    cand = ref_flip(bits, b)
                    if not allow_nan and not math.isfinite(ref_value(cand, w)):
                        failed += 1
                    else:
                        bits = cand
                if not failed:
                    break
                pending = ref_slots(rng, first, last, failed, sign)
        with np.errstate(all="ignore"):
            arr[elem[i]] = np.array(ref_value(bits, w)).astype(arr.dtype)
    return data


def read_all(path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__("/" + n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def same_words(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))


@pytest.mark.parametrize("cfg", [
    {"first_bit": 1, "last_bit": 8, "burst": 1, "allow_sign_change": True, "float_precision": 32},
    {"first_bit": 0, "last_bit": 8, "burst": 3, "allow_sign_change": False, "float_precision": 32},
    {"first_bit": 2, "last_bit": 12, "burst": 12, "allow_sign_change": True, "float_precision": 64},
    {"first_bit": 1, "last_bit": 11, "burst": 2, "allow_NaN_values": False, "float_precision": 64},
    {"first_bit": 1, "last_bit": 8, "burst": 2, "allow_NaN_values": False, "float_precision": 32},
    {"bit_mask": "1011", "allow_NaN_values": False, "float_precision": 64},
    {"bit_mask": "11", "float_precision": 16},
    {"use_random_locations": False, "locations_to_corrupt": ["/predictor/a/", "/predictor/"], "first_bit": 9,
     "last_bit": 31, "float_precision": 32, "injection_probability": 0.5},
])
def test_matches_independent_reimplementation(ckpt, tmp_path, cfg):
    h5, data = ckpt
    with h5py.File(h5, "a") as f:
        f["predictor/i/n"] = np.array([1000, -5, 0, 7, -128], "i8")
    data = read_all(h5)
    full = {"injection_tries": 400, "allow_NaN_values": True, **cfg}
    s = base_cfg(h5, **full)
    r = run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=11)
    want = reference_run(full, data, seed=11)
    got = read_all(tmp_path / "o.h5")
    for k in data:
        assert same_words(got[k], want[k]), k
    assert same_words(read_all(h5)["/predictor/a/W"], data["/predictor/a/W"])  # the input is untouched
    # the log replays and reverts the run bit for bit
    replay(r.result.log_path, str(h5), str(tmp_path / "re.h5"))
    assert all(same_words(read_all(tmp_path / "re.h5")[k], got[k]) for k in got)
    revert(r.result.log_path, str(tmp_path / "o.h5"))
    assert all(same_words(read_all(tmp_path / "o.h5")[k], data[k]) for k in data)


def test_datasets_of_more_than_four_dimensions_spend_attempts(tmp_path, capsys):
    """One 5-D dataset among four: a quarter of the attempts land on it and change nothing (the older tool
    indexed at most 4 dimensions); --design fastflip corrupts it."""
    stats = require("scipy.stats")
    h5 = tmp_path / "c3d.h5"
    shapes = {"/w1": (64,), "/w2": (8, 8), "/w4": (2, 4, 2, 4), "/w5": (2, 2, 2, 2, 4)}
    rng = np.random.default_rng(3)
    with h5py.File(h5, "w") as f:
        for k, shp in shapes.items():
            f[k] = (rng.standard_normal(shp) * 0.05 + 1.0).astype("<f4")
    data = read_all(h5)
    cfg = {"injection_tries": 800, "first_bit": 9, "last_bit": 31, "float_precision": 32}
    s = base_cfg(h5, **cfg, save_injection_sequence=True)
    r = run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=5)
    seq = r.run.sequence
    on5 = len(seq["/w5"])
    assert r.run.attempts == 800 == sum(len(v) for v in seq.values())
    assert r.run.corrupted == 800 - on5 and r.run.plan.meta["skipped_over_4d"] == on5
    assert all(bits is None for _, bits in seq["/w5"]) and all(bits for k in ("/w1", "/w2", "/w4") for _, bits in seq[k])
    assert stats.binomtest(on5, 800, 0.25).pvalue > 1e-3  # still one location in four
    got = read_all(tmp_path / "o.h5")
    want = reference_run({**cfg, "allow_NaN_values": True}, data, seed=5)
    assert all(same_words(got[k], want[k]) for k in data) and same_words(got["/w5"], data["/w5"])
    assert not same_words(got["/w4"], data["/w4"])  # 4 dimensions still corrupted
    assert any("more than 4 dimensions (/w5)" in w and "--design fastflip" in w for w in r.warnings)
    # the same settings in fastflip's design corrupt the 5-D dataset too
    f = run_old_settings(s, str(h5), str(tmp_path / "f.h5"), seed=5, design="fastflip")
    assert not same_words(read_all(f.result.output)["/w5"], data["/w5"])
    # the drop-in command says so on stderr and counts the same way
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--injectionTries", "40", "--injectionType",
                       "count", "--useRandomLocations", "--floatPrecision", "32", "--seed", "2", "--json")
    res = json.loads(out)
    assert rc == 0 and "more than 4 dimensions" in err and res["attempts"] == 40 and res["corrupted"] < 40


def test_config_exactly_as_the_older_tool_ships_it(ckpt, tmp_path, capsys):
    h5, _ = ckpt
    with h5py.File(h5, "a") as f:
        for k in ("conv1", "conv2", "conv5"):
            f[f"predictor/{k}/W"] = np.ones((4, 3), "f4")
            f[f"predictor/{k}/b"] = np.ones(4, "f4")
    cfg = write_yaml(tmp_path / "config.yaml", f"""\
################################################# Injector Parameters #################################################
#
#    hdf5_file                    the path to the hdf5 file to corrupt
#    log_file_path                path where to save the log files.
#    float_precision              32 or 64, the number or bits to use for each float value
################################################# Injector Parameters #################################################

hdf5_file: "{h5}"
injection_probability: 1 # 1e-8
injection_type: "count" #"percentage"
injection_tries: 3000
log_file_path: "/home/diego/PycharmProjects/hdf5_corrupter/log-"
float_precision: 64
#first_bit: 2
#last_bit: 31
#burst: 3
#scaling_factor: 100
bit_mask: "101101"
allow_sign_change: True
allow_NaN_values: False
#injection_sequence_path: "/home/diego/PycharmProjects/hdf5_corrupter/injectionSequence.json"
save_injection_sequence: True
use_random_locations: False
locations_to_corrupt:
  - "/predictor/conv1/"
  - "/predictor/conv2/"
  - "/predictor/conv5/"
""")
    rc, out, err = run(capsys, "inject", "--config", str(cfg), "-o", str(tmp_path / "o.h5"), "--seed", "5", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["attempts"] == 3000 and res["corrupted"] == 3000
    seq = json.loads((tmp_path / "o.h5.sequence.json").read_text())
    assert set(seq) == {"/predictor/conv1/", "/predictor/conv2/", "/predictor/conv5/"}
    assert sum(len(v) for v in seq.values()) == 3000
    for entries in seq.values():  # six bits "101101" at a random offset: bits off, off+2, off+3, off+5
        for idx, bits in entries:
            off = bits[0]
            assert bits == [off, off + 2, off + 3, off + 5] and 0 <= off <= 58
    diff = read_all(tmp_path / "o.h5")
    assert np.array_equal(diff["/predictor/a/W"], read_all(h5)["/predictor/a/W"])  # only the listed prefixes
    log = InjectionLog.load(res["log"])
    assert {log.plan.tensors[t].name.split("/")[2] for t in log.plan.tensor} == {"conv1", "conv2", "conv5"}


def test_dataset_uniform_picks_chi_square(ckpt, tmp_path):
    stats = require("scipy.stats")
    h5, _ = ckpt
    s = base_cfg(h5, injection_tries=3000, save_injection_sequence=True)
    _, seq = seq_of(s, h5, tmp_path, seed=2)
    counts = [len(seq[f"/predictor/{k}/W"]) for k in SIZES]
    assert sum(counts) == 3000
    assert stats.chisquare(counts).pvalue > 1e-3, counts  # ~750 each, whatever the size
    # fastflip's design: in proportion to size, without replacement
    r = run_old_settings(s, str(h5), str(tmp_path / "f.h5"), seed=2, design="fastflip")
    log = InjectionLog.load(r.result.log_path)
    pairs = np.bitwise_count(log.plan.bits)  # distinct (element, bit) sites, uniform over all of them
    assert int(pairs.sum()) == 3000
    n = {t.name: 0 for t in log.plan.tensors}
    for t, k in zip(log.plan.tensor, pairs):
        n[log.plan.tensors[t].name] += int(k)
    lo, hi = stats.hypergeom(sum(SIZES.values()) * 32, SIZES["d"] * 32, 3000).interval(0.999)
    assert lo <= n["/predictor/d/W"] <= hi and n.get("/predictor/a/W", 0) <= 20, n


@pytest.mark.parametrize("sign,first,expected", [(True, 1, list(range(9))), (False, 0, list(range(9))),
                                                 (False, 1, list(range(1, 9))), (True, 4, [0, 4, 5, 6, 7, 8])])
def test_sign_slot_rule_bit_distribution(ckpt, tmp_path, sign, first, expected):
    stats = require("scipy.stats")
    h5, _ = ckpt
    s = base_cfg(h5, injection_tries=4500, first_bit=first, last_bit=8, allow_sign_change=sign,
                 save_injection_sequence=True)
    assert s.slot_bits(32) == expected
    _, seq = seq_of(s, h5, tmp_path)
    bits = [b for v in seq.values() for _, bb in v for b in bb]
    counts = [bits.count(b) for b in expected]
    assert sum(counts) == 4500 and stats.chisquare(counts).pvalue > 1e-3, counts


def test_burst_is_distinct_random_bits(ckpt, tmp_path):
    stats = require("scipy.stats")
    h5, _ = ckpt
    s = base_cfg(h5, injection_tries=3000, first_bit=9, last_bit=31, burst=3, allow_sign_change=False,
                 save_injection_sequence=True)
    _, seq = seq_of(s, h5, tmp_path)
    draws = [bb for v in seq.values() for _, bb in v]
    assert all(len(set(bb)) == 3 and all(9 <= b <= 31 for b in bb) for bb in draws)
    assert any(max(bb) - min(bb) > 2 for bb in draws)  # not adjacent
    flat = [b for bb in draws for b in bb]
    assert stats.chisquare([flat.count(b) for b in range(9, 32)]).pvalue > 1e-3
    # a burst longer than the range: chunks of (range - 1) distinct slots, so bits may repeat and cancel
    rng = generator(3)
    longer = draw_slots(rng, 0, 3, 7, False)
    assert len(longer) == 7 and len(set(longer[:3])) == 3 and len(set(longer[3:6])) == 3


def test_bit_mask_at_random_offset(ckpt, tmp_path):
    stats = require("scipy.stats")
    h5, data = ckpt
    s = base_cfg(h5, injection_tries=3000, bit_mask="101", save_injection_sequence=True)
    r, seq = seq_of(s, h5, tmp_path)
    offs = [bb[0] for v in seq.values() for _, bb in v]
    assert all(bb == [bb[0], bb[0] + 2] for v in seq.values() for _, bb in v)
    assert stats.chisquare([offs.count(o) for o in range(30)]).pvalue > 1e-3  # 0..29 uniformly
    log = InjectionLog.load(r.result.log_path)
    single = [int(x) for x in log.plan.xor_mask]  # every mask is 0b101 shifted (or a XOR of such)
    assert any(x in {0b101 << k for k in range(30)} for x in single)


def test_integers_flip_their_own_binary_digits(tmp_path):
    h5 = tmp_path / "i.h5"
    with h5py.File(h5, "w") as f:
        f["n"] = np.array([1000], "i8")
        f["m"] = np.array([-5], "i4")
        f["z"] = np.array([0], "u2")
    seen: dict[str, set[int]] = {"/n": set(), "/m": set(), "/z": set()}
    for seed in range(60):
        s = base_cfg(h5, injection_tries=1, float_precision=64)
        run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=seed, log_path=False)
        out = read_all(tmp_path / "o.h5")
        for k in seen:
            seen[k].add(int(out[k][0]))
    assert seen["/n"] - {1000} <= {1000 ^ (1 << k) for k in range(10)} and len(seen["/n"]) > 5
    assert max(seen["/n"]) < 1024  # the old tool's 1000 stays small (a 64-bit word flip would not)
    assert seen["/m"] - {-5} <= {-1, -7, -4} and seen["/m"] - {-5}
    assert seen["/z"] - {0} == {1}


def test_float64_path_bit_for_bit(tmp_path):
    h5 = tmp_path / "f.h5"
    vals = np.array([1.5, -0.0731, 3.0e-39, 2.0e38], "f4")
    with h5py.File(h5, "w") as f:
        f["w"] = vals
    for b in range(64):
        s = base_cfg(h5, injection_tries=1, first_bit=b, last_bit=b, allow_sign_change=False, float_precision=64)
        for seed in range(2):
            run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=seed, log_path=False)
            got = read_all(tmp_path / "o.h5")["/w"]
            changed = np.flatnonzero(got.view("u4") != vals.view("u4"))
            assert len(changed) <= 1 and (len(changed) == 1 or b > 11)  # sign/exponent flips always show
            i = int(changed[0]) if len(changed) else None
            for j in range(4):
                if j == i:
                    want = np.array(ref_value(ref_flip(ref_bits(float(vals[j]), 64), b), 64))
                    with np.errstate(all="ignore"):
                        assert got[j:j + 1].view("u4")[0] == want.astype("f4").reshape(1).view("u4")[0], (b, j)
    # Infs are written although NaN values are not allowed: the check ran on the float64 value
    with h5py.File(h5, "w") as f:
        f["w"] = np.array([-0.0731, 3.0e-39], "f4")
    s = base_cfg(h5, injection_tries=1, first_bit=1, last_bit=1, allow_sign_change=False, allow_NaN_values=False,
                 float_precision=64)
    run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=0, log_path=False)
    assert np.isinf(read_all(tmp_path / "o.h5")["/w"]).sum() == 1


def test_counts_percentage_truncates_and_attempts_exceed_sites(ckpt, tmp_path):
    h5, _ = ckpt
    total = sum(SIZES.values())
    s = base_cfg(h5, injection_type="percentage", injection_tries=1)
    assert s.attempts(total) == int(total / 100) == 51  # 51.92 truncated
    r = run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=1)
    assert r.run.attempts == 51
    assert base_cfg(h5, injection_tries=7.9).attempts(total) == 7
    tiny = tmp_path / "t.h5"
    with h5py.File(tiny, "w") as f:
        f["w"] = np.full(4, 1.5, "f4")
    r = run_old_settings(base_cfg(tiny, injection_tries=100, first_bit=20, last_bit=31), str(tiny),
                         str(tmp_path / "o2.h5"), seed=1)
    assert r.run.attempts == 100 and len(r.run.plan) == 4  # with replacement: 4 elements, hit many times


def test_repeated_flips_cancel_and_are_logged(tmp_path):
    h5 = tmp_path / "one.h5"
    with h5py.File(h5, "w") as f:
        f["w"] = np.array([1.5], "f4")
    s = base_cfg(h5, injection_tries=2, first_bit=5, last_bit=5, allow_sign_change=False)
    r = run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=1)
    assert r.run.corrupted == 2 and len(r.run.plan) == 1 and int(r.run.plan.xor_mask[0]) == 0
    assert read_all(tmp_path / "o.h5")["/w"][0] == 1.5
    log = InjectionLog.load(r.result.log_path)
    assert len(log) == 1 and log.manifest["plan"]["unchanged"] == 1


def test_prefixes_and_nan_redraw(ckpt, tmp_path, capsys):
    h5, data = ckpt
    s = base_cfg(h5, use_random_locations=False, locations_to_corrupt=["/predictor/b/", "predictor/c"],
                 injection_tries=500, first_bit=1, last_bit=8, burst=3, allow_NaN_values=False)
    r = run_old_settings(s, str(h5), str(tmp_path / "o.h5"), seed=4)
    out = read_all(tmp_path / "o.h5")
    assert np.array_equal(out["/predictor/a/W"], data["/predictor/a/W"])
    assert all(np.isfinite(v).all() for v in out.values()) and r.run.nan_redraws > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"hdf5_file: {h5}\nuse_random_locations: false\nlocations_to_corrupt: ['/nothing/']\n"
                   "injection_type: count\ninjection_tries: 3\n")
    rc, _, err = run(capsys, "inject", "--config", str(bad), "-o", str(tmp_path / "z.h5"))
    assert rc == 2 and "no datasets with the prefix '/nothing/'" in err and "Traceback" not in err


def test_every_key_accepted_and_checked(tmp_path, capsys):
    keys = dict(hdf5_file="x.h5", log_file_path="l-", injection_probability=0.5, injection_type="count",
                injection_tries=3, allow_sign_change=False, allow_NaN_values=True, use_random_locations=True,
                locations_to_corrupt=[], save_injection_sequence=False, float_precision="auto", burst=2,
                injection_sequence_path="", load_injection_sequence=False, log_file="l")
    s = settings_from_config(keys)
    assert s.precision == "auto" and s.burst == 2 and s.probability == 0.5
    p = write_yaml(tmp_path / "c.yaml", "\n".join(f"{k}: {json.dumps(v)}" for k, v in keys.items()))
    assert load_old_config(p)["log_file_path"] == "l-"
    from fastflip.errors import OptionError

    for bad, msg in [({"bit_mask": "11", "burst": 3}, "incompatible"), ({"first_bit": 9, "last_bit": 3}, "interval"),
                     ({"injection_type": "often"}, "percentage"), ({"bit_mask": "12"}, "0 and 1"),
                     ({"use_random_locations": False}, "locations_to_corrupt")]:
        with pytest.raises(OptionError, match=msg):
            settings_from_config({**keys, "float_precision": 32, "burst": 1, **bad})


def test_drop_in_command(ckpt, tmp_path, capsys):
    h5, data = ckpt
    before = h5.read_bytes()
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--injectionTries", "30", "--injectionType",
                       "count", "--firstBit", "1", "--lastBit", "8", "--floatPrecision", "32", "--useRandomLocations",
                       "--allowSignChange", "--burst", "2", "--saveInjectionSequence", str(tmp_path / "seq"), "true",
                       "--seed", "3", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert h5.read_bytes() == before and "unchanged" in err and "--inPlace" in err  # a copy by default
    assert res["output"].endswith("m.corrupted.h5") and res["attempts"] == 30
    seq = json.loads((tmp_path / "seq.json").read_text())
    assert sum(len(v) for v in seq.values()) == 30 and all(len(i) == 1 for v in seq.values() for i, _ in v)
    # the saved sequence (with indexes) loads as a plan: the same float flips at the same elements
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--loadInjectionSequence",
                       str(tmp_path / "seq.json"), "--floatPrecision", "32", "--output", str(tmp_path / "re.h5"), "--json")
    assert rc == 0, err
    a, b = read_all(res["output"]), read_all(tmp_path / "re.h5")
    assert all(same_words(a[k], b[k]) for k in a)
    # the older format (bits only) loads too
    (tmp_path / "old.json").write_text(json.dumps({"/predictor/a/": [[1], [2, 3], None]}))
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--loadInjectionSequence",
                       str(tmp_path / "old.json"), "--floatPrecision", "32", "--output", str(tmp_path / "old.h5"), "--json")
    assert rc == 0 and json.loads(out)["attempts"] == 2
    # --inPlace edits the input like the older tool; the log reverts it
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--injectionTries", "5", "--injectionType",
                       "count", "--useRandomLocations", "--floatPrecision", "32", "--inPlace", "--seed", "1", "--json")
    assert rc == 0 and h5.read_bytes() != before
    assert run(capsys, "revert", json.loads(out)["log"], str(h5))[0] == 0 and h5.read_bytes() == before
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--injectionType", "count",
                       "--injectionTries", "2")
    assert rc == 2 and "locations_to_corrupt" in err  # switches absent are false, as in the older tool


def ref_old_tool_refuses(cfg: dict) -> bool:
    """The last version's settings check (settings_reader.py), re-written from its description: precision
    compared with strings, its ``auto and (range) or scaling or mask`` condition as Python groups it, its count of
    incompatible settings, and the crash when a range setting leaves first/last bit unset."""
    fp, first, last = cfg.get("float_precision"), cfg.get("first_bit"), cfg.get("last_bit")
    sf, mask, burst = cfg.get("scaling_factor"), cfg.get("bit_mask"), cfg.get("burst", 1)
    if fp not in ("16", "32", "64", "auto"):
        return True
    if fp == "auto" and (first is not None and last is not None) or sf is not None or mask is not None:
        return True
    ranged = burst > 1 or first is not None or last is not None
    if (fp == "auto") + ranged > 1:
        return True
    return ranged and (first is None or last is None)


@pytest.mark.parametrize("extra", [
    {"float_precision": "32", "first_bit": 1, "last_bit": 8}, {"float_precision": 32}, {"float_precision": 64},
    {"float_precision": "64", "bit_mask": "101"}, {"float_precision": "32", "scaling_factor": 2.0},
    {"float_precision": "32", "burst": 3}, {"float_precision": "32", "burst": 3, "first_bit": 2, "last_bit": 20},
    {"float_precision": "32", "first_bit": 4}, {"float_precision": "auto"}, {"float_precision": "auto", "burst": 2},
    {"float_precision": "16", "burst": 1},
])
def test_note_when_the_older_tool_refused_the_setting(ckpt, tmp_path, capsys, extra):
    h5, _ = ckpt
    cfg = {"hdf5_file": str(h5), "log_file_path": "l-", "injection_probability": 1, "injection_type": "count",
           "injection_tries": 5, "allow_sign_change": False, "allow_NaN_values": True, "use_random_locations": True,
           "locations_to_corrupt": [], "save_injection_sequence": False, **extra}
    p = write_yaml(tmp_path / "c.yaml", "\n".join(f"{k}: {json.dumps(v)}" for k, v in cfg.items()))
    rc, out, err = run(capsys, "inject", "--config", str(p), "-o", str(tmp_path / "o.h5"), "--seed", "1", "--json")
    notes = [line for line in err.splitlines() if line.startswith("fastflip inject: note: the older tool refused")]
    assert rc == 0 and len(notes) == int(ref_old_tool_refuses(extra)), err
    log = InjectionLog.load(json.loads(out)["log"])
    assert len(log.manifest.get("old_tool_refused", [])) == len(notes)  # the log says so too
    rc, _, err = run(capsys, "inject", "--config", str(p), "-o", str(tmp_path / "f.h5"), "--design", "fastflip")
    assert rc == 0 and ("note: the older tool refused" in err) == ref_old_tool_refuses(extra)


README_SHORT = {"-c": "--configFile", "-f": "--hdf5File", "-l": "--logFilePath", "-d": "--firstBit", "-e": "--lastBit",
                "-p": "--injectionProbability", "-t": "--injectionType", "-k": "--injectionTries",
                "-a": "--scalingFactor"}  # its README's list (-o | --onlyPrint takes no value)


def test_readme_short_flags(ckpt, tmp_path, capsys):
    from fastflip.cli import build_parser

    h5, _ = ckpt
    parser = build_parser()
    for short, long in README_SHORT.items():
        assert parser.parse_args(["hdf5-corrupter", short, "7"]) == parser.parse_args(["hdf5-corrupter", long, "7"])
    assert parser.parse_args(["hdf5-corrupter", "-o"]).onlyPrint is True
    cfg = write_yaml(tmp_path / "config-pytorch.yaml", f"""\
hdf5_file: "{h5}"
log_file_path: "l-"
injection_probability: 1
injection_type: "percentage"
injection_tries: 1
float_precision: "32"
allow_sign_change: True
allow_NaN_values: False
save_injection_sequence: False
use_random_locations: True
locations_to_corrupt: []
""")
    # its README: python3 hdf5_corrupter.py -c "config-pytorch.yaml" -t "count" -k 34 (the flags override the file)
    rc, out, err = run(capsys, "hdf5-corrupter", "-c", str(cfg), "-t", "count", "-k", "34", "--output",
                       str(tmp_path / "o.h5"), "--seed", "1", "--json")
    assert rc == 0 and json.loads(out)["attempts"] == 34, err
    rc, out, err = run(capsys, "hdf5-corrupter", "-c", str(cfg), "--output", str(tmp_path / "o2.h5"), "--json")
    assert rc == 0 and json.loads(out)["attempts"] == sum(SIZES.values()) // 100  # the file's own 1 %
    rc, out, err = run(capsys, "hdf5-corrupter", "-c", str(cfg), "--burst", "3", "--output", str(tmp_path / "o3.h5"))
    assert rc == 0 and "--burst is ignored with --configFile" in err
    # python3 hdf5_corrupter.py -c "config-pytorch.yaml" -o: print the datasets, change nothing
    rc, out, err = run(capsys, "hdf5-corrupter", "-c", str(cfg), "-o")
    assert rc == 0 and '"/predictor/a/W" --- Type: float32' in out and not (tmp_path / "m.corrupted.h5").exists()
    rc, out, err = run(capsys, "hdf5-corrupter", "-c", str(cfg), "-o", str(tmp_path / "x.h5"))
    assert rc == 2 and "--output" in err and "Traceback" not in err
    rc, out, err = run(capsys, "hdf5-corrupter", "-f", str(h5), "-t", "count", "-k", "3", "-d", "1", "-e", "8",
                       "--useRandomLocations", "--output", str(tmp_path / "o4.h5"), "--json")
    assert rc == 0 and json.loads(out)["attempts"] == 3
    assert "note: the older tool refused or crashed on this setting" in err and "--floatPrecision" in err


def test_old_tool_sequence_file_and_replay_of_either_form(ckpt, tmp_path, capsys, monkeypatch):
    """--oldtool-sequence writes the sequence as the older tool did in config mode (<injection_sequence_path>.json
    in the working directory, no indexes, each entry under the first location its dataset starts with); its
    entries are re-derived here from fastflip's own form of the same run, then both forms replay."""
    h5, data = ckpt
    monkeypatch.chdir(tmp_path)
    prefixes = ["/predictor/a/", "/predictor/", "/predictor/c/"]  # a and c are each under two prefixes
    cfg = {"hdf5_file": str(h5), "log_file_path": "l-", "injection_probability": 0.5, "injection_type": "count",
           "injection_tries": 300, "float_precision": "32", "first_bit": 1, "last_bit": 8, "allow_sign_change": True,
           "allow_NaN_values": True, "use_random_locations": False, "locations_to_corrupt": prefixes,
           "save_injection_sequence": True}
    p = write_yaml(tmp_path / "c.yaml", "\n".join(f"{k}: {json.dumps(v)}" for k, v in cfg.items()))
    rc, out, err = run(capsys, "inject", "--config", str(p), "-o", "f.h5", "--seed", "4", "--json")
    assert rc == 0 and json.loads(out)["sequence"].endswith("/f.h5.sequence.json"), err
    rc, out, err = run(capsys, "inject", "--config", str(p), "-o", "o.h5", "--seed", "4", "--json", "--oldtool-sequence")
    assert rc == 0 and json.loads(out)["sequence"] == ".json", err  # no injection_sequence_path: just ".json"
    ours = json.loads((tmp_path / "f.h5.sequence.json").read_text())
    old = json.loads((tmp_path / ".json").read_text())
    names = [n for q in prefixes for n in data if n.startswith(q)]  # the location list, per prefix in order
    drawn = [q for q in prefixes for n in data if n.startswith(q)]
    pick = generator(4).integers(0, len(names), size=300)  # the documented first draw: one location per attempt
    queues = {k: list(v) for k, v in ours.items()}
    want: dict[str, list] = {}
    for i in pick.tolist():
        idx, bits = queues[drawn[i]].pop(0)
        assert len(idx) == 1  # fastflip's form keeps the indexes
        want.setdefault(next(q for q in prefixes if names[i].startswith(q)), []).append([[], bits])
    assert old == want and list(old) == list(want) and "/predictor/c/" not in old and "/predictor/c/" in ours
    assert all(same_words(read_all("f.h5")[k], read_all("o.h5")[k]) for k in data)  # the same run either way
    # the older form replays: entries with bits re-applied (null: the probability failed), each at a random
    # element of a random dataset under its location (fastflip's form replays too: test_drop_in_command)
    rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--loadInjectionSequence", ".json",
                       "--floatPrecision", "32", "--output", "re.h5", "--json")
    assert rc == 0 and json.loads(out)["attempts"] == sum(b is not None for v in old.values() for _, b in v), err
    # injection_sequence_path names the file (".json" appended, relative to the working directory), and a config
    # that names it without saving loads it back
    (tmp_path / "seqs").mkdir()
    p2 = write_yaml(tmp_path / "c2.yaml", p.read_text() + '\ninjection_sequence_path: "seqs/run1"\n')
    rc, out, err = run(capsys, "inject", "--config", str(p2), "-o", "o2.h5", "--seed", "4", "--oldtool-sequence")
    assert rc == 0 and json.loads((tmp_path / "seqs" / "run1.json").read_text()) == old, err
    p3 = write_yaml(tmp_path / "c3.yaml", p2.read_text().replace("save_injection_sequence: true",
                                                                 "save_injection_sequence: false"))
    rc, out, err = run(capsys, "inject", "--config", str(p3), "-o", "o3.h5", "--seed", "1", "--json")
    assert rc == 0 and json.loads(out)["attempts"] == sum(b is not None for v in old.values() for _, b in v), err
    rc, out, err = run(capsys, "inject", str(h5), "-o", "n.h5", "--count", "1", "--oldtool-sequence")
    assert rc == 2 and "add --config" in err
    # its flags: --saveInjectionSequence PATH SAVE_INDEXES, entries under the first matching location
    for keep in ("true", "false"):
        rc, out, err = run(capsys, "hdf5-corrupter", "--hdf5File", str(h5), "--injectionTries", "50", "--injectionType",
                           "count", "--floatPrecision", "32", "--locationsToCorrupt", *prefixes,
                           "--saveInjectionSequence", f"s-{keep}", keep, "--oldtool-sequence", "--output", "x.h5",
                           "--seed", "2")
        got = json.loads((tmp_path / f"s-{keep}.json").read_text())
        assert rc == 0 and set(got) <= {"/predictor/a/", "/predictor/"} and sum(map(len, got.values())) == 50
        assert all(len(i) == (1 if keep == "true" else 0) for v in got.values() for i, _ in v)


def test_diff_oldtool_comparator(tmp_path, capsys):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    x = np.array([1.0, -2.0, 0.0, 4.0, np.nan], "f4")
    y = np.array([1.0, -3.0, 0.5, 4.0, np.nan], "f4")
    with h5py.File(a, "w") as f:
        f["w"] = x
        f["s"] = np.float32(2.0)
    with h5py.File(b, "w") as f:
        f["w"] = y
        f["s"] = np.float32(3.0)
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--oldtool", "--json")
    assert rc == 1
    t = {d["path"]: d["oldtool"] for d in json.loads(out)["tensors"]}
    w = t["/w"]
    ne = [(float(p), float(q)) for p, q in zip(x, y) if p != q]  # the older tool: x != y, NaN differs from itself
    assert w["diff_count"] == len(ne) == 3 and w["diff_percent"] == pytest.approx(60.0)
    assert w["euclidean_distance"] is None  # NaN - NaN: the distance is NaN (null in JSON)
    rel = [abs(q - p) / p if p else math.inf for p, q in ne[:2]]
    assert w["relative_diffs"][0] == pytest.approx(rel[0]) and w["relative_diffs"][1] == "inf"
    assert t["/s"]["diff_count"] == 1 and t["/s"]["euclidean_distance"] is None
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--oldtool", "--locations", "/w", "s")
    assert '\n--Summary of comparison for "/w" ---\n\t  3 diff count. Representing 60.0%. \n' in out
    assert '\n--Summary of comparison for "/s" ---\n\t  1 diff count. Representing 100.0%. \n' in out
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--oldtool", "--locations", "/", "--json")
    assert json.loads(out)["oldtool_locations"]["/"]["diff_count"] == 4


def ref_comparator_lines(path: str, x: np.ndarray, y: np.ndarray) -> list[str]:
    """hdf5_comparator.py -p on one dataset, re-written from its description: NumPy scalars of the stored
    dtype compared one by one, ``abs(y - x) / x`` per differing pair, ``numpy.linalg.norm(x - y)``, each figure
    printed with ``str`` (NumPy 1 printed list items that way)."""
    with np.errstate(all="ignore"):
        if x.ndim == 0:
            n, dist, diffs = int(x[()] != y[()]), "", []
        else:
            pairs = [(p, q) for p, q in zip(x.flatten(), y.flatten()) if p != q]
            diffs = [abs(q - p) / p for p, q in pairs]
            n, dist = len(diffs), " Euclidean distance: " + str(np.linalg.norm(x.flatten() - y.flatten()))
    return [f'\t\t Object: "{path}" has:  {n} diff count. Representing {str(n * 100 / max(x.size, 1))}%. {dist}',
            f"\t\t Actual diffs: [{', '.join(str(v) for v in diffs)}]", ""]


def test_diff_oldtool_in_the_datasets_own_arithmetic(tmp_path, capsys):
    """float32 norms overflow to inf, NaN distances print nan, float16 figures have float16 digits, x = 0 gives
    ±inf, integer differences wrap (int8), every relative difference printed: as the older comparator did."""
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    rng = np.random.default_rng(7)
    h = rng.standard_normal(50).astype("f2")
    pairs = {
        "/big": (np.array([3.0e38, -2.0e38, 1.0, 0.0], "f4"), np.array([-3.0e38, 2.0e38, 1.5, -4.0], "f4")),
        "/near": (np.array([1.0e19, 2.0e19, 3.0], "f4"), np.array([-1.0e19, -2.0e19, 3.0], "f4")),
        "/half": (h, np.where(np.arange(50) % 7 == 0, h * np.float16(1.37), h).astype("f2")),
        "/nan": (np.array([1.0, np.nan, 2.0], "f8"), np.array([1.0, np.nan, 2.5], "f8")),
        "/i8": (np.array([[100, -120], [5, 0]], "i1"), np.array([[-100, 120], [7, -3]], "i1")),
        "/u8": (np.array([3, 250, 9], "u1"), np.array([5, 4, 9], "u1")),
        "/be": (np.array([1.5, -2.25, 7.0], ">f4"), np.array([1.5, 2.25, -7.0], ">f4")),
        "/s": (np.array(2.5, "f4"), np.array(-2.5, "f4")),
    }
    with h5py.File(a, "w") as fa, h5py.File(b, "w") as fb:
        for k, (x, y) in pairs.items():
            fa[k], fb[k] = x, y
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--oldtool")
    assert rc == 1
    block = out[out.index("the older tool's comparator"):].split("\n")[1:-1]  # print ends the last line
    want = [line for k in sorted(pairs) for line in ref_comparator_lines(k, *pairs[k])]
    assert block == want
    assert "Euclidean distance: inf" in out and "Euclidean distance: nan" in out  # what it printed
    # fastflip's own figures stay the default: float64, no wrap (|(-100) - 100| / 100 = 2, not 0.56)
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--json")
    t = {d["path"]: d for d in json.loads(out)["tensors"]}
    assert "oldtool" not in t["/i8"] and t["/i8"]["max_rel"] == 2.0 and t["/big"]["max_abs"] == pytest.approx(6e38)
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--oldtool", "--json")
    o = {d["path"]: d["oldtool"] for d in json.loads(out)["tensors"]}
    assert o["/i8"]["relative_diffs"][0] == pytest.approx(0.56) and o["/big"]["euclidean_distance"] == "inf"
    assert o["/half"]["arithmetic"] == "float16" and o["/i8"]["arithmetic"] == "float64"


def test_console_script_entry_point(ckpt, tmp_path, capsys):
    from fastflip.cli.hdf5_corrupter_cmd import main as script_main

    h5, _ = ckpt
    rc = script_main(["--hdf5File", str(h5), "--injectionTries", "4", "--injectionType", "count",
                      "--useRandomLocations", "--floatPrecision", "auto", "--output", str(tmp_path / "s.h5"), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["attempts"] == 4, err


@pytest.mark.framework
def test_pytorch_checkpoint_as_users_make_it(tmp_path, capsys):
    """A real PyTorch model (a subclass with nesting and BatchNorm, its int64 counters and momentum buffers),
    saved with fastflip.frameworks.torch_state, corrupted with the older tool's PyTorch-style config, loaded back."""
    torch = require("torch")
    from fastflip.frameworks.torch_state import load_checkpoint, save_checkpoint

    class Block(torch.nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(cin, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer1 = torch.nn.Sequential(Block(3), Block(4))
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.layer1(x).mean((2, 3)))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(2, 3, 9, 9)).sum().backward()
        opt.step()
    ck = save_checkpoint(tmp_path / "ck.h5", net, opt, epoch=3)
    cfg = write_yaml(tmp_path / "config-pytorch.yaml", f"""\
hdf5_file: "{ck}"
log_file_path: "/tmp/log-"
injection_probability: 1
injection_type: "count"
injection_tries: 300
float_precision: 32
first_bit: 1
last_bit: 8
allow_sign_change: True
allow_NaN_values: False
save_injection_sequence: True
use_random_locations: False
locations_to_corrupt:
  - "/model/layer1.0.bn."
  - "/model/layer1.1.bn.num_batches_tracked"
  - "/model/fc.weight"
""")
    rc, out, err = run(capsys, "inject", "--config", str(cfg), "-o", str(tmp_path / "bad.h5"), "--seed", "9", "--json")
    assert rc == 0, err
    seq = json.loads((tmp_path / "bad.h5.sequence.json").read_text())
    assert sum(len(v) for v in seq.values()) == 300
    before, after = read_all(ck), read_all(tmp_path / "bad.h5")
    counter = "/model/layer1.1.bn.num_batches_tracked"
    assert before[counter] == 3 and 0 <= int(after[counter]) < 4  # digits of 3 ('11'): it stays in 0..3
    changed = {k for k in before if not same_words(before[k], after[k])}
    assert changed and changed <= {k for k in before if k.startswith(("/model/layer1.0.bn.", counter, "/model/fc.weight"))}
    assert all(np.isfinite(after[k]).all() for k in changed if after[k].dtype.kind == "f")
    state = load_checkpoint(tmp_path / "bad.h5", net, opt)  # loads back into the model and optimizer
    assert state["epoch"] == 3
