"""The vectorised local step captured as CUDA graphs: its kernels launched as one, not op by op.

On a GPU the batched and stacked executors' step is bound by the host: a stacked step of 12
R1 runs is about 3,300 aten operations and 1,300 kernel launches, 70 ms of the host's work
(vmap's batching rules, autograd, the dispatcher) for 15 ms of kernels (the H200's G2 profile,
BENCHMARKS.md G). A CUDA graph records one call's kernels and replays them with one launch.

A graph holds fixed shapes, fixed values and fixed memory, so :class:`StepGraphs` keeps one
graph per input signature (the tensors' shapes and dtypes, and every value that is not a
tensor): each call copies its inputs into that graph's own buffers and replays it, and its
outputs are that graph's buffers, valid until the next call (the graphs share one memory pool):
the caller reads or copies them before then (``BatchedExecutor.train_group`` does). A group's
width is padded to one of a few sizes (:func:`width`), so that clients finishing one by one
reuse a handful of graphs instead of capturing one per size.

The step must be pure and free of host synchronisation (no ``.item()``, no shape that depends
on values, no random draw of its own: the engine draws noise and views before the step), as
the engine's steps are. A replay runs the kernels the uncaptured step runs, in the same order:
the same results. A capture that fails is said in one warning line, and the step then runs
uncaptured for the rest of the run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fedrift.errors import first_line

log = logging.getLogger("fedrift")

WARMUP = 2  # uncaptured calls on a side stream before a capture (lazy set-up: cuBLAS handles, cuDNN plans)

Capture = Callable[[Callable[..., Any], tuple, Any], tuple[Callable[[], None], Any]]


def width(n: int) -> int:
    """The padded size of a group of ``n`` clients: 1, 2, 3, 4, then 6, 8, 12, 16, 24, 32, ...
    (each 1.5x or 1.33x the last): at most a third of a step's rows padding, about 2 log2(n)
    graphs for every size up to n."""
    w = 1
    while w < n:
        w = w + 1 if w < 4 else (w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3)
    return w


def flatten(tree: Any, out: list[torch.Tensor], key: list[Any]) -> None:
    """``tree``'s tensors appended to ``out`` in a fixed order; its structure, the tensors'
    shapes and dtypes and its other values appended to ``key`` (what a graph is captured for)."""
    if isinstance(tree, torch.Tensor):
        out.append(tree)
        key.append((tuple(tree.shape), tree.dtype, tree.device))
    elif isinstance(tree, dict):
        key.append(("{", len(tree)))
        for k, v in tree.items():
            key.append(k)
            flatten(v, out, key)
    elif isinstance(tree, (tuple, list)):
        key.append((type(tree).__name__, len(tree)))
        for v in tree:
            flatten(v, out, key)
    else:
        key.append(tree if isinstance(tree, (int, float, str, bool, type(None))) else repr(tree))


def rebuild(tree: Any, tensors: Any) -> Any:
    """``tree`` with its tensors replaced, in :func:`flatten`'s order, by those of the iterator
    ``tensors``."""
    if isinstance(tree, torch.Tensor):
        return next(tensors)
    if isinstance(tree, dict):
        return {k: rebuild(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(rebuild(v, tensors) for v in tree)
    return tree


def cuda_capture(fn: Callable[..., Any], args: tuple, pool: Any) -> tuple[Callable[[], None], Any]:
    """``fn(*args)`` recorded as a CUDA graph in ``pool`` (after :data:`WARMUP` calls on a side
    stream, as torch's documentation prescribes): its replay, and its outputs (the graph's own
    buffers, written by each replay; the capture itself computes nothing)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: a stack's training thread captures while the runs' own threads wait; a CUDA
    # call of theirs (the allocator freeing a tensor) must not end the capture
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn(*args)
    return graph.replay, out


def eager_capture(fn: Callable[..., Any], args: tuple, pool: Any) -> tuple[Callable[[], None], Any]:
    """A stand-in for :func:`cuda_capture` on any device (the tests' CPU): the replay calls
    ``fn`` on the same input buffers and copies its outputs into the same output buffers, so
    that a caller's handling of the buffers is checked as a GPU would exercise it."""
    out = fn(*args)
    got: list[torch.Tensor] = []
    flatten(out, got, [])
    outputs = [t.clone() for t in got]
    held = rebuild(out, iter(outputs))

    def replay() -> None:
        new: list[torch.Tensor] = []
        flatten(fn(*args), new, [])
        torch._foreach_copy_(outputs, new)

    return replay, held


@dataclass
class _Graph:
    inputs: list[torch.Tensor]  # the graph's input buffers, in flatten's order
    replay: Callable[[], None]
    outputs: Any


class StepGraphs:
    """``step`` (a pure function of tensors), called through one captured graph per input
    signature (see the module's docstring). ``captures``, ``replays``, ``capture_seconds``:
    what it did (benchmarks report them); ``failed``: the first capture's error, if any."""

    def __init__(self, step: Callable[..., Any], capture: Capture = cuda_capture) -> None:
        self.step, self.capture = step, capture
        self._graphs: dict[tuple, _Graph] = {}
        self._pool: Any = None
        self.captures = self.replays = 0
        self.capture_seconds = 0.0
        self.failed: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self.failed is not None:
            return self.step(*args)
        tensors: list[torch.Tensor] = []
        key: list[Any] = []
        flatten(args, tensors, key)
        graph = self._graphs.get(sig := tuple(key))
        if graph is None:
            graph = self._make(args, tensors)
            if graph is None:
                return self.step(*args)
            self._graphs[sig] = graph
        torch._foreach_copy_(graph.inputs, tensors)
        graph.replay()
        self.replays += 1
        return graph.outputs

    def _make(self, args: tuple, tensors: list[torch.Tensor]) -> _Graph | None:
        start = time.perf_counter()
        inputs = [t.clone(memory_format=torch.contiguous_format) for t in tensors]
        try:
            if self._pool is None and tensors and tensors[0].is_cuda:
                self._pool = torch.cuda.graph_pool_handle()
            replay, outputs = self.capture(self.step, rebuild(args, iter(inputs)), self._pool)
        except Exception as err:  # noqa: BLE001 - said once; the step runs uncaptured from here on
            self.failed = first_line(err)
            log.warning(f"engine: capturing the vectorised step as a CUDA graph raised {self.failed}; "
                        "it runs uncaptured (op by op) for the rest of the run")
            self._graphs.clear()
            return None
        self.captures += 1
        self.capture_seconds += time.perf_counter() - start
        return _Graph(inputs, replay, outputs)
