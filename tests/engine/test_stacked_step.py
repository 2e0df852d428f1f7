"""The vectorised step through a model's stacked form (engine/stacked_step.py): the same
function as each client's step under vmap, other float rounding."""

import pytest
import torch
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

import fedrift
from agreement import BITS, agree
from fedrift.api import prepare
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.local import make_apply, make_step, optimizer_init
from fedrift.engine.stacked_step import make_vstep, stacked_call
from fedrift.models.mlp import MLP
from fedrift.models.resnet import ResNet8


@pytest.fixture
def mlp_steps_stacked(monkeypatch):
    """The MLP steps through its stacked form (FedModel.stacked_step; off by default: slower
    than vmap on a CPU), so that the step's machinery is tested on a small model."""
    monkeypatch.setattr(MLP, "stacked_step", True)


def _rows(model, k, scale=0.05):
    g = torch.Generator().manual_seed(0)
    return {n: p.detach().unsqueeze(0) + scale * torch.randn(k, *p.shape, generator=g) for n, p in model.named_parameters()}


@pytest.mark.agreement
@pytest.mark.parametrize("mode", ["logits", "features", "both"])
def test_resnet8_as_channel_groups_is_each_clients_model(mode):
    """Three clients' ResNet-8s (GroupNorm of 2 channels a group, strides, shortcuts) as one
    network of channel groups: each client's outputs as its own model gives them."""
    model = ResNet8((3, 8, 8), 5, width=4, group_channels=2)
    p, x = _rows(model, 3), torch.randn(3, 6, 3, 8, 8)
    own = vmap(lambda q, xi: functional_call(model, q, (xi,), {"mode": mode}))(p, x)
    agree(model.stacked(p, x, mode), own)
    h = torch.randn(3, 6, model.feature_dim)
    agree(model.stacked(p, h, "head"), vmap(lambda q, hi: functional_call(model, q, (hi,), {"mode": "head"}))(p, h))


@pytest.mark.agreement
@pytest.mark.parametrize("name,shape", [("resnet18", (3, 32, 32)), ("resnet50", (3, 64, 64))])
def test_resnet18_and_50_as_channel_groups_are_each_clients_model(name, shape):
    """ResNet-18 (BasicBlocks, the CIFAR stem) and ResNet-50 (Bottlenecks, the ImageNet stem and
    its max-pool), narrowed: each client's outputs as its own model gives them; none under
    BatchNorm. Sizes that leave each last-stage GroupNorm 64 values or more: over a handful
    (a 1x1 last stage) a norm amplifies float rounding past the bound on some CPUs' kernels."""
    from fedrift.models.resnet import ResNet18, ResNet50

    cls = {"resnet18": ResNet18, "resnet50": ResNet50}[name]
    model = cls(shape, 5, width=4, group_channels=4, stem="auto")
    p, x = _rows(model, 3), torch.randn(3, 4, *shape, generator=torch.Generator().manual_seed(1))
    agree(model.stacked(p, x, "both"), vmap(lambda q, xi: functional_call(model, q, (xi,), {"mode": "both"}))(p, x))
    assert cls(shape, 5, width=4, norm="batch").stacked_features({}, x) is None


@pytest.mark.agreement
def test_the_fedavg_cnn_as_channel_groups_is_each_clients_model():
    from fedrift.models.cnn import CNN

    model = CNN((1, 8, 8), 5, hidden=12)
    p, x = _rows(model, 3), torch.randn(3, 6, 1, 8, 8)
    agree(model.stacked(p, x, "both"), vmap(lambda q, xi: functional_call(model, q, (xi,), {"mode": "both"}))(p, x))
    assert CNN((1, 8, 8), 5, norm="batch").stacked_features({}, x) is None


@pytest.mark.agreement
@pytest.mark.parametrize("mode", ["logits", "features", "both"])
def test_fedadcs_cnn_as_channel_groups_is_each_clients_model(mode):
    """FedADC's CNN (four convolutions, two poolings, three dense layers; R2's model), odd sides
    floored by its poolings: each client's outputs as its own model gives them."""
    from fedrift.models.fedadc_cnn import FedADCCNN

    model = FedADCCNN((3, 9, 9), 5, channels=(4, 4, 6, 6), hidden=(12, 10, 8))
    p, x = _rows(model, 3), torch.randn(3, 6, 3, 9, 9)
    agree(model.stacked(p, x, mode), vmap(lambda q, xi: functional_call(model, q, (xi,), {"mode": mode}))(p, x))


def test_models_without_a_stacked_form_say_so():
    """BatchNorm (running statistics), a projection head: None, and vmap batches each operation."""
    assert ResNet8((3, 8, 8), 5, width=4, norm="batch").stacked_features({}, torch.zeros(1, 1, 3, 8, 8)) is None
    mlp = MLP((4,), 3, [5], projection_dim=2)
    assert mlp.stacked(_rows(mlp, 2), torch.zeros(2, 3, 4)) is None


