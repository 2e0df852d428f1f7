"""FedDF (Lin, Kong, Stich & Jaggi 2020, "Ensemble Distillation for Robust Model Fusion in
Federated Learning"; ALGORITHMS.md "FedDF").

Clients run FedAvg's local training. The server averages, ``w = sum_k p_k w_k``, then
fine-tunes ``w`` on an unlabelled proxy set ``D`` towards the ensemble of the round's
client models::

    teacher(x) = (1/|S_t|) sum_{k in S_t} softmax(f(w_k; x) / T)      (computed once a round)
    loss(w)    = T^2 mean_{x in batch} KL( teacher(x) || softmax(f(w; x) / T) )

with Adam (``lr``, fresh each round, as the released code's per-round optimiser), batches of
``batch_size`` proxy samples, for at most ``steps`` steps with early stopping on a labelled
server validation split ``V``: the model is scored on ``V`` before distillation (step 0),
every ``eval_every`` steps and at the budget's end; the best-scoring model is kept (step 0's,
i.e. FedAvg's average itself, included), and the run stops after ``patience`` evaluations in
a row without improvement. The score is validation accuracy, ties broken by lower
validation cross-entropy.

Data: the server's held-out training samples (``partition.holdout``, never in any client's
data; ``Setup.holdout_x``/``holdout_y``) are split once per run, by a seeded permutation
(seed, ``SERVER_RNG``, 0), into ``V`` (a ``val_share`` of them, labels used) and the proxy
``D`` (the rest; its labels are dropped when the algorithm is built and never read). The
algorithm refuses, when it is built (before anything is written), a run without held-out
data, with a ConfigError naming ``partition.holdout``. Proxy batches are drawn as epochs of
seeded permutations of ``D``, keyed by (seed, ``SERVER_RNG``, round).

Decisions where the spec is silent, and where the paper or its code differ:

- Teacher: the *mean of the client softmaxes* (the spec). The paper's Algorithm 1 applies
  ``softmax`` to the mean of the client logits. Uniform over the sampled clients (the
  paper's ``1/|S_t|``), whatever ``aggregation`` says; the parameter average uses ``p_k``.
- ``T^2`` scales the KL (Hinton et al.'s convention, so that gradient sizes do not shrink
  as ``T`` grows); at the default ``T = 1`` it is 1.
- Budget: ``steps = 500``, the spec's, with ``eval_every = 50`` and ``patience = 4`` (so at
  least 200 steps, ~30 passes over a 400-sample proxy at batch 64: mnist5k with
  ``partition.holdout: 0.1``). The paper fixes 500 steps for its CIFAR runs with
  early stopping on a validation set; its code evaluates every 100 steps. Learning rate
  constant (the paper mentions cosine annealing; the spec gives a fixed Adam lr 1e-3).
- ``val_share = 0``: no early stopping, the whole budget runs and the last model is kept.
- ``steps = 0`` returns FedAvg's average itself, bit for bit (the proxy is never touched).
- Server-side randomness uses the purpose tag ``SERVER_RNG = 102`` of ``functional.rng.generator``
  (the engine's own tags are 1-3; FedGen's is 101).

Cost per round on the server: ``|S_t|`` forward passes over the proxy (the teacher), up to
``steps`` forward/backward passes on ``batch_size`` samples, and one forward pass over ``V``
per evaluation. Communication is FedAvg's.
"""

from __future__ import annotations

from typing import Annotated, Callable, Iterator

import numpy as np
import torch
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import CHUNK, kl_to_target
from fedrift.functional.rng import generator
from fedrift.functional.tree import unstack, weighted_sum
from fedrift.errors import ConfigError
from fedrift.params import params

SERVER_RNG = 102  # purpose tag of FedDF's server-side draws (validation split, proxy batches)


@params
class FedDFParams(AlgorithmParams):
    """FedDF's options (Lin et al. 2020; ALGORITHMS.md).

    T: distillation temperature (1).
    lr: the server's Adam learning rate (1e-3).
    steps: distillation step budget per round (500; 0 gives FedAvg exactly).
    batch_size: proxy samples per distillation step (64).
    val_share: share of the held-out data used as the labelled validation split for early
        stopping (0.2); the rest is the unlabelled proxy set. 0: no early stopping.
    eval_every: distillation steps between two validation scores (50).
    patience: stop after this many validation scores in a row without improvement (4).
    """

    T: Annotated[float, Field(gt=0)] = 1.0
    lr: Annotated[float, Field(gt=0)] = 1e-3
    steps: Annotated[int, Field(ge=0)] = 500
    batch_size: Annotated[int, Field(ge=1)] = 64
    val_share: Annotated[float, Field(ge=0, lt=1)] = 0.2
    eval_every: Annotated[int, Field(ge=1)] = 50
    patience: Annotated[int, Field(ge=1)] = 4


# ---------------------------------------------------------------------------------------
# Pure pieces (tested on their own)


