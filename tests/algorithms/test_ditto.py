"""Ditto (algorithms/ditto.py): FedAvg's global model and a personal model per client trained
towards it, both in one trained tree.

The hooks by hand on the linear model (each model's gradient, the per-model optimiser, what
travels and what stays); the global model is FedAvg's bit for bit for any lambda, under
momentum, weight decay and clipping too (each model clipped alone); at lambda 0 each personal
model trains exactly as a client training alone from it; local_accuracy is each client's
personal model on its own split; BatchNorm and AdamW are refused in one line; compare and tune
take the three two-model methods. The executors (batched, processes, ray), disk client states,
stacked runs and checkpoints run it through tests/engine/algorithm_cases.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from agreement import BITS, agree
from conftest import one_line_refusal
from linear_model import apply as linear, rand_params
from partial_sharing import one_round, server_of

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.ditto import OWN, per_part, part_sgd, tag
from fedrift.algorithms.terms import weighted_ce
from fedrift.engine.client import train_client
from fedrift.engine.local import make_step
from fedrift.functional.optim import local_optimizer
from fedrift.experiments.tune import score_of

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


def as_fedavg(tools, fedavg, train):
    """``tools`` training as FedAvg (or another one-model method): its loss, the train section's
    optimiser, their step."""
    optimizer = local_optimizer(train)
    return dataclasses.replace(tools, algorithm=fedavg, optimizer=optimizer,
                               step=make_step(fedavg, tools.apply, optimizer, inplace=True))


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(5, 4, generator=g), "y": torch.tensor([0, 2, 1, 1, 0]), "w": torch.full((5,), 0.2)}


def _grads(alg, tree, batch, payload, ctx=None):
    leaves = {k: v.clone().requires_grad_(True) for k, v in tree.items()}
    loss, aux = alg.local_loss(leaves, batch, payload, ctx or {}, linear)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return loss, aux, {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}


def _ce_grad(params, batch):
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = weighted_ce(linear(p, batch["x"]), batch["y"], batch["w"])
    return dict(zip(p, torch.autograd.grad(loss, list(p.values()))))


@pytest.mark.agreement
def test_hooks_by_hand_on_the_linear_model():
    """grad_w = grad f(w); grad_v = grad f(v) + lam (v - w_t); one step moves each by its own
    SGD; only w goes up, v stays; the scored model is v."""
    lam = 0.5
    alg = make("ditto", SETUP, lam=lam)
    w_t, v = rand_params(0), rand_params(1)
    payload, state = {"params": w_t}, alg.init_client(rand_params(1))
    tree = alg.train_params(payload, state)
    assert set(tree) == {"w", "b", OWN + "w", OWN + "b"}
    batch = _batch()
    loss, aux, g = _grads(alg, tree, batch, payload)
    fw, fv = _ce_grad(w_t, batch), _ce_grad(v, batch)
    prox = sum((v[k] - w_t[k]).pow(2).sum() for k in v)
    agree(loss, weighted_ce(linear(w_t, batch["x"]), batch["y"], batch["w"]) + aux["personal_loss"] + lam / 2 * prox)
    agree({k: g[k] for k in w_t}, fw, BITS)  # the global model's gradient is FedAvg's, exactly
    agree({k: g[OWN + k] for k in v}, {k: fv[k] + lam * (v[k] - w_t[k]) for k in v})
    new, _ = alg.optimizer.update(g, alg.optimizer.init(tree), tree)
    moved = {k: tree[k] + new[k] for k in tree}
    agree({k: moved[k] for k in w_t}, {k: w_t[k] - 0.1 * fw[k] for k in w_t})
    agree({k: moved[OWN + k] for k in v}, {k: v[k] - 0.1 * (fv[k] + lam * (v[k] - w_t[k])) for k in v})
    upload, kept = alg.client_result(payload, moved, {"state": state})
    assert set(upload["params"]) == {"w", "b"} and set(kept) == {"v"} and set(kept["v"]) == {"w", "b"}
    assert all(torch.equal(kept["v"][k], moved[OWN + k]) for k in v)
    assert alg.client_model({"params": w_t}, kept) is kept["v"]  # scored: the personal model


def test_each_model_is_clipped_alone():
    """Two models' gradients, clipped at 1: each part scaled by its own norm (torch's rule)."""
    opt = per_part([(OWN, part_sgd(dataclasses.replace(SETUP, clip_grad_norm=1.0))),
                    ("", part_sgd(dataclasses.replace(SETUP, clip_grad_norm=1.0)))])
    params = {"a": torch.zeros(2), OWN + "a": torch.zeros(2)}
    grads = {"a": torch.tensor([3.0, 4.0]), OWN + "a": torch.tensor([0.3, 0.4])}
    updates, _ = opt.update(grads, opt.init(params), params)
    torch.testing.assert_close(updates["a"], torch.tensor([-0.06, -0.08]), rtol=1e-5, atol=0)  # norm 5 -> 1
    torch.testing.assert_close(updates[OWN + "a"], torch.tensor([-0.03, -0.04]))  # norm 0.5: unclipped


@pytest.mark.agreement
@pytest.mark.parametrize("lam", [0.0, 0.5, 100.0])
def test_the_global_model_is_fedavgs_bit_for_bit(tiny, tmp_path, lam):
    """The personal model never reaches the global one's gradient or optimiser (its own SGD, its
    own clipping norm): 3 rounds with momentum, weight decay and clipping on."""
    train = {"rounds": 3, "momentum": 0.5, "weight_decay": 1e-3, "clip_grad_norm": 1.0}
    avg = fedrift.run(tiny(train=train, output={"dir": str(tmp_path / "avg")}))
    dit = fedrift.run(tiny(train=train, algorithm={"name": "ditto", "lam": lam}, output={"dir": str(tmp_path / "d")}))
    agree(avg.global_state, dit.global_state, BITS)
    assert dit.history[-1]["bytes_up"] == avg.history[-1]["bytes_up"]  # the personal model never travels
    assert dit.history[-1]["bytes_down"] == avg.history[-1]["bytes_down"]


@pytest.mark.agreement
def test_at_lambda_zero_a_personal_model_trains_as_a_client_alone(tiny, tmp_path):
    """lam 0: v's steps are plain local SGD from the client's stored v (FedAvg's local training
    from that model, bit for bit); a client sampled again resumes its own v, a first-timer the
    initial model."""
    fedavg = make("fedavg", SETUP)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    again = 0
    with server_of(tiny, tmp_path, "ditto", algorithm={"name": "ditto", "lam": 0.0},
                   train={"rounds": 3, "clients_per_round": 3}) as (server, w0):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            for job, out in zip(rnd.jobs, outputs):
                start = seen.get(job.client_id, w0)
                again += job.client_id in seen
                alone = train_client(as_fedavg(rnd.tools, fedavg, server.cfg.train), {"params": start}, job, t)
                agree({k: alone.end_params[k] for k in w0}, {k: out.end_params[OWN + k] for k in w0}, BITS,
                      where=f"round {t}, client {job.client_id}")
            ends = {o.client_id: {k: o.end_params[OWN + k].clone() for k in w0} for o in outputs}
            server.close(rnd, outputs, [])
            seen.update(ends)
            for k, v in ends.items():
                agree(server.store.get(k)["v"], v, BITS)
    assert again > 0


@pytest.mark.agreement
def test_in_a_clients_first_round_the_personal_model_is_fedproxs_client_model(tiny, tmp_path):
    """A first-timer's v starts at w_t and trains on f_k(v) + lam/2 ||v - w_t||^2: FedProx's local
    problem at mu = lam, under momentum and weight decay (the same function, its two terms'
    gradients summed by autograd in another order: the rounding rule). So where FedProx at
    mu = lam diverges (workload A at mu 1, lr 0.05, momentum 0.9), Ditto's personal model does."""
    lam = 0.5
    train = {"rounds": 1, "clients_per_round": 3, "momentum": 0.9, "weight_decay": 1e-3}
    with server_of(tiny, tmp_path, "ditto", algorithm={"name": "ditto", "lam": lam}, train=train) as (server, w0):
        rnd, outputs = one_round(server, 1)
        fedprox = make("fedprox", SETUP, mu=lam)
        for job, out in zip(rnd.jobs, outputs):
            alone = train_client(as_fedavg(rnd.tools, fedprox, server.cfg.train), {"params": w0}, job, 1)
            agree({k: alone.end_params[k] for k in w0}, {k: out.end_params[OWN + k] for k in w0},
                  where=f"client {job.client_id}")
        server.close(rnd, outputs, [])


