"""The vectorised executors' local step through a model's stacked form.

Why: under ``torch.func.vmap`` every operation of K clients' model calls is batched on its
own: a convolution of K clients' kernels becomes one grouped call (the clients merged into the
channels), a GroupNorm a normalisation over clients x batch, and the activations are
reordered between the two arrangements at every layer (on a GPU, cuDNN converts layouts around
each grouped call too: a quarter of the H200 profile's kernel time, BENCHMARKS.md G). A model
whose :meth:`~fedrift.models.base.FedModel.stacked` form keeps the clients in its layout
(ResNet-8: as channel groups, never reordered) runs the same arithmetic as one network.

How: the step takes each client's loss under ``vmap`` as before (the algorithm's
``local_loss``, unchanged, with its payload and context rows), but the model call inside is
:class:`_StackedCall`, whose ``vmap`` rule runs the model's stacked form on all clients at
once; the gradients are then one ordinary backward of the clients' summed losses (each
client's loss depends on its own parameters only, so the gradient of the sum with respect to
a client's parameters is that client's gradient); each client's gradient correction and
optimiser step follow under ``vmap``. Used where the model steps through its stacked form
(``FedModel.stacked_step``: ResNet-8, where it was measured faster; under bf16 every model
that has one) and the step has no BatchNorm statistics and no DP-SGD
(``executors.batched``); the rest train as before. Same
function as ``make_step(functional=True)`` under ``vmap``, other float rounding (other
kernels); under bf16 autocast the sequential step's (the vmapped one is 1e-2 from it: under
``vmap`` ``F.linear`` with a bias returns float32): ``tests/engine/test_stacked_step.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.func import vjp, vmap

from fedrift.engine.local import ModelApply, apply_update, autograd_grad_and_value, checked_local_loss, stat_keys_of
from fedrift.engine.round_types import Params, RoundTools, StepFn
from fedrift.engine.step_values import VALUES
from fedrift.models.base import FedModel


class _StackedCall(torch.autograd.Function):
    """``apply(params, x, mode)`` as one function of its tensors: alone, the model's own call
    (differentiable through :func:`torch.func.vjp` of it); under ``vmap``, the model's stacked
    form on every client at once, or each operation batched where it has none."""

    @staticmethod
    def forward(apply: ModelApply, names: tuple[str, ...], mode: str, x: torch.Tensor, *tensors: torch.Tensor) -> Any:
        return apply(dict(zip(names, tensors)), x, mode)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.call, ctx.names, ctx.mode = inputs[:3]  # (not ctx.apply: the node's own)
        ctx.save_for_backward(*inputs[3:])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        # a gradient taken inside a client's loss (FedSAM's ascent step): the model's own call's
        x, *tensors = ctx.saved_tensors
        _, pull = vjp(lambda x_, *t: ctx.call(dict(zip(ctx.names, t)), x_, ctx.mode), x, *tensors)
        return (None, None, None, *pull(grads[0] if len(grads) == 1 else grads))

    @staticmethod
    def vmap(info: Any, in_dims: tuple, apply: ModelApply, names: tuple[str, ...], mode: str, x: torch.Tensor,
             *tensors: torch.Tensor) -> tuple[Any, Any]:
        k = info.batch_size

        def rows(t: torch.Tensor, d: int | None) -> torch.Tensor:
            return t.movedim(d, 0) if d is not None else t.expand(k, *t.shape)

        out = apply.model.stacked(dict(zip(names, (rows(t, d) for t, d in zip(tensors, in_dims[4:])))),
                                  rows(x, in_dims[3]), mode)
        if out is None:  # no stacked form for this call: each operation batched, as vmap does
            out = vmap(lambda x_, *t: apply(dict(zip(names, t)), x_, mode), in_dims=in_dims[3:])(x, *tensors)
        return out, (0, 0) if isinstance(out, tuple) else 0


def stacked_call(apply: ModelApply) -> Callable[..., Any]:
    """``apply`` for a client's loss under ``vmap`` that runs the model's stacked form."""
    def call(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        if apply.prepare is not None and not x.is_floating_point():
            x = apply.prepare(x)
        return _StackedCall.apply(apply, tuple(params), mode, x, *params.values())

    return call


def steps_stacked(apply: Any, precision: str = "fp32") -> bool:
    """Whether ``apply`` (a ``ModelApply``) calls a model that steps through its stacked form:
    one it has (``FedModel.has_stacked_form``) and was measured faster with than ``vmap``
    (``FedModel.stacked_step``), or any that has one under bf16, where ``vmap``'s step is not
    the sequential one (``F.linear`` with a bias returns float32 under ``vmap`` and autocast:
    pytorch/pytorch issue 192617) and the form's is."""
    model = getattr(apply, "model", None)
    return isinstance(model, FedModel) and (model.stacked_step or precision == "bf16") and model.has_stacked_form()


