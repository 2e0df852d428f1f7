"""G1 and G2 of ../shared/BENCH.md (issue 49): ResNet-8 training samples a second on one device,
per path (sequential, batched, stacked runs at 1, 3, 12, 48, 96 runs), precision (fp32, bf16)
and way of launching the vectorised step (captured as CUDA graphs, ``engine.cuda_graphs``, or
op by op: ``cuda_graphs`` in each row, with the graphs captured and the seconds it took), and in
how many processes at once (item 4's "several processes per GPU": ``processes``, copies of a
stacked row in processes of their own meeting before their first round, their samples summed
over the longest one's seconds: :func:`measure_processes`), and a profile of the local step.

Workload R1 at paper settings but for the data's content: ResNet-8 (GroupNorm, 16 channels a
group), CIFAR-sized uint8 images (50,000 train, 10,000 test; random pixels and labels, made
here into an .npz: throughput does not depend on what the pixels show, and nothing has to
travel to the device), Dirichlet alpha 0.1 over 20 clients, 4 a round, batch 64, SGD lr 0.05,
momentum 0.9, wd 1e-5, clip 10, the papers' crop-and-flip augmentation, holdout 0.1,
val_share 0.1, FedAvg. Each row trains ``--rounds`` rounds (the first one a warm-up, not
counted) of ``--epochs`` local epochs; samples a second = the rounds' training samples (each
sampled client's samples x epochs, from the run's own sampler and partition) over the rounds'
``seconds`` (metrics.jsonl: a round's federated work, evaluation excluded), of all runs at
once for stacked rows (they train together, and their rounds overlap). ``real_step_share``
(vectorised rows): the clients' steps over clients x the longest client's steps, the share of
the group's work that was real when finished clients' steps were masked (Dirichlet 0.1:
about a third); since they leave the call, that padding costs nothing.

Rows are written as they are measured to ``--out``/throughput-<device>.json in BENCH.md's form
(``{"device", "torch", "cuda", "date", "rows": [{"path", "runs", "clients", "precision",
"samples_per_second", "fraction_of_peak", ...}]}``); a rerun skips the rows already there (a
device call cut short resumes), most informative rows first. ``fraction_of_peak``: samples a
second x the model's training FLOPs a sample (3 x the forward pass's, counted by
``torch.utils.flop_counter`` on a batch) over the device's dense rate for the precision
(H100/H200: 989 TFLOP/s bf16, 67 TFLOP/s fp32 without tensor cores; ``peak`` in each row says
which); null on a CPU.

``--profile``: G2, round 2's training (round 1 warms up) of the sequential path and of 12
stacked runs under ``torch.profiler``: wall time, steps, aten ops and kernels a step, kernel
time a step, the device's busy share of the wall time (the rest is the host's: launches,
Python, the batch's assembly), the top kernels and host ops; to profile-<device>.json and a
markdown summary.

    python benchmarks/gpu_throughput.py --device cuda --out benchmarks/results/gpu-throughput
    python benchmarks/gpu_throughput.py --device cuda --profile --out ...
    # here, to check it end to end (tiny sizes, a minute):
    .venv/bin/python benchmarks/gpu_throughput.py --device cpu --quick --out /tmp/gpu-tp --profile
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedrift
from fedrift.api import prepare
from fedrift.engine.batches import num_steps
from fedrift.engine.sampling import SAMPLERS, cohort_size
from fedrift.experiments.stacked import run_stacked

PEAK_FLOPS = {"bf16": 989e12, "fp32": 67e12}  # H100/H200 SXM dense (NVIDIA's data sheets)
# most informative first: the baseline; the stacks with their steps captured (engine.cuda_graphs,
# the default), which should fill the device, also as several processes at once (item 4: a 5th
# field, the processes); the same stack launched op by op (the first H200 call's way) for the
# ratio in one call; then the rest of BENCH.md's rows. A 4th field "compiled" (--rows only):
# captured, and the step's stacked form compiled (engine.compile; its compiles, one a group width,
# fall in the timed rounds too where a width first appears there: the row counts them all,
# `compiles`; step_kernels.py's compiled cases time the compiled step alone). "+cudnn" after the 4th
# field (graphs+cudnn, eager+cudnn, compiled+cudnn): with engine.cudnn_benchmark (cuDNN's algorithms
# timed on each shape, not picked by heuristics)
ORDER = [
    ("sequential", 1, "fp32", "eager"), ("stacked", 48, "fp32", "graphs"), ("trials", 48, "fp32", "graphs"),
    ("stacked", 12, "fp32", "graphs"),
    ("stacked", 12, "fp32", "graphs", 4), ("stacked", 48, "bf16", "graphs"), ("stacked", 48, "fp32", "eager"),
    ("batched", 1, "fp32", "graphs"), ("stacked", 48, "fp32", "graphs", 2),
    ("stacked", 96, "fp32", "graphs"), ("stacked", 3, "fp32", "graphs"), ("stacked", 1, "fp32", "graphs"),
    ("stacked", 96, "bf16", "graphs"), ("stacked", 12, "bf16", "graphs"), ("stacked", 12, "fp32", "eager"),
    ("batched", 1, "fp32", "eager"), ("sequential", 1, "bf16", "eager"), ("batched", 1, "bf16", "graphs"),
    ("stacked", 3, "bf16", "graphs"), ("stacked", 1, "bf16", "graphs"),
]


STACKS = ("stacked", "trials")  # "trials": the stack's runs at other learning rates (a tune's), engine.step_values


def trial_lr(path: str, seed: int, runs: int) -> float:
    """Run ``seed``'s learning rate: 0.05, or on the ``trials`` path spread over 0.035-0.071 (a
    tune's trials, each run's step reading its own)."""
    return 0.05 * 2 ** (seed / max(runs - 1, 1) - 0.5) if path == "trials" else 0.05


def make_data(folder: Path, n_train: int, n_test: int) -> Path:
    """CIFAR-sized uint8 images and labels in an .npz (seeded): the workload's shapes."""
    path = folder / "cifar-shaped.npz"
    if not path.is_file():
        g = np.random.default_rng(0)
        np.savez(path, x_train=g.integers(0, 256, (n_train, 32, 32, 3), dtype=np.uint8),
                 y_train=g.integers(0, 10, n_train), x_test=g.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8),
                 y_test=g.integers(0, 10, n_test))
    return path


