"""APFL (algorithms/apfl.py): each client's personal model is alpha v + (1 - alpha) w, with
FedAvg's global model w and a local model v trained through the mixture.

The hooks by hand on the linear model (the gradients in w, v and alpha; alpha's projected
step); the global model is FedAvg's bit for bit for any alpha, fixed or adaptive; at alpha 0
every personal model is the global model, bit for bit; at alpha 1 the local model trains as a
client alone; local_accuracy is each client's mixture on its own split; an adaptive alpha
moves and stays in [0, 1]. Refusals and compare/tune: tests/algorithms/test_ditto.py. The
executors (batched, processes, ray), disk client states, stacked runs and checkpoints run it
through tests/engine/algorithm_cases.py."""

from __future__ import annotations

import pytest
import torch
from agreement import BITS, agree
from linear_model import apply as linear, rand_params
from partial_sharing import one_round, server_of
from test_ditto import _batch, _ce_grad, _grads, as_fedavg

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.apfl import ALPHA, OWN, alpha_step, mix
from fedrift.algorithms.base import Setup
from fedrift.engine.client import train_client

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


@pytest.mark.agreement
def test_hooks_by_hand_on_the_linear_model():
    """grad_w = grad f(w); grad_v = alpha grad f(vbar); grad_alpha = <v - w, grad f(vbar)>;
    only w goes up; v and alpha stay; the scored model mixes v with the server's w."""
    a = 0.3
    alg = make("apfl", SETUP, alpha=a, adaptive_alpha=True)
    w, v = rand_params(0), rand_params(1)
    payload = {"params": w}
    state = {"v": v, "alpha": torch.tensor(a)}
    tree = alg.train_params(payload, state)
    assert set(tree) == {"w", "b", OWN + "w", OWN + "b", ALPHA}
    batch = _batch()
    _, aux, g = _grads(alg, tree, batch, payload)
    vbar = {k: a * v[k] + (1 - a) * w[k] for k in w}
    fw, fbar = _ce_grad(w, batch), _ce_grad(vbar, batch)
    agree({k: g[k] for k in w}, fw, BITS)  # the global model's gradient is FedAvg's, exactly
    agree({k: g[OWN + k] for k in v}, {k: a * fbar[k] for k in v})
    agree(g[ALPHA], sum((v[k] - w[k]).mul(fbar[k]).sum() for k in w))
    upload, kept = alg.client_result(payload, tree, {"state": state})
    assert set(upload["params"]) == {"w", "b"} and set(kept) == {"v", "alpha"}
    server_w = rand_params(2)
    agree(alg.client_model({"params": server_w}, kept), {k: a * v[k] + (1 - a) * server_w[k] for k in w})
    # alpha's step: plain SGD at the train lr, projected on [0, 1]
    step = alpha_step(0.1)
    p = {ALPHA: torch.tensor(0.5)}
    assert step.update({ALPHA: torch.tensor(-100.0)}, (), p)[0][ALPHA].item() == 0.5  # to 1
    assert step.update({ALPHA: torch.tensor(100.0)}, (), p)[0][ALPHA].item() == -0.5  # to 0
    agree(step.update({ALPHA: torch.tensor(1.0)}, (), p)[0][ALPHA], torch.tensor(-0.1))


@pytest.mark.agreement
@pytest.mark.parametrize("options", [{"alpha": 0.0}, {"alpha": 0.5}, {"alpha": 0.25, "adaptive_alpha": True}],
                         ids=["alpha0", "alpha0.5", "adaptive"])
def test_the_global_model_is_fedavgs_bit_for_bit(tiny, tmp_path, options):
    train = {"rounds": 3, "momentum": 0.5, "weight_decay": 1e-3}
    avg = fedrift.run(tiny(train=train, output={"dir": str(tmp_path / "avg")}))
    run = fedrift.run(tiny(train=train, algorithm={"name": "apfl", **options}, output={"dir": str(tmp_path / "a")}))
    agree(avg.global_state, run.global_state, BITS)
    assert run.history[-1]["bytes_up"] == avg.history[-1]["bytes_up"]


@pytest.mark.agreement
def test_at_alpha_zero_every_personal_model_is_the_global_model(tiny, tmp_path):
    """alpha 0 (fixed): 0 v + 1 w is w, bit for bit, for every client, sampled or not; the
    personal scores are then the global model's on each client's split."""
    with server_of(tiny, tmp_path, "apfl", algorithm={"name": "apfl", "alpha": 0.0}, train={"rounds": 2}) as (server, _):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            row = server.close(rnd, outputs, [])
        for k in server.panel:
            agree(server.client_model(k), server.state["params"], BITS)
        apply, fed = server.tools.apply, server.fed
        accs = []
        for k in server.panel:
            ix = fed.test_indices(k)
            with torch.no_grad():
                accs.append((apply(server.state["params"], fed.x_test[ix]).argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))


@pytest.mark.agreement
def test_at_alpha_one_the_local_model_trains_as_a_client_alone(tiny, tmp_path):
    """alpha 1 (fixed): the mixture is v itself (1 v + 0 w, bit for bit), so v's steps are
    plain local SGD from the client's stored v: FedAvg's local training from that model."""
    fedavg = make("fedavg", SETUP)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    with server_of(tiny, tmp_path, "apfl", algorithm={"name": "apfl", "alpha": 1.0},
                   train={"rounds": 3, "clients_per_round": 3}) as (server, w0):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            for job, out in zip(rnd.jobs, outputs):
                alone = train_client(as_fedavg(rnd.tools, fedavg, server.cfg.train),
                                     {"params": seen.get(job.client_id, w0)}, job, t)
                agree({k: alone.end_params[k] for k in w0}, {k: out.end_params[OWN + k] for k in w0}, BITS,
                      where=f"round {t}, client {job.client_id}")
            seen.update({o.client_id: {k: o.end_params[OWN + k].clone() for k in w0} for o in outputs})
            server.close(rnd, outputs, [])


@pytest.mark.agreement
def test_local_accuracy_is_each_clients_mixture_and_an_adaptive_alpha_moves_within_0_and_1(tiny, tmp_path):
    sections = dict(algorithm={"name": "apfl", "alpha": 0.5, "adaptive_alpha": True},
                    train={"rounds": 3, "clients_per_round": 3, "lr": 0.5})
    with server_of(tiny, tmp_path, "apfl", **sections) as (server, _):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            row = server.close(rnd, outputs, [])
        apply, fed = server.tools.apply, server.fed
        accs, alphas = [], []
        for k in server.panel:
            state = server.store.get(k)
            alphas.append(state["alpha"].item())
            model = mix(state["alpha"], state["v"], server.state["params"])
            ix = fed.test_indices(k)
            with torch.no_grad():
                accs.append((apply(model, fed.x_test[ix]).argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a != 0.5 for a in alphas), alphas
