"""FedDecorr: the correlation penalty by hand on a 3 x 2 feature matrix, padding rows left
out of the batch statistics, the released code's formula, FedAvg identity at beta = 0."""

import pytest
import torch
from torch.func import grad, vmap
from agreement import BITS, agree

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import Setup
from fedrift.algorithms.feddecorr import decorrelation
from fedrift.engine.local import make_apply
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=2, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
H = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 0.0]])


def test_penalty_by_hand():
    # column 0: centred [-1, 0, 1], unbiased var 1 -> z0 = [-1, 0, 1]
    # column 1: centred [0, 2, -2], unbiased var 4 -> z1 = [0, 1, -1]
    # G_01 = G_10 = z0 . z1 = -1 (correlation -1/2 = G / (N - 1)); mean of the 2 squares 1, / N = 1/3
    value = decorrelation(H, torch.full((3,), 1 / 3))
    assert abs(float(value) - 1 / 3) < 1e-6


@pytest.mark.agreement
def test_released_formula_on_random_features():
    """The authors' FedDecorrLoss, written out with torch's own var and an off-diagonal mask."""
    h = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    x = h - h.mean(0, keepdim=True)
    x = x / torch.sqrt(1e-8 + x.var(0, keepdim=True))
    g = x.t() @ x
    off = g[~torch.eye(5, dtype=torch.bool)]
    agree(decorrelation(h, torch.full((7,), 1 / 7)), off.pow(2).mean() / 7)


@pytest.mark.agreement
def test_padding_rows_do_not_count():
    padded = torch.cat([H, torch.tensor([[100.0, -7.0], [0.0, 0.0]])])
    w = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0])
    agree(decorrelation(padded, w), decorrelation(H, torch.full((3,), 1 / 3)))
    # one real row: 0, finite gradient
    one = padded.clone().requires_grad_(True)
    w1 = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    value = decorrelation(one, w1)
    (g,) = torch.autograd.grad(value, one)
    assert float(value.detach()) == 0.0 and torch.isfinite(g).all()


def _case():
    """logreg: its representation is the input itself, so h = H."""
    model = build_model("logreg", None, (2,), 3, seed=0)
    apply = make_apply(model, {})
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = {"x": H, "y": torch.tensor([0, 2, 1]), "w": torch.full((3,), 1 / 3)}
    return apply, params, batch


@pytest.mark.agreement
def test_loss_is_ce_plus_beta_penalty():
    apply, params, batch = _case()
    ce = make("fedavg", SETUP).local_loss(params, batch, {}, {}, apply)[0]
    loss, aux = make("feddecorr", SETUP, beta=0.3).local_loss(params, batch, {}, {}, apply)
    torch.testing.assert_close(aux["decorr"], torch.tensor(0.1))
    agree(loss, ce + 0.1)


@pytest.mark.agreement
def test_gradient_under_vmap_with_padding_matches_per_client():
    """A feature model (mlp) whose penalty has a gradient; the second client has a padded row."""
    model = build_model("mlp", MODELS.get("mlp").params(hidden=[5]), (4,), 3, seed=0)
    apply = make_apply(model, {})
    alg = make("feddecorr", SETUP, beta=1.0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, 0.5 * v]) for k, v in params.items()}
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    b = {"x": torch.stack([x, x]), "y": torch.tensor([[0, 1, 2, 0], [0, 1, 2, 0]]),
         "w": torch.tensor([[0.25] * 4, [1 / 3, 1 / 3, 1 / 3, 0.0]])}

    def loss(p, bb):
        return alg.local_loss(p, bb, {}, {}, apply)[0]

    batched = vmap(grad(loss))(stacked, b)
    for i in range(2):
        n = 4 if i == 0 else 3  # the client's real rows only: no padding at all
        real = {"x": x[:n], "y": b["y"][i, :n], "w": torch.full((n,), 1 / n)}
        one = grad(loss)({k: v[i] for k, v in stacked.items()}, real)
        # the same sums with zero rows added: float rounding only
        agree({k: batched[k][i] for k in one}, one, where=f"client {i}")


@pytest.mark.agreement
def test_beta_zero_is_exactly_fedavg(tiny, tmp_path):
    def run(alg, d):
        return fedrift.run(tiny(algorithm=alg, output={"dir": str(tmp_path / d)}, train={"rounds": 3}))

    a = run({"name": "fedavg"}, "a")
    b = run({"name": "feddecorr", "beta": 0.0}, "b")
    agree(a.global_state, b.global_state, BITS)
    c = run({"name": "feddecorr", "beta": 1.0}, "c")
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)
    assert c.history[-1]["decorr"] > 0  # the added term, reported per round


def test_sample_level_privacy_is_refused(tiny):
    """DP-SGD's per-sample losses would make the penalty 0: refused, not silently FedAvg."""
    with pytest.raises(ConfigError, match="whole batch"):
        fedrift.run(tiny(algorithm={"name": "feddecorr"}, privacy={"level": "sample"}))
