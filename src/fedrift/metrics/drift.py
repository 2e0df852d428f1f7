"""Client-drift diagnostics the papers plot (FedGKD Fig. 2, FedCSD Fig. 1).

Computed on the round's local models against the global model they started from (w_t):
how far local training pulled each client away, in accuracy, in logits and in features.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from fedrift.metrics.evaluate import evaluate


@torch.no_grad()
def drift_metrics(
    apply: Callable[..., Any],
    global_params: dict[str, torch.Tensor],
    local_params: list[dict[str, torch.Tensor]],
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    probe: torch.Tensor,
    batch_size: int,
) -> dict[str, float]:
    """Mean over local models of: test accuracy, KL(softmax(z_global) || softmax(z_local)) and
    ||h_local - h_global||_2 on the probe samples (features = the model's representation)."""
    h_g, z_g = apply(global_params, x_test[probe], mode="both")
    log_p_g = F.log_softmax(z_g.double(), -1)
    accs, kls, dists = [], [], []
    for params in local_params:
        accs.append(evaluate(apply, params, x_test, y_test, batch_size)["test_accuracy"])
        h_l, z_l = apply(params, x_test[probe], mode="both")
        log_p_l = F.log_softmax(z_l.double(), -1)
        kls.append((log_p_g.exp() * (log_p_g - log_p_l)).sum(-1).mean().item())
        dists.append((h_l - h_g).double().norm(dim=-1).mean().item())
    n = max(len(local_params), 1)
    return {
        "local_test_accuracy": sum(accs) / n,
        "local_test_accuracy_min": min(accs, default=float("nan")),
        "drift_logit_kl": sum(kls) / n,
        "drift_feature_l2": sum(dists) / n,
    }


def probe_indices(n_test: int, size: int, seed: int) -> torch.Tensor:
    """A fixed, seeded probe subset of the test set, the same every round."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_test, generator=g)[: min(size, n_test)].sort().values
