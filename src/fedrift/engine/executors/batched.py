"""K clients trained at once: one ``torch.func.vmap`` over stacked parameters and optimiser state.

Each local step of K clients is one vectorised call of the same pure step the sequential
executor runs. Clients with fewer samples in a batch get padded rows with sample weight 0;
clients with fewer steps get masked steps (their parameters and optimiser state are kept
as they were), so every client ends where the sequential executor leaves it up to float
rounding: not bit for bit, as vmap runs other kernels (batched matrix products, convolutions
in the default layout rather than channels-last). Tested (tests/engine/test_batched.py): after
3 rounds every parameter within 1e-4 of its tensor's largest value and metrics within 1e-3
relative, for every algorithm on a tiny MLP; the FedAvg CNN within 1e-4 after one round (the
differences grow with rounds). Clients are grouped by step count so little is spent on padding.

BatchNorm models (``model.norm: batch``): the running statistics are stacked with the
parameters, so a masked step keeps them too, and padded rows are left out of the batch
statistics (``models/norm.py``): the same statistics as ``sequential`` to float rounding.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch
from torch.func import vmap

from fedrift.engine.local import make_step, optimizer_init
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.functional.tree import stack


def _select(mask: torch.Tensor, new: Any, old: Any) -> Any:
    """``new`` where a client's step is real, ``old`` where it is padding; any nesting."""
    if isinstance(new, torch.Tensor):
        m = mask.reshape(-1, *([1] * (new.dim() - 1)))
        return torch.where(m, new, old)
    if isinstance(new, dict):
        return {k: _select(mask, new[k], old[k]) for k in new}
    if isinstance(new, (tuple, list)):
        return type(new)(_select(mask, n, o) for n, o in zip(new, old))
    return new


