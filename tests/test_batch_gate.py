"""A sweep whose trials run one by one never imports the batched machinery (campaign/batched.py and below)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import require

HERE = os.path.dirname(os.path.abspath(__file__))

#: The modules of the batched path: imported only by a sweep whose trials may batch
BATCHED = ("fastflip.campaign.batched", "fastflip.campaign.batchedtorch", "fastflip.campaign.batchsize",
           "fastflip.campaign.fxsplit", "fastflip.campaign.pertrial")

_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
from test_campaign import make
from fastflip.campaign.sweep import sweep
c = make(**json.loads({over!r}))
res = sweep(c, {store!r}, workers=0, progress=False)
print(json.dumps([res.stored, sorted(m for m in {batched!r} if m in sys.modules)]))
"""


def _sweep_imports(tmp_path, **over) -> tuple[int, list[str]]:
    """Run a small in-process sweep (the pre-flight, the batching decision and the worker's trials in one fresh
    process) of ``make(**over)``; returns the trials stored and which batched modules it imported."""
    code = _SCRIPT.format(here=HERE, over=json.dumps(over), store=str(tmp_path / "s.db"), batched=BATCHED)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    stored, imported = json.loads(out.stdout.strip().splitlines()[-1])
    return stored, imported


def test_a_serial_sweep_does_not_import_the_batched_path(tmp_path):
    """A function evaluator on NumPy weights: the trials run one by one and no batched module is loaded."""
    stored, imported = _sweep_imports(tmp_path, trials={"per_cell": 3})
    assert stored > 0 and imported == []


@pytest.mark.framework
@pytest.mark.parametrize("batch, loaded", [(1, False), (None, True)])
def test_a_torch_sweep_imports_the_batched_path_only_when_it_may_batch(tmp_path, batch, loaded):
    """A PyTorch model with a built-in evaluator: ``batch_trials = 1`` leaves the batched modules unloaded; the
    automatic choice loads them (the check sees an import when there is one)."""
    require("torch")
    ev = {"function": None, "builtin": "classification", "data": "batch_helpers:digits_data"}
    if batch is not None:
        ev["batch_trials"] = batch
    stored, imported = _sweep_imports(tmp_path, target={"factory": "batch_helpers:digits_net"}, evaluator=ev,
                                      cells={"bits": ["30"], "group_by": "layer"}, trials={"per_cell": 4})
    assert stored > 0
    assert imported == (sorted(BATCHED) if loaded else [])
