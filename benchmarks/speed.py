"""Speed benchmark (BENCH.md workloads S1-S4 and A): fedrift's executors against the usual
sequential PyTorch loop, Flower's simulation engine (when the `bench` extra is installed;
benchmarks/flower_baseline.py) and the machine's compute limit for the model.

Each measurement runs in a fresh child process (one at a time), so peak memory is its own and
no run warms another's caches. Seconds per round are the median of rounds after the first
(the first pays start-up: workers, vmap tracing); end-to-end time is reported beside them.

    .venv/bin/python benchmarks/speed.py --workloads S1 A --out runs/speed
    .venv/bin/python benchmarks/speed.py --workloads S1 --executors processes ray --clients-per-round 10 50 100

``ray`` runs a local Ray started for the run (one actor of one CPU and one thread per core);
its start-up (``ray.init``, the actors, the data put in the object store) falls in the first
round, so "start-up s" (first round minus the steady round) is its price at start-up.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fresh import peak_mb

WORKLOADS: dict[str, dict[str, Any]] = {
    # 1,000 small clients, 100 per round, 20 local steps of batch 10
    "S1": {
        "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "num_devices": 1000},
        "partition": {"name": "natural"},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 20, "clients_per_round": 100, "local_steps": 20, "batch_size": 10},
    },
    # 500 clients of mnist5k, 50 per round, the FedAvg CNN, 1 epoch of batch 8
    "S2": {
        "data": {"name": "mnist5k"},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 500, "min_size": 2},
        "model": {"name": "cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 10, "clients_per_round": 50, "local_epochs": 1, "batch_size": 8},
    },
    # workload A at alpha 0.1 (S3 runs it for fedavg, fedgkd and fedgkd_vote)
    "A": {
        "data": {"name": "mnist5k"},
        "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20},
        "model": {"name": "cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 6, "clients_per_round": 4, "local_epochs": 5, "batch_size": 32},
    },
}
# Throughput (issue 12 item 5): the papers' models on their data's shapes, a fixed number of
# local steps per client so every executor trains the same samples. "cifar" is random uint8
# 3x32x32 images written in CIFAR-10's published format (no real CIFAR here); "sst5" the real
# SST-5 (a 2,000-sentence training subset, max 64 tokens, dynamic padding), with the MiniLM-L6
# encoder trained (T) or frozen (TF: head-only training on its pooled embeddings, computed once).
_CIFAR = {"name": "cifar10", "root": "cifar"}
_SST5 = {"name": "sst5", "root": "sst5", "max_train": 2000, "max_test": 300}
_IID8 = {"name": "dirichlet", "alpha": 1000.0, "num_clients": 8}
THROUGHPUT: dict[str, dict[str, Any]] = {
    "R8": {"data": _CIFAR, "partition": _IID8, "model": {"name": "resnet8"}, "algorithm": {"name": "fedavg"},
           "train": {"rounds": 3, "clients_per_round": 4, "local_steps": 8, "batch_size": 32}},
    "R18": {"data": _CIFAR, "partition": _IID8, "model": {"name": "resnet18"}, "algorithm": {"name": "fedavg"},
            "train": {"rounds": 2, "clients_per_round": 4, "local_steps": 2, "batch_size": 32}},
    "T": {"data": _SST5, "partition": _IID8, "model": {"name": "text"}, "algorithm": {"name": "fedavg"},
          "train": {"rounds": 2, "clients_per_round": 4, "local_steps": 2, "batch_size": 32, "optimizer": "adamw",
                    "lr": 5e-5}},
    "TF": {"data": _SST5, "partition": _IID8, "model": {"name": "text", "freeze_encoder": True},
           "algorithm": {"name": "fedavg"},
           "train": {"rounds": 6, "clients_per_round": 4, "local_steps": 50, "batch_size": 32, "optimizer": "adamw",
                     "lr": 1e-3}},
}
WORKLOADS.update(THROUGHPUT)
S3 = {"fedavg": {}, "fedgkd": {"gamma": 0.2, "M": 5}, "fedgkd_vote": {"M": 5, "lam": 0.1}}


def fedrift_case(cfg: dict[str, Any], out: str) -> dict[str, Any]:
    import fedrift

    cfg = copy.deepcopy(cfg)
    cfg.setdefault("output", {}).update(dir=out, overwrite=True, progress=False, save_model=False)
    start = time.perf_counter()
    result = fedrift.run(cfg)
    wall = time.perf_counter() - start
    secs = [r["seconds"] for r in result.history]
    steady = statistics.median(secs[1:]) if len(secs) > 1 else secs[0]
    return {"s_per_round": steady, "first_round_s": secs[0], "end_to_end_s": wall, "rounds_s": secs,
            "final_accuracy": result.summary["final_accuracy"], "peak_mb": peak_mb()}


def usual_local_training(model: Any, x: Any, y: Any, tc: Any) -> None:
    """A client's local training written the common way: torch.optim.SGD over a shuffling
    DataLoader, for the train section's epochs or steps (the usual loop and Flower's clients)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    opt = torch.optim.SGD(model.parameters(), lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    loader = DataLoader(TensorDataset(x, y), batch_size=tc.batch_size, shuffle=True)
    steps, done = tc.local_steps, 0
    for _ in range(tc.local_epochs if steps is None else 10**9):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            done += 1
            if steps is not None and done >= steps:
                return


def usual_case(cfg: dict[str, Any]) -> dict[str, Any]:
    """FedAvg written the usual way: deepcopy of the global model per client, a DataLoader per
    client, torch.optim.SGD, state_dict averaging. Same data, partition, sampling and
    hyper-parameters as fedrift's config (batch order differs: DataLoader's own shuffle).
    A round's seconds are training and aggregation; the evaluation after it is not counted,
    as in fedrift's ``seconds`` and Flower's round marks (it evaluates after the last round)."""
    import torch

    from fedrift.api import prepare
    from fedrift.engine.sampling import cohort_size, uniform
    from fedrift.models import build_model

    prep = prepare(cfg)
    c, ds, part = prep.config, prep.dataset, prep.partition
    tc = c.train
    model = build_model(c.model.name, prep.options["model"], ds.input_shape, ds.num_classes, c.seed)
    m = cohort_size(part.num_clients, tc.clients_per_round, tc.participation)
    secs = []
    start = time.perf_counter()
    for t in range(1, tc.rounds + 1):
        t0 = time.perf_counter()
        states, sizes = [], []
        for k in uniform(part.num_clients, m, c.seed, t, None):
            local = copy.deepcopy(model)
            ix = torch.as_tensor(part.train[k])
            usual_local_training(local, ds.inputs(ds.x_train[ix]), ds.y_train[ix], tc)
            states.append(local.state_dict())
            sizes.append(len(ix))
        total = sum(sizes)
        avg = {key: sum(s[key] * (n / total) for s, n in zip(states, sizes)) for key in states[0]}
        model.load_state_dict(avg)
        secs.append(time.perf_counter() - t0)  # as fedrift's and Flower's rounds: evaluation not counted
        with torch.no_grad():
            acc = (model(ds.inputs(ds.x_test)).argmax(1) == ds.y_test).float().mean().item()
    return {"s_per_round": statistics.median(secs[1:]) if len(secs) > 1 else secs[0], "first_round_s": secs[0],
            "end_to_end_s": time.perf_counter() - start, "final_accuracy": acc, "peak_mb": peak_mb()}


def compute_limit(cfg: dict[str, Any], seconds: float = 4.0) -> dict[str, Any]:
    """Samples per second one single-threaded process trains the model at the batch size,
    times the cores: what the machine can do for this model at best."""
    import torch

    from fedrift.api import prepare
    from fedrift.models import build_model

    torch.set_num_threads(1)
    prep = prepare(cfg)
    ds, tc = prep.dataset, prep.config.train
    model = build_model(prep.config.model.name, prep.options["model"], ds.input_shape, ds.num_classes, 0)
    trained = [p for p in model.parameters() if p.requires_grad]  # a frozen encoder's are not
    opt = torch.optim.AdamW(trained, lr=1e-4) if tc.optimizer == "adamw" else torch.optim.SGD(trained, lr=0.01)
    inputs = ds.prepare or (lambda x: x)  # uint8 images normalised, token batches cut to their longest
    g = torch.Generator().manual_seed(0)
    n, start, seen = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        ix = torch.randint(0, ds.num_train, (tc.batch_size,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs(ds.x_train[ix])), ds.y_train[ix]).backward()
        opt.step()
        seen += tc.batch_size
        n += 1
    one = seen / (time.perf_counter() - start)
    cores = len(os.sched_getaffinity(0))
    return {"samples_per_s_one_thread": one, "cores": cores, "limit_samples_per_s": one * cores, "peak_mb": peak_mb()}


def cifar_shaped(folder: Path, per_batch: int = 400) -> Path:
    """Random uint8 3x32x32 images and labels in CIFAR-10's published format (the tests'
    writer: five training batches and a test batch of ``per_batch`` images), once."""
    if not (folder / "cifar-10-batches-py" / "test_batch").exists():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.data.formats import cifar10

        cifar10(folder, per_batch=per_batch)
    return folder


def samples_per_round(cfg: dict[str, Any]) -> float:
    """Training samples one round processes (the mean over the rounds' sampled clients)."""
    from fedrift.api import prepare
    from fedrift.engine.batches import num_steps
    from fedrift.engine.sampling import cohort_size, uniform

    prep = prepare(cfg)
    c, part, tc = prep.config, prep.partition, prep.config.train
    m = cohort_size(part.num_clients, tc.clients_per_round, tc.participation)
    totals = []
    for t in range(1, tc.rounds + 1):
        total = 0
        for k in uniform(part.num_clients, m, c.seed, t, None):
            n = len(part.train[k])
            steps = num_steps(n, tc.batch_size, tc.local_epochs, tc.local_steps)
            total += n * tc.local_epochs if tc.local_steps is None else steps * min(tc.batch_size, n)
        totals.append(total)
    return statistics.mean(totals)


def _child(kind: str, cfg: dict[str, Any], out: str, threads: int | None, queue: Any) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        fn = {"fedrift": lambda: fedrift_case(cfg, out), "usual": lambda: usual_case(cfg), "limit": lambda: compute_limit(cfg),
              "flower": lambda: __import__("flower_baseline").flower_case(cfg)}
        queue.put(fn[kind]())
    except Exception as err:  # report, don't hang the parent
        queue.put({"error": f"{type(err).__name__}: {err}"})


def isolated(kind: str, cfg: dict[str, Any], out: str = "", threads: int | None = None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, cfg, out, threads, queue))
    load = os.getloadavg()[0]
    proc.start()
    result = queue.get()
    proc.join()
    # the 1-minute load average before and after: on a shared machine, a high one makes the
    # figures upper bounds
    result["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["S1", "A", "S3"])
    ap.add_argument("--executors", nargs="+", default=["sequential", "batched", "processes"])
    ap.add_argument("--rounds", type=int, default=None, help="override the workload's rounds")
    ap.add_argument("--clients-per-round", type=int, nargs="+", default=None,
                    help="run each workload at these clients per round (rows labelled WORKLOAD@N)")
    ap.add_argument("--no-usual-loop", action="store_true", help="skip the usual-loop baseline (throughput "
                    "is measured against the compute limit)")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower's simulation even when installed")
    ap.add_argument("--sst5", default="../shared/data/sst5", help="SST-5's folder (T, TF)")
    ap.add_argument("--out", default="runs/speed")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    roots = {"cifar": lambda: str(cifar_shaped(root / "cifar")), "sst5": lambda: str(Path(args.sst5).resolve())}
    os.environ.setdefault("FEDRIFT_CACHE", str((root / "cache").resolve()))  # frozen-encoder embeddings
    cores = len(os.sched_getaffinity(0))
    # Flower's simulation engine (the optional `bench` extra) is a baseline when installed.
    flower = not args.no_flower and all(importlib.util.find_spec(m) is not None for m in ("flwr", "ray"))
    if not flower and not args.no_flower:
        print("flwr[simulation] is not installed (pip install -e '.[bench]'): the Flower column is skipped", flush=True)
    rows = []
    for name in args.workloads:
        variants = {f"{name}:{a}": {**WORKLOADS["A"], "algorithm": {"name": a, **o}} for a, o in S3.items()} \
            if name == "S3" else {name: WORKLOADS[name]}
        if args.clients_per_round:
            variants = {f"{label}@{m}": {**cfg, "train": {**cfg["train"], "clients_per_round": m}}
                        for label, cfg in variants.items() for m in args.clients_per_round}
        for label, cfg in variants.items():
            cfg = copy.deepcopy(cfg)
            if cfg["data"].get("root") in roots:
                cfg["data"]["root"] = roots[cfg["data"]["root"]]()
            if args.rounds:
                cfg["train"]["rounds"] = args.rounds
            per_round = samples_per_round(cfg)
            # the baselines train plain FedAvg: measured once per workload and cohort (S3 reuses them)
            group = label.split(":")[0].split("@")[0] + (label[label.index("@"):] if "@" in label else "")
            first = not rows or rows[-1]["group"] != group
            if first:
                baselines = {"limit": isolated("limit", cfg), "usual_loop": {"skipped": True} if args.no_usual_loop
                             else isolated("usual", cfg, threads=cores)}
            row = {"workload": label, "group": group, "samples_per_round": per_round, "cores": cores, **baselines, "executors": {}}
            for ex in args.executors:
                c = copy.deepcopy(cfg)
                c["engine"] = {"executor": ex, "threads": 1 if ex in ("processes", "ray") else cores}
                row["executors"][ex] = isolated("fedrift", c, str(root / f"{label.replace(':', '-')}-{ex}"), threads=cores)
            if first and flower:
                # last: Ray's processes outlive run_simulation by seconds and would share the cores
                # with whatever ran next
                row["flower"] = baselines["flower"] = isolated("flower", cfg)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (root / "speed.json").write_text(json.dumps(rows, indent=1))
    print(render(rows))
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown table; "x usual loop" and "x flower" are the baseline's s/round over the runner's
    (above 1: the runner is faster)."""
    head = ["workload", "runner", "s/round", "samples/s", "x usual loop", "x flower", "% of compute limit",
            "first round s", "start-up s", "end-to-end s", "peak MB", "final acc", "load avg"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        limit = row["limit"].get("limit_samples_per_s", float("nan"))
        base, fl = row["usual_loop"], row.get("flower")
        runners = {**({} if "skipped" in base else {"usual loop": base}), **({"flower simulation": fl} if fl is not None else {}),
                   **{f"fedrift {k}": v for k, v in row["executors"].items()}}
        for label, r in runners.items():
            if "error" in r:
                out.append(f"| {row['workload']} | {label} | error: {r['error']} |" + "|" * (len(head) - 3))
                continue
            sps = row["samples_per_round"] / r["s_per_round"]
            x_base = f"{base['s_per_round'] / r['s_per_round']:.2f}" if "s_per_round" in base else "-"
            x_flower = f"{fl['s_per_round'] / r['s_per_round']:.2f}" if fl is not None and "error" not in fl else "-"
            peak = f"{r['peak_mb']:.0f}" + (f" + {r['ray_peak_rss_mb']:.0f} Ray" if "ray_peak_rss_mb" in r else "")
            out.append(
                f"| {row['workload']} | {label} | {r['s_per_round']:.3f} | {sps:,.0f} | {x_base} | {x_flower} | "
                f"{100 * sps / limit:.0f}% | {r['first_round_s']:.2f} | {r['first_round_s'] - r['s_per_round']:.2f} | "
                f"{r['end_to_end_s']:.1f} | {peak} | "
                f"{r['final_accuracy']:.3f} | {'-'.join(f'{v:.1f}' for v in r.get('load', []))} |"
            )
        if fl is not None and "error" not in fl:
            notes.append(f"- {row['workload']}: Flower start-up {fl['startup_s']:.1f} s (run_simulation to the first "
                         f"client's training), {fl['ray_actors']} Ray actors, Ray processes' summed peak RSS "
                         f"{fl['ray_peak_rss_mb']:.0f} MB (actors {fl['ray_actors_peak_rss_mb']:.0f} MB)")
    return "\n".join(out + ([""] + notes if notes else []))


if __name__ == "__main__":
    sys.exit(main())
