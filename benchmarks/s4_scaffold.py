"""BENCH.md S4 end to end: SCAFFOLD through ``fedrift.run`` on ``synthetic`` with 10,000
clients, an MLP of over 100k parameters, 100 clients a round: peak memory.

Each configuration runs in a fresh process (its peak memory is its own). SCAFFOLD keeps a
model-sized control variate per client; ``engine.client_state: disk`` keeps only the round's
clients' rows in memory, ``memory`` keeps every state put (run it with fewer rounds: it grows
with the clients seen).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/s4_scaffold.py --runs disk memory --rounds 10
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from fresh import in_fresh_process, peak_mb


def config(store: str, rounds: int, out: str, executor: str = "auto", max_parallel: int | None = None) -> dict:
    return {
        "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "num_devices": 10_000},
        "partition": {"name": "natural"},
        "model": {"name": "mlp", "hidden": [512, 256, 64]},  # 60 -> 512 -> 256 -> 64 -> 10: 179,594 parameters
        "algorithm": {"name": "scaffold"},
        "train": {"rounds": rounds, "clients_per_round": 100, "local_steps": 20, "batch_size": 10, "lr": 0.05},
        "engine": {"client_state": store, "threads": 1, "executor": executor, "max_parallel_clients": max_parallel},
        "eval": {"every": rounds},
        "output": {"dir": out, "overwrite": True, "progress": False, "save_model": False},
    }


def child(store: str, rounds: int, out: str, executor: str = "auto", max_parallel: int | None = None) -> dict:
    import fedrift

    start, cpu = time.perf_counter(), time.process_time()
    r = fedrift.run(config(store, rounds, out, executor, max_parallel))
    cpu = time.process_time() - cpu
    return {
        "store": store, "rounds": rounds, "executor": r.summary["executor"], "num_params": r.summary["num_params"],
        "clients": r.summary["num_clients"], "peak_rss_mb": peak_mb(),
        "s_per_round": r.summary["seconds_per_round"], "end_to_end_s": time.perf_counter() - start,
        "cpu_s": cpu, "max_parallel": max_parallel,
        "final_accuracy": r.summary["final_accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=["disk", "memory"], choices=["disk", "memory", "auto"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--executor", default="auto", help="engine.executor (auto: the rule's choice, batched here)")
    ap.add_argument("--max-parallel", type=int, default=None, help="engine.max_parallel_clients (batched's group)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rounds, args.out, args.executor, args.max_parallel)))
        return
    rows = []
    for store in args.runs:
        with tempfile.TemporaryDirectory() as out:
            extra = ["--max-parallel", str(args.max_parallel)] if args.max_parallel else []
            rows.append(in_fresh_process(__file__, ["--child", store, "--rounds", str(args.rounds), "--out", out,
                                                    "--executor", args.executor, *extra]))
    # CPU seconds (the process's, all threads) hold when other jobs share the machine; wall
    # seconds do not
    print("\n| client state | rounds | executor | peak RSS | s/round | end to end | CPU s end to end | final accuracy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        group = f" (groups of {r['max_parallel']})" if r.get("max_parallel") else ""
        print(f"| {r['store']} | {r['rounds']} | {r['executor']}{group} | {r['peak_rss_mb']:,.0f} MB | {r['s_per_round']:.2f} | "
              f"{r['end_to_end_s']:.0f} s | {r['cpu_s']:.0f} s | {r['final_accuracy']:.3f} |")


if __name__ == "__main__":
    main()
