"""The Flower deployment's cost per round against fedrift's own engine, on the same federation.

A real loopback federation (``fedrift.deploy.loopback``: a SuperLink with TLS and SuperNode
authentication, one SuperNode per client) runs the config deployed (``fedrift flower app``,
``flwr run``); the same config runs in-process (``sequential``, one thread). Every client
trains every round (``clients_per_round`` = ``num_clients`` = K), for K in ``--clients``.

Reported per K: the engine's seconds per round; the deployment's seconds per round (the
ServerApp's round, from sampling to the logged row: messages out, ClientApp processes,
training, replies, aggregation, evaluation), its overhead over the engine per round and per
client, the time the ServerApp waited for the SuperNodes to answer who they serve, the run's
wall time from ``flwr run`` to the run's end, and the bytes per round (Flower's messages
against the engine's tensor bytes). The model and data are small on purpose: what is left is
the price of the transport and of Flower's process per message.

    PYTHONPATH=src python benchmarks/flower_deploy.py --clients 2 4 --rounds 3

``--variants`` compares ways to run the ClientApp processes (``LoopbackFederation``'s
``isolation``: ``subprocess``, ``process``, ``fork``) in one command, alternating their order
each ``--repeat``, on the same data and engine run; a variant ``before`` is ``subprocess``
(or ``--before-isolation``) with the fedrift of ``--before-src`` (a source tree, e.g. ``git
archive HEAD~1 src``) in the Flower processes, so that a change to the deployed code is
measured against its parent on the same loaded machine. Each row has the load average (1
min) at its start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"

import numpy as np  # noqa: E402

import fedrift  # noqa: E402
from fedrift.deploy.loopback import LoopbackFederation, gaussian_blobs  # noqa: E402
from fedrift.deploy.project import write_app  # noqa: E402


def config(root: Path, k: int, rounds: int, out: Path, algorithm: str) -> dict:
    return {
        "seed": 0,
        "data": {"name": "npz", "root": str(root)},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": k, "min_size": 20},
        "model": {"name": "mlp", "hidden": [64]},
        "algorithm": {"name": algorithm},
        "engine": {"threads": 1, "executor": "sequential", "checkpoint_every": 0},
        "train": {"rounds": rounds, "clients_per_round": k, "local_epochs": 1, "batch_size": 32, "lr": 0.05},
        "output": {"dir": str(out), "progress": False},
    }


def measure(base: Path, k: int, rounds: int, algorithm: str, variant: str = "subprocess",
            before_src: str | None = None, engine: Any = None, before_isolation: str = "subprocess") -> dict:
    data = base / "data"
    if not (data / "data.npz").exists():
        data.mkdir(parents=True, exist_ok=True)
        np.savez(data / "data.npz", **gaussian_blobs(2000, 500, dim=64, classes=10, spread=1.5))
    if engine is None:  # the same engine run for every variant of one K
        engine = fedrift.run(config(data, k, rounds, base / "engine", algorithm))
    load, tries = os.getloadavg()[0], len(list(base.glob("federation-*")))  # a new folder per measurement
    saved = os.environ.get("PYTHONPATH")
    if variant == "before":  # the Flower processes import the fedrift of before_src
        os.environ["PYTHONPATH"] = str(Path(before_src).resolve())
    try:
        fed = LoopbackFederation(base / f"federation-{variant}-{tries}", k,
                                 isolation=before_isolation if variant == "before" else variant)
    finally:
        os.environ.pop("PYTHONPATH", None)
        if saved is not None:
            os.environ["PYTHONPATH"] = saved
    out = base / f"deployed-{variant}"
    shutil.rmtree(out, ignore_errors=True)
    with fed:
        app = write_app(base / f"app-{variant}-{tries}", config(data, k, rounds, out, algorithm))
        start = time.perf_counter()
        entry = fed.run(app, out / "summary.json", timeout=1800)
        wall = time.perf_counter() - start
    if entry["status"] != "finished:completed":
        raise RuntimeError(f"the deployed run failed: {entry.get('status-details')}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    mine = statistics.median(r["seconds"] for r in rows)
    theirs = statistics.median(r["seconds"] for r in engine.history)
    return {
        "variant": variant, "load_1min": load, "clients_per_round": k, "rounds": rounds, "algorithm": algorithm,
        "engine_s_per_round": theirs, "flower_s_per_round": mine,
        "overhead_s_per_round": mine - theirs, "overhead_s_per_client": (mine - theirs) / k,
        "flower_connect_s": summary["connect_seconds"], "flower_run_wall_s": wall,
        "flower_bytes_per_round": (summary["bytes_down_total"] + summary["bytes_up_total"]) / rounds,
        "engine_bytes_per_round": (engine.summary["bytes_down_total"] + engine.summary["bytes_up_total"]) / rounds,
        "clientapp_seconds": entry["compute-time"]["clientapp-seconds"],
        "same_final_accuracy": summary["final_accuracy"] == engine.summary["final_accuracy"],
        "engine": engine,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--variants", nargs="+", default=["subprocess"], choices=["before", *LoopbackFederation.ISOLATIONS])
    p.add_argument("--repeat", type=int, default=1, help="rounds of all variants, each in the reverse order of the last")
    p.add_argument("--before-src", default=None, help="the fedrift source tree (its src folder) of variant before")
    p.add_argument("--before-isolation", default="subprocess", choices=LoopbackFederation.ISOLATIONS,
                   help="the isolation of variant before")
    args = p.parse_args()
    if "before" in args.variants and not args.before_src:
        p.error("--variants before needs --before-src")
    results = []
    for k in args.clients:
        with tempfile.TemporaryDirectory(prefix=f"flower-deploy-{k}-") as tmp:
            base, engine, order = Path(tmp), None, list(args.variants)
            for _ in range(args.repeat):
                for variant in order:
                    results.append(measure(base, k, args.rounds, args.algorithm, variant, args.before_src, engine,
                                           args.before_isolation))
                    engine = results[-1].pop("engine")
                    print(json.dumps(results[-1]), flush=True)
                order.reverse()
    print("\n| variant | load | clients/round | engine s/round | Flower s/round | overhead s/round | per client | connect s | bytes/round Flower / engine |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['variant']} | {r['load_1min']:.1f} | {r['clients_per_round']} | {r['engine_s_per_round']:.3f} | {r['flower_s_per_round']:.2f} | "
              f"{r['overhead_s_per_round']:.2f} | {r['overhead_s_per_client']:.2f} | {r['flower_connect_s']:.1f} | "
              f"{r['flower_bytes_per_round']:,.0f} / {r['engine_bytes_per_round']:,.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
