"""Every registered algorithm with options under which its extra terms matter: executors are
checked against each other on all of them."""

import torch
from agreement import ILL_CONDITIONED, ROUNDING, Promise

from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import Algorithm, Setup


OPTIONS = {
    "fedprox": {"mu": 0.1},
    "fedgkd": {"gamma": 0.5, "M": 2},
    "fedgkd_plus": {"gamma": 0.5, "M": 2},
    "fedgkd_vote": {"M": 2, "lam": 0.5},
    "fedcsd": {"mu": 0.5},
    "fedadc_plus": {"lam": 0.5},
    "fedavgm": {"beta": 0.5},
    "fednova": {"eta_s": 1.5},
    "feddyn": {"alpha": 0.1},
    "fedntd": {"beta": 1.0, "T": 2.0},
    "fedrs": {"alpha": 0.3},
    "moon": {"mu": 1.0},
    "feddistill_plus": {"lam": 0.5},
    "fedproto": {"lam": 1.0},
    "fedgen": {"alpha": 1.0, "gen_steps": 2},
    "feddf": {"steps": 10, "eval_every": 5},
    "fedacg": {"lam": 0.85, "beta": 0.1},
    "fedsam": {"rho": 0.1},
    "fedasam": {"rho": 0.5, "eta": 0.05},
    "fedlc": {"tau": 1.0},
    "feddecorr": {"beta": 0.5},
    "fedexp": {"epsilon": 1e-4},
    "elastic": {"tau": 0.5},
    "feddc": {"alpha": 0.1},
    "ccvr": {"M": 40, "epochs": 2, "calibrate_at": "every"},  # calibration at every evaluated round; small, as tests go
}
MODELS = {
    "fedgkd_plus": {"name": "mlp", "hidden": [32], "projection_dim": 16},
    "moon": {"name": "mlp", "hidden": [32], "projection_dim": 16},
    "fedbn": {"name": "resnet8", "width": 4, "norm": "batch"},  # BatchNorm layers to keep local (digits: 1x8x8)
}
# FedDecorr standardises each feature over a batch's rows (variance + 1e-8 under the root, the
# released code's): a feature nearly constant over a batch (a ReLU unit nearly dead) has a
# rounding-level variance, and the penalty amplifies float32's own error in it. Two executors'
# kernels then end 2-3e-4 of a layer's scale apart after 3 rounds (AVX-512, AVX2 and
# ATEN_CPU_CAPABILITY=default alike), past the 1e-4 of float rounding; on a last batch of two
# rows (the tests' Dirichlet split has a client of 162 samples: 5 batches of 32 and one of 2)
# 7.6e-3 under the default kernels, so its case takes an IID split
ILL_CONDITIONED_NAMES = {"feddecorr"}
# merged into the partition section: FedDF's proxy data; Vote's server split (its default
# vote_loss then scores the buffered models on the server; tests/algorithms/test_fedgkd.py
# checks the client form's executors)
PARTITIONS = {"feddf": {"holdout": 0.1}, "fedgkd_vote": {"holdout": 0.1},
              # FedDecorr: an IID split, whose last batches hold 15 and 16 rows (ILL_CONDITIONED)
              "feddecorr": {"name": "iid", "num_clients": 6}}


def case(name: str) -> dict:
    """Config sections for algorithm ``name`` (merge into the tiny config)."""
    out = {"algorithm": {"name": name, **OPTIONS.get(name, {})}}
    if name in MODELS:
        out["model"] = MODELS[name]
    if name in PARTITIONS:
        out["partition"] = PARTITIONS[name]
    return out


NAMES = [e.name for e in ALGORITHMS if e.source == "built in"]  # not an installed plugin's

# a model with a projection head and server-held data, so that every algorithm can be built
SETUP = Setup(num_classes=10, num_clients=6, feature_dim=16, lr=0.05, momentum=0.9, weight_decay=0.0,
              clip_grad_norm=None, seed=0, projection_dim=16,
              holdout_x=torch.zeros(4, 64), holdout_y=torch.zeros(4, dtype=torch.int64))


def promise(name: str) -> Promise:
    """What two executors' runs of algorithm ``name`` promise each other (tests/agreement.py)."""
    return ILL_CONDITIONED if name in ILL_CONDITIONED_NAMES else ROUNDING


def build(name: str) -> Algorithm:
    """Algorithm ``name`` with its case options, to ask which hooks it has."""
    return make(name, SETUP, **{k: v for k, v in case(name)["algorithm"].items() if k != "name"})
