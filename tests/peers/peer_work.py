"""The work a peer library and fedrift both do, and the record of how far apart they ended.

One fixture for every (algorithm, peer) pair: 4 clients of sklearn's digits (a Dirichlet label
skew), fedrift's MLP with one hidden layer at its seeded initial weights, every client in every
round, and full-batch local steps, so that "the same batches in the same order" holds by
construction: each local epoch is one step on the client's whole training split, whatever
order a peer's loader shuffles it into. Plain SGD (no momentum, no weight decay) unless a
pair says otherwise. :func:`work` hands a peer the same start: a copy of the model, each
client's ``(x, y)`` tensors, their sizes, and the hyper-parameters.

Two implementations of the same algorithm sum the same terms in other orders and through other
kernels: they are held to ``PEER`` (``ROUNDING``'s tolerance, tests/agreement.py). A pair that
departs is pinned: the test asserts the expected difference (or configures the peer to the
paper) and records the reason; :func:`record` keeps each pair's row for the agreement page.
"""

from __future__ import annotations

import copy
import fcntl
import importlib.metadata
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from agreement import ROUNDING, Promise

import fedrift
from fedrift.engine.build import build_run, prepare

PEER = Promise("peer", ROUNDING.rtol, ROUNDING.metric)  # the same sums through other code
CLIENTS = 4
FULL_BATCH = 100_000  # larger than any client's split: one step an epoch, on all of it
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "agreement.json"
WRITE = "FEDRIFT_WRITE_AGREEMENT"  # set: the suite rewrites RESULTS instead of checking it


def config(out: Path, algorithm: dict[str, Any], rounds: int = 3, local_epochs: int = 2, lr: float = 0.05,
           seed: int = 0, **train: Any) -> dict[str, Any]:
    """fedrift's side of the work as a config: every client every round, full-batch SGD."""
    return {
        "seed": seed,
        "data": {"name": "digits"},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": CLIENTS, "min_size": 20},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": algorithm,
        "train": {"rounds": rounds, "clients_per_round": CLIENTS, "local_epochs": local_epochs,
                  "batch_size": FULL_BATCH, "lr": lr, "momentum": 0.0, "weight_decay": 0.0} | train,
        "engine": {"executor": "sequential"},
        "output": {"dir": str(out), "progress": False},
    }


@dataclass
class Work:
    """What a peer is handed: ``model`` (a fresh copy at fedrift's initial weights each time
    :meth:`fresh_model` is called), each client's training ``(x, y)``, and the settings."""

    model: torch.nn.Module
    clients: list[tuple[torch.Tensor, torch.Tensor]]
    lr: float
    local_epochs: int
    rounds: int
    num_classes: int

    def fresh_model(self) -> torch.nn.Module:
        return copy.deepcopy(self.model)

    @property
    def sizes(self) -> list[int]:
        return [len(y) for _, y in self.clients]

    @property
    def initial(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def work(cfg: dict[str, Any]) -> Work:
    """The peer's copy of ``cfg``'s start: the same model at the same weights, the same clients."""
    prep = prepare(cfg)
    model, _ = build_run(prep)
    ds, part = prep.dataset, prep.partition
    clients = [(ds.x_train[torch.as_tensor(part.train[k])], ds.y_train[torch.as_tensor(part.train[k])])
               for k in range(part.num_clients)]
    tc = cfg["train"]
    return Work(model.eval().requires_grad_(True), clients, tc["lr"], tc["local_epochs"], tc["rounds"],
                ds.num_classes)


def fedrift_run(cfg: dict[str, Any]) -> fedrift.RunResult:
    return fedrift.run(cfg)


def params_of(model_or_state: Any) -> dict[str, torch.Tensor]:
    """A model's (or state dict's) tensors, detached, on the CPU, by name."""
    state = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) else model_or_state
    return {k: torch.as_tensor(v).detach().cpu().clone() for k, v in state.items()}


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of two states over their largest magnitude (the scale
    tests/agreement.py's rule measures against), as a number for the agreement page."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    num = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    den = max(max(float(a[k].double().abs().max()), float(b[k].double().abs().max())) for k in a)
    return num / max(den, 1e-12)


def version(distribution: str) -> str:
    return importlib.metadata.version(distribution)


def record(algorithm: str, peer: str, rounds: list[int], difference: float, verdict: str,
           reason: str = "", compared: str = "global model") -> None:
    """One (algorithm, peer) row of the agreement page: ``verdict`` ``agrees`` (held to
    ``PEER``) or ``departs`` (``reason``: which side departs from the paper, and where).

    The page is generated from RESULTS, which the suite writes (``FEDRIFT_WRITE_AGREEMENT=1
    pytest tests/peers -p no:xdist``) and otherwise checks: the committed row must say what
    this run found (the same verdict, reason, rounds and peer version; the difference within
    two decades of the recorded one, since another CPU's kernels round otherwise)."""
    assert verdict in ("agrees", "departs") and (verdict == "agrees") != bool(reason), (verdict, reason)
    dist = PEER_DISTRIBUTIONS[peer]
    row = {"algorithm": algorithm, "peer": peer, "version": f"{dist} {version(dist)}", "rounds": rounds,
           "compared": compared, "difference": float(f"{difference:.2g}"), "verdict": verdict, "reason": reason}
    rows = committed()
    old = next((r for r in rows if (r["algorithm"], r["peer"]) == (algorithm, peer)), None)
    if writing():
        with open(RESULTS.with_suffix(".lock"), "w") as lock:  # test files written at once: one at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows = [r for r in committed() if (r["algorithm"], r["peer"]) != (algorithm, peer)] + [row]
            rows.sort(key=lambda r: (r["algorithm"], r["peer"]))
            RESULTS.write_text(json.dumps({"written_by": "tests/peers (FEDRIFT_WRITE_AGREEMENT=1)", "rule": RULE,
                                           "pairs": rows}, indent=1) + "\n")
        return
    assert old is not None, f"{RESULTS.name} has no row for ({algorithm}, {peer}): rewrite it ({WRITE}=1)"
    same = ("version", "rounds", "compared", "verdict", "reason")
    assert {k: old[k] for k in same} == {k: row[k] for k in same}, (old, row)
    both = [max(abs(x), 1e-300) for x in (old["difference"], row["difference"])]
    assert abs(math.log10(both[0]) - math.log10(both[1])) <= 2 or max(both) < 1e-12, (old, row)


RULE = (f"agrees: every parameter within {PEER.rtol:g} of its layer's largest magnitude after each "
        "compared round (tests/agreement.py's rounding rule: the same sums in other orders)")
PEER_DISTRIBUTIONS = {"flower": "flwr", "fedlab": "fedlab", "pfl": "pfl", "flwr-datasets": "flwr-datasets"}


def committed() -> list[dict[str, Any]]:
    return json.loads(RESULTS.read_text())["pairs"] if RESULTS.exists() else []


def writing() -> bool:
    return bool(os.environ.get(WRITE))
