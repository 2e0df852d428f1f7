"""Models: shapes, the features/head split, seeded building, shape checks, torch.func."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn import functional as F

from fedrift.errors import ConfigError
from fedrift.models import MODELS, FedModel, build_model
from fedrift.models.alexnet import AlexNetParams
from fedrift.models.fedadc_cnn import FedADCCNNParams
from fedrift.models.mlp import MLPParams
from fedrift.models.resnet import ResNet18Params, ResNetParams, group_norm

# (model, options, input shape): every registered model on shapes it should take.
CASES = [
    ("cnn", None, (1, 28, 28)),
    ("cnn", None, (3, 32, 32)),
    ("cnn", None, (1, 8, 8)),
    ("mlp", None, (1, 28, 28)),
    ("mlp", MLPParams(hidden=[16, 8]), (60,)),
    ("logreg", None, (60,)),
    ("logreg", None, (1, 8, 8)),
    ("resnet8", None, (3, 32, 32)),
    ("resnet8", ResNetParams(width=8, group_channels=4), (1, 8, 8)),
    ("resnet18", ResNet18Params(width=8, group_channels=4), (3, 32, 32)),
    ("resnet18", ResNet18Params(width=8, group_channels=4), (3, 64, 64)),
    ("resnet18", ResNet18Params(width=4, group_channels=2, stem="imagenet"), (1, 8, 8)),
    ("resnet50", ResNet18Params(width=4, group_channels=4), (3, 32, 32)),
    ("resnet50", ResNet18Params(width=4, group_channels=4), (3, 64, 64)),
    ("alexnet", AlexNetParams(hidden=32, group_channels=8), (3, 64, 64)),
    ("fedadc_cnn", None, (3, 32, 32)),
    ("fedadc_cnn", FedADCCNNParams(channels=[4, 4, 8, 8], hidden=[16, 8, 6]), (1, 28, 28)),
    ("fedadc_cnn", FedADCCNNParams(channels=[4, 4, 8, 8], hidden=[16, 8, 6]), (2, 9, 5)),  # odd sides, floored
]
# Smaller cases for the torch.func checks (3 copies, gradients).
FUNC_CASES = [
    ("cnn", None, (1, 8, 8)),
    ("mlp", MLPParams(hidden=[16, 8]), (60,)),
    ("logreg", None, (60,)),
    ("resnet8", ResNetParams(width=8, group_channels=4), (3, 8, 8)),
    ("resnet8", None, (3, 16, 16)),
    # 16x16: at 8x8 the last stage's groups hold 2 numbers, and GroupNorm turns rounding into 1e-3
    ("resnet18", ResNet18Params(width=4, group_channels=4), (3, 16, 16)),
    ("resnet50", ResNet18Params(width=2, group_channels=4), (3, 16, 16)),
    ("alexnet", AlexNetParams(hidden=16, group_channels=8), (3, 63, 63)),
    ("fedadc_cnn", FedADCCNNParams(channels=[4, 4, 8, 8], hidden=[16, 8, 6]), (3, 8, 8)),
]
NUM_CLASSES = 10


def _ids(cases):
    return [f"{n}-{'x'.join(map(str, s))}" for n, _, s in cases]


def _input(shape, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g)


def test_all_registered_models_are_covered():
    # text (the pretrained MiniLM encoder, on token ids) has its own tests: tests/models/test_text_model.py
    assert sorted({n for n, _, _ in CASES} | {"text"}) == [e.name for e in MODELS if e.source == "built in"] == [
        "alexnet", "cnn", "fedadc_cnn", "logreg", "mlp", "resnet18", "resnet50", "resnet8", "text"]


@pytest.mark.parametrize("name,options,shape", CASES, ids=_ids(CASES))
def test_shapes_and_feature_head_split(name, options, shape):
    model = build_model(name, options, shape, NUM_CLASSES, seed=0)
    assert isinstance(model, FedModel)
    x = _input(shape)
    logits = model(x)
    assert logits.shape == (4, NUM_CLASSES)
    h = model(x, mode="features")
    assert h.shape == (4, model.feature_dim)
    h2, logits2 = model(x, mode="both")
    torch.testing.assert_close(h2, h, rtol=0, atol=0)
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    torch.testing.assert_close(model(h, mode="head"), logits, rtol=0, atol=0)
    torch.testing.assert_close(model.head(model.features(x)), logits, rtol=0, atol=0)
    with pytest.raises(ValueError):
        model(x, mode="nope")


@pytest.mark.parametrize("name,options,shape", CASES, ids=_ids(CASES))
def test_head_prefixes_name_the_classifier(name, options, shape):
    model = build_model(name, options, shape, NUM_CLASSES, seed=0)
    assert model.head_prefixes == ("fc",)
    names = [k for k, _ in model.named_parameters()]
    # Matched as a plain string prefix (the loosest reading): only the classifier.
    head = [k for k in names if k.startswith(model.head_prefixes)]
    assert head == ["fc.weight", "fc.bias"]
    assert model.fc.weight.shape == (NUM_CLASSES, model.feature_dim)
    # Everything else is the feature extractor.
    assert len(names) > len(head) or name == "logreg"


@pytest.mark.parametrize("name,options,shape", CASES, ids=_ids(CASES))
def test_no_batchnorm_no_buffers(name, options, shape):
    model = build_model(name, options, shape, NUM_CLASSES, seed=0)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert list(model.buffers()) == []  # no running statistics or other in-place state


def test_resnet8_uses_groupnorm_with_group_channels():
    model = build_model("resnet8", None, (3, 32, 32), NUM_CLASSES, seed=0)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms
    assert {(m.num_channels, m.num_groups) for m in norms} == {(16, 1), (32, 2), (64, 4)}
    assert model.feature_dim == 64
    # groups = channels // group_channels, at least 1, and always a divisor of channels.
    assert group_norm(8, 16).num_groups == 1
    assert group_norm(40, 16).num_groups == 2
    assert group_norm(7, 2).num_groups == 1  # 7 // 2 = 3 does not divide 7


def test_cnn_parameter_count_matches_mcmahan():
    model = build_model("cnn", None, (1, 28, 28), 10, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 1_663_370
    assert model.feature_dim == 512


def test_parameter_counts_of_the_other_models():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build_model("mlp", None, (1, 28, 28), 10, seed=0)) == 199_210
    assert count(build_model("logreg", None, (1, 28, 28), 10, seed=0)) == 7_850
    assert count(build_model("resnet8", None, (3, 32, 32), 10, seed=0)) == 78_042


def test_options_change_the_model():
    cnn = build_model("cnn", MODELS.get("cnn").params(hidden=64), (1, 8, 8), 3, seed=0)
    assert cnn.feature_dim == 64 and cnn.fc.weight.shape == (3, 64)
    mlp = build_model("mlp", MLPParams(hidden=[]), (5,), 3, seed=0)
    assert mlp.feature_dim == 5  # no hidden layer: logistic regression
    res = build_model("resnet8", ResNetParams(width=4, group_channels=2), (3, 8, 8), 3, seed=0)
    assert res.feature_dim == 16


@pytest.mark.parametrize("name,options,shape", CASES, ids=_ids(CASES))
def test_seeded_build(name, options, shape):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a = build_model(name, options, shape, NUM_CLASSES, seed=7)
    after = torch.get_rng_state()
    assert torch.equal(before, after)  # the caller's global RNG is untouched
    b = build_model(name, options, shape, NUM_CLASSES, seed=7)
    c = build_model(name, options, shape, NUM_CLASSES, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    # ... and the caller's next draw is the one it would have been without the builds.
    drawn = torch.rand(3)
    torch.set_rng_state(before)
    assert torch.equal(drawn, torch.rand(3))


@pytest.mark.parametrize("name", ["cnn", "resnet8", "resnet18", "resnet50", "alexnet", "fedadc_cnn"])
def test_image_models_refuse_vectors(name):
    with pytest.raises(ConfigError) as err:
        build_model(name, None, (60,), NUM_CLASSES, seed=0)
    msg = str(err.value)
    assert "model.name" in msg and name in msg and "(60,)" in msg
    assert "logreg, mlp" in msg  # the models that do take it


def test_too_small_images_refused():
    with pytest.raises(ConfigError, match="resnet8.*at least 8"):
        build_model("resnet8", None, (3, 4, 4), NUM_CLASSES, seed=0)
    with pytest.raises(ConfigError, match="alexnet.*at least 63"):
        build_model("alexnet", None, (3, 62, 62), NUM_CLASSES, seed=0)
    with pytest.raises(ConfigError, match="cnn.*at least 4"):
        build_model("cnn", None, (1, 3, 3), NUM_CLASSES, seed=0)
    with pytest.raises(ConfigError, match="fedadc_cnn cannot take input shape \\(3, 32, 3\\).*at least 4"):
        build_model("fedadc_cnn", None, (3, 32, 3), NUM_CLASSES, seed=0)
    # The factory checks too, when called directly.
    with pytest.raises(ConfigError):
        MODELS.get("cnn").factory(MODELS.get("cnn").params(), (60,), NUM_CLASSES)


def test_unknown_model_names_allowed_ones():
    with pytest.raises(ConfigError, match="model.name: unknown model 'nope'; allowed: alexnet, cnn, fedadc_cnn, logreg"):
        build_model("nope", None, (60,), NUM_CLASSES, seed=0)


# ----------------------------------------------------------------------------------------
# The torch.func property the batched executor relies on.


def _stacked(name, options, shape, k=3):
    copies = [build_model(name, options, shape, NUM_CLASSES, seed=s) for s in range(k)]
    params, buffers = stack_module_state(copies)
    assert buffers == {}
    return copies, params


@pytest.mark.parametrize("name,options,shape", FUNC_CASES, ids=_ids(FUNC_CASES))
def test_vmap_functional_call_matches_each_copy(name, options, shape):
    copies, params = _stacked(name, options, shape)
    base = copies[0]
    x = _input(shape, n=5, seed=1)

    out = vmap(lambda p, x: functional_call(base, p, (x,), strict=True), in_dims=(0, None))(params, x)
    feats = vmap(
        lambda p, x: functional_call(base, p, (x,), {"mode": "features"}, strict=True), in_dims=(0, None)
    )(params, x)
    # Each copy on its own data, too.
    xs = torch.stack([_input(shape, n=5, seed=10 + i) for i in range(len(copies))])
    out_own = vmap(lambda p, x: functional_call(base, p, (x,), strict=True))(params, xs)
    with torch.no_grad():
        for i, m in enumerate(copies):
            torch.testing.assert_close(out[i], m(x), rtol=0, atol=1e-5)
            torch.testing.assert_close(feats[i], m(x, mode="features"), rtol=0, atol=1e-5)
            torch.testing.assert_close(out_own[i], m(xs[i]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,options,shape", FUNC_CASES, ids=_ids(FUNC_CASES))
def test_vmap_grad_matches_autograd(name, options, shape):
    """In float64: a gradient is discontinuous at a ReLU's kink, and float32's rounding (1e-5
    here, other kernels under vmap) flips a unit that sits within it of 0 (ResNet-50's third
    copy has one at 1.4e-6: 33% apart on a CPU without AVX2, issue 52). In float64 rounding is
    1e-14 and no unit of these inputs is that close, so equal functions give equal gradients
    to a bound that an error in a batching rule cannot meet."""
    copies = [build_model(name, options, shape, NUM_CLASSES, seed=s).double() for s in range(3)]
    params, buffers = stack_module_state(copies)
    assert buffers == {}
    base = copies[0]
    x = _input(shape, n=6, seed=2).double()
    y = torch.arange(6) % NUM_CLASSES

    def loss(p, x, y):
        return F.cross_entropy(functional_call(base, p, (x,), strict=True), y)

    grads = vmap(grad(loss), in_dims=(0, None, None))(params, x, y)
    assert set(grads) == set(params)
    for i, m in enumerate(copies):
        m.zero_grad()
        F.cross_entropy(m(x), y).backward()
        for k, p in m.named_parameters():
            torch.testing.assert_close(grads[k][i], p.grad, rtol=1e-9, atol=1e-12)


def test_resnet18_parameter_counts_are_the_published_ones():
    """GroupNorm has BatchNorm's affine parameters, so the counts are the BatchNorm models':
    the CIFAR ResNet-18 (3x3 stem) on 10 classes, and torchvision's resnet18 (7x7 stem) on
    1,000 classes (11,689,512) with its classifier cut to 200 classes (Tiny-ImageNet)."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    cifar = build_model("resnet18", None, (3, 32, 32), 10, seed=0)
    assert count(cifar) == 11_173_962 and cifar.stem_kind == "cifar" and cifar.feature_dim == 512
    tiny = build_model("resnet18", None, (3, 64, 64), 200, seed=0)
    assert tiny.stem_kind == "imagenet" and tiny.stem.kernel_size == (7, 7)
    assert count(tiny) == 11_689_512 - (512 * 1000 + 1000) + (512 * 200 + 200)
    assert build_model("resnet18", ResNet18Params(stem="cifar"), (3, 64, 64), 200, seed=0).stem_kind == "cifar"


