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
AUGMENT = 4


def generator(seed: int, purpose: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, *keys])


def step_noise(seed: int, round_: int, client: int, step: int, rows: int, dim: int, device: torch.device) -> torch.Tensor:
    """Standard normal ``(rows, dim)`` for a client's local step; row i does not depend on
    ``rows``, so a padded batch (batched executor) shares its real rows with an unpadded one."""
    draw = generator(seed, NOISE, round_, client, step).standard_normal((rows, dim), dtype=np.float32)
    return torch.from_numpy(draw).to(device)
