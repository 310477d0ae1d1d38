"""Evaluators and process helpers for the lifeline tests and bench (workers import it through `paths`)."""

from __future__ import annotations

import os
import time

import campaign_helpers

HERE = os.path.dirname(os.path.abspath(__file__))

CKPT = """
name = "ckpt-life"
seed = 9
mode = "checkpoint"
paths = [{here!r}]
[target]
checkpoint = "model.h5"
[cells]
bits = ["31", "30", "0"]
group_by = "tensor"
[trials]
per_cell = {per_cell}
[evaluator]
function = "lifeline_helpers:{fn}"
critical = 0.05
"""


def slow_file(path):
    """Checkpoint mode, slowly (so that a kill lands while workers hold working copies)."""
    time.sleep(0.01)
    return campaign_helpers.evaluate_file(path)


def nan_file(path):
    """A broken evaluator: the fault-free run already gives NaN (the sweep must stop with an error)."""
    return float("nan")


def ckpt_campaign(folder, per_cell=400, fn="slow_file"):
    """Write model.h5 (the test MLP) and c.toml (a checkpoint-mode campaign on it) into ``folder``."""
    import h5py

    with h5py.File(os.path.join(folder, "model.h5"), "w") as f:
        for name, arr in campaign_helpers.weights().items():
            f.create_dataset(name, data=arr)
    p = os.path.join(folder, "c.toml")
    with open(p, "w") as fh:
        fh.write(CKPT.format(here=HERE, per_cell=per_cell, fn=fn))
    return p


def _stat(pid):
    """(state, ppid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return rest[0], int(rest[1])


def descendants(root):
    """Every process below ``root`` (children, grandchildren...)."""
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                kids.setdefault(st[1], []).append(int(name))
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def alive(pids):
    """The pids still running (zombies count as gone)."""
    return [p for p in pids if (_stat(p) or ("Z",))[0] != "Z"]


def leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("fastflip-trial-"))
