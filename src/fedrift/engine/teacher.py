"""Teacher caching: per-sample teacher outputs computed once per round, reused every epoch.

In every distillation method here the teacher is fixed for the round and the same for all
clients (it comes from the broadcast), and the data are not augmented, so its outputs are a
function of the sample alone. The engine computes them once for the round's clients, in
large no-grad batches, into a table indexed by training-sample index; each local step reads
its rows as ``batch["teacher"]``. With ``engine.teacher_cache: false`` the executors call the
algorithm's ``teacher`` hook on every batch instead (same values up to float rounding).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fedrift.engine.executors.base import ClientJob, RoundTools
from fedrift.engine.tree import tree_map


@torch.no_grad()
def teacher_table(tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob]) -> dict[str, Any]:
    """``{name: tensor[n_train, ...]}``, filled on the rows of the jobs' samples."""
    teacher = tools.algorithm.teacher
    assert teacher is not None
    rows = torch.unique(torch.cat([j.indices for j in jobs])) if jobs else torch.zeros(0, dtype=torch.int64)
    table: dict[str, Any] | None = None
    for start in range(0, len(rows), tools.eval_batch):
        ix = rows[start : start + tools.eval_batch]
        out = teacher(payload, tools.x[ix], tools.apply)
        if table is None:
            table = tree_map(lambda t: t.new_zeros((len(tools.x), *t.shape[1:])), out)

        def put(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
            dst[ix] = src
            return dst

        table = tree_map(put, table, out)
    return table or {}


def with_teacher(tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], cache: bool) -> RoundTools:
    """The round's tools, carrying the teacher table when the algorithm has a cacheable teacher."""
    if tools.algorithm.teacher is None or not cache:
        return tools
    return replace(tools, teacher_cache=teacher_table(tools, payload, jobs))

