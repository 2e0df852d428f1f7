"""One local step as a pure function, shared by every executor."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from fedrift.algorithms.base import Algorithm, check_local_loss
from fedrift.functional.optim import Transform, apply_updates
from fedrift.engine.privacy import dp_grad_and_value
from fedrift.engine.round_types import Params, RoundTools, StepFn
from fedrift.engine.step_values import LR, Rebuild
from fedrift.engine.teacher import TeacherMemo
from fedrift.errors import ConfigError
from fedrift.models.norm import batch_norms, norm_mode, running_stat_names, without_stats


ONEDNN_IC_BLOCK = 16  # oneDNN's widest f32 input-channel block on x86 (AVX-512): narrower 1x1 kernels train unlaid


def make_apply(
    model: nn.Module, buffers: dict[str, torch.Tensor], channels_last: bool = False, prepare: Callable[..., Any] | None = None
) -> "ModelApply":
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
    plain ``apply``. Not for a call that may be differentiated (grad mode on) in a model with a
    1x1 kernel of fewer than 16 input channels (a narrow ResNet's strided shortcut): oneDNN's
    channels-last backward of a strided 1x1 convolution with fewer input channels than its
    block writes past its workspace (uxlfoundation/oneDNN issue 6035; the block is 16 with
    AVX-512, 8 with AVX2). Here, with torch 2.13, ResNet-8 of width 4 or 8 then crashed with
    two threads (glibc: "corrupted size vs. prev_size"); that issue reports wrong gradients or
    a crash at one thread too on AVX2 machines. Inference keeps the layout (a forward pass).

    A model with BatchNorm (``models/norm.py``): ``params`` is the whole model state, its
    running statistics included, and the call runs in eval mode with them; the local step
    runs the trained model through :meth:`ModelApply.train_call` instead.
    """
    return ModelApply(model, buffers, channels_last, prepare)


