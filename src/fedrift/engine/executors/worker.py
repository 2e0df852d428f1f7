"""What the executors that train in other processes share: the ``processes`` executor's
worker processes and the ``ray`` executor's actors.

Both rebuild the run's tools from its config (``engine.build.client_tools``), check with
:func:`tools_fingerprint` that they rebuilt the parent's, receive their share of a round's
jobs (:func:`split_jobs`) with the payload and either the rows of the round's teacher table
their jobs read (:func:`teacher_rows`) or :data:`BUILD_TEACHER`, train with the round's tools
(:func:`round_tools`) and send back outputs made :func:`portable`. Tools the workers do not
hold (:func:`same_run` is false: personalisation's) train in the parent instead.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import fields, replace
from typing import Any

import torch

from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.engine.teacher import with_teacher
from fedrift.functional.tree import tree_map

BUILD_TEACHER = "build"  # sent instead of teacher rows: the worker builds its clients' rows itself


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def split_jobs(jobs: list[ClientJob], buckets: int) -> list[list[int]]:
    """Job positions per worker, a pure function of the jobs: the costliest job (samples to
    process over its schedule, then client id) goes to the least-loaded bucket (lowest index
    on ties); each bucket lists its positions in job order."""
    cost = [int((job.table >= 0).sum()) for job in jobs]
    order = sorted(range(len(jobs)), key=lambda i: (-cost[i], jobs[i].client_id, i))
    load = [0] * buckets
    out: list[list[int]] = [[] for _ in range(buckets)]
    for i in order:
        b = min(range(buckets), key=lambda j: (load[j], j))
        out[b].append(i)
        load[b] += cost[i]
    return [sorted(b) for b in out if b]


def portable(tree: Any, device: torch.device | str = "cpu", memo: dict[int, Any] | None = None) -> Any:
    """``tree`` with every tensor on ``device``. A view of a larger storage is copied (pickling
    a view sends its whole storage); an object met twice (an upload that is the end model)
    stays one object, so it is pickled once."""
    memo = {} if memo is None else memo
    if id(tree) in memo:
        return memo[id(tree)][1]
    if isinstance(tree, torch.Tensor):
        out: Any = (tree.detach() if tree.requires_grad else tree).to(device)
        if out.untyped_storage().nbytes() > out.numel() * out.element_size():
            out = out.clone()
    elif isinstance(tree, dict):
        out = {k: portable(v, device, memo) for k, v in tree.items()}
    elif isinstance(tree, (list, tuple)):
        out = type(tree)(portable(v, device, memo) for v in tree)
    elif isinstance(tree, (ClientJob, ClientOutput)):
        out = type(tree)(**{k: portable(v, device, memo) for k, v in vars(tree).items()})
    else:
        return tree
    memo[id(tree)] = (tree, out)  # the original is kept so that its id is not reused
    return out


_ROUND_FIELDS = ("teacher_cache",)  # a new teacher table each round
_LR_FIELDS = ("algorithm", "optimizer", "step", "lr")  # a round's own under a train.lr_schedule (RoundTools.at_round)


def same_run(a: RoundTools, b: RoundTools) -> bool:
    """The same run's tools, whatever the round's teacher table and, under a learning-rate
    schedule, whatever the round's lr (the schedule's own pieces at it, which the workers
    build too: ``RoundTools.at_lr``)."""
    scheduled = a.schedule is not None and a.schedule is b.schedule and a.schedule.owns(a)
    skip = _ROUND_FIELDS + (_LR_FIELDS if scheduled else ())
    return all(getattr(a, f.name) is getattr(b, f.name) for f in fields(RoundTools) if f.name not in skip)


def tools_fingerprint(tools: RoundTools) -> dict[str, Any]:
    """What must be the same in the parent and a worker: algorithm, options, training data."""
    x, y = tools.x, tools.y
    rows = torch.linspace(0, max(len(x) - 1, 0), steps=min(256, len(x))).long().to(x.device)
    h = hashlib.blake2b(digest_size=16)
    h.update(x[rows].cpu().contiguous().numpy().tobytes())
    h.update(y.cpu().contiguous().numpy().tobytes())
    return {
        "algorithm": f"{tools.algorithm.name} {tools.algorithm.hparams!r}",
        "training data": f"x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}, {h.hexdigest()}",
    }


def workers_build_teacher(tools: RoundTools, cache: bool) -> bool:
    """Whether each worker builds the round's teacher table on its own clients' rows, in
    parallel: a cached teacher whose table the loop left to the executor (``builds_teacher``).
    A table the loop built (a pre-phase read it) is sent instead (:func:`teacher_rows`)."""
    return cache and tools.algorithm.teacher is not None and tools.teacher_cache is None


def teacher_rows(tools: RoundTools, jobs: list[ClientJob]) -> tuple[torch.Tensor, dict[str, Any]] | None:
    """The rows of the round's teacher table that these jobs read (their samples), or None."""
    if tools.teacher_cache is None:
        return None
    rows = torch.unique(torch.cat([j.indices for j in jobs]))
    return rows.cpu(), tree_map(lambda t: t[rows].cpu(), tools.teacher_cache)


def with_teacher_rows(tools: RoundTools, part: tuple[torch.Tensor, dict[str, Any]] | None) -> RoundTools:
    """The worker's tools carrying the parent's teacher table on the rows its jobs read."""
    if part is None:
        return tools
    rows, values = part
    rows = rows.to(tools.x.device)

    def fill(t: torch.Tensor) -> torch.Tensor:
        table = t.new_zeros((len(tools.x), *t.shape[1:]), device=tools.x.device)
        table[rows] = t.to(tools.x.device)
        return table

    return replace(tools, teacher_cache=tree_map(fill, values))


def round_tools(tools: RoundTools, lr: float | None, payload: dict[str, Any], jobs: list[ClientJob], teacher: Any) -> RoundTools:
    """A worker's tools for a round: its own at the parent's tools' lr (the round's under a
    ``train.lr_schedule``), carrying the teacher rows it was sent, or the ones it builds for
    its jobs when sent :data:`BUILD_TEACHER`."""
    at_lr = tools.at_lr(lr)
    if teacher == BUILD_TEACHER:
        return with_teacher(at_lr, payload, jobs, True)
    return with_teacher_rows(at_lr, teacher)
