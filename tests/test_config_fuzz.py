"""Config validation: every key of a campaign file and an experiment configuration, given wrong values by a
seeded generator, is refused through the CLI in one line that names the key, with no traceback and no output."""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import sys

import pytest

from conftest import require
from fastflip.cli import main
from test_campaign import HERE

yaml = require("yaml")

# --------------------------------------------------------------------------- campaign files
CAMPAIGN = {
    "name": "fz", "seed": 5, "mode": "memory", "paths": [HERE],
    "target": {"factory": "campaign_helpers:weights"},
    "select": {"include": ["dense/*"]},
    "cells": {"bits": ["31", "0-3"], "group_by": "tensor", "flips": [1], "faults": ["flip"], "distribution": "element"},
    "trials": {"per_cell": 2, "confidence": 0.95, "p": 0.5, "block": 10, "min_trials": 10, "max_per_cell": 100},
    "evaluator": {"function": "campaign_helpers:evaluate", "critical": 0.05, "timeout": 30.0},
}
# every key a campaign file may hold -> what it must be
CAMPAIGN_KEYS = {
    ("name",): "str", ("seed",): "int0", ("mode",): "choice", ("paths",): "strs",
    ("target",): "table", ("select",): "table", ("cells",): "table", ("trials",): "table", ("evaluator",): "table",
    ("target", "checkpoint"): "str", ("target", "factory"): "str",
    ("select", "include"): "strs", ("select", "exclude"): "strs", ("select", "regex"): "strs",
    ("select", "dtypes"): "strs", ("select", "roles"): "strs", ("select", "layers"): "strs",
    ("cells", "bits"): "strs", ("cells", "group_by"): "choice", ("cells", "flips"): "ints+",
    ("cells", "faults"): "strs", ("cells", "epochs"): "ints0", ("cells", "distribution"): "choice",
    ("trials", "per_cell"): "int+", ("trials", "margin"): "open01", ("trials", "confidence"): "open01",
    ("trials", "p"): "open01", ("trials", "half_width"): "open01", ("trials", "block"): "int+",
    ("trials", "min_trials"): "int+", ("trials", "max_per_cell"): "int+",
    ("evaluator", "function"): "str", ("evaluator", "builtin"): "str", ("evaluator", "data"): "str",
    ("evaluator", "command"): "str", ("evaluator", "critical"): "finite", ("evaluator", "timeout"): "finite+",
}

NAN, INF = float("nan"), float("inf")
POOL = ["abc", "", 1.5, -2.5, 0.0, 7.0, True, False, -5, 0, 3, 10**30, NAN, INF, -INF, [1, 2], ["x", 3], [],
        {"a": 1}, {"deep": {"er": [1]}}, [[1]], [{"a": 1}]]


def valid(kind, v):
    """Whether ``v`` is an acceptable value of ``kind`` (the generator only keeps wrong ones)."""
    is_int = isinstance(v, int) and not isinstance(v, bool)
    is_num = isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "int0":
        return is_int and 0 <= v < 2**32
    if kind == "int+":
        return is_int and v >= 1
    if kind == "open01":
        return is_num and 0 < v < (0.5 if False else 1)
    if kind == "finite":
        return is_num and math.isfinite(v)
    if kind == "finite+":
        return is_num and math.isfinite(v) and v > 0
    if kind == "table":
        return isinstance(v, dict) and not v  # an empty table is a table; non-empty ones have wrong keys
    return False  # str, strs, choice, ints: nothing in POOL is both valid and meaningful here


