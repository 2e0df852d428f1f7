"""Stacked runs: several runs of one config (a compare's seeds) trained as one vectorised stack.

Each run keeps everything of its own (its server half, data partition, random streams,
client states, checkpoints and run folder) and runs the ordinary round loop
(``engine.loop``) in a thread of its own; what the runs share is their executor: a
:class:`RunStack` whose members (one per run) meet at each round's training. When every run
still running has handed over its round's jobs, the jobs of all of them are trained together,
each local step one ``torch.func.vmap`` call over clients x runs (the batched executor's
group, ``BatchedExecutor.train_group``, with each client given its own run's payload), and
each run gets its own outputs back. Everything else (broadcast, aggregation, evaluation,
metrics, checkpoints, failures, divergence) is each run's own, as if it had run alone.

What this buys: one step for the whole stack instead of one per run, so a GPU that one run
of a small model leaves idle (launch-bound) runs many at once; on a CPU it is what the tests
check against the runs done one by one.

Results equal each run done alone with the ``batched`` executor to float rounding (other
stack sizes run other kernels): tested in ``tests/engine/test_stacked_runs.py``. Reproducible
for the same set of runs: the stack's composition at each round depends only on which runs
are still running, and the runs are joined in a fixed order (their index), not by arrival.

Failures: a round whose stacked training raises is trained again run by run (each run's
round as the batched executor trains it alone), so the error, or a client failure under
``engine.accept_failures``, reaches the run it belongs to and no other; a warning line says
so (the round lost the stack's speed: an error of the stack's own, a device's memory, would
otherwise slow every round in silence). Ctrl-C (:meth:`RunStack.stop`): every run stops as
at Ctrl-C, at its next local step or meeting, and writes its ``interrupted`` summary,
resumable from its checkpoint.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from fedrift.engine.executors.batched import BatchedExecutor, Part, batch_width, payload_signature
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.engine.step_values import step_kind, values_of
from fedrift.errors import first_line

log = logging.getLogger("fedrift")


@dataclass
class _Request:
    """One run's round, waiting to be trained with the others'."""

    part: Part
    outputs: list[ClientOutput] | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class RunStack:
    """The meeting point of ``size`` runs' executors (see the module's docstring).
    ``max_parallel``: clients per vectorised group, over all runs (``engine.max_parallel_clients``;
    None: the batched executor's memory rule); ``cuda_graphs``: ``engine.cuda_graphs``;
    ``compiled``: ``engine.compile``."""

    size: int
    max_parallel: int | None = None
    cuda_graphs: Any = True  # engine.cuda_graphs (or a capture function: BatchedExecutor's graphs)
    compiled: bool = False  # engine.compile
    live: int = 0
    rounds_trained: int = 0  # meetings that trained more than one run at once (tests read it)
    rounds_alone: int = 0  # meetings whose stacked training raised, trained run by run instead
    _pending: dict[int, _Request] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopped: bool = False
    _engine: BatchedExecutor | None = None

    def __post_init__(self) -> None:
        self.live = self.size
        self._engine = BatchedExecutor(self.max_parallel, self.cuda_graphs, self.compiled)

    def member(self, index: int) -> "StackMember":
        """Run ``index``'s executor."""
        return StackMember(self, index)

    def leave(self, index: int) -> None:
        """Run ``index`` has ended (finished, diverged, failed): the others no longer wait for it."""
        with self._cond:
            self.live -= 1
            self._pending.pop(index, None)
            self._train_if_all_here()
            self._cond.notify_all()

    def stop(self) -> None:
        """Ctrl-C: every run stops at its next local step or meeting (``KeyboardInterrupt``).
        The flag is set without the lock: the run that trains a meeting's rounds holds it for
        all of their steps (it reads the flag at each), and the others read it each second of
        their wait; waking them at once where the lock is free only saves that second."""
        self._stopped = True
        if self._cond.acquire(blocking=False):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (each run's own work reads it: ``fedrift.stopping``)."""
        return self._stopped

    def _check_stop(self) -> None:
        if self._stopped:
            raise KeyboardInterrupt

    def train(self, index: int, part: Part) -> list[ClientOutput]:
        """Run ``index``'s round: waits for the other live runs' rounds, then all are trained
        together (by the last to arrive); returns this run's outputs in job order."""
        req = _Request(part)
        with self._cond:
            self._check_stop()
            self._pending[index] = req
            self._train_if_all_here()
            while not req.done:
                self._cond.wait(timeout=1.0)
                if self._stopped and not req.done:
                    self._pending.pop(index, None)
                    raise KeyboardInterrupt
        if req.error is not None:
            raise req.error
        assert req.outputs is not None
        return req.outputs

    def _train_if_all_here(self) -> None:
        """With the lock held: when every live run waits, train all their rounds and wake them."""
        if not self._pending or len(self._pending) < self.live:
            return
        requests = [self._pending.pop(i) for i in sorted(self._pending)]
        try:
            self._train_together(requests)
        except KeyboardInterrupt as err:  # stop() during the stack's steps: every run stops
            for r in requests:
                r.error = err
        except BaseException as err:  # noqa: BLE001 - retried run by run: each error reaches its own run
            # said when runs lose the stack's speed for the round (a systematic error, a device's
            # memory: every round, in silence otherwise); an error of one run's own reaches it below
            if len(requests) > 1:
                self.rounds_alone += 1
                rounds = "/".join(str(t) for t in sorted({r.part.round_ for r in requests}))
                log.warning(f"stacked runs: round {rounds}: training {len(requests)} runs together raised "
                            f"{first_line(err)}; this round trains each run alone")
            for r in requests:
                try:
                    r.outputs = self._engine.run_round(r.part.tools, r.part.payload, r.part.jobs, r.part.round_)
                except BaseException as own:  # noqa: BLE001 - handed to the run it belongs to
                    r.error = own
        for r in requests:
            r.done = True
        self._cond.notify_all()

    def _train_together(self, requests: list[_Request]) -> None:
        """The requests' clients in vectorised groups over runs. Runs share a step when they
        train the same algorithm with the same options but for its values
        (``engine.step_values``: the learning rate and the options of its tune space, which
        the step then reads client by client), or methods that all train their clients as
        FedAvg does, and their payloads have one form (a run that has finished its rounds may
        be personalising, ``eval.personalize``: another algorithm, while the others train)."""
        by_kind: dict[Any, list[_Request]] = {}
        for r in requests:
            by_kind.setdefault((step_kind(r.part.tools), payload_signature(r.part.payload)), []).append(r)
        engine = self._engine
        for same in by_kind.values():
            parts = [r.part for r in same]
            width = batch_width(parts)
            got: dict[tuple[int, int], ClientOutput] = {}
            values = None
            if parts[0].tools.rebuild is not None:
                values = [values_of(p.tools) for p in parts]
                if all(v == values[0] for v in values) and not engine.keeps_graphs(parts[0].tools):
                    values = None  # one step, as it is
            for group in engine.groups(parts):
                group_values = None if values is None else [values[n] for n, _ in group]
                trained = engine.train_group([g for _, g in group], width, stop=self._check_stop,
                                             step_tools=parts[0].tools, values=group_values)
                for (n, _), outs in zip(group, trained):
                    for out in outs:
                        got[(n, out.client_id)] = out
            if len(parts) > 1:
                self.rounds_trained += 1
            for n, r in enumerate(same):
                r.outputs = [got[(n, j.client_id)] for j in r.part.jobs]


class StackMember:
    """One run's executor in a :class:`RunStack`: ``run_round`` meets the other runs there."""

    hands_over = False  # outputs come back whole, after the stack's round

    def __init__(self, stack: RunStack, index: int) -> None:
        self.stack, self.index = stack, index

    def run_round(self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int) -> list[ClientOutput]:
        if not jobs:
            return []
        return self.stack.train(self.index, Part(tools, payload, jobs, round_))

    def close(self) -> None:
        """Nothing: the run's attempt has ended, and the caller says when the run has
        (``RunStack.leave``, once: a run whose checkpoint could not be used runs again with
        this member, and the others must go on waiting for it)."""
