"""Where trials run: in this process, a local process pool, or a Dask cluster.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

Every executor ships the same unit of work, :func:`fastflip.campaign.trials.run_chunk`
(a chunk of trials of one cell), and hands back futures; the sweep loop keeps a
bounded number in flight and streams finished rows to the single store writer.

* :class:`SerialExecutor` — runs chunks inline (tests, debugging, ``--workers 0``).
* :class:`LocalExecutor` — a ``spawn`` process pool (default: all cores); workers ignore
  SIGINT so that Ctrl-C reaches only the sweep, which then saves what finished, exit
  when the sweep's process dies (even by SIGKILL), and run one BLAS/OpenMP thread each
  (unless ``OMP_NUM_THREADS`` etc. say otherwise).
* :class:`DaskExecutor` — ``dask.distributed``: ``'local'`` starts a ``LocalCluster`` of
  worker processes, ``'tcp://host:port'`` connects to a running scheduler.

Examples
--------
>>> ex = SerialExecutor()
>>> f = ex.submit(pow, 2, 10)
>>> ex.wait([f], 0.1)[0] == [f] and f.result()
1024
>>> ex.close()
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import os
import signal
import sys
from typing import Any, Callable, Sequence

from ..errors import OptionError
from .lifeline import watch_parent

__all__ = ["SerialExecutor", "LocalExecutor", "DaskExecutor", "make_executor", "WorkerCrash"]


class WorkerCrash(RuntimeError):
    """A worker process died while running a chunk (segfault, out of memory, killed)."""


class SerialExecutor:
    """Run every chunk at once, in this process."""

    workers = 1
    name = "serial"

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            if isinstance(exc, KeyboardInterrupt):
                raise
            fut.set_exception(exc)
        return fut

    def wait(self, futures: Sequence[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        return list(futures), []

    def result(self, fut: Any) -> Any:
        return fut.result()

    def restart(self) -> None:
        pass

    def close(self, cancel: bool = False) -> None:
        pass


_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def _init_worker(single_threaded: bool, parent: int, gpus: Sequence[str] = (), counter: Any = None) -> None:
    """Pool worker set-up: Ctrl-C is the sweep's business; the worker dies with the sweep
    (:func:`fastflip.campaign.lifeline.watch_parent`); one BLAS/OpenMP thread per worker process;
    with ``gpus``, the worker sees one GPU of them (the next in turn) before anything imports CUDA."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent)
    if single_threaded:  # N processes x N threads would oversubscribe the cores
        for var in _THREAD_VARS:
            os.environ.setdefault(var, "1")
    if gpus:
        with counter.get_lock():
            k = counter.value
            counter.value += 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]


def sweep_gpus() -> list[str]:
    """The GPUs a sweep's workers share out, one worker each: when the target lives on CUDA.

    The target factory ran in the sweep's process before the workers start; if it put anything on a
    CUDA device (``torch.cuda.is_initialized()``), the visible devices (``CUDA_VISIBLE_DEVICES`` entries,
    else ``0 … count-1``) are returned; otherwise ``[]`` (CPU workers).

    >>> sweep_gpus() if "torch" not in __import__("sys").modules else []
    []
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    n = torch.cuda.device_count()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return (visible or [str(i) for i in range(n)])[:n]


def _calls_sweep(node: ast.AST) -> bool:
    """True when ``node`` runs a call named ``sweep`` (``sweep(...)``, ``campaign.sweep(...)``) outside a def."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return False
    if isinstance(node, ast.Call):
        f = node.func
        if (isinstance(f, ast.Name) and f.id == "sweep") or (isinstance(f, ast.Attribute) and f.attr == "sweep"):
            return True
    return any(_calls_sweep(child) for child in ast.iter_child_nodes(node))


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def check_main_guard(main_file: str | None = None) -> None:
    """Refuse to start worker processes from a script that calls ``sweep()`` at its top level.

    Workers start with ``spawn``: each imports the main script again, which would call ``sweep()`` again in
    every worker (and fail there, looking like a broken factory). One message, naming what to add.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); script = os.path.join(d, "run.py")
    >>> _ = open(script, "w").write("from fastflip.campaign import sweep\\nsweep(None, 'r.db')\\n")
    >>> check_main_guard(script)
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: ... if __name__ == "__main__": ...
    """
    if main_file is None:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file or not str(main_file).endswith(".py") or not os.path.isfile(main_file):
        return
    try:
        with open(main_file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=main_file)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return
    for stmt in tree.body:
        if not _is_main_guard(stmt) and _calls_sweep(stmt):
            raise OptionError(
                f"{main_file}:{stmt.lineno}: sweep() runs at the top level of the script, and every worker process "
                'imports the script again; put it under if __name__ == "__main__": (or use --workers 0)'
            )


