"""FedProx's Synthetic(alpha, beta): devices whose models and inputs both drift apart.

Li et al. 2018, "Federated Optimization in Heterogeneous Networks", section 5.1, as in the
authors' generator (github.com/litian96/FedProx, data/synthetic_*/generate_*.py). For device k:

    u_k ~ N(0, alpha),  B_k ~ N(0, beta)               (alpha, beta are standard deviations)
    W_k (d x C), b_k (C) entries ~ N(u_k, 1)           (b_k shares W_k's mean u_k)
    v_k (d) entries ~ N(B_k, 1)
    x ~ N(v_k, Sigma), Sigma diagonal, Sigma_jj = j^-1.2 (j = 1..d)
    y = argmax(softmax(W_k^T x + b_k))

alpha drives how much the devices' labelling models differ, beta how much their inputs do.
``iid=True`` is FedProx's synthetic_iid: one W, b ~ N(0, 1) for all devices and v_k = 0
(alpha and beta are then unused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from pydantic import Field

from fedrift.data import DATASETS
from fedrift.data.base import Dataset
from fedrift.params import params

NonNegative = Annotated[float, Field(ge=0.0)]


@params
class SyntheticParams:
    """Options of the Synthetic(alpha, beta) generator; FedProx's values are the defaults,
    except ``max_samples`` (FedProx has no cap) and ``test_fraction`` (FedProx holds out 0.1).

    Device k holds ``int(lognormal(size_mu, size_sigma)) + min_samples`` samples, capped at
    ``max_samples``. The cap keeps the lognormal's heavy tail in check on a laptop:
    uncapped, about 1 device in 13 gets over 1,000 samples, 1 in 27 over 2,000 and 1 in 200
    over 10,000. Set it to ``null`` to disable it and get FedProx's sizes. Each device's
    samples are split into its own train part and a ``test_fraction`` test part.
    The data are a pure function of these options (``seed`` seeds the generator), and device
    k's data do not change with ``num_devices``.
    """

    alpha: NonNegative = 1.0
    beta: NonNegative = 1.0
    num_devices: Annotated[int, Field(ge=1)] = 30
    dim: Annotated[int, Field(ge=1)] = 60
    num_classes: Annotated[int, Field(ge=2)] = 10
    iid: bool = False
    min_samples: Annotated[int, Field(ge=2)] = 50
    size_mu: float = 4.0
    size_sigma: NonNegative = 2.0
    max_samples: Annotated[int | None, Field(ge=2)] = 1000
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_samples is not None and self.max_samples < self.min_samples:
            raise ValueError(
                f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples}),"
                " or null for no cap"
            )


def device_size(options: SyntheticParams, rng: np.random.Generator) -> int:
    """One device's sample count: a lognormal draw cast to int, plus the minimum, capped."""
    draw = rng.lognormal(options.size_mu, options.size_sigma)
    size = int(min(draw, 2.0**62)) + options.min_samples  # min(): no int overflow on wild draws
    return size if options.max_samples is None else min(size, options.max_samples)


def _test_count(n: int, fraction: float) -> int:
    # At least one sample on each side (n >= 2 is guaranteed by min_samples >= 2).
    return min(max(int(round(fraction * n)), 1), n - 1)


@DATASETS.register(
    "synthetic",
    "FedProx Synthetic(alpha, beta): per-device linear-softmax labels, natural device groups",
    params=SyntheticParams,
)
def load_synthetic(root: Path | None, options: SyntheticParams) -> Dataset:
    """x float32 (N, dim); train_groups/test_groups hold each sample's device id.

    Samples are stored device by device. ``root`` is unused.
    """
    o = options
    # Device k draws everything of its own (size, u_k, B_k, model, inputs) from stream k, so
    # its data do not depend on how many devices there are; the shared model of iid=True
    # comes from one more stream.
    shared_seq, *device_seqs = np.random.SeedSequence(o.seed).spawn(1 + o.num_devices)
    shared = np.random.default_rng(shared_seq)
    w_shared = shared.normal(0.0, 1.0, (o.dim, o.num_classes))  # used only if iid
    b_shared = shared.normal(0.0, 1.0, o.num_classes)
    x_sd = np.arange(1, o.dim + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2

    # Sizes first (each device's stream starts with its size), so that the arrays are made
    # once, in float32: 10,000 devices are 1.9M samples, 0.45 GB, not 3 GB of float64 parts.
    sizes = [device_size(o, np.random.default_rng(seq)) for seq in device_seqs]
    n_test = [_test_count(n, o.test_fraction) for n in sizes]
    n_tr, n_te = sum(sizes) - sum(n_test), sum(n_test)
    xtr, xte = np.empty((n_tr, o.dim), np.float32), np.empty((n_te, o.dim), np.float32)
    ytr, yte = np.empty(n_tr, np.int64), np.empty(n_te, np.int64)
    gtr = np.repeat(np.arange(o.num_devices, dtype=np.int64), np.subtract(sizes, n_test))
    gte = np.repeat(np.arange(o.num_devices, dtype=np.int64), n_test)
    a = b_ = 0  # where device k's train / test rows start
    for k, seq in enumerate(device_seqs):
        rng = np.random.default_rng(seq)
        n = device_size(o, rng)
        if o.iid:
            w, b, v = w_shared, b_shared, np.zeros(o.dim)
        else:
            u_k, big_b_k = rng.normal(0.0, o.alpha), rng.normal(0.0, o.beta)
            w = rng.normal(u_k, 1.0, (o.dim, o.num_classes))
            b = rng.normal(u_k, 1.0, o.num_classes)
            v = rng.normal(big_b_k, 1.0, o.dim)
        x = v + rng.standard_normal((n, o.dim)) * x_sd
        y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
        order = rng.permutation(n)
        te, tr = order[: n_test[k]], order[n_test[k] :]
        xtr[a : a + len(tr)], ytr[a : a + len(tr)] = x[tr], y[tr]
        xte[b_ : b_ + len(te)], yte[b_ : b_ + len(te)] = x[te], y[te]
        a, b_ = a + len(tr), b_ + len(te)

    return Dataset(
        name="synthetic",
        x_train=torch.from_numpy(xtr),
        y_train=torch.from_numpy(ytr),
        x_test=torch.from_numpy(xte),
        y_test=torch.from_numpy(yte),
        num_classes=o.num_classes,
        train_groups=gtr,
        test_groups=gte,
    )
