"""Runs that differ only in values, trained by one vectorised step: a tune's trials stacked.

A stack (``engine.executors.stacked``) trains several runs' clients with one ``vmap`` call of
one local step. Runs of one config but for the seed share that step as it is. Runs that also
differ in ``train.lr`` or in the options their algorithm's tune space names
(``Algorithm.value_keys``: FedProx's ``mu``, FedGKD's ``gamma``, ...) share it too: the step is
then built inside the vectorised call from each client's values, one row a client in its
context (under :data:`VALUES`), by the algorithm's own factory (``Algorithm.at_values``) and the
local optimiser at that learning rate. The step's hooks (``local_loss``, ``grad_correction``,
the optimiser) read the values of the client's run; the hooks outside the step
(``client_start``, ``client_result``, the server's) are each run's own, built with its values.

Same function, other rounding: a value the run alone multiplies as a Python float is a float32
tensor here, and an expression of two values (``lr * weight_decay``) is rounded to float32
where the run alone computes it in double. Tested in ``tests/engine/test_stacked_runs.py``:
every algorithm, its two runs at other learning rates and other values of every key of its
space, equals the runs done alone within the stack's tolerance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from fedrift.algorithms.base import Algorithm
from fedrift.functional.optim import Transform

VALUES = "step_values"  # the key of a client's values in the step's context
LR = "train.lr"  # the learning rate among the values (an option may be called lr: CCVR's calibration)


@dataclass(frozen=True)
class Rebuild:
    """How a run's step is built at other values: ``keys``, the algorithm's options that may
    differ between runs sharing the step (besides the learning rate); ``pieces(values)``, the algorithm and
    local optimiser at ``values`` (``{LR: train.lr, option: value}``, floats or tensors)."""

    keys: tuple[str, ...]
    pieces: Callable[[Mapping[str, Any]], tuple[Algorithm, Transform]]


def fedavg_step(alg: Algorithm) -> bool:
    """Whether ``alg`` trains its clients exactly as FedAvg does (what sets it apart happens on
    the server: FedAvgM, FedAdam, FedNova, FedExp, ...): the plain cross-entropy, the train
    section's optimiser, and no correction, teacher, noise, client start, client state or
    personal model. Such methods share one step whatever their names and options."""
    from fedrift.algorithms.fedavg import ce_loss

    return (alg.local_loss is ce_loss and alg.grad_correction is None and alg.optimizer is None and alg.teacher is None
            and alg.noise_dim is None and alg.client_start is None and alg.init_client is None and not alg.personal
            and alg.client_model is None)


def values_of(tools: Any) -> dict[str, float]:
    """A run's values of its step at these training tools: its learning rate and its options'
    :attr:`Rebuild.keys` (the learning rate alone for :func:`fedavg_step`'s methods)."""
    if fedavg_step(tools.algorithm):
        return {LR: float(tools.lr)}
    hp = tools.algorithm.hparams
    return {LR: float(tools.lr), **{k: float(getattr(hp, k)) for k in tools.rebuild.keys}}


def step_kind(tools: Any) -> tuple[Any, ...]:
    """What runs must have in common to train with one step: the algorithm, its options but
    for the values, and its hooks (the same functions: a method is built without its term at
    the value that switches it off, ``algorithms.base.term_off``); FedAvg's step for the
    methods that train their clients as it does (:func:`fedavg_step`); everything, the
    learning rate too, for tools that cannot be built at other values (a personalisation's)."""
    alg, rebuild = tools.algorithm, tools.rebuild
    if rebuild is None:
        return (alg.name, repr(alg.hparams), tools.lr)
    if fedavg_step(alg):
        return ("fedavg step",)
    hp = alg.hparams
    fixed = ({f.name: getattr(hp, f.name) for f in dataclasses.fields(hp) if f.name not in rebuild.keys}
             if dataclasses.is_dataclass(hp) else hp)
    hooks = tuple(getattr(getattr(alg, f.name), "__code__", None) for f in dataclasses.fields(alg)
                  if callable(getattr(alg, f.name)) or getattr(alg, f.name) is None)
    return (alg.name, repr(fixed), hooks)


def value_rows(values: Sequence[Mapping[str, float]], counts: Sequence[int], dev: torch.device) -> dict[str, torch.Tensor]:
    """Each client's values, a float32 row per client (``counts[i]`` clients of run ``i``)."""
    return {k: torch.tensor([v[k] for v, c in zip(values, counts) for _ in range(c)], dtype=torch.float32, device=dev)
            for k in values[0]}


def valued(make: Callable[[Algorithm, Transform], Callable[..., Any]], rebuild: Rebuild) -> Callable[..., Any]:
    """A step ``(params, opt_state, batch, payload, ctx)`` that builds, call by call, the step
    ``make(algorithm, optimizer)`` at the values in ``ctx[VALUES]`` (under ``vmap``: the
    client's own) and runs it on the rest of ``ctx``."""

    def step(params: Any, opt_state: Any, batch: Any, payload: Any, ctx: dict[str, Any]) -> Any:
        rest = {k: v for k, v in ctx.items() if k != VALUES}
        return make(*rebuild.pieces(ctx[VALUES]))(params, opt_state, batch, payload, rest)

    return step


__all__ = ["LR", "VALUES", "Rebuild", "fedavg_step", "step_kind", "valued", "value_rows", "values_of"]
