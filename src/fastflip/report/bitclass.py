"""Bit classes (sign / exponent / mantissa) of a campaign's cells and the metric drops per class.

Layer: ``report`` (may import experiment and below; imported by cli and the demo).

A results store records the dtype names of each cell's tensors (the ``cell_dtypes``
entry of its ``meta`` table, written when ``fastflip sweep`` creates the store). From
them the report knows, per condition, where the sign, exponent and mantissa fields
lie (:func:`fastflip.core.dtypes.word_type`), draws their boundaries on bit axes, and
groups the trials' metric drops (``delta`` = golden metric − faulty metric) by the
class of the bit they flipped (:func:`drop_table`). A condition whose cells mix
dtypes of different layouts, or a store made before dtypes were recorded, gets no
boundaries and no class (the report says so).

Examples
--------
>>> bit_fields("float32")["exponent"][:2], bit_fields("float32")["sign"]
((23, 24), (31,))
>>> bit_class(30, bit_fields("float32")), bit_class(3, bit_fields("float16")), bit_fields("int32")
('exponent', 'mantissa', None)
>>> class_spans(bit_fields("float16"))
[('mantissa', 0, 9), ('exponent', 10, 14), ('sign', 15, 15)]
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np

from ..campaign.store import ResultStore
from ..core.dtypes import word_type
from .campaign_data import _SITE_BIT_SQL

__all__ = ["BIT_CLASSES", "bit_fields", "bit_class", "class_spans", "cell_dtypes", "condition_fields", "drop_table",
           "DROP_FIELDS"]

BIT_CLASSES = ("sign", "exponent", "mantissa")
DROP_FIELDS = ("condition", "bit_class", "trials", "with_drop", "with_drop_rate", "mean_drop", "median_drop",
               "p90_drop", "max_drop", "nonfinite")


def bit_fields(dtype: str) -> dict[str, tuple[int, ...]] | None:
    """Bit positions of ``sign``, ``exponent`` and ``mantissa`` of a floating dtype (None otherwise)."""
    try:
        wt = word_type(dtype)
    except Exception:  # an unknown or unsupported name: no classes
        return None
    fields = getattr(wt, "fields", None) or {}
    if wt.kind != "f" or not all(k in fields for k in BIT_CLASSES):
        return None
    return {k: tuple(int(b) for b in fields[k]) for k in BIT_CLASSES}


def bit_class(bit: int, fields: dict[str, tuple[int, ...]] | None) -> str | None:
    """The class of bit position ``bit`` (None without fields or outside the word)."""
    if fields is None:
        return None
    for k in BIT_CLASSES:
        if bit in fields[k]:
            return k
    return None


def class_spans(fields: dict[str, tuple[int, ...]]) -> list[tuple[str, int, int]]:
    """``(class, lowest bit, highest bit)`` from the least significant class up."""
    spans = [(k, min(fields[k]), max(fields[k])) for k in BIT_CLASSES if fields[k]]
    return sorted(spans, key=lambda s: s[1])


def cell_dtypes(path: str) -> dict[str, list[str]]:
    """Cell key → dtype names of its tensors, as the store recorded them ({} for older stores)."""
    st = ResultStore.open(path, check=False)
    try:
        raw = st.meta_value("cell_dtypes")
    finally:
        st.close()
    try:
        got = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): [str(x) for x in v] for k, v in got.items()} if isinstance(got, dict) else {}


def condition_fields(data: Any) -> dict[str, dict[str, tuple[int, ...]] | None]:
    """Per condition of ``data`` (:class:`~fastflip.report.campaign_data.CampaignData`): the bit fields
    its cells share, or None (dtypes unknown, or layouts that differ). Read once per ``data``."""
    cached = getattr(data, "_condition_fields", None)
    if cached is not None:
        return cached
    dts = cell_dtypes(data.path)
    out: dict[str, dict[str, tuple[int, ...]] | None] = {}
    for cond in data.conditions:
        layouts = set()
        known = True
        for c in data.cells:
            if c["condition"] != cond:
                continue
            names = dts.get(c["key"])
            if not names:
                known = False
                break
            for n in names:
                f = bit_fields(n)
                layouts.add(None if f is None else tuple(sorted(f.items())))
        out[cond] = dict(layouts.pop()) if known and len(layouts) == 1 and None not in layouts else None
    try:
        data._condition_fields = out
    except AttributeError:  # pragma: no cover - a read-only stand-in: just recompute next time
        pass
    return out


def drop_table(data: Any) -> list[dict[str, Any]]:
    """Per condition and bit class: the distribution of metric drops of single-bit trials.

    Columns :data:`DROP_FIELDS`: trials with a recorded ``delta``, how many dropped
    (``delta > 0``) and their share, mean / median / 90th percentile / maximum of the
    finite drops, and ``nonfinite`` (NaN/Inf metric). Trials flipping several bits and
    conditions without known bit fields are left out.
    """
    values = drop_values(data)
    rows = []
    for (cond, cls), v in values.items():
        arr = np.asarray(v, dtype=np.float64)
        fin = arr[np.isfinite(arr)]
        rows.append({
            "condition": cond, "bit_class": cls, "trials": int(arr.size), "with_drop": int((fin > 0).sum()),
            "with_drop_rate": float((fin > 0).sum() / arr.size) if arr.size else math.nan,
            "mean_drop": float(fin.mean()) if fin.size else math.nan,
            "median_drop": float(np.median(fin)) if fin.size else math.nan,
            "p90_drop": float(np.quantile(fin, 0.9)) if fin.size else math.nan,
            "max_drop": float(fin.max()) if fin.size else math.nan, "nonfinite": int(arr.size - fin.size),
        })
    return rows


def drop_values(data: Any) -> dict[tuple[str, str], np.ndarray]:
    """(condition, bit class) → the ``delta`` of every single-bit trial with one recorded (classes in order).

    One SQL scan of the trials with a ``delta``; the result is kept on ``data`` for the
    table and the figure.
    """
    cached = getattr(data, "_drop_values", None)
    if cached is not None:
        return cached
    out = _drop_values(data)
    try:
        data._drop_values = out
    except AttributeError:  # pragma: no cover
        pass
    return out


def _drop_values(data: Any) -> dict[tuple[str, str], np.ndarray]:
    fields = condition_fields(data)
    cells = {c["cell_id"]: c for c in data.cells if fields.get(c["condition"]) is not None}
    if not cells:
        return {}
    conds = [c for c in data.conditions if fields.get(c) is not None]
    # per condition, a lookup table bit position -> class index (-1: none)
    table = np.full((len(conds), 129), -1, dtype=np.int64)
    for i, cond in enumerate(conds):
        for j, cls in enumerate(BIT_CLASSES):
            table[i, list(fields[cond][cls])] = j
    parts: list[np.ndarray] = []
    st = ResultStore.open(data.path, check=False)
    try:
        plain_ids = sorted(i for i, c in cells.items() if str(c["bits"] or "").isdigit())
        other_ids = sorted(i for i, c in cells.items() if not str(c["bits"] or "").isdigit())
        for ids, bit_sql in ((plain_ids, "-1"), (other_ids, f"COALESCE({_SITE_BIT_SQL}, -1)")):
            for start in range(0, len(ids), 500):  # plain-position cells need no string work per trial
                chunk = ",".join(str(i) for i in ids[start:start + 500])
                q = f"SELECT cell_id, {bit_sql} AS bit, delta FROM trials WHERE cell_id IN ({chunk}) AND delta IS NOT NULL"
                rows = st.conn.execute(q).fetchall()
                if rows:
                    parts.append(np.array(rows, dtype=np.float64))
    finally:
        st.close()
    if not parts:
        return {}
    arr = np.concatenate(parts)
    cid = arr[:, 0].astype(np.int64)
    bit = arr[:, 1].astype(np.int64)
    plain = np.full(int(cid.max()) + 1, -1, dtype=np.int64)  # a plain-position cell's bit
    cond_of = np.full(int(cid.max()) + 1, -1, dtype=np.int64)
    for c in cells.values():
        if c["cell_id"] <= cid.max():
            cond_of[c["cell_id"]] = conds.index(c["condition"])
            if str(c["bits"] or "").isdigit():
                plain[c["cell_id"]] = int(c["bits"])
    bit = np.where(bit < 0, plain[cid], bit)
    ci = cond_of[cid]
    ok = (bit >= 0) & (bit < table.shape[1]) & (ci >= 0)
    cls = np.full(len(bit), -1, dtype=np.int64)
    cls[ok] = table[ci[ok], bit[ok]]
    out: dict[tuple[str, str], np.ndarray] = {}
    for i, cond in enumerate(conds):
        for j, name in enumerate(BIT_CLASSES):
            v = arr[(ci == i) & (cls == j), 2]
            if v.size:
                out[(cond, name)] = v
    return out


def order_of(values: Sequence[str]) -> list[str]:
    """Bit classes in :data:`BIT_CLASSES` order (for tables and figures)."""
    return [c for c in BIT_CLASSES if c in values]
