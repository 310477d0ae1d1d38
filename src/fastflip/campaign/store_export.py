"""Trials out of results stores: every trial to a CSV or Parquet file, and shard stores merged into a new one.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

An export writes the trials joined with their cells (columns :data:`EXPORT_COLUMNS`, outcomes by name)
atomically, never over the store itself and over an existing file only when asked; a merge
(:func:`merge_stores`) combines the stores of one campaign's shards, refusing sources that disagree.

Examples
--------
>>> import tempfile, os
>>> from fastflip.campaign.store import ResultStore, TrialRow
>>> d = tempfile.mkdtemp()
>>> parts = []
>>> for i in range(2):
...     st = ResultStore.create(os.path.join(d, f"s{i}.db"), {"name": "demo", "seed": 1},
...                             [{"key": "c0", "planned": 2}], shard=f"{i}/2")
...     _ = st.add_trials([TrialRow(0, i, 11 + i, None, 0, 1.0, 0.0, None, 0.01, f"w{i}")])
...     st.close(); parts.append(os.path.join(d, f"s{i}.db"))
>>> merge_stores(os.path.join(d, "all.db"), parts)
{'trials': 2, 'duplicates': 0}
>>> with ResultStore.open(os.path.join(d, "all.db")) as st:
...     export_csv(st, os.path.join(d, "all.csv"))
2
"""

from __future__ import annotations

import csv
import os
from typing import Any, Sequence

from ..errors import OutputError, StoreError
from ..files.fileio import atomic_output
from ..files.paths import resolve_output
from .store import ResultStore

__all__ = ["EXPORT_COLUMNS", "export_csv", "export_parquet", "merge_stores"]

EXPORT_COLUMNS = (
    "cell_id", "cell", "bits", "group", "flips", "fault", "epoch", "trial", "seed", "sites",
    "outcome", "numeric", "changed", "metric", "delta", "message", "duration", "worker",
)


def export_csv(store: ResultStore, out: str, *, overwrite: bool = False) -> int:
    """Write every trial of ``store`` (joined with its cell) to a CSV file, atomically; return the row count."""
    n = 0
    with _output(out, overwrite, store.path) as tmp:
        with open(tmp, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(EXPORT_COLUMNS)
            for rows in store.iter_trials():
                w.writerows(rows)
                n += len(rows)
    return n

def export_parquet(store: ResultStore, out: str, *, overwrite: bool = False) -> int:
    """Write every trial of ``store`` to a Parquet file (needs pyarrow), atomically; return the row count."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the extras
        raise OutputError("Parquet export needs pyarrow: pip install 'fastflip[parquet]'") from exc
    schema = pa.schema(
        [
            ("cell_id", pa.int32()), ("cell", pa.string()), ("bits", pa.string()), ("group", pa.string()),
            ("flips", pa.int32()), ("fault", pa.string()), ("epoch", pa.int32()), ("trial", pa.int64()),
            ("seed", pa.int64()), ("sites", pa.string()), ("outcome", pa.string()), ("numeric", pa.int8()),
            ("changed", pa.float64()), ("metric", pa.float64()),
            ("delta", pa.float64()), ("message", pa.string()), ("duration", pa.float64()), ("worker", pa.string()),
        ]
    )
    n = 0
    with _output(out, overwrite, store.path) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            for rows in store.iter_trials():
                cols = list(zip(*rows))
                writer.write_table(pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, schema)], schema=schema))
                n += len(rows)
            if n == 0:
                writer.write_table(schema.empty_table())
    return n


def _output(out: str, overwrite: bool, source: str) -> Any:
    """:func:`fastflip.files.fileio.atomic_output` for an export of store ``source``: never the store itself (nor a
    device, FIFO or directory), and an existing file only when asked (see :func:`fastflip.files.paths.resolve_output`)."""
    out = os.fspath(out)
    if os.path.exists(out) and not overwrite:
        raise OutputError(f"{out} exists; pass --force (overwrite=True) to replace it")
    return atomic_output(resolve_output(out, inputs=[source], overwrite=overwrite, what="export"))


def merge_stores(out: str, sources: Sequence[str]) -> dict[str, int]:
    """Combine shard stores of one campaign into a new store ``out``.

    All sources must hold the same campaign (same configuration hash and cells) and
    distinct shards of the same count. A trial present in two sources must agree on
    every stored result, else the merge is refused; agreeing duplicates are kept once.
    Returns ``{'trials': ..., 'duplicates': ...}``.
    """
    if not sources:
        raise StoreError("merge: give at least one source store")
    opened = [ResultStore.open(s) for s in sources]
    try:
        first = opened[0]
        cells = first.cells()
        shards = []
        for st in opened:
            if st.config_hash != first.config_hash:
                raise StoreError(f"merge: {st.path} holds another campaign than {first.path} (configuration differs)")
            if st.cells() != cells:
                raise StoreError(f"merge: {st.path} has other cells than {first.path}")
            shards.append(st.shard)
        named = [s for s in shards if s]
        if len(set(named)) != len(named):
            raise StoreError(f"merge: the same shard appears twice among the sources ({', '.join(sorted(named))})")
        counts = {s.split("/")[1] for s in named}
        if len(counts) > 1:
            raise StoreError(f"merge: shards of different counts ({', '.join(sorted(named))})")
        config = first.config
        hashes = first.input_hashes
        chash = first.config_hash
        dtypes = first.meta_value("cell_dtypes")
    finally:
        for st in opened:
            st.close()
    dst = ResultStore.create(out, config, cells, input_hashes=hashes, chash=chash)
    if dtypes is not None:
        dst.set_meta("cell_dtypes", dtypes)
    duplicates = 0
    try:
        conn = dst.conn
        for src in sources:
            conn.execute("ATTACH DATABASE ? AS src", (os.path.abspath(src),))
            try:
                conn.execute("BEGIN IMMEDIATE")
                conflict = conn.execute(
                    "SELECT s.cell_id, s.trial FROM src.trials s JOIN main.trials m USING (cell_id, trial) "
                    "WHERE s.outcome IS NOT m.outcome OR s.sites IS NOT m.sites OR s.metric IS NOT m.metric "
                    "OR s.numeric IS NOT m.numeric OR s.changed IS NOT m.changed "
                    "OR s.seed IS NOT m.seed LIMIT 1"
                ).fetchone()
                if conflict:
                    conn.execute("ROLLBACK")
                    raise StoreError(
                        f"merge: {src} disagrees with an earlier source on cell {conflict[0]} trial {conflict[1]}"
                    )
                duplicates += conn.execute(
                    "SELECT COUNT(*) FROM src.trials s JOIN main.trials m USING (cell_id, trial)"
                ).fetchone()[0]
                conn.execute("INSERT OR IGNORE INTO main.workers (label) SELECT label FROM src.workers")
                conn.execute(
                    "INSERT OR IGNORE INTO main.trials SELECT s.cell_id, s.trial, s.seed, s.sites, s.outcome, s.metric, "
                    "s.delta, s.message, s.duration, mw.worker_id, s.numeric, s.changed FROM src.trials s "
                    "LEFT JOIN src.workers sw ON sw.worker_id = s.worker LEFT JOIN main.workers mw ON mw.label = sw.label"
                )
                conn.execute("COMMIT")
            finally:
                conn.execute("DETACH DATABASE src")
        total = dst.n_trials()
    except BaseException:
        dst.close()
        for p in (out, out + "-wal", out + "-shm"):
            if os.path.exists(p):
                os.unlink(p)
        raise
    dst.close()
    return {"trials": total, "duplicates": duplicates}
