"""One local step as a pure function, shared by every executor."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from fedrift.algorithms.base import Algorithm
from fedrift.engine.optim import Transform, apply_updates

Params = dict[str, torch.Tensor]
StepFn = Callable[[Params, Any, dict, dict, dict], tuple[Params, Any, torch.Tensor]]


def make_apply(model: nn.Module, buffers: dict[str, torch.Tensor]) -> Callable[..., Any]:
    """``apply(params, x, mode)``: the model run with given parameters (strict: no fallbacks)."""

    def apply(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        return functional_call(model, (params, buffers), (x,), {"mode": mode}, strict=True)

    return apply


def make_step(algorithm: Algorithm, apply: Callable[..., Any], optimizer: Transform) -> StepFn:
    """``step(params, opt_state, batch, payload, ctx) -> (params, opt_state, loss)``."""

    def loss_fn(params: Params, batch: dict, payload: dict, ctx: dict):
        loss, aux = algorithm.local_loss(params, batch, payload, ctx, apply)
        return loss, aux

    grad_fn = grad_and_value(loss_fn, has_aux=True)
    correct = algorithm.grad_correction

    def step(params: Params, opt_state: Any, batch: dict, payload: dict, ctx: dict):
        grads, (loss, _aux) = grad_fn(params, batch, payload, ctx)
        if correct is not None:
            grads = correct(grads, params, payload, ctx)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return apply_updates(params, updates), opt_state, loss.detach()

    return step
