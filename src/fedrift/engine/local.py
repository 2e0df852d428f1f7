"""One local step as a pure function, shared by every executor."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from fedrift.algorithms.base import Algorithm, check_local_loss
from fedrift.engine.optim import Transform, apply_updates
from fedrift.engine.privacy import dp_grad_and_value

Params = dict[str, torch.Tensor]
StepFn = Callable[[Params, Any, dict, dict, dict], tuple[Params, Any, torch.Tensor, dict]]


def make_apply(
    model: nn.Module, buffers: dict[str, torch.Tensor], channels_last: bool = False, prepare: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """``apply(params, x, mode)``: the model run with given parameters (strict: no fallbacks).

    ``prepare`` turns raw integer rows into model input: uint8 images normalised
    (``data.base.PixelNorm``), token ids cut to the batch's longest sentence
    (``data.base.TokenCut``). Every caller (training steps, teachers, evaluation) hands
    ``apply`` raw rows of the dataset, so this is the one place where a batch is prepared,
    on its device.

    ``channels_last=True`` hands every 4-D parameter (convolution kernels) to the model in the
    channels-last layout, a differentiable copy of a few kB per call: oneDNN then runs the
    convolutions in that layout, on this CPU about 1.15x faster to train and 2-3x faster to
    infer for the FedAvg CNN and ResNet-8 (BENCHMARKS.md). Same function, other float rounding.
    Not under ``vmap``, which cannot express the layout: the batched executor's step uses a
    plain ``apply``.
    """

    def apply(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        if prepare is not None and not x.is_floating_point():
            x = prepare(x)
        return functional_call(model, (params, buffers), (x,), {"mode": mode}, strict=True)

    if not channels_last:
        return apply

    def apply_channels_last(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        laid = {k: v.clone(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in params.items()}
        return apply(laid, x, mode)

    return apply_channels_last


def prefers_channels_last(model: nn.Module, device: torch.device) -> bool:
    """Whether ``apply`` should lay convolution kernels out channels-last: on the CPU, for a
    model that has any (measured faster there; on a GPU the default layout stays)."""
    return device.type == "cpu" and any(p.dim() == 4 for p in model.parameters())


def autograd_grad_and_value(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.func.grad_and_value(loss_fn, has_aux=True)`` computed with plain autograd.

    Same function, same gradient; outside ``vmap`` it costs less per step than the functorch
    transform and skips its one-off start-up (about 1.5 s here), see BENCHMARKS.md.
    """

    def grad_and_value_(params: Params, *args: Any):
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        loss, aux = loss_fn(leaves, *args)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        out = {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}
        return out, (loss, aux)

    return grad_and_value_


def make_step(
    algorithm: Algorithm, apply: Callable[..., Any], optimizer: Transform, functional: bool = False, inplace: bool = False,
    dp: tuple[float, float] | None = None,
) -> StepFn:
    """``step(params, opt_state, batch, payload, ctx) -> (params, opt_state, loss, aux)``.

    ``functional=True`` takes gradients with ``torch.func`` (needed under ``vmap``);
    otherwise with autograd, for the one-client-at-a-time executors. ``inplace=True`` (not
    with ``functional``) updates the caller's ``params`` and optimiser state in place when
    the optimiser can (``Transform.apply_inplace``) and returns them: the caller owns them
    (the executors copy the starting model once per client). No new model per step: on the
    FedAvg CNN the new tensors had cost 7-10% of the step (page faults on fresh memory).
    ``dp=(C, z)``: DP-SGD's clipped, noised gradient (:func:`fedrift.engine.privacy.dp_grad_and_value`).
    """

    checked = False

    def loss_fn(params: Params, batch: dict, payload: dict, ctx: dict):
        nonlocal checked
        out = algorithm.local_loss(params, batch, payload, ctx, apply)
        if not checked:  # the first step of this executor's (or worker's) first client
            check_local_loss(algorithm.name, out)
            checked = True
        return out

    if dp is not None:
        grad_fn = dp_grad_and_value(loss_fn, *dp)
    else:
        grad_fn = grad_and_value(loss_fn, has_aux=True) if functional else autograd_grad_and_value(loss_fn)
    correct = algorithm.grad_correction
    in_place = optimizer.apply_inplace if inplace and not functional else None

    def step(params: Params, opt_state: Any, batch: dict, payload: dict, ctx: dict):
        grads, (loss, aux) = grad_fn(params, batch, payload, ctx)
        if correct is not None:
            grads = correct(grads, params, payload, ctx)
        aux = {k: v.detach() for k, v in aux.items()}
        if in_place is not None:
            with torch.no_grad():
                opt_state = in_place(grads, opt_state, params)
            return params, opt_state, loss.detach(), aux
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new = apply_updates(params, updates)
        return {k: v.detach() for k, v in new.items()}, opt_state, loss.detach(), aux

    return step


