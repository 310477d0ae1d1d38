"""Worker for the file fuzz test: reads cases (JSON lines) on stdin, runs the CLI in-process on a mutated
copy of a base file, and answers one JSON line per case (exit code, stderr, whether the input changed).

Run by ``tests/test_fuzz_files.py`` in a subprocess so that a hang or a crash of one case can be
detected (the parent kills and restarts it) without losing the speed of one import for many cases.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import resource
import sys


def mutate(data: bytes, rng: random.Random) -> bytes:
    """1-8 byte-level mutations: set a byte, flip a bit, zero a run, truncate, duplicate a slice."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if not b:
            break
        i = rng.randrange(len(b))
        if op < 0.35:
            b[i] = rng.randrange(256)
        elif op < 0.7:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.8:
            n = rng.randint(1, 16)
            b[i:i + n] = bytes(min(n, len(b) - i))
        elif op < 0.88:
            b[i:i + 8] = rng.choice([b"\xff" * 8, (2**62).to_bytes(8, "little"), (2**31).to_bytes(8, "little")])[
                :min(8, len(b) - i)]
        elif op < 0.94:
            del b[rng.randrange(len(b) // 2, len(b)):]
        else:
            j = rng.randrange(len(b))
            b[j:j] = b[i:i + rng.randint(1, 64)]
    return bytes(b)


def _sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def run_case(case: dict, work: str) -> dict:
    from fastflip.cli import main

    with open(case["base"], "rb") as fh:
        data = mutate(fh.read(), random.Random(case["seed"]))
    target = os.path.join(work, "in" + case["ext"])
    with open(target, "wb") as fh:
        fh.write(data)
    for name in os.listdir(work):  # outputs of the previous case
        if name.startswith("out"):
            os.unlink(os.path.join(work, name))
    before = _sha(target)
    argv = [a.replace("{in}", target).replace("{work}", work) for a in case["argv"]]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # anything escaping main() is a failure of the one error path
            import traceback

            rc = -1
            err.write("ESCAPED " + "".join(traceback.format_exception(exc)))
    return {"rc": rc, "stderr": err.getvalue(), "changed": _sha(target) != before}


def main() -> None:
    limit = int(os.environ.get("FUZZ_MEM_LIMIT", str(3 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a declared-size bomb is a MemoryError, not the OOM killer
    work = sys.argv[1]
    for line in sys.stdin:
        case = json.loads(line)
        res = run_case(case, work)
        sys.__stdout__.write(json.dumps(res) + "\n")
        sys.__stdout__.flush()


if __name__ == "__main__":
    main()
