"""``fastflip inspect FILE``: list the tensors of a checkpoint — HDF5, torch.save, safetensors, .npy/.npz —
(paths, dtypes, storage, roles).

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse

from .jsonout import dumps
from typing import Any, Sequence

__all__ = ["add_parser", "run", "format_layout", "human_bytes", "format_table"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .options import add_selection_arguments

    p = subparsers.add_parser(
        "inspect",
        help="list the tensors of a checkpoint (HDF5, torch.save, safetensors, npy/npz)",
        description="List every numeric dataset once (aliases merged) with dtype, shape, storage, "
        "framework role, and the datasets fastflip skips with the reason.",
    )
    p.add_argument("file", help="checkpoint file, format detected by content (opened read-only)")
    p.add_argument("--json", action="store_true", help="print the layout as JSON")
    add_selection_arguments(p)
    return p


def human_bytes(n: int) -> str:
    """``1536`` → ``'1.5 KiB'``.

    >>> human_bytes(10), human_bytes(1536), human_bytes(3 * 2**30)
    ('10 B', '1.5 KiB', '3.0 GiB')
    """
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1024 or unit == "TiB":
            break
    return f"{x:.1f} {unit}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Plain-text table with aligned columns (columns in ``right`` right-aligned).

    >>> print(format_table(["a", "n"], [["x", "1"], ["yy", "10"]], right=[1]))
    a    n
    x    1
    yy  10
    """
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    return "\n".join(line(r) for r in [header, *rows])


def _storage(t: Any, shard: str | None = None) -> str:
    if t.storage == "contiguous":
        return f"{shard or 'contiguous'}@{t.offset}"
    if t.storage in ("chunked", "filtered"):
        s = f"{t.storage}({','.join(str(c) for c in t.chunks)})"
        return s + (" " + "+".join(t.filters) if t.filters else "")
    return t.storage


def format_layout(layout: Any, tensors: Sequence[Any] | None = None) -> str:
    """The readable table ``fastflip inspect`` prints."""
    from ..files.packing import describe, detect_packing

    tensors = layout.tensors if tensors is None else tensors
    rows = []
    shard_of = getattr(layout, "shard_of", {})  # a checkpoint directory: the shard holding each tensor
    for t in tensors:
        role = (t.role or "") + (f" [{t.layer}]" if t.layer else "")
        others = [a for a in t.aliases if a != t.path]
        rows.append([t.path, t.format or t.dtype.str, "x".join(str(s) for s in t.shape) or "scalar", str(t.size),
                     _storage(t, shard_of.get(t.path)), str(t.nbytes), role, ",".join(others)])
    out = [f"{layout.file}: framework {layout.framework or 'unknown'}"
           + (f"; {len(layout.shards)} weight file(s)" if shard_of else "")
           + (f", index {layout.index}" if getattr(layout, "index", None) else "")]
    if rows:
        out.append(format_table(["path", "dtype", "shape", "elements", "storage", "bytes", "role [layer]",
                                 "aliases"], rows, right=[3, 5]))
    by_storage: dict[str, int] = {}
    for t in tensors:
        by_storage[t.storage] = by_storage.get(t.storage, 0) + 1
    nbytes = sum(t.nbytes for t in tensors)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(by_storage.items()))
    out.append(f"total: {len(tensors)} tensors, {sum(t.size for t in tensors)} elements, "
               f"{human_bytes(nbytes)} ({nbytes} bytes){'; ' + kinds if kinds else ''}")
    packed = detect_packing(tensors)
    if packed:  # GPTQ/AWQ int32 words: which logical element each bit belongs to
        out.append(f"packed integer weights ({len(packed)}; a site is a bit of a word, "
                   "fastflip.files.packing.packed_element names its element):")
        out.extend(f"  {describe(p)}" for p in packed)
    if layout.skipped:
        out.append(f"skipped {len(layout.skipped)} datasets:")
        out.extend(f"  {s.path}: {s.reason}" for s in layout.skipped)
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:

    import dataclasses

    from ..files.layout import read_layout
    from ..files.select import select, selection_from_args
    from ..files.packing import detect_packing

    from ..files.archives import is_keras_archive, read_archive

    if is_keras_archive(args.file):  # a Keras 3 archive: the tensors of its inner model.weights.h5
        with read_archive(args.file) as inner:
            layout = read_layout(inner)
        layout.file = f"{args.file} (model.weights.h5 inside the archive)"
    else:
        layout = read_layout(args.file, verify=True)  # a member np.load refuses is refused, not listed
    sel = selection_from_args(args)
    tensors = layout.tensors if sel.is_all else select(layout.tensors, sel)
    if args.json:
        shown = layout if sel.is_all else dataclasses.replace(layout, tensors=list(tensors))  # shards kept
        d = shown.as_dict()
        if not sel.is_all:
            d["selection"] = sel.as_dict()
        packed = detect_packing(tensors)
        if packed:
            d["packed"] = [{"path": p.path, "kind": p.kind, "packing": p.packing, "bits": p.bits} for p in packed]
        print(dumps(d))
    else:
        print(format_layout(layout, tensors))
    return 0