def make_tools(
    model: nn.Module, algorithm: Algorithm, train: Any, x: torch.Tensor, y: torch.Tensor, seed: int,
    eval_batch: int | None = None, prepare: Callable[..., Any] | None = None, augment: Any = None, privacy: Any = None,
) -> Any:
    """The run's ``RoundTools``: apply, the local optimiser (the algorithm's own, else the
    train section's ``optimizer``) and the step; one place, for the loop and for worker processes.
    ``prepare``: the dataset's ``prepare`` (see :func:`make_apply`); one that reads the batch
    (``TokenCut``) is not used under ``vmap``: ``RoundTools.batch`` cuts every training batch
    before it reaches a step, the batched executor's stacked clients to their longest;
    ``augment``: the training batches' ``engine.augment.Augment`` (None: off)."""
    from fedrift.engine.executors.base import RoundTools  # executors import this module
    from fedrift.algorithms.terms import CHUNK
    from fedrift.engine.optim import local_optimizer
    from fedrift.engine.teacher import TeacherMemo

    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    channels_last = prefers_channels_last(model, x.device)
    apply = make_apply(model, buffers, channels_last, prepare)
    optimizer = algorithm.optimizer or local_optimizer(train)
    vmappable = getattr(prepare, "vmappable", True)
    # sample-level DP without clipping has no noise either (config): plain SGD, as FedAvg
    dp = (privacy.clip, privacy.noise_multiplier) if privacy is not None and privacy.level == "sample" and privacy.clip else None
    shapes = tuple((k, tuple(v.shape)) for k, v in model.named_parameters()) if dp is not None else None
    # training batches arrive cut (RoundTools.batch): the step's apply does not read them,
    # so it also runs under DP-SGD's per-sample vmap
    step_apply = apply if vmappable else make_apply(model, buffers, channels_last)
    step = make_step(algorithm, step_apply, optimizer, inplace=True, dp=dp)
    schedule = None
    if getattr(train, "lr_schedule", "constant") != "constant":
        if algorithm.at_lr is None:
            raise ValueError(f"algorithm {algorithm.name}: train.lr_schedule {train.lr_schedule} needs the algorithm "
                             "as engine.build.build_algorithm makes it (with at_lr)")

        def pieces(lr: float) -> tuple[Algorithm, Transform, StepFn]:
            alg = algorithm.at_lr(lr)
            opt = alg.optimizer or local_optimizer(train.model_copy(update={"lr": lr}))
            return alg, opt, make_step(alg, step_apply, opt, inplace=True, dp=dp)

        schedule = LrSchedule(train, (algorithm, optimizer, step), pieces)
    return RoundTools(
        algorithm, apply, optimizer, step, x, y, seed=seed,
        vmap_apply=make_apply(model, buffers, prepare=prepare if vmappable else None), eval_batch=eval_batch or (CHUNK if channels_last else 1024),
        teacher_memo=TeacherMemo(len(x)) if algorithm.teacher is not None and augment is None else None,
        augment=augment, dp=dp, dp_shapes=shapes, cut=None if vmappable else prepare, lr=train.lr, schedule=schedule,
    )


class LrSchedule:
    """A run's training pieces (algorithm, optimiser, step) at each local learning rate its
    ``train.lr_schedule`` reaches (``train.lr_at(round)``), built on first use by the
    algorithm's factory (``Algorithm.at_lr``) and the train section's optimiser at that lr.
    Those of ``train.lr`` are the run's own; of the others only the latest is kept (a cosine
    schedule reaches a new lr every round; FedDF's factory holds a copy of its proxy data)."""

    def __init__(self, train: Any, base: tuple[Algorithm, Transform, StepFn],
                 build: Callable[[float], tuple[Algorithm, Transform, StepFn]]) -> None:
        self.lr_at: Callable[[int], float] = train.lr_at
        self._base = (train.lr, base)
        self._last: tuple[float, tuple[Algorithm, Transform, StepFn]] | None = None
        self._build = build

    def pieces(self, lr: float) -> tuple[Algorithm, Transform, StepFn]:
        """The algorithm, optimiser and step at ``lr`` (the same objects while it is the latest)."""
        if lr == self._base[0]:
            return self._base[1]
        if self._last is None or self._last[0] != lr:
            self._last = (lr, self._build(lr))
        return self._last[1]

    def owns(self, tools: Any) -> bool:
        """Whether ``tools`` train with this schedule's own pieces at their lr (a personalisation's
        tools, with another algorithm and optimiser, do not)."""
        held = [p for lr, p in (self._base, self._last or (None, None)) if lr == tools.lr]
        return bool(held) and all(a is b for a, b in zip(held[0], (tools.algorithm, tools.optimizer, tools.step)))
