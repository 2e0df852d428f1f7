"""``resnet8``: the CIFAR ResNet-8 of FedDF (Lin et al. 2020) and FedGKD (Yao et al. 2023),
``resnet18`` (He et al. 2016; FedGKD's CIFAR-100 and Tiny-ImageNet model) and ``resnet50``
(its bottleneck version), with GroupNorm in place of BatchNorm, or BatchNorm (``norm: batch``).

A 3x3 convolution stem of ``width`` channels, then three stages of one BasicBlock each
(widths ``width``, ``2*width``, ``4*width``; strides 1, 2, 2), global average pooling (the
representation, ``4*width`` wide) and a linear classifier ``fc``. Every norm is a GroupNorm
with ``group_channels`` channels per group. Width 16 on 3x32x32 with 10 classes: 78,042
parameters. Option ``projection_dim`` adds a projection head before ``fc`` (see
``models/base.py``).

Option ``norm: batch`` puts a BatchNorm (``models/norm.py``: running statistics as state the
engine carries, which that module's docstring defines) wherever a GroupNorm is: the same
parameters (two affine weights per channel) and the same initial weights for a seed, plus
a running mean and variance per channel. ``group`` (the default) is the GroupNorm model.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from fedrift.models import needs_image, register_model
from fedrift.models.base import FedModel, channel_groups, clients_first, grouped_conv
from fedrift.models.norm import BatchNorm2d
from fedrift.params import params

_check = needs_image(8)


@params
class ResNetParams:
    """``width``: channels of the stem and first stage (16 in FedDF/FedGKD);
    ``group_channels``: channels per GroupNorm group (16 as in FedGKD).

    ``projection_dim``: when set, a projection head ``proj`` (``Linear(feat, feat) -> ReLU ->
    Linear(feat, projection_dim)``, MOON's) sits between the representation and ``fc``;
    ``features`` then returns its output (MOON, FedGKD+; 256 in their papers). None: no head.

    ``norm``: ``group`` (GroupNorm, the default) or ``batch`` (BatchNorm with running
    statistics, as the FedGKD+ and MOON Tiny-ImageNet rows; ``group_channels`` then unused).
    """

    width: Annotated[int, Field(ge=1)] = 16
    group_channels: Annotated[int, Field(ge=1)] = 16
    projection_dim: Annotated[int, Field(ge=1)] | None = None
    norm: Literal["group", "batch"] = "group"


def group_norm(channels: int, group_channels: int) -> nn.GroupNorm:
    """GroupNorm with ``channels // group_channels`` groups (at least 1).

    GroupNorm needs the group count to divide ``channels``; when it does not, the largest
    divisor below it is used (so each group has at least ``group_channels`` channels).
    """
    groups = max(1, channels // group_channels)
    while channels % groups:
        groups -= 1
    return nn.GroupNorm(groups, channels)


def norm_layer(norm: str, channels: int, group_channels: int) -> nn.Module:
    """The normalisation ``model.norm`` names: ``group`` (:func:`group_norm`) or ``batch``
    (``models.norm.BatchNorm2d``: running statistics as state the engine carries)."""
    return BatchNorm2d(channels) if norm == "batch" else group_norm(channels, group_channels)


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _init_convs(model: nn.Module) -> None:
    """He initialisation (fan-out, ReLU) of every convolution, as torchvision's ResNets."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def _stacked_norm(h: torch.Tensor, p: dict[str, torch.Tensor], name: str, module: nn.GroupNorm, k: int) -> torch.Tensor:
    """``module``'s GroupNorm for K clients' channel groups: one call with K times its groups
    (a client's groups are its own channels: its own statistics), each client's affine."""
    return F.group_norm(h, k * module.num_groups, p[f"{name}.weight"].reshape(-1), p[f"{name}.bias"].reshape(-1),
                        module.eps)


def _stacked_conv_norm(h: torch.Tensor, p: dict[str, torch.Tensor], block: nn.Module, prefix: str, conv: str,
                       norm: str, k: int) -> torch.Tensor:
    """``block``'s convolution ``conv`` then its norm ``norm`` (names within the block, whose
    parameters are ``p``'s under ``prefix``) for K clients at once."""
    return _stacked_norm(grouped_conv(h, p, prefix + conv, block.get_submodule(conv), k), p, prefix + norm,
                         block.get_submodule(norm), k)


def _stacked_shortcut(h: torch.Tensor, p: dict[str, torch.Tensor], block: nn.Module, prefix: str,
                      k: int) -> torch.Tensor:
    """A block's shortcut for K clients at once: ``h`` itself, or its 1x1 convolution and norm."""
    if isinstance(block.shortcut, nn.Identity):
        return h
    return _stacked_conv_norm(h, p, block, prefix, "shortcut.0", "shortcut.1", k)


def _stacked_resnet(model: FedModel, p: dict[str, torch.Tensor], x: torch.Tensor, blocks: list[tuple[str, nn.Module]],
                    pool: bool = False) -> torch.Tensor | None:
    """A ResNet's features for K clients' images ``(K, N, C, H, W)`` as channel groups: the stem
    (convolution, norm, ReLU; then a max-pool per channel where ``pool``: the ImageNet stem's),
    each of ``blocks`` ((its parameters' prefix, the block), in order), the global average
    pool; in channels-last memory format where the model says so. None under BatchNorm (its
    running statistics: ``vmap`` batches each client's step instead)."""
    if not isinstance(model.stem_norm, nn.GroupNorm):
        return None
    k, h = x.shape[0], channel_groups(x)
    if model.stacked_channels_last:
        h = h.contiguous(memory_format=torch.channels_last)
    h = F.relu(_stacked_norm(grouped_conv(h, p, "stem", model.stem, k), p, "stem_norm", model.stem_norm, k))
    if pool:
        h = F.max_pool2d(h, kernel_size=3, stride=2, padding=1)
    for prefix, block in blocks:
        h = block.stacked(h, p, prefix, k)
    return clients_first(h.mean(dim=(-2, -1)), k)


class BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus a shortcut (1x1 conv + GN when the shape changes);
    BN for GN under ``norm="batch"``."""

    def __init__(self, cin: int, cout: int, stride: int, group_channels: int, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, cout, stride)
        self.norm1 = norm_layer(norm, cout, group_channels)
        self.conv2 = _conv3x3(cout, cout)
        self.norm2 = norm_layer(norm, cout, group_channels)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False),
                norm_layer(norm, cout, group_channels),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))

    def stacked(self, h: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, k: int) -> torch.Tensor:
        """:meth:`forward` for K clients' channel groups (``p``: their parameters, clients first;
        this block's under ``prefix``)."""
        out = F.relu(_stacked_conv_norm(h, p, self, prefix, "conv1", "norm1", k))
        out = _stacked_conv_norm(out, p, self, prefix, "conv2", "norm2", k)
        return F.relu(out + _stacked_shortcut(h, p, self, prefix, k))


class ResNet8(FedModel):
    head_prefixes = ("fc",)
    stacked_step = True  # a step of 4 clients 1.31x, of 16 2.79x faster than vmap's on this CPU (BENCHMARKS.md G)
    # the stacked form's activations in channels-last memory format (cuDNN's NHWC grouped kernels
    # without conversions): off until a GPU measures it (benchmarks/step_kernels.py times both)
    stacked_channels_last = False

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        width: int = 16,
        group_channels: int = 16,
        projection_dim: int | None = None,
        norm: str = "group",
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.stem = _conv3x3(input_shape[0], width)
        self.stem_norm = norm_layer(norm, width, group_channels)
        self.stage1 = BasicBlock(width, width, 1, group_channels, norm)
        self.stage2 = BasicBlock(width, 2 * width, 2, group_channels, norm)
        self.stage3 = BasicBlock(2 * width, 4 * width, 2, group_channels, norm)
        self._classifier(4 * width, num_classes, projection_dim)
        _init_convs(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_norm(self.stem(x)))
        x = self.stage3(self.stage2(self.stage1(x)))
        return self.proj(x.mean(dim=(-2, -1)))

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor | None:
        """The K clients as K channel groups of one network: activations ``(N, K*C, H, W)``
        throughout, each convolution one call grouped by client, each GroupNorm one call with
        K times its groups (a client's groups are its own channels: its own statistics).
        Not for BatchNorm (``norm: batch``)."""
        return _stacked_resnet(self, p, x, [(f"{name}.", getattr(self, name)) for name in ("stage1", "stage2", "stage3")])


@register_model(
    "resnet8",
    "ResNet-8 with GroupNorm, or BatchNorm (model.norm) (FedDF/FedGKD CIFAR model); (C,H,W) input, H,W >= 8",
    ResNetParams,
    _check,
)
def build_resnet8(options: ResNetParams, input_shape: tuple[int, ...], num_classes: int) -> ResNet8:
    return ResNet8(tuple(input_shape), num_classes, options.width, options.group_channels, options.projection_dim,
                   options.norm)


@params
class ResNet18Params:
    """``width``: channels of the first stage (64 as published; stages ``w, 2w, 4w, 8w``);
    ``group_channels``: channels per GroupNorm group (16 as in FedGKD); ``stem``: ``cifar``
    (one 3x3 convolution, stride 1: for 32x32 inputs), ``imagenet`` (7x7 stride 2 and a 3x3
    max-pool: the usual one, for 64x64 and up) or ``auto`` (cifar up to 32x32, else imagenet).
    ``projection_dim``: the optional projection head; ``norm``: ``group`` or ``batch`` (see
    ``ResNetParams``)."""

    width: Annotated[int, Field(ge=1)] = 64
    group_channels: Annotated[int, Field(ge=1)] = 16
    stem: Literal["auto", "cifar", "imagenet"] = "auto"
    projection_dim: Annotated[int, Field(ge=1)] | None = None
    norm: Literal["group", "batch"] = "group"


class Bottleneck(nn.Module):
    """ResNet-50's block: conv1x1-GN-ReLU, conv3x3 (the stride, as torchvision's v1.5)-GN-ReLU,
    conv1x1 to ``4 * planes``-GN, plus a shortcut (1x1 conv + GN when the shape changes);
    BN for GN under ``norm="batch"``."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, group_channels: int, norm: str = "group") -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, kernel_size=1, bias=False)
        self.norm1 = norm_layer(norm, planes, group_channels)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.norm2 = norm_layer(norm, planes, group_channels)
        self.conv3 = nn.Conv2d(planes, cout, kernel_size=1, bias=False)
        self.norm3 = norm_layer(norm, cout, group_channels)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False), norm_layer(norm, cout, group_channels)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = F.relu(self.norm2(self.conv2(out)))
        return F.relu(self.norm3(self.conv3(out)) + self.shortcut(x))

    def stacked(self, h: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, k: int) -> torch.Tensor:
        """:meth:`forward` for K clients' channel groups (as ``BasicBlock.stacked``)."""
        out = F.relu(_stacked_conv_norm(h, p, self, prefix, "conv1", "norm1", k))
        out = F.relu(_stacked_conv_norm(out, p, self, prefix, "conv2", "norm2", k))
        out = _stacked_conv_norm(out, p, self, prefix, "conv3", "norm3", k)
        return F.relu(out + _stacked_shortcut(h, p, self, prefix, k))


class ResNet(FedModel):
    """A stem, four stages of blocks (planes ``w, 2w, 4w, 8w``; strides 1, 2, 2, 2), global
    average pooling (the representation, ``8 * w * block.expansion`` wide) and ``fc``."""

    head_prefixes = ("fc",)
    # through the stacked form, a step of 4 clients of 32 images 1.62x (ResNet-18), 2.10x (ResNet-50)
    # faster than vmap's on this CPU (BENCHMARKS.md G); channels-last as ResNet8's
    stacked_step = True
    stacked_channels_last = False

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        block: type[nn.Module],
        depths: tuple[int, int, int, int],
        width: int = 64,
        group_channels: int = 16,
        stem: str = "auto",
        projection_dim: int | None = None,
        norm: str = "group",
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        if stem == "auto":
            stem = "cifar" if max(input_shape[1:]) <= 32 else "imagenet"
        self.stem_kind = stem
        if stem == "cifar":
            self.stem = _conv3x3(input_shape[0], width)
        else:
            self.stem = nn.Conv2d(input_shape[0], width, kernel_size=7, stride=2, padding=3, bias=False)
        self.stem_norm = norm_layer(norm, width, group_channels)
        cin, grow = width, getattr(block, "expansion", 1)
        for i, (planes, stride, depth) in enumerate(zip((width, 2 * width, 4 * width, 8 * width), (1, 2, 2, 2), depths), 1):
            blocks = [block(cin, planes, stride, group_channels, norm)]
            cin = planes * grow
            blocks += [block(cin, planes, 1, group_channels, norm) for _ in range(depth - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*blocks))
        self._classifier(cin, num_classes, projection_dim)
        _init_convs(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_norm(self.stem(x)))
        if self.stem_kind == "imagenet":
            x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.proj(x.mean(dim=(-2, -1)))

    def stacked_features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor | None:
        """As ``ResNet8.stacked_features``: the stem (the ImageNet stem's max-pool per
        channel), then every block as K channel groups. Not for BatchNorm."""
        blocks = [(f"layer{i}.{j}.", b) for i in range(1, 5) for j, b in enumerate(getattr(self, f"layer{i}"))]
        return _stacked_resnet(self, p, x, blocks, pool=self.stem_kind == "imagenet")


class ResNet18(ResNet):
    """Two BasicBlocks per stage. Width 64 with the CIFAR stem on 3x32x32 and 10 classes:
    11,173,962 parameters (as the usual CIFAR ResNet-18); with the ImageNet stem and 1,000
    classes: torchvision's 11,689,512."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, width: int = 64, group_channels: int = 16,
        stem: str = "auto", projection_dim: int | None = None, norm: str = "group",
    ) -> None:
        super().__init__(input_shape, num_classes, BasicBlock, (2, 2, 2, 2), width, group_channels, stem, projection_dim,
                         norm)


class ResNet50(ResNet):
    """Bottleneck blocks, 3, 4, 6 and 3 per stage; the representation is ``32 * width`` wide
    (2,048). Width 64 with the ImageNet stem and 1,000 classes: torchvision's resnet50's
    25,557,032 parameters (GroupNorm has BatchNorm's two affine weights per channel); with
    the CIFAR stem and 10 classes: 23,520,842."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, width: int = 64, group_channels: int = 16,
        stem: str = "auto", projection_dim: int | None = None, norm: str = "group",
    ) -> None:
        super().__init__(input_shape, num_classes, Bottleneck, (3, 4, 6, 3), width, group_channels, stem, projection_dim,
                         norm)


@register_model(
    "resnet18",
    "ResNet-18 with GroupNorm, or BatchNorm (model.norm); CIFAR stem up to 32x32, ImageNet stem above (model.stem); (C,H,W), H,W >= 8",
    ResNet18Params,
    _check,
)
def build_resnet18(options: ResNet18Params, input_shape: tuple[int, ...], num_classes: int) -> ResNet18:
    return ResNet18(
        tuple(input_shape), num_classes, options.width, options.group_channels, options.stem, options.projection_dim,
        options.norm,
    )


@register_model(
    "resnet50",
    "ResNet-50 (bottleneck blocks) with GroupNorm, or BatchNorm (model.norm); CIFAR stem up to 32x32, ImageNet stem above (model.stem); (C,H,W), H,W >= 8",
    ResNet18Params,
    _check,
)
def build_resnet50(options: ResNet18Params, input_shape: tuple[int, ...], num_classes: int) -> ResNet50:
    return ResNet50(
        tuple(input_shape), num_classes, options.width, options.group_channels, options.stem, options.projection_dim,
        options.norm,
    )
