"""A/B of two source trees on the CPU paths (issue 49 item 5: "the CPU path does not slow down").

Runs workload S1 under ``batched`` (100 small clients a round: the vectorised group's per-step
Python is what a change to it would show) and workload A under ``sequential`` (the FedAvg CNN,
one client at a time: the local step's loop) from tree A and tree B alternately, each run in a
fresh child process with one torch thread, ``--passes`` times, and prints the median **CPU
seconds a round** of each (``time.process_time`` of the child over its rounds 2.., from a 1-round
and an N-round run differenced, so start-up and data loading drop out), and B / A. CPU time of
one thread, interleaved passes: a machine shared with other jobs slows both trees alike.

    .venv/bin/python benchmarks/cpu_ab.py --a /tmp/clean/src --b src --passes 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import fedrift
cfg = json.loads(sys.argv[1])
t0 = time.process_time()
fedrift.run(cfg)
print(json.dumps({"cpu": time.process_time() - t0}))
"""

WORKLOADS = {
    "S1-batched": {
        "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "num_devices": 1000},
        "partition": {"name": "natural"}, "model": {"name": "logreg"}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 100, "local_steps": 20, "batch_size": 10}, "engine": {"executor": "batched"},
    },
    "A-sequential": {
        "data": {"name": "mnist5k"}, "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20},
        "model": {"name": "cnn"}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 4, "local_epochs": 1, "batch_size": 32}, "engine": {"executor": "sequential"},
    },
}


def cpu_seconds(src: str, cfg: dict, rounds: int, out: Path) -> float:
    doc = json.loads(json.dumps(cfg))
    doc["train"]["rounds"] = rounds
    doc["engine"] = {**doc.get("engine", {}), "threads": 1}
    doc["eval"] = {"every": 1000}
    doc["output"] = {"dir": str(out), "overwrite": True, "progress": False, "save_model": False}
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(doc)], env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["cpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="tree A's src folder (the baseline)")
    ap.add_argument("--b", required=True, help="tree B's src folder")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpu-ab-"))
    per: dict[tuple[str, str], list[float]] = {}
    for p in range(args.passes):
        for name, cfg in WORKLOADS.items():
            for tag, src in (("A", args.a), ("B", args.b)) if p % 2 == 0 else (("B", args.b), ("A", args.a)):
                long = cpu_seconds(src, cfg, args.rounds, work / f"{name}-{tag}")
                short = cpu_seconds(src, cfg, 1, work / f"{name}-{tag}-1")
                per.setdefault((name, tag), []).append((long - short) / (args.rounds - 1))
        print(f"pass {p + 1}: " + ", ".join(f"{n} {t} {v[-1]:.3f}" for (n, t), v in per.items()), flush=True)
    print("| workload | A: CPU s a round (median) | B | B / A |")
    print("|---|---|---|---|")
    for name in WORKLOADS:
        a, b = statistics.median(per[(name, "A")]), statistics.median(per[(name, "B")])
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