def test_resnet18_stages_groups_and_projection_head():
    model = build_model("resnet18", ResNet18Params(width=8, group_channels=4, projection_dim=6), (3, 32, 32), 5, seed=0)
    norms = {(m.num_channels, m.num_groups) for m in model.modules() if isinstance(m, nn.GroupNorm)}
    assert norms == {(8, 2), (16, 4), (32, 8), (64, 16)}
    assert model.feature_dim == 6 and model.proj[0].in_features == 64 and model.fc.in_features == 6
    x = _input((3, 32, 32))
    h = model(x, mode="features")
    assert h.shape == (4, 6) and model(x).shape == (4, 5)
    # 32x32 through the CIFAR stem and three stride-2 stages: 4x4 before the pooling
    inner = model.layer4(model.layer3(model.layer2(model.layer1(F.relu(model.stem_norm(model.stem(x)))))))
    assert inner.shape == (4, 64, 4, 4)


def test_resnet50_parameter_counts_are_the_published_ones():
    """torchvision's resnet50 (ImageNet stem, 1,000 classes, BatchNorm): 25,557,032; GroupNorm
    has the same two affine weights per channel. The CIFAR stem: a 3x3 conv, no max-pool."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    imagenet = build_model("resnet50", None, (3, 64, 64), 1000, seed=0)
    assert imagenet.stem_kind == "imagenet" and imagenet.feature_dim == 2048 and count(imagenet) == 25_557_032
    cifar = build_model("resnet50", None, (3, 32, 32), 10, seed=0)
    stem_diff = 64 * 3 * (7 * 7 - 3 * 3)  # the stem's kernel, 7x7 -> 3x3
    assert cifar.stem_kind == "cifar" and count(cifar) == 25_557_032 - stem_diff - 1000 * 2049 + 10 * 2049
    blocks = [len(getattr(cifar, f"layer{i}")) for i in range(1, 5)]
    assert blocks == [3, 4, 6, 3] and cifar.layer4[0].conv2.stride == (2, 2)  # stride on the 3x3 (v1.5)


def test_alexnet_is_fedbns_with_groupnorm():
    """torchvision's AlexNet (61,100,840 parameters at 1,000 classes) has FedBN's layers; FedBN
    adds a BatchNorm after each of its 5 convolutions and 2 hidden linear layers, here GroupNorm
    with the same affine weights: 2 x (64 + 192 + 384 + 256 + 256 + 4096 + 4096) = 18,688."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    model = build_model("alexnet", None, (3, 64, 64), 1000, seed=0)
    assert count(model) == 61_100_840 + 18_688 and model.feature_dim == 4096
    assert [c.out_channels for c in model.convs] == [64, 192, 384, 256, 256] and model.linear1.in_features == 9216
    assert model(_input((3, 64, 64), n=2)).shape == (2, 1000)
    small = build_model("alexnet", AlexNetParams(hidden=32, projection_dim=8), (3, 80, 80), 10, seed=0)
    h, logits = small(_input((3, 80, 80), n=2), mode="both")
    assert h.shape == (2, 8) and logits.shape == (2, 10) and small.proj[0].in_features == 32


