"""Runs of one config trained as one stack (``engine.executor: stacked``): at several seeds
and partitions, and at other values of the learning rate and the algorithm's tune-space options.

:func:`run_stacked` prepares every run (one copy of the dataset for all, on their device),
checks that they can share a step (the same config but for each run's own keys,
:data:`PER_RUN`: seed, partition, cohort, rounds, evaluation, output; and :func:`value_keys`,
whose values each run's step reads as its own: ``engine.step_values``; an algorithm that
stacks), then runs each in a thread of its own with its member of one
``RunStack`` as its executor (``fedrift.engine.executors.stacked``): each run writes its own
folder exactly as :func:`fedrift.run` does, its training stacked with the others'.

``fedrift compare`` uses it for a setting's seeds, for settings that differ only in those
keys (a sweep of ``partition.alpha``, of ``train.lr``), and for methods that train their
clients as FedAvg does, when the runs' ``engine.executor`` is ``stacked`` (or ``auto`` on a
GPU); ``fedrift tune`` for a study's trials (:func:`stacked_outcomes`, each trial with its own
pruning); ``engine.executor: batched`` (or any other) runs them one by one as before.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedrift import stopping
from fedrift.api import RunResult, prepare, resolved_yaml, run_prepared
from fedrift.engine.build import Prepared, cudnn_choice
from fedrift.engine.checkpoint import CheckpointError
from fedrift.engine.executors.stacked import RunStack
from fedrift.errors import ConfigError
from fedrift.report.table import flatten

# algorithms whose runs cannot share a local step, and why (refused by name, not run slowly)
UNSTACKABLE: dict[str, str] = {}
# keys that may differ between the runs of a stack: what a run is and which clients train
# when, not how a client's step trains (each run has its own partition, sampling and loop)
PER_RUN = ("seed", "output.", "partition.", "eval.", "train.rounds", "train.clients_per_round", "train.participation",
           "train.local_epochs", "train.local_steps", "engine.sampling", "engine.dropout", "engine.stragglers",
           "engine.straggler_work", "engine.divergence_", "engine.checkpoint_every")
# ... but for the partition keys the algorithms are built with (engine.build.Setup: the step of
# the stack is built with the first run's)
SHARED = ("partition.num_clients", "partition.holdout")


def _per_run(key: str) -> bool:
    return key.startswith(PER_RUN) and key not in SHARED


def wants_stack(doc: Mapping[str, Any]) -> bool:
    """Whether a run's config asks to be stacked with its setting's other seeds:
    ``engine.executor: stacked``, or ``auto`` where the run goes to a GPU (one run of a small
    model leaves it idle; :func:`fedrift.engine.executor_choice.choose_executor` decides
    for a run alone)."""
    import torch

    engine = doc.get("engine") or {}
    executor, device = engine.get("executor", "auto"), engine.get("device", "auto")
    if executor == "stacked":
        return True
    return executor == "auto" and device != "cpu" and torch.cuda.is_available() and doc.get("algorithm", {}).get(
        "name") not in UNSTACKABLE


def check_stackable(preps: Sequence[Prepared]) -> None:
    """Refuse, in one line, runs that cannot be one stack: another config than the first's in
    a key other than each run's own (:data:`PER_RUN`) and the values a step can take per run
    (:func:`value_keys`; other keys train with other steps; the algorithm and its options may
    differ too where every run's method trains its clients as FedAvg does,
    ``engine.step_values.fedavg_step``), or an algorithm in :data:`UNSTACKABLE`."""
    executor = preps[0].config.engine.executor
    if executor != "stacked":  # each run's config.yaml and summary say how it trained
        raise ConfigError(f"engine.executor: {executor} runs train one by one; allowed: stacked, for runs trained as one stack")
    names = list(dict.fromkeys(p.config.algorithm.name for p in preps))
    for name in names:
        if name in UNSTACKABLE:
            raise ConfigError(f"engine.executor: stacked cannot stack {name} ({UNSTACKABLE[name]}); "
                              f"allowed: batched or sequential with {name}")
    values = tuple(dict.fromkeys(k for name in names for k in value_keys(name)))
    first = _comparable(preps[0], values)
    fedavg: list[bool] = []  # whether every run's method trains its clients as FedAvg does: asked once, if needed
    for prep in preps[1:]:
        other = _comparable(prep, values)
        diff = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        if not diff:
            continue
        if not fedavg:
            fedavg.append(_fedavg_steps(preps))
        blocking = [k for k in diff if not k.startswith("algorithm.")] if fedavg[0] else diff
        if blocking:  # a key no stack of these methods may differ in, named first
            key = blocking[0]
            raise ConfigError(
                f"engine.executor: stacked runs share how a client trains; {key} differs ({first.get(key)!r} "
                f"and {other.get(key)!r}); allowed: runs that differ only in the seed, output.*, partition.* "
                "(not num_clients or holdout), eval.*, train.rounds, clients_per_round, participation, local_epochs, "
                f"local_steps, the engine's sampling, failures and checkpoints, and {', '.join(values)}; or methods "
                "that all train their clients as FedAvg does (FedAvgM, FedAdam, FedNova, ...)")


def _fedavg_steps(preps: Sequence[Prepared]) -> bool:
    """Whether every run's algorithm trains its clients as FedAvg does (built to be asked)."""
    from fedrift.api import build_run
    from fedrift.engine.step_values import fedavg_step

    return all(fedavg_step(build_run(p)[1]) for p in preps)


