"""Teacher caching: per-sample teacher outputs computed once per round, reused every epoch,
and a model's outputs reused across rounds while it stays a teacher.

In every distillation method here the teacher is fixed for the round and the same for all
clients (it comes from the broadcast), so without augmentation its outputs are a function of
the sample alone. (With ``data.augment`` they are not: the teacher runs on each step's
augmented batch, the student's view, and no table or memo is kept.) The engine computes them once for the round's clients, in
large no-grad batches, into a table indexed by training-sample index; each local step reads
its rows as ``batch["teacher"]``. With ``engine.teacher_cache: false`` the executors call the
algorithm's ``teacher`` hook on every batch instead (same values up to float rounding).

A teacher is a whole model state from the broadcast, so a BatchNorm model (``model.norm:
batch``) runs it in eval mode with its running statistics, changing none of them, as FedGKD's
released code runs its teacher (``models/norm.py``); its fingerprint covers those statistics.

Across rounds, :class:`TeacherMemo` keeps each model's outputs on the samples it has seen:
FedGKD-Vote's teachers are the last M global models, each a teacher for M rounds, so a
client sampled again would run models it already ran on the very same samples.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Callable

import torch

from fedrift.engine.round_types import ClientJob, RoundTools
from fedrift.functional.tree import tree_map

Params = dict[str, torch.Tensor]


def fingerprint(params: Params) -> bytes:
    """SHA-256 of a model's names, shapes, dtypes and values: the same model is recognised
    however it arrived (worker processes receive the broadcast anew every round)."""
    h = hashlib.sha256()
    for name, t in params.items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.view(-1).view(torch.uint8).numpy())
    return h.digest()


class TeacherMemo:
    """Each model's outputs (per ``apply`` mode) on the training samples it has run on.

    ``bind(apply, rows, x)`` gives the ``apply`` a teacher hook sees for a chunk ``x`` of
    training rows: on that very tensor it answers from the memo for the rows a model has
    seen and runs the model on the others only (on anything else it just runs the model).
    After a round's table, :meth:`sweep` drops the models that round did not use. A table
    that would take the memo over ``budget_bytes`` is not kept (the model then runs on every
    row, as without the memo).
    """

    def __init__(self, num_rows: int, budget_bytes: int = 256 * 2**20) -> None:
        self.num_rows, self.budget = num_rows, budget_bytes
        self.tables: dict[tuple[bytes, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.used: set[tuple[bytes, str]] = set()
        self._prints: dict[int, tuple[torch.Tensor, bytes]] = {}  # id(first tensor) -> (it, print)
        self.hits = self.misses = 0  # rows answered from the memo / run

    def _key(self, params: Params, mode: str) -> tuple[bytes, str]:
        first = next(iter(params.values()))
        held = self._prints.get(id(first))
        if held is None or held[0] is not first:  # the reference held keeps id() unambiguous
            held = self._prints[id(first)] = (first, fingerprint(params))
        return held[1], mode

    def bind(self, apply: Callable[..., Any], rows: torch.Tensor, rows_x: torch.Tensor) -> Callable[..., Any]:
        def memo_apply(params: Params, x: torch.Tensor, mode: str = "logits") -> Any:
            if x is not rows_x:
                return apply(params, x, mode)
            key = self._key(params, mode)
            self.used.add(key)
            entry = self.tables.get(key)
            if entry is None:  # a model not seen before: run it, and keep its rows if they fit
                self.misses += len(rows)
                out = apply(params, x, mode)
                if isinstance(out, torch.Tensor) and self._fits(out):
                    table = out.new_zeros((self.num_rows, *out.shape[1:]))
                    have = torch.zeros(self.num_rows, dtype=torch.bool, device=rows.device)
                    table[rows], have[rows] = out, True
                    self.tables[key] = (table, have)
                return out
            table, have = entry
            todo = ~have[rows]
            n_todo = int(todo.sum())
            self.hits += len(rows) - n_todo
            self.misses += n_todo
            if n_todo:
                new_rows = rows[todo]
                table[new_rows] = apply(params, x[todo], mode)
                have[new_rows] = True
            return table[rows]

        return memo_apply

    def _fits(self, out: torch.Tensor) -> bool:
        held = sum(t.numel() * t.element_size() for t, _ in self.tables.values())
        return held + self.num_rows * out[:1].numel() * out.element_size() <= self.budget

    def dump(self) -> list[dict[str, Any]]:
        """The kept tables, for a checkpoint: a resumed run answers from the same memo, so its
        teacher outputs have the same bits as an uninterrupted run's (rows computed in other
        batches may round differently)."""
        return [{"print": k[0].hex(), "mode": k[1], "table": t, "have": h} for k, (t, h) in self.tables.items()]

    def load(self, dumped: list[dict[str, Any]]) -> None:
        self.tables = {(bytes.fromhex(e["print"]), e["mode"]): (e["table"], e["have"]) for e in dumped}

    def sweep(self) -> None:
        """Forget the models the last table did not use (they left the teacher)."""
        self.tables = {k: v for k, v in self.tables.items() if k in self.used}
        keep = {k[0] for k in self.used}
        self._prints = {i: v for i, v in self._prints.items() if v[1] in keep}
        self.used = set()


@torch.no_grad()
def teacher_table(tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob]) -> dict[str, Any]:
    """``{name: tensor[n_train, ...]}``, filled on the rows of the jobs' samples."""
    teacher = tools.algorithm.teacher
    assert teacher is not None
    rows = torch.unique(torch.cat([j.indices for j in jobs])) if jobs else torch.zeros(0, dtype=torch.int64)
    memo = tools.teacher_memo
    table: dict[str, Any] | None = None
    for start in range(0, len(rows), tools.eval_batch):
        ix = rows[start : start + tools.eval_batch]
        x = tools.x[ix]
        out = teacher(payload, x, tools.apply if memo is None else memo.bind(tools.apply, ix, x))
        if table is None:
            table = tree_map(lambda t: t.new_zeros((len(tools.x), *t.shape[1:])), out)

        def put(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
            dst[ix] = src
            return dst

        table = tree_map(put, table, out)
    if memo is not None:
        memo.sweep()
    return table or {}


def with_teacher(tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], cache: bool) -> RoundTools:
    """The round's tools, carrying the teacher table when the algorithm has a cacheable teacher.

    With augmentation there is none: the teacher must see the view the student trains on,
    new at every step, so it runs on each augmented batch (``RoundTools.batch``)."""
    if tools.algorithm.teacher is None or not cache or tools.augment is not None:
        return tools
    return replace(tools, teacher_cache=teacher_table(tools, payload, jobs))
