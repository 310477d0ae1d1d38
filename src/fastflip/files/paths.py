"""Path safety for every command that writes: one place that decides whether a path may be written.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

Rules (applied by :func:`resolve_output` and :func:`check_run_paths`):

- an output, log or temporary is never an input of the same run, nor another output of it
  (``inject in.h5 -o o.h5 --log in.h5`` and ``--log o.h5`` are refused);
- only regular files are written: a directory, a device (``-o /dev/null``, even as root), a FIFO
  or a socket is refused, never replaced by a regular file;
- symbolic links are resolved: the real file is written (the link stays a link), so
  ``--in-place`` through a link changes the file it points to. A hard link is a second name of
  one file: the atomic rename gives the written name a new file and the other names keep the old one;
- an existing output is replaced only when asked (``--force`` on the command line; the Python
  API's ``overwrite`` parameter, default True there because scripts rewrite their scratch files).

Temporaries are named ``.<target>.fastflip-<pid>-<random>.tmp`` (files beside the target) or
``fastflip-<kind>-<pid>-<random>`` (folders in ``$TMPDIR``) so that :func:`sweep_stale` can remove
the ones a killed process left behind (its pid is gone) the next time fastflip writes there.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp(); a = os.path.join(d, "a.h5"); open(a, "w").close()
>>> resolve_output(os.path.join(d, "b.h5"), inputs=[a]) == os.path.join(os.path.realpath(d), "b.h5")
True
>>> resolve_output(a, inputs=[a])
Traceback (most recent call last):
...
fastflip.errors.OutputError: ...a.h5: the output is the input file; choose another path (or --in-place)
>>> resolve_output("/dev/null")
Traceback (most recent call last):
...
fastflip.errors.OutputError: /dev/null: not a regular file (a device, FIFO or socket); fastflip writes regular files only
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from typing import Iterable, Mapping

from ..errors import OutputError

__all__ = ["resolve_output", "check_run_paths", "temp_prefix", "make_temp_dir", "sweep_stale", "pid_alive",
           "is_fastflip_scratch"]

_TEMP_FILE = re.compile(r"^\..*\.fastflip-(\d+)-[A-Za-z0-9_]+\.tmp.*$")
_TEMP_DIR = re.compile(r"^fastflip-[a-z0-9]+-(\d+)-[A-Za-z0-9_]+$")
_LOCK_RECORD = re.compile(r"^\.fastflip-\d+-\d+\.lock$")


def _same(a: str, b: str) -> bool:
    """True when two paths name one file (same inode, or the same real path when one does not exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def resolve_output(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str]] = (),
                   others: Mapping[str, str | os.PathLike[str] | None] | None = None, overwrite: bool = True,
                   what: str = "output", in_place_of: str | None = None, hint: str | None = None) -> str:
    """Check that ``path`` may be written by this run; return its real path (symlinks resolved).

    Parameters
    ----------
    path : path
        The output (or log) to write.
    inputs : paths
        The run's inputs; the output must be none of them.
    others : mapping of label to path
        The run's other outputs (e.g. ``{"output": "o.h5"}`` for a log); the output must be none of them.
    overwrite : bool
        Replace an existing regular file (``--force``); otherwise an existing output is refused.
    what : str
        The name used in messages (``output``, ``log``).
    in_place_of : path, optional
        The input this output deliberately replaces (``--in-place``): allowed to be that input.
    hint : str, optional
        The fix named when the path is an input (default: another path, or ``--in-place`` for an output).

    Raises
    ------
    OutputError
        With one line naming the path and the fix.
    """
    p = os.fspath(path)
    if not p:
        raise OutputError(f"empty {what} path; give a file name")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{p}: cannot use as {what} ({exc.strerror or exc})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{p}: is a directory; give a file name for the {what}")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{p}: not a regular file (a device, FIFO or socket); fastflip writes regular files only")
    if p.endswith(os.sep):
        raise OutputError(f"{p}: names a directory; give a file name for the {what}")
    real = os.path.realpath(p)
    for src in inputs:
        s = os.fspath(src)
        if in_place_of is not None and _same(s, in_place_of):
            continue
        if _same(p, s):
            fix = hint or "choose another path" + (" (or --in-place)" if what == "output" else "")
            raise OutputError(f"{p}: the {what} is the input file; {fix}")
    for label, other in (others or {}).items():
        if other is not None and _same(p, os.fspath(other)):
            raise OutputError(f"{p}: the {what} is also the {label} of this run; give them different paths")
    if st is not None and not overwrite and not (in_place_of is not None and _same(p, in_place_of)):
        raise OutputError(f"{p}: {what} exists; use --force to replace it")
    d = os.path.dirname(real)
    if not os.path.isdir(d):
        raise OutputError(f"{p}: {what} directory {d} does not exist; create it first")
    if not os.access(d, os.W_OK):
        raise OutputError(f"{p}: {what} directory {d} is not writable; choose another path")
    return real