class ModelApply:
    """The ``apply`` of :func:`make_apply`, a callable; ``stat_keys`` names the BatchNorm running
    statistics a model state carries (empty without BatchNorm: ``apply`` is then exactly the
    plain functional call)."""

    def __init__(self, model: nn.Module, buffers: dict[str, torch.Tensor], channels_last: bool = False,
                 prepare: Callable[..., Any] | None = None) -> None:
        self.model, self.channels_last, self.prepare = model, channels_last, prepare
        # no 1x1 kernel narrower than oneDNN's widest input-channel block (make_apply's docstring)
        self.laid_out_training = not any(p.dim() == 4 and p.shape[-2:] == (1, 1) and p.shape[1] < ONEDNN_IC_BLOCK
                                         for p in model.parameters())
        self.stat_keys = running_stat_names(model)
        self.norms = [m for _, m in batch_norms(model)]
        carried = set(self.stat_keys)
        self.buffers = {k: v for k, v in buffers.items() if k not in carried}  # fixed: not model state
        self.slots = _slots(model)
        # functional_call's weight tying walks every parameter and buffer name on each call
        # (30 us of a tiny MLP's 190 us forward): only for a model that has a tensor under two
        # names; for any other it changes nothing, so it is skipped there
        self.tie = len({id(store[leaf]) for store, leaf in self.slots.values()}) < len(self.slots)

    def _inputs(self, params: Params, x: torch.Tensor) -> tuple[Params, torch.Tensor]:
        if self.channels_last and (self.laid_out_training or not torch.is_grad_enabled()):
            params = {k: v.clone(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in params.items()}
        if self.prepare is not None and not x.is_floating_point():
            x = self.prepare(x)
        return params, x

    def __call__(self, params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
        params, x = self._inputs(params, x)
        dicts = (params, self.buffers) if self.buffers else params  # no merged copy a call where nothing is fixed
        if not self.norms:
            return self._call(dicts, x, mode)
        with norm_mode(self.norms, train=False):
            return self._call(dicts, x, mode)

    def _call(self, dicts: Params | tuple[Params, ...], x: torch.Tensor, mode: str) -> Any:
        """``torch.func.functional_call(model, dicts, (x,), {"mode": mode}, strict=True)``, the
        same swap of tensors around the same forward pass, without the checks it repeats on
        each call (a walk over every name of the model: a quarter of a tiny model's step).
        What they check is checked here once a call, by the names' set: anything else (a
        missing, unexpected or repeated name; a model with tied tensors) goes to
        ``functional_call`` itself, which raises or ties as it does.

        Like ``functional_call``, a tensor that the forward pass put in the model's place of
        one (``models/norm.py``'s new running statistics) is written back into the dict handed
        in (a single dict; the merged one of a tuple is not kept)."""
        parts = (dicts,) if isinstance(dicts, dict) else dicts
        state = parts[0] if len(parts) == 1 else {k: v for d in parts for k, v in d.items()}
        if self.tie or len(state) != sum(map(len, parts)) or state.keys() != self.slots.keys():
            return functional_call(self.model, dicts, (x,), {"mode": mode}, strict=True, tie_weights=self.tie)
        slots, saved = self.slots, []
        try:
            for name, value in state.items():
                store, leaf = slots[name]
                saved.append((name, store, leaf, store[leaf]))
                store[leaf] = value
            return self.model(x, mode=mode)
        finally:
            for name, store, leaf, old in saved:
                state[name] = store[leaf]
                store[leaf] = old

    def train_call(self, params: Params, stats: Params, x: torch.Tensor, mode: str = "logits",
                   mask: torch.Tensor | None = None) -> tuple[Any, Params]:
        """The trained model's forward pass in train mode: ``(output, new running statistics)``.
        ``params`` without the statistics, ``stats`` the current ones; ``mask`` (bool per row)
        keeps padded rows out of the batch statistics."""
        params, x = self._inputs(params, x)
        state = {**params, **stats, **self.buffers}  # one dict: the layers' new statistics are written back into it
        with norm_mode(self.norms, train=True, mask=mask):
            out = self._call(state, x, mode)
        return out, {k: state[k] for k in self.stat_keys}


def _slots(model: nn.Module) -> dict[str, tuple[dict[str, Any], str]]:
    """Each parameter's and buffer's full name -> (its module's ``_parameters`` or ``_buffers``
    dict, its name there): where ``functional_call`` swaps it (``torch.nn.utils.stateless``)."""
    slots: dict[str, tuple[dict[str, Any], str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for store in (module._parameters, module._buffers):
            for leaf, value in store.items():
                if value is not None:
                    slots[f"{prefix}.{leaf}" if prefix else leaf] = (store, leaf)
    return slots


def stat_keys_of(apply: Callable[..., Any]) -> tuple[str, ...]:
    """The running statistics an ``apply``'s model carries (none for a plain function)."""
    return tuple(getattr(apply, "stat_keys", ()))


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


def checked_local_loss(algorithm: Algorithm, precision: str = "fp32") -> Callable[..., Any]:
    """``algorithm.local_loss(params, batch, payload, ctx, apply)``, under bfloat16 autocast for
    ``precision="bf16"`` (loss and aux back in float32), its output checked at the first call;
    ``alg``: the algorithm built at other values (``engine.step_values``) in its place."""
    checked = False

    def checked_loss(params: Params, batch: dict, payload: dict, ctx: dict, apply_: Callable[..., Any],
                     alg: Algorithm | None = None):
        nonlocal checked
        local_loss = (alg or algorithm).local_loss
        if precision == "bf16":
            with torch.autocast(batch["y"].device.type, dtype=torch.bfloat16):
                loss, aux = local_loss(params, batch, payload, ctx, apply_)
            out = (loss.float(), {k: v.float() for k, v in aux.items()})
        else:
            out = local_loss(params, batch, payload, ctx, apply_)
        if not checked:  # the first step of this executor's (or worker's) first client
            check_local_loss(algorithm.name, out)
            checked = True
        return out

    return checked_loss


def apply_update(optimizer: Transform, grads: Params, opt_state: Any, trained: Params) -> tuple[Params, Any]:
    """The optimiser's step: the new parameters and optimiser state (new tensors)."""
    updates, opt_state = optimizer.update(grads, opt_state, trained)
    return apply_updates(trained, updates), opt_state


def make_step(
    algorithm: Algorithm, apply: Callable[..., Any], optimizer: Transform, functional: bool = False, inplace: bool = False,
    dp: tuple[float, float] | None = None, precision: str = "fp32",
) -> StepFn:
    """``step(params, opt_state, batch, payload, ctx) -> (params, opt_state, loss, aux)``.

    ``functional=True`` takes gradients with ``torch.func`` (needed under ``vmap``);
    otherwise with autograd, for the one-client-at-a-time executors. ``inplace=True`` (not
    with ``functional``) updates the caller's ``params`` and optimiser state in place when
    the optimiser can (``Transform.apply_inplace``) and returns them: the caller owns them
    (the executors copy the starting model once per client). No new model per step: on the
    FedAvg CNN the new tensors had cost 7-10% of the step (page faults on fresh memory).
    ``dp=(C, z)``: DP-SGD's clipped, noised gradient (:func:`fedrift.engine.privacy.dp_grad_and_value`).
    ``precision="bf16"`` (``train.precision``): ``local_loss`` (forward and backward) runs under
    bfloat16 autocast on the batch's device; the loss, the gradients, the optimiser and the new
    parameters stay float32.

    BatchNorm models (``apply.stat_keys``, ``models/norm.py``): ``params`` carries the running
    statistics too. ``local_loss``, ``grad_correction`` and the optimiser see the parameters
    without them (so the optimiser state must be made from those: :func:`optimizer_init`);
    a call of ``apply`` on such a dict is the trained model, in train mode, and the statistics
    it leaves are returned in the new ``params``. Under ``functional`` the batch's zero-weight
    rows (the batched executor's padding) are left out of the batch statistics.
    """

    stat_keys = stat_keys_of(apply)
    if stat_keys and dp is not None:
        raise ConfigError("privacy.level: DP-SGD cannot train a model with BatchNorm (batch statistics mix the "
                          "samples); allowed: model.norm group with privacy")
    checked_loss = checked_local_loss(algorithm, precision)

    def loss_fn(params: Params, batch: dict, payload: dict, ctx: dict):
        return checked_loss(params, batch, payload, ctx, apply)

    def stats_loss_fn(params: Params, stats: Params, batch: dict, payload: dict, ctx: dict):
        """``local_loss`` with the running statistics threaded through its train-mode calls;
        returns ``(loss, (aux, new statistics))``."""
        held = dict(stats)
        mask = batch["w"] > 0 if functional else None

        def step_apply(p: Params, x: torch.Tensor, mode: str = "logits") -> Any:
            if stat_keys[0] in p:  # a fixed model (broadcast, teacher, previous model): eval mode
                return apply(p, x, mode)
            out, new = apply.train_call(p, held, x, mode, mask)
            held.update(new)
            return out

        loss, aux = checked_loss(params, batch, payload, ctx, step_apply)
        return loss, (aux, held)

    fn = stats_loss_fn if stat_keys else loss_fn
    if dp is not None:
        grad_fn = dp_grad_and_value(fn, *dp)
    else:
        grad_fn = grad_and_value(fn, has_aux=True) if functional else autograd_grad_and_value(fn)
    correct = algorithm.grad_correction
    in_place = optimizer.apply_inplace if inplace and not functional else None

    def step(params: Params, opt_state: Any, batch: dict, payload: dict, ctx: dict):
        if stat_keys:
            trained = without_stats(params, stat_keys)
            grads, (loss, (aux, stats)) = grad_fn(trained, {k: params[k] for k in stat_keys}, batch, payload, ctx)
        else:
            trained, stats = params, None
            grads, (loss, aux) = grad_fn(params, batch, payload, ctx)
        if correct is not None:
            grads = correct(grads, trained, payload, ctx)
        aux = {k: v.detach() for k, v in aux.items()}
        if in_place is not None:
            with torch.no_grad():
                opt_state = in_place(grads, opt_state, trained)
            if stats is not None:
                params.update(stats)  # the trained tensors moved in place; the statistics are new
            return params, opt_state, loss.detach(), aux
        new, opt_state = apply_update(optimizer, grads, opt_state, trained)
        if stats is not None:
            return {k: (new[k] if k in new else stats[k]).detach() for k in params}, opt_state, loss.detach(), aux
        return {k: v.detach() for k, v in new.items()}, opt_state, loss.detach(), aux

    return step


def optimizer_init(optimizer: Transform, params: Params, apply: Callable[..., Any],
                   start: Callable[[Any, Any], Any] | None = None, ctx: Any = None) -> Any:
    """The optimiser state for a client's ``params``: over the trained tensors only (a
    BatchNorm model's running statistics are not optimised, see :func:`make_step`), then
    ``start(state, ctx)`` where the algorithm prepares it from the client's context
    (``Algorithm.optimizer_start``)."""
    state = optimizer.init(without_stats(params, stat_keys_of(apply)))
    return state if start is None else start(state, ctx)


def make_tools(
    model: nn.Module, algorithm: Algorithm, train: Any, x: torch.Tensor, y: torch.Tensor, seed: int,
    eval_batch: int | None = None, prepare: Callable[..., Any] | None = None, augment: Any = None, privacy: Any = None,
) -> RoundTools:
    """The run's ``RoundTools``: apply, the local optimiser (the algorithm's own, else the
    train section's ``optimizer``) and the step; one place, for the loop and for worker processes.
    ``prepare``: the dataset's ``prepare`` (see :func:`make_apply`); one that reads the batch
    (``TokenCut``) is not used under ``vmap``: ``RoundTools.batch`` cuts every training batch
    before it reaches a step, the batched executor's stacked clients to their longest;
    ``augment``: the training batches' ``engine.augment.Augment`` (None: off)."""
    from fedrift.algorithms.terms import CHUNK
    from fedrift.functional.optim import local_optimizer

    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    if running_stat_names(model) and privacy is not None and privacy.level != "none":
        raise ConfigError(
            f"privacy.level: {privacy.level} cannot protect a model with BatchNorm (batch statistics mix the "
            "samples; the running statistics would travel unnoised); allowed: none with model.norm batch, or model.norm group"
        )
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
    precision = getattr(train, "precision", "fp32")
    step = make_step(algorithm, step_apply, optimizer, inplace=True, dp=dp, precision=precision)
    rebuild = None
    if algorithm.at_values is not None:  # the step at other values: a schedule's rounds, a stack's runs (engine.step_values)
        def at_values(values: Any) -> tuple[Algorithm, Transform]:
            alg = algorithm.at_values(values)
            return alg, alg.optimizer or local_optimizer(train, values[LR])

        rebuild = Rebuild(algorithm.value_keys, at_values)
    schedule = None
    if getattr(train, "lr_schedule", "constant") != "constant":
        if rebuild is None:
            raise ValueError(f"algorithm {algorithm.name}: train.lr_schedule {train.lr_schedule} needs the algorithm "
                             "as engine.build.build_algorithm makes it (with at_values)")

        def pieces(lr: float) -> tuple[Algorithm, Transform, StepFn]:
            alg, opt = rebuild.pieces({LR: lr})
            return alg, opt, make_step(alg, step_apply, opt, inplace=True, dp=dp, precision=precision)

        schedule = LrSchedule(train, (algorithm, optimizer, step), pieces)
    return RoundTools(
        algorithm, apply, optimizer, step, x, y, seed=seed,
        vmap_apply=make_apply(model, buffers, prepare=prepare if vmappable else None), eval_batch=eval_batch or (CHUNK if channels_last else 1024),
        teacher_memo=TeacherMemo(len(x)) if algorithm.teacher is not None and augment is None else None,
        augment=augment, dp=dp, dp_shapes=shapes, cut=None if vmappable else prepare, lr=train.lr, schedule=schedule,
        precision=precision, rebuild=rebuild,
    )


class LrSchedule:
    """A run's training pieces (algorithm, optimiser, step) at each local learning rate its
    ``train.lr_schedule`` reaches (``train.lr_at(round)``), built on first use by the
    algorithm's factory (``Algorithm.at_values``) and the train section's optimiser at that lr.
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
