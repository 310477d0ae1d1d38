"""Shared by the trials-per-second benchmarks: time one way of running a campaign's trials in this process."""

from __future__ import annotations

from typing import Any, Callable


def time_mode(benchmark: Any, runner: Any, n_cells: int, per_cell: int, batch: int | None,
              same: Callable[[list], None], prefix: bool | None = None) -> list:
    """Run every cell's ``per_cell`` trials through ``runner.run_many`` with ``batch_trials = batch`` (once to build
    the batcher, probe the cells and cache prefixes, as a worker does once), check the rows with ``same(rows)``,
    then time three rounds; ``extra_info`` gets the trials, the best trials/s and B."""
    runner.campaign.evaluator.batch_trials = batch
    runner._batcher = False
    rows: list = []

    def run() -> None:
        rows[:] = [r for cid in range(n_cells) for r in runner.run_many(cid, range(per_cell))]

    run()
    if prefix is not None and runner._batcher:
        runner._batcher.prefix = prefix
        run()
    same(rows)
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["trials"] = len(rows)
    benchmark.extra_info["trials_per_s_best"] = len(rows) / benchmark.stats.stats.min
    benchmark.extra_info["batch"] = runner._batcher.batch if runner._batcher else 1
    return rows