def make_vstep(tools: RoundTools, payload_dims: Any = None, valued: bool = False) -> StepFn | None:
    """The vectorised step of ``tools``' algorithm and optimiser over K clients' stacked rows
    (the payload's rows as ``payload_dims`` says: shared, or one a client), through the model's
    stacked form (see the module's docstring); ``valued``: each client's algorithm and optimiser
    built at its values (``ctx[VALUES]``, ``engine.step_values``: stacked runs at other learning
    rates and options). None where it does not apply (no stacked form, BatchNorm statistics,
    DP-SGD): the executor then vmaps ``make_step``'s step."""
    apply = tools.vmap_apply or tools.apply
    if tools.dp is not None or stat_keys_of(apply) or not steps_stacked(apply, tools.precision):
        return None
    call, loss = stacked_call(apply), checked_local_loss(tools.algorithm, tools.precision)

    def pieces(ctx: dict) -> tuple[Any, Any, dict]:
        if not valued:
            return tools.algorithm, tools.optimizer, ctx
        alg, opt = tools.rebuild.pieces(ctx[VALUES])
        return alg, opt, {k: v for k, v in ctx.items() if k != VALUES}

    def client_loss(params: Params, batch: dict, payload: dict, ctx: dict) -> Any:
        alg, _, rest = pieces(ctx)
        return loss(params, batch, payload, rest, call, alg)

    def update(grads: Params, opt_state: Any, trained: Params, payload: dict, ctx: dict) -> tuple[Params, Any]:
        alg, opt, rest = pieces(ctx)
        if alg.grad_correction is not None:
            grads = alg.grad_correction(grads, trained, payload, rest)
        return apply_update(opt, grads, opt_state, trained)

    losses = vmap(client_loss, in_dims=(0, 0, payload_dims, 0))
    updates = vmap(update, in_dims=(0, 0, 0, payload_dims, 0))

    def summed(params: Params, batch: dict, payload: dict, ctx: dict) -> tuple[torch.Tensor, Any]:
        loss_k, aux = losses(params, batch, payload, ctx)
        return loss_k.sum(), (loss_k, aux)

    grad_fn = autograd_grad_and_value(summed)  # the clients' gradients: one backward of their summed losses

    def step(params: Params, opt_state: Any, batch: dict, payload: dict, ctx: dict):
        grads, (_, (loss_k, aux)) = grad_fn(params, batch, payload, ctx)
        # contiguous: a batched product's backward can hand a weight's gradient transposed, and the
        # optimiser's elementwise work over a strided tensor ran slower (the FedAvg CNN's dense
        # layer: BENCHMARKS.md G)
        grads = {k: g.contiguous() for k, g in grads.items()}
        with torch.no_grad():
            new, opt_state = updates(grads, opt_state, params, payload, ctx)
        return ({k: v.detach() for k, v in new.items()}, opt_state, loss_k.detach(),
                {k: v.detach() for k, v in aux.items()})

    return step
