"""Personalisation by classifier calibration (FedADC): each client fine-tunes only the
final linear layer of the global model on its own data, then is tested on its local split.

It runs through the same executor as training, with an optimiser whose updates are zero
outside the classifier, so a personalised model differs from the global one in ``fc`` only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedrift.algorithms.base import Algorithm, RoundInfo
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import squared_distance
from fedrift.config import Config
from fedrift.engine.executors.base import Executor, RoundTools
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.local import make_step
from fedrift.engine.optim import Transform, chain, sgd
from fedrift.engine.state import ClientStateStore
from fedrift.engine.teacher import with_teacher
from fedrift.metrics.evaluate import evaluate


def only(names: set[str]) -> Transform:
    """Zero the updates of every parameter not in ``names``."""

    def update(updates, state, params):
        return {k: (u if k in names else torch.zeros_like(u)) for k, u in updates.items()}, state

    return Transform(lambda p: (), update)


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
    """Fine-tune the classifier of each of ``clients`` (the server's evaluation panel: every
    client up to ``eval.clients_sample``, else that many drawn by the seed) for
    ``eval.personalize_epochs``; test on their local splits.

    ``eval.personalize_loss``: ``ce`` (plus ``eval.personalize_mu``/2 ||w - w_global||^2) or
    ``algorithm`` (the run's own local loss, e.g. FedADC+'s self-confidence distillation).
    """
    ev, tc = cfg.eval, cfg.train
    head = {k for k in server["params"] if k.split(".")[0] in head_prefixes}
    round_ = tc.rounds + 1  # batches drawn as for a round after the last one
    info = RoundInfo(round=round_, num_clients=fed.num_clients, sampled=tuple(clients))
    if ev.personalize_loss == "algorithm":
        tuned_alg = algorithm
        payload = algorithm.broadcast(server, info)
    else:
        mu = ev.personalize_mu

        def local_loss(params, batch, payload, ctx, apply):
            loss, aux = ce_loss(params, batch, payload, ctx, apply)
            return loss + 0.5 * mu * squared_distance(params, payload["params"]), aux

        tuned_alg = Algorithm(name="personalize", hparams=algorithm.hparams, local_loss=local_loss)
        payload = {"params": server["params"]}
    opt = chain(sgd(tc.lr, tc.momentum, tc.weight_decay, tc.clip_grad_norm), only(head))
    tuned = replace(tools, algorithm=tuned_alg, optimizer=opt, step=make_step(tuned_alg, tools.apply, opt, inplace=True))

    rows = []
    for start in range(0, len(clients), 64):  # bounded memory: 64 personal models at a time
        jobs = [client_job(fed, k, store.get(k), tc, cfg.seed, round_, epochs=ev.personalize_epochs)
                for k in clients[start : start + 64]]
        chunk_tools = with_teacher(tuned, payload, jobs, cfg.engine.teacher_cache)
        for job, out in zip(jobs, executor.run_round(chunk_tools, payload, jobs, round_)):
            local = fed.test_indices(job.client_id)
            xs, ys = fed.x_test[local], fed.y_test[local]
            glob = evaluate(tools.apply, server["params"], xs, ys, tools.eval_batch)["test_accuracy"]
            pers = evaluate(tools.apply, out.end_params, xs, ys, tools.eval_batch)["test_accuracy"]
            rows.append({"client": job.client_id, "global_local_accuracy": glob,
                         "personalized_accuracy": pers, "local_test_size": int(len(local))})
    return {
        "personalized_accuracy": float(np.mean([r["personalized_accuracy"] for r in rows])),
        "global_local_accuracy": float(np.mean([r["global_local_accuracy"] for r in rows])),
        "clients": rows,
    }
