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
- A finite blow-up is a divergence too (:class:`DivergenceBound`): a client whose training
  loss or update norm is beyond ``engine.divergence_factor`` times the median of the run's
  first trained round (over its clients), or whose loss is beyond ``engine.divergence_loss``, stops the run as a
  non-finite loss does (``Server.close``); under ``engine.accept_failures`` it is left out and
  counted as diverged, as a non-finite loss is.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable

import torch

from fedrift.config import EngineConfig
from fedrift.functional import rng
from fedrift.engine.executors.base import Executor
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.functional.tree import all_finite
from fedrift.errors import FedriftError, first_line

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
    those of a one-client round; a line says so, since a vectorised round then loses its
    speed, in silence otherwise when the error was the round's own, such as a device's
    memory), and clients that raise or return a non-finite loss or upload are left out. A
    :class:`FedriftError` (bad input) is never a client failure.
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
    except Exception as err:
        if len(jobs) > 1:  # said: a vectorised round (or worker pool) retried one client at a time is slower
            log.warning(f"round {round_}: training its {len(jobs)} clients raised {first_line(err)}; "
                        "each client trains again alone")
        outputs = []
        for job in jobs:
            try:
                outputs += executor.run_round(tools, payload, [job], round_)
            except FedriftError:
                raise
            except Exception as own:
                failed.append(job.client_id)
                log.warning(f"round {round_}: client {job.client_id} failed and is left out ({type(own).__name__}: {own})")
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


def update_norm(upload: dict[str, Any], payload: dict[str, Any]) -> float | None:
    """``||w_k - w||``: the distance of the client's uploaded parameters from the broadcast
    ones (the floating-point entries both hold); None when the upload or the payload holds
    no ``params`` (an algorithm that uploads something else)."""
    new, old = upload.get("params"), payload.get("params")
    if not isinstance(new, dict) or not isinstance(old, dict):
        return None
    keys = [k for k, v in new.items() if (w := old.get(k)) is not None and v.is_floating_point() and v.shape == w.shape]
    if not keys:
        return 0.0
    # a few fused calls per client, not three per tensor (S1's 100 clients a round felt those):
    # a bound at many times the first round's size needs no float64 sum
    diffs = torch._foreach_sub([new[k] for k in keys], [old[k].to(new[k].device) for k in keys])
    return float(torch.stack(torch._foreach_norm(diffs)).norm())


class DivergenceBound:
    """When a finite client training counts as diverged (``engine.divergence_factor``,
    ``engine.divergence_loss``).

    The reference is the run's first trained round: the median over its clients of ``|loss|``
    (at least 1, so that a loss that starts near 0 makes no tiny bound) and of the update norm
    (:func:`update_norm`); the median, so that one client that blows up in round 1 does not
    set it. From that round on, a client whose ``|loss|`` or update norm is beyond ``factor``
    times the reference diverged, and from round 1 one whose ``|loss|`` is beyond
    ``loss_max``. The reference is kept in ``totals`` (saved with each checkpoint), so a
    resumed run judges as the uninterrupted one.

    Why relative to the run's own start: losses and update sizes differ by orders of magnitude
    between models, data and algorithms (FedGen's loss carries its generator's terms), while a
    blow-up is many orders beyond any of them: FedAdagrad on workload A (alpha 1.0, seed 1)
    went from client losses near 1.4 in round 1 to 1.4e17 in round 17, and ended at 11.8%
    accuracy, ``completed``.
    """

    KEY = "divergence_reference"

    def __init__(self, factor: float | None, loss_max: float | None, totals: dict[str, Any]) -> None:
        self.factor, self.loss_max, self.totals = factor, loss_max, totals

    @property
    def reference(self) -> dict[str, float] | None:
        return self.totals.get(self.KEY)

    def learn(self, outputs: list[ClientOutput], norms: dict[int, float | None]) -> None:
        """The reference, from the first round with a finite output (then never again)."""
        losses = [abs(float(o.loss)) for o in outputs if math.isfinite(float(o.loss))]
        if self.factor is None or self.reference is not None or not losses:
            return
        sizes = [n for o in outputs if (n := norms.get(o.client_id)) is not None and math.isfinite(n)]
        self.totals[self.KEY] = {"loss": max(1.0, median(losses)), "update": median(sizes) if sizes else 0.0}

    def judge(self, outputs: list[ClientOutput], norms: dict[int, float | None]) -> dict[int, str]:
        """Client id -> why its training diverged, for each finite loss or update beyond a
        bound (non-finite ones are the caller's, as before: a non-finite loss diverged whatever
        the bounds, a non-finite upload is a corrupt one)."""
        ref, out = self.reference, {}
        for o in outputs:
            loss, norm = float(o.loss), norms.get(o.client_id)
            if not math.isfinite(loss):
                continue
            if self.loss_max is not None and abs(loss) > self.loss_max:
                out[o.client_id] = f"had a training loss of {loss:.4g}, beyond engine.divergence_loss {self.loss_max:g}"
            elif self.factor is None or ref is None:
                continue
            elif abs(loss) > self.factor * ref["loss"]:
                out[o.client_id] = (f"had a training loss of {loss:.4g}, beyond engine.divergence_factor {self.factor:g} "
                                    f"times the run's first round's ({ref['loss']:.4g}, its clients' median)")
            elif norm is not None and math.isfinite(norm) and ref["update"] > 0 and norm > self.factor * ref["update"]:
                out[o.client_id] = (f"made an update of norm {norm:.4g}, beyond engine.divergence_factor {self.factor:g} "
                                    f"times the run's first round's ({ref['update']:.4g}, its clients' median)")
        return out