@pytest.mark.agreement
def test_local_accuracy_is_each_clients_personal_model_on_its_own_split(tiny, tmp_path):
    sections = dict(algorithm={"name": "ditto"}, train={"rounds": 2, "clients_per_round": 3},
                    partition={"val_share": 0.2})
    with server_of(tiny, tmp_path, "ditto", **sections) as (server, w0):
        for t in server.rounds():
            rnd, outputs = one_round(server, t)
            row = server.close(rnd, outputs, [])
        apply, fed = server.tools.apply, server.fed
        accs = []
        for k in server.panel:
            ix = fed.test_indices(k)
            with torch.no_grad():
                accs.append((apply(server.store.get(k)["v"], fed.x_test[ix]).argmax(1) == fed.y_test[ix]).double().mean().item())
        agree(row["local_accuracy"], sum(accs) / len(accs))
        assert score_of(row)[0] == "val_local_accuracy"


@pytest.mark.parametrize("name", ["ditto", "apfl"])
def test_batchnorm_and_adamw_are_refused_in_one_line(tmp_path, capsys, name):
    base = ["data.name=digits", f"algorithm.name={name}", "train.rounds=1", "partition.num_clients=4",
            "train.clients_per_round=2", f"output.dir={tmp_path / 'run'}", "output.progress=false"]
    one_line_refusal(capsys, ["run", *base, "model.name=resnet8", "model.width=4", "model.norm=batch"],
                     "model.norm", name, "allowed: group")
    one_line_refusal(capsys, ["run", *base, "train.optimizer=adamw"], "train.optimizer", name, "allowed: sgd")
    assert not (tmp_path / "run").exists()


