"""Nothing left behind by a sweep: workers die with it (even by SIGKILL), working copies go on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import lifeline_helpers
from fastflip.campaign import lifeline
from lifeline_helpers import alive, descendants, leftovers
from test_campaign_kill import stored, wait_for_progress, write_campaign

def ckpt_campaign(tmp_path, per_cell=400, fn="slow_file"):
    return lifeline_helpers.ckpt_campaign(str(tmp_path), per_cell, fn)


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """A private $TMPDIR for the sweep and for this test's view of it."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    env = dict(os.environ, TMPDIR=str(d))
    return d, env


def sweep_proc(args, env):
    return subprocess.Popen([sys.executable, "-m", "fastflip", "sweep", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)


def wait_gone(pids, timeout=15.0):
    t0 = time.monotonic()
    while alive(pids) and time.monotonic() - t0 < timeout:
        time.sleep(0.05)
    return time.monotonic() - t0


def wait_workdirs(d, n, proc, timeout=60.0):
    t0 = time.monotonic()
    while len(leftovers(d)) < n and time.monotonic() - t0 < timeout and proc.poll() is None:
        time.sleep(0.05)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.parametrize("mode", ["memory", "checkpoint"])
def test_sigkill_of_the_sweep_alone_takes_its_workers_and_resource_tracker_with_it(tmp_path, tmpdir_env, mode):
    d, env = tmpdir_env
    if mode == "memory":
        camp, store = write_campaign(tmp_path, per_cell=3000), str(tmp_path / "m.db")
    else:
        camp, store = ckpt_campaign(tmp_path, per_cell=3000), str(tmp_path / "c.db")
    proc = sweep_proc([camp, "-o", store, "--workers", "2", "--quiet"], env)
    try:
        wait_for_progress(store, 0, proc)
        assert proc.poll() is None, proc.stderr.read()
        kids = descendants(proc.pid)
        assert len(kids) >= 3  # two workers and the resource tracker
        os.kill(proc.pid, signal.SIGKILL)  # the main process only: its workers are not signalled
        proc.wait()
        took = wait_gone(kids)
        assert not alive(kids), f"still alive {took:.1f} s after the sweep was killed: {alive(kids)}"
    finally:
        kill_group(proc)
    # what the kill left, the next start of any sweep on this machine removes
    small = tmp_path / "small"
    small.mkdir()
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", write_campaign(small, per_cell=2), "-o",
                        str(small / "s.db"), "--workers", "0", "--quiet"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert leftovers(d) == []


def test_checkpoint_sweep_leaves_no_copies_after_success_serial_and_pool(tmp_path, tmpdir_env):
    d, env = tmpdir_env
    camp = ckpt_campaign(tmp_path, per_cell=5)
    for workers in ("0", "2"):
        r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", str(tmp_path / f"s{workers}.db"),
                            "--workers", workers, "--quiet"], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert stored(str(tmp_path / f"s{workers}.db")) == 3 * 3 * 5
        assert leftovers(d) == [], workers


def test_checkpoint_sweep_leaves_no_copies_after_an_error(tmp_path, tmpdir_env):
    d, env = tmpdir_env
    camp = ckpt_campaign(tmp_path, per_cell=5, fn="nan_file")
    for workers in ("0", "2"):
        r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", str(tmp_path / f"e{workers}.db"),
                            "--workers", workers, "--quiet"], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2 and "golden" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert leftovers(d) == [], workers


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_checkpoint_sweep_leaves_no_copies_after_ctrl_c_or_sigterm(tmp_path, tmpdir_env, sig):
    d, env = tmpdir_env
    camp = ckpt_campaign(tmp_path, per_cell=3000)
    store = str(tmp_path / "s.db")
    proc = sweep_proc([camp, "-o", store, "--workers", "2", "--chunk", "20", "--quiet"], env)
    try:
        wait_for_progress(store, 0, proc)
        wait_workdirs(d, 2, proc)
        assert len(leftovers(d)) == 2  # one working copy folder per worker while it runs
        kids = descendants(proc.pid)
        os.kill(proc.pid, sig)  # the main process only (a terminal's Ctrl-C would reach the workers too)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in err and out == "", err  # --quiet: the reason only
    else:
        # saved and cleaned up, then SIGTERM's end: the CLI's "terminated" (143), or death by the signal
        assert proc.returncode in (143, -signal.SIGTERM), err
    assert stored(store) > 0
    wait_gone(kids)  # the resource tracker ends once the sweep has closed its end of the pipe
    assert not alive(kids)
    assert leftovers(d) == []


def test_next_start_removes_only_dead_sweeps_leftovers(tmpdir_env):
    d, env = tmpdir_env
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = lifeline.host_tag()
    for name in (f"fastflip-trial-{host}-{dead_pid}-{dead_pid}-abc", f"fastflip-trial-{host}-{os.getpid()}-{dead_pid}-x1",
                 f"fastflip-trial-otherhost-{dead_pid}-{dead_pid}-y2", "fastflip-trial-garbage"):
        (d / name).mkdir()
        (d / name / "0-model.h5").write_bytes(b"x" * 100)
    assert lifeline.sweep_leftovers() == 1
    assert leftovers(d) == sorted([f"fastflip-trial-{host}-{os.getpid()}-{dead_pid}-x1",
                                   "fastflip-trial-otherhost-{}-{}-y2".format(dead_pid, dead_pid),
                                   "fastflip-trial-garbage"])


@pytest.mark.slow
def test_ten_random_kills_then_the_next_start_leave_nothing(tmp_path, tmpdir_env):
    import random

    d, env = tmpdir_env
    camp = ckpt_campaign(tmp_path, per_cell=400)
    store = str(tmp_path / "s.db")
    rng = random.Random(11)
    for _ in range(10):
        proc = sweep_proc([camp, "-o", store, "--workers", "2", "--quiet"], env)
        try:
            time.sleep(rng.uniform(0.5, 4.0))
            kids = descendants(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            wait_gone(kids)
            assert not alive(kids)
        finally:
            kill_group(proc)
    r = subprocess.run([sys.executable, "-m", "fastflip", "sweep", camp, "-o", store, "--workers", "2", "--quiet"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert leftovers(d) == []
