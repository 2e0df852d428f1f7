"""The channels-last ``apply``: the same function as the plain one (values and gradients),
used on the CPU for convolutional models only, and never inside the batched executor's vmap."""

from __future__ import annotations

import pytest
import torch

from fedrift.engine.local import make_apply, prefers_channels_last
from fedrift.models import build_model


@pytest.mark.parametrize("name,shape", [("cnn", (1, 28, 28)), ("resnet8", (3, 16, 16))])
def test_channels_last_apply_is_the_same_function(name, shape):
    model = build_model(name, None, shape, 10, seed=0)
    plain, laid = make_apply(model, {}), make_apply(model, {}, channels_last=True)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(6, *shape, generator=torch.Generator().manual_seed(1))
    y = torch.arange(6) % 10
    for mode in ("logits", "features"):
        torch.testing.assert_close(laid(params, x, mode), plain(params, x, mode), rtol=1e-4, atol=1e-5)

    def grads(apply):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        loss = torch.nn.functional.cross_entropy(apply(leaves, x), y)
        return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    g_plain, g_laid = grads(plain), grads(laid)
    assert g_laid.keys() == g_plain.keys()
    for k in g_plain:  # the gradient reaches the caller's (default-layout) leaves
        torch.testing.assert_close(g_laid[k], g_plain[k], rtol=1e-3, atol=1e-5)
        assert g_laid[k].shape == params[k].shape


def test_only_convolutional_models_on_the_cpu_use_channels_last():
    cnn = build_model("cnn", None, (1, 28, 28), 10, seed=0)
    mlp = build_model("mlp", None, (60,), 10, seed=0)
    assert prefers_channels_last(cnn, torch.device("cpu"))
    assert not prefers_channels_last(mlp, torch.device("cpu"))
    assert not prefers_channels_last(cnn, torch.device("cuda"))


def test_inference_chunks_follow_the_model_unless_configured():
    from fedrift.algorithms import make
    from fedrift.config import TrainConfig
    from fedrift.engine.local import make_tools

    from algorithm_cases import SETUP

    alg = make("fedavg", SETUP)
    x, y = torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.int64)
    cnn = build_model("cnn", None, (1, 28, 28), 10, seed=0)
    mlp = build_model("mlp", None, (1, 28, 28), 10, seed=0)
    assert make_tools(cnn, alg, TrainConfig(), x, y, 0).eval_batch == 128
    assert make_tools(mlp, alg, TrainConfig(), x, y, 0).eval_batch == 1024
    assert make_tools(cnn, alg, TrainConfig(), x, y, 0, eval_batch=500).eval_batch == 500
    assert make_tools(cnn, alg, TrainConfig(), x, y, 0).vmap_apply is not None
