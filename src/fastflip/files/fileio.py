"""Safe file handling: atomic outputs and staged commits, input and output checks, fsync and writeback.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Outputs are written to a temporary file beside the target, flushed and fsync'ed,
then renamed over the target (and the directory fsync'ed); on any error the
temporary file is removed and the target is untouched. Hashing and copying a file's bytes, and byte-level undo
records, are in :mod:`fastflip.files.filebytes`; OS and reader errors mapped to one line in
:mod:`fastflip.files.oserrors`.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with atomic_output(os.path.join(d, "out.bin")) as tmp:
...     with open(tmp, "wb") as fh:
...         _ = fh.write(b"hello")
>>> sorted(os.listdir(d)), open(os.path.join(d, "out.bin"), "rb").read()
(['out.bin'], b'hello')
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import sys
import tempfile
import threading
from typing import Any, Iterator, Sequence

from ..errors import FastflipError, InputFileError, OutputError, one_line
from .oserrors import WRITE_ERRNOS, write_error
from .paths import sweep_stale, temp_prefix

__all__ = ["atomic_output", "staged", "Staging", "deferred_signals", "check_input", "check_output_dir", "fsync_path",
           "start_writeback", "release_later", "process_umask", "new_file_mode"]


def check_input(path: str | os.PathLike[str]) -> str:
    """Return ``path`` as a string if it is an existing readable regular file, else raise InputFileError."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputFileError(f"{p}: file not found; check the path")
    if not os.path.isfile(p):
        raise InputFileError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{p}: not readable; check its permissions")
    return p


