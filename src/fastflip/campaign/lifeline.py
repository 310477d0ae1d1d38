"""Workers die with their sweep, and their temporaries with them.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

Imported by the executors (worker set-up), the trial runner (working copies) and the
sweep (clean-up at the end and at the next start).

* :func:`watch_parent` — run in each pool worker: on Linux ``prctl(PR_SET_PDEATHSIG)``
  asks the kernel to send SIGKILL when the sweep's process dies (even by SIGKILL; a
  SIGTERM there was seen to leave a worker deadlocked in its own Python-level handler,
  about one kill in ten under load — the kernel's SIGKILL needs no Python code), and
  a daemon thread polling ``os.getppid()`` ends the worker everywhere else, removing its
  temporaries first. Either way no worker or multiprocessing resource tracker is left
  blocked behind a killed sweep; a killed worker's folder is removed at the next start.
* :func:`make_workdir` — a worker's temporary folder in ``$TMPDIR``, named
  ``fastflip-trial-<host>-<sweep pid>-<worker pid>-XXXX`` so that its owners can be
  told from its name.
* :func:`remove_workdirs` — the sweep removes its own workers' folders when it ends
  (success, error, Ctrl-C, SIGTERM); :func:`sweep_leftovers` removes those of sweeps
  whose processes are all gone (a SIGKILL), at the next start.

Examples
--------
>>> import os
>>> d = make_workdir(owner=os.getpid())
>>> os.path.basename(d).startswith(f"fastflip-trial-{host_tag()}-{os.getpid()}-{os.getpid()}-")
True
>>> remove_workdirs(os.getpid()), os.path.exists(d)
(1, False)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

from .store_guard import pid_alive

__all__ = ["OWNER_ENV", "watch_parent", "make_workdir", "remove_workdirs", "sweep_leftovers", "host_tag"]

OWNER_ENV = "FASTFLIP_SWEEP_PID"  # set in pool workers: the pid of the sweep that owns them
_PREFIX = "fastflip-trial-"
_NAME = re.compile(r"^fastflip-trial-(?P<host>.+)-(?P<owner>\d+)-(?P<pid>\d+)-[a-z0-9_]+$")
_PR_SET_PDEATHSIG = 1


def host_tag() -> str:
    """This machine's name as it appears in temporary names (letters, digits, '.', '_')."""
    return re.sub(r"[^A-Za-z0-9._]", "_", os.uname().nodename) or "host"


def _owner() -> int:
    try:
        return int(os.environ.get(OWNER_ENV, ""))
    except ValueError:
        return os.getpid()


def make_workdir(owner: int | None = None) -> str:
    """A fresh temporary folder for this process's working copies (see the module docstring)."""
    owner = _owner() if owner is None else owner
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{host_tag()}-{owner}-{os.getpid()}-")


def _ours(owner: int | None = None) -> list[tuple[str, int, int]]:
    """(path, owner pid, worker pid) of this host's work folders in $TMPDIR (of ``owner`` if given)."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    host = host_tag()
    out = []
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        m = _NAME.match(name)
        if m is None or m["host"] != host:
            continue
        o, p = int(m["owner"]), int(m["pid"])
        if owner is None or o == owner:
            out.append((os.path.join(root, name), o, p))
    return out


def remove_workdirs(owner: int) -> int:
    """Remove the work folders of sweep ``owner``'s workers; return how many there were."""
    found = _ours(owner)
    for path, _, _ in found:
        shutil.rmtree(path, ignore_errors=True)
    return len(found)


def sweep_leftovers() -> int:
    """Remove work folders whose sweep and worker processes are both gone; return how many.

    A folder whose owner or worker pid is alive (or reused by a live process) is kept:
    never remove what a running sweep may use.
    """
    n = 0
    for path, owner, pid in _ours():
        if not pid_alive(owner) and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            n += 1
    return n


def _die(code: int = 143) -> None:
    remove_workdirs_of_this_process()
    os._exit(code)


def remove_workdirs_of_this_process() -> None:
    """Remove the work folders this process made (its pid in the name)."""
    me = os.getpid()
    for path, _, pid in _ours():
        if pid == me:
            shutil.rmtree(path, ignore_errors=True)


def _on_sigterm(signum: int, frame: object) -> None:
    _die(128 + signum)


def watch_parent(parent: int, poll: float = 0.5) -> None:
    """Make this worker exit (removing its temporaries) when ``parent`` (the sweep that started it) dies.

    ``parent`` comes from the sweep, not from ``os.getppid()`` here: a worker still
    starting when the sweep is killed would otherwise watch its new parent (init).
    """
    os.environ[OWNER_ENV] = str(parent)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # its folder: the next start removes it
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the thread below still watches
            pass
    if os.getppid() != parent:  # the parent died before the watch was set
        _die()

    def poll_parent() -> None:
        while True:
            time.sleep(poll)
            if os.getppid() != parent:
                _die()

    threading.Thread(target=poll_parent, name="fastflip-parent-watch", daemon=True).start()
