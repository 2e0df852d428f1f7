"""Executors (registry ``EXECUTORS``, kept in ``engine.executor_choice``; the built-in ones
registered here): who runs the round's clients, with the same hooks.

A factory takes the whole validated config and returns an object with
``run_round(tools, payload, jobs, round) -> list[ClientOutput]`` (outputs in job order) and
``close()`` (release workers; called once when the run ends, also on errors).
"""

from __future__ import annotations

from fedrift.config import Config
from fedrift.engine.executor_choice import (  # noqa: F401 - their import path
    EXECUTORS, PROCESSES_MIN_RUN_SAMPLES, PROCESSES_MIN_SAMPLES, choose_executor,
)
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.executors.processes import ProcessesExecutor
from fedrift.engine.executors.sequential import SequentialExecutor


@EXECUTORS.register("sequential", "one client after another; the reference the others are checked against")
def sequential(cfg: Config) -> SequentialExecutor:
    return SequentialExecutor()


@EXECUTORS.register("batched", "K clients per step in one torch.func.vmap call (engine.max_parallel_clients)")
def batched(cfg: Config) -> BatchedExecutor:
    return BatchedExecutor(cfg.engine.max_parallel_clients, cfg.engine.cuda_graphs, cfg.engine.compile)


@EXECUTORS.register("processes", "clients spread over worker processes, one thread each (engine.workers)")
def processes(cfg: Config) -> ProcessesExecutor:
    return ProcessesExecutor(cfg)


@EXECUTORS.register("ray", "clients spread over Ray actors, on a local Ray or a cluster (engine.ray_address)")
def ray(cfg: Config):  # noqa: ANN201 - ray is an optional extra, imported on use
    from fedrift.engine.executors.ray_actors import RayExecutor

    return RayExecutor(cfg)


@EXECUTORS.register("auto", "the default: batched on a GPU (in fedrift compare and tune: runs stacked); processes for compute-bound models on CPUs; batched for small models with many clients")
def auto(cfg: Config) -> SequentialExecutor:  # pragma: no cover - api.run resolves auto first
    raise RuntimeError("engine.executor auto is resolved by fedrift.api before executors are built")


@EXECUTORS.register("stacked", "runs trained as one vmap stack: a compare's seeds, partitions, learning rates and tune-space values, a tune's trials (alone: batched)")
def stacked_runs(cfg: Config):  # noqa: ANN201 - a stack of one: this run's clients as the batched executor trains them
    from fedrift.engine.executors.stacked import RunStack

    return RunStack(1, cfg.engine.max_parallel_clients, cfg.engine.cuda_graphs, cfg.engine.compile).member(0)