def _tools(name, model, precision="fp32", **algorithm):
    cfg = {"data": {"name": "digits"}, "model": model, "algorithm": {"name": name, **algorithm},
           "train": {"lr": 0.1, "momentum": 0.9, "clip_grad_norm": 1.0, "precision": precision}}
    from fedrift.engine.build import build_algorithm
    from fedrift.engine.local import make_tools
    from fedrift.models import build_model

    prep = prepare(cfg)
    net = build_model(model["name"], prep.options["model"], prep.dataset.input_shape, prep.dataset.num_classes, 0)
    alg = build_algorithm(prep, net)
    return make_tools(net, alg, prep.config.train, prep.dataset.x_train, prep.dataset.y_train, seed=0), net


@pytest.mark.agreement
@pytest.mark.parametrize("name,options,precision", [("fedavg", {}, "fp32"), ("fedprox", {"mu": 0.5}, "fp32"),
                                                    ("fedsam", {"rho": 0.05}, "fp32"), ("fedprox", {"mu": 0.5}, "bf16")])
def test_the_stacked_step_is_each_clients_step(name, options, precision, mlp_steps_stacked):
    """Two steps of three clients (FedProx: a payload term; FedSAM: a gradient inside the
    loss, through the stacked call's own backward) equal ``make_step``'s step under vmap. Under
    bf16 autocast they equal the sequential executor's steps instead (the same operations:
    ``baddbmm`` rounds as ``addmm``), where the vmapped step is 1e-2 of a weight's largest value
    from sequential's after one step (under vmap and autocast ``F.linear`` with a bias returns
    float32, its bias added in float32)."""
    tools, net = _tools(name, {"name": "mlp", "hidden": [16]}, precision, **options)
    k, n = 3, 8
    params = _rows(net, k)
    payload = {"params": {kk: v.detach() for kk, v in net.named_parameters()}}
    x = tools.x[: k * n].reshape(k, n, *tools.x.shape[1:])
    batch = {"x": x, "y": tools.y[: k * n].reshape(k, n), "w": torch.full((k, n), 1.0 / n)}
    ctx = {"num_samples": torch.full((k,), 8.0)}
    opt = vmap(lambda p: optimizer_init(tools.optimizer, p, tools.apply))(params)
    fast = make_vstep(tools, None)
    assert fast is not None
    if precision == "fp32":
        slow = vmap(make_step(tools.algorithm, tools.vmap_apply, tools.optimizer, functional=True),
                    in_dims=(0, 0, 0, None, 0))
    else:  # sequential's step, client by client
        one = make_step(tools.algorithm, tools.apply, tools.optimizer, precision=precision)

        def slow(p, o, b_, pl, c):
            outs = [one(*tree_map(lambda v: v[i].clone(), (p, o, b_)), pl, tree_map(lambda v: v[i], c)) for i in range(k)]
            return tree_map(lambda *xs: torch.stack(xs), *[x[:2] for x in outs])
    a, b = (params, opt), (params, opt)
    for _ in range(2):
        a = fast(a[0], a[1], batch, payload, ctx)[:2]
        b = slow(b[0], b[1], batch, payload, ctx)[:2]
    agree(a[0], b[0])
    assert all(not torch.equal(a[0][key], params[key]) for key in params)  # trained


@pytest.mark.agreement
def test_the_stacked_step_at_each_clients_values(mlp_steps_stacked):
    """Stacked runs at other learning rates and options (engine.step_values): each client's
    algorithm and optimiser built at its values, as the vmapped valued step builds them."""
    from functools import partial

    from fedrift.engine import step_values
    from fedrift.engine.executors.batched import _functional_step

    tools, net = _tools("fedprox", {"name": "mlp", "hidden": [16]}, mu=0.5)
    k, n = 3, 8
    params = _rows(net, k)
    payload = {"params": {kk: v.detach() for kk, v in net.named_parameters()}}
    batch = {"x": tools.x[: k * n].reshape(k, n, *tools.x.shape[1:]), "y": tools.y[: k * n].reshape(k, n),
             "w": torch.full((k, n), 1.0 / n)}
    base = step_values.values_of(tools)
    values = [{**base, step_values.LR: lr, "mu": mu} for lr, mu in ((0.1, 0.5), (0.02, 0.0), (0.05, 2.0))]
    ctx = {step_values.VALUES: step_values.value_rows(values, [1, 1, 1], torch.device("cpu"))}
    opt = vmap(lambda p: optimizer_init(tools.optimizer, p, tools.apply))(params)
    fast = make_vstep(tools, None, valued=True)(params, opt, batch, payload, ctx)
    slow = vmap(step_values.valued(partial(_functional_step, tools), tools.rebuild), in_dims=(0, 0, 0, None, 0))(
        params, opt, batch, payload, ctx)
    agree(fast[0], slow[0])
    plain = make_vstep(tools, None)(params, opt, batch, payload, {})
    assert not torch.allclose(plain[0]["fc.weight"], fast[0]["fc.weight"])  # the values did change the step


