"""Executors (registry ``EXECUTORS``): who runs the round's clients, with the same hooks.

A factory takes the engine section of the config and returns an object with
``run_round(tools, payload, jobs, round) -> list[ClientOutput]`` (outputs in job order).
"""

from __future__ import annotations

from fedrift.config import EngineConfig
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.registry import Registry

EXECUTORS: Registry = Registry("executor")


@EXECUTORS.register("sequential", "one client after another; the reference the others are checked against")
def sequential(engine: EngineConfig) -> SequentialExecutor:
    return SequentialExecutor()


@EXECUTORS.register("batched", "K clients per step in one torch.func.vmap call (engine.max_parallel_clients)")
def batched(engine: EngineConfig) -> BatchedExecutor:
    return BatchedExecutor(engine.max_parallel_clients)
