"""Library and CLI manners: -q/-v everywhere, JSON with schema_version, outputs under the umask, logging."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

import h5fixtures as hf
from fastflip import inject_file
from fastflip.cli import COMMANDS, build_parser, main
from fastflip.cli.jsonout import JSON_SCHEMA_VERSION


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_every_command_takes_quiet_and_verbose(command):
    sub = next(a for a in build_parser()._subparsers._group_actions).choices[command]
    opts = sub._option_string_actions
    assert "-q" in opts and "--quiet" in opts
    assert "-v" in opts or command == "experiment"  # experiment's own -q prints only its table


def test_json_outputs_carry_schema_version(tmp_path, capsys):
    src, out = str(tmp_path / "m.h5"), str(tmp_path / "o.h5")
    hf.dtype_zoo(src)
    outputs = []
    for argv in (["inspect", src, "--json"], ["inject", src, "-o", out, "--count", "3", "--seed", "1", "--json"],
                 ["log", out + ".fflog", "--json"], ["diff", src, out, "--json"], ["info", "--json"],
                 ["plan", "--population", "1000", "--json"]):
        rc = main(argv)
        assert rc in (0, 1), argv  # diff exits 1: the files differ
        outputs.append(json.loads(capsys.readouterr().out))
    assert all(o["schema_version"] == JSON_SCHEMA_VERSION for o in outputs)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_outputs_and_stores_respect_the_umask(tmp_path, mask):
    from fastflip.campaign.store import ResultStore

    src = str(tmp_path / "m.h5")
    hf.dtype_zoo(src)
    old = os.umask(mask)
    try:
        res = inject_file(src, str(tmp_path / "o.h5"), seed=1, count=2)
        store = ResultStore.create(str(tmp_path / "r.db"), {"name": "x"}, [])
        store.close()
    finally:
        os.umask(old)
    want = 0o666 & ~mask
    for path in (res.output, res.log_path, str(tmp_path / "r.db")):
        assert stat.S_IMODE(os.stat(path).st_mode) == want, path


def test_library_is_silent_unless_the_host_configures_logging(tmp_path, capfd):
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("fastflip").handlers)
    src = str(tmp_path / "m.h5")
    hf.dtype_zoo(src)
    inject_file(src, str(tmp_path / "o.h5"), seed=1, count=2)
    assert capfd.readouterr().err == ""


def test_export_never_overwrites_its_own_store(tmp_path, capsys):
    from fastflip.campaign import Campaign
    from fastflip.campaign.sweep import sweep

    here = os.path.dirname(os.path.abspath(__file__))
    c = Campaign.from_dict({"name": "e", "seed": 1, "paths": [here], "target": {"factory": "campaign_helpers:weights"},
                            "cells": {"bits": ["30"], "group_by": "tensor"}, "trials": {"per_cell": 2},
                            "evaluator": {"function": "campaign_helpers:evaluate"}})
    store = str(tmp_path / "r.db")
    sweep(c, store, workers=0, progress=False)
    before = open(store, "rb").read()
    link = tmp_path / "link.csv"
    link.symlink_to(store)
    for target in (store, str(link)):
        assert main(["export", store, "--csv", target, "--force"]) == 2
        assert "error" in capsys.readouterr().err
    assert open(store, "rb").read() == before