def config(data: Path, args: argparse.Namespace, path: str, precision: str, seed: int, out: Path,
           mode: str = "eager", lr: float = 0.05) -> dict[str, Any]:
    return {
        "seed": seed,
        "data": {"name": "npz", "root": str(data), "augment": True},
        "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 20, "holdout": 0.1, "val_share": 0.1},
        "model": {"name": "resnet8", "group_channels": 16},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": args.rounds, "clients_per_round": 4, "local_epochs": args.epochs, "batch_size": 64, "lr": lr,
                  "momentum": 0.9, "weight_decay": 1e-5, "clip_grad_norm": 10, "precision": precision},
        "eval": {"every": 1},  # a metrics line a round: its `seconds` (evaluation excluded) are what is timed
        "engine": {"executor": "stacked" if path in STACKS else path, "device": args.device, **mode_keys(mode)},
        "output": {"dir": str(out / f"s{seed}"), "progress": False, "save_model": False, "overwrite": True},
    }


def client_work(cfg: dict[str, Any], rounds: range) -> list[list[tuple[int, int]]]:
    """Each round's sampled clients as (training samples x local epochs, local steps), from the
    run's own partition and sampler (the engine's draws, not an estimate)."""
    prep = prepare(cfg)
    part, tc = prep.partition, prep.config.train
    sizes = part.sizes()
    m = cohort_size(part.num_clients, tc.clients_per_round, tc.participation)
    sampler = SAMPLERS.get(prep.config.engine.sampling, "engine.sampling").factory
    out = []
    for t in rounds:
        ids = sampler(part.num_clients, m, prep.config.seed, t, None, retries=100)
        out.append([(int(sizes[k]) * tc.local_epochs, num_steps(int(sizes[k]), tc.batch_size, tc.local_epochs, None))
                    for k in ids])
    return out


def samples_per_round(cfg: dict[str, Any], rounds: range) -> list[int]:
    """Training samples of each round (:func:`client_work`)."""
    return [sum(n for n, _ in clients) for clients in client_work(cfg, rounds)]


def steps_taken(configs: list[dict[str, Any]], path: str, rounds: range) -> int:
    """Local steps the path takes over ``rounds``: one client's step at a time (sequential),
    one vectorised call a step for the round's clients (batched) or for all runs' clients
    (stacked, one group: ``auto_parallel`` on a GPU)."""
    work = [client_work(c, rounds) for c in configs]
    if path == "sequential":
        return sum(s for run in work for clients in run for _, s in clients)
    if path == "batched":
        return sum(max(s for _, s in clients) for run in work for clients in run)
    return sum(max(s for run in work for _, s in run[i]) for i in range(len(rounds)))


