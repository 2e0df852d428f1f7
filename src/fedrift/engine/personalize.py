"""Personalisation by classifier calibration (FedADC, papers/004 Fig. 7): each client fine-tunes
only the final linear layer of the global model on its own data, then is tested on its local
split.

The fine-tuning takes a *loss* from the run, never its update rule (ALGORITHMS.md, FedADC):

- ``eval.personalize_loss: ce``: cross-entropy; ``algorithm``: the algorithm's loss alone
  (``Algorithm.objective``, else its ``local_loss``) with what that loss reads: the broadcast,
  the client's stored state, ``client_start``, the teacher, the per-step noise and the
  pre-phase (FedCSD's prototypes, combined over the calibrated clients). ``eval.personalize_mu``
  adds ``mu/2 ||w - w_global||^2`` to either.
- The update is the train section's optimiser (``train.optimizer``: SGD with ``train.lr``, or
  ``eval.personalize_lr`` where set, ``momentum``, ``weight_decay`` applied once) for every
  algorithm: no ``grad_correction`` (SCAFFOLD's controls, FedADC's embedded server momentum),
  no optimiser of the algorithm's own.
- Only the classifier moves: the loss sees the body detached (no gradient, no backward pass
  through it) and the optimiser is handed the classifier's parameters only, so every other
  tensor of a personalised model equals the global model's, bit for bit. With
  ``eval.personalize_part: all`` (FedBABU's fine-tuning) the whole model moves, by the same
  loss and optimiser.

It runs through the same executor as training, as a round ``train.rounds + 1`` of the
calibrated clients (their batch schedules drawn as for that round).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from fedrift.algorithms.base import Algorithm, RoundInfo
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import squared_distance
from fedrift.config import Config
from fedrift.engine.client import client_summary
from fedrift.engine.executors.base import Executor
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.local import make_step
from fedrift.functional.optim import Transform, local_optimizer
from fedrift.engine.round_types import ClientJob, RoundTools
from fedrift.engine.state import ClientStateStore
from fedrift.engine.teacher import with_teacher
from fedrift.functional.tree import all_finite, stack
from fedrift.metrics.client_spread import ClientScores, client_spread
from fedrift.metrics.evaluate import outcomes

CHUNK = 64  # personal models trained at a time: bounded memory


def only(names: set[str], inner: Transform) -> Transform:
    """``inner`` on the parameters in ``names`` alone (its state covers only them); every other
    parameter is left as it is: untouched in place, and an update of ``-0.0`` otherwise (the
    additive identity of every float, ``-0.0`` included), so it keeps its bits."""

    def pick(tree: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in tree.items() if k in names}

    def update(grads, state, params):
        updates, state = inner.update(pick(grads), state, pick(params))
        return {k: updates[k] if k in names else torch.full_like(g, -0.0) for k, g in grads.items()}, state

    def apply_inplace(grads, state, params):
        return inner.apply_inplace(pick(grads), state, pick(params))  # the same tensors: moved in place

    return Transform(lambda p: inner.init(pick(p)), update, apply_inplace if inner.apply_inplace is not None else None)


def calibration(algorithm: Algorithm, loss: str, mu: float, head: set[str]) -> Algorithm:
    """The algorithm the fine-tuning runs: the loss (``ce``, or ``algorithm``: the algorithm's
    own and the hooks it reads) evaluated with the body detached, plus ``mu/2 ||w - w_t||^2``
    when ``mu`` > 0; no gradient correction, no optimiser (the caller gives the train section's)."""
    if loss == "algorithm":
        base = algorithm.objective or algorithm.local_loss
        a = algorithm
        hooks: dict[str, Any] = dict(broadcast=a.broadcast, client_summary=a.client_summary, pre_combine=a.pre_combine,
                                     client_start=a.client_start, teacher=a.teacher, noise_dim=a.noise_dim)
    else:
        base, hooks = ce_loss, {}

    def local_loss(params, batch, payload, ctx, apply):
        fixed = {k: (v if k in head else v.detach()) for k, v in params.items()}  # the body: a constant
        out = base(fixed, batch, payload, ctx, apply)
        if not mu:
            return out
        value, aux = out
        return value + 0.5 * mu * squared_distance(fixed, payload["params"]), aux

    return Algorithm(name=f"{algorithm.name} (personalize_loss {loss})", hparams=algorithm.hparams, local_loss=local_loss, **hooks)


def _with_prephase(cfg: Config, tools: RoundTools, payload: dict[str, Any], fed: Federation,
                   chunks: Callable[[], Iterator[list[ClientJob]]]) -> dict[str, Any]:
    """The payload with the algorithm's pre-phase (FedCSD's prototypes) combined over the
    calibrated clients, weighted as a round of them would be."""
    alg = tools.algorithm
    if alg.client_summary is None:
        return payload
    summaries, ids = [], []
    for jobs in chunks():
        chunk_tools = with_teacher(tools, payload, jobs, cfg.engine.teacher_cache)
        summaries += [client_summary(chunk_tools, payload, job) for job in jobs]
        ids += [job.client_id for job in jobs]
    n = torch.tensor([float(fed.sizes[k]) for k in ids], dtype=torch.float64)
    weights = torch.full_like(n, 1.0 / len(n)) if alg.hparams.aggregation == "uniform" else n / n.sum()
    return {**payload, **alg.pre_combine(payload, stack(summaries), weights.to(fed.device))}


def personalize(
    cfg: Config,
    algorithm: Algorithm,
    tools: RoundTools,
    executor: Executor,
    server: dict[str, Any],
    fed: Federation,
    store: ClientStateStore,
    head_prefixes: tuple[str, ...],
    clients: list[int],
) -> dict[str, Any]:
    """Fine-tune the classifier (``eval.personalize_part: all``: the whole model) of each of
    ``clients`` (the server's evaluation panel: every client up to ``eval.clients_sample``,
    else that many drawn by the seed) for
    ``eval.personalize_epochs`` with the loss of ``eval.personalize_loss`` (module docstring);
    test on their local splits, and on their validation samples where the run has a validation
    split (``personalized_val_accuracy``: what ``fedrift tune`` scores such a run on)."""
    ev, tc = cfg.eval, cfg.train
    head = {k for k in server["params"] if ev.personalize_part == "all" or k.split(".")[0] in head_prefixes}
    round_ = tc.rounds + 1  # batches drawn as for a round after the last one
    tuned_alg = calibration(algorithm, ev.personalize_loss, ev.personalize_mu, head)
    info = RoundInfo(round=round_, num_clients=fed.num_clients, sampled=tuple(clients))
    # from the global model itself: a broadcast may send another point to train from (FedACG's
    # look-ahead w_t + lam m), which is its update rule, not the model being calibrated
    payload = {**tuned_alg.broadcast(server, info), "params": server["params"]}
    opt = only(head, local_optimizer(tc, ev.personalize_lr))
    tuned = replace(tools, algorithm=tuned_alg, optimizer=opt, step=make_step(tuned_alg, tools.apply, opt, inplace=True),
                    rebuild=None)

    def chunks() -> Iterator[list[ClientJob]]:  # CHUNK clients' jobs (and stored states) at a time
        for start in range(0, len(clients), CHUNK):
            yield [client_job(fed, k, store.get(k), tc, cfg.seed, round_, epochs=ev.personalize_epochs)
                   for k in clients[start : start + CHUNK]]

    payload = _with_prephase(cfg, tuned, payload, fed, chunks)
    rows, counts, val = [], [], []  # per client: (samples, right answers per model) on its test split; on its val
    for jobs in chunks():
        chunk_tools = with_teacher(tuned, payload, jobs, cfg.engine.teacher_cache)
        for job, out in zip(jobs, executor.run_round(chunk_tools, payload, jobs, round_)):
            k = job.client_id
            n, right = _right(tools, fed.x_test, fed.y_test, fed.test_indices(k),
                              {"global_local_accuracy": server["params"], "personalized_accuracy": out.end_params})
            counts.append((n, right))
            rows.append({"client": k, **{key: c / n if n else 0.0 for key, c in right.items()},
                         "local_test_size": n, "diverged": not all_finite(out.end_params)})
            if len(fed.y_val):  # a validation split
                val.append(_right(tools, fed.x_val, fed.y_val, fed.val_positions(k),
                                  {"personalized_val_accuracy": out.end_params}))

    def spread(key: str, counts: list[tuple[int, dict[str, int]]], full: bool = True) -> dict[str, float]:
        """The mean over clients with samples, and (``full``) its spread."""
        n = torch.tensor([n for n, _ in counts], dtype=torch.int64)
        return client_spread(ClientScores(n, torch.tensor([c[key] for _, c in counts], dtype=torch.int64)), key, full)

    # a fine-tuning that diverged scores what its model predicts (non-finite logits: class 0), and is counted
    diverged = sum(r["diverged"] for r in rows)
    return {**spread("personalized_accuracy", counts), **spread("global_local_accuracy", counts),
            **(spread("personalized_val_accuracy", val, full=False) if val else {}),  # what tune scores
            "personalized_clients_diverged": diverged, "clients": rows}


def _right(tools: RoundTools, x: torch.Tensor, y: torch.Tensor, own: torch.Tensor,
           models: dict[str, dict[str, torch.Tensor]]) -> tuple[int, dict[str, int]]:
    """A client's samples (``own`` indexes x, y) and, per named model, how many it gets right."""
    xs, ys = x[own], y[own]
    return int(len(own)), {key: int(outcomes(tools.apply, params, xs, ys, tools.eval_batch)[0][""].sum())
                           for key, params in models.items()}
