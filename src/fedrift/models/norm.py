"""BatchNorm for federated training: running statistics as explicit state (``model.norm: batch``).

fedrift's models normalise with GroupNorm by default: it keeps nothing between batches. The
BatchNorm variants (the FedGKD+ and MOON Tiny-ImageNet rows; FedBN later) keep running means
and variances, which ``torch.nn.BatchNorm2d`` updates in place: that breaks ``vmap`` and would
hide state from the engine. Here they are part of the model state the engine carries.

The model state. A BatchNorm model's state, wherever the engine and the algorithms hold a
model (``params`` in the server state, the broadcast, uploads, client states, checkpoints,
``final_model.pt``), is its parameters (``named_parameters`` order) followed by every
BatchNorm layer's ``running_mean`` and ``running_var`` (:func:`model_state`). So FedGKD's
teacher, the parameter average of its buffered global models, averages their statistics too
(as the authors' code averages state_dicts), and MOON's previous model keeps its own.
``num_batches_tracked`` is not carried: with momentum 0.1 it enters no computation (torch
reads it only for ``momentum=None``, a cumulative average fedrift does not use), a sum or
mean of it over clients counts nothing meaningful, and it stays 0 in the model and in the
exported ``final_model.pt`` (which a ``torch.nn.BatchNorm2d`` model loads as it is).

Training (the local step, ``engine/local.py``). The model being trained runs in train mode:
it normalises with the batch's statistics (biased variance) and updates the running ones,
``r <- 0.9 r + 0.1 s`` (momentum 0.1; the variance update takes the unbiased batch variance),
exactly as ``torch.nn.BatchNorm2d`` does. The step takes the statistics in and returns the
new ones beside the new parameters; they get no gradient, no weight decay, no momentum and
no gradient correction (the optimiser and ``grad_correction`` see the parameters only).
Which call of the model is the one trained: ``local_loss`` receives the trained parameters
without the statistics; a call on such a dict is the trained model (train mode, the step's
statistics, updated); a call on a dict that carries statistics (the broadcast model, a
FedGKD teacher, MOON's previous model) is a fixed model, run in eval mode with its own
statistics and updating nothing. Several train-mode calls in one step update the statistics
in turn, as several forward passes of a torch module would.

Padding (the batched executor). Its padded rows (sample weight 0) are left out of the batch
statistics (:class:`BatchNorm2d`'s ``sample_mask``), and a client past its last batch leaves
the vectorised call with its statistics and parameters, so every client's statistics follow
the same updates as under ``sequential``, to float rounding (the same formula, run by other
kernels, like the rest of a vectorised step). ``processes`` and ``ray`` run ``sequential``'s
code: the same bits.

Upload and aggregation (``engine/server.py``). A client uploads its end statistics with its
end parameters (in ``upload["params"]``). Whatever the algorithm does with the parameters,
the server's new statistics are the weighted average of the uploaded ones, with the round's
aggregation weights: ``p_k = n_k / sum n_j`` by default (FedAvg over the state_dict, as in
the FedGKD and MOON code), ``1/K`` under ``aggregation: uniform``. A server rule meant for
parameters (FedAvgM's momentum, FedDyn's correction, FedNova's rescaling) is never applied
to them: extrapolated variances could turn negative. Personal models (FedProto) keep their
statistics with their parameters; nothing is averaged. FedBN (statistics and BatchNorm
parameters stay on each client) fits this layout: its client state holds its BatchNorm
entries and the server skips their average.

Evaluation, teachers, drift probes and server-side training (FedDF, FedGen) call the model
on full states, so they run in eval mode with the running statistics and change nothing.

Not supported with BatchNorm (refused by the engine in one line): differential privacy
(batch statistics mix samples, so per-sample clipping bounds nothing, and clients' noised
models would leave their statistics unnoised) and personalisation by classifier calibration
(``eval.personalize``: its body is meant to stay the global model's, bit for bit).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from torch.nn import functional as F

STATS = ("running_mean", "running_var")  # the buffers of a BatchNorm layer the engine carries


class BatchNorm2d(nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` (momentum 0.1, eps 1e-5, affine, its state_dict keys) whose
    train-mode forward reassigns its running statistics instead of updating them in place,
    so that ``torch.func.functional_call`` hands the new ones back in the dict it was given.

    Train mode computes the batch statistics with plain tensor operations, one form for every
    executor (``vmap`` runs it too): torch's fused kernel rounds differently, and in a
    channel that is nearly constant over a batch BatchNorm's ``1/sqrt(var + eps)`` amplifies
    that rounding (measured: two forms 6e-6 apart after two rounds of a width-4 ResNet-8 on
    ``digits``, 0.9 apart relative after three). The numbers equal ``torch.nn.BatchNorm2d``'s
    to float rounding; a batch with one value per channel, which torch refuses, gets
    variance 0. ``sample_mask`` (bool per row, None: every row counts; set per call by
    :func:`norm_mode`, never kept) leaves padded rows out of the batch statistics.
    ``num_batches_tracked`` is never touched (module docstring)."""

    sample_mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        mask = self.sample_mask
        if mask is not None and mask.shape[0] != x.shape[0]:  # a call on other rows than the batch's
            mask = None
        out, self.running_mean, self.running_var = self._normalise(x, mask)
        return out

    def _normalise(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch norm over the rows ``mask`` keeps, and the updated running statistics. No
        row kept: a finite result (the count clamped to 1), not a division by zero."""
        dims = [0, *range(2, x.dim())]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        per_row = x[0, 0].numel()
        if mask is None:
            count = x.new_full((), float(x.shape[0] * per_row))
            rows = x
        else:
            keep = mask.to(x.dtype)
            count = keep.sum() * per_row
            keep = keep.reshape(-1, *([1] * (x.dim() - 1)))
            rows = x * keep
        n = count.clamp(min=1)
        mean = rows.sum(dims) / n
        centred = x - mean.reshape(shape)
        sq = centred * centred
        var = (sq if mask is None else sq * keep).sum(dims) / n
        scale = torch.rsqrt(var + self.eps) * self.weight  # per channel: one pass over x below
        out = torch.addcmul(self.bias.reshape(shape), centred, scale.reshape(shape))
        m = self.momentum
        unbiased = var.detach() * (n / (count - 1).clamp(min=1))
        new_mean = self.running_mean * (1 - m) + mean.detach() * m
        new_var = self.running_var * (1 - m) + unbiased * m
        return out, new_mean, new_var


def batch_norms(model: nn.Module) -> list[tuple[str, BatchNorm2d]]:
    """The model's :class:`BatchNorm2d` layers with their names, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, BatchNorm2d)]


def running_stat_names(model: nn.Module) -> tuple[str, ...]:
    """The state keys of the running statistics the engine carries (empty: no BatchNorm)."""
    return tuple(f"{name}.{s}" for name, _ in batch_norms(model) for s in STATS)


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model state the engine carries (module docstring): the parameters, then the running
    statistics, detached copies. Without BatchNorm: the parameters alone."""
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())
    state.update({k: buffers[k].detach().clone() for k in running_stat_names(model)})
    return state


def without_stats(params: dict[str, torch.Tensor], stat_keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """``params`` less the running statistics: what is trained (the same dict without any)."""
    if not stat_keys:
        return params
    drop = set(stat_keys)
    return {k: v for k, v in params.items() if k not in drop}


@contextmanager
def norm_mode(layers: list[BatchNorm2d], train: bool, mask: torch.Tensor | None = None) -> Iterator[None]:
    """For one call of the model: its BatchNorm layers in train (batch statistics, updated)
    or eval mode (running statistics), with the call's sample mask; put back afterwards."""
    before = [m.training for m in layers]
    for m in layers:
        m.training, m.sample_mask = train, mask
    try:
        yield
    finally:
        for m, was in zip(layers, before):
            m.training = was
            del m.sample_mask  # back to the class default, None