def real_step_share(configs: list[dict[str, Any]], path: str, rounds: range) -> float | None:
    """Of a vectorised group's client-steps were every client to take the longest's steps, the
    share that are real (the sum of the clients' steps over clients x the longest's): what
    masking the finished clients' steps had cost, and what their leaving the call saves.
    None for the sequential path."""
    if path == "sequential":
        return None
    work = [client_work(c, rounds) for c in configs]
    groups = [[s for run in work for _, s in run[i]] for i in range(len(rounds))] if path in STACKS else \
        [[s for _, s in clients] for run in work for clients in run]
    return sum(sum(g) for g in groups) / sum(len(g) * max(g) for g in groups)


def round_seconds(folder: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["round"]: r["seconds"] for r in rows}


def flops_per_sample(device: str) -> float:
    """Training FLOPs a sample of ResNet-8 on 3x32x32: 3 x the forward pass (counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedrift.models import build_model
    from fedrift.params import params as _  # noqa: F401 - the registries' options

    prep = prepare({"data": {"name": "digits"}, "model": {"name": "resnet8", "group_channels": 16}})
    model = build_model("resnet8", prep.options["model"], (3, 32, 32), 10, 0).to(device)
    x = torch.zeros(64, 3, 32, 32, device=device)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return 3.0 * counter.get_total_flops() / 64


def stacked_runs(configs: list[dict[str, Any]], train_together: Any = None, capture: Any = None) -> list[Any]:
    """``run_stacked(configs)`` and the stacks it made; ``train_together(real, stack, requests)``
    wraps each stack's ``_train_together`` (the profile's window); ``capture``: the stacks'
    capture function instead of the config's ``engine.cuda_graphs`` (the CPU check's stand-in).
    Raises a run's error."""
    from fedrift.experiments import stacked

    made, real = [], stacked.RunStack

    class Seen(real):  # type: ignore[misc, valid-type]
        def __post_init__(self) -> None:
            if capture is not None:
                self.cuda_graphs = capture
            super().__post_init__()
            made.append(self)

        def _train_together(self, requests):  # noqa: ANN001, ANN202
            if train_together is None:
                return real._train_together(self, requests)
            return train_together(real, self, requests)

    stacked.RunStack = Seen  # type: ignore[misc]
    try:
        bad = [r for r in run_stacked(configs) if isinstance(r, BaseException)]
    finally:
        stacked.RunStack = real  # type: ignore[misc]
    if bad:
        raise bad[0]
    return made


