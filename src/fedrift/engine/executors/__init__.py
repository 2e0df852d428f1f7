"""Executors (registry ``EXECUTORS``): who runs the round's clients, with the same hooks."""

from __future__ import annotations

from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.registry import Registry

EXECUTORS: Registry = Registry("executor")
EXECUTORS.register("sequential", "one client after another; the reference the others are checked against")(
    SequentialExecutor
)
