"""Functional local optimisers, assembled from pure transforms (the optax pattern).

A transform is ``init(params) -> state`` and ``update(grads, state, params) -> (updates,
state)``; SGD is one transform (after clipping, when asked). All of it is plain tensor code, so the batched executor can ``vmap`` it over clients. Algorithms
that correct the gradient (SCAFFOLD, FedADC) add one more link in front.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fedrift.functional.tree import leaves, tree_map

Params = dict[str, torch.Tensor]
State = Any


@dataclass(frozen=True)
class Transform:
    """``init(params) -> state``; ``update(grads, state, params) -> (updates, state)``.

    ``apply_inplace(grads, state, params) -> state``, where given, moves ``params`` by the
    step in place and returns the state (also updated in place): what ``update`` and
    ``apply_updates`` compute, bit for bit, without new model-sized tensors each step. For
    callers that own ``params`` (one client at a time); never under ``vmap``."""

    init: Callable[[Params], State]
    update: Callable[[Params, State, Params], tuple[Params, State]]
    apply_inplace: Callable[[Params, State, Params], State] | None = None


def clip_by_global_norm(max_norm: float) -> Transform:
    """Scale the whole gradient down to ``max_norm`` (torch's clip_grad_norm_ rule)."""

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        norm = torch.stack([g.pow(2).sum() for g in leaves(grads)]).sum().sqrt()
        factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        return tree_map(lambda g: g * factor, grads), state

    return Transform(lambda p: (), update)


def scale(factor: float) -> Transform:
    return Transform(lambda p: (), lambda g, s, p: (tree_map(lambda x: x.mul(factor), g), s))


def _through(links: tuple[Transform, ...], grads: Params, state: State, params: Params) -> tuple[Params, list]:
    """``grads`` passed through each link's update in turn; the links' new states."""
    new_state = []
    for t, s in zip(links, state):
        grads, s = t.update(grads, s, params)
        new_state.append(s)
    return grads, new_state


def chain(*transforms: Transform) -> Transform:
    """The transforms one after another; in place when the last one can be (the others only
    transform the gradient)."""

    def init(params: Params) -> State:
        return tuple(t.init(params) for t in transforms)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        grads, new_state = _through(transforms, grads, state, params)
        return grads, tuple(new_state)

    last = transforms[-1].apply_inplace if transforms else None

    def apply_inplace(grads: Params, state: State, params: Params) -> State:
        grads, new_state = _through(transforms[:-1], grads, state, params)
        return (*new_state, last(grads, state[-1], params))

    return Transform(init, update, apply_inplace if last is not None else None)


def decay(g: torch.Tensor, p: torch.Tensor, weight_decay: float) -> torch.Tensor:
    """``g + wd p`` as one fused ``add``: the single weight-decay code path of every local
    optimiser and gradient correction. A multiply then an add (``g + wd * p``) rounds
    differently from the fused form on some CPUs' kernels and not on others', so methods
    that decay on their own path would equal FedAvg at zero only by luck."""
    return g.add(p, alpha=weight_decay) if weight_decay else g


def add_decay(grads: Params, params: Params, weight_decay: float) -> Params:
    """:func:`decay` on every leaf (the gradient corrections of SCAFFOLD and FedADC)."""
    return tree_map(lambda g, p: decay(g, p, weight_decay), grads, params) if weight_decay else grads


def sgd(
    lr: float, momentum: float = 0.0, weight_decay: float = 0.0, clip_grad_norm: float | None = None
) -> Transform:
    """Local SGD as torch.optim.SGD computes it: ``d = g + wd p``, ``buf = momentum buf + d``
    (a zero buffer at the start: heavy-ball momentum reset each round), update ``-lr buf``.

    One transform, one pass per tensor for each of those lines: under ``vmap`` these
    elementwise passes over every client's parameters are much of a step's cost, so they
    are not split into separate decay, trace and scale links."""

    def init(params: Params) -> State:
        return tree_map(torch.zeros_like, params) if momentum else ()

    def update(grads: Params, buf: State, params: Params) -> tuple[Params, State]:
        d = add_decay(grads, params, weight_decay)
        if momentum:
            buf = tree_map(lambda b, x: x.add(b, alpha=momentum), buf, d)
            d = buf
        return tree_map(lambda x: x.mul(-lr), d), buf

    def apply_inplace(grads: Params, buf: State, params: Params) -> State:
        # update's very operations, written into buf and params: the same bits, so methods
        # with another optimiser still equal FedAvg exactly at zero (an ``add_(alpha=-lr)``
        # would fuse a multiply-add and round differently). The gradients are only read
        # (autograd may hand out expanded views).
        for name, p in params.items():
            d = decay(grads[name], p, weight_decay)
            if momentum:
                d = torch.add(d, buf[name], alpha=momentum, out=buf[name])
            p.add_(d.mul(-lr))
        return buf

    step = Transform(init, update, apply_inplace)
    return chain(clip_by_global_norm(clip_grad_norm), step) if clip_grad_norm is not None else step


def adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
    """Adam as torch.optim.Adam computes it (no weight decay); state ``{"count", "m", "v"}``
    with the step count a tensor, so the transform also runs under ``vmap``."""

    def init(params: Params) -> State:
        first = next(iter(params.values()))
        return {"count": torch.zeros((), dtype=torch.float64, device=first.device), "m": tree_map(torch.zeros_like, params),
                "v": tree_map(torch.zeros_like, params)}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        t = state["count"] + 1
        m = tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, state["m"], grads)
        v = tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, state["v"], grads)
        step = lr / (1 - b1**t)
        root = torch.sqrt(1 - b2**t)
        updates = tree_map(lambda m_, v_: -step * m_ / (v_.sqrt() / root + eps), m, v)
        return updates, {"count": t, "m": m, "v": v}

    return Transform(init, update)


def adamw(lr: float, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
    """AdamW (Loshchilov and Hutter) as torch.optim.AdamW computes it: the decay is decoupled
    from the moments, ``p <- p - lr wd p - lr m_hat / (sqrt(v_hat) + eps)``, with
    ``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)``; moments and count start at zero
    each round (a fresh ``init`` per client and round, as SGD's momentum). Plain tensor code:
    runs under ``vmap``. torch applies the decay before the Adam step, in place; here both are
    one update, so results agree with torch's to float rounding."""
    base = adam(lr, b1, b2, eps)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        updates, state = base.update(grads, state, params)
        if weight_decay:
            if isinstance(lr, torch.Tensor):  # a stacked run's own lr (engine.step_values): no alpha from a tensor
                updates = tree_map(lambda u, p: u.add(p * (-lr * weight_decay)), updates, params)
            else:
                updates = tree_map(lambda u, p: u.add(p, alpha=-lr * weight_decay), updates, params)
        return updates, state

    return Transform(base.init, update)


def local_optimizer(train: Any, lr: Any = None) -> Transform:
    """The local optimiser of the ``train`` section: ``sgd`` (lr, momentum, weight_decay) or
    ``adamw`` (lr, weight_decay; momentum unused), after ``clip_grad_norm`` when set. ``lr``:
    another learning rate than ``train.lr`` (a float, or a tensor under a stack's vmap)."""
    lr = train.lr if lr is None else lr
    if getattr(train, "optimizer", "sgd") == "sgd":
        return sgd(lr, train.momentum, train.weight_decay, train.clip_grad_norm)
    step = adamw(lr, train.weight_decay)
    return chain(clip_by_global_norm(train.clip_grad_norm), step) if train.clip_grad_norm is not None else step


def apply_updates(params: Params, updates: Params) -> Params:
    return tree_map(lambda p, u: p + u, params, updates)