def split_holdout(n: int, val_share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(proxy, validation)`` positions in the held-out set: a seeded permutation (seed,
    SERVER_RNG, 0), its first ``round(val_share n)`` (at least 1 when ``val_share > 0``) for
    validation. Labels play no part, so the proxy's are never read."""
    order = generator(seed, SERVER_RNG, 0).permutation(n)
    n_val = 0 if val_share == 0 else max(1, round(val_share * n))
    return torch.from_numpy(np.sort(order[n_val:])), torch.from_numpy(np.sort(order[:n_val]))


def proxy_batches(n: int, batch_size: int, seed: int, round_: int) -> Iterator[torch.Tensor]:
    """Proxy sample positions per step, endlessly: epochs of seeded permutations of ``n``
    (keyed by seed, SERVER_RNG, round), cut into batches of ``batch_size`` (the last of an
    epoch may be shorter; never longer than ``n``)."""
    rng = generator(seed, SERVER_RNG, round_)
    while True:
        order = torch.from_numpy(rng.permutation(n))
        yield from order.split(batch_size)


@torch.no_grad()
def ensemble_probs(apply: Callable, clients: list[Params], x: torch.Tensor, T: float) -> torch.Tensor:
    """``(1/K) sum_k softmax(f(w_k; x) / T)``: the teacher's class probabilities, (n, C)."""
    out = []
    for chunk in x.split(CHUNK):
        out.append(torch.stack([torch.softmax(apply(c, chunk) / T, dim=-1) for c in clients]).mean(0))
    return torch.cat(out)


@torch.no_grad()
def validation_score(apply: Callable, params_: Params, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(accuracy, -cross_entropy)`` on the validation split: larger is better."""
    correct, loss = 0.0, 0.0
    for xc, yc in zip(x.split(CHUNK), y.split(CHUNK)):
        z = apply(params_, xc)
        correct += float((z.argmax(-1) == yc).sum())
        loss += float(torch.nn.functional.cross_entropy(z, yc, reduction="sum"))
    return correct / len(y), -loss / len(y)


def distill(
    apply: Callable,
    start: Params,
    teacher: torch.Tensor,
    proxy_x: torch.Tensor,
    val_x: torch.Tensor | None,
    val_y: torch.Tensor | None,
    batches: Iterator[torch.Tensor],
    hp: FedDFParams,
) -> tuple[Params, dict]:
    """Adam on ``T^2 KL(teacher || softmax(f(w; x)/T))`` over proxy batches, from ``start``.

    With a validation split: the best-scoring model (``start`` itself if nothing beats it),
    stopping after ``hp.patience`` evaluations without improvement; without one, the last.
    Returns the model and a log: steps run, the kept model's step, validation scores."""
    student = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    opt = torch.optim.Adam(list(student.values()), lr=hp.lr)
    validate = val_x is not None and len(val_x) > 0
    best_params, best_step, bad, step = start, 0, 0, 0
    scores = [(0, validation_score(apply, start, val_x, val_y))] if validate else []
    best = scores[0][1] if validate else None
    with torch.enable_grad():
        for step in range(1, hp.steps + 1):
            idx = next(batches).to(proxy_x.device)
            w = torch.full((len(idx),), 1.0 / len(idx), device=proxy_x.device)
            loss = hp.T**2 * kl_to_target(teacher[idx], apply(student, proxy_x[idx]), w, hp.T)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not validate or (step % hp.eval_every and step != hp.steps):
                continue
            score = validation_score(apply, student, val_x, val_y)
            scores.append((step, score))
            if score > best:
                best, best_step, bad = score, step, 0
                best_params = {k: v.detach().clone() for k, v in student.items()}
            else:
                bad += 1
                if bad >= hp.patience:
                    break
    if not validate:
        best_params, best_step = ({k: v.detach() for k, v in student.items()} if step else start), step
    return best_params, {"steps": step, "best_step": best_step, "scores": scores}


# ---------------------------------------------------------------------------------------
# The algorithm


@ALGORITHMS.register(
    "feddf",
    "FedDF: FedAvg, then distil the clients' ensemble into the average on server-held proxy data",
    FedDFParams,
    space={"lr": "log:1e-4:1e-2"},
)
def feddf(hp: FedDFParams, setup: Setup) -> Algorithm:
    if setup.holdout_x is None or setup.holdout_y is None or len(setup.holdout_x) == 0:
        raise ConfigError(
            "partition.holdout: algorithm feddf distils on proxy data the server holds and this run "
            "holds none; set partition.holdout to a share of the training set (e.g. 0.1)"
        )
    proxy_ix, val_ix = split_holdout(len(setup.holdout_x), hp.val_share, setup.seed)
    if len(proxy_ix) == 0:
        raise ConfigError(
            f"partition.holdout: feddf's validation split (algorithm.val_share {hp.val_share}) takes all "
            f"{len(setup.holdout_x)} held-out samples and leaves no proxy data; raise partition.holdout"
        )
    device = setup.holdout_x.device
    proxy_x = setup.holdout_x[proxy_ix.to(device)]  # labels dropped here
    val_x = setup.holdout_x[val_ix.to(device)] if len(val_ix) else None
    val_y = setup.holdout_y[val_ix.to(device)] if len(val_ix) else None

    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        avg = weighted_sum(uploads["params"], weights)
        if hp.steps == 0:
            return {**state, "params": avg}
        if setup.apply is None:
            raise ValueError("feddf: Setup.apply is needed to distil on the server")
        teacher = ensemble_probs(setup.apply, unstack(uploads["params"]), proxy_x, hp.T)
        batches = proxy_batches(len(proxy_x), hp.batch_size, setup.seed, info.round)
        params_, log = distill(setup.apply, avg, teacher, proxy_x, val_x, val_y, batches, hp)
        return {**state, "params": params_, "distill": {"steps": log["steps"], "best_step": log["best_step"]}}

    return Algorithm(name="feddf", hparams=hp, local_loss=ce_loss, aggregate=aggregate)