def test_fedadc_cnn_layers_and_parameter_count_by_hand():
    """FedADC's CNN: 4 convolutions and 4 fully connected layers, no normalisation, 2 max-pools
    (the paper's description; widths and kernels are fedrift's, models/fedadc_cnn.py)."""
    model = build_model("fedadc_cnn", None, (3, 32, 32), 10, seed=0)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 32, (3, 3), (1, 1)), (32, 32, (3, 3), (1, 1)), (32, 64, (3, 3), (1, 1)), (64, 64, (3, 3), (1, 1))]
    assert [(m.in_features, m.out_features) for m in linears] == [(64 * 8 * 8, 512), (512, 256), (256, 128), (128, 10)]
    assert not any(isinstance(m, (nn.GroupNorm, nn.LayerNorm, nn.Dropout)) for m in model.modules())
    conv = 3 * 32 * 9 + 32 + 32 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 64 * 64 * 9 + 64  # 65,568
    dense = 4096 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10  # 2,263,178
    assert sum(p.numel() for p in model.parameters()) == conv + dense == 2_328_746
    assert model.feature_dim == 128 and model.head_prefixes == ("fc",)
    # the representation is dense3's ReLU output; the head is the 4th fully connected layer alone
    x = _input((3, 32, 32), n=3)
    with torch.no_grad():
        h = F.max_pool2d(F.relu(model.conv2(F.relu(model.conv1(x)))), 2)
        h = F.max_pool2d(F.relu(model.conv4(F.relu(model.conv3(h)))), 2)
        h = F.relu(model.dense3(F.relu(model.dense2(F.relu(model.dense1(h.flatten(1)))))))
        torch.testing.assert_close(model(x, mode="features"), h, rtol=0, atol=0)
        torch.testing.assert_close(model(x), model.fc(h), rtol=0, atol=0)
    # MNIST-sized input: 28 -> 14 -> 7
    assert build_model("fedadc_cnn", None, (1, 28, 28), 10, seed=0).dense1.in_features == 64 * 7 * 7
    head = build_model("fedadc_cnn", FedADCCNNParams(projection_dim=16), (3, 32, 32), 10, seed=0)
    assert head.feature_dim == 16 and head.proj[0].in_features == 128 and head(x).shape == (3, 10)