def compiled_graphs() -> int:
    """What ``torch.compile`` has compiled in this process (0 where nothing has imported it)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo.counters["stats"]["unique_graphs"] if dynamo else 0


def mode_keys(mode: str) -> dict[str, bool]:
    """A row's 4th field, ``eager|graphs|compiled[+cudnn]``, as the engine keys it sets (each
    row records them too): ``cuda_graphs``, ``compile``, ``cudnn_benchmark``."""
    base, _, extra = mode.partition("+")
    if base not in ("eager", "graphs", "compiled") or extra not in ("", "cudnn"):
        raise ValueError(f"row mode {mode!r}; allowed: eager, graphs or compiled, each with +cudnn or not")
    return {"cuda_graphs": base in ("graphs", "compiled"), "compile": base == "compiled", "cudnn_benchmark": extra == "cudnn"}


def mode_name(row: dict[str, Any]) -> str:
    """:func:`mode_keys`' inverse, from a row's fields (a row written before a key existed: its
    default then, off)."""
    base = "compiled" if row.get("compile") else "graphs" if row.get("cuda_graphs") else "eager"
    return base + ("+cudnn" if row.get("cudnn_benchmark") else "")


def measure(data: Path, args: argparse.Namespace, path: str, runs: int, precision: str, work: Path,
            mode: str = "eager", barrier: Path | None = None) -> dict[str, Any]:
    from fedrift.api import run_prepared
    from fedrift.engine.executors.batched import BatchedExecutor
    from fedrift.engine.step_graphs import eager_capture

    # on a CPU (the script's own check) captured steps are the tests' stand-in: the same buffers
    keys = mode_keys(mode)
    capture = eager_capture if keys["cuda_graphs"] and args.device == "cpu" else None
    folder = work / f"{path}-{runs}-{precision}-{mode}"
    configs = [config(data, args, path, precision, seed, folder, mode, trial_lr(path, seed, runs)) for seed in range(runs)]
    graphs_before = compiled_graphs()
    start = time.perf_counter()
    alone, engines = 0, []
    if barrier is not None and path not in STACKS:
        raise ValueError("rows in several processes: the stacked path only (its first meeting is where the copies meet)")
    if path in STACKS:
        together = None if barrier is None else meet_first(barrier, args.parties)
        stacks = stacked_runs(configs, together, capture=capture)
        alone = sum(s.rounds_alone for s in stacks)  # rounds whose stacked step raised: run by run
        engines = [s._engine for s in stacks]
        if alone:
            print(f"stacked x{runs} {precision}: {alone} round(s) trained run by run (the stacked step raised)", flush=True)
    elif path == "batched":  # the executor made here, to read what its captured steps did
        engines = [BatchedExecutor(None, capture or keys["cuda_graphs"], keys["compile"])]
        run_prepared(prepare(configs[0]), executor=engines[0])
    else:
        fedrift.run(configs[0])
    wall = time.perf_counter() - start
    counts = [e.graph_counts() for e in engines]
    timed = range(2, args.rounds + 1) or range(1, 2)  # round 1: the warm-up (a 1-round profile run: itself)
    samples = sum(sum(samples_per_round(c, timed)) for c in configs)
    per_run = [round_seconds(Path(c["output"]["dir"])) for c in configs]
    # the runs of a stack train together: the stack's round takes the longest of theirs
    seconds = sum(max(s[t] for s in per_run) for t in timed)
    return {"path": path, "runs": runs, "clients": 4 * runs, "precision": precision, **keys, "processes": 1,
            "compiles": compiled_graphs() - graphs_before,
            "graph_captures": sum(c["captures"] for c in counts), "graph_replays": sum(c["replays"] for c in counts),
            "capture_seconds": sum(c["capture_seconds"] for c in counts),
            "capture_failed": next((c["failed"] for c in counts if c["failed"]), None),
            "samples_per_second": samples / seconds, "samples": samples, "seconds": seconds, "wall_seconds": wall,
            "rounds_timed": len(timed), "local_epochs": args.epochs, "rounds_trained_run_by_run": alone,
            "real_step_share": real_step_share(configs, path, timed)}


def meet_first(folder: Path, parties: int, timeout: float = 600.0) -> Any:
    """A ``train_together`` for :func:`stacked_runs` that, before the stack's first training, waits
    until ``parties`` processes have reached theirs (a file each in ``folder``): the copies of a
    row in several processes then train their rounds at the same time, not one after another's
    start-up."""
    met = [False]

    def together(real: Any, stack: Any, requests: Any) -> Any:
        if not met[0]:
            met[0] = True
            (folder / str(os.getpid())).touch()
            end = time.monotonic() + timeout
            while len(list(folder.iterdir())) < parties:
                if time.monotonic() > end:
                    raise TimeoutError(f"{parties} processes did not all reach their first round within {timeout:.0f} s")
                time.sleep(0.05)
        return real._train_together(stack, requests)

    return together


def measure_processes(data: Path, args: argparse.Namespace, path: str, runs: int, precision: str, mode: str,
                      procs: int) -> dict[str, Any]:
    """Item 4's "several processes per GPU": ``procs`` copies of a stacked row at once, each in a
    process of its own (this script, one row), meeting before their first round; the device's
    samples a second = their samples over the longest one's timed seconds (their timed rounds
    overlap: a lower bound). Each copy's own row is kept under ``per_process``."""
    import subprocess

    root = args.work / f"procs-{path}-{runs}-{precision}-{mode}-x{procs}"
    barrier = root / "barrier"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    barrier.mkdir(parents=True)
    children = []
    for k in range(procs):
        cmd = [sys.executable, __file__, "--device", args.device, "--rows", f"{path}:{runs}:{precision}:{mode}",
               "--out", str(root / f"p{k}"), "--work", str(root / f"w{k}"), "--data", str(data), "--rounds", str(args.rounds),
               "--epochs", str(args.epochs), "--budget", "1e9", "--barrier", str(barrier), "--parties", str(procs)]
        children.append(subprocess.Popen(cmd + (["--quick"] if args.quick else []), stdout=subprocess.DEVNULL))
    codes = [c.wait() for c in children]
    got = [json.loads(f.read_text())["rows"][0] for f in sorted(root.glob("p*/throughput-*.json"))]
    bad = [g for g in got if "samples_per_second" not in g]
    if len(got) < procs or bad or any(codes):
        why = bad[0].get("error") if bad else f"exit codes {codes}"
        raise RuntimeError(f"{procs} processes of {path} x{runs}: {len(got)} rows came back ({why})")
    samples, seconds = sum(g["samples"] for g in got), max(g["seconds"] for g in got)
    return {"path": path, "runs": runs, "clients": 4 * runs * procs, "precision": precision, **mode_keys(mode),
            "processes": procs, "samples_per_second": samples / seconds, "samples": samples, "seconds": seconds,
            "wall_seconds": max(g["wall_seconds"] for g in got), "rounds_timed": got[0]["rounds_timed"],
            "local_epochs": args.epochs, "rounds_trained_run_by_run": sum(g["rounds_trained_run_by_run"] for g in got),
            "real_step_share": got[0]["real_step_share"],
            "per_process": [{k: g[k] for k in ("samples_per_second", "seconds", "graph_captures", "capture_failed")} for g in got]}


