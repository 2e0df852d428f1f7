"""FedGen (Zhu, Hong & Zhou 2021, "Data-Free Knowledge Distillation for Heterogeneous
Federated Learning"; ALGORITHMS.md "FedGen").

The server keeps, beside the global model ``w_t``, a light conditional generator ``G``
mapping noise and a label to the model's representation space (``feature_dim``)::

    G(eps, y) = W2 relu(W1 [eps, onehot(y)] + b1) + b2        eps ~ N(0, I_noise_dim)

(a 2-layer MLP, ``hidden`` wide, no BatchNorm). A round:

- **Broadcast**: ``w_t`` and, once it has been trained, ``G`` (the downlink counts both).
- **Client k**: local SGD on ``CE + alpha sum_i w_i CE(head(w; G(eps_i, y_i)), y_i)`` where
  ``head`` is the model's classifier (``apply(w, z, mode="head")``), ``eps_i`` the engine's
  per-step ``batch["noise"]`` and ``y_i`` the batch's own labels: they are a draw from the
  client's label distribution, so the term is ``alpha E_{y ~ p_k(y), eps} CE(head(G(eps, y)), y)``
  as the spec writes, with one generated sample per real one, and padding rows weigh 0
  through ``batch["w"]`` like the CE. ``G`` is a constant: only the head gets gradients.
  The client uploads its model and its label counts ``n_{k,c}``.
- **Server**: ``w_{t+1} = sum_k p_k w_k`` (FedAvg), then ``gen_steps`` Adam steps on ``G``
  minimising, over a batch of ``gen_batch`` pairs ``(eps_b, y_b)``::

      CE( sum_k a_{k,y_b} head(w_k; G(eps_b, y_b)), y_b )  +  diversity * L_div(eps, G(eps, y))
      a_{k,c} = n_{k,c} / sum_{j in S_t} n_{j,c}              (per class label-count share)
      L_div   = exp( -mean_{b,b'} d2(eps_b, eps_b') * d1(G_b, G_b') )

  with ``d2`` the mean squared difference over noise dimensions and ``d1`` the mean absolute
  difference over output dimensions (FedGen's ``DiversityLoss(metric="l1")``, which measures
  the noise with its "l2", itself a mean of squares; the diagonal pairs count, as there).
  ``y_b`` is drawn from the sampled clients' pooled label distribution
  ``sum_k n_{k,c} / sum_{k,c} n_{k,c}``, ``eps_b`` standard normal, both from a numpy
  generator keyed by (seed, ``SERVER_RNG``, round): the same draws under every executor.

Switch: the client term is off until ``G`` has been trained once (round 1 has an untrained
``G``): the payload then carries no ``G`` at all, so round 1 is FedAvg (loss, result and
downlink). The local loss tests the payload's *keys*, which are the same for every client of
a round; it never branches on a tensor value, so it stays vmap-safe.

Zero identities: ``alpha = 0`` builds FedAvg itself (no generator, no label counts sent, no
noise drawn), bit for bit. ``gen_steps = 0`` never trains ``G``, so the term never switches on:
FedAvg's models, with the label counts still uploaded.

Decisions where the spec is silent, and where FedGen's released code (zhuangdizhu/FedGen)
differs:

- Ensemble: the spec's (and the paper's eq. 4) cross-entropy of the *ensembled logits*,
  weighted per class by label-count share (the code's ``label_weights``). The released
  code's ``teacher_loss`` is instead ``sum_k mean_b a_{k,y_b} CE(head_k(G_b), y_b)``, a
  weighted sum of per-client cross-entropies (its weighted logits only feed the
  ``ensemble_beta`` student term, 0 by default, not implemented here).
- Labels for ``G``'s training: the pooled label distribution (the spec). The code draws
  uniformly among labels some selected client holds more than once.
- Noise: standard normal (the spec; the code's comment says Gaussian but it draws ``torch.rand``).
- Steps and optimiser: ``gen_steps = 5`` (the spec) with Adam, betas (0.9, 0.999), and
  ``gen_lr = 1e-3``. The code runs ``ensemble_epochs = 50`` steps a round at 3e-4 (its MNIST
  ``ensemble_lr``); with the spec's 10x fewer steps, 3e-4 leaves ``G`` near chance for tens
  of rounds: on mnist5k's MLP (64 hidden) with fixed heads, the ensemble CE went from 2.33
  to 1.69 in 200 steps (40 rounds) at 3e-4, to 0.15 at 1e-3. Set ``gen_lr: 3.0e-4,
  gen_steps: 50`` for the code's schedule. Not implemented: the code's generator weight
  decay (1e-2), and its client-side extras: the ``generative_alpha``/``generative_beta``
  decay (0.98 per round), the second "latent" KL term and the ``gen_batch / batch`` ratio;
  the spec's (and the paper's eq. 5) client objective is CE plus ``alpha`` times the
  generated-sample CE.
- Generator architecture: no BatchNorm (fedrift's models have none; its running statistics
  would also be state outside the parameters). Initial weights: PyTorch's default
  ``nn.Linear`` rule (uniform in ``+-1/sqrt(fan_in)``), drawn from (seed, ``SERVER_RNG``, 0).
- The Adam state persists across rounds (the code keeps one optimiser for the whole run).
- Server-side randomness uses the purpose tag ``SERVER_RNG = 101`` of ``functional.rng.generator``
  (the engine's own tags are 1-3).

Cost: the generator is ``(noise_dim + C) hidden + hidden + hidden feature_dim + feature_dim``
parameters (27k for MNIST's MLP with 64 hidden units, against the model's 51k): downlink is
FedAvg's plus that per client from round 2; uplink FedAvg's plus C floats. Per local step one
generator forward and one head forward/backward on as many rows as the batch; on the server
``gen_steps`` forward/backward passes through ``|S_t|`` heads on ``gen_batch`` rows.
"""