class LocalExecutor:
    """A pool of ``workers`` processes (``spawn``: no state leaks from the parent)."""

    name = "local"

    def __init__(self, workers: int | None = None, gpus: Sequence[str] = ()) -> None:
        import multiprocessing

        self.gpus = list(gpus)
        self.workers = int(workers or len(self.gpus) or os.cpu_count() or 1)  # GPU targets: one worker per GPU
        if self.workers < 1:
            raise OptionError(f"--workers must be at least 1, got {workers}")
        check_main_guard()
        self._ctx = multiprocessing.get_context("spawn")
        self._counter = self._ctx.Value("i", 0)
        self._pool = self._new_pool()

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(self.workers, mp_context=self._ctx, initializer=_init_worker,
                                      initargs=(self.workers > 1, os.getpid(), self.gpus, self._counter))

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        return self._pool.submit(fn, *args)

    def wait(self, futures: Sequence[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        done, pending = cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return list(done), list(pending)

    def result(self, fut: Any) -> Any:
        try:
            return fut.result()
        except cf.process.BrokenProcessPool as exc:
            raise WorkerCrash(f"a worker process died ({exc})") from exc

    def restart(self) -> None:
        """Replace a broken pool (after a worker crash)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def close(self, cancel: bool = False) -> None:
        """Shut the pool down; with ``cancel`` stop the workers now (SIGTERM: they remove their
        temporaries) instead of letting them finish what they hold, and wait until they are gone."""
        if not cancel:
            self._pool.shutdown(wait=True)
            return
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():  # pragma: no cover - a worker stuck in C code that ignores SIGTERM
                proc.kill()
                proc.join(5)


class DaskExecutor:
    """Chunks as Dask tasks: ``address='local'`` starts a LocalCluster of ``workers`` processes."""

    name = "dask"

    def __init__(self, address: str = "local", workers: int | None = None, gpus: Sequence[str] = ()) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:  # pragma: no cover - extras
            raise OptionError("--dask needs dask.distributed: pip install 'fastflip[dask]'") from exc
        self._cluster = None
        if address == "local":
            check_main_guard()
            n = int(workers or os.cpu_count() or 1)
            cluster: Any = LocalCluster
            kw: dict[str, Any] = {}
            if gpus:
                try:  # one worker per GPU, each pinned to its own
                    from dask_cuda import LocalCUDACluster

                    cluster, kw = LocalCUDACluster, {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
                except ImportError:
                    pass
            self._cluster = cluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, **kw)
            self._client = Client(self._cluster)
        else:
            if not address.startswith(("tcp://", "tls://", "ucx://", "inproc://")):
                raise OptionError(f"--dask takes 'local' or a scheduler address like tcp://host:8786, got {address!r}")
            try:
                self._client = Client(address, timeout="30s")
            except OSError as exc:
                raise OptionError(f"cannot reach the Dask scheduler at {address}: {exc}") from exc
        self._min_workers = int(workers or 1)

    @property
    def workers(self) -> int:
        """Workers now connected (jobs of a batch system join over time)."""
        try:
            n = len(self._client.scheduler_info().get("workers", {}))
        except Exception:  # pragma: no cover - a scheduler going away shows up in the futures
            n = 0
        return max(1, n or self._min_workers)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        # pure=False: a chunk that failed on a lost worker is run again, never served from cache
        return self._client.submit(fn, *args, pure=False, retries=0)

    def wait(self, futures: Sequence[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        from distributed import wait
        from distributed.utils import TimeoutError as DaskTimeout

        if not futures:
            return [], []
        try:
            res = wait(list(futures), timeout=timeout, return_when="FIRST_COMPLETED")
        except (DaskTimeout, TimeoutError):
            return [], list(futures)
        return list(res.done), list(res.not_done)

    def result(self, fut: Any) -> Any:
        try:
            return fut.result()
        except Exception as exc:
            if type(exc).__name__ in ("KilledWorker", "CommClosedError"):
                raise WorkerCrash(f"a Dask worker died ({exc})") from exc
            raise

    def restart(self) -> None:
        pass

    def close(self, cancel: bool = False) -> None:
        try:
            self._client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()


def make_executor(kind: str = "local", *, workers: int | None = None, dask: str | None = None,
                  gpus: Sequence[str] = ()) -> Any:
    """``'serial'``, ``'local'`` or ``'dask'`` (with ``dask`` = 'local' or a scheduler address).

    ``gpus`` (:func:`sweep_gpus`): local workers default to one per GPU, each seeing its own; a Dask
    LocalCluster gets one worker per GPU (dask-cuda's ``LocalCUDACluster`` when installed, which pins
    each worker to its GPU).
    """
    if dask is not None:
        return DaskExecutor(dask, workers or (len(gpus) or None), gpus=gpus)
    if kind == "serial" or workers == 0:
        return SerialExecutor()
    if kind == "local":
        return LocalExecutor(workers, gpus=gpus)
    raise OptionError(f"unknown executor {kind!r}: choose serial, local or --dask")
