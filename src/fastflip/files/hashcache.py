"""A stat-keyed cache of files' hashes (sha256, or another :mod:`fastflip.files.hashing` algorithm, one entry
each), so that a checkpoint injected many times is hashed once.

Layer: ``files`` (imports only :mod:`fastflip.files.hashing`; imported by :mod:`fastflip.files.fileio` and
:mod:`fastflip.files.h5apply`).

A campaign or an experiment injects into the same epoch-E checkpoint again and again; every
injection logs the input's sha256, and hashing a 1 GiB input costs as much as copying it. An
entry records a file's sha256 under its identity and state as ``stat`` gives them — device,
inode, size, modification and *change* time in nanoseconds — the rule git's index uses. Any
write to the file moves its mtime and ctime, and ctime cannot be set back from user space, so a
changed file misses the cache. Like git, a file whose mtime or ctime is within :data:`RACY_S`
seconds of the moment it was hashed is not cached (a write in the same clock tick would not move them).

Where it is sound, and where it is not used. A write through a shared writable memory map can
change a file without moving its mtime or ctime (the times move at the first write fault of a clean
page, not at later writes to the same dirty page; on tmpfs never), so the stat key alone can lie. An
entry is therefore only recorded, and only trusted, while

- the file is owned by the current user and writable by no one else (group/other write bits clear), and
- no process of this user maps it shared and writable (``/proc/<pid>/maps``: device and inode, or path;
  where ``/proc`` cannot be read the cache is not used).

A mapping opened after an entry was recorded moves the times at its first write, so it misses. Not
seen: a root process writing through a shared map of the user's file. And the cache is never used
where a file is about to change: an ``--in-place`` inject hashes the bytes it reads (its log is the
only way back to them; so does an in-place inject, replay or revert of a checkpoint directory for each shard
it replaces), and ``revert``/``replay`` hash the bytes they check and the bytes they produce
(:func:`fastflip.files.filebytes.sha256_file` with ``cache=False``). A copy-mode inject may take the
input's hash from the cache (the input stays, so a wrong entry could at worst make a later
revert/replay refuse, never accept).

The folder must be a real folder (not a symlink) owned by the current user and writable by no one
else; otherwise the cache is not used, with a one-line warning (once per process). New folders are made
with mode 0700; the default folder, if an earlier fastflip made it group-writable, is made private.

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
import stat
import tempfile
import threading
import time
import warnings
from typing import Any

from .hashing import check_digest

__all__ = ["ENV", "RACY_S", "cache_dir", "lookup", "prefetch", "remember", "same_state", "mapped_for_write"]

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


def _entry(d: str, st: os.stat_result, algorithm: str = "sha256") -> str:
    tag = "" if algorithm == "sha256" else "." + "".join(c for c in algorithm if c.isalnum() or c == "-")
    return os.path.join(d, f"{st.st_dev:x}-{st.st_ino:x}{tag}.json")


_WARNED: set[str] = set()


def _private(d: str, create: bool) -> str | None:
    """``d`` when it is a real folder of this user that no one else can write (made, mode 0700, when ``create``),
    else None (with a one-line warning once per folder and process)."""
    try:
        if create:
            os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return None
    why = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a folder" if not stat.S_ISDIR(st.st_mode)
           else "is owned by another user" if not hasattr(os, "getuid") or st.st_uid != os.getuid()
           else "is writable by other users" if st.st_mode & 0o022 else None)
    if why == "is writable by other users" and not os.environ.get(ENV, "").strip():
        try:  # the default folder, made by an earlier fastflip under a umask of 002: made private
            os.chmod(d, 0o700)
            why = None
        except OSError:
            pass
    if why is None:
        return d
    if d not in _WARNED:
        _WARNED.add(d)
        warnings.warn(f"fastflip: hash cache folder {d} {why}; not used (set {ENV} to a private folder, or off)",
                      stacklevel=3)
    return None


def mapped_for_write(path: str, st: os.stat_result) -> bool | None:
    """Whether a process of this user maps the file shared and writable (None: ``/proc`` cannot tell).

    Such a process can change the file without moving its mtime/ctime, so its cached hash is not trusted.

    >>> import os
    >>> mapped_for_write(__file__, os.stat(__file__))
    False
    """
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    if not pids:
        return None
    ino = str(st.st_ino).encode()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}".encode()
    real = os.fsencode(os.path.realpath(path))
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as fh:
                data = fh.read()
        except OSError:  # gone, or another user's process (which cannot write the user's private file)
            continue
        if ino not in data and real not in data:
            continue
        for line in data.splitlines():
            f = line.split(None, 5)
            if len(f) < 5 or b"w" not in f[1] or b"s" not in f[1]:
                continue
            if (f[4] == ino and f[3] == dev) or (len(f) == 6 and f[5].removesuffix(b" (deleted)") == real):
                return True
    return False


def _sound(path: str, st: os.stat_result) -> bool:
    """Whether the stat key can stand for this file's bytes (see the module docstring)."""
    if not hasattr(os, "getuid") or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return False
    return mapped_for_write(path, st) is False


