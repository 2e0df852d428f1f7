"""Issue 71 item 1: what the per-client recording costs an evaluation (``local_accuracy``'s
spread over the clients in ``metrics.jsonl``, their counts in ``clients.csv``).

Two federations, each evaluated by a server built as a run builds it (``fedrift.api.prepare``,
``build_run``, ``Server``), its global model the one given:

- workload A (``examples/workload_a.yaml``: mnist5k, Dirichlet 0.1, 20 clients, the FedAvg CNN),
  trained for ``--rounds`` rounds by ``fedrift.run`` (its ``run_seconds`` and ``clients.csv``
  are reported too);
- BENCH.md S5's cross-device federation (``benchmarks/scale.py``: mnist5k shared out by the
  ``devices`` partition, each client 10 local test samples, an MLP 784-64-10, untrained) at
  N = 10^3 and 10^6 clients: ``eval.clients_sample`` (1,000) bounds the clients evaluated.

Per federation, in a fresh process with one thread, ``--reps`` times each, alternately:

- *without*: the evaluation as it was before the recording: the test set's predictions, test
  accuracy and loss, and ``local_accuracy`` as the mean of the panel clients' shares by the
  two tensor ops it used then (copied here);
- *with*: ``fedrift.metrics.evaluate.evaluate`` with the panel's local parts (the mean, its
  spread, the per-client counts) and the round's ``clients.csv`` rows appended by ``RunWriter``;
- *recording alone*: from the same predictions, the per-client counts, the spread and the rows
  against the old mean (the part of the evaluation that changed).

    .venv/bin/python benchmarks/client_spread.py --rounds 3 --reps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

import fedrift
from fresh import in_fresh_process
from fedrift.api import prepare
from fedrift.engine.build import build_run
from fedrift.engine.federation import Federation
from fedrift.engine.outputs import CLIENTS, RunWriter
from fedrift.engine.server import Server
from fedrift.metrics.client_spread import client_counts, client_spread
from fedrift.metrics.evaluate import evaluate, outcomes

ROOT = Path(__file__).resolve().parent.parent


def workload_a(rounds: int, out: Path) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "workload_a.yaml").read_text())
    doc["train"]["rounds"] = rounds
    doc["eval"] = {"every": 1}
    doc["output"] = {"dir": str(out), "overwrite": True, "progress": False}
    return doc


def devices(clients: int, out: Path) -> dict[str, Any]:
    return {
        "data": {"name": "mnist5k"},
        "partition": {"name": "devices", "num_clients": clients, "samples": 8, "classes_per_client": 2},
        "model": {"name": "mlp", "hidden": [64]},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 1, "clients_per_round": 100, "local_epochs": 1, "batch_size": 8, "lr": 0.05},
        "engine": {"executor": "sequential"},
        "output": {"dir": str(out), "overwrite": True, "progress": False},
    }


def old_mean(parts, right: torch.Tensor) -> float:
    """``local_accuracy`` as LocalParts.mean_rate made it before the recording (its two ops)."""
    keep = parts.sizes > 0
    hits = torch.zeros(len(parts.sizes), dtype=torch.float64, device=right.device)
    hits.index_add_(0, parts.owner, right[parts.positions].double())
    return (hits[keep] / parts.sizes[keep]).mean().item()


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def measure(doc: dict[str, Any], folder: Path, reps: int, params: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    prep = prepare(doc)
    model, algorithm = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(folder, overwrite=False)
    srv = Server(prep.config, fed, model, algorithm, writer)
    try:
        if params is not None:
            srv.state = {**srv.state, "params": params}
        apply, chunk, parts = srv.tools.apply, srv.tools.eval_batch, srv.local_test
        w = srv.state["params"]
        x, y = fed.x_test, fed.y_test
        t = [0]

        def without() -> dict[str, float]:
            right, loss = outcomes(apply, w, x, y, chunk)
            return {"test_accuracy": right[""].double().mean().item(), "test_loss": loss.mean().item(),
                    "local_accuracy": old_mean(parts, right[""])}

        def with_() -> dict[str, float]:
            t[0] += 1
            scores: dict = {}
            row = evaluate(apply, w, x, y, chunk, None, "test", parts, scores=scores)
            for name, sc in scores.items():
                writer.log_clients(t[0], "global", srv.panel, sc)
            return row

        right, _ = outcomes(apply, w, x, y, chunk)

        def record_alone() -> None:
            t[0] += 1
            scores = parts.scores(right[""])
            client_spread(scores, "local_accuracy")
            client_counts(scores)
            writer.log_clients(t[0], "global", srv.panel, scores)

        a, b = without(), with_()
        assert a["local_accuracy"] == b["local_accuracy"], (a, b)  # the same number, to the bit
        ms_without, ms_with = [], []
        for _ in range(reps):  # alternately, so that a busy stretch of the machine hits both
            ms_without.append(median_ms(without, 1))
            ms_with.append(median_ms(with_, 1))
        rows_before = (folder / CLIENTS).stat().st_size
        rec = median_ms(record_alone, reps)
        rows_bytes = ((folder / CLIENTS).stat().st_size - rows_before) / reps
        mean_ms = median_ms(lambda: old_mean(parts, right[""]), reps)
        return {
            "clients": fed.num_clients, "panel": len(srv.panel), "with_test": int((parts.sizes > 0).sum()),
            "test_samples": len(y), "local_samples": int(parts.sizes.sum()),
            "eval_without_ms": statistics.median(ms_without), "eval_with_ms": statistics.median(ms_with),
            "record_ms": rec, "old_mean_ms": mean_ms, "rows_bytes_per_round": rows_bytes,
            "spread": {k: v for k, v in b.items() if k.startswith("local")},
        }
    finally:
        srv.release()
        writer.close()
        writer.release()


def child(which: str, rounds: int, reps: int, tmp: Path) -> dict[str, Any]:
    if which == "A":
        start = time.perf_counter()
        run = fedrift.run(workload_a(rounds, tmp / "a"))
        end = time.perf_counter()
        a = measure(workload_a(rounds, tmp / "unused"), tmp / "a-eval", reps, run.server_state["params"])
        return {"name": "A", **a, "run_seconds": run.summary["run_seconds"], "wall_seconds": run.summary["wall_seconds"],
                "end_to_end_s": end - start, "rounds": rounds, "clients_csv_bytes": (run.output_dir / CLIENTS).stat().st_size,
                "final_local_accuracy": run.summary["final_local_accuracy"]}
    n = int(which)
    return {"name": f"S5 N={n:,}", **measure(devices(n, tmp / "d"), tmp / "d-eval", reps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="workload A's rounds (reduced from 50)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--clients", nargs="+", type=int, default=[1_000, 1_000_000])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(child(args.child, args.rounds, args.reps, Path(tmp))))
        return
    # each federation in a fresh process (one thread): none inherits another's heap or caches
    out = [in_fresh_process(__file__, ["--child", which, "--rounds", str(args.rounds), "--reps", str(args.reps)])
           for which in ["A", *map(str, args.clients)]]
    print("\n| federation | clients N | panel (with test) | local samples | eval without ms | eval with ms | with / without "
          "| recording ms | old mean ms | clients.csv bytes a round |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in out:
        print(f"| {r['name']} | {r['clients']:,} | {r['panel']:,} ({r['with_test']:,}) | {r['local_samples']:,} | "
              f"{r['eval_without_ms']:.2f} | {r['eval_with_ms']:.2f} | {r['eval_with_ms'] / r['eval_without_ms']:.3f} | "
              f"{r['record_ms']:.3f} | {r['old_mean_ms']:.3f} | {r['rows_bytes_per_round']:,.0f} |")


if __name__ == "__main__":
    main()