def check_run_paths(inputs: Iterable[str], outputs: Mapping[str, str | None], *, overwrite: bool = True,
                    in_place_of: str | None = None) -> dict[str, str]:
    """:func:`resolve_output` for every named output of one run against the inputs and each other.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); a = os.path.join(d, "a"); open(a, "w").close()
    >>> check_run_paths([a], {"output": os.path.join(d, "o"), "log": os.path.join(d, "o")})
    Traceback (most recent call last):
    ...
    fastflip.errors.OutputError: ...o: the log is also the output of this run; give them different paths
    """
    ins = [os.fspath(i) for i in inputs]
    done: dict[str, str] = {}
    for label, path in outputs.items():
        if path is None:
            continue
        done[label] = resolve_output(path, inputs=ins, others={k: v for k, v in outputs.items() if k != label and k in done},
                                     overwrite=overwrite if label == "output" else True, what=label,
                                     in_place_of=in_place_of if label == "output" else None)
    return done


def temp_prefix(base: str) -> str:
    """Prefix of a temporary file beside ``base``: ``.<name>.fastflip-<pid>-`` (suffix ``.tmp``)."""
    return f".{os.path.basename(base)}.fastflip-{os.getpid()}-"


def make_temp_dir(kind: str) -> str:
    """A private folder ``$TMPDIR/fastflip-<kind>-<pid>-<random>``; stale ones of dead pids are swept first."""
    sweep_stale(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"fastflip-{kind}-{os.getpid()}-")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine and is not a zombie.

    >>> pid_alive(os.getpid())
    True
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:  # a zombie is dead for our purpose
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_lock_record(path: str) -> list[str]:
    """Remove a writer-lock record (:mod:`fastflip.files.locks`) whose holder is gone."""
    import json

    try:
        with open(path) as fh:
            pid = int(json.load(fh)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if pid_alive(pid):
        return []
    try:
        os.unlink(path)
    except OSError:
        return []
    return [path]


def is_fastflip_scratch(name: str) -> bool:
    """True for a name fastflip gives its temporary files (``.<x>.fastflip-<pid>-<r>.tmp*``) and writer-lock
    records (``.fastflip-<dev>-<ino>.lock``): never part of a checkpoint, never copied with one.

    >>> is_fastflip_scratch(".model.safetensors.fastflip-12-ab.tmp"), is_fastflip_scratch(".fastflip-1-2.lock")
    (True, True)
    >>> is_fastflip_scratch("model.safetensors")
    False
    """
    return bool(_TEMP_FILE.match(name) or _LOCK_RECORD.match(name))


def sweep_stale(directory: str) -> list[str]:
    """Remove fastflip temporaries in ``directory`` whose creating process is gone; return what was removed.

    Only names fastflip makes are touched (``.<x>.fastflip-<pid>-<r>.tmp*`` files,
    ``fastflip-<kind>-<pid>-<r>`` folders and ``.fastflip-<dev>-<ino>.lock`` writer-lock records);
    a temporary of a live process is kept. On a
    file system shared between machines a pid names a process of this machine only.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    me = os.getpid()
    for name in names:
        m = _TEMP_FILE.match(name) or _TEMP_DIR.match(name)
        if m is None:
            if _LOCK_RECORD.match(name):
                removed += _sweep_lock_record(os.path.join(directory, name))
            continue
        pid = int(m.group(1))
        if pid == me or pid_alive(pid):
            continue
        full = os.path.join(directory, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
        except OSError:
            pass
    return removed