class Window:
    """``torch.profiler`` over round 2's training only (round 1 warms up: kernels chosen, code
    loaded; evaluation, aggregation and the run's start-up stay outside), in the thread that
    trains (a stack's training thread: the labels of the other threads are not recorded)."""

    def __init__(self, device: str) -> None:
        from torch.profiler import ProfilerActivity

        self.device = device
        self.acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        self.prof: Any = None
        self.wall = 0.0

    def around(self, round_: int, train: Any) -> Any:
        if round_ != 2 or self.prof is not None:
            return train()
        from torch.profiler import profile as torch_profile

        prof = torch_profile(activities=self.acts)
        prof.start()
        start = time.perf_counter()
        try:
            return train()
        finally:
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.wall = time.perf_counter() - start
            prof.stop()
            self.prof = prof


def profiled_run(data: Path, args: argparse.Namespace, path: str, runs: int, work: Path, window: Window,
                 mode: str = "eager") -> list[dict]:
    """A 2-round run of ``path`` (``runs`` stacked runs; ``mode``: :func:`mode_keys`) with
    ``window`` around round 2's training."""
    from fedrift.api import run_prepared
    from fedrift.engine.executors.sequential import SequentialExecutor

    two = argparse.Namespace(**{**vars(args), "rounds": 2})
    configs = [config(data, two, path, "fp32", seed, work, mode) for seed in range(runs)]
    if path == "sequential":
        class Profiled(SequentialExecutor):
            def run_round(self, tools, payload, jobs, round_, take=None):  # noqa: ANN001, ANN202
                return window.around(round_, lambda: SequentialExecutor.run_round(self, tools, payload, jobs, round_, take))

        run_prepared(prepare(configs[0]), executor=Profiled())
        return configs

    made = stacked_runs(configs, lambda real, stack, requests: window.around(
        requests[0].part.round_, lambda: real._train_together(stack, requests)))
    if any(s.rounds_alone for s in made):
        raise RuntimeError(f"profile stacked x{runs}: the stacked step raised; its rounds trained run by run")
    return configs


