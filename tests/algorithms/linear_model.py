"""A linear model small enough to check algorithms' math by hand: logits = x W + b (4 -> 3)."""

import torch


def apply(params, x, mode="logits"):
    return x @ params["w"] + params["b"]


def rand_params(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {"w": scale * torch.randn(4, 3, generator=g), "b": scale * torch.randn(3, generator=g)}
