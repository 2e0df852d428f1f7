"""The in-process round loop: the server half (``engine.server``) and the client function
(``engine.client``, run by an executor), joined round by round."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from fedrift.algorithms.base import Algorithm
from fedrift.config import Config
from fedrift.engine.checkpoint import Checkpointer, Snapshot
from fedrift.engine.client import client_summary
from fedrift.engine.executors.base import Executor
from fedrift.engine.failures import train_clients
from fedrift.engine.federation import Federation
from fedrift.engine.outputs import RunWriter
from fedrift.engine.personalize import personalize
from fedrift.engine.server import LoopResult, Server
from fedrift.errors import ClusterLostError, DivergenceError
from fedrift.models.base import FedModel


def run_federation(
    cfg: Config,
    fed: Federation,
    model: FedModel,
    algorithm: Algorithm,
    executor: Executor,
    writer: RunWriter,
    checkpoints: Checkpointer | None = None,
    resume: Snapshot | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    started: float | None = None,
) -> LoopResult:
    """Rounds 1..``train.rounds`` (from ``resume.round + 1`` when given a checkpoint's
    snapshot), saving a checkpoint when ``checkpoints`` says one is due. ``on_round`` sees
    each evaluated round's metrics row once it is written (a tuner's pruner reads them; an
    exception it raises stops the run there, with the metrics so far kept). A stop (Ctrl-C,
    a lost cluster) saves the checkpoint of the last whole round first (``Server.keep_on_stop``).
    ``started``: the run's start (``time.perf_counter``), its summary's ``run_seconds`` count from it."""
    server = Server(cfg, fed, model, algorithm, writer, checkpoints, resume, on_round,
                    clients_build_teacher=getattr(executor, "builds_teacher", False),
                    reuse_uploads=getattr(executor, "one_client_at_a_time", False),
                    extra_state=getattr(executor, "checkpoint_state", None),
                    hands_over=getattr(executor, "hands_over", False), started=started)
    if resume is not None and resume.executor is not None and hasattr(executor, "restore_state"):
        # the executor that saved it (processes: its workers' teacher memos); one with equal
        # results that keeps none (engine/checkpoint.py EQUAL_EXECUTORS) computes those rows again
        executor.restore_state(resume.executor)
    try:
        for t in server.rounds():
            rnd = server.open(t)
            if rnd.needs_summaries:  # the pre-phase, in this process: summaries are cheap
                server.combine(rnd, [client_summary(rnd.tools, rnd.payload, job) for job in rnd.jobs])
            take = partial(server.take, rnd) if server.streams else None  # outputs folded as they come
            outputs, failed, diverged = train_clients(executor, rnd.tools, rnd.payload, rnd.jobs, t,
                                                      cfg.engine.accept_failures, take)
            server.close(rnd, outputs, failed, diverged=diverged)
            rnd = outputs = take = None  # this round's jobs and outputs: not held while the next one trains
        diverged_run = server.diverged_in_effect()
        if diverged_run is not None:  # every round ran, but some clients' training diverged
            raise diverged_run
    except DivergenceError as err:
        err.result = server.result(status=err.status, message=str(err))  # fedrift.api writes summary.json
        raise
    except ClusterLostError as err:  # stopped as at Ctrl-C: the checkpoint stays for --resume
        server.keep_on_stop()
        out = server.result(status=err.status, message=f"{err}; {server.interrupted()}{err.hint}")
        if checkpoints is not None:
            out.summary["checkpoint_round"] = checkpoints.last_round
        err.args = (out.summary["message"],)  # the one line the CLI prints
        err.result = out  # fedrift.api writes summary.json
        raise
    except KeyboardInterrupt as err:
        server.keep_on_stop()
        out = server.result(status="interrupted", message=server.interrupted())
        if checkpoints is not None:
            out.summary["checkpoint_round"] = checkpoints.last_round
        err.result = out  # type: ignore[attr-defined]  # fedrift.api writes summary.json
        raise
    else:
        if cfg.eval.personalize:  # reads the client states: before the store closes
            heads = getattr(model, "head_prefixes", ("fc",))
            server.out.personalization = personalize(cfg, algorithm, server.tools, executor, server.state, fed,
                                                     server.store, heads, server.panel)
    finally:
        server.release()
    return server.result()
