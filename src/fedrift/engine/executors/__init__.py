"""Executors (registry ``EXECUTORS``): who runs the round's clients, with the same hooks.

A factory takes the whole validated config and returns an object with
``run_round(tools, payload, jobs, round) -> list[ClientOutput]`` (outputs in job order) and
``close()`` (release workers; called once when the run ends, also on errors).
"""

from __future__ import annotations

from fedrift.config import Config
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.executors.processes import ProcessesExecutor
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.registry import Registry

EXECUTORS: Registry = Registry("executor")


@EXECUTORS.register("sequential", "one client after another; the reference the others are checked against")
def sequential(cfg: Config) -> SequentialExecutor:
    return SequentialExecutor()


@EXECUTORS.register("batched", "K clients per step in one torch.func.vmap call (engine.max_parallel_clients)")
def batched(cfg: Config) -> BatchedExecutor:
    return BatchedExecutor(cfg.engine.max_parallel_clients)


@EXECUTORS.register("processes", "clients spread over worker processes, one thread each (engine.workers)")
def processes(cfg: Config) -> ProcessesExecutor:
    return ProcessesExecutor(cfg)
