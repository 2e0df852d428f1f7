"""The one rule by which a test compares two computations of the same thing.

``agree(a, b, promise)`` walks two results (tensors, dicts and lists of them, numbers, strings)
and holds them to what fedrift promises of the pair:

- ``BITS``: the same operations in the same order (processes and ray against sequential at one
  thread, a resumed run against the uninterrupted one): every tensor ``torch.equal``, every
  number ``==``.
- ``ROUNDING``: the same function through other kernels or summation orders (batched against
  sequential, a stacked form against vmap, a compiled step, the bf16 step's float32 master
  weights): each float tensor within 1e-4 of its layer's scale, each metric within 1e-3.
- ``ILL_CONDITIONED``: ``ROUNDING`` for a computation that amplifies float32's own error
  (FedDecorr's penalty on a two-row batch): 1e-3 of the layer's scale.
- ``BF16``: two steps that round to bfloat16 at other places (vmap's bf16 step against one
  client's): 1e-2 of the layer's scale.
- ``through_square_root(promise, eps)``: a function that takes a square root of its inputs'
  difference (CCVR's calibration).

A tensor's scale is the largest magnitude in its layer (the tensors of a state dict sharing its
name up to the last dot, both sides), floored at ``FLOOR``: the error of a sum has the scale of
its terms, not of its result, and a bias that ends near zero is the sum of steps as large as its
layer's. docs/concepts/reproducibility.md gives the rule and its reasons.

A test that calls ``agree`` is declared with ``@pytest.mark.agreement`` (``make test`` runs
every declared test again under AVX2's kernels); tests/conftest.py fails a test that compares
without the mark, or carries the mark and never compares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

FLOOR = 1e-3  # a layer all below it is held to rtol x FLOOR absolute
TIMING = ("seconds", "wall_seconds")  # a history row's clock readings: no computation's result


@dataclass(frozen=True)
class Promise:
    """What is promised of two computations: parameters within ``rtol`` of their layer's scale
    (0: bit for bit), metrics within ``metric`` relative."""

    name: str
    rtol: float
    metric: float


BITS = Promise("bits", 0.0, 0.0)
ROUNDING = Promise("rounding", 1e-4, 1e-3)  # ~840 float32 unit roundoffs; a test sample in a thousand
ILL_CONDITIONED = Promise("ill-conditioned", 1e-3, 1e-3)
BF16 = Promise("bf16", 1e-2, 1e-2)  # a few bfloat16 unit roundoffs (2**-8 = 3.9e-3)


def through_square_root(promise: Promise, eps: float) -> Promise:
    """``promise`` for a function whose outputs differ by at most the square root of its inputs'
    difference ``eps`` (CCVR's calibration draws through a covariance's symmetric square root:
    ``||A^(1/2) - B^(1/2)|| <= ||A - B||^(1/2)``)."""
    return Promise(f"{promise.name} through a square root of {eps:.2g}",
                   max(promise.rtol, eps ** 0.5), max(promise.metric, eps ** 0.5))


class Declaration:
    """Whether the running test is declared an agreement test, and whether it compared
    (set by tests/conftest.py around each test's call)."""

    declared: bool | None = None  # None: outside a test's call (a fixture, a helper module)
    used: bool = False


def agree(a, b, promise: Promise = ROUNDING, where: str = "") -> None:
    """Assert that ``a`` and ``b`` are equal as ``promise`` says (module docstring)."""
    if Declaration.declared is False:
        raise AssertionError("this test compares two computations with agree() but is not marked "
                             "@pytest.mark.agreement: make test would not run it under AVX2's kernels")
    Declaration.used = True
    _walk(a, b, promise, where or "result", None)


def untimed(history: list[dict]) -> list[dict]:
    """A run's history without its clock readings."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in history]


def largest_difference(a: Mapping, b: Mapping) -> float:
    """The largest difference of two state dicts' float tensors, relative to their layers'
    scales (the measure ``agree`` bounds)."""
    scales = _layer_scales(a, b)
    return max((_apart(_double(a[k]), _double(b[k])) / max(scales[k], FLOOR) for k in scales), default=0.0)


def _walk(a, b, promise: Promise, where: str, scale: float | None) -> None:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        _tensor(a, b, promise, where, scale)
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        assert set(a) == set(b), (f"{where}: keys {sorted(map(str, set(a) - set(b)))} in the first only, "
                                  f"{sorted(map(str, set(b) - set(a)))} in the second only")
        scales = _layer_scales(a, b)
        for k in a:
            _walk(a[k], b[k], promise, f"{where}[{k!r}]", scales.get(k))
    elif isinstance(a, Sequence) and not isinstance(a, str) and isinstance(b, Sequence) and not isinstance(b, str):
        assert len(a) == len(b), f"{where}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, promise, f"{where}[{i}]", None)
    elif isinstance(a, float) and isinstance(b, (int, float)) and promise.rtol:
        assert math.isclose(a, b, rel_tol=promise.metric, abs_tol=promise.metric * FLOOR) or (math.isnan(a) and math.isnan(b)), \
            f"{where}: {a!r} against {b!r} (promise {promise.name}: within {promise.metric:g} relative)"
    else:
        assert type(a) is type(b) and (a == b or (a != a and b != b)), f"{where}: {a!r} against {b!r}"


def _tensor(a: torch.Tensor, b: torch.Tensor, promise: Promise, where: str, scale: float | None) -> None:
    assert a.shape == b.shape, f"{where}: shape {tuple(a.shape)} against {tuple(b.shape)}"
    if not promise.rtol or not a.is_floating_point():
        assert a.dtype == b.dtype and torch.equal(a, b), \
            f"{where}: not equal bit for bit ({_worst(a, b)}) where the promise is {promise.name}"
        return
    x, y = _double(a), _double(b)
    finite = torch.isfinite(x)
    assert finite.equal(torch.isfinite(y)), f"{where}: non-finite values at other places"
    assert torch.equal(x[~finite], y[~finite]), f"{where}: other non-finite values"
    scale = max(scale if scale is not None else _largest(x, y), FLOOR)
    diff = _apart(x, y)
    bound = promise.rtol * scale
    assert diff <= bound, (f"{where}: {diff:.3g} apart where the promise ({promise.name}) allows {bound:.3g} "
                           f"= {promise.rtol:g} x the layer's scale {scale:.3g}")


def _layer_scales(a: Mapping, b: Mapping) -> dict:
    """Each float tensor's layer scale: the largest finite magnitude among the tensors whose
    names agree up to the last dot (``conv2.weight`` and ``conv2.bias``), on both sides."""
    layers: dict[str, float] = {}
    names = {}
    for k in a:
        if isinstance(a[k], torch.Tensor) and isinstance(b.get(k), torch.Tensor) and a[k].is_floating_point():
            layer = str(k).rpartition(".")[0] or str(k)
            names[k] = layer
            layers[layer] = max(layers.get(layer, 0.0), _largest(_double(a[k]), _double(b[k])))
    return {k: layers[layer] for k, layer in names.items()}


def _double(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().cpu()


def _apart(x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest difference of two tensors' finite entries (non-finite ones are compared apart)."""
    finite = torch.isfinite(x) & torch.isfinite(y)
    return (x[finite] - y[finite]).abs().max().item() if finite.any() else 0.0


def _largest(x: torch.Tensor, y: torch.Tensor) -> float:
    both = torch.cat([x.flatten(), y.flatten()])
    both = both[torch.isfinite(both)]
    return both.abs().max().item() if both.numel() else 0.0


def _worst(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} against {b.dtype}"
    if not a.is_floating_point():
        return f"{int((a != b).sum())} of {a.numel()} entries differ"
    return f"largest difference {(a.double() - b.double()).abs().max().item():.3g}"