def value_keys(algorithm: str) -> tuple[str, ...]:
    """The config keys whose values may differ between the runs of a stack of ``algorithm``,
    each run's step reading its own (``engine.step_values``): ``train.lr`` and the options of
    the algorithm's tune space (``fedrift list`` shows it)."""
    from fedrift.algorithms import ALGORITHMS

    entry = ALGORITHMS.get(algorithm, "algorithm.name")
    return ("train.lr", *(f"algorithm.{k}" for k in (entry.space or {})))


def stack_key(flat: Mapping[str, Any], algorithm: str, fedavg_step: bool = False) -> tuple[Any, ...]:
    """What runs of ``algorithm`` (their resolved configs, flattened) must share to be one
    stack: every key but each run's own and :func:`value_keys`; with ``fedavg_step`` (the
    method trains its clients as FedAvg does) the algorithm and its options too, so that such
    methods stack together."""
    shared = _shared(flat, value_keys(algorithm))
    if fedavg_step:
        shared = {k: v for k, v in shared.items() if not k.startswith("algorithm.")}
    return tuple(sorted((k, repr(v)) for k, v in shared.items())) + (("fedavg step",) if fedavg_step else ())


def _shared(flat: Mapping[str, Any], values: tuple[str, ...]) -> dict[str, Any]:
    """The keys of a flattened config that a stack's runs share: all but each run's own and ``values``."""
    return {k: v for k, v in flat.items() if not _per_run(k) and k not in values}


def _comparable(prep: Prepared, values: tuple[str, ...]) -> dict[str, Any]:
    from fedrift import yamlio

    return _shared(flatten(yamlio.load(resolved_yaml(prep))), values)


def prepare_stack(configs: Sequence[Mapping[str, Any] | str | Path]) -> list[Prepared]:
    """Every run prepared (validated, its data partitioned) with one dataset shared, and checked
    to stack (:func:`check_stackable`)."""
    datasets: dict[Any, Any] = {}
    preps = [prepare(c, datasets=datasets) for c in configs]
    check_stackable(preps)
    return preps


def run_stacked(
    configs: Sequence[Mapping[str, Any] | str | Path], resume: Sequence[bool] | None = None,
) -> list[RunResult | BaseException]:
    """Run ``configs`` (one config at several seeds, or at other values of
    :func:`value_keys`, each with its own ``output.dir``) as one stack; per run its
    :class:`fedrift.api.RunResult`, or the exception that ended it (a divergence, a refusal in
    round 1, a bad checkpoint after which it ran again from round 1 ...: each run's own, as if
    it had run alone). ``resume[i]``: continue run i from its checkpoint (one that cannot be
    used is said and the run started again from round 1, as ``fedrift compare`` does). Ctrl-C
    stops every run as at Ctrl-C (each writes its ``interrupted`` summary) and is raised here
    once all have stopped."""
    results, stopped = stacked_outcomes(prepare_stack(configs), resume)
    if stopped:
        raise KeyboardInterrupt
    return results