from __future__ import annotations

import math
from typing import Annotated, Callable

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, RoundInfo, Setup, Tree, term_off
from fedrift.algorithms.fedavg import ce_loss
from fedrift.algorithms.terms import weighted_ce
from fedrift.functional.optim import Transform, adam, apply_updates
from fedrift.functional.rng import generator
from fedrift.functional.tree import unstack, weighted_sum
from fedrift.params import params

SERVER_RNG = 101  # purpose tag of FedGen's server-side draws (generator init, training batches)


@params
class FedGenParams(AlgorithmParams):
    """FedGen's options (Zhu et al. 2021; ALGORITHMS.md).

    alpha: weight of the clients' generated-sample cross-entropy (0 gives FedAvg exactly).
    gen_steps: generator training steps per round on the server (the released code: 50).
    gen_batch: generated samples per generator step.
    noise_dim: dimension of the generator's noise input ``eps``.
    hidden: width of the generator's hidden layer (256 for small models).
    gen_lr: the generator's Adam learning rate (the released code: 3e-4 with 50 steps a
        round; 1e-3 here for 5 steps a round, where 3e-4 leaves the generator near chance).
    diversity: weight of the diversity loss in the generator's objective (the code's
        ``ensemble_eta``, 1).
    """

    alpha: Annotated[float, Field(ge=0)] = 1.0
    gen_steps: Annotated[int, Field(ge=0)] = 5
    gen_batch: Annotated[int, Field(ge=1)] = 32
    noise_dim: Annotated[int, Field(ge=1)] = 32
    hidden: Annotated[int, Field(ge=1)] = 256
    gen_lr: Annotated[float, Field(gt=0)] = 1e-3
    diversity: Annotated[float, Field(ge=0)] = 1.0


# ---------------------------------------------------------------------------------------
# The generator (pure pieces, tested on their own)


