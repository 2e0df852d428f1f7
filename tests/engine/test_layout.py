"""The channels-last ``apply``: the same function as the plain one (values and gradients),
used on the CPU for convolutional models only, and never inside the batched executor's vmap;
and ``apply`` itself: ``functional_call``'s swap of the model's tensors, without its per-call walk."""

from __future__ import annotations

import pickle

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


CRASH = """
import torch
from fedrift.engine.local import make_apply
from fedrift.models import build_model
from fedrift.models.resnet import ResNetParams

torch.set_num_threads(2)
model = build_model("resnet8", ResNetParams(width=4), (1, 28, 28), 10, seed=0)
apply = make_apply(model, {}, channels_last=True)
params = {k: v.detach().clone() for k, v in model.named_parameters()}
for bs in (3, 7, 17) * 10:  # the batch sizes that corrupted the heap here
    x = torch.randn(bs, 1, 28, 28)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = torch.nn.functional.cross_entropy(apply(leaves, x), torch.arange(bs) % 10)
    torch.autograd.grad(loss, list(leaves.values()))
print("trained")
"""


@pytest.mark.process
def test_a_narrow_resnet_trains_with_two_threads_without_corrupting_the_heap():
    """ResNet-8 of width 4: strided 1x1 shortcut convolutions of 4 and 8 input channels,
    differentiated with two threads. Channels-last kernels crashed torch 2.13 here (oneDNN's
    backward writes past its workspace: glibc's "corrupted size vs. prev_size"), so ``apply``
    trains such a model in the default layout. In a child process: a crash fails the test,
    not the test process."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("threads", [1, 2])
def test_training_lays_out_kernels_only_without_narrow_1x1_kernels(threads):
    """The kernels ``apply`` hands the model, at one thread and at two: channels-last for
    inference always; for training only in a model without a 1x1 kernel of fewer than 16
    input channels (the FedAvg CNN and ResNet-8 of width 16: yes; of width 8: no)."""
    from fedrift.models.resnet import ResNetParams

    def laid(model, grad: bool) -> bool:
        apply = make_apply(model, {}, channels_last=True)
        params = {k: v.detach() for k, v in model.named_parameters()}
        conv = next(k for k, v in params.items() if v.dim() == 4 and v.shape[1] > 1)  # 1 channel in: both layouts
        with torch.set_grad_enabled(grad):
            return apply._inputs(params, torch.zeros(1))[0][conv].is_contiguous(memory_format=torch.channels_last)

    cnn = build_model("cnn", None, (1, 28, 28), 10, seed=0)
    wide = build_model("resnet8", ResNetParams(width=16), (3, 16, 16), 10, seed=0)
    narrow = build_model("resnet8", ResNetParams(width=8), (3, 16, 16), 10, seed=0)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert laid(cnn, True) and laid(wide, True) and not laid(narrow, True)
        assert laid(cnn, False) and laid(wide, False) and laid(narrow, False)
    finally:
        torch.set_num_threads(saved)


def test_weight_tying_is_walked_only_for_a_model_that_ties_a_tensor():
    """functional_call's weight tying (a walk over every name on each call) runs for a model
    whose tensor has two names, which needs it; a model without one gets the very same values
    without it."""
    from torch.func import functional_call

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight  # one tensor, two names

        def forward(self, x, mode="logits"):
            return self.b(torch.relu(self.a(x)))

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    tied = Tied()
    apply = make_apply(tied, {})
    params = {k: 2 * v.detach() for k, v in tied.named_parameters()}  # b.weight is not among them
    assert apply.tie and "b.weight" not in params
    w, bias_a, bias_b = params["a.weight"], params["a.bias"], params["b.bias"]
    torch.testing.assert_close(apply(params, x), torch.relu(x @ w.T + bias_a) @ w.T + bias_b)
    mlp = build_model("mlp", None, (1, 4, 4), 10, seed=0)
    apply = make_apply(mlp, {})
    params = {k: v.detach() for k, v in mlp.named_parameters()}
    x = torch.randn(5, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    assert not apply.tie
    assert torch.equal(apply(params, x), functional_call(mlp, params, (x,), {"mode": "logits"}, strict=True))


def test_apply_is_functional_call_without_its_per_call_walk():
    """``apply`` swaps the model's tensors around the forward pass as ``functional_call(...,
    strict=True)`` does (the same values and gradients, bit for bit; BatchNorm's new running
    statistics handed back in the dict), leaves the model's own tensors in place after a call,
    one that raised too, and for a missing, unexpected or repeated name raises
    ``functional_call``'s own error."""
    from torch.func import functional_call

    from fedrift.models.norm import batch_norms, norm_mode, without_stats
    from fedrift.models.resnet import ResNetParams

    model = build_model("resnet8", ResNetParams(width=4, norm="batch"), (3, 8, 8), 10, seed=0)
    own = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}

    def put_back(m: torch.nn.Module) -> bool:  # the model holds its own tensors again
        return all(v is own[k] for k, v in [*m.named_parameters(), *m.named_buffers()])

    apply = make_apply(model, dict(model.named_buffers()))
    state = {k: (v.detach() + 0.01).requires_grad_(v.is_floating_point() and k not in apply.stat_keys)
             for k, v in own.items() if k not in apply.buffers}  # the model state: parameters and statistics
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    params = without_stats(state, apply.stat_keys)
    stats = {k: state[k] for k in apply.stat_keys}
    out, new_stats = apply.train_call(params, stats, x)
    theirs = {**params, **stats, **apply.buffers}
    norms = [m for _, m in batch_norms(model)]
    with norm_mode(norms, train=True):
        expected = functional_call(model, theirs, (x,), {"mode": "logits"}, strict=True)
    assert torch.equal(out, expected)
    assert all(torch.equal(new_stats[k], theirs[k]) and not torch.equal(new_stats[k], stats[k])
               for k in apply.stat_keys if k.endswith("running_mean"))
    trained = [v for v in params.values() if v.requires_grad]
    grads = torch.autograd.grad(out.square().sum(), trained)
    expected_grads = torch.autograd.grad(expected.square().sum(), trained)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads))
    with norm_mode(norms, train=False):
        expected = functional_call(model, (state, apply.buffers), (x,), {"mode": "logits"}, strict=True)
    assert torch.equal(apply(state, x), expected)
    assert put_back(model)
    shipped = pickle.loads(pickle.dumps(apply))  # as the processes and Ray executors ship it: its slots are its model's
    assert torch.equal(shipped(state, x), expected) and put_back(model)
    with pytest.raises(RuntimeError, match="Missing key"):
        apply({k: v for k, v in state.items() if k != "fc.bias"}, x)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        apply({**state, "extra": torch.zeros(1)}, x)
    with pytest.raises(ValueError, match="appeared in multiple dictionaries"):
        apply({**state, **apply.buffers}, x)  # the fixed buffers (num_batches_tracked) twice
    with pytest.raises(RuntimeError):
        apply(state, torch.randn(2, 5, 8, 8))  # a wrong input shape: raised inside the forward pass
    assert put_back(model)