def stacked_outcomes(
    preps: Sequence[Prepared], resume: Sequence[bool] | None = None,
    on_round: Sequence[Callable[[dict[str, Any]], None] | None] | None = None,
) -> tuple[list[RunResult | BaseException], bool]:
    """:func:`run_stacked` of prepared runs (:func:`prepare_stack`), each with its own
    ``on_round`` (as :func:`fedrift.run`'s: what it raises ends that run alone), and whether a
    Ctrl-C stopped them: then a run it stopped has ``KeyboardInterrupt`` for its outcome, and
    one that had ended before keeps its own (``fedrift tune`` records each trial as it ended)."""
    flags = list(resume) if resume is not None else [False] * len(preps)
    hooks = list(on_round) if on_round is not None else [None] * len(preps)
    engine = preps[0].config.engine
    stack = RunStack(len(preps), engine.max_parallel_clients, engine.cuda_graphs, engine.compile)
    out: list[RunResult | BaseException | None] = [None] * len(preps)
    ended = [threading.Event() for _ in preps]

    def one(i: int) -> None:
        member = stack.member(i)
        try:
            with stopping.stopped_by(lambda: stack.stopped):  # its evaluation hears a Ctrl-C too
                try:
                    out[i] = run_prepared(preps[i], resume=flags[i], executor=member, on_round=hooks[i])
                except CheckpointError as err:
                    note = f"checkpoint not used ({err}), ran again from round 1"
                    out[i] = run_prepared(preps[i], executor=member, on_round=hooks[i])
                    out[i].summary.setdefault("note", note)  # type: ignore[union-attr]
        except BaseException as err:  # noqa: BLE001 - the run's own ending, handed to the caller
            out[i] = err
        finally:
            stack.leave(i)
            ended[i].set()

    def wait_all() -> None:
        # polled with sleeps, not Thread.join: a Ctrl-C that lands in a join's lock wait can
        # mark that thread finished while it still runs (CPython 3.11's bpo-45274 handling),
        # and its run's outcome would be read before it has one
        while not all(e.is_set() for e in ended):
            time.sleep(0.05)

    stopped = False
    with cudnn_choice(preps[0].config):  # the runs' shared value, held until the last has ended
        for i in range(len(preps)):
            threading.Thread(target=one, args=(i,), name=f"fedrift-stack-{i}", daemon=True).start()
        try:
            wait_all()
        except KeyboardInterrupt:
            stopped = True
            stack.stop()  # every run stops at its next step and writes its interrupted summary
            wait_all()
    return [r if r is not None else RuntimeError("the run ended without a result") for r in out], stopped


def stack_results(configs: Sequence[Mapping[str, Any]], resume: Sequence[bool]) -> list[dict[str, Any]]:
    """:func:`run_stacked` for ``fedrift compare``: per run the result line a pool worker
    returns (``experiments.pool.execute_run``): a divergence is a result, not an error; any
    other error of a run is raised (the first, once all have ended)."""
    from fedrift.errors import DivergenceError
    from fedrift.experiments.pool import interruptible

    start = time.perf_counter()
    with interruptible():  # in a pool worker, the pool's stop is the stack's Ctrl-C: every run writes its summary
        results = run_stacked(configs, resume)
    seconds = time.perf_counter() - start
    lines = []
    for r in results:
        if isinstance(r, DivergenceError):
            lines.append({"status": r.status, "message": str(r), "seconds": seconds})
        elif isinstance(r, BaseException):
            raise r
        else:
            s = r.summary
            note = f"{s['note']}; " if s.get("note") else ""
            lines.append({"status": "completed", "final_accuracy": s.get("final_accuracy"),
                          "best_accuracy": s.get("best_accuracy"), "seconds": seconds,
                          "note": f"{note}stacked with {len(results) - 1} more, "})
    return lines


__all__ = ["UNSTACKABLE", "check_stackable", "prepare_stack", "run_stacked", "stack_key", "stack_results", "stacked_outcomes",
           "value_keys", "wants_stack"]
