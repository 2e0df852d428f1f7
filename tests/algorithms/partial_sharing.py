"""Shared pieces of the partial-sharing tests (FedPer, LG-FedAvg, FedRep, FedBABU): a two-layer
linear model small enough to check by hand, and a run's server stepped round by round
(tests/algorithms/test_fedbn.py's form)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from fedrift.api import prepare
from fedrift.engine.build import build_run
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.federation import Federation
from fedrift.engine.outputs import RunWriter
from fedrift.engine.server import Server
from fedrift.models.norm import model_state


def two_layers(shift: float = 0.0) -> dict[str, torch.Tensor]:
    """A two-layer linear model's state (4 -> 2 -> 3): ``body``, then the head ``fc``."""
    g = torch.Generator().manual_seed(0)
    return {"body.weight": torch.randn(2, 4, generator=g) + shift, "body.bias": torch.randn(2, generator=g) + shift,
            "fc.weight": torch.randn(3, 2, generator=g) + shift, "fc.bias": torch.randn(3, generator=g) + shift}


def two_layer_apply(p, x, mode="logits"):
    return (x @ p["body.weight"].T + p["body.bias"]) @ p["fc.weight"].T + p["fc.bias"]


@contextmanager
def server_of(tiny, tmp_path: Path, name: str, **sections):
    """A run's server, for stepping its rounds by hand (tests/algorithms/test_fedbn.py's form)."""
    cfg = tiny(output={"dir": str(tmp_path / name), "progress": False}, engine={"executor": "sequential", "threads": 1},
               **sections)
    prep = prepare(cfg)
    model, alg = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(Path(prep.config.output.dir), overwrite=False)
    server = Server(prep.config, fed, model, alg, writer)
    try:
        yield server, model_state(model)
    finally:
        server.release()
        writer.close()
        writer.release()


def one_round(server: Server, t: int):
    rnd = server.open(t)
    return rnd, SequentialExecutor().run_round(rnd.tools, rnd.payload, rnd.jobs, t)
