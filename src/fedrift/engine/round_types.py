"""The data of one round: the client jobs, their outputs and the run's training tools.

Below the executors, the local step and the teacher cache, which all pass them around (the
executors' own contract, ``Executor``, is in ``fedrift.engine.executors.base``, which also
exports these names under their old import path).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch.nn.utils.rnn import pad_sequence

from fedrift.algorithms.base import Algorithm, ClientData
from fedrift.functional.optim import Transform
from fedrift.functional.rng import PRIVACY_SAMPLE, gaussian, step_noise
from fedrift.functional.tree import tree_map

Params = dict[str, torch.Tensor]
# step(params, opt_state, batch, payload, ctx) -> (params, opt_state, loss, aux): engine.local.make_step
StepFn = Callable[[Params, Any, dict, dict, dict], tuple[Params, Any, torch.Tensor, dict]]


@dataclass
class ClientJob:
    """One sampled client's work: its sample indices, its batch schedule, its context."""

    client_id: int
    indices: torch.Tensor  # global train indices of the client's samples
    table: torch.Tensor  # the batch schedule: row s = step s's global train indices, -1 after its end
    ctx: dict[str, Any]  # num_samples, num_steps, label_counts, state (+ client_start's)
    state_from: Callable[[], dict[str, Any]] | None = None  # in-process: ctx["state"] read when the client trains

    def context(self) -> dict[str, Any]:
        """A copy of ``ctx`` for the client's round, its state read now when it is read late."""
        ctx = dict(self.ctx)
        if self.state_from is not None:
            ctx["state"] = self.state_from()
        return ctx

    @classmethod
    def from_schedule(cls, client_id: int, indices: torch.Tensor, schedule: list[torch.Tensor], ctx: dict[str, Any]) -> "ClientJob":
        """A job from a list of per-step index tensors (of any lengths)."""
        table = pad_sequence(schedule, batch_first=True, padding_value=-1) if schedule else indices.new_zeros((0, 1))
        return cls(client_id, indices, table, ctx)

    @property
    def num_steps(self) -> int:
        return int(self.table.shape[0])

    @property
    def schedule(self) -> list[torch.Tensor]:
        """Per step, the batch's global train indices (rows of ``table`` without the padding)."""
        sizes = (self.table >= 0).sum(1).tolist()
        return [row[:b] for row, b in zip(self.table, sizes)]


@dataclass
class ClientOutput:
    client_id: int
    upload: dict[str, Any]
    state: dict[str, Any]
    loss: torch.Tensor  # mean local loss over the client's steps (0-dim)
    aux: dict[str, torch.Tensor]  # mean over steps of each scalar the local loss reported
    end_params: dict[str, torch.Tensor]  # the local model after training (drift diagnostics)


def rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[idx]`` for an index tensor of any shape, by ``index_select`` (4x faster on the CPU
    than advanced indexing for a (clients, batch) index into the training set)."""
    return t.index_select(0, idx.reshape(-1)).view(*idx.shape, *t.shape[1:])


@dataclass(frozen=True)
class RoundTools:
    """The pure pieces an executor needs, built once per run."""

    algorithm: Algorithm
    apply: Callable[..., Any]
    optimizer: Transform
    step: StepFn  # may update its params and optimiser state in place: callers pass their own copy
    x: torch.Tensor  # whole training set, on the device
    y: torch.Tensor
    teacher_cache: dict[str, Any] | None = None  # per-sample teacher outputs of this round
    seed: int = 0  # the run's seed: per-step noise (``Algorithm.noise_dim``)
    vmap_apply: Callable[..., Any] | None = None  # ``apply`` usable under vmap (None: ``apply`` is)
    eval_batch: int = 1024  # rows per inference pass (``eval.batch_size`` resolved for the model)
    teacher_memo: Any = None  # engine.teacher.TeacherMemo: teacher outputs kept across rounds
    augment: Any = None  # engine.augment.Augment: training batches' random crop and flip (None: off)
    dp: tuple[float, float] | None = None  # sample-level DP: (clip C, noise multiplier z) of the step
    dp_shapes: tuple[tuple[str, tuple[int, ...]], ...] | None = None  # ... and the parameters' shapes
    cut: Callable[[torch.Tensor], torch.Tensor] | None = None  # text: a batch cut to its longest sentence (TokenCut)
    lr: float | None = None  # the local learning rate these tools train at: train.lr, or a round's (at_round)
    schedule: Any = None  # engine.local.LrSchedule under a train.lr_schedule, else None (train.lr throughout)
    precision: str = "fp32"  # train.precision: the local step's arithmetic (engine.local.make_step)
    rebuild: Any = None  # engine.step_values.Rebuild: the step at other values (None: these tools' values only)

    def at_lr(self, lr: float) -> "RoundTools":
        """The run's training tools at local learning rate ``lr``: algorithm, optimiser and step
        built at it (``LrSchedule``); these tools themselves when the run has no schedule or
        ``lr`` is theirs. For the run's own training tools (not personalisation's)."""
        if self.schedule is None or lr == self.lr:
            return self
        algorithm, optimizer, step = self.schedule.pieces(lr)
        return replace(self, algorithm=algorithm, optimizer=optimizer, step=step, lr=lr)

    def at_round(self, round_: int) -> "RoundTools":
        """The tools of round ``round_``: at ``train.lr_at(round_)`` (see :meth:`at_lr`)."""
        return self if self.schedule is None else self.at_lr(self.schedule.lr_at(round_))

    def client_data(self, job: ClientJob, payload: dict[str, Any]) -> ClientData:
        """The client's samples, with their rows of the teacher table (cached or computed)."""
        idx = job.indices
        teacher = None
        if self.algorithm.teacher is not None:
            if self.teacher_cache is not None:
                teacher = tree_map(lambda t: rows(t, idx), self.teacher_cache)
            else:
                with torch.no_grad():
                    teacher = self.algorithm.teacher(payload, rows(self.x, idx), self.apply)
        return ClientData(rows(self.x, idx), rows(self.y, idx), teacher)

    def start_params(self, payload: dict[str, Any], ctx: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Where local training starts: the broadcast model, the client's own (personal), the
        broadcast joined with the part the client keeps (``client_model``: FedBN), or the tree
        of its two models (``train_params``: Ditto)."""
        alg = self.algorithm
        if alg.personal:
            return ctx["state"]["params"]
        if alg.train_params is not None:
            return alg.train_params(payload, ctx["state"])
        return payload["params"] if alg.client_model is None else alg.client_model(payload, ctx["state"])

    def noise(self, round_: int, client: int, step: int, rows: int) -> torch.Tensor | None:
        """The step's ``batch["noise"]`` when the algorithm asks for one (see ``rng.step_noise``)."""
        dim = self.algorithm.noise_dim
        return None if dim is None else step_noise(self.seed, round_, client, step, rows, dim, self.x.device)

    def views(self, round_: int, client: int, step: int, rows: int) -> torch.Tensor | None:
        """The step's augmentation draws (``Augment.views``) when ``data.augment`` is on."""
        aug = self.augment
        return None if aug is None else aug.views(self.seed, round_, client, step, rows, self.x.device)

    def dp_noise(self, round_: int, client: int, step: int) -> dict[str, torch.Tensor] | None:
        """The step's ``batch["dp_noise"]`` under sample-level DP: standard normal, shaped like
        the parameters, a pure function of (seed, round, client, step)."""
        if self.dp_shapes is None:
            return None
        return gaussian(list(self.dp_shapes), self.x.device, self.seed, PRIVACY_SAMPLE, round_, client, step)

    def batch(
        self, payload: dict[str, Any], idx: torch.Tensor, w: torch.Tensor, noise: torch.Tensor | None = None,
        views: torch.Tensor | None = None, dp_noise: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """A local step's batch: inputs (augmented by ``views``, one row per sample of ``idx``,
        when given; token ids cut to the longest sentence of the whole ``idx``), labels, sample
        weights, the step's noise and DP noise if any, and teacher outputs if any (rows of the
        round's cached table, or computed on the batch, so on its augmented view, when there is
        no table)."""
        x = rows(self.x, idx)
        if self.cut is not None:  # over all of idx: the batched executor's clients share one width
            x = self.cut(x)
        if views is not None:
            lead = idx.dim()
            x = self.augment(x.reshape(-1, *x.shape[lead:]), views.reshape(-1, 3)).view(x.shape)
        out = {"x": x, "y": rows(self.y, idx), "w": w}
        if noise is not None:
            out["noise"] = noise
        if dp_noise is not None:
            out["dp_noise"] = dp_noise
        if self.algorithm.teacher is None:
            return out
        if self.teacher_cache is not None:
            out["teacher"] = tree_map(lambda t: rows(t, idx), self.teacher_cache)
            return out
        with torch.no_grad():
            flat = out["x"].reshape(-1, *out["x"].shape[idx.dim() :])
            teacher = self.algorithm.teacher(payload, flat, self.apply)
        out["teacher"] = tree_map(lambda t: t.reshape(*idx.shape, *t.shape[1:]), teacher)
        return out
