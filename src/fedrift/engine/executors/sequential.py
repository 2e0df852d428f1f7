"""The reference executor: clients one after another, the hooks called eagerly."""

from __future__ import annotations

from typing import Any, Callable

from fedrift.engine.client import HookError, train_client  # noqa: F401 - HookError: its old home
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools


class SequentialExecutor:
    one_client_at_a_time = True  # training holds one model beside the outputs (server.UploadStack)
    hands_over = True  # run_round's take: each output handed over as it is made (Server.take)

    def close(self) -> None:
        """Nothing to release: this executor runs in the calling process."""

    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int,
        take: Callable[[ClientOutput], None] | None = None,
    ) -> list[ClientOutput]:
        outputs = []
        for job in jobs:
            outputs.append(train_client(tools, payload, job, round_))
            if take is not None:
                take(outputs[-1])
        return outputs
