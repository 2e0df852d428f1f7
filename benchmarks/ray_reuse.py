"""Consecutive runs on one Ray cluster from one driver: new actors for every run
(``KEEP_SECONDS = 0``) against the last run's actors taken by the next (the default).

A Ray of this script's own stands for the cluster (``ray.init``; its address given as
``engine.ray_address``, as a cluster's would be). Each run is small (``config``), so what
differs is the actors' start. The two modes
alternate, ``--repeat`` times each, on the same machine in the same process.

    PYTHONPATH=src .venv/bin/python benchmarks/ray_reuse.py --runs 6 --repeat 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray

import fedrift
from fedrift.engine.executors import ray_actors


def config(out: Path, address: str, workers: int) -> dict:
    """FedProx's Synthetic(1,1) devices, logistic regression, 2 rounds of 3 clients: seconds of
    nothing but the actors' start and the transport."""
    return {
        "seed": 0,
        "data": {"name": "synthetic"},
        "partition": {"name": "natural"},
        "model": {"name": "logreg"},
        "train": {"rounds": 2, "clients_per_round": 3, "local_epochs": 1, "batch_size": 10, "lr": 0.01},
        "engine": {"executor": "ray", "ray_address": address, "workers": workers, "threads": 1},
        "output": {"dir": str(out), "progress": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6, help="consecutive runs per measurement")
    ap.add_argument("--repeat", type=int, default=2, help="measurements per mode, alternating")
    ap.add_argument("--workers", type=int, default=2, help="actors per run (and the Ray's CPUs)")
    args = ap.parse_args()
    with ray_actors.loopback_only():  # as fedrift starts a local Ray: listening on 127.0.0.1 only
        ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    keep = ray_actors.KEEP_SECONDS
    seconds: dict[str, list[float]] = {"new actors": [], "kept actors": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for mode in ("new actors", "kept actors"):
                ray_actors.KEEP_SECONDS = keep if mode == "kept actors" else 0
                per_run = []
                for i in range(args.runs):
                    start = time.perf_counter()
                    fedrift.run(config(Path(tmp) / f"{mode[:4]}-{r}-{i}", address, args.workers))
                    per_run.append(time.perf_counter() - start)
                # the first run of a measurement starts actors in both modes: the rest show the difference
                seconds[mode] += per_run[1:]
                print(f"repeat {r} {mode}: first run {per_run[0]:.2f} s, then median {statistics.median(per_run[1:]):.2f} s a run")
                with ray_actors._KEPT_LOCK:  # the next measurement starts without kept actors
                    kept = [a for a, _ in ray_actors._KEPT.pop(address, [])]
                ray_actors._kill(ray, kept)
    ray.shutdown()
    new, kept = (statistics.median(seconds[m]) for m in ("new actors", "kept actors"))
    print(f"| mode | median s a run (runs 2-{args.runs}, {args.repeat} measurements) | ratio |")
    print("|---|---|---|")
    print(f"| new actors every run | {new:.2f} | 1.00 |")
    print(f"| the last run's actors | {kept:.2f} | {kept / new:.2f} |")


if __name__ == "__main__":
    main()
