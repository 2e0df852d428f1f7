"""Peak memory of the client-state store under BENCH.md S4's state traffic, without training.

S4: SCAFFOLD, 10,000 clients, an MLP of >= 100k parameters, 100 clients a round. SCAFFOLD
keeps one control variate the size of the model per client; here it is an MLP 512-256-64-10
(148,426 float32, 594 KB a client) plus a 0-dim int64 counter. Each round draws 100 clients,
gets their states (the engine builds its jobs), changes them, and puts them back (after the
aggregation), as ``engine/loop.py`` does. ``--prefill`` first puts every client's state,
the steady state of a long run in which every client has been seen.

Each (mode, clients) runs in a fresh process, so each peak RSS is its own.
Memory mode holds every client's state in RAM (~6 GB at 10,000): run it with fewer clients
and read the extrapolation, which is linear in the clients held.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/state_memory.py --prefill \\
        --runs disk:10000 memory:1000 memory:2000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from fresh import in_fresh_process, peak_mb

MLP = [512, 256, 64, 10]


def child(mode: str, clients: int, per_round: int, rounds: int, prefill: bool, folder: str) -> dict:
    import numpy as np
    import torch

    from fedrift.engine.state import ClientStateStore

    torch.set_num_threads(1)
    params = {}
    for i, (a, b) in enumerate(zip(MLP, MLP[1:])):
        params[f"fc{i}.weight"] = torch.randn(b, a)
        params[f"fc{i}.bias"] = torch.randn(b)

    def init_client(p):
        return {"c": {k: torch.zeros_like(v) for k, v in p.items()}, "visits": torch.tensor(0)}

    state_bytes = sum(v.numel() * 4 for v in params.values()) + 8
    path = Path(folder) / f"client_state-{mode}-{clients}.bin"
    rss0 = peak_mb()
    store = ClientStateStore(init_client, params, mode=mode, path=path, num_clients=clients)
    fill_s = 0.0
    if prefill:
        start = time.perf_counter()
        s = init_client(params)
        for k in range(clients):
            s["visits"] = torch.tensor(k)
            store.put(k, s)
        fill_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        sampled = rng.choice(clients, per_round, replace=False)
        states = [store.get(int(k)) for k in sampled]  # all held at once, as the round's jobs
        new = [{"c": {n: c + 0.01 for n, c in s["c"].items()}, "visits": s["visits"] + 1} for s in states]
        for k, s in zip(sampled, new):
            store.put(int(k), s)
        seconds.append(time.perf_counter() - start)
    disk_mb = path.stat().st_blocks * 512 / 2**20 if path.exists() else 0.0
    store.close()
    return {
        "mode": mode, "clients": clients, "state_kb": state_bytes / 1024, "stored": clients if prefill else None,
        "rss_before_store_mb": rss0, "peak_rss_mb": peak_mb(), "prefill_s": fill_s,
        "s_per_round": sum(seconds) / len(seconds), "s_per_round_max": max(seconds), "file_mb_on_disk": disk_mb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=["disk:10000", "memory:1000", "memory:2000"],
                    help="mode:clients pairs, each run in its own process")
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prefill", action="store_true", help="put every client's state before the rounds")
    ap.add_argument("--dir", default=None, help="folder for the disk file (default: a temporary folder)")
    ap.add_argument("--full", type=int, default=10_000, help="clients to extrapolate memory mode to")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "CLIENTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        out = child(args.child[0], int(args.child[1]), args.per_round, args.rounds, args.prefill, args.dir)
        print(json.dumps(out))
        return

    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for run in args.runs:
            mode, clients = run.split(":")
            rows.append(in_fresh_process(__file__, ["--child", mode, clients, "--per-round", str(args.per_round),
                                                    "--rounds", str(args.rounds), "--dir", folder]
                                         + (["--prefill"] if args.prefill else [])))

    print(f"\n{args.per_round} clients a round, {args.rounds} rounds, prefill={args.prefill}\n")
    print("| mode | clients | state per client | peak RSS | RSS before the store | s/round (max) | file on disk |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['clients']:,} | {r['state_kb']:.0f} KB | {r['peak_rss_mb']:.0f} MB | "
              f"{r['rss_before_store_mb']:.0f} MB | {r['s_per_round']:.3f} ({r['s_per_round_max']:.3f}) | "
              f"{r['file_mb_on_disk']:.0f} MB |")
    mem = [r for r in rows if r["mode"] == "memory"]
    if len(mem) >= 2 and args.prefill:
        a, b = sorted(mem, key=lambda r: r["clients"])[:: len(mem) - 1]
        per = (b["peak_rss_mb"] - a["peak_rss_mb"]) / (b["clients"] - a["clients"])
        full = a["peak_rss_mb"] + per * (args.full - a["clients"])
        print(f"\nmemory mode, extrapolated to {args.full:,} clients: {full:,.0f} MB ({per * 1024:.0f} KB a client)")


if __name__ == "__main__":
    main()