def wrong_values(kind, rng, n):
    vals = [v for v in POOL if not valid(kind, v)]
    if kind == "strs":  # a non-empty string or a list of them (an empty list: none) is valid
        vals = [v for v in vals if not (isinstance(v, str) and v) and v != []]
    if kind == "ints+":
        vals = [v for v in vals if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1)]
    if kind == "ints0":
        vals = [v for v in vals if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)]
    if kind == "open01":
        vals += [1.0, 1, 2]
    return rng.sample(vals, min(n, len(vals)))


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == INF else "-inf" if v == -INF else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(d):
    lines = [f"{k} = {toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def campaign_cases(seed=20261130, per_key=4):
    rng = random.Random(seed)
    cases = []
    for path, kind in CAMPAIGN_KEYS.items():
        for v in wrong_values(kind, rng, per_key):
            cases.append((path, v, rng.choice(["toml", "yaml"])))
    return cases


@pytest.fixture(autouse=True)
def strict_cli(monkeypatch):
    """FASTFLIP_DEBUG: an exception that is not a FastflipError escapes main() (no generic mapping to hide it)."""
    monkeypatch.setenv("FASTFLIP_DEBUG", "1")


def check_cli(args, key, capsys, out_path):
    code = main(args)  # anything but a FastflipError would escape main() and fail the test here
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert code == 2, (key, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert key in lines[0], (key, lines[0])
    assert not out_path.exists()
    return lines[0]


def test_valid_base_campaign_runs(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text(to_toml(CAMPAIGN))
    assert main(["sweep", str(p), "-o", str(tmp_path / "s.db"), "--workers", "0", "--quiet"]) == 0


def test_every_campaign_key_wrong_typed_is_one_line_naming_it(tmp_path, capsys):
    cases = campaign_cases()
    assert len(cases) > 120
    for n, (path, value, fmt) in enumerate(cases):
        d = copy.deepcopy(CAMPAIGN)
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        f = tmp_path / f"c{n}.{fmt}"
        f.write_text(to_toml(d) if fmt == "toml" else yaml.safe_dump(d))
        store = tmp_path / f"s{n}.db"
        line = check_cli(["sweep", str(f), "-o", str(store), "--workers", "0", "--quiet"], path[-1], capsys, store)
        assert f"c{n}.{fmt}: " in line  # the file is named first
        if len(path) == 2:
            assert path[0] in line  # and the section


@pytest.mark.parametrize("text, words", [
    ("[evaluator]\ncritical = nan", "[evaluator] critical must be a finite number (got nan)"),
    ("[evaluator]\ncritical = inf", "[evaluator] critical must be a finite number (got inf)"),
    ("[trials]\nper_cell = -5", "[trials] per_cell must be a positive integer (got -5)"),
    ("[trials]\nper_cell = 0", "[trials] per_cell must be a positive integer (got 0)"),
    ("[trials]\nper_cell = 2.5", "[trials] per_cell must be an integer (got 2.5)"),
    ("[target]\nfactory = {module = 'm'}", "[target] factory must be a non-empty string (got a table)"),
    ("[trials]\nper_cel = 5", "[trials]: unknown key 'per_cel' (did you mean 'per_cell'?)"),
    ("[cells]\ngroupby = 'layer'", "[cells]: unknown key 'groupby' (did you mean 'group_by'?)"),
    ("[evaluator]\ncritcal = 0.1", "[evaluator]: unknown key 'critcal' (did you mean 'critical'?)"),
    ("sed = 3", "campaign: unknown key 'sed' (did you mean 'seed'?)"),
    ("[trials]\nhalf_width = 0.7", "[trials] half_width must be a number in (0, 0.5) (got 0.7)"),
    ("[cells]\nflips = [1, 0]", "[cells] flips must be a positive integer (got 0)"),
    ("[select]\nroles = [{a = 1}]", "[select] roles must be a string or a list of strings (got a table)"),
])
def test_named_refusals(tmp_path, capsys, text, words):
    d = copy.deepcopy(CAMPAIGN)
    for line in text.splitlines()[1:] if text.startswith("[") else [text]:
        pass
    import tomllib

    over = tomllib.loads(text)
    for k, v in over.items():
        if isinstance(v, dict):
            d[k].update(v)
            if "half_width" in v:
                d["trials"].pop("per_cell")
        else:
            d[k] = v
    f = tmp_path / "campaign.toml"
    f.write_text(to_toml(d))
    line = check_cli(["sweep", str(f), "-o", str(tmp_path / "s.db"), "--workers", "0"], "", capsys,
                     tmp_path / "s.db")
    assert line.endswith(words) and f"{f}: " in line, line


def test_binary_file_as_campaign_or_experiment_is_one_line(tmp_path, capsys):
    blob = tmp_path / "model.toml"
    blob.write_bytes(bytes(range(256)) * 8)
    check_cli(["sweep", str(blob), "-o", str(tmp_path / "s.db")], "not a text file", capsys, tmp_path / "s.db")
    h5 = tmp_path / "model.h5"
    h5.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    check_cli(["experiment", str(h5), "--out", str(tmp_path / "o")], "not a text file", capsys, tmp_path / "o")


@pytest.mark.parametrize("chunk", ["-5", "0"])
def test_chunk_must_be_positive(tmp_path, capsys, chunk):
    f = tmp_path / "c.toml"
    f.write_text(to_toml(CAMPAIGN))
    line = check_cli(["sweep", str(f), "-o", str(tmp_path / "s.db"), "--workers", "0", "--chunk", chunk],
                     "--chunk must be a positive integer", capsys, tmp_path / "s.db")
    assert f"got {chunk}" in line


def test_real_cli_process_prints_one_line(tmp_path):
    """The same through a real `fastflip` process: exit 2, one line on stderr, nothing on stdout."""
    d = copy.deepcopy(CAMPAIGN)
    d["evaluator"]["critical"] = NAN
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", str(f), "-o", str(tmp_path / "s.db")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.strip().endswith("c.yaml: [evaluator] critical must be a finite number (got nan)")


# --------------------------------------------------------------------------- experiment configurations
EXPERIMENT = {
    "name": "fz", "epochs": 3, "seed": 1, "repetitions": 2, "tolerance": 0.02, "chance": 0.1,
    "chance_margin": 0.05, "output": "out", "keep_checkpoints": False,
    "trainer": {"framework": "keras", "batch_size": 32, "threads": 1, "checkpoint_format": "weights.h5"},
    "failure": ["degraded", "diverged"],
    "scenarios": [{"name": "a", "epoch": 1, "bits": "exponent-msb", "model": "flip", "count": 3,
                   "distribution": "element", "nan_policy": "allow", "sign_first": False, "repetitions": 1,
                   "control": False, "selection": {"roles": ["weight"]}},
                  {"name": "b", "epoch": 1, "control": True, "repetitions": 1}],
    "compare": [["a", "b"]],
}
EXPERIMENT_KEYS = {
    ("name",): "str", ("epochs",): "int+", ("seed",): "int0", ("repetitions",): "int+", ("tolerance",): "unit",
    ("chance",): "unit", ("chance_margin",): "unit", ("output",): "str", ("keep_checkpoints",): "bool",
    ("trainer",): "table!", ("failure",): "strs", ("scenarios",): "list", ("compare",): "list",
    ("trainer", "framework"): "choice", ("trainer", "batch_size"): "int+", ("trainer", "threads"): "int+",
    ("trainer", "checkpoint_format"): "choice",
    ("scenarios", 0, "name"): "str", ("scenarios", 0, "epoch"): "int0", ("scenarios", 0, "bits"): "str",
    ("scenarios", 0, "model"): "str", ("scenarios", 0, "count"): "int+", ("scenarios", 0, "distribution"): "choice",
    ("scenarios", 0, "nan_policy"): "choice", ("scenarios", 0, "sign_first"): "bool",
    ("scenarios", 0, "repetitions"): "int+", ("scenarios", 0, "control"): "bool",
    ("scenarios", 0, "selection"): "table!", ("scenarios", 0, "rate"): "unit0", ("scenarios", 0, "ber"): "unit0",
}


def exp_wrong(kind, rng, n):
    def ok(v):
        num = isinstance(v, (int, float)) and not isinstance(v, bool)
        if kind == "unit":
            return num and 0 <= v <= 1
        if kind == "unit0":
            return num and 0 < v <= 1
        if kind == "bool":
            return isinstance(v, bool)
        if kind == "str":
            return isinstance(v, str) and v != "" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        if kind == "table!":
            return False
        return valid(kind, v)
    vals = [v for v in POOL if not ok(v)]
    if kind in ("list", "strs"):
        vals = [v for v in vals if not isinstance(v, list) or v in ([], [1, 2], [[1]])]
    if kind == "table!":
        vals = [v for v in vals if not (isinstance(v, dict))] + [{"zz": 1}]
    return rng.sample(vals, min(n, len(vals)))


def test_every_experiment_key_wrong_typed_is_one_line_naming_it(tmp_path, capsys):
    rng = random.Random(20261130)
    n = 0
    for path, kind in EXPERIMENT_KEYS.items():
        for value in exp_wrong(kind, rng, 4):
            d = copy.deepcopy(EXPERIMENT)
            node = d
            for k in path[:-1]:
                node = node[k]
            if kind in ("unit0",):  # rate/ber replace the scenario's count
                node.pop("count", None)
            node[path[-1]] = value
            f = tmp_path / f"e{n}.yaml"
            f.write_text(yaml.safe_dump(d))
            out = tmp_path / f"o{n}"
            key = str(path[-1]) if not isinstance(path[-1], int) else str(path[0])
            check_cli(["experiment", str(f), "--out", str(out), "--no-plot"], key, capsys, out)
            n += 1
    assert n > 80
