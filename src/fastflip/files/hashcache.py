"""A stat-keyed cache of files' sha256, so that a checkpoint injected many times is hashed once.

Layer: ``files`` (imports nothing of fastflip; imported by :mod:`fastflip.files.fileio` and
:mod:`fastflip.files.h5apply`).

A campaign or an experiment injects into the same epoch-E checkpoint again and again; every
injection logs the input's sha256, and hashing a 1 GiB input costs as much as copying it. An
entry records a file's sha256 under its identity and state as ``stat`` gives them — device,
inode, size, modification and *change* time in nanoseconds — the rule git's index uses. Any
write to the file moves its mtime and ctime, and ctime cannot be set back from user space, so a
changed file misses the cache. Like git, a file whose mtime or ctime is within :data:`RACY_S`
seconds of the moment it was hashed is not cached (a write in the same clock tick would not move them).

A wrong entry could only make fastflip *refuse* (a log whose input hash is not the file's
makes ``revert``/``replay`` fail their sha256 check); it can never make it accept a file it
should not. Readers still hash what they write: only the hash of an unchanged input is reused.

Where: ``$FASTFLIP_HASH_CACHE`` if set (``off``, ``0`` or ``no`` turns the cache off), else
``$XDG_CACHE_HOME/fastflip/sha256`` (``~/.cache/fastflip/sha256``). One small JSON file per
file hashed; a cache that cannot be written is silently not used.

Examples
--------
>>> import os, tempfile, hashlib
>>> d = tempfile.mkdtemp()
>>> os.environ["FASTFLIP_HASH_CACHE"] = os.path.join(d, "cache")
>>> p = os.path.join(d, "ckpt.bin")
>>> with open(p, "wb") as fh:
...     _ = fh.write(b"weights")
>>> st = os.stat(p)
>>> lookup(p, st) is None
True
>>> remember(p, st, hashlib.sha256(b"weights").hexdigest())  # written a moment ago: "racy", not kept
False
>>> remember(p, st, hashlib.sha256(b"weights").hexdigest(), hashed_at=st.st_ctime_ns / 1e9 + 60)
True
>>> lookup(p, os.stat(p))[:12]
'9a129038d9a0'
>>> with open(p, "ab") as fh:  # any write moves size/mtime/ctime: a miss
...     _ = fh.write(b"!")
>>> lookup(p, os.stat(p)) is None
True
>>> del os.environ["FASTFLIP_HASH_CACHE"]
"""

from __future__ import annotations

import json
import os
import tempfile
import time

__all__ = ["ENV", "RACY_S", "cache_dir", "lookup", "remember", "same_state"]

ENV = "FASTFLIP_HASH_CACHE"
RACY_S = 2.0  # a file modified this close to the moment it was hashed is not cached
_OFF = {"0", "off", "no", "false"}


def cache_dir() -> str | None:
    """The cache's folder, or None when it is turned off (``FASTFLIP_HASH_CACHE=off``)."""
    v = os.environ.get(ENV, "").strip()
    if v.lower() in _OFF:
        return None
    if v:
        return v
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastflip", "sha256")


def _key(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def same_state(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two ``stat`` results show the same file in the same state (no write in between)."""
    return _key(a) == _key(b)


def _entry(d: str, st: os.stat_result) -> str:
    return os.path.join(d, f"{st.st_dev:x}-{st.st_ino:x}.json")


def lookup(path: str, st: os.stat_result) -> str | None:
    """The cached sha256 of the file ``path`` whose ``stat`` is ``st``, or None."""
    d = cache_dir()
    if d is None or not os.path.isfile(path):
        return None
    try:
        with open(_entry(d, st), encoding="utf-8") as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != _key(st):
        return None
    digest = rec.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def remember(path: str, st: os.stat_result, digest: str, hashed_at: float | None = None) -> bool:
    """Record ``digest`` as the sha256 of ``path`` in the state ``st`` (taken before it was read, and checked
    unchanged after); return whether it was recorded (not racy, cache on and writable)."""
    d = cache_dir()
    hashed_at = time.time() if hashed_at is None else hashed_at
    last_write = max(st.st_mtime_ns, st.st_ctime_ns) / 1e9  # ctime too: timestamps are coarse (a clock tick)
    if d is None or not os.path.isfile(path) or hashed_at - last_write < RACY_S:
        return False
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".entry-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"key": _key(st), "sha256": digest, "path": os.path.abspath(path)}, fh)
        os.replace(tmp, _entry(d, st))
    except OSError:
        return False
    return True
