"""What a stack's runs at other values cost against runs at one value (engine.step_values).

A stack whose runs differ in ``train.lr`` (a tune's trials) builds its local step inside each
vectorised call from the clients' values; a stack at one learning rate (a compare's seeds)
uses the step as it is. Both train the same work, so the ratio of their seconds a round is
what the build costs on this device. Passes alternate (one value, other values, one value,
...) so that a noisy machine's drift falls on both. Also, once, ``fedrift tune``'s trials
stacked against the same trials one by one (``engine.executor`` batched).

    .venv/bin/python benchmarks/stack_values.py --runs 4 --rounds 6 --passes 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from fedrift.experiments.stacked import run_stacked


def config(out: Path, seed: int, lr: float, rounds: int, model: str) -> dict[str, Any]:
    models = {"mlp": {"name": "mlp", "hidden": [200, 200]}, "cnn": {"name": "cnn"}}
    return {
        "seed": seed, "data": {"name": "digits"},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 20, "val_share": 0.1},
        "model": models[model], "algorithm": {"name": "fedprox", "mu": 0.01},
        "train": {"rounds": rounds, "clients_per_round": 5, "local_epochs": 2, "batch_size": 32, "lr": lr},
        "eval": {"every": 1},  # a metrics line a round: its `seconds` (evaluation excluded) are timed
        "engine": {"executor": "stacked", "device": "cpu"},
        "output": {"dir": str(out / f"s{seed}"), "progress": False, "save_model": False, "overwrite": True},
    }


def stack_seconds(runs: int, rounds: int, model: str, spread: bool) -> float:
    """Seconds of the stack's rounds after the first (each run's ``seconds``, the longest a round)."""
    tmp = Path(tempfile.mkdtemp(prefix="fedrift-stack-values-"))
    try:
        lrs = [0.05 * 2 ** (k / max(runs - 1, 1) - 0.5) if spread else 0.05 for k in range(runs)]
        results = run_stacked([config(tmp, k, lr, rounds, model) for k, lr in enumerate(lrs)])
        bad = [r for r in results if isinstance(r, BaseException)]
        if bad:
            raise bad[0]
        per_run = []
        for k in range(runs):
            rows = [json.loads(line) for line in (tmp / f"s{k}" / "metrics.jsonl").read_text().splitlines()]
            per_run.append({r["round"]: r["seconds"] for r in rows})
        return sum(max(s[t] for s in per_run if t in s) for t in range(2, rounds + 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tune_seconds(trials: int, executor: str) -> float:
    """Wall seconds of a tune of FedProx's grid (``trials`` learning rates x 1 mu) on digits."""
    import fedrift

    tmp = Path(tempfile.mkdtemp(prefix="fedrift-stack-tune-"))
    try:
        base = config(tmp, 0, 0.05, 6, "mlp")
        base.pop("output")
        base["engine"] = {"executor": executor, "device": "cpu"}
        lrs = ",".join(f"{0.01 * 1.5 ** k:.4g}" for k in range(trials))
        start = time.perf_counter()
        fedrift.tune(base, algorithms=["fedprox"], space={"train.lr": lrs, "mu": "0.01"}, trials=trials,
                     out=tmp / "t", pruner="none", report=False, verbose=False)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--trials", type=int, default=8, help="trials of the tune measured stacked and one by one (0: none)")
    args = ap.parse_args()
    for model in args.models.split(","):
        one, other = [], []
        for _ in range(args.passes):
            one.append(stack_seconds(args.runs, args.rounds, model, spread=False))
            other.append(stack_seconds(args.runs, args.rounds, model, spread=True))
        print(json.dumps({"model": model, "runs": args.runs, "rounds_timed": args.rounds - 1,
                          "one_lr_seconds": one, "other_lrs_seconds": other,
                          "ratio_median": median(other) / median(one)}), flush=True)
    if args.trials:
        alone, stacked = tune_seconds(args.trials, "batched"), tune_seconds(args.trials, "stacked")
        print(json.dumps({"tune_trials": args.trials, "one_by_one_seconds": alone, "stacked_seconds": stacked,
                          "stacked_over_one_by_one": stacked / alone}), flush=True)


if __name__ == "__main__":
    main()
