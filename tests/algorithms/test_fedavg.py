import pytest
import torch
import torch.nn.functional as F
from agreement import agree

import fedrift
from fedrift.algorithms.base import RoundInfo, fedavg_aggregate
from fedrift.data import load_dataset
from fedrift.engine.batches import schedule
from fedrift.models import MODELS, build_model
from fedrift.functional.tree import stack


def test_aggregate_is_the_sample_weighted_average_by_hand():
    uploads = stack([{"params": {"w": torch.tensor([0.0, 4.0])}}, {"params": {"w": torch.tensor([2.0, 0.0])}}])
    info = RoundInfo(round=1, num_clients=2, sampled=(0, 1))
    # n = (30, 10): p = (0.75, 0.25)
    out = fedavg_aggregate({"params": {}, "other": 1}, uploads, torch.tensor([0.75, 0.25]), info)
    assert torch.equal(out["params"]["w"], torch.tensor([0.5, 3.0]))
    assert out["other"] == 1


@pytest.mark.agreement
def test_one_client_full_participation_equals_plain_sgd_on_the_same_batches(tiny):
    cfg = tiny(
        partition={"name": "iid", "num_clients": 1},
        train={"rounds": 2, "clients_per_round": 1, "local_epochs": 1, "batch_size": 64,
               "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
    )
    result = fedrift.run(cfg)

    # The same thing written as a plain PyTorch loop.
    ds = load_dataset("digits", None, _opts("digits"))
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), ds.input_shape, ds.num_classes, seed=0)
    idx = torch.arange(ds.num_train)  # one iid client holds every sample, in index order
    for rnd in (1, 2):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)  # reset each round
        for pos in schedule(ds.num_train, 64, 1, None, seed=0, round_=rnd, client=0):
            b = idx[torch.as_tensor(pos)]
            opt.zero_grad()
            F.cross_entropy(model(ds.x_train[b]), ds.y_train[b]).backward()
            opt.step()
    agree(result.global_state, {name: p.detach() for name, p in model.named_parameters()})


def _opts(name):
    from fedrift.data import DATASETS

    return DATASETS.get(name).params()
