"""Per-client state (SCAFFOLD controls, FedDyn gradients, MOON's previous model, ...).

Kept behind a get/put interface by client id, never on client objects, so that the storage
can change (in memory here; a memory-mapped spill file for huge federations) without any
algorithm noticing. A client never seen gets ``init_client(global params)``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fedrift.engine.tree import detach_clone

Tree = dict[str, Any]


class ClientStateStore:
    def __init__(self, init_client: Callable[[dict[str, torch.Tensor]], Tree] | None, params: dict[str, torch.Tensor]) -> None:
        self._init = init_client
        self._params = params
        self._states: dict[int, Tree] = {}

    def get(self, client: int) -> Tree:
        if self._init is None:
            return {}
        if client not in self._states:
            return self._init(self._params)
        return self._states[client]

    def put(self, client: int, state: Tree) -> None:
        if self._init is not None:
            self._states[client] = detach_clone(state)

    def __len__(self) -> int:
        return len(self._states)