def check_output_dir(path: str | os.PathLike[str]) -> str:
    """Raise OutputError unless the directory that will hold ``path`` exists and is writable."""
    p = os.fspath(path)
    d = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(d):
        raise OutputError(f"{p}: output directory {d} does not exist; create it first")
    if not os.access(d, os.W_OK):
        raise OutputError(f"{p}: output directory {d} is not writable; choose another output path")
    if os.path.isdir(p):
        raise OutputError(f"{p}: is a directory; give a file name")
    return p


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait
_WRITEBACK: list[Any] = []  # [libc's sync_file_range or None], looked up once


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` of the file ``fd`` to disk now, without
    waiting for them (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing).

    For a large output that will be fsynced: its blocks go to disk while the rest is still being copied, so
    the fsync at the commit (which still makes the file durable) waits for little. Best effort: a failure is
    ignored (the fsync reports what matters).
    """
    if not _WRITEBACK:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes  # already loaded with NumPy

                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _WRITEBACK.append(fn)
    fn = _WRITEBACK[0]
    if fn is not None and length > 0:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def fsync_path(path: str) -> None:
    """fsync a file or directory by path (directories: best effort)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def deferred_signals(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """A critical section in which SIGINT and SIGTERM are held back, then re-raised once it ends.

    Used around the renames that commit a run's files (the log, then the file it describes), so that
    Ctrl-C or a ``kill`` lands before or after the commit, never in the middle of it. Outside the main
    thread (where Python cannot install handlers) the section defers nothing. SIGKILL cannot be deferred:
    the order of the commit (evidence first) is what keeps a kill -9 safe.

    >>> import signal
    >>> got = []
    >>> old = signal.signal(signal.SIGTERM, lambda s, f: got.append("handled"))
    >>> with deferred_signals():
    ...     signal.raise_signal(signal.SIGTERM)  # held back until the section ends
    ...     got.append("committed")
    >>> got
    ['committed', 'handled']
    >>> _ = signal.signal(signal.SIGTERM, old)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        if signum not in held:
            held.append(signum)

    for s in signums:
        h = signal.getsignal(s)
        if h is None or h is signal.SIG_IGN:  # installed outside Python, or ignored: left as it is
            continue
        previous[s] = signal.signal(s, hold)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for s in held:  # ... and delivered to the handler that was there before, now that the commit is done
            signal.raise_signal(s)


class Staging:
    """Temporaries beside their targets, renamed into place together, *evidence first*.

    :meth:`add` makes a temporary for a target (``evidence=True``: a log that describes another
    target, committed before it), :meth:`add_dir` a temporary folder for a target folder (a checkpoint
    directory: an existing one is moved aside, replaced, then removed); :meth:`commit` fsyncs every
    temporary (``durable``), then, in one :func:`deferred_signals` section, renames the evidence and then
    the rest into place and fsyncs their folders; :meth:`abort` removes the temporaries. Used through
    :func:`staged`. If a rename fails part way, the evidence is taken back only while none of the files
    it describes has changed yet (after that, it is what reverts them).
    """

    def __init__(self, durable: bool = True) -> None:
        self.durable = durable
        self.items: list[tuple[str, str, bool]] = []  # (temporary, target, evidence)

    def add(self, target: str | os.PathLike[str], *, suffix: str = "", evidence: bool = False) -> str:
        """A fresh temporary path beside ``target`` that :meth:`commit` renames onto it."""
        target = check_output_dir(target)
        d = os.path.dirname(os.path.abspath(target))
        sweep_stale(d)  # temporaries a killed run left here
        try:
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp" + suffix, dir=d)
        except OSError as exc:
            raise write_error(target, exc) from None
        os.close(fd)
        self.items.append((tmp, target, evidence))
        return tmp

    def add_dir(self, target: str | os.PathLike[str]) -> str:
        """A fresh temporary folder beside the folder ``target`` that :meth:`commit` renames onto it (an existing
        ``target`` folder is replaced: the caller has checked that it may be)."""
        target = os.path.abspath(os.fspath(target))
        d = os.path.dirname(target)
        sweep_stale(d)
        try:
            tmp = tempfile.mkdtemp(prefix=temp_prefix(target), suffix=".tmp", dir=d)
        except OSError as exc:
            raise write_error(target, exc) from None
        self.items.append((tmp, target, False))
        return tmp

    def temp(self, target: str | os.PathLike[str]) -> str:
        """The temporary staged for ``target``."""
        real = os.fspath(target)
        for tmp, t, _ in self.items:
            if t == real:
                return tmp
        raise KeyError(real)

    def drop(self, tmp: str) -> None:
        """Remove the temporary ``tmp`` (from :meth:`add`) and forget it: its target is left as it is."""
        self.items = [i for i in self.items if i[0] != tmp]
        with contextlib.suppress(OSError):
            os.unlink(tmp)

    def commit(self) -> None:
        """fsync the temporaries, then rename them into place (evidence first) with signals deferred."""
        order = [i for i in self.items if i[2]] + [i for i in self.items if not i[2]]
        for tmp, target, _ in order:
            if self.durable:
                _fsync_tree(tmp)
            _copy_mode(tmp, target)
        backups = {tmp: _backup(tmp, target) for tmp, target, ev in order if ev and len(order) > 1}
        aside: list[str] = []  # replaced target folders, removed once the commit is done
        held = [fd for tmp, target, ev in order if not ev and (fd := _hold(target)) is not None]
        try:
            self._rename_all(order, backups, aside)
        finally:
            release_later(held)
        if aside:
            import shutil  # directory outputs replaced: rare

            for old in aside:
                shutil.rmtree(old, ignore_errors=True)
        self.items = []

    def _rename_all(self, order: list[tuple[str, str, bool]], backups: dict[str, str | None],
                    aside: list[str]) -> None:
        """The renames of :meth:`commit` (evidence first), in one :func:`deferred_signals` section."""
        with deferred_signals():
            done: list[str] = []
            try:
                for tmp, target, ev in order:
                    if os.path.isdir(tmp) and os.path.isdir(target) and not os.path.islink(target):
                        aside.append(tmp + ".old")
                        os.rename(target, aside[-1])
                        try:
                            os.rename(tmp, target)
                        except BaseException:
                            os.rename(aside.pop(), target)
                            raise
                    else:
                        os.replace(tmp, target)
                    done.append(tmp)
                    if self.durable:
                        fsync_path(os.path.dirname(os.path.abspath(target)))
            except BaseException:
                changed = any(tmp in done for tmp, _, ev in order if not ev)
                for tmp, target, ev in order:  # evidence of a change that did not happen: the earlier file again
                    if ev and tmp in done and not changed:
                        with contextlib.suppress(OSError):
                            if backups.get(tmp):
                                os.replace(backups.pop(tmp), target)
                            else:
                                os.unlink(target)
                raise
            finally:
                for bak in backups.values():
                    if bak:
                        with contextlib.suppress(OSError):
                            os.unlink(bak)

    def abort(self) -> None:
        for tmp, _, _ in self.items:
            if os.path.isdir(tmp) and not os.path.islink(tmp):
                import shutil  # a directory output failed: rare

                shutil.rmtree(tmp, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self.items = []


def _fsync_tree(path: str) -> None:
    """fsync a file, or a folder with every file and folder in it."""
    if os.path.isdir(path) and not os.path.islink(path):
        for d, _, files in os.walk(path):
            for f in files:
                fsync_path(os.path.join(d, f))
            fsync_path(d)
    else:
        fsync_path(path)


def _hold(target: str) -> int | None:
    """A read-only descriptor of the regular file ``target`` that a commit is about to replace (None: no such
    file, or it cannot be opened; not on Windows, where an open file cannot be replaced): while it is open, the
    rename does not free the old file's blocks."""
    if os.name != "posix":
        return None
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def release_later(fds: Sequence[int]) -> None:
    """Close ``fds`` (replaced files, from :func:`_hold`) in a background thread.

    The last close of a replaced file frees its blocks, which costs about as much as truncating it (0.02 s
    for 100 MB, 0.15-0.2 s for 800 MB on ext4): done beside the rest of the run (the directory fsync, the
    summary, the interpreter's exit) rather than inside the rename. The new file is committed and durable
    before this starts; nothing depends on the old blocks being free.
    """
    if not fds:
        return

    def close_all() -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    try:
        threading.Thread(target=close_all, name="fastflip-release", daemon=True).start()
    except RuntimeError:  # no thread now (interpreter shutting down): close here
        close_all()


def _backup(tmp: str, target: str) -> str | None:
    """A second name (beside ``tmp``, swept like it) for an existing ``target`` that a commit may have to put back."""
    if not os.path.isfile(target):
        return None
    bak = tmp + ".bak"
    try:
        os.link(target, bak)
    except OSError:
        try:
            import shutil  # a backup asked for

            shutil.copy2(target, bak)
        except OSError:
            return None
    return bak


def _copy_mode(tmp: str, target: str) -> None:
    """Give ``tmp`` the permission bits of the ``target`` it replaces (a new file or folder: the umask's)."""
    try:
        new = (0o777 & ~process_umask()) if os.path.isdir(tmp) else new_file_mode()
        os.chmod(tmp, os.stat(target).st_mode & 0o7777 if os.path.exists(target) else new)
    except OSError:
        pass


@contextlib.contextmanager
def staged(durable: bool = True, *, name: str | None = None) -> Iterator[Staging]:
    """A :class:`Staging` committed when the block ends cleanly and aborted (temporaries removed) otherwise.

    OS write failures (disk full, permissions...) become one-line :class:`OutputError` naming ``name``
    (default: the first target).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with staged() as st:
    ...     with open(st.add(os.path.join(d, "out.bin")), "wb") as fh:
    ...         _ = fh.write(b"data")
    ...     with open(st.add(os.path.join(d, "out.bin.fflog"), evidence=True), "wb") as fh:
    ...         _ = fh.write(b"log")  # renamed into place first
    >>> sorted(os.listdir(d))
    ['out.bin', 'out.bin.fflog']
    """
    st = Staging(durable)
    try:
        yield st
        st.commit()
    except BaseException as exc:
        targets = [t for _, t, _ in st.items]
        st.abort()
        if isinstance(exc, OSError) and not isinstance(exc, FastflipError):
            target = name or (targets[0] if targets else "output")
            d = os.path.dirname(os.path.abspath(target))
            if exc.errno is None and _full(d):  # h5py reports a failed write without errno
                exc = OSError(errno.ENOSPC, f"No space left on device ({one_line(exc)})")
            if exc.errno in WRITE_ERRNOS:
                raise write_error(target, exc) from None
        raise


@contextlib.contextmanager
def atomic_output(target: str | os.PathLike[str], *, suffix: str = "", durable: bool = True) -> Iterator[str]:
    """Yield a temporary path beside ``target``; on success fsync it and rename it onto ``target``.

    ``durable=False`` skips the fsyncs (the rename is still atomic: readers see the old
    or the new file, never a partial one) — for scratch files such as an experiment's
    per-run checkpoint copies, where a crash may lose them but never corrupt them.
    The rename runs with SIGINT/SIGTERM deferred (:func:`deferred_signals`).
    """
    target = check_output_dir(target)
    with staged(durable, name=target) as st:
        yield st.add(target, suffix=suffix)


def _full(directory: str) -> bool:
    """True when the file system holding ``directory`` has (almost) no free blocks left."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (64 << 10)


def process_umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux ``/proc``).

    Elsewhere it is read by setting and restoring it, which briefly changes it for every thread.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """Permission bits of a new regular file under the process's umask (as ``open(..., 'w')`` gives)."""
    return 0o666 & ~process_umask()