def profile(data: Path, args: argparse.Namespace, work: Path, out: Path, tag: str) -> None:
    """G2: round 2's training of ``--profile-cases`` (the sequential path first, then 12 stacked
    runs) under torch.profiler; a case that fails is written down with its error."""
    report: dict[str, Any] = {"device": tag, "cases": []}
    name = f"profile-{tag}{'-' + args.series if args.series else ''}"
    # sequential first: the profiler's first start is then in the main thread, where Kineto set
    # its client up at import (a first start in a stack's training thread prints "External init
    # callback must run in same thread as registerClient" and skips that set-up)
    for case in args.profile_cases.split(","):
        path, runs, mode = case.split(":")
        runs = min(int(runs), 3) if args.quick else int(runs)
        try:
            report["cases"].append(profile_case(data, args, work, path, runs, mode))
        except Exception as err:  # noqa: BLE001 - written down; the other cases go on
            report["cases"].append({"path": path, "runs": runs, **mode_keys(mode), "error": f"{type(err).__name__}: {err}"})
            print(f"profile {path} x{runs} {mode}: {type(err).__name__}: {err}", flush=True)
        (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# G2 profile, {tag}: round 2's training (round 1 a warm-up)", ""]
    for c in report["cases"]:
        if "error" in c:
            lines.append(f"- {c['path']} x{c['runs']} ({mode_name(c)}): {c['error']}")
            continue
        busy = "n/a" if c["device_busy_share"] is None else f"{c['device_busy_share']:.2f}"
        lines.append(f"- {c['path']} x{c['runs']} ({mode_name(c)}): {c['steps']} steps, {c['wall_seconds']:.2f} s "
                     f"({c['wall_ms_per_step']:.2f} ms a step, {c['samples_per_second']:.0f} samples/s), "
                     f"{c['aten_ops_per_step']:.0f} aten ops and {c['kernels_per_step']:.0f} kernels a step "
                     f"({c['kernel_ms_per_step']:.2f} ms of kernels), device busy {busy}")
        for k in c["top_kernels"][:6]:
            lines.append(f"  - {k['name'][:80]}: {k['count']} calls, {k['ms']:.1f} ms")
        for k in c["top_cpu_ops"][:6]:
            lines.append(f"  - host: {k['name'][:60]}: {k['count']} calls, {k['cpu_ms']:.1f} ms self")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def profile_case(data: Path, args: argparse.Namespace, work: Path, path: str, runs: int, mode: str) -> dict[str, Any]:
    """One case of :func:`profile`: its summary."""
    window = Window(args.device)
    configs = profiled_run(data, args, path, runs, work / f"prof-{path}-{runs}-{mode}", window, mode)
    prof, wall = window.prof, window.wall
    events = prof.key_averages()
    if not any(e.key.startswith("aten::") for e in events):  # a window around nothing: say so, write nothing false
        raise RuntimeError(f"profile {path} x{runs}: the profiler recorded no operation in round 2's training")
    # the labels' CPU ranges count the steps; on CUDA each label also shows as a device-side
    # annotation spanning its kernels, which is no kernel (counting it doubled the steps and
    # put the steps' whole spans into the kernel time: the first H200 profile, BENCHMARKS.md G)
    labelled = sum(1 for e in prof.events() if e.name == "fedrift.step" and e.device_type.name == "CPU")
    steps = labelled or steps_taken(configs, path, range(2, 3))
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("fedrift.")]
    if args.device == "cuda" and not kernels:
        raise RuntimeError(f"profile {path} x{runs}: the profiler recorded no CUDA kernel in round 2's training")
    kernel_s = sum(e.device_time_total for e in kernels) / 1e6 if kernels else 0.0
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time_total)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]
    labels = {e.name: {"count": 0, "cpu_ms": 0.0} for e in prof.events() if e.name.startswith("fedrift.")}
    for e in prof.events():
        if e.name.startswith("fedrift.") and e.device_type.name == "CPU":
            labels[e.name]["count"] += 1
            labels[e.name]["cpu_ms"] += e.cpu_time_total / 1e3
    samples = sum(samples_per_round(c, range(2, 3))[0] for c in configs)
    print(f"profile {path} x{runs} {mode}: {steps} steps, {len(kernels)} kernels, wall {wall:.2f} s", flush=True)
    return {
        "path": path, "runs": runs, **mode_keys(mode), "wall_seconds": wall, "steps": steps, "samples": samples,
        "samples_per_second": samples / wall, "kernels": len(kernels),
        "aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
        "kernels_per_step": len(kernels) / steps, "kernel_ms_per_step": 1e3 * kernel_s / steps,
        "wall_ms_per_step": 1e3 * wall / steps, "device_busy_share": kernel_s / wall if kernels else None,
        "labels": labels,
        "top_kernels": [{"name": n[:120], "count": len(v), "ms": sum(v) / 1e3} for n, v in top],
        "top_cpu_ops": [{"name": e.key, "count": e.count, "cpu_ms": e.self_cpu_time_total / 1e3}
                        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-throughput"))
    ap.add_argument("--rounds", type=int, default=3, help="rounds a row trains (the first is a warm-up)")
    ap.add_argument("--epochs", type=int, default=1, help="local epochs (throughput does not depend on them)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all rows; a row is not started past it")
    ap.add_argument("--rows", default="", help="path:runs:precision:graphs|eager|compiled[+cudnn][:processes],... (default: ORDER, "
                    "most informative first; processes: that many copies of the row at once, their samples summed)")
    ap.add_argument("--data", type=Path, default=None, help="the .npz to train on (default: made in --work)")
    ap.add_argument("--barrier", type=Path, default=None, help="(a copy of measure_processes') the folder where the copies meet")
    ap.add_argument("--parties", type=int, default=1, help="(a copy of measure_processes') how many meet there")
    ap.add_argument("--series", default="", help="a name for this call's file, throughput-<device>-<series>.json (its own baseline)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a check of the script on a CPU")
    ap.add_argument("--profile", action="store_true", help="G2 instead of G1")
    ap.add_argument("--profile-cases", default="sequential:1:eager,stacked:12:eager",
                    help="path:runs:graphs|eager[+cudnn],... profiled (sequential first: see profile())")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "fedrift-gpu-throughput")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    n_train, n_test = (2_000, 500) if args.quick else (50_000, 10_000)
    data = args.data or make_data(args.work, n_train, n_test)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    tag = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:40]
    if args.profile:
        profile(data, args, args.work, args.out, tag)
        return 0
    path = args.out / f"throughput-{tag}{'-' + args.series if args.series else ''}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {
        "device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "date": str(datetime.date.today()),
        "workload": "R1 at paper settings (ResNet-8 GN16, batch 64, 20 clients Dirichlet 0.1, 4 a round, augmented), "
                    "CIFAR-sized random uint8 images", "rows": []}
    fps = flops_per_sample(args.device)
    doc["train_flops_per_sample"] = fps
    rows = [(*spec, 1)[:5] for spec in ([tuple(r.split(":")) for r in args.rows.split(",")] if args.rows else ORDER)]
    try:
        for row in rows:
            mode_keys(row[3])  # a bad mode is said before any row runs
    except ValueError as err:
        print(f"gpu_throughput: --rows: {err}", file=sys.stderr)
        return 2
    if args.quick:
        rows = [(p, min(int(r), 3), prec, mode, procs) for p, r, prec, mode, procs in rows]
    start = time.perf_counter()
    for p, r, prec, mode, procs in rows:
        r, procs = int(r), int(procs)
        # rows of a file written before cuda_graphs (engine.compile, engine.cudnn_benchmark) existed were launched
        # op by op (uncompiled, cuDNN's heuristics)
        if any(x["path"] == p and x["runs"] == r and x["precision"] == prec and mode_name(x) == mode
               and x.get("processes", 1) == procs for x in doc["rows"]):
            continue  # measured by an earlier call
        if time.perf_counter() - start > args.budget:
            print(f"budget spent: {p} x{r} {prec} {mode} in {procs} process(es) not measured", flush=True)
            continue
        try:
            if procs > 1:
                row = measure_processes(data, args, p, r, prec, mode, procs)
            else:
                row = measure(data, args, p, r, prec, args.work, mode, barrier=args.barrier)
        except Exception as err:  # noqa: BLE001 - one row's failure is written down, the rest go on
            row = {"path": p, "runs": r, "clients": 4 * r, "precision": prec, **mode_keys(mode), "processes": procs,
                   "error": f"{type(err).__name__}: {err}"}
        if "samples_per_second" in row:
            on_gpu = args.device == "cuda"
            row["fraction_of_peak"] = row["samples_per_second"] * fps / PEAK_FLOPS[prec] if on_gpu else None
            row["peak"] = f"{PEAK_FLOPS[prec] / 1e12:.0f} TFLOP/s dense {prec} (H100/H200 SXM)" if on_gpu else None
        doc["rows"].append(row)
        path.write_text(json.dumps(doc, indent=1) + "\n")  # after every row: a cut call keeps what it measured
        print(json.dumps(row), flush=True)
    base = next((x for x in doc["rows"] if x["path"] == "sequential" and x["precision"] == "fp32" and "samples_per_second" in x), None)
    # the same call's baseline: the ratios are within one call, as BENCH.md asks
    for x in doc["rows"]:
        if base and "samples_per_second" in x:
            mode = mode_name(x) + (f" in {x['processes']} processes" if x.get("processes", 1) > 1 else "")
            print(f"{x['path']:>10} x{x['runs']:<3} {x['precision']} {mode:>14}: {x['samples_per_second']:>10.0f} samples/s "
                  f"({x['samples_per_second'] / base['samples_per_second']:.2f}x sequential fp32)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
