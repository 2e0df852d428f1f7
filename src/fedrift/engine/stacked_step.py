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
(``FedModel.stacked_step``: the ResNets, where it was measured faster; under bf16 or
``engine.compile`` every model that has one) and the step has no BatchNorm statistics and no DP-SGD
(``executors.batched``); the rest train as before. Same
function as ``make_step(functional=True)`` under ``vmap``, other float rounding (other
kernels); under bf16 autocast the sequential step's (the vmapped one is 1e-2 from it: under
``vmap`` ``F.linear`` with a bias returns float32): ``tests/engine/test_stacked_step.py``.

``engine.compile``: the stacked form compiled by ``torch.compile`` (inductor: a GroupNorm, its
ReLU and a residual add fused into one kernel, forward and backward; the convolutions stay
cuDNN's or oneDNN's), one compile for each shape it meets (a group's width, a mode), cached
on disk by torch across processes. Within float rounding of the uncompiled form, not bit for
bit (other kernels, other summation orders); the same machine compiles the same kernels, so a
run stays reproducible.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.func import vjp, vmap

from fedrift.engine.local import ModelApply, apply_update, autograd_grad_and_value, checked_local_loss
from fedrift.engine.round_types import Params, RoundTools, StepFn
from fedrift.engine.step_values import VALUES
from fedrift.models.base import FedModel
from fedrift.models.norm import running_stat_names


Form = Callable[[FedModel, Params, torch.Tensor, str], Any]  # FedModel.stacked, or it compiled


class _StackedCall(torch.autograd.Function):
    """``apply(params, x, mode)`` as one function of its tensors: alone, the model's own call
    (differentiable through :func:`torch.func.vjp` of it); under ``vmap``, the model's stacked
    form on every client at once, or each operation batched where it has none."""

    @staticmethod
    def forward(apply: ModelApply, form: Form, names: tuple[str, ...], mode: str, x: torch.Tensor,
                *tensors: torch.Tensor) -> Any:
        return apply(dict(zip(names, tensors)), x, mode)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.call, _, ctx.names, ctx.mode = inputs[:4]  # (not ctx.apply: the node's own)
        ctx.save_for_backward(*inputs[4:])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        # a gradient taken inside a client's loss (FedSAM's ascent step): the model's own call's
        x, *tensors = ctx.saved_tensors
        _, pull = vjp(lambda x_, *t: ctx.call(dict(zip(ctx.names, t)), x_, ctx.mode), x, *tensors)
        return (None, None, None, None, *pull(grads[0] if len(grads) == 1 else grads))

    @staticmethod
    def vmap(info: Any, in_dims: tuple, apply: ModelApply, form: Form, names: tuple[str, ...], mode: str,
             x: torch.Tensor, *tensors: torch.Tensor) -> tuple[Any, Any]:
        k = info.batch_size

        def rows(t: torch.Tensor, d: int | None) -> torch.Tensor:
            return t.movedim(d, 0) if d is not None else t.expand(k, *t.shape)

        out = form(apply.model, dict(zip(names, (rows(t, d) for t, d in zip(tensors, in_dims[5:])))),
                   rows(x, in_dims[4]), mode)
        if out is None:  # no stacked form for this call: each operation batched, as vmap does
            out = vmap(lambda x_, *t: apply(dict(zip(names, t)), x_, mode), in_dims=in_dims[4:])(x, *tensors)
        return out, (0, 0) if isinstance(out, tuple) else 0


RECOMPILES = 64  # compiles of the stacked form a process keeps (torch's default, 8, is below a GPU group's widths x modes)


def compiled_form(model: FedModel) -> Form:
    """``type(model).stacked`` compiled by ``torch.compile``; torch's recompile limit raised to
    :data:`RECOMPILES` shapes (past them torch warns and runs it uncompiled). Static shapes, a
    compile for each group width: with the clients' axis a symbol inductor failed on the
    FedAvg CNN's grouped convolutions (and a grouped convolution's ``groups=K`` made ResNet-8's
    a constant again), with every size a symbol on ResNet-8's strides (torch 2.13)."""
    import torch._dynamo  # on use: importing it costs a process start-up about 1.7 s of CPU

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILES)
    return torch.compile(type(model).stacked, dynamic=False)


def stacked_call(apply: ModelApply, compiled: bool = False) -> Callable[..., Any]:
    """``apply`` for a client's loss under ``vmap`` that runs the model's stacked form
    (``compiled``: by ``torch.compile``, :func:`compiled_form`)."""
    form = compiled_form(apply.model) if compiled else type(apply.model).stacked

    def call(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        if apply.prepare is not None and not x.is_floating_point():
            x = apply.prepare(x)
        return _StackedCall.apply(apply, form, tuple(params), mode, x, *params.values())

    return call


def form_refusal(model: Any, sample_dp: bool) -> str | None:
    """Why the vectorised step cannot go through ``model``'s stacked form (None: it can): the
    model lacks one, BatchNorm's running statistics or DP-SGD's per-sample gradients (which the
    form does not carry). The one rule for :func:`make_vstep` and for ``engine.compile``'s
    refusal (``fedrift.api.check_compile``)."""
    if not isinstance(model, FedModel) or not model.has_stacked_form():
        return f"{type(model).__name__} has no stacked form (a projection head or another model)"
    if running_stat_names(model):
        return "BatchNorm's running statistics (model.norm: batch) do not go through the stacked form"
    if sample_dp:
        return "DP-SGD (privacy.level: sample) does not go through the stacked form"
    return None


def make_vstep(tools: RoundTools, payload_dims: Any = None, valued: bool = False,
               compiled: bool = False) -> StepFn | None:
    """The vectorised step of ``tools``' algorithm and optimiser over K clients' stacked rows
    (the payload's rows as ``payload_dims`` says: shared, or one a client), through the model's
    stacked form (see the module's docstring); ``valued``: each client's algorithm and optimiser
    built at its values (``ctx[VALUES]``, ``engine.step_values``: stacked runs at other learning
    rates and options); ``compiled``: the form compiled (``engine.compile``). None where it does
    not apply (:func:`form_refusal`), or where the model's step is not through its form: it was
    measured faster with ``vmap`` (``FedModel.stacked_step`` off), under fp32 and uncompiled
    (under bf16 ``vmap``'s step is not the sequential one: ``F.linear`` with a bias returns
    float32 under ``vmap`` and autocast, pytorch/pytorch issue 192617; the form's is). The
    executor then vmaps ``make_step``'s step."""
    apply = tools.vmap_apply or tools.apply
    model = getattr(apply, "model", None)
    if form_refusal(model, tools.dp is not None) is not None:
        return None
    if not (model.stacked_step or tools.precision == "bf16" or compiled):
        return None
    call, loss = stacked_call(apply, compiled), checked_local_loss(tools.algorithm, tools.precision)

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
