"""FedRoD (algorithms/fedrod.py): a shared body and generic head trained on balanced softmax and
averaged, and a personal head per client on the summed logits.

Balanced softmax by hand; the hooks by hand on an MLP (the body's and generic head's gradient
is the generic loss's alone; the personal head's is the empirical loss's of the summed logits;
the scored model, fc folded with the personal head, gives generic + personal logits); with
generic_loss ce the model is FedAvg's bit for bit, and with the balanced loss the generic part
is the balanced loss's alone (the personal head never reaches it); a client never sampled
scores the generic model itself; local_accuracy is each client's summed logits on its own
split; a BatchNorm body trains too; a projection head is refused in one line. compare/tune:
tests/algorithms/test_ditto.py. The executors (batched, processes, ray), disk client states,
stacked runs and checkpoints run it through tests/engine/algorithm_cases.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from agreement import BITS, agree
from conftest import one_line_refusal
from partial_sharing import one_round, server_of

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.fedrod import OWN, balanced_ce
from fedrift.algorithms.terms import weighted_ce
from fedrift.engine.local import make_apply
from fedrift.models import build_model
from fedrift.models.mlp import MLPParams

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=8, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


@pytest.mark.agreement
def test_balanced_softmax_by_hand():
    """CE of the logits shifted by log n_c; a class the client lacks drops out; padding adds 0."""
    z = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [2.0, 2.0, 2.0]])
    y, w = torch.tensor([0, 2, 1]), torch.tensor([0.5, 0.5, 0.0])
    counts = torch.tensor([4.0, 0.0, 2.0])
    got = balanced_ce(z, y, w, counts)
    held = torch.tensor([0, 2])
    shifted = z[:2][:, held] + counts[held].log()
    agree(got, 0.5 * F.cross_entropy(shifted, torch.tensor([0, 1]), reduction="sum"))
    agree(balanced_ce(z, y, torch.full((3,), 1 / 3), torch.ones(3)), weighted_ce(z, y, torch.full((3,), 1 / 3)))


def _mlp():
    model = build_model("mlp", MLPParams(hidden=[8]), (4,), 3, seed=0)
    return make_apply(model, {}), {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.agreement
def test_hooks_by_hand_on_an_mlp():
    apply, w = _mlp()
    alg = make("fedrod", SETUP)
    fresh = alg.init_client(w)
    assert all(torch.equal(v, torch.zeros_like(w[k])) for k, v in fresh["head"].items())
    agree(alg.client_model({"params": w}, fresh), w, BITS)  # a head of zeros: the generic model itself
    g = torch.Generator().manual_seed(1)
    head = {"fc.weight": torch.randn(3, 8, generator=g), "fc.bias": torch.randn(3, generator=g)}
    payload, state = {"params": w}, {"head": head}
    tree = alg.train_params(payload, state)
    assert set(tree) == set(w) | {OWN + "fc.weight", OWN + "fc.bias"}
    x = torch.randn(6, 4, generator=g)
    y, wt = torch.tensor([0, 0, 2, 1, 0, 2]), torch.full((6,), 1 / 6)
    ctx = {"label_counts": torch.tensor([30.0, 5.0, 10.0])}
    leaves = {k: v.clone().requires_grad_(True) for k, v in tree.items()}
    loss, aux = alg.local_loss(leaves, {"x": x, "y": y, "w": wt}, payload, ctx, apply)
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    # the body and the generic head: the balanced loss's gradient alone
    p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    generic = balanced_ce(apply(p, x), y, wt, ctx["label_counts"])
    agree({k: grads[k] for k in w}, dict(zip(p, torch.autograd.grad(generic, list(p.values())))), BITS)
    # the personal head: CE of (generic + personal) logits, features and generic logits fixed
    h, z = apply(w, x, mode="both")
    q = {k: v.clone().requires_grad_(True) for k, v in head.items()}
    personal = weighted_ce(z + h @ q["fc.weight"].T + q["fc.bias"], y, wt)
    agree(aux["personal_loss"], personal)
    agree({k: grads[OWN + k] for k in head}, dict(zip(q, torch.autograd.grad(personal, list(q.values())))))
    # the scored model: fc folded with the personal head, the summed logits in one pass
    agree(apply(alg.client_model(payload, state), x), z + h @ head["fc.weight"].T + head["fc.bias"])
    upload, kept = alg.client_result(payload, tree, {"state": state})
    assert set(upload["params"]) == set(w) and set(kept["head"]) == {"fc.weight", "fc.bias"}


@pytest.mark.agreement
def test_with_plain_cross_entropy_the_model_is_fedavgs_bit_for_bit(tiny, tmp_path):
    train = {"rounds": 3, "momentum": 0.5, "clip_grad_norm": 1.0}
    avg = fedrift.run(tiny(train=train, output={"dir": str(tmp_path / "avg")}))
    rod = fedrift.run(tiny(train=train, algorithm={"name": "fedrod", "generic_loss": "ce"},
                           output={"dir": str(tmp_path / "rod")}))
    agree(avg.global_state, rod.global_state, BITS)
    assert rod.history[-1]["bytes_up"] == avg.history[-1]["bytes_up"]  # the personal head never travels


@pytest.mark.agreement
def test_local_accuracy_is_each_clients_summed_logits_on_its_own_split(tiny, tmp_path):
    sections = dict(algorithm={"name": "fedrod"}, train={"rounds": 2, "clients_per_round": 3},
                    partition={"val_share": 0.2})
    with server_of(tiny, tmp_path, "rod", **sections) as (server, w0):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            row = server.close(rnd, outputs, [])
        apply, fed, w = server.tools.apply, server.fed, server.state["params"]
        accs = []
        for k in server.panel:
            head = server.store.get(k)["head"]
            ix = fed.test_indices(k)
            with torch.no_grad():
                h, z = apply(w, fed.x_test[ix], mode="both")
                logits = z + h @ head["fc.weight"].T + head["fc.bias"]
            accs.append((logits.argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))


@pytest.mark.agreement
def test_a_batchnorm_body_trains_and_its_statistics_are_averaged(tiny, tmp_path):
    """ResNet-8 with BatchNorm, generic_loss ce: FedAvg's model bit for bit, running statistics
    included (averaged as FedAvg's)."""
    sections = dict(model={"name": "resnet8", "width": 4, "norm": "batch"}, train={"rounds": 1})
    avg = fedrift.run(tiny(**sections, output={"dir": str(tmp_path / "avg")}))
    rod = fedrift.run(tiny(**sections, algorithm={"name": "fedrod", "generic_loss": "ce"},
                           output={"dir": str(tmp_path / "rod")}))
    agree(avg.global_state, rod.global_state, BITS)


def test_a_projection_head_is_refused_in_one_line(tmp_path, capsys):
    one_line_refusal(capsys, ["run", "data.name=digits", "algorithm.name=fedrod", "model.name=mlp", "model.projection_dim=8",
                              "train.rounds=1", "partition.num_clients=4", "train.clients_per_round=2",
                              f"output.dir={tmp_path / 'run'}", "output.progress=false"],
                     "model.projection_dim", "fedrod", "allowed: null")
    assert not (tmp_path / "run").exists()
