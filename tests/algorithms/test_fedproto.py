import pytest
import torch
from agreement import agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import ClientData, Setup
from fedrift.algorithms.fedproto import nearest_prototype
from fedrift.engine.local import make_apply
from fedrift.errors import ConfigError
from fedrift.models import build_model
from fedrift.models.mlp import MLPParams

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=8, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(**hp):
    return make("fedproto", SETUP, **hp)


def _model():
    model = build_model("mlp", MLPParams(hidden=[8]), (4,), 3, seed=0)
    return make_apply(model, {}), {k: v.detach() for k, v in model.named_parameters()}


@pytest.mark.agreement
def test_loss_adds_lam_times_mean_squared_distance_to_known_prototypes():
    apply, params = _model()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2])
    batch = {"x": x, "y": y, "w": torch.full((3,), 1 / 3)}
    protos = torch.arange(24, dtype=torch.float32).reshape(3, 8) / 10
    payload = {"protos": protos, "has": torch.tensor([True, False, True])}
    with_p, _ = _alg(lam=0.5).local_loss(params, batch, payload, {}, apply)
    without, _ = _alg(lam=0.0).local_loss(params, batch, payload, {}, apply)
    h = apply(params, x, mode="features")
    expected = 0.5 * ((h[0] - protos[0]).pow(2).mean() + (h[2] - protos[2]).pow(2).mean()) / 3
    agree(with_p - without, expected)


@pytest.mark.agreement
def test_client_prototypes_are_feature_means_and_server_weights_by_counts():
    apply, params = _model()
    alg = _alg()
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([1, 1, 0, 1])
    out = alg.client_end({}, params, {}, ClientData(x, y), apply)
    h = apply(params, x, mode="features")
    agree(out["protos"][1], h[[0, 1, 3]].mean(0))
    agree(out["protos"][0], h[2])
    state = alg.init_server(params)
    uploads = {"protos": torch.stack([torch.ones(3, 8), 3 * torch.ones(3, 8)]),
               "counts": torch.tensor([[1.0, 0.0, 0.0], [1.0, 2.0, 0.0]])}
    new = alg.aggregate(state, uploads, torch.tensor([0.5, 0.5]), None)
    torch.testing.assert_close(new["protos"][0], torch.full((8,), 2.0))
    torch.testing.assert_close(new["protos"][1], torch.full((8,), 3.0))
    assert torch.equal(new["protos"][2], torch.zeros(8)) and new["has"].tolist() == [True, True, False]


def test_nearest_prototype_skips_classes_without_one():
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.1, 0.1]])
    h = torch.tensor([[0.09, 0.1], [0.9, 1.0]])
    assert nearest_prototype(h, protos, torch.tensor([True, True, True])).tolist() == [2, 1]
    assert nearest_prototype(h, protos, torch.tensor([True, True, False])).tolist() == [0, 1]


def test_only_prototypes_travel_and_personal_models_learn(tmp_path):
    r = fedrift.run({
        "data": {"name": "mnist5k"}, "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 6},
        "model": {"name": "mlp", "hidden": [64]}, "algorithm": {"name": "fedproto"},
        "train": {"rounds": 4, "clients_per_round": 6, "local_epochs": 1, "batch_size": 32},
        "output": {"dir": str(tmp_path), "progress": False},
    })
    last = r.history[-1]
    assert last["bytes_down"] == 6 * (10 * 64 * 4 + 10)  # prototype table + its bool mask
    assert last["bytes_up"] == 6 * (10 * 64 * 4 + 10 * 4)  # prototypes + class counts
    assert last["local_accuracy"] > 0.75 and last["local_accuracy_proto"] > 0.75
    assert {"test_accuracy", "test_accuracy_proto", "local_accuracy_proto"} <= set(last)
    assert r.summary["final_local_accuracy"] == last["local_accuracy"]


def test_personal_models_refuse_global_model_diagnostics(tiny):
    for key in ("drift", "personalize"):
        with pytest.raises(ConfigError, match=f"eval.{key}"):
            fedrift.run(tiny(algorithm={"name": "fedproto"}, eval={key: True}))
