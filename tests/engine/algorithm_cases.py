"""Every registered algorithm with options under which its extra terms matter: executors are
checked against each other on all of them."""

import torch
from agreement import ILL_CONDITIONED, ROUNDING, Promise

from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import Algorithm, Setup

# FedDecorr standardises each feature over a batch's real rows (variance + 1e-8 under the
# root): on a client's last batch of two rows a feature's variance can be rounding-level, and
# float32's own error in the gradient there is about 1e-4 of its largest entry (measured
# against float64, the sequential and the vectorised step alike), which the next steps grow;
# vectorised kernels (vmap's, a model's stacked form: engine/stacked_step.py) round
# otherwise, so after 3 rounds the models are a few 1e-4 apart
ILL_CONDITIONED_NAMES = {"feddecorr"}

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
# merged into the partition section: FedDF's proxy data; Vote's server split (its default
# vote_loss then scores the buffered models on the server; tests/algorithms/test_fedgkd.py
# checks the client form's executors)
PARTITIONS = {"feddf": {"holdout": 0.1}, "fedgkd_vote": {"holdout": 0.1}}


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
