"""``fastflip diff A B``: which tensors, elements and bit positions differ between two checkpoints.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).

Exit status: 0 identical, 1 they differ, 2 error.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .jsonout import dumps

__all__ = ["add_parser", "run", "format_diff"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .options import add_selection_arguments

    p = subparsers.add_parser(
        "diff",
        help="compare two checkpoints bit by bit (HDF5, torch.save, safetensors, npy/npz)",
        description="Compare the stored words of every tensor (matched by path) of two HDF5 files: "
        "differing elements, histogram of flipped bit positions (bit 0 = LSB), largest absolute and "
        "relative change, new NaN/Inf. Exit 0 when identical, 1 when they differ, 2 on error.",
    )
    p.add_argument("a", help="reference file")
    p.add_argument("b", help="file to compare with the reference")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--all", action="store_true", help="list identical tensors too")
    p.add_argument("--oldtool", action="store_true",
                   help="also print what the older tool's comparator (hdf5_comparator.py -p) printed per dataset, "
                   "computed in the dataset's own dtype as it did: differing entries, their %%, Euclidean distance, "
                   "every relative difference |b-a|/a")
    p.add_argument("--locations", nargs="+", metavar="PREFIX",
                   help="with --oldtool: also sum the figures per location prefix, as its -l option did")
    add_selection_arguments(p)
    return p


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


def format_diff(result: Any, show_all: bool = False) -> str:
    """The readable report ``fastflip diff`` prints."""
    from .inspect_cmd import format_table

    rows = []
    for t in result.tensors:
        if t.identical and not show_all:
            continue
        if t.note:
            rows.append([t.path, t.dtype, str(t.size), "?", "-", t.note, "-", "-", "-", "-"])
            continue
        bits = " ".join(f"{b}:{n}" for b, n in list(t.bit_counts().items())[:8])
        more = len(t.bit_counts()) - 8
        bits += f" (+{more} more)" if more > 0 else ""
        pct = f"{100.0 * t.n_diff / t.size:.3g}%" if t.size else "-"
        rows.append([t.path, t.dtype, str(t.size), str(t.n_diff), pct, bits or "-", _fmt(t.max_abs),
                     _fmt(t.max_rel), str(t.new_nan), str(t.new_inf)])
    out = [f"a: {result.a}", f"b: {result.b}"]
    if rows:
        out.append(format_table(["path", "dtype", "elements", "differ", "%", "bits (pos:count)", "max abs",
                                 "max rel", "new NaN", "new Inf"], rows, right=[2, 3, 4, 6, 7, 8, 9]))
    out.extend(f"only in a: {p}" for p in result.only_a)
    out.extend(f"only in b: {p}" for p in result.only_b)
    tot = result.totals
    if result.identical:
        out.append(f"identical: {tot['tensors_compared']} tensors, {tot['elements_compared']} elements")
    else:
        hist = " ".join(f"{b}:{n}" for b, n in tot["bit_hist"].items()) or "-"
        out.append(
            f"differ: {tot['tensors_differing']} of {tot['tensors_compared']} tensors, "
            f"{tot['elements_differing']} of {tot['elements_compared']} elements; bits {hist}; "
            f"new NaN {tot['new_nan']}, new Inf {tot['new_inf']}; "
            f"only in a {tot['only_a']}, only in b {tot['only_b']}"
        )
    return "\n".join(out)


def _old_print(tabs: str, prefix: str, o: dict[str, Any], distance: str | None, diffs: list[str]) -> list[str]:
    """The lines of the older comparator's ``diff_print`` (with the blank line its ``print`` added)."""
    dist = "" if distance is None else " Euclidean distance: " + distance
    return [f"{tabs} {prefix} {o['diff_count']} diff count. Representing {o['diff_percent']!r}%. {dist}",
            f"{tabs} Actual diffs: [{', '.join(diffs)}]", ""]


def _under(result: Any, raw: str) -> tuple[str, list[Any]]:
    """A location prefix (with its leading ``/``) and the compared tensors under it."""
    p = "/" + raw.strip().lstrip("/")
    return p, [t for t in result.tensors if t.oldtool is not None and t.path.startswith(p)]


def _old_diffs(ts: list[Any]) -> list[str]:
    """Every relative difference of ``ts`` as the older tool printed it (each in its dataset's arithmetic)."""
    from ..files.oldcompare import old_str

    return [old_str(x, t.oldtool["arithmetic"]) for t in ts for x in t.oldtool["relative_diffs"]]


def format_oldtool(result: Any, prefixes: list[str] | None = None) -> str:
    """What ``hdf5_comparator.py -p`` printed (``fastflip diff --oldtool``): per dataset with differing entries
    its count, percentage, Euclidean distance and every relative difference ``|b-a|/a``, in the dataset's own
    arithmetic; then, with ``--locations``, its summary per location prefix."""
    from ..files.oldcompare import old_str

    out = ["the older tool's comparator (hdf5_comparator.py -p), in each dataset's own arithmetic:"]
    for t in result.tensors:
        o = t.oldtool
        if o is None or not o["diff_count"] or not o["entries"]:
            continue
        dist = None if len(t.shape) == 0 else old_str(o["euclidean_distance"], o["arithmetic"])
        out += _old_print("\t\t", f'Object: "{t.path}" has: ', o, dist, _old_diffs([t]))
    if len(out) == 1:
        out.append("no differing entries")
    for p, o in oldtool_summary(result, prefixes or []).items():
        if o["diff_count"]:
            diffs = _old_diffs(_under(result, p)[1])
            out += ["", f'--Summary of comparison for "{p}" ---'] + _old_print("\t", "", o, None, diffs)
    return "\n".join(out)


def oldtool_summary(result: Any, prefixes: list[str]) -> dict[str, dict[str, Any]]:
    """The older comparator's per-location summary: entries, differing entries and their % summed over the
    datasets whose path starts with each prefix (it printed no distance for a summary)."""
    out: dict[str, dict[str, Any]] = {}
    for raw in prefixes:
        p, under = _under(result, raw)
        ts = [t.oldtool for t in under]
        entries = sum(o["entries"] for o in ts)
        diff = sum(o["diff_count"] for o in ts)
        out[p] = {"datasets": len(ts), "entries": entries, "diff_count": diff,
                  "diff_percent": diff * 100 / entries if entries else 0.0,
                  "relative_diffs": [x for o in ts for x in o["relative_diffs"]]}
    return out


def run(args: argparse.Namespace) -> int:
    from ..files.diff import diff_files
    from ..files.select import selection_from_args

    sel = selection_from_args(args)
    result = diff_files(args.a, args.b, None if sel.is_all else sel, oldtool=args.oldtool)
    summary = oldtool_summary(result, args.locations) if args.oldtool and args.locations else None
    if args.json:
        d = result.as_dict()
        if summary is not None:
            d["oldtool_locations"] = summary
        print(dumps(d))
    else:
        print(format_diff(result, show_all=args.all))
        if args.oldtool:
            print(format_oldtool(result, args.locations))
    return 0 if result.identical else 1