def init_generator(
    noise_dim: int, num_classes: int, hidden: int, feature_dim: int, seed: int, device: torch.device | str = "cpu"
) -> Params:
    """``G``'s parameters, PyTorch's default ``nn.Linear`` rule (uniform in ``+-1/sqrt(fan_in)``),
    drawn from (seed, SERVER_RNG, 0)."""
    rng = generator(seed, SERVER_RNG, 0)

    def uniform(fan_in: int, shape: tuple[int, ...]) -> torch.Tensor:
        bound = 1.0 / math.sqrt(fan_in)
        return torch.from_numpy(rng.uniform(-bound, bound, shape).astype(np.float32)).to(device)

    fan1 = noise_dim + num_classes
    return {
        "fc1.weight": uniform(fan1, (hidden, fan1)),
        "fc1.bias": uniform(fan1, (hidden,)),
        "fc2.weight": uniform(hidden, (feature_dim, hidden)),
        "fc2.bias": uniform(hidden, (feature_dim,)),
    }


def one_hot(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``onehot(y)`` as a comparison (vmap-safe; ``F.one_hot`` is not under every transform)."""
    return (y[..., None] == torch.arange(num_classes, device=y.device)).to(dtype)


def generate(gen: Params, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``G(eps, y) = W2 relu(W1 [eps, onehot(y)] + b1) + b2``: (rows, feature_dim)."""
    num_classes = gen["fc1.weight"].shape[1] - eps.shape[-1]
    inp = torch.cat([eps, one_hot(y, num_classes, eps.dtype)], dim=-1)
    h = F.relu(F.linear(inp, gen["fc1.weight"], gen["fc1.bias"]))
    return F.linear(h, gen["fc2.weight"], gen["fc2.bias"])


def class_weights(label_counts: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``a[b, k] = n_{k, y_b} / sum_j n_{j, y_b}``: each client's share of class ``y_b``
    (``label_counts``: (K, C); ``y`` is drawn from the pooled counts, so no column is all 0)."""
    w = label_counts[:, y].T.to(torch.float32)  # (B, K)
    return w / w.sum(1, keepdim=True)


def ensemble_logits(head_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_k a[b, k] z_k[b]``: head logits (K, B, C) combined per row with weights (B, K)."""
    return torch.einsum("kbc,bk->bc", head_logits, weights.to(head_logits.dtype))


def diversity_loss(eps: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """FedGen's ``DiversityLoss("l1")``: ``exp(-mean_{b,b'} d2(eps) d1(out))`` with
    ``d2`` the mean squared and ``d1`` the mean absolute pairwise difference (diagonal included)."""
    noise_dist = (eps[:, None, :] - eps[None, :, :]).pow(2).mean(-1)
    out_dist = (out[:, None, :] - out[None, :, :]).abs().mean(-1)
    return torch.exp(-(noise_dist * out_dist).mean())


def generator_loss(
    gen: Params,
    eps: torch.Tensor,
    y: torch.Tensor,
    heads: Callable[[torch.Tensor], torch.Tensor],
    label_counts: torch.Tensor,
    diversity: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``CE(ensemble(heads(G(eps, y))), y) + diversity L_div``; ``heads(z)`` gives (K, B, C)."""
    z = generate(gen, eps, y)
    logits = ensemble_logits(heads(z), class_weights(label_counts, y))
    ce = F.cross_entropy(logits, y)
    div = diversity_loss(eps, z)
    return ce + diversity * div, {"ce": ce.detach(), "diversity": div.detach()}


def generator_draws(
    seed: int, round_: int, steps: int, batch: int, noise_dim: int, label_counts: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(eps, y)`` for each generator step of a round: ``y`` from the pooled label
    distribution of ``label_counts`` (K, C), ``eps`` standard normal; keyed by (seed, round)."""
    rng = generator(seed, SERVER_RNG, round_)
    pooled = label_counts.sum(0).double().cpu().numpy()
    prob = pooled / pooled.sum()
    device = label_counts.device
    out = []
    for _ in range(steps):
        y = rng.choice(len(prob), size=batch, p=prob)
        eps = rng.standard_normal((batch, noise_dim), dtype=np.float32)
        out.append((torch.from_numpy(eps).to(device), torch.from_numpy(y).to(device)))
    return out


def train_generator(
    gen: Params,
    opt: Transform,
    opt_state: dict,
    heads: Callable[[torch.Tensor], torch.Tensor],
    label_counts: torch.Tensor,
    draws: list[tuple[torch.Tensor, torch.Tensor]],
    diversity: float,
) -> tuple[Params, dict, list[dict[str, torch.Tensor]]]:
    """One optimiser step of ``generator_loss`` per draw; returns ``G``, the optimiser state,
    and each step's loss parts (before its update)."""
    log = []
    with torch.enable_grad():
        for eps, y in draws:
            leaves = {k: v.detach().requires_grad_(True) for k, v in gen.items()}
            loss, parts = generator_loss(leaves, eps, y, heads, label_counts, diversity)
            grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            updates, opt_state = opt.update(grads, opt_state, gen)
            gen = apply_updates(gen, updates)
            log.append(parts)
    return gen, opt_state, log


def client_heads(apply: Callable, stacked: Params) -> Callable[[torch.Tensor], torch.Tensor]:
    """``z -> (K, B, C)``: every uploaded client model's classifier on representations ``z``."""
    clients = unstack(stacked)
    return lambda z: torch.stack([apply(c, z, mode="head") for c in clients])


# ---------------------------------------------------------------------------------------
# The algorithm


@ALGORITHMS.register(
    "fedgen",
    "FedGen: a server-trained generator of representations regularises the clients' heads",
    FedGenParams,
    space={"alpha": "log:0.1:10"},
)
def fedgen(hp: FedGenParams, setup: Setup) -> Algorithm:
    if term_off(hp.alpha):  # the term is skipped at build time: FedAvg itself
        return Algorithm(name="fedgen", hparams=hp, local_loss=ce_loss)
    opt = adam(hp.gen_lr)

    def init_server(global_params: Params) -> Tree:
        device = next(iter(global_params.values())).device
        gen = init_generator(hp.noise_dim, setup.num_classes, hp.hidden, setup.feature_dim, setup.seed, device)
        return {"params": global_params, "gen": gen, "gen_opt": opt.init(gen), "gen_trained": False}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        # An untrained G is not sent: the term is off and round 1 is FedAvg, downlink included.
        return {"params": state["params"], "gen": state["gen"]} if state["gen_trained"] else {"params": state["params"]}

    def local_loss(params_, batch, payload, ctx, apply):
        x, y, w = batch["x"], batch["y"], batch["w"]
        ce = weighted_ce(apply(params_, x), y, w)
        if "gen" not in payload:  # the payload's structure, the same for every client: no tensor branch
            return ce, {"fedgen_term": torch.zeros_like(ce)}
        z = generate(payload["gen"], batch["noise"], y).detach()
        term = hp.alpha * weighted_ce(apply(params_, z, mode="head"), y, w)
        return ce + term, {"fedgen_term": term}

    def client_result(payload, end_params, ctx):
        return {"params": end_params, "label_counts": ctx["label_counts"]}, ctx.get("state", {})

    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        avg = weighted_sum(uploads["params"], weights)
        if hp.gen_steps == 0:
            return {**state, "params": avg}
        if setup.apply is None:
            raise ValueError("fedgen: Setup.apply is needed to train the generator on the server")
        counts = uploads["label_counts"]
        draws = generator_draws(setup.seed, info.round, hp.gen_steps, hp.gen_batch, hp.noise_dim, counts)
        heads = client_heads(setup.apply, uploads["params"])
        gen, gen_opt, _ = train_generator(state["gen"], opt, state["gen_opt"], heads, counts, draws, hp.diversity)
        return {**state, "params": avg, "gen": gen, "gen_opt": gen_opt, "gen_trained": True}

    return Algorithm(
        name="fedgen",
        hparams=hp,
        local_loss=local_loss,
        init_server=init_server,
        broadcast=broadcast,
        client_result=client_result,
        aggregate=aggregate,
        noise_dim=hp.noise_dim,
    )
