"""A/B of two source trees on the CPU paths (issue 49 item 5: "the CPU path does not slow down").

Runs workload S1 under ``batched`` (100 small clients a round: the vectorised group's per-step
Python is what a change to it would show), a small MLP on digits under ``sequential`` (6 clients
of ~240 samples, batches of 16: the per-call Python of ``apply`` and the step), workload A
under ``sequential`` (the FedAvg CNN, one client at a time: the local step's loop) and under
``batched`` (its 4 clients of very unequal sizes in one vectorised group), and R1's ResNet-8 under
``batched`` on CIFAR-shaped random images, from tree A and tree B
alternately, each run in a fresh child process with one torch thread, ``--passes`` times, and prints the **CPU seconds of
a round's training** (``time.process_time`` around the executor's ``run_round``, rounds 2..;
start-up, evaluation and aggregation outside): the minimum over all rounds and passes (what a
load on the machine can only raise) and the median, and B / A of the minima. Interleaved
passes: a machine shared with other jobs slows both trees alike.

    .venv/bin/python benchmarks/cpu_ab.py --a /tmp/clean/src --b src --passes 5
    # one tree, B with config keys of its own (engine.compile: A/B of a switch)
    .venv/bin/python benchmarks/cpu_ab.py --a src --b src --b-set engine.compile=true --only R1-batched

Where the step is compiled (``engine.compile``), a compile falls in the round that first meets
its shape (a group width: clients leave a group as their steps end), part of its CPU in the
compiler's own processes: a round in which anything compiled is left out of the figures
(``rounds left out``, printed each pass), so that they are the compiled step's.
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
from fedrift.engine.executors.batched import BatchedExecutor
from fedrift.engine.executors.sequential import SequentialExecutor
def graphs():  # what torch.compile has compiled so far (0 where nothing has imported torch._dynamo)
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo.counters["stats"]["unique_graphs"] if dynamo else 0
cpu, compiles = [], []
def timed(fn):
    def run_round(self, *a, **k):
        t0 = time.process_time()
        out = fn(self, *a, **k)
        cpu.append(time.process_time() - t0)
        compiles.append(graphs())
        return out
    return run_round
def fresh(i):  # no compile in round i (1-based)
    return compiles[i - 1] == (compiles[i - 2] if i > 1 else 0)
for cls in (BatchedExecutor, SequentialExecutor):  # the executors' own training, nothing else
    cls.run_round = timed(cls.run_round)
fedrift.run(json.loads(sys.argv[1]))
kept = [c for i, c in enumerate(cpu, 1) if i > 1 and fresh(i)]
print(json.dumps({"cpu": kept, "left_out": len(cpu) - 1 - len(kept)}))
"""

WORKLOADS = {
    "S1-batched": {
        "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "num_devices": 1000},
        "partition": {"name": "natural"}, "model": {"name": "logreg"}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 100, "local_steps": 20, "batch_size": 10}, "engine": {"executor": "batched"},
    },
    "digits-MLP-sequential": {  # the small model a test or a quick study runs: the step's Python shows
        "data": {"name": "digits"}, "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 6, "min_size": 5},
        "model": {"name": "mlp", "hidden": [32]}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 6, "local_epochs": 1, "batch_size": 16}, "engine": {"executor": "sequential"},
    },
    "A-sequential": {
        "data": {"name": "mnist5k"}, "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20},
        "model": {"name": "cnn"}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 4, "local_epochs": 1, "batch_size": 32}, "engine": {"executor": "sequential"},
    },
    "A-batched": {  # clients of very unequal sizes (Dirichlet 0.1) in one vectorised group: its padding shows
        "data": {"name": "mnist5k"}, "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20},
        "model": {"name": "cnn"}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 4, "local_epochs": 1, "batch_size": 32}, "engine": {"executor": "batched"},
    },
    "R1-batched": {  # R1's model (ResNet-8, GroupNorm 16) and batch on CIFAR-shaped images (made here)
        "data": {"name": "npz", "augment": True}, "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20},
        "model": {"name": "resnet8", "group_channels": 16}, "algorithm": {"name": "fedavg"},
        "train": {"clients_per_round": 4, "local_epochs": 1, "batch_size": 64}, "engine": {"executor": "batched"},
    },
}


def cifar_shaped(folder: Path, n_train: int = 2000, n_test: int = 200) -> Path:
    """Random CIFAR-sized uint8 images in an .npz (seeded): R1's shapes, nothing to fetch."""
    import numpy as np

    path = folder / "cifar-shaped.npz"
    g = np.random.default_rng(0)
    np.savez(path, x_train=g.integers(0, 256, (n_train, 32, 32, 3), dtype=np.uint8), y_train=g.integers(0, 10, n_train),
             x_test=g.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8), y_test=g.integers(0, 10, n_test))
    return path


LEFT_OUT: dict[tuple[str, str], int] = {}  # rounds 2.. left out (something compiled), per (workload, tree)


def round_cpu(src: str, cfg: dict, rounds: int, out: Path, sets: list[str] = ()) -> list[float]:
    """CPU seconds of each round's training (the executor's ``run_round``), rounds 2.., in a
    fresh child process running tree ``src``, with the ``section.key=value`` of ``sets``."""
    doc = json.loads(json.dumps(cfg))
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        doc.setdefault(section, {})[name] = json.loads(value)
    doc["train"]["rounds"] = rounds
    doc["engine"] = {**doc.get("engine", {}), "threads": 1}
    doc["eval"] = {"every": 1000}
    doc["output"] = {"dir": str(out), "overwrite": True, "progress": False, "save_model": False}
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(doc)], env=env, capture_output=True, text=True, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    LEFT_OUT[(out.name, src)] = LEFT_OUT.get((out.name, src), 0) + got["left_out"]
    return got["cpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="tree A's src folder (the baseline)")
    ap.add_argument("--b", required=True, help="tree B's src folder")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--only", default="", help="these workloads (comma-separated names; default: all)")
    ap.add_argument("--b-set", action="append", default=[], help="section.key=value (JSON) for tree B's runs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpu-ab-"))
    WORKLOADS["R1-batched"]["data"]["root"] = str(cifar_shaped(work))
    chosen = {n: c for n, c in WORKLOADS.items() if not args.only or n in args.only.split(",")}
    per: dict[tuple[str, str], list[float]] = {}
    for p in range(args.passes):
        for name, cfg in chosen.items():
            for tag, src in (("A", args.a), ("B", args.b)) if p % 2 == 0 else (("B", args.b), ("A", args.a)):
                sets = args.b_set if tag == "B" else []
                per.setdefault((name, tag), []).extend(round_cpu(src, cfg, args.rounds, work / f"{name}-{tag}", sets))
        print(f"pass {p + 1}: " + ", ".join(f"{n} {t} min {min(v):.4f}" for (n, t), v in per.items())
              + f"; rounds left out {sum(LEFT_OUT.values())}", flush=True)
    print("| workload | A: CPU s a round (min; median) | B (min; median) | B / A (min) |")
    print("|---|---|---|---|")
    for name in chosen:
        a, b = per[(name, "A")], per[(name, "B")]
        print(f"| {name} | {min(a):.4f}; {statistics.median(a):.4f} | {min(b):.4f}; {statistics.median(b):.4f} | "
              f"{min(b) / min(a):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
