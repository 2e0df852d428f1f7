"""Differential privacy: client-level DP-FedAvg and sample-level DP-SGD, accounted by dp-accounting.

- ``client`` (McMahan et al. 2018, "Learning differentially private recurrent language
  models"): each returning client's model change ``Delta_k = w_k - w_t`` is clipped to norm
  ``S`` (``privacy.clip``), the server averages them uniformly over the m returning clients
  and adds ``N(0, (z S)^2 I) / m`` (z: ``privacy.noise_multiplier``). The algorithm's
  ``aggregate`` then sees one upload, that noised mean, with weight 1: whatever it computes
  from it is post-processing, so the guarantee holds for any aggregation. Algorithms whose
  upload holds more than the model (SCAFFOLD's controls, FedNova's normaliser, ...), that
  have a pre-phase (FedCSD's prototypes) or personal models are refused.
- ``sample`` (Abadi et al. 2016): in every local step each sample's gradient (``torch.func``:
  the local loss on that sample alone) is clipped to norm ``C``, the clipped gradients are
  averaged, and ``N(0, (z C)^2 I) / B`` is added, before the algorithm's gradient correction
  and optimiser. Refused for algorithms that release more of a client's data than the
  steps' gradients (a pre-phase, a ``client_end`` summary such as FedProto's prototypes,
  FedDistill's class logits) or whose loss reads the client's label counts (FedADC+, FedRS,
  FedGen): one sample changes those for every step.

epsilon at ``privacy.delta`` comes from Google's ``dp-accounting`` (RDP accountant):
``client``: one Poisson-subsampled Gaussian per round with rate m/N; ``sample``: the
smallest client (the largest sampling rate B/n_k), taken as training in every round (no
credit for client sampling, so an upper bound for that client).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.func import grad_and_value, vmap

from fedrift.algorithms.base import Algorithm
from fedrift.config import Config, PrivacyConfig
from fedrift.functional import rng
from fedrift.functional.tree import stack, tree_map, weighted_sum
from fedrift.errors import ConfigError

Params = dict[str, torch.Tensor]

# loss hooks that read ctx["label_counts"]: a client statistic, not a per-sample one
READS_LABEL_COUNTS = {"fedadc_plus": "its loss", "fedrs": "its restricted softmax", "fedgen": "its upload",
                      "fedlc": "its calibrated logits"}
# loss hooks whose term is a statistic of the whole batch: DP-SGD's per-sample losses would
# silently change the method (FedDecorr's penalty is 0 on one sample)
READS_BATCH = {"feddecorr": "its decorrelation penalty (0 on a single sample)",
               "fedsam": "its perturbation (from the whole batch's gradient)",
               "fedasam": "its perturbation (from the whole batch's gradient)"}
# built-in algorithms whose upload holds more than the model, refused for client level before
# the run starts (any other, a plugin's, is refused at its first upload by ``private_mean``)
UPLOADS_MORE = {"scaffold": "delta_control", "feddc": "delta_control", "fednova": "a",
                "feddistill_plus": "class_logits, counts", "fedgen": "label_counts",
                "fedexp": "sq_norm", "elastic": "sensitivity"}


def check(cfg: Config, algorithm: Algorithm) -> None:
    """Refuse, before anything runs, what the configured privacy cannot cover."""
    level, name = cfg.privacy.level, algorithm.name
    if level == "none":
        return
    try:
        import dp_accounting  # noqa: F401
    except ImportError:
        raise ConfigError(f"privacy.level: {level} needs the dp-accounting package; install it with "
                          "pip install 'fedrift[privacy]'") from None
    if cfg.engine.sampling != "uniform":
        raise ConfigError(f"engine.sampling: {cfg.engine.sampling} picks clients from their label counts, which "
                          f"privacy.level {level} does not account for; allowed: uniform")
    if algorithm.client_summary is not None:
        raise ConfigError(f"privacy.level: {name} uploads a pre-phase summary of each client's data that "
                          f"privacy.level {level} does not protect; allowed: none")
    if algorithm.calibration is not None:
        raise ConfigError(f"privacy.level: {name} uploads per-class means and covariances of each client's features "
                          f"for its calibration, which privacy.level {level} does not protect; allowed: none")
    if level == "client" and name in UPLOADS_MORE:
        raise ConfigError(f"privacy.level: client clips the uploaded model, and {name} uploads more "
                          f"({UPLOADS_MORE[name]}); allowed: none or sample")
    if level == "client" and algorithm.personal:
        raise ConfigError(f"privacy.level: client clips model changes, and {name} keeps personal models and "
                          "uploads prototypes; allowed: none or sample")
    if level == "sample":
        if algorithm.train_params is not None:
            raise ConfigError(f"privacy.level: sample noises each step's gradient of one model, and {name} trains "
                              "two on each client in one step; allowed: none or client")
        if algorithm.client_end is not None:
            raise ConfigError(f"privacy.level: sample protects the local steps, and {name} uploads a summary "
                              "computed from the client's data after them; allowed: none")
        if name in READS_LABEL_COUNTS:
            raise ConfigError(f"privacy.level: sample: {READS_LABEL_COUNTS[name]} of {name} reads the client's "
                              "label counts, which one sample changes; allowed: none or client")
        if name in READS_BATCH:
            raise ConfigError(f"privacy.level: sample computes each sample's gradient alone, and {READS_BATCH[name]} "
                              f"of {name} needs the whole batch; allowed: none or client")
        if name == "fedcsd" and getattr(algorithm.hparams, "variant", "paper") == "released" \
                and algorithm.client_start is not None:
            raise ConfigError("privacy.level: sample: fedcsd's variant released distils every sample towards "
                              "prototypes of the client's whole data, which one sample changes; allowed: none or client")


# ---------------------------------------------------------------------------------------
# Client level


def clip_change(params: Params, ref: Params, bound: float | None) -> Params:
    """``ref + Delta * min(1, S / ||Delta||)``, ``Delta = params - ref`` (the whole model's norm)."""
    if bound is None:
        return params
    delta = tree_map(lambda p, r: p - r, params, ref)
    norm = torch.stack([d.double().pow(2).sum() for d in delta.values()]).sum().sqrt()
    factor = float(torch.clamp(bound / norm, max=1.0)) if float(norm) > 0 else 1.0
    return params if factor == 1.0 else tree_map(lambda r, d: r + d * factor, ref, delta)


def private_mean(uploads: list[dict[str, Any]], ref: Params, pc: PrivacyConfig, seed: int, round_: int,
                 name: str) -> tuple[dict[str, Any], torch.Tensor]:
    """The one upload and weight the aggregation sees: the uniform mean of the clipped models
    plus the round's noise / m. With ``clip`` null and zero noise, the mean is computed as
    FedAvg's uniform aggregation computes it (``weighted_sum``), bit for bit."""
    extra = sorted({k for u in uploads for k in u} - {"params"})
    if extra:
        raise ConfigError(f"privacy.level: client clips the uploaded model, and {name} uploads more "
                          f"({', '.join(extra)}); allowed: none or sample")
    clipped = stack([clip_change(u["params"], ref, pc.clip) for u in uploads])
    m = len(uploads)
    device = next(iter(ref.values())).device
    mean = weighted_sum(clipped, torch.full((m,), 1.0 / m, dtype=torch.float64, device=device))
    if pc.noise_multiplier > 0:
        std = pc.noise_multiplier * pc.clip / m
        noise = rng.gaussian([(k, tuple(v.shape)) for k, v in mean.items()], device, seed, rng.PRIVACY_CLIENT, round_)
        mean = {k: v + std * noise[k].to(v.dtype) for k, v in mean.items()}
    one = torch.ones(1, dtype=torch.float64, device=device)
    return {"params": {k: v.unsqueeze(0) for k, v in mean.items()}}, one


# ---------------------------------------------------------------------------------------
# Sample level


def dp_grad_and_value(loss_fn: Any, clip: float, sigma: float) -> Any:
    """``grad_and_value(loss_fn, has_aux=True)``'s form with DP-SGD's gradient.

    Per sample ``i`` (the batch's rows; padded rows have ``w_i = 0``): the loss on that sample
    alone (weight 1), its gradient ``g_i`` clipped to norm ``C``; the gradient is
    ``sum_i w_i clip(g_i) + sigma C max_i(w_i) xi`` (``w_i = 1/B``; ``xi``: ``batch["dp_noise"]``)
    and the loss and aux are the ``w``-weighted means. Pure tensor code, so it also runs
    under the batched executor's ``vmap``."""

    def one(params: Params, sample: dict, payload: dict, ctx: dict):
        batch = {**tree_map(lambda t: t.unsqueeze(0), sample), "w": sample["w"].new_ones(1)}
        return loss_fn(params, batch, payload, ctx)

    per_sample = vmap(grad_and_value(one, has_aux=True), in_dims=(None, 0, None, None))

    def grad_value(params: Params, batch: dict, payload: dict, ctx: dict):
        noise = batch["dp_noise"]
        data = {k: v for k, v in batch.items() if k != "dp_noise"}
        grads, (losses, aux) = per_sample(params, data, payload, ctx)
        w = data["w"]
        norms = torch.stack([g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
        coef = w * torch.clamp(clip / (norms + 1e-12), max=1.0)
        scale = sigma * clip * w.max()
        out = {k: torch.tensordot(coef, g, dims=1) + scale * noise[k] for k, g in grads.items()}
        return out, ((w * losses).sum(), {k: (w * v).sum() for k, v in aux.items()})

    return grad_value


# ---------------------------------------------------------------------------------------
# Accounting


class Accountant:
    """epsilon at ``delta`` after each round, from dp-accounting's RDP accountant."""

    def __init__(self, pc: PrivacyConfig, clients_per_round: int, num_clients: int, sizes: list[int],
                 batch_size: int, epochs: int, local_steps: int | None) -> None:
        import logging

        import dp_accounting

        # its RDP series warns, per excluded order, when one does not converge: noise, not news
        logging.getLogger("absl").setLevel(logging.ERROR)
        self.delta = pc.delta
        self.accountant = dp_accounting.rdp.RdpAccountant() if pc.noise_multiplier > 0 else None
        gaussian = dp_accounting.GaussianDpEvent(pc.noise_multiplier)
        if pc.level == "client":
            self.round_event = dp_accounting.PoissonSampledDpEvent(clients_per_round / num_clients, gaussian)
        else:
            n = min(sizes)
            steps = local_steps if local_steps is not None else epochs * math.ceil(n / batch_size)
            step = dp_accounting.PoissonSampledDpEvent(min(1.0, batch_size / n), gaussian)
            self.round_event = dp_accounting.SelfComposedDpEvent(step, steps)

    def step(self, rounds: int = 1) -> float | None:
        """``rounds`` more rounds (a resumed run replays its checkpoint's, composed one by one
        as they were); epsilon so far (None without noise: no finite guarantee)."""
        if self.accountant is None:
            return None
        for _ in range(rounds):
            self.accountant.compose(self.round_event)
        return float(self.accountant.get_epsilon(self.delta))
