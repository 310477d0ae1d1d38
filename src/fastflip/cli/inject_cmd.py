"""``fastflip inject FILE -o OUT``: flip bits in an HDF5 checkpoint and write a log."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run", "parse_distribution"]


def parse_distribution(text: str) -> Any:
    """``element`` / ``tensor`` / ``a=1,b=2`` / ``@file.json`` → the distribution argument."""
    if text in ("element", "tensor"):
        return text
    from ..errors import OptionError

    if text.startswith("@"):
        try:
            with open(text[1:]) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise OptionError(f"--distribution {text}: cannot read the weights file ({exc})") from None
        if not isinstance(data, dict):
            raise OptionError(f"--distribution {text}: the file must hold a JSON object of name: weight")
        return {str(k): float(v) for k, v in data.items()}
    out = {}
    for item in text.split(","):
        name, eq, w = item.rpartition("=")
        if not eq or not name:
            raise OptionError(f"--distribution: cannot read {item!r}; use element, tensor, name=w,... or @file.json")
        try:
            out[name if name.startswith("/") else "/" + name] = float(w)
        except ValueError:
            raise OptionError(f"--distribution: weight {w!r} is not a number") from None
    return out


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .options import add_fault_arguments, add_selection_arguments

    p = subparsers.add_parser(
        "inject", help="flip bits in an HDF5 checkpoint (writes a new file and a log)",
        description="Sample injection sites with a seed, change the stored words, write the result to a new "
        "file (atomically; the input is untouched unless --in-place) and a log that replays and reverts it.")
    p.add_argument("file", nargs="?", help="the HDF5 checkpoint (or hdf5_file of --config)")
    p.add_argument("-o", "--output", help="output file")
    p.add_argument("--in-place", action="store_true", help="change FILE itself (atomically)")
    p.add_argument("--config", metavar="YAML", help="an old hdf5_corrupter config (its keys are mapped faithfully)")
    p.add_argument("--log", metavar="PATH", help="log path (default OUTPUT.fflog)")
    p.add_argument("--no-log", action="store_true", help="write no log file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_selection_arguments(p)
    add_fault_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import OptionError
    from ..inject import inject_file
    from ..layout import read_layout
    from ..select import select, selection_from_args

    kwargs: dict[str, Any] = {
        "selection": selection_from_args(args), "bits": args.bits, "sign_first": args.sign_first,
        "model": args.model, "seed": args.seed, "distribution": parse_distribution(args.distribution),
        "replace": args.replace, "nan_policy": args.nan,
    }
    modes = {k: getattr(args, k) for k in ("count", "rate", "ber") if getattr(args, k) is not None}
    kwargs.update(modes or {"count": 1})
    src = args.file
    warnings: list[str] = []
    if args.config:
        from ..oldconfig import load_old_config, map_old_config

        cfg = load_old_config(args.config)
        src = src or cfg.get("hdf5_file")
        if not src:
            raise OptionError("no input file: give FILE or hdf5_file in the config")
        layout = read_layout(src)
        chosen = select(layout.tensors, kwargs["selection"])
        if kwargs["seed"] is None:
            import secrets

            kwargs["seed"] = secrets.randbits(63)
        mapped = map_old_config(cfg, [t.dtype.str for t in chosen], sum(t.size for t in chosen), kwargs["seed"])
        warnings = mapped.warnings
        for k in ("count", "rate", "ber"):
            kwargs.pop(k, None)
        if "selection" in mapped.kwargs and not kwargs["selection"].is_all:
            raise OptionError("the config names locations_to_corrupt; do not also give selection options")
        kwargs.update({k: v for k, v in mapped.kwargs.items() if v is not None or k == "bits"})
        kwargs["layout"] = layout
        kwargs["extra_manifest"] = {"old_config": {k: cfg[k] for k in cfg}, "old_config_attempts": mapped.attempts}
    if not src:
        raise OptionError("give the HDF5 file to inject into")
    if args.no_log:
        kwargs["log_path"] = False
    elif args.log:
        kwargs["log_path"] = args.log
    for w in warnings:
        print(f"fastflip inject: warning: {w}", file=sys.stderr)
    from ..keras_io import inject_checkpoint_file, is_keras_archive

    if is_keras_archive(src):  # alter the archive's model.weights.h5 and write a new, valid archive
        if args.config:
            raise OptionError("--config works on HDF5 files; for a .keras archive give the options directly")
        out = src if args.in_place else args.output
        if not out:
            raise OptionError("give an output path (-o OUT.keras); the input is only changed with --in-place")
        kwargs.setdefault("log_path", out + ".fflog")
        res = inject_checkpoint_file(src, out, **kwargs)
        res.output = out
    else:
        res = inject_file(src, args.output, in_place=args.in_place, **kwargs)
    c = res.counts
    if args.json:
        print(json.dumps({"output": res.output, "log": res.log_path, "seed": res.log.manifest["seed"], **c}))
    else:
        print(f"wrote {res.output}: {c['flips']} bit(s) in {c['sites']} element(s) of {c['tensors_hit']} tensor(s); "
              f"NaN created {c['nan_created']}, Inf created {c['inf_created']}; seed {res.log.manifest['seed']}"
              + (f"; log {res.log_path}" if res.log_path else ""))
    return 0
