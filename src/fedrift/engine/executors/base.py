"""What an executor is given and returns for one round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from fedrift.algorithms.base import Algorithm, ClientData
from fedrift.engine.local import StepFn
from fedrift.engine.optim import Transform


@dataclass
class ClientJob:
    """One sampled client's work: its sample indices, its batch schedule, its context."""

    client_id: int
    indices: torch.Tensor  # global train indices of the client's samples
    schedule: list[torch.Tensor]  # per step: global train indices of the batch
    ctx: dict[str, Any]  # num_samples, num_steps, label_counts, state (+ client_start's)


@dataclass
class ClientOutput:
    client_id: int
    upload: dict[str, Any]
    state: dict[str, Any]
    loss: torch.Tensor  # mean local loss over the client's steps (0-dim)
    aux: dict[str, torch.Tensor]  # mean over steps of each scalar the local loss reported
    end_params: dict[str, torch.Tensor]  # the local model after training (drift diagnostics)


@dataclass(frozen=True)
class RoundTools:
    """The pure pieces an executor needs, built once per run."""

    algorithm: Algorithm
    apply: Callable[..., Any]
    optimizer: Transform
    step: StepFn
    x: torch.Tensor  # whole training set, on the device
    y: torch.Tensor

    def client_data(self, job: ClientJob) -> ClientData:
        return ClientData(self.x[job.indices], self.y[job.indices])


class Executor(Protocol):
    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int
    ) -> list[ClientOutput]: ...

    def close(self) -> None: ...