def test_compare_and_tune_take_the_two_model_methods(tiny, tmp_path):
    cfg = tiny(train={"rounds": 2}, partition={"val_share": 0.2})
    cfg.pop("output")
    names = ["ditto", "apfl", "fedrod"]
    rows = fedrift.compare(cfg, algorithms=["fedavg", *names], seeds=[0], out=tmp_path / "c", report=False,
                           verbose=False)
    assert [r["completed"] for r in rows] == [1, 1, 1, 1]
    results = fedrift.tune(cfg, algorithms=names, trials=1, out=tmp_path / "t", pruner="none", report=False,
                           verbose=False)
    assert all(results[n]["best"]["metric"] == "val_local_accuracy" for n in names)


def test_a_study_runs_the_two_model_methods(tmp_path):
    """A study file of the three (untuned, one seed): each run completes, scored per client."""
    import json

    import yaml

    from conftest import grid_config
    from fedrift.experiments.study_run import run_study

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(grid_config(tmp_path, train={"rounds": 2})))
    doc = {"base": "base.yaml", "entries": [{"entry": n, "tune": False} for n in ("ditto", "apfl", "fedrod")],
           "seeds": [0], "report": {"tsne": "none"}, "out": "out"}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert run_study(tmp_path / "study.yaml", verbose=False).finished
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "runs").glob("*/seed0/summary.json"))]
    assert len(summaries) == 3 and all(s["status"] == "completed" and s["final_local_accuracy"] > 0.3 for s in summaries)
