"""The client half of a run: what one sampled client does with the server's payload.

Every executor (in this process, worker processes, Ray actors) and a deployed Flower client
call these functions; they differ only in how jobs reach them and outputs come back.
"""

from __future__ import annotations

from typing import Any

import torch

from fedrift.engine.local import optimizer_init
from fedrift.engine.profiling import labeller
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.errors import FedriftError


class HookError(RuntimeError):
    """A hook failed; the message names the hook, the round and the client."""


def train_client(tools: RoundTools, payload: dict[str, Any], job: ClientJob, round_: int) -> ClientOutput:
    """Client ``job.client_id``'s round: ``client_start``, its local steps over the job's batch
    schedule, ``client_end``, ``client_result``. A pure function of its arguments (every draw
    is keyed by seed, round, client and step), so whichever executor, process or device runs
    it gets the same output."""
    alg = tools.algorithm
    stage = "client_start"
    try:
        ctx = job.context()
        if alg.client_start is not None:
            with torch.no_grad():
                ctx.update(alg.client_start(payload, ctx, tools.client_data(job, payload), tools.apply))
        stage = "local_loss"
        # the client's own copy: the step may update it in place (RoundTools.step)
        params = {k: v.clone() for k, v in tools.start_params(payload, ctx).items()}
        opt_state = optimizer_init(tools.optimizer, params, tools.apply, alg.optimizer_start, ctx)
        loss_sum = torch.zeros((), device=params[next(iter(params))].device)
        aux_sum: dict[str, torch.Tensor] = {}
        label = labeller()
        for s, idx in enumerate(job.schedule):
            w = torch.full((idx.numel(),), 1.0 / idx.numel(), device=idx.device)
            n = idx.numel()
            with label("fedrift.batch"):
                batch = tools.batch(payload, idx, w, noise=tools.noise(round_, job.client_id, s, n),
                                    views=tools.views(round_, job.client_id, s, n), dp_noise=tools.dp_noise(round_, job.client_id, s))
            with label("fedrift.step"):
                params, opt_state, loss, aux = tools.step(params, opt_state, batch, payload, ctx)
            loss_sum = loss_sum + loss
            for k, v in aux.items():
                aux_sum[k] = aux_sum.get(k, 0.0) + v
        if alg.client_end is not None:
            stage = "client_end"
            with torch.no_grad():
                ctx.update(alg.client_end(payload, params, ctx, tools.client_data(job, payload), tools.apply))
        stage = "client_result"
        upload, state = alg.client_result(payload, params, ctx)
    except FedriftError:
        raise
    except Exception as err:
        raise HookError(f"{alg.name}: hook {stage} failed in round {round_}, client {job.client_id}: {err}") from err
    steps = max(job.num_steps, 1)
    aux_mean = {k: v / steps for k, v in aux_sum.items()}
    return ClientOutput(job.client_id, upload, state, loss_sum / steps, aux_mean, params)


def client_summary(tools: RoundTools, payload: dict[str, Any], job: ClientJob) -> dict[str, Any]:
    """The client's pre-phase upload (``Algorithm.client_summary``: e.g. FedCSD's class
    prototypes), computed on its data before the round's training."""
    alg = tools.algorithm
    with torch.no_grad():
        return alg.client_summary(payload, job.ctx, tools.client_data(job, payload), tools.apply)