@pytest.mark.parametrize("options, key", [({"channels": [8, 8, 8]}, "channels"), ({"hidden": [8, 8, 8, 8]}, "hidden"),
                                          ({"channels": [8, 0, 8, 8]}, "channels.1"), ({"dropout": 0.5}, "dropout")])
def test_fedadc_cnn_options_are_checked(options, key):
    from fedrift.config import validate_options

    with pytest.raises(ConfigError) as err:
        validate_options("model", FedADCCNNParams, options)
    assert str(err.value).startswith(f"model.{key}:") and "\n" not in str(err.value)


# ------------------------------------------------------------------ BatchNorm (model.norm: batch)


def test_resnet_batchnorm_variants_shapes_and_counts():
    """``norm: batch`` swaps every GroupNorm for fedrift's BatchNorm: the same parameters (and
    the same initial weights for a seed), plus a running mean and variance per channel."""
    from fedrift.models.norm import BatchNorm2d, model_state, running_stat_names

    group = build_model("resnet8", None, (3, 32, 32), 10, seed=0)
    model = build_model("resnet8", ResNetParams(norm="batch"), (3, 32, 32), 10, seed=0)
    assert ResNetParams().norm == "group" and ResNet18Params().norm == "group"
    assert not any(isinstance(m, nn.GroupNorm) for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, BatchNorm2d)]
    assert len(norms) == 9 and sum(m.num_features for m in norms) == 16 * 3 + 32 * 3 + 64 * 3
    assert sum(p.numel() for p in model.parameters()) == 78_042
    assert all(torch.equal(a, b) for a, b in zip(group.parameters(), model.parameters()))
    keys = running_stat_names(model)
    assert len(keys) == 18 and keys[:2] == ("stem_norm.running_mean", "stem_norm.running_var")
    state = model_state(model)
    assert list(state) == [k for k, _ in model.named_parameters()] + list(keys)  # parameters, then statistics
    assert sum(state[k].numel() for k in keys) == 2 * 336
    model.eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert model(torch.randn(2, 3, 32, 32), mode="features").shape == (2, 64)
    for name, options, shape, n_norms in [
        ("resnet18", ResNet18Params(width=4, norm="batch"), (3, 32, 32), 1 + 8 * 2 + 3),
        ("resnet50", ResNet18Params(width=4, norm="batch"), (3, 64, 64), 1 + 16 * 3 + 4),
    ]:
        bn = build_model(name, options, shape, 5, seed=0)
        gn = build_model(name, ResNet18Params(width=4, group_channels=4), shape, 5, seed=0)
        assert sum(p.numel() for p in bn.parameters()) == sum(p.numel() for p in gn.parameters())
        assert len(running_stat_names(bn)) == 2 * n_norms
        bn.eval()
        assert bn(torch.randn(2, *shape)).shape == (2, 5)


