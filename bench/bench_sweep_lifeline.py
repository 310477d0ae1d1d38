"""Nothing left behind by a killed sweep: how fast its workers go, and what stays in $TMPDIR.

* ``test_workers_exit_after_sigkill``: a checkpoint-mode sweep with 2 workers runs until every worker holds
  its working copy; the benchmark times SIGKILL of the sweep's main process alone → every descendant (2 workers
  and the multiprocessing resource tracker) gone.
* ``test_leftovers_after_random_kills``: 10 SIGKILLs of the main process at random moments (seeded), then the
  next start; prints the leftovers in $TMPDIR before and after it and times the next start's clean-up.

Run: ``pytest bench/bench_sweep_lifeline.py --benchmark-only -s --benchmark-columns=min,median,max,rounds``
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
from lifeline_helpers import alive, ckpt_campaign, descendants, leftovers  # noqa: E402

@pytest.fixture
def setting(tmp_path):
    ckpt_campaign(str(tmp_path), per_cell=2000)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), TESTS]))
    return tmp_path, tmp, env


def start(d, env, store="s.db"):
    return subprocess.Popen([sys.executable, "-m", "fastflip", "sweep", str(d / "c.toml"), "-o", str(d / store),
                             "--workers", "2", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)


def test_workers_exit_after_sigkill(benchmark, setting):
    d, tmp, env = setting
    state: dict = {}
    times: list[float] = []

    def setup():
        proc = start(d, env, f"s{len(times)}.db")
        t0 = time.monotonic()
        while len(leftovers(tmp)) < 2 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        state.update(proc=proc, kids=descendants(proc.pid))
        assert len(state["kids"]) >= 3
        return (), {}

    def kill_and_wait():
        t0 = time.monotonic()
        os.kill(state["proc"].pid, signal.SIGKILL)
        while alive(state["kids"]):
            time.sleep(0.005)
        times.append(time.monotonic() - t0)

    try:
        benchmark.pedantic(kill_and_wait, setup=setup, rounds=5, iterations=1)
    finally:
        if "proc" in state:
            state["proc"].wait()
    print(f"\nworkers + resource tracker gone after SIGKILL of the sweep: {', '.join(f'{t:.3f}' for t in times)} s")


def test_leftovers_after_random_kills(benchmark, setting):
    d, tmp, env = setting
    rng = random.Random(11)
    for _ in range(10):
        proc = start(d, env)
        time.sleep(rng.uniform(0.5, 5.0))
        kids = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        while alive(kids) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
    before = len(leftovers(tmp))
    from fastflip.campaign.lifeline import sweep_leftovers

    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    import tempfile

    tempfile.tempdir = None
    try:
        removed = benchmark.pedantic(sweep_leftovers, rounds=1, iterations=1)
    finally:
        tempfile.tempdir = None
        if old is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = old
    # and a real next start (a small shard, to keep it short) leaves nothing either
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", str(d / "c.toml"), "-o", str(d / "shard.db"),
                        "--shard", "0/50", "--workers", "2", "--quiet"], env=env, capture_output=True, text=True,
                       timeout=3600)
    print(f"\nafter 10 random SIGKILLs: {before} work folders in $TMPDIR; the next start removed {removed}; "
          f"after the next sweep ran (exit {r.returncode}): {len(leftovers(tmp))}")
    assert r.returncode == 0 and leftovers(tmp) == []
