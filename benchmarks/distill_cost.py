"""Distillation's cost per round against FedAvg, round by round (BENCH.md S3).

Workload A's rounds differ (each samples other clients, of other sizes), so a median over
rounds mixes them. This runs FedAvg, FedGKD and FedGKD-Vote for the same rounds, ``--repeats``
times alternating, and reports the ratio of the summed seconds of rounds 2..R (round 1 pays
start-up and has no teacher yet).

    .venv/bin/python benchmarks/distill_cost.py --executor sequential
    .venv/bin/python benchmarks/distill_cost.py --executor processes
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from speed import S3, WORKLOADS  # noqa: E402


def round_seconds(algorithm: str, executor: str, rounds: int) -> list[float]:
    import fedrift

    cfg = copy.deepcopy(WORKLOADS["A"])
    cfg["algorithm"] = {"name": algorithm, **S3[algorithm]}
    cfg["engine"] = {"executor": executor}
    cfg["train"]["rounds"] = rounds
    cfg["eval"] = {"every": 1}
    cfg["output"] = {"dir": f"runs/distill_cost/{algorithm}-{executor}", "overwrite": True, "progress": False}
    return [h["seconds"] for h in fedrift.run(cfg).history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executor", default="sequential")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print("| executor | repeat | FedGKD / FedAvg | FedGKD-Vote / FedAvg |\n|---|---|---|---|")
    for rep in range(args.repeats):
        total = {a: sum(round_seconds(a, args.executor, args.rounds)[1:]) for a in S3}
        print(f"| {args.executor} | {rep + 1} | {total['fedgkd'] / total['fedavg']:.2f} | "
              f"{total['fedgkd_vote'] / total['fedavg']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