def test_batchnorm_matches_torch_and_masks_padding():
    """Train mode: torch.nn.BatchNorm2d's output and running statistics (momentum 0.1, unbiased
    variance in the update) to float rounding, the statistics reassigned, num_batches_tracked
    left at 0; eval mode: torch's bit for bit. Rows the mask drops do not count."""
    from fedrift.models.norm import BatchNorm2d, norm_mode

    torch.manual_seed(0)
    mine, ref = BatchNorm2d(3), nn.BatchNorm2d(3)
    with torch.no_grad():
        for m in (mine, ref):
            m.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
            m.running_mean.copy_(torch.tensor([1.0, 0.0, -1.0]))
            m.running_var.copy_(torch.tensor([2.0, 1.0, 0.5]))
    x = torch.randn(5, 3, 4, 4) * 2 + 1
    before = mine.running_mean
    assert torch.allclose(mine(x), ref(x), atol=1e-5)
    assert mine.running_mean is not before  # a new tensor: no in-place update
    assert torch.allclose(mine.running_mean, ref.running_mean, atol=1e-6)
    assert torch.allclose(mine.running_var, ref.running_var, atol=1e-6)
    assert int(mine.num_batches_tracked) == 0 and int(ref.num_batches_tracked) == 1
    mine.eval(), ref.eval()
    assert torch.equal(mine(x), ref(x))
    # padding: the statistics of the kept rows only, whatever the dropped rows hold
    padded = torch.cat([x[:3], torch.full((2, 3, 4, 4), 50.0)])
    start = (mine.running_mean.clone(), mine.running_var.clone())
    with norm_mode([mine], train=True, mask=torch.tensor([True, True, True, False, False])):
        out_masked = mine(padded)
    masked = (mine.running_mean, mine.running_var)
    mine.running_mean, mine.running_var = start
    with norm_mode([mine], train=True):
        out_kept = mine(x[:3])
    assert torch.allclose(out_masked[:3], out_kept, atol=1e-5)
    assert torch.allclose(masked[0], mine.running_mean, atol=1e-6)
    assert torch.allclose(masked[1], mine.running_var, atol=1e-6)
    assert not mine.training and mine.sample_mask is None  # norm_mode puts the module back


def test_models_built_in_threads_at_once_get_their_seeds_weights():
    """Initial weights come from torch's global generator, seeded per build: builds in several
    threads of one process (a deployment's ``write_app`` beside a simulation, as the Flower
    tests do) must not draw from each other's seeding."""
    import threading

    from fedrift.models import MODELS, build_model

    params = MODELS.get("mlp").params(hidden=[64, 64])
    ref = build_model("mlp", params, (32,), 4, seed=0).state_dict()
    bad: list[str] = []

    def build() -> None:
        for _ in range(30):
            got = build_model("mlp", params, (32,), 4, seed=0).state_dict()
            bad.extend(k for k in ref if not torch.equal(ref[k], got[k]))
            build_model("mlp", params, (32,), 4, seed=1)  # another seed between, as another run's

    threads = [threading.Thread(target=build) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, f"{len(bad)} tensors drawn from another build's seeding"
