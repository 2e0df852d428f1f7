"""FedGen: generator, per-class ensemble, diversity loss, client term by hand; FedAvg identities."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, stack_module_state, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.functional.optim import adam
from fedrift.algorithms.fedgen import (
    class_weights,
    client_heads,
    diversity_loss,
    ensemble_logits,
    generate,
    generator_draws,
    generator_loss,
    init_generator,
    train_generator,
)
from fedrift.engine.local import make_apply
from fedrift.functional.tree import stack
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=5, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def _alg(name, setup=SETUP, **hp):
    return make(name, setup, **hp)


def _mlp(seed=0):
    """A 4-input, 3-class MLP with a 5-wide representation, called functionally."""
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[5]), (4,), 3, seed=seed)
    return make_apply(model, {}), {k: v.detach() for k, v in model.named_parameters()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ----------------------------------------------------------------------------------------
# Hand-checkable pieces


@pytest.mark.agreement
def test_generator_shapes_and_one_hot_conditioning():
    gen = init_generator(noise_dim=2, num_classes=3, hidden=7, feature_dim=5, seed=0)
    assert {k: tuple(v.shape) for k, v in gen.items()} == {
        "fc1.weight": (7, 5), "fc1.bias": (7,), "fc2.weight": (5, 7), "fc2.bias": (5,)}
    # PyTorch's Linear rule: uniform in +-1/sqrt(fan_in); seeded: the same again, another seed differs
    assert gen["fc1.weight"].abs().max() <= 1 / math.sqrt(5) and gen["fc2.weight"].abs().max() <= 1 / math.sqrt(7)
    _assert_same(gen, init_generator(2, 3, 7, 5, seed=0))
    assert not torch.equal(gen["fc1.weight"], init_generator(2, 3, 7, 5, seed=1)["fc1.weight"])
    eps = torch.tensor([[0.5, -1.0], [0.5, -1.0], [2.0, 0.0]])
    y = torch.tensor([0, 2, 1])
    out = generate(gen, eps, y)
    assert out.shape == (3, 5)
    # by hand: the label enters as one column of W1 (one-hot), after the noise columns
    W1, b1, W2, b2 = gen["fc1.weight"], gen["fc1.bias"], gen["fc2.weight"], gen["fc2.bias"]
    for i in range(3):
        h = torch.relu(W1[:, :2] @ eps[i] + W1[:, 2 + y[i]] + b1)
        agree(out[i], W2 @ h + b2, where=f"sample {i}")
    assert not torch.allclose(out[0], out[1])  # same noise, other label: another output


@pytest.mark.agreement
def test_per_class_ensemble_weighting_by_hand():
    """2 clients, 3 classes: client 0 holds 3/1/0 samples of classes 0/1/2, client 1 1/1/2."""
    counts = torch.tensor([[3.0, 1.0, 0.0], [1.0, 1.0, 2.0]])
    y = torch.tensor([0, 1, 2, 0])
    a = class_weights(counts, y)
    torch.testing.assert_close(a, torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.0, 1.0], [0.75, 0.25]]))
    z0 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [4.0, 0.0, 0.0], [0.0, 0.0, 8.0]])
    z1 = torch.tensor([[0.0, 4.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [4.0, 4.0, 0.0]])
    ens = ensemble_logits(torch.stack([z0, z1]), a)
    expected = torch.tensor([[0.75, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 6.0]])
    torch.testing.assert_close(ens, expected)
    # ... and the generator's objective is the CE of those logits (+ diversity), through heads
    gen = init_generator(2, 3, 4, 5, seed=0)
    eps = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    loss, parts = generator_loss(gen, eps, y, lambda z: torch.stack([z0, z1]), counts, diversity=0.5)
    agree(parts["ce"], F.cross_entropy(expected, y))
    agree(loss, F.cross_entropy(expected, y) + 0.5 * diversity_loss(eps, generate(gen, eps, y)))


def test_diversity_loss_on_known_vectors():
    # two samples: noise squared distance (mean over 2 dims) 1, output L1 distance (mean over 3) 2;
    # the 2x2 pair matrix [[0, 2], [2, 0]] has mean 1: exp(-1)
    eps = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    torch.testing.assert_close(diversity_loss(eps, out), torch.tensor(math.exp(-1.0)))
    # three samples, written out: d2(eps_a, eps_b) * d1(out_a, out_b) summed over ordered pairs / 9
    eps = torch.tensor([[0.0], [1.0], [3.0]])
    out = torch.tensor([[1.0, 0.0], [1.0, 2.0], [0.0, 0.0]])
    d2 = {(0, 1): 1.0, (0, 2): 9.0, (1, 2): 4.0}
    d1 = {(0, 1): 1.0, (0, 2): 0.5, (1, 2): 1.5}
    expected = math.exp(-2 * sum(d2[p] * d1[p] for p in d2) / 9)
    torch.testing.assert_close(diversity_loss(eps, out), torch.tensor(expected))
    # identical outputs for different noise (mode collapse) cost the most: exp(0) = 1
    assert float(diversity_loss(eps, torch.ones(3, 2))) == 1.0


@pytest.mark.agreement
def test_client_term_is_the_head_cross_entropy_on_generated_features():
    apply, params = _mlp()
    gen = init_generator(noise_dim=3, num_classes=3, hidden=8, feature_dim=5, seed=2)
    g = torch.Generator().manual_seed(1)
    x, y, noise = torch.randn(6, 4, generator=g), torch.tensor([0, 1, 2, 2, 1, 0]), torch.randn(6, 3, generator=g)
    w = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2, 0.0])  # the last row is padding
    batch = {"x": x, "y": y, "w": w, "noise": noise}
    alpha = 0.7
    alg = _alg("fedgen", alpha=alpha, noise_dim=3, hidden=8)
    assert alg.noise_dim == 3
    loss, aux = alg.local_loss(params, batch, {"params": params, "gen": gen}, {}, apply)
    ce = (F.cross_entropy(apply(params, x), y, reduction="none") * w).sum()
    z = generate(gen, noise, y)
    head = z @ params["fc.weight"].T + params["fc.bias"]  # the model's classifier on G's output
    term = alpha * F.cross_entropy(head[:5], y[:5])  # padding weighs 0
    agree(loss, ce + term)
    agree(aux["fedgen_term"], term)
    # G is a constant: only the classifier gets the term's gradient
    grads = grad(lambda p: alg.local_loss(p, batch, {"params": params, "gen": gen}, {}, apply)[0])(params)
    plain = grad(lambda p: _alg("fedavg").local_loss(p, batch, {}, {}, apply)[0])(params)
    for k in params:
        if k.startswith("fc"):
            assert not torch.allclose(grads[k], plain[k]), k
    body = [k for k in params if not k.startswith("fc")]
    agree({k: grads[k] for k in body}, {k: plain[k] for k in body})
    # no generator in the payload (not trained yet): plain CE, exactly, term reported as 0
    off, aux = alg.local_loss(params, batch, {"params": params}, {}, apply)
    agree(off, _alg("fedavg").local_loss(params, batch, {}, {}, apply)[0], BITS)
    assert float(aux["fedgen_term"]) == 0.0


@pytest.mark.agreement
def test_local_loss_gradient_under_vmap_matches_per_client():
    """The batched executor's rule: vmap(grad(local_loss)) over clients = each client's grad."""
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[5]), (4,), 3, seed=0)
    apply = make_apply(model, {})
    copies = [build_model("mlp", MODELS.get("mlp").params(hidden=[5]), (4,), 3, seed=s) for s in (1, 2)]
    stacked, _ = stack_module_state(copies)
    gen = init_generator(3, 3, 8, 5, seed=0)
    g = torch.Generator().manual_seed(3)
    batches = {"x": torch.randn(2, 6, 4, generator=g), "y": torch.randint(0, 3, (2, 6), generator=g),
               "w": torch.full((2, 6), 1 / 6), "noise": torch.randn(2, 6, 3, generator=g)}
    alg = _alg("fedgen", alpha=0.5, noise_dim=3, hidden=8)
    payload = {"params": {k: v.detach() for k, v in model.named_parameters()}, "gen": gen}

    def loss(p, b):
        return alg.local_loss(p, b, payload, {}, apply)[0]

    batched = vmap(grad(loss))(stacked, batches)
    for i in range(2):
        one = grad(loss)({k: v[i].detach() for k, v in stacked.items()}, {k: v[i] for k, v in batches.items()})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


def test_generator_draws_follow_the_pooled_label_distribution():
    counts = torch.tensor([[30.0, 0.0, 10.0, 0.0], [10.0, 0.0, 0.0, 0.0]])  # pooled 40/0/10/0
    draws = generator_draws(seed=0, round_=3, steps=50, batch=32, noise_dim=2, label_counts=counts)
    y = torch.cat([d[1] for d in draws])
    eps = torch.cat([d[0] for d in draws])
    assert set(y.tolist()) == {0, 2}  # classes no sampled client holds are never drawn
    assert abs(float((y == 0).float().mean()) - 0.8) < 0.03
    assert eps.shape == (1600, 2) and abs(float(eps.mean())) < 0.1 and abs(float(eps.std()) - 1) < 0.05
    # a pure function of (seed, round)
    again = generator_draws(0, 3, 50, 32, 2, counts)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(draws, again))
    assert not torch.equal(generator_draws(0, 4, 1, 32, 2, counts)[0][0], draws[0][0])


@pytest.mark.agreement
def test_generator_learns_to_fool_the_ensemble():
    """Fixed heads of two clients (3 classes, 5 features): a few hundred Adam steps bring the
    ensemble's cross-entropy on G's samples far below chance (log 3)."""
    apply, _ = _mlp()
    clients = [_mlp(seed=s)[1] for s in (1, 2)]
    counts = torch.tensor([[5.0, 5.0, 0.0], [1.0, 5.0, 5.0]])
    heads = client_heads(apply, stack(clients))
    z = torch.randn(3, 5)
    agree(heads(z)[1], apply(clients[1], z, mode="head"))
    gen = init_generator(4, 3, 16, 5, seed=0)
    opt = adam(1e-2)
    draws = generator_draws(0, 1, 300, 32, 4, counts)
    gen, state, log = train_generator(gen, opt, opt.init(gen), heads, counts, draws, diversity=1.0)
    assert state["count"] == 300
    assert float(log[0]["ce"]) > 0.8 and float(log[-1]["ce"]) < 0.2


@pytest.mark.agreement
def test_aggregate_averages_the_models_and_trains_the_generator():
    apply, _ = _mlp()
    setup = dataclasses.replace(SETUP, apply=apply)
    alg = _alg("fedgen", setup, noise_dim=4, hidden=16, gen_steps=3)
    clients = [_mlp(seed=s)[1] for s in (1, 2)]
    state = alg.init_server(_mlp()[1])
    assert state["gen_trained"] is False and state["gen"]["fc2.weight"].shape == (5, 16)
    info = RoundInfo(round=1, num_clients=2, sampled=(0, 1))
    assert set(alg.broadcast(state, info)) == {"params"}  # an untrained G is not sent
    uploads = stack([{"params": c, "label_counts": torch.tensor(n)} for c, n in
                     zip(clients, ([4.0, 0.0, 2.0], [1.0, 3.0, 0.0]))])
    p = torch.tensor([0.6, 0.4])
    out = alg.aggregate(state, uploads, p, info)
    agree(out["params"], {k: 0.6 * clients[0][k] + 0.4 * clients[1][k] for k in clients[0]})
    assert out["gen_trained"] is True and out["gen_opt"]["count"] == 3
    assert not torch.equal(out["gen"]["fc1.weight"], state["gen"]["fc1.weight"])
    payload = alg.broadcast(out, RoundInfo(2, 2, (0, 1)))
    assert payload["gen"] is out["gen"] and payload["params"] is out["params"]
    _assert_same(alg.aggregate(state, uploads, p, info)["gen"], out["gen"])  # deterministic per round
    # the client uploads its label counts beside its model
    upload, _ = alg.client_result(payload, clients[0], {"label_counts": torch.tensor([1.0, 2.0, 3.0]), "state": {}})
    assert set(upload) == {"params", "label_counts"}


# ----------------------------------------------------------------------------------------
# Identities with FedAvg, through the engine


_RUNS: dict = {}


@pytest.fixture
def run(tiny, tmp_path_factory):
    def go(algorithm, rounds=3):
        key = repr((sorted(algorithm.items()), rounds))
        if key not in _RUNS:
            out = str(tmp_path_factory.mktemp("fedgen") / "run")
            _RUNS[key] = fedrift.run(tiny(algorithm=algorithm, train={"rounds": rounds}, output={"dir": out}))
        return _RUNS[key]

    return go


@pytest.mark.agreement
def test_zero_weight_and_no_generator_training_give_fedavg_exactly(run):
    base = run({"name": "fedavg"})
    agree(base.global_state, run({"name": "fedgen", "alpha": 0.0}).global_state, BITS)
    agree(base.global_state, run({"name": "fedgen", "gen_steps": 0}).global_state, BITS)
    # round 1 (untrained G, not sent) is FedAvg too, with a non-zero alpha
    agree(run({"name": "fedavg"}, rounds=1).global_state, run({"name": "fedgen"}, rounds=1).global_state, BITS)
    # ... and from round 2 on the term moves the model
    moved = run({"name": "fedgen"})
    assert any(not torch.equal(base.global_state[k], moved.global_state[k]) for k in moved.global_state)
    assert moved.history[0]["fedgen_term"] == 0 and moved.history[-1]["fedgen_term"] > 0


def test_communication(run):
    base, gen = run({"name": "fedavg"}), run({"name": "fedgen"})
    g = gen.server_state["gen"]
    gen_bytes = sum(v.numel() * v.element_size() for v in g.values())
    assert g["fc1.weight"].shape == (256, 32 + 10) and g["fc2.weight"].shape == (32, 256)  # mlp [32]: 32 features
    for a, b in zip(base.history, gen.history):
        clients = a["clients"]
        assert b["bytes_up"] == a["bytes_up"] + clients * 10 * 4  # label counts, float32
        assert b["bytes_down"] == a["bytes_down"] + (clients * gen_bytes if b["round"] > 1 else 0)
    assert run({"name": "fedgen", "alpha": 0.0}).history[-1]["bytes_up"] == base.history[-1]["bytes_up"]