_PREFETCHED: dict[tuple[str, str], tuple[dict[str, int], Any]] = {}  # (real path, algorithm) -> (key, future)
_PREFETCH_LOCK = threading.Lock()


def prefetch(path: str, algorithm: str = "sha256") -> None:
    """Start :func:`lookup` of ``path`` in a background thread; the next :func:`lookup` of the file in the same
    state takes its answer.

    The lookup's soundness check reads every process's ``/proc/<pid>/maps`` (10-30 ms on a busy machine,
    mostly in the kernel): started before a run reads the file's layout and plans its flips, it costs the run
    next to nothing. Best effort: a file that cannot be statted is left to the lookup itself.
    """
    try:
        st = os.stat(path)
    except OSError:
        return
    fut = _Prefetch(path, st, algorithm)
    with _PREFETCH_LOCK:
        _PREFETCHED[(os.path.realpath(path), algorithm)] = (_key(st), fut)
    try:
        fut.start()
    except RuntimeError:
        fut.run()


class _Prefetch(threading.Thread):
    """A :func:`_lookup` run in a thread; :meth:`result` waits for its answer (or raises its error)."""

    def __init__(self, path: str, st: os.stat_result, algorithm: str) -> None:
        super().__init__(name="fastflip-hashcache", daemon=True)
        self.args_ = (path, st, algorithm)
        self.done = threading.Event()
        self.value: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = _lookup(*self.args_)
        except BaseException as exc:  # handed to the lookup that takes it
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> str | None:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def lookup(path: str, st: os.stat_result, algorithm: str = "sha256") -> str | None:
    """The cached digest (``algorithm``, default sha256) of the file ``path`` whose ``stat`` is ``st``, or None
    (the answer of a :func:`prefetch` of the file in this same state, where one was started)."""
    with _PREFETCH_LOCK:
        key_fut = _PREFETCHED.pop((os.path.realpath(path), algorithm), None)
    if key_fut is not None and key_fut[0] == _key(st):
        return key_fut[1].result()
    return _lookup(path, st, algorithm)


def _lookup(path: str, st: os.stat_result, algorithm: str) -> str | None:
    d = cache_dir()
    if d is None or not os.path.isfile(path) or (d := _private(d, create=False)) is None:
        return None
    try:
        fd = os.open(_entry(d, st, algorithm), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, encoding="utf-8") as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != _key(st):
        return None
    digest = rec.get(algorithm)
    if not check_digest(algorithm, digest) or not _sound(path, st):
        return None
    return digest


def remember(path: str, st: os.stat_result, digest: str, hashed_at: float | None = None,
             algorithm: str = "sha256") -> bool:
    """Record ``digest`` as the ``algorithm`` digest (default sha256) of ``path`` in the state ``st`` (taken before it was read, and checked
    unchanged after); return whether it was recorded (not racy, sound, cache on and private)."""
    d = cache_dir()
    hashed_at = time.time() if hashed_at is None else hashed_at
    last_write = max(st.st_mtime_ns, st.st_ctime_ns) / 1e9  # ctime too: timestamps are coarse (a clock tick)
    if d is None or not os.path.isfile(path) or hashed_at - last_write < RACY_S or not _sound(path, st):
        return False
    if (d := _private(d, create=True)) is None:
        return False
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".entry-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"key": _key(st), algorithm: digest, "path": os.path.abspath(path)}, fh)
        os.replace(tmp, _entry(d, st, algorithm))
    except OSError:
        return False
    return True
