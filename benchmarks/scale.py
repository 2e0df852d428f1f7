"""BENCH.md S5, cross-device scale: start-up, steady seconds per round and peak memory of
``fedrift.run`` against the number of clients N, 100 of them a round, FedAvg and SCAFFOLD
(its control variates in the disk store: one per client that ever trained).

The federation: ``mnist5k`` shared out by the ``devices`` partition (each client 8 training
samples of 2 classes, 10 local test samples), an MLP 784-64-10, one local epoch of batch 8,
one thread. Each (algorithm, N) runs in a fresh process, so its peak memory is its own.

- start-up: from calling ``fedrift.run`` to the start of round 1 (data, partition, its files,
  the federation, the model; measured as the first metrics row's time less that round's
  seconds, so round 1's evaluation, a few milliseconds, is in it);
- s/round: the median of the rounds' ``seconds`` (training and aggregation, no evaluation)
  after the first two;
- peak RSS: the process's peak resident memory (VmHWM) at the end.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scale.py --clients 1000 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from fresh import in_fresh_process, peak_mb


def config(algorithm: str, clients: int, rounds: int, out: str) -> dict:
    return {
        "data": {"name": "mnist5k"},
        "partition": {"name": "devices", "num_clients": clients, "samples": 8, "classes_per_client": 2},
        "model": {"name": "mlp", "hidden": [64]},
        "algorithm": {"name": algorithm},
        "train": {"rounds": rounds, "clients_per_round": 100, "local_epochs": 1, "batch_size": 8, "lr": 0.05},
        "engine": {"executor": "sequential", "threads": 1, "client_state": "disk"},
        "output": {"dir": out, "overwrite": True, "progress": False, "save_model": False},
    }


def child(algorithm: str, clients: int, rounds: int, out: str) -> dict:
    import fedrift

    seen: list[float] = []
    start = time.perf_counter()
    r = fedrift.run(config(algorithm, clients, rounds, out), on_round=lambda row: seen.append(time.perf_counter()))
    end = time.perf_counter()
    secs = [row["seconds"] for row in r.history]
    return {
        "algorithm": algorithm, "clients": clients, "rounds": rounds,
        "startup_s": seen[0] - start - secs[0], "s_per_round": statistics.median(secs[2:]),
        "first_round_s": secs[0], "end_to_end_s": end - start,
        "peak_rss_mb": peak_mb(),
        "partition_mb": sum(os.path.getsize(os.path.join(out, f)) for f in ("partition.json", "partition.bin")) / 2**20,
        "final_accuracy": r.summary["final_accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", nargs="+", type=int, default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "scaffold"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.rounds, args.out)))
        return
    rows = []
    for algorithm in args.algorithms:
        for n in args.clients:
            with tempfile.TemporaryDirectory() as out:
                rows.append(in_fresh_process(__file__, ["--child", algorithm, str(n), "--rounds", str(args.rounds),
                                                        "--out", out]))
    print("\n| algorithm | clients N | start-up | s/round (median) | peak RSS | partition files | final accuracy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {r['clients']:,} | {r['startup_s']:.1f} s | {r['s_per_round']:.3f} | "
              f"{r['peak_rss_mb']:,.0f} MB | {r['partition_mb']:.1f} MB | {r['final_accuracy']:.3f} |")


if __name__ == "__main__":
    main()
