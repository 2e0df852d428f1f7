"""Client failures and stragglers, as real federations have them.

Who drops out and who straggles is a pure function of (seed, round, client), like every
other draw (:mod:`fedrift.functional.rng`): a run with failures is as reproducible as one
without, on every executor, and a client's fate does not depend on who else was sampled.

- ``engine.dropout`` p: a sampled client receives the broadcast and never returns; the
  round aggregates the others with their weights renormalised.
- ``engine.stragglers`` s: a returning client completes only part of its local steps
  (``engine.straggler_work``, a share, or ``uniform``: a share drawn per client); its
  context's ``num_steps`` is the steps it ran, which FedNova, SCAFFOLD and FedADC read.
- ``engine.accept_failures`` (as Flower's): a client whose training raises, or whose loss or
  upload is not finite, is left out of the round with a warning. Without it the first such
  client stops the run (an error, or a divergence with the metrics kept).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from fedrift.config import EngineConfig
from fedrift.functional import rng
from fedrift.engine.executors.base import Executor
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.functional.tree import all_finite
from fedrift.errors import FedriftError

log = logging.getLogger("fedrift")


@dataclass(frozen=True)
class Fates:
    """The round's sampled clients split into those that never return and those that train;
    ``work[k]`` is the share of its local steps a straggler ``k`` runs."""

    returning: list[int]
    dropped: list[int]
    work: dict[int, float] = field(default_factory=dict)


def fates(engine: EngineConfig, seed: int, round_: int, sampled: list[int]) -> Fates:
    if not engine.dropout and not engine.stragglers:
        return Fates(list(sampled), [])
    returning, dropped, work = [], [], {}
    for k in sampled:
        if engine.dropout and rng.generator(seed, rng.DROPOUT, round_, k).random() < engine.dropout:
            dropped.append(k)
            continue
        returning.append(k)
        if engine.stragglers:
            g = rng.generator(seed, rng.STRAGGLERS, round_, k)
            if g.random() < engine.stragglers:
                work[k] = g.random() if engine.straggler_work == "uniform" else float(engine.straggler_work)
    return Fates(returning, dropped, work)


def steps_done(planned: int, work: float) -> int:
    """A straggler's local steps: its share of the planned ones, at least one."""
    return planned if work >= 1.0 else max(1, math.floor(work * planned))


def train_clients(
    executor: Executor, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int, accept: bool,
    take: Callable[[ClientOutput], None] | None = None,
) -> tuple[list[ClientOutput], list[int], list[int]]:
    """The round's outputs of the clients that returned, the ids of those that failed, and
    those of the failed whose training loss was not finite (their training diverged: the
    server ends such a run as diverged in effect, ``Server.diverged_in_effect``).

    With ``accept``, a round whose training raises is run again one client at a time (each
    client's work is a pure function of the payload and its job, so the others' results are
    those of a one-client round), and clients that raise or return a non-finite loss or
    upload are left out. A :class:`FedriftError` (bad input) is never a client failure.
    ``take`` (without ``accept``): handed each output as soon as it exists, by an executor
    that trains in this process (``hands_over``; ``Server.take``).
    """
    if not accept:
        if take is not None and getattr(executor, "hands_over", False):
            return executor.run_round(tools, payload, jobs, round_, take=take), [], []
        return executor.run_round(tools, payload, jobs, round_), [], []
    failed: list[int] = []
    try:
        outputs = executor.run_round(tools, payload, jobs, round_)
    except FedriftError:
        raise
    except Exception:
        outputs = []
        for job in jobs:
            try:
                outputs += executor.run_round(tools, payload, [job], round_)
            except FedriftError:
                raise
            except Exception as err:
                failed.append(job.client_id)
                log.warning(f"round {round_}: client {job.client_id} failed and is left out ({type(err).__name__}: {err})")
    kept, bad, diverged = screen(outputs, round_)
    return kept, sorted(failed + bad), diverged


def screen(outputs: list[ClientOutput], round_: int) -> tuple[list[ClientOutput], list[int], list[int]]:
    """Under ``engine.accept_failures``: the outputs with a finite loss and upload, the ids of
    the others (left out, with a warning), and those of them whose loss was not finite."""
    kept, failed, diverged = [], [], []
    for o in outputs:
        if bool(o.loss.isfinite()) and all_finite(o.upload):
            kept.append(o)
            continue
        failed.append(o.client_id)
        if not bool(o.loss.isfinite()):
            diverged.append(o.client_id)
        log.warning(f"round {round_}: client {o.client_id} returned a non-finite loss or update and is left out")
    return kept, failed, sorted(diverged)
