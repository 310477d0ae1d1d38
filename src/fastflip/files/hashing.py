"""The integrity hashes of logs: one registry of algorithms, the fastest available by default.

Layer: ``files`` (imports nothing of fastflip but :mod:`fastflip.errors`; imported by
:mod:`fastflip.files.fileio`, :mod:`fastflip.files.h5apply`, :mod:`fastflip.files.log` and above).

A log records, for its input and its output, the name of the algorithm and the hex digest
(``hash_algorithm``, ``hash``; a sha256 log also keeps the ``sha256`` field older readers know).
``revert`` and ``replay`` verify with the algorithm the log names, so a log written with sha256 is
still verified after a faster algorithm became the default. The algorithms:

``blake3``
    BLAKE3 (PyPI ``blake3``, the ``fasthash`` extra), multi-threaded (``max_threads=blake3.AUTO``):
    several GB/s, a fraction of the cost of copying the file.
``xxh3-128``
    XXH3 with a 128-bit digest (PyPI ``xxhash``): not cryptographic, but the log's hash guards
    against accidents (a wrong or damaged file), not against an attacker who can also rewrite the log.
``sha256``
    hashlib's, always available (about 1 GB/s on one core).

The default is the first of these whose package imports, unless ``FASTFLIP_HASH`` names one
(``sha256``, ``blake3``, ``xxh3-128``; ``auto`` = the default rule).

Examples
--------
>>> h = new("sha256"); h.update(b"abc"); h.hexdigest()[:16]
'ba7816bf8f01cfea'
>>> "sha256" in available()
True
>>> check_digest("sha256", "0" * 63)
False
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..errors import LogMismatchError, MissingExtraError, OptionError

__all__ = ["Hasher", "Algorithm", "ENV", "register", "unregister", "algorithm", "available", "default_algorithm",
           "new", "check_digest", "known", "file_entry", "logged_hash", "logged_hashes", "HashThread"]

ENV = "FASTFLIP_HASH"


class Hasher(Protocol):
    """What the registry's factories return: hashlib's streaming interface."""

    def update(self, data: Any, /) -> Any: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: its name, digest length in hex digits, the module it needs, its factory."""

    name: str
    hex_len: int
    module: str | None  # None: the standard library
    extra: str | None  # the fastflip extra that installs it
    factory: Callable[[], Hasher]


_FORKED = [False]  # set in a child made by os.fork(): blake3's thread pool does not survive a fork
os.register_at_fork(after_in_child=lambda: _FORKED.__setitem__(0, True))


def _blake3() -> Hasher:
    """A BLAKE3 hasher on all cores; on one thread in a forked child, where the parent's thread pool (its
    threads are not copied by fork) would leave a multi-threaded update waiting forever."""
    import blake3  # the documented API: blake3.blake3(max_threads=blake3.blake3.AUTO), update, hexdigest

    return blake3.blake3(max_threads=1 if _FORKED[0] else blake3.blake3.AUTO)


def _sha256() -> Hasher:
    import hashlib  # imported when a sha256 hasher is made (the default is the fastest installed algorithm)

    return hashlib.sha256()


def _xxh3_128() -> Hasher:
    import xxhash

    return xxhash.xxh3_128()


# order = preference: the first whose module imports is the default
_REGISTRY: dict[str, Algorithm] = {
    "blake3": Algorithm("blake3", 64, "blake3", "fasthash", _blake3),
    "xxh3-128": Algorithm("xxh3-128", 32, "xxhash", None, _xxh3_128),
    "sha256": Algorithm("sha256", 64, None, None, _sha256),
}
_IMPORTABLE: dict[str, bool] = {}


def register(alg: Algorithm, *, first: bool = False) -> None:
    """Add (or replace) an algorithm; ``first`` makes it the most preferred."""
    global _REGISTRY
    rest = {k: v for k, v in _REGISTRY.items() if k != alg.name}
    _REGISTRY = {alg.name: alg, **rest} if first else {**rest, alg.name: alg}
    _IMPORTABLE.pop(alg.name, None)


def unregister(name: str) -> None:
    """Remove an algorithm added by :func:`register` (sha256 stays)."""
    if name != "sha256":
        _REGISTRY.pop(name, None)
        _IMPORTABLE.pop(name, None)


def known() -> list[str]:
    """Every registered name, most preferred first."""
    return list(_REGISTRY)


def _importable(alg: Algorithm) -> bool:
    if alg.module is None:
        return True
    if alg.name not in _IMPORTABLE:
        try:
            __import__(alg.module)
            _IMPORTABLE[alg.name] = True
        except ImportError:
            _IMPORTABLE[alg.name] = False
    return _IMPORTABLE[alg.name]


def available() -> list[str]:
    """The registered algorithms whose package imports, most preferred first."""
    return [n for n, a in _REGISTRY.items() if _importable(a)]


def algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; one-line errors for an unknown name or a missing package."""
    alg = _REGISTRY.get(name)
    if alg is None:
        raise OptionError(f"unknown hash algorithm {name!r:.40}; use one of {', '.join(_REGISTRY)}")
    if not _importable(alg):
        how = f"pip install 'fastflip[{alg.extra}]'" if alg.extra else f"pip install {alg.module}"
        raise MissingExtraError(f"hash algorithm {name} needs the {alg.module} package; {how} "
                                "(or choose sha256)")
    return alg


def default_algorithm() -> str:
    """``FASTFLIP_HASH`` when set (and not ``auto``), else the most preferred available algorithm."""
    want = os.environ.get(ENV, "").strip().lower()
    if want and want != "auto":
        return algorithm(want).name
    return available()[0]


def new(name: str | None = None) -> Hasher:
    """A fresh hasher of ``name`` (default: :func:`default_algorithm`)."""
    return algorithm(name or default_algorithm()).factory()


def check_digest(name: str, digest: Any) -> bool:
    """Whether ``digest`` is a well-formed hex digest of the registered algorithm ``name``."""
    alg = _REGISTRY.get(name)
    return (alg is not None and isinstance(digest, str) and len(digest) == alg.hex_len
            and all(c in "0123456789abcdef" for c in digest))


def file_entry(path: str, digest: str | None, name: str, **more: Any) -> dict[str, Any]:
    """A log's ``input``/``output`` entry: the path, the algorithm's name and its digest (None: not hashed).

    A sha256 entry also keeps the ``sha256`` field older readers know (null for other algorithms).

    >>> file_entry("/x", "ab" * 8, "xxh3-128")
    {'path': '/x', 'hash_algorithm': 'xxh3-128', 'hash': 'abababababababab', 'sha256': None}
    """
    return {"path": path, "hash_algorithm": name, "hash": digest,
            "sha256": digest if name == "sha256" else None, **more}


def logged_hash(entry: Any) -> tuple[str, str | None]:
    """(algorithm, digest or None) of a log's ``input``/``output`` entry; a log without ``hash_algorithm``
    (written before the registry) holds sha256.

    >>> logged_hash({"sha256": "ab"}), logged_hash({"hash_algorithm": "blake3", "hash": None})
    (('sha256', 'ab'), ('blake3', None))
    """
    if not isinstance(entry, dict):
        return "sha256", None
    if "hash_algorithm" in entry:
        return str(entry["hash_algorithm"]), entry.get("hash")
    return "sha256", entry.get("sha256")


def logged_hashes(manifest: Any) -> tuple[str, str | None, str | None]:
    """(algorithm, input digest, output digest) of a log's manifest, for ``revert`` and ``replay``.

    The algorithm is checked to be available here (one line before anything is read); an output entry
    hashed with another algorithm than the input's is refused.

    >>> logged_hashes({"input": {"sha256": "ab"}, "output": {"sha256": "cd"}})
    ('sha256', 'ab', 'cd')

    Raises
    ------
    LogMismatchError
        The input and output entries name different algorithms.
    OptionError, MissingExtraError
        The algorithm is unknown, or its package is not installed.
    """
    m = manifest if isinstance(manifest, dict) else {}
    algo, want_in = logged_hash(m.get("input"))
    out_algo, want_out = logged_hash(m.get("output"))
    if want_out is not None and out_algo != algo:
        raise LogMismatchError(f"the log's input is hashed with {algo!r:.40} but its output with {out_algo!r:.40}; "
                               "give the log the injection wrote")
    algorithm(algo)
    return algo, want_in, want_out


class HashThread(threading.Thread):
    """A hasher updated on its own thread with the buffers handed to it, in the order they are handed: a second
    hash beside one the caller takes (each runs on its own core).

    >>> t = HashThread(new("sha256")); t.start(); t.wait(t.hand([b"a", b"bc"])); t.close(); t.h.hexdigest()[:16]
    'ba7816bf8f01cfea'
    """

    def __init__(self, h: Hasher) -> None:
        super().__init__(name="fastflip-hash", daemon=True)
        self.h = h
        self.error: BaseException | None = None
        self._todo: queue.SimpleQueue[tuple[Any, threading.Event]] = queue.SimpleQueue()

    def hand(self, pieces: Any) -> threading.Event:
        """Queue ``pieces`` (buffers) to be hashed; the event returned is set once they are (their buffers may
        then be reused)."""
        done = threading.Event()
        self._todo.put((pieces, done))
        return done

    def wait(self, done: threading.Event) -> None:
        """Wait for a hand-over (:meth:`hand`'s event); raise the error an update met, if any."""
        done.wait()
        if self.error is not None:
            raise self.error

    def close(self, check: bool = True) -> None:
        """Stop the thread once everything handed is hashed (again: nothing); ``check``: raise the error an update
        met."""
        if self.is_alive():
            self.hand(None).wait()
            self.join()
        if check and self.error is not None:
            raise self.error

    def run(self) -> None:
        while True:
            pieces, done = self._todo.get()
            try:
                if pieces is None:
                    return
                if self.error is None:
                    for chunk in pieces:
                        self.h.update(chunk)
            except BaseException as exc:  # handed to the caller at its next wait or close
                self.error = exc
            finally:
                done.set()
