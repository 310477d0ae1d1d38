"""`--dask tcp://...`: the documented Slurm set-up (dask-jobqueue), its workers started as the job script would."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from conftest import require
from test_campaign import make, results

from fastflip.campaign.sweep import sweep


def test_slurm_job_script_workers_run_the_campaign_through_a_tcp_scheduler(tmp_path):
    """A scheduler process and two workers started with the command dask-jobqueue writes into its Slurm job script."""
    require("distributed")
    jq = require("dask_jobqueue")
    import json

    cluster = jq.SLURMCluster(cores=1, processes=1, memory="2GB", walltime="00:10:00", queue="normal",
                              scheduler_options={"dashboard_address": None})
    try:
        script = cluster.job_script()
        own_address = cluster.scheduler_address
    finally:
        cluster.close()
    assert "#SBATCH -p normal" in script and "#SBATCH -t 00:10:00" in script and own_address in script
    command = [line for line in script.splitlines() if "dask_worker" in line and not line.startswith("#")][0]
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
                               str(sched_file), "--no-dashboard", "--host", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        t0 = time.monotonic()
        while not sched_file.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for i in range(2):  # what two Slurm jobs would run, pointed at this scheduler
            argv = [address if a == own_address else (f"job-{i}" if a == "dummy-name" else a) for a in shlex.split(command)]
            argv[0] = sys.executable
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        c = make(trials={"per_cell": 8})
        local = sweep(c, str(tmp_path / "local.db"), workers=0, progress=False)
        remote = sweep(c, str(tmp_path / "slurm.db"), dask=address, chunk=5, progress=False)
        assert local.complete and remote.complete
        assert results(tmp_path / "slurm.db") == results(tmp_path / "local.db")
        import sqlite3

        con = sqlite3.connect(tmp_path / "slurm.db")
        assert con.execute("SELECT COUNT(*) FROM workers").fetchone()[0] == 2  # both 'jobs' ran trials
        con.close()
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_unreachable_or_malformed_scheduler_is_a_clear_error(tmp_path):
    require("distributed")
    import pytest

    from fastflip.errors import OptionError

    with pytest.raises(OptionError, match="scheduler address"):
        sweep(make(), str(tmp_path / "a.db"), dask="localhost:1")
