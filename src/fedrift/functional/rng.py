"""Every random draw is a pure function of (seed, purpose, round, client, ...).

Reorder the work, change the executor, or skip a client, and no other draw moves: this is
what makes all executors see the same batches and reruns give identical metrics.
"""

from __future__ import annotations

import numpy as np
import torch

# Purpose tags keep independent streams apart.
SAMPLING = 1
BATCHES = 2
NOISE = 3
AUGMENT = 4  # data.augment: each training row's crop and flip
DROPOUT = 5  # engine.dropout: does a sampled client return
STRAGGLERS = 6  # engine.stragglers: does it stop early, and after how much of its work
PRIVACY_SAMPLE = 7  # privacy.level sample: DP-SGD noise, per (round, client, step)
PRIVACY_CLIENT = 8  # privacy.level client: DP-FedAvg noise on the round's sum, per round
EVAL_CLIENTS = 9  # eval.clients_sample: the clients whose personal models are evaluated


def generator(seed: int, purpose: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, *keys])


def step_noise(seed: int, round_: int, client: int, step: int, rows: int, dim: int, device: torch.device) -> torch.Tensor:
    """Standard normal ``(rows, dim)`` for a client's local step; row i does not depend on
    ``rows``, so a padded batch (batched executor) shares its real rows with an unpadded one."""
    draw = generator(seed, NOISE, round_, client, step).standard_normal((rows, dim), dtype=np.float32)
    return torch.from_numpy(draw).to(device)


def gaussian(shapes: list[tuple[str, tuple[int, ...]]], device: torch.device, seed: int, purpose: int, *keys: int) -> dict[str, torch.Tensor]:
    """Standard normal float32 tensors of the given names and shapes (one draw for all, in
    their order), a pure function of (seed, purpose, keys)."""
    total = sum(int(np.prod(s)) for _, s in shapes)
    flat = torch.from_numpy(generator(seed, purpose, *keys).standard_normal(total, dtype=np.float32)).to(device)
    out, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = flat[at : at + n].view(shape)
        at += n
    return out
