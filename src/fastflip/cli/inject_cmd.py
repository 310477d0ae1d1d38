"""``fastflip inject FILE -o OUT``: flip bits in an HDF5 checkpoint and write a log.

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .jsonout import dumps

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .options import add_fault_arguments, add_selection_arguments

    p = subparsers.add_parser(
        "inject", help="flip bits in a checkpoint: HDF5, torch.save, safetensors, npy/npz, .keras, a Hugging Face "
        "directory (writes a new file or directory and a log)",
        description="Sample injection sites with a seed, change the stored words, write the result to a new "
        "file (atomically; the input is untouched unless --in-place) and a log that replays and reverts it.")
    p.add_argument("file", nargs="?", help="the checkpoint, format detected by content (or hdf5_file of --config); "
                   "a save_pretrained directory or its index file is one model")
    p.add_argument("-o", "--output", help="output file (a directory for a checkpoint directory)")
    p.add_argument("--in-place", action="store_true", help="change FILE itself (atomically; symlinks are followed "
                   "to the real file, which is locked against other writers)")
    p.add_argument("--direct", action="store_true",
                   help="with --in-place: rewrite only the changed bytes where they lie (no copy; raw storage, or "
                   "chunks/members re-encoded at their size), the log committed first; the log's evidence is the "
                   "touched byte ranges (old and new), the file size and a hash of its first and last MiB, so "
                   "the cost follows the flips (docs/log-format.md)")
    p.add_argument("--verify-file", action="store_true",
                   help="with --direct: also hash the whole file before and after (one read of it), so that "
                   "revert verifies every byte")
    p.add_argument("--evidence", choices=("file", "regions"),
                   help="what the log holds to verify revert and replay: file (whole-file hashes of the input and "
                   "output: every byte verified; the default, except with --direct) or regions (the touched byte "
                   "ranges, the size and a hash of the first and last MiB: no whole-file pass; a new file is then "
                   "copied in the kernel and only the touched bytes are written; the default with --direct)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--config", metavar="YAML", help="an hdf5_corrupter config, run with the older tool's sampling "
                   "and value rules (docs/oldtool.md)")
    p.add_argument("--design", choices=("oldtool", "fastflip"), default="oldtool",
                   help="with --config: oldtool (default: reproduce the older tool: a dataset uniformly, then an "
                   "element, with replacement; float_precision packing) or fastflip (elements uniform, without "
                   "replacement, stored words flipped exactly)")
    p.add_argument("--oldtool-sequence", action="store_true",
                   help="with --config and save_injection_sequence: write the sequence as the older tool did "
                   "(<injection_sequence_path>.json in the working directory, no indexes, entries under the first "
                   "matching location) instead of OUTPUT.sequence.json")
    p.add_argument("--log", metavar="PATH", help="log path (default OUTPUT.fflog)")
    p.add_argument("--no-log", action="store_true", help="write no log file")
    p.add_argument("--hash", metavar="ALGO", dest="hash_algorithm",
                   help="the log's integrity hash: blake3, xxh3-128 or sha256 (default: the fastest installed, "
                   "or FASTFLIP_HASH)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_selection_arguments(p)
    add_fault_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..core.spec import Sampling
    from ..errors import OptionError
    from ..files.inject import inject_file
    from ..files.select import selection_from_args

    kwargs: dict[str, Any] = {"selection": selection_from_args(args), "seed": args.seed}
    src = args.file
    if args.config:
        if args.direct or args.verify_file or args.hash_algorithm or args.evidence:
            raise OptionError("--direct, --verify-file, --evidence and --hash do not go with --config (the older "
                              "tool's run)")
        return _run_config(args, kwargs)
    if args.oldtool_sequence:
        raise OptionError("--oldtool-sequence writes the sequence file of an hdf5_corrupter config: add --config")
    if not src:
        raise OptionError("give the HDF5 file to inject into")
    kwargs["sampling"] = Sampling.from_cli(args)
    if args.hash_algorithm:
        kwargs["hash_algorithm"] = args.hash_algorithm
    if args.verify_file and not args.direct:
        raise OptionError("--verify-file goes with --in-place --direct (elsewhere whole-file hashes are the default: "
                          "--evidence file)")
    if args.verify_file and args.evidence == "regions":
        raise OptionError("--verify-file logs whole-file hashes, --evidence regions does not: give one of them")
    evidence = "file" if args.verify_file else args.evidence or ("regions" if args.direct else "file")
    if args.direct:
        if not args.in_place:
            raise OptionError("--direct changes the file itself: add --in-place")
        kwargs["atomic"] = False
    if evidence == "regions":
        kwargs["hash_files"] = "regions"
    if args.no_log:
        kwargs["log_path"] = False
    elif args.log:
        kwargs["log_path"] = args.log
    from ..files.inject import inject_checkpoint_file
    from ..files.archives import is_keras_archive

    from ..files.formats.hfdir import is_checkpoint_dir  # files.sharded only for a directory

    in_dir = is_checkpoint_dir(src)
    keras = not in_dir and is_keras_archive(src)
    if args.direct and (in_dir or keras):  # the library would write them through a copy (or keep no log)
        raise OptionError(f"{src}: --direct works on a single checkpoint file (a directory or .keras archive is "
                          "rewritten through a copy); drop --direct")
    if in_dir:  # a Hugging Face directory (or its index): every shard as one model
        if kwargs.pop("hash_algorithm", "sha256") != "sha256":
            raise OptionError("a checkpoint directory's log is hashed with sha256; drop --hash")
        from ..files.sharded import inject_dir

        res = inject_dir(src, args.output, in_place=args.in_place, overwrite=args.force, **kwargs)
    elif keras:  # alter the archive's model.weights.h5 and write a new, valid archive
        res = inject_checkpoint_file(src, args.output, in_place=args.in_place, overwrite=args.force, **kwargs)
    else:
        res = inject_file(src, args.output, in_place=args.in_place, overwrite=args.force, **kwargs)
    _print_summary(res, args.json, quiet=args.quiet)
    return 0


def _print_summary(res: Any, as_json: bool, extra: dict[str, Any] | None = None, quiet: bool = False) -> None:
    """The run's summary line (``--json``: as JSON, printed under ``-q`` too: it is what was asked for)."""
    if quiet and not as_json:
        return
    c = res.counts
    left = (res.log.manifest.get("plan") or {}).get("left_out")  # tensors without the named bit fields
    if as_json:
        print(dumps({"output": res.output, "log": res.log_path, "seed": res.log.manifest["seed"], **c,
                     **({"left_out": left} if left else {}), **(extra or {})}, indent=None))
    else:
        note = ""
        if left:
            names = ", ".join(left["tensors"][:3]) + (", ..." if len(left["tensors"]) > 3 else "")
            note = f"; left out {len(left['tensors'])} tensor(s) without {'/'.join(left['fields'])} ({names})"
        print(f"wrote {res.output}: changed {c['bits_changed']} bit(s) in {c['elements_changed']} element(s) "
              f"({c['sites']} site(s) touched in {c['tensors_hit']} tensor(s)); "
              f"NaN created {c['nan_created']}, Inf created {c['inf_created']}; seed {res.log.manifest['seed']}"
              + (f"; log {res.log_path}" if res.log_path else "") + note)
        if extra:
            print("; ".join(f"{k} {v}" for k, v in extra.items()))


