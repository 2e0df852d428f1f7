"""Small helpers over trees: nested dicts whose leaves are tensors."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

Tree = Mapping[str, Any]


def tree_map(fn: Callable[..., torch.Tensor], tree: Tree, *rest: Tree) -> dict[str, Any]:
    """Apply ``fn`` leaf-wise over trees of the same structure."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        others = [r[key] for r in rest]
        out[key] = tree_map(fn, value, *others) if isinstance(value, Mapping) else fn(value, *others)
    return out


def leaves(tree: Tree) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for value in tree.values():
        if isinstance(value, Mapping):
            out.extend(leaves(value))
        elif isinstance(value, torch.Tensor):
            out.append(value)
    return out


def tree_bytes(tree: Tree) -> int:
    """Bytes a tree takes on the wire; a tensor referenced twice is sent once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in leaves(tree):
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def stack(trees: list[Tree]) -> dict[str, Any]:
    """Stack same-structured trees along a new leading axis (one row per client)."""
    return tree_map(lambda *xs: torch.stack(xs), trees[0], *trees[1:])


def unstack(stacked: Tree) -> list[dict[str, Any]]:
    """The rows of a tree stacked by :func:`stack` (views, one tree per client)."""
    rows = len(leaves(stacked)[0]) if leaves(stacked) else 0
    return [tree_map(lambda t: t[i], stacked) for i in range(rows)]


def weighted_sum(stacked: Tree, weights: torch.Tensor) -> dict[str, Any]:
    """``sum_k weights[k] * stacked[k]`` leaf-wise; weights has one entry per row."""

    def combine(x: torch.Tensor) -> torch.Tensor:
        w = weights.to(dtype=x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        return (w * x).sum(0)

    return tree_map(combine, stacked)


def all_finite(tree: Tree) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in leaves(tree) if t.is_floating_point())


def detach_clone(tree: Tree) -> dict[str, Any]:
    return tree_map(lambda t: t.detach().clone(), tree)
