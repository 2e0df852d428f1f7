import pytest
import torch

from fedrift.functional.optim import apply_updates, sgd
from agreement import BITS, agree


def _torch_sgd_run(params0, grads_seq, **kw):
    ps = [torch.nn.Parameter(p.clone()) for p in params0.values()]
    opt = torch.optim.SGD(ps, lr=kw["lr"], momentum=kw.get("momentum", 0), weight_decay=kw.get("weight_decay", 0))
    for grads in grads_seq:
        for p, g in zip(ps, grads.values()):
            p.grad = g.clone()
        if kw.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(ps, kw["clip_grad_norm"])
        opt.step()
    return [p.detach() for p in ps]


SGD_SETTINGS = (
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
    dict(lr=0.05, momentum=0.5, weight_decay=1e-3, clip_grad_norm=1.0),
)


def _problem(seed: int):
    """Two parameter tensors and six steps of large random gradients."""
    g = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
    return params, [{k: 5 * torch.randn(v.shape, generator=g) for k, v in params.items()} for _ in range(6)]


def test_functional_sgd_matches_torch_sgd_with_momentum_decay_and_clipping():
    params, grads_seq = _problem(0)
    for kw in SGD_SETTINGS:
        opt = sgd(**kw)
        p, state = dict(params), opt.init(params)
        for grads in grads_seq:
            updates, state = opt.update(grads, state, p)
            p = apply_updates(p, updates)
        expected = _torch_sgd_run(params, grads_seq, **kw)
        for got, want in zip(p.values(), expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_sgd_step_by_hand():
    # w = 1, g = 2, wd = 0.5 -> d = 2.5; momentum buffer 2.5; w' = 1 - 0.1 * 2.5 = 0.75
    opt = sgd(lr=0.1, momentum=0.9, weight_decay=0.5)
    p = {"w": torch.tensor([1.0])}
    s = opt.init(p)
    u, s = opt.update({"w": torch.tensor([2.0])}, s, p)
    p = apply_updates(p, u)
    assert torch.allclose(p["w"], torch.tensor([0.75]))
    # second step, g = 0: d = 0.5 * 0.75 = 0.375; buf = 0.9 * 2.5 + 0.375 = 2.625; w = 0.75 - 0.2625
    u, s = opt.update({"w": torch.tensor([0.0])}, s, p)
    p = apply_updates(p, u)
    assert torch.allclose(p["w"], torch.tensor([0.4875]))


def test_adam_is_torch_adam():
    from fedrift.functional.optim import adam

    p0 = {"w": torch.tensor([1.0, -2.0, 0.5])}
    opt = adam(0.1)
    state = opt.init(p0)
    p = p0
    ref = p0["w"].clone().requires_grad_(True)
    torch_opt = torch.optim.Adam([ref], lr=0.1)
    for t in range(5):
        g = {"w": torch.tensor([0.3, -1.0, 2.0]) * (t + 1) + p["w"]}
        updates, state = opt.update(g, state, p)
        p = {"w": p["w"] + updates["w"]}
        ref.grad = g["w"].clone()
        torch_opt.step()
        torch.testing.assert_close(p["w"], ref.detach(), rtol=1e-6, atol=1e-7)
    assert state["count"] == 5


@pytest.mark.agreement
def test_in_place_sgd_is_the_functional_sgd_bit_for_bit_and_leaves_the_gradients_alone():
    params, grads_seq = _problem(3)
    for kw in SGD_SETTINGS:
        opt = sgd(**kw)
        assert opt.apply_inplace is not None
        p, state = dict(params), opt.init(params)
        q = {k: v.clone() for k, v in params.items()}
        q_state = opt.init(q)
        for grads in grads_seq:
            updates, state = opt.update(grads, state, p)
            p = apply_updates(p, updates)
            before = {k: v.clone() for k, v in grads.items()}
            q_state = opt.apply_inplace(grads, q_state, q)
            assert all(torch.equal(grads[k], before[k]) for k in grads)
        agree(p, q, BITS, where=str(kw))


def test_an_expanded_gradient_is_fine_for_the_in_place_step():
    # autograd hands out stride-0 views, e.g. the gradient of p.sum(); writing into one fails
    opt = sgd(lr=0.5, momentum=0.9, weight_decay=0.1)
    p = {"w": torch.ones(3)}
    state = opt.apply_inplace({"w": torch.ones(()).expand(3)}, opt.init(p), p)
    assert torch.allclose(p["w"], torch.full((3,), 1 - 0.5 * 1.1)) and torch.allclose(state["w"], torch.full((3,), 1.1))


def test_adamw_step_by_hand():
    """One AdamW step: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2, so
    p1 = p0 - lr wd p0 - lr g / (|g| + eps); the second step from those moments."""
    from fedrift.functional.optim import adamw

    lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-8
    p0 = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}
    g1 = torch.tensor([0.5, -4.0, 0.0], dtype=torch.float64)
    opt = adamw(lr, wd, b1, b2, eps)
    state = opt.init(p0)
    up, state = opt.update({"w": g1}, state, p0)
    p1 = p0["w"] + up["w"]
    want = p0["w"] - lr * wd * p0["w"] - lr * g1 / (g1.abs() + eps)
    torch.testing.assert_close(p1, want, rtol=0, atol=1e-15)
    assert p1[2] == 0.5 - lr * wd * 0.5  # a zero gradient: decay only
    g2 = torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)
    up, state = opt.update({"w": g2}, state, {"w": p1})
    m = b1 * (1 - b1) * g1 + (1 - b1) * g2
    v = b2 * (1 - b2) * g1**2 + (1 - b2) * g2**2
    m_hat, v_hat = m / (1 - b1**2), v / (1 - b2**2)
    want2 = p1 - lr * wd * p1 - lr * m_hat / (v_hat.sqrt() + eps)
    torch.testing.assert_close(p1 + up["w"], want2, rtol=0, atol=1e-12)
    assert int(state["count"]) == 2


@pytest.mark.agreement
def test_adamw_is_torch_adamw_and_sgd_stays_the_default():
    from types import SimpleNamespace

    from fedrift.functional.optim import adamw, local_optimizer

    params, grads_seq = _problem(3)
    opt = adamw(0.01, 0.05)
    state, p = opt.init(params), dict(params)
    ref = [torch.nn.Parameter(v.clone()) for v in params.values()]
    torch_opt = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.05)
    for grads in grads_seq:
        updates, state = opt.update(grads, state, p)
        p = apply_updates(p, updates)
        for r, g in zip(ref, grads.values()):
            r.grad = g.clone()
        torch_opt.step()
    agree(p, {k: r.detach() for k, r in zip(p, ref)})
    train = SimpleNamespace(lr=0.05, momentum=0.9, weight_decay=1e-5, clip_grad_norm=None, optimizer="sgd")
    one, two = local_optimizer(train), sgd(0.05, 0.9, 1e-5)
    a, b = one.update(grads_seq[0], one.init(params), params), two.update(grads_seq[0], two.init(params), params)
    agree(a[0], b[0], BITS)  # train.optimizer=sgd: the same SGD, bit for bit