def _index_table(jobs: list[ClientJob], steps: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``idx[s, k, :]``: client k's batch at step s, padded with its first sample; ``w``: the
    sample weights, 1/len for real rows and 0 for padding and for steps past the client's end."""
    dev = jobs[0].indices.device
    table = torch.full((len(jobs), steps, batch_size), -1, dtype=torch.int64, device=dev)
    for k, job in enumerate(jobs):  # one copy per client; the rest is done on the whole table
        table[k, : job.num_steps, : job.table.shape[1]] = job.table
    real = table >= 0
    first = torch.stack([job.indices[0] for job in jobs]).view(-1, 1, 1)
    idx = torch.where(real, table, first)
    w = real / real.sum(-1, keepdim=True).clamp(min=1)
    return idx.transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous()


def auto_parallel(params: dict[str, torch.Tensor], batch_size: int, sample_numel: int) -> int:
    """How many clients to vectorise: bounded by a memory budget for parameters, gradients,
    optimiser state and activations (a rough 256 MB per group on the CPU), at most 256.

    A vectorised step holds about 8 model-sized tensors per client at its peak (parameters
    before and after, gradients, optimiser and client state, the update chain's temporaries):
    measured on S4's SCAFFOLD MLP, a group of 86 clients raised peak memory by 450 MB."""
    per_client = 4 * (8 * sum(p.numel() for p in params.values()) + 32 * batch_size * sample_numel)
    return int(max(1, min(256, (256 * 2**20) // max(per_client, 1))))


class BatchedExecutor:
    def __init__(self, max_parallel_clients: int | None = None) -> None:
        self.max_parallel = max_parallel_clients
        self._steps: dict[int, Any] = {}

    def close(self) -> None:
        """Nothing to release: this executor runs in the calling process."""

    hands_over = True  # run_round's take: each group's outputs handed over as they are made (Server.take)

    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int,
        take: Callable[[ClientOutput], None] | None = None,
    ) -> list[ClientOutput]:
        params = tools.start_params(payload, jobs[0].ctx) if jobs else payload["params"]
        batch_size = max((j.table.shape[1] for j in jobs), default=1)
        k = self.max_parallel or auto_parallel(params, batch_size, int(tools.x[0].numel()))
        # longest first (less masked work per group), then in job order: the order in which
        # take folds the outputs, so that clients of equal length are not held waiting
        order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].num_steps, i))
        outputs: dict[int, ClientOutput] = {}
        for start in range(0, len(order), k):
            group = [jobs[i] for i in order[start : start + k]]
            for job, out in zip(group, self._group(tools, payload, group, batch_size, round_)):
                outputs[job.client_id] = out
                if take is not None:
                    take(out)
        return [outputs[j.client_id] for j in jobs]

    def _vstep(self, tools: RoundTools) -> Any:
        key = (id(tools.algorithm), id(tools.optimizer))
        if key not in self._steps:  # one batched step per (algorithm, optimiser): training, personalisation
            step = make_step(tools.algorithm, tools.vmap_apply or tools.apply, tools.optimizer, functional=True, dp=tools.dp)
            self._steps = {key: (tools.algorithm, tools.optimizer, vmap(step, in_dims=(0, 0, 0, None, 0)))}
        return self._steps[key][2]

    def _group(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], batch_size: int, round_: int
    ) -> list[ClientOutput]:
        alg, dev = tools.algorithm, tools.x.device
        ctxs = []
        for job in jobs:
            ctx = job.context()
            if alg.client_start is not None:
                with torch.no_grad():
                    ctx.update(alg.client_start(payload, ctx, tools.client_data(job, payload), tools.apply))
            ctxs.append(ctx)
        ctx = stack(ctxs)
        n = len(jobs)
        if alg.personal:
            params = tools.start_params(payload, ctx)  # the clients' own models, stacked with ctx
        elif alg.client_model is not None:  # the broadcast (expanded) with each client's own part
            params = vmap(partial(tools.start_params, payload))(ctx)
        else:
            params = {name: p.unsqueeze(0).expand(n, *p.shape) for name, p in payload["params"].items()}
        opt_state = vmap(partial(optimizer_init, tools.optimizer, apply=tools.apply))(params)
        vstep = self._vstep(tools)
        steps = [j.num_steps for j in jobs]
        idx_all, w_all = _index_table(jobs, max(steps), batch_size)
        active_all = torch.arange(max(steps), device=dev)[:, None] < torch.tensor(steps, device=dev)[None, :]
        loss_sum = torch.zeros(n, device=dev)
        aux_sum: dict[str, torch.Tensor] = {}
        for s in range(max(steps)):
            active = active_all[s]
            noise = None
            if alg.noise_dim is not None:
                noise = torch.stack([tools.noise(round_, j.client_id, s, batch_size) for j in jobs])
            views = None
            if tools.augment is not None:
                views = torch.stack([tools.views(round_, j.client_id, s, batch_size) for j in jobs])
            dp_noise = stack([tools.dp_noise(round_, j.client_id, s) for j in jobs]) if tools.dp is not None else None
            batch = tools.batch(payload, idx_all[s], w_all[s], noise=noise, views=views, dp_noise=dp_noise)
            new_params, new_state, loss, aux = vstep(params, opt_state, batch, payload, ctx)
            if s < min(steps):  # every client still training: nothing to mask (and no pass over the stack)
                params, opt_state = new_params, new_state
            else:
                params = _select(active, new_params, params)
                opt_state = _select(active, new_state, opt_state)
            loss_sum = loss_sum + torch.where(active, loss, torch.zeros_like(loss))
            for key, v in aux.items():
                aux_sum[key] = aux_sum.get(key, 0.0) + torch.where(active, v, torch.zeros_like(v))
        outs = []
        for i, job in enumerate(jobs):
            end = {name: p[i].clone() for name, p in params.items()}
            if alg.client_end is not None:
                with torch.no_grad():
                    ctxs[i].update(alg.client_end(payload, end, ctxs[i], tools.client_data(job, payload), tools.apply))
            upload, state = alg.client_result(payload, end, ctxs[i])
            h = max(steps[i], 1)
            aux_i = {key: v[i] / h for key, v in aux_sum.items()}
            outs.append(ClientOutput(job.client_id, upload, state, loss_sum[i] / h, aux_i, end))
        return outs
