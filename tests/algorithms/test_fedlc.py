"""FedLC: the calibrated cross-entropy by hand, absent classes, vmap, FedAvg identity at tau = 0."""

import math

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.fedlc import calibrated_ce, calibration
from fedrift.engine.local import make_apply
from fedrift.errors import ConfigError
from fedrift.models import build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)


def test_margins_by_hand():
    # 16^(-1/4) = 0.5, 1^(-1/4) = 1, absent: inf
    m = calibration(torch.tensor([16.0, 1.0, 0.0]), 2.0)
    assert torch.equal(m, torch.tensor([1.0, 2.0, float("inf")]))


@pytest.mark.agreement
def test_calibrated_ce_by_hand():
    z = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]])
    y = torch.tensor([0, 1])
    w = torch.tensor([0.25, 0.75])
    counts = torch.tensor([16.0, 1.0, 0.0])  # margins tau * [0.5, 1, inf], tau = 1
    # row 0: [0.5, 1, -inf]; row 1: [-0.5, -1, -inf]: class 2 (absent) drops out
    ce0 = -math.log(math.exp(0.5) / (math.exp(0.5) + math.exp(1.0)))
    ce1 = -math.log(math.exp(-1.0) / (math.exp(-0.5) + math.exp(-1.0)))
    loss = calibrated_ce(z, y, w, counts, 1.0)
    assert abs(float(loss) - (0.25 * ce0 + 0.75 * ce1)) < 1e-6
    # all classes held: the same as CE on z - tau n^(-1/4)
    counts = torch.tensor([16.0, 1.0, 81.0])  # 81^(-1/4) = 1/3
    cal = z - 0.5 * torch.tensor([0.5, 1.0, 1.0 / 3.0])
    expected = -(torch.log_softmax(cal, -1)[torch.arange(2), y] * w).sum()
    agree(calibrated_ce(z, y, w, counts, 0.5), expected)


@pytest.mark.agreement
def test_absent_class_gets_no_gradient_and_padding_stays_finite():
    z = torch.tensor([[1.0, 2.0, 3.0], [4.0, -1.0, 0.0]], requires_grad=True)
    counts = torch.tensor([2.0, 1.0, 0.0])
    # the second row is padding (w = 0) whose label is the absent class: log p = -inf there
    loss = calibrated_ce(z, torch.tensor([1, 2]), torch.tensor([1.0, 0.0]), counts, 1.0)
    (g,) = torch.autograd.grad(loss, z)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    assert torch.equal(g[:, 2], torch.zeros(2)) and torch.equal(g[1], torch.zeros(3))
    one = calibrated_ce(z[:1], torch.tensor([1]), torch.tensor([1.0]), counts, 1.0)
    agree(loss, one, BITS)


@pytest.mark.agreement
def test_gradient_under_vmap_matches_per_client():
    model = build_model("logreg", None, (2,), 3, seed=0)
    apply = make_apply(model, {})
    alg = make("fedlc", SETUP, tau=1.0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, v * 0.5]) for k, v in params.items()}
    batch = {"x": torch.tensor([[2.0, 1.0], [0.0, 3.0]]), "y": torch.tensor([0, 2]), "w": torch.tensor([0.25, 0.75])}
    b = {k: torch.stack([v, v]) for k, v in batch.items()}
    ctx = {"label_counts": torch.tensor([[3.0, 0.0, 1.0], [5.0, 2.0, 2.0]])}

    def loss(p, bb, c):
        return alg.local_loss(p, bb, {}, c, apply)[0]

    batched = vmap(grad(loss))(stacked, b, ctx)
    for i in range(2):
        one = grad(loss)({k: v[i] for k, v in stacked.items()}, batch, {"label_counts": ctx["label_counts"][i]})
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


@pytest.mark.agreement
def test_tau_zero_is_exactly_fedavg(tiny, tmp_path):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": "fedlc", "tau": 0.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": "fedlc"}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert c.summary["final_accuracy"] > 0.3


def test_sample_level_privacy_is_refused(tiny):
    """The margins come from the client's label counts, which one sample changes."""
    with pytest.raises(ConfigError, match="label counts"):
        fedrift.run(tiny(algorithm={"name": "fedlc"}, privacy={"level": "sample"}))
