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


def stack(trees: list[Tree], out: Tree | None = None) -> dict[str, Any]:
    """Stack same-structured trees along a new leading axis (one row per client); into
    ``out``'s tensors when given (same structure and shapes)."""
    if out is not None:
        return tree_map(lambda buf, *xs: torch.stack(xs, out=buf), out, *trees)
    return tree_map(lambda *xs: torch.stack(xs), trees[0], *trees[1:])


def unstack(stacked: Tree) -> list[dict[str, Any]]:
    """The rows of a tree stacked by :func:`stack` (views, one tree per client)."""
    rows = len(leaves(stacked)[0]) if leaves(stacked) else 0
    return [tree_map(lambda t: t[i], stacked) for i in range(rows)]


def weighted_sum(stacked: Tree, weights: torch.Tensor) -> dict[str, Any]:
    """``sum_k weights[k] * stacked[k]`` leaf-wise; weights has one entry per row.

    The rows go through :class:`RunningSum` (``acc = w_0 x_0``, then ``acc += w_k x_k`` in row
    order): the product ``w * x`` of a whole stack is as big as the stack itself (330 MB for
    50 FedAvg CNNs) and cost ten times more than the sum (BENCHMARKS.md, S2), and a streamed
    aggregation, fed the same rows one at a time, gets the same bits."""
    acc = RunningSum(weights)
    for k in range(len(weights)):
        acc.add(tree_map(lambda x: x[k], stacked))
    return acc.result()


class RunningSum:
    """``sum_k weights[k] * tree_k`` leaf-wise, with the trees given one at a time in row order,
    so no stack of them is ever built. Holds one sum per leaf."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights
        self.count = 0
        self.acc: dict[str, Any] | None = None
        self._alphas: dict[torch.dtype, list[float]] = {}  # one device read of the weights per dtype

    def add(self, tree: Tree) -> None:
        k = self.count
        if k >= len(self.weights):
            raise ValueError(f"RunningSum: row {k} given, but there are {len(self.weights)} weights")
        if self.acc is None:
            # contiguous, as a row of a stack is: the same kernel path whichever way rows come
            self.acc = tree_map(lambda x: x.contiguous() * self.weights.to(dtype=x.dtype)[0], tree)
        else:
            tree_map(lambda a, x: a.add_(x.contiguous(), alpha=self._alpha(x.dtype, k)), self.acc, tree)
        self.count = k + 1

    def _alpha(self, dtype: torch.dtype, k: int) -> float:
        if dtype not in self._alphas:
            self._alphas[dtype] = self.weights.to(dtype=dtype).tolist()
        return self._alphas[dtype][k]

    def result(self) -> dict[str, Any]:
        if self.count != len(self.weights) or self.acc is None:
            raise ValueError(f"RunningSum: {self.count} rows given for {len(self.weights)} weights")
        return self.acc


def shares_memory(tree: Tree, other: Tree) -> bool:
    """Whether any tensor of ``tree`` lives in the storage of a tensor of ``other``."""
    held = {t.untyped_storage().data_ptr() for t in leaves(other)}
    return any(t.untyped_storage().data_ptr() in held for t in leaves(tree))


def signature(tree: Tree) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``(path, shape, dtype)`` of every tensor leaf, in order: two trees with the same
    signature can be written into each other."""
    out = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.extend((f"{key}.{p}", s, d) for p, s, d in signature(value))
        elif isinstance(value, torch.Tensor):
            out.append((key, tuple(value.shape), value.dtype))
    return out


def all_finite(tree: Tree) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in leaves(tree) if t.is_floating_point())


def detach_clone(tree: Tree) -> dict[str, Any]:
    return tree_map(lambda t: t.detach().clone(), tree)


def cat(trees: list[Any]) -> Any:
    """Concatenate same-structured trees (dicts, tuples, lists of tensors) along their leading
    axis: groups of clients joined into one; a non-tensor leaf is the first tree's."""
    t0 = trees[0]
    if len(trees) == 1:
        return t0
    if isinstance(t0, torch.Tensor):
        return torch.cat(trees)
    if isinstance(t0, Mapping):
        return {k: cat([t[k] for t in trees]) for k in t0}
    if isinstance(t0, (tuple, list)):
        return type(t0)(cat([t[i] for t in trees]) for i in range(len(t0)))
    return t0


def split(tree: Any, sizes: list[int]) -> list[Any]:
    """:func:`cat`'s inverse: the tree cut along its leading axis into parts of ``sizes`` rows (views)."""
    if isinstance(tree, torch.Tensor):
        return list(torch.split(tree, sizes))
    if isinstance(tree, Mapping):
        parts = {k: split(v, sizes) for k, v in tree.items()}
        return [{k: p[i] for k, p in parts.items()} for i in range(len(sizes))]
    if isinstance(tree, (tuple, list)):
        parts_ = [split(v, sizes) for v in tree]
        return [type(tree)(p[i] for p in parts_) for i in range(len(sizes))]
    return [tree] * len(sizes)