def _run_config(args: argparse.Namespace, kwargs: dict[str, Any]) -> int:
    """``--config old.yaml``: the older tool's settings, run in the chosen design."""
    from ..compat.run import run_old_settings
    from ..errors import OptionError
    from ..compat.oldconfig import load_old_config, settings_from_config

    given = [f"--{k}" for k in ("count", "rate", "ber", "bits") if getattr(args, k) is not None]
    given += ["--model"] if args.model != "flip" else []
    if given:
        raise OptionError(f"--config sets what to flip; drop {', '.join(given)}")
    settings = settings_from_config(load_old_config(args.config), source=args.config)
    log: Any = False if args.no_log else args.log
    r = run_old_settings(settings, args.file, args.output, in_place=args.in_place, seed=kwargs["seed"],
                         design=args.design, log_path=log, selection=kwargs["selection"],
                         old_sequence="config" if args.oldtool_sequence else None)
    for w in r.warnings:
        print(f"fastflip inject: warning: {w}", file=sys.stderr)
    for n in [] if args.quiet else r.notes:
        print(f"fastflip inject: note: {n}", file=sys.stderr)
    extra = {} if r.run is None else {"attempts": r.run.attempts, "corrupted": r.run.corrupted,
                                      "unchanged": int(r.run.plan.meta["unchanged"])}
    if r.sequence_path:
        extra["sequence"] = r.sequence_path
    _print_summary(r.result, args.json, extra, quiet=args.quiet)
    return 0
