"""What an executor is: the ``Executor`` protocol. The round's data it is given and returns
(``ClientJob``, ``ClientOutput``, ``RoundTools``) live in ``fedrift.engine.round_types``
and keep this import path too."""

from __future__ import annotations

from typing import Any, Protocol

from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools, StepFn, rows  # noqa: F401 - their old home


class Executor(Protocol):
    """Runs a round's jobs, returning the outputs in job order. One that trains in this process
    may declare ``hands_over = True`` and accept ``take=``: a function it calls with each
    output as soon as it exists, which may drop the output's tensors (``Server.take``)."""

    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int
    ) -> list[ClientOutput]: ...

    def close(self) -> None: ...
