"""Stopping a run that trains in a thread of its own: a stacked run's Ctrl-C.

A Ctrl-C raises ``KeyboardInterrupt`` in the main thread, wherever it is; a stacked run
(``engine.executor: stacked``: each run of the stack a thread) hears it through its stack's
flag, which the stack reads at each local step and meeting. Work of a run's own between its
steps that can be long (evaluating a large test set with a large model on a CPU) reads the
flag too, through :func:`check`, so that the run stops there as a run in the main thread would,
and writes its ``interrupted`` summary within the grace a ``--jobs`` pool gives it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_local = threading.local()


def check() -> None:
    """Raise ``KeyboardInterrupt`` where this thread's run was asked to stop (:func:`stopped_by`);
    once: the run's own stopping (its summary, its last writes) is not interrupted again."""
    stopped = getattr(_local, "stopped", None)
    if stopped is not None and stopped():
        _local.stopped = None
        raise KeyboardInterrupt


@contextmanager
def stopped_by(flag: Callable[[], bool]) -> Iterator[None]:
    """Within the block, :func:`check` in this thread stops the run once ``flag()`` is true."""
    _local.stopped = flag
    try:
        yield
    finally:
        _local.stopped = None