def test_the_stacked_step_is_left_where_it_does_not_apply(monkeypatch):
    """A model that does not step through its form (the MLP by default), BatchNorm statistics
    and DP-SGD keep the vmapped step (None here); a stacked form is what the batched executor
    steps with."""
    tools, _ = _tools("fedavg", {"name": "mlp", "hidden": [8]})
    assert make_vstep(tools, None) is None and ResNet8.stacked_step and not MLP.stacked_step
    monkeypatch.setattr(MLP, "stacked_step", True)
    assert make_vstep(tools, None) is not None
    step = BatchedExecutor(graphs=False).vstep(tools)
    assert not hasattr(step, "__wrapped__") and step.__qualname__.endswith("make_vstep.<locals>.step")
    bn, _ = _tools("fedavg", {"name": "resnet8", "width": 4, "norm": "batch"})
    assert make_vstep(bn, None) is None
    head, _ = _tools("fedavg", {"name": "resnet8", "width": 4, "group_channels": 2, "projection_dim": 8})
    assert make_vstep(head, None) is None  # a projection head: no stacked form
    assert make_vstep(_tools("fedavg", {"name": "resnet8", "width": 4, "group_channels": 2})[0], None) is not None
    from dataclasses import replace

    assert make_vstep(replace(tools, dp=(1.0, 1.0)), None) is None


@pytest.mark.agreement
def test_a_stacked_call_alone_is_the_models_call():
    """Outside vmap (a hook's own call): the model's call, differentiable."""
    net = MLP((4,), 3, [5])
    apply = make_apply(net, {})
    p = {kk: v.detach().requires_grad_() for kk, v in net.named_parameters()}
    x = torch.randn(6, 4)
    out = stacked_call(apply)(p, x)
    agree(out, apply(p, x), BITS)
    g = torch.autograd.grad(out.sum(), list(p.values()))
    ref = torch.autograd.grad(apply(p, x).sum(), list(p.values()))
    agree(dict(zip(p, g)), dict(zip(p, ref)))


@pytest.fixture
def images(tmp_path):
    """``data`` for a ResNet-8 federation: 600 random 16x16 RGB images (an ``npz``). Not the
    tests' 8x8 digits: there ResNet-8's last stage is 2x2, a GroupNorm group of 2 channels
    normalises 8 values, mostly the zeros of the digits' background, and a group whose
    variance is near zero turns rounding into an O(1) difference in its normalised values: on
    an AVX-512 Xeon batched and sequential were 1e-6 apart after 9 steps and 6e-4 after the
    10th (1.7e-2 after a round), where they stay 1e-6 on random images."""
    import numpy as np

    g = np.random.default_rng(0)
    path = tmp_path / "images.npz"
    np.savez(path, x_train=g.integers(0, 256, (600, 16, 16, 3), dtype=np.uint8), y_train=g.integers(0, 10, 600),
             x_test=g.integers(0, 256, (100, 16, 16, 3), dtype=np.uint8), y_test=g.integers(0, 10, 100))
    return {"name": "npz", "root": str(path)}


@pytest.mark.agreement
@pytest.mark.parametrize("model,train", [
    ({"name": "resnet8", "width": 4, "group_channels": 2}, {}),
    # ResNet-18 (two BasicBlocks a stage, four stages), narrowed, at a smaller learning rate and 5
    # steps a round: at the tests' 0.05 this narrow, deep network trains chaotically on random
    # labels, and rounding grows to 1e-2 in 10 steps under vmap's step as under the form's
    # (4.7e-6 here)
    ({"name": "resnet18", "width": 4, "group_channels": 4}, {"lr": 0.02, "local_steps": 5}),
], ids=["resnet8", "resnet18"])
def test_resnets_batched_equal_sequential_through_the_stacked_form(tiny, tmp_path, images, model, train):
    """The engine end to end: a ResNet (GroupNorm) federation batched, through its channel
    groups, ends where the sequential executor does (float rounding)."""
    runs = {}
    for ex in ("sequential", "batched"):
        runs[ex] = fedrift.run(tiny(data=images, engine={"executor": ex}, model=model,
                                    train={"rounds": 2, "batch_size": 16, **train}, output={"dir": str(tmp_path / ex)}))
    agree(runs["batched"].global_state, runs["sequential"].global_state)


@pytest.mark.agreement
def test_stacked_resnet8_runs_at_other_values_equal_the_runs_alone(tiny, tmp_path, images):
    """A stack of two ResNet-8 runs at other learning rates and FedProx mu: one step through
    the channel groups, each client at its own values; each run ends where it ends alone."""
    from fedrift.experiments.stacked import run_stacked

    def config(s, ex, tag):
        return tiny(seed=s, data=images, engine={"executor": ex}, model={"name": "resnet8", "width": 4, "group_channels": 2},
                    algorithm={"name": "fedprox", "mu": 0.1 * (1 + 4 * s)}, train={"rounds": 2, "batch_size": 16,
                                                                                  "lr": 0.05 / (1 + s)},
                    output={"dir": str(tmp_path / f"{tag}{s}")})

    together = run_stacked([config(s, "stacked", "t") for s in (0, 1)])
    for s, got in enumerate(together):
        alone = fedrift.run(config(s, "batched", "a"))
        agree(got.global_state, alone.global_state)
