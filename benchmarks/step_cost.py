"""Cost of one local step per client, single-threaded, for the ways fedrift can take it.

- plain: an nn.Module, loss.backward(), torch.optim.SGD (the usual loop without its
  DataLoader and deepcopy);
- sequential: fedrift's step as the one-client-at-a-time executors take it (functional_call,
  convolution kernels channels-last on the CPU, autograd, SGD in place);
- func.grad: the same step with torch.func.grad_and_value (what vmap needs);
- batched K: fedrift's vmapped step over K clients, per client;

then the cost of inference (evaluation, teacher tables) per sample for the convolutional
models, by memory layout and chunk size.

``--papers``: instead, the papers' models (issue 12): ResNet-8, ResNet-18 and ResNet-50
(FedGKD's Tiny-ImageNet model) on 3x32x32 batches (SGD) and the MiniLM text model on 32-token
batches (AdamW, encoder trained), plain against fedrift's sequential step, timed in **CPU
seconds** of this one-thread process (``time.process_time``), so that the figures hold on a
machine shared with other jobs: a step's CPU time does not count the time the process waited
for a core. Samples per CPU second x the cores is the compute limit of the throughput table (BENCHMARKS.md).

``--cifar``: workload R1's step (issue 30 item 3): ResNet-8 (GroupNorm, 16 channels a group)
on real CIFAR-10 batches of 64 (the JPEG q75 copy, read from its zip through
``fedrift.data.load_dataset``, normalised by the dataset's ``pixel_norm`` inside every step),
SGD lr 0.05, momentum 0.9, wd 1e-5, gradients clipped at norm 10, in CPU ms per step of this
process (``time.process_time``): plain torch in the default layout and channels-last,
fedrift's sequential step in both layouts, ``torch.compile`` of the plain model and of
fedrift's ``apply`` (inductor: needs a C++ compiler; ``--no-compile`` skips it), fedrift's
vmapped step per client at K = 4 and 8, and the plain and sequential steps with two
threads (CPU ms summed over both: what a second thread costs). The measurements are taken in
``--passes`` interleaved passes and the median is printed, so that a load change on a shared
machine hits every row alike; then how far each variant's parameters drift from the
eager ones after the same steps (the exactness the executors promise).

    .venv/bin/python benchmarks/step_cost.py
    .venv/bin/python benchmarks/step_cost.py --papers
    .venv/bin/python benchmarks/step_cost.py --cifar [--root ../shared/data/cifar10-jpeg] [--no-compile]
    .venv/bin/python benchmarks/step_cost.py --cifar-runs examples/workload_r1.yaml

``--cifar-runs CONFIG``: the same in whole runs (``fedrift run`` in a child process, its
worker processes included, CPU read from /proc): CPU seconds a round per executor (sequential, processes with two
one-thread workers, batched), every client 20 local steps of 64, start-up and evaluation
taken out by differencing a 1-round and a 3-round run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.func import vmap

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Setup
from fedrift.engine.local import make_apply, make_step, prefers_channels_last
from fedrift.functional.optim import adamw, sgd
from fedrift.models import MODELS, build_model

CASES = [("logreg", (60,), None, 10), ("mlp", (60,), {"hidden": [200, 200]}, 10), ("cnn", (1, 28, 28), {}, 32)]


def timed(fn, reps: int, clock=time.perf_counter, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    start = clock()
    for _ in range(reps):
        fn()
    return (clock() - start) / reps


def main() -> None:
    torch.set_num_threads(1)
    print("| model | batch | plain ms | sequential ms | func.grad ms | batched K=16 ms/client | batched K=64 ms/client |")
    print("|---|---|---|---|---|---|---|")
    for name, shape, opts, batch in CASES:
        entry = MODELS.get(name)
        model = build_model(name, entry.params(**opts) if entry.params else None, shape, 10, 0)
        apply = make_apply(model, {})
        fedavg = ALGORITHMS.get("fedavg")
        alg = fedavg.factory(fedavg.params(), Setup(10, 100, 1, 0.05, 0.9, 1e-5, None, 0))
        opt = sgd(0.05, 0.9, 1e-5)
        x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
        b = {"x": x, "y": y, "w": torch.full((batch,), 1.0 / batch)}
        p0 = {k: v.detach() for k, v in model.named_parameters()}
        reps = 20 if name == "cnn" else 300

        torch_opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-5)

        def plain() -> None:
            torch_opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch_opt.step()

        laid = make_apply(model, {}, prefers_channels_last(model, torch.device("cpu")))
        seq, fun = make_step(alg, laid, opt, inplace=True), make_step(alg, apply, opt, functional=True)
        state = opt.init(p0)
        own = {k: v.clone() for k, v in p0.items()}  # the in-place step's own copy
        own_state = opt.init(own)
        row = [timed(plain, reps), timed(lambda: seq(own, own_state, b, {"params": p0}, {}), reps),
               timed(lambda: fun(p0, state, b, {"params": p0}, {}), reps)]
        vstep = vmap(fun, in_dims=(0, 0, 0, None, 0))
        for k in (16, 64):
            ps = {n: v.unsqueeze(0).expand(k, *v.shape).clone() for n, v in p0.items()}
            st = vmap(opt.init)(ps)
            bk = {n: v.unsqueeze(0).expand(k, *v.shape).clone() for n, v in b.items()}
            ctx = {"num_samples": torch.ones(k)}
            row.append(timed(lambda: vstep(ps, st, bk, {"params": p0}, ctx), max(3, reps // k)) / k)
        print(f"| {name} | {batch} | " + " | ".join(f"{1000 * v:.3f}" for v in row) + " |", flush=True)
    inference()


@torch.no_grad()
def inference() -> None:
    print("\n| model | layout | chunk 32 ms/sample | chunk 128 ms/sample | chunk 1024 ms/sample |\n|---|---|---|---|---|")
    for name, shape in (("cnn", (1, 28, 28)), ("resnet8", (3, 32, 32))):
        model = build_model(name, None, shape, 10, 0)
        p0 = {k: v.detach() for k, v in model.named_parameters()}
        x = torch.randn(1024, *shape)
        for layout, laid in (("default", False), ("channels-last", True)):
            apply = make_apply(model, {}, laid)
            row = [timed(lambda c=c: [apply(p0, x[i : i + c]) for i in range(0, len(x), c)], 2) / len(x)
                   for c in (32, 128, 1024)]
            print(f"| {name} | {layout} | " + " | ".join(f"{1000 * v:.3f}" for v in row) + " |", flush=True)


PAPERS = [("resnet8", (3, 32, 32), "sgd"), ("resnet18", (3, 32, 32), "sgd"), ("resnet50", (3, 32, 32), "sgd"),
          ("text", (32,), "adamw")]


def papers(batch: int = 32, reps: int = 5) -> None:
    """CPU seconds per step of batch ``batch``, one thread: plain (torch.optim) and fedrift's
    sequential step (channels-last convolutions, in-place update), for the papers' models."""
    torch.set_num_threads(1)
    print("| model | optimiser | batch | plain CPU ms/step | sequential CPU ms/step | plain samples/CPU-s | "
          "sequential samples/CPU-s |\n|---|---|---|---|---|---|---|")
    fedavg = ALGORITHMS.get("fedavg")
    alg = fedavg.factory(fedavg.params(), Setup(10, 100, 1, 0.05, 0.9, 1e-5, None, 0))
    for name, shape, optim in PAPERS:
        entry = MODELS.get(name)
        model = build_model(name, entry.params() if entry.params else None, shape, 10, 0)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(1, 30000, (batch, *shape), generator=g) if name == "text" else torch.randn(batch, *shape, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        b = {"x": x, "y": y, "w": torch.full((batch,), 1.0 / batch)}
        trained = [q for q in model.parameters() if q.requires_grad]
        if optim == "sgd":
            torch_opt = torch.optim.SGD(trained, lr=0.05, momentum=0.9, weight_decay=1e-5)
            opt = sgd(0.05, 0.9, 1e-5)
        else:
            torch_opt = torch.optim.AdamW(trained, lr=5e-5, weight_decay=1e-5)
            opt = adamw(5e-5, 1e-5)

        def plain() -> None:
            torch_opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch_opt.step()

        p0 = {k: v.detach() for k, v in model.named_parameters()}
        buffers = dict(model.named_buffers())
        seq = make_step(alg, make_apply(model, buffers, prefers_channels_last(model, torch.device("cpu"))), opt, inplace=True)
        own = {k: v.clone() for k, v in p0.items()}
        own_state = opt.init(own)
        row = [timed(plain, reps, time.process_time, 2),
               timed(lambda: seq(own, own_state, b, {"params": p0}, {}), reps, time.process_time, 2)]
        print(f"| {name} | {optim} | {batch} | " + " | ".join(f"{1000 * v:.0f}" for v in row) + " | "
              + " | ".join(f"{batch / v:.1f}" for v in row) + " |", flush=True)


R1_BATCH = 64  # workload R1's batch
R1_OPT = dict(lr=0.05, momentum=0.9, weight_decay=1e-5)
R1_CLIP = 10.0


class Variant:
    """One way to take R1's step: ``start()`` puts it back at the common starting model and
    returns ``step(i)`` (one step on batch ``i``) and ``params()`` (its model now)."""

    def __init__(self, name: str, start: Callable[[], tuple[Callable[[int], None], Callable[[], dict]]],
                 threads: int = 1, clients: int = 1, reference: str | None = None) -> None:
        self.name, self.start, self.threads, self.clients, self.reference = name, start, threads, clients, reference


def cifar(root: Path, with_compile: bool = True, reps: int = 8, passes: int = 3, check_steps: int = 5) -> None:
    """CPU ms per step of R1's ResNet-8 on real CIFAR-10 batches of 64, one thread (two where
    the row says so), every way the engine could take it; see the module's docstring."""
    import copy
    import shutil

    from fedrift.data import DATASETS, load_dataset

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ds = load_dataset("imagefolder", root, DATASETS.get("imagefolder").params(size=32))
    norm = ds.pixel_norm
    n_batches = 8
    pick = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))[: n_batches * R1_BATCH]
    xs = ds.x_train[pick].reshape(n_batches, R1_BATCH, *ds.x_train.shape[1:])  # uint8, as the engine keeps them
    ys = ds.y_train[pick].reshape(n_batches, R1_BATCH)
    w = torch.full((R1_BATCH,), 1.0 / R1_BATCH)
    print(f"data: {root} ({len(ds.y_train)} training images, loaded in {time.perf_counter() - t0:.1f} s wall); "
          f"batch {R1_BATCH}, {n_batches} fixed batches cycled; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread", flush=True)

    model = build_model("resnet8", MODELS.get("resnet8").params(group_channels=16), tuple(xs.shape[2:]), 10, 0)
    p0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    fedavg = ALGORITHMS.get("fedavg")
    alg = fedavg.factory(fedavg.params(), Setup(10, 20, 1, R1_OPT["lr"], R1_OPT["momentum"], R1_OPT["weight_decay"],
                                                R1_CLIP, 0, batch_size=R1_BATCH))
    opt = sgd(R1_OPT["lr"], R1_OPT["momentum"], R1_OPT["weight_decay"], R1_CLIP)
    payload = {"params": p0}

    def plain(module: torch.nn.Module, channels_last: bool, forward: Callable[..., Any] | None = None) -> Callable:
        """torch's usual step: nn.Module, backward, clip_grad_norm_, torch.optim.SGD."""
        fwd = module if forward is None else forward

        def start():
            module.load_state_dict(p0, strict=False)
            if channels_last:
                module.to(memory_format=torch.channels_last)
            torch_opt = torch.optim.SGD(module.parameters(), **R1_OPT)

            def step(i: int) -> None:
                x = norm(xs[i])
                if channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                torch_opt.zero_grad()
                torch.nn.functional.cross_entropy(fwd(x), ys[i]).backward()
                torch.nn.utils.clip_grad_norm_(module.parameters(), R1_CLIP)
                torch_opt.step()

            return step, lambda: {k: v.detach().clone() for k, v in module.named_parameters()}

        return start

    def sequential(apply: Callable[..., Any]) -> Callable:
        """fedrift's step as sequential / processes / ray take it (autograd, SGD in place)."""
        seq = make_step(alg, apply, opt, inplace=True)

        def start():
            own = {k: v.clone() for k, v in p0.items()}
            state = [opt.init(own)]

            def step(i: int) -> None:
                _, state[0], _, _ = seq(own, state[0], {"x": xs[i], "y": ys[i], "w": w}, payload, {})

            return step, lambda: {k: v.clone() for k, v in own.items()}

        return start

    def batched(k: int, wrap: Callable[[Callable], Callable] = lambda f: f) -> Callable:
        """fedrift's vmapped step over ``k`` clients (the batched executor's: default layout)."""
        vstep = wrap(vmap(make_step(alg, make_apply(model, buffers, False, norm), opt, functional=True),
                          in_dims=(0, 0, 0, None, 0)))
        ctx = {"num_samples": torch.full((k,), float(R1_BATCH))}

        def start():
            ps = {n: v.unsqueeze(0).expand(k, *v.shape).clone() for n, v in p0.items()}
            held = [ps, vmap(opt.init)(ps)]

            def step(i: int) -> None:
                sel = [(i + j) % n_batches for j in range(k)]  # each client its own batch
                b = {"x": xs[sel], "y": ys[sel], "w": w.expand(k, -1)}
                held[0], held[1], _, _ = vstep(held[0], held[1], b, payload, ctx)

            return step, lambda: {n: v[0].clone() for n, v in held[0].items()}

        return start

    laid = make_apply(model, buffers, prefers_channels_last(model, torch.device("cpu")), norm)
    variants = [
        Variant("plain torch (default layout)", plain(model, False)),
        Variant("plain torch, channels-last", plain(copy.deepcopy(model), True), reference="plain torch (default layout)"),
        Variant("fedrift sequential (channels-last kernels, as run)", sequential(laid)),
        Variant("fedrift sequential, default layout", sequential(make_apply(model, buffers, False, norm)),
                reference="fedrift sequential (channels-last kernels, as run)"),
        Variant("fedrift batched K=4, per client", batched(4), clients=4,
                reference="fedrift sequential (channels-last kernels, as run)"),
        Variant("fedrift batched K=8, per client", batched(8), clients=8,
                reference="fedrift sequential (channels-last kernels, as run)"),
        Variant("plain torch, 2 threads (CPU of both)", plain(copy.deepcopy(model), False), threads=2,
                reference="plain torch (default layout)"),
        Variant("fedrift sequential, 2 threads (CPU of both)", sequential(laid), threads=2,
                reference="fedrift sequential (channels-last kernels, as run)"),
    ]
    compile_notes: list[str] = []
    if with_compile:
        if shutil.which("g++") is None and shutil.which("c++") is None:
            compile_notes.append("torch.compile: not tried, no C++ compiler (g++) on this machine (inductor needs one)")
        else:
            cm = copy.deepcopy(model)
            compiled_apply = torch.compile(make_apply(model, buffers, prefers_channels_last(model, torch.device("cpu")), norm))
            variants += [
                Variant("torch.compile(plain model)", plain(cm, False, torch.compile(cm)),
                        reference="plain torch (default layout)"),
                Variant("fedrift sequential, torch.compile(apply)", sequential(compiled_apply),
                        reference="fedrift sequential (channels-last kernels, as run)"),
                Variant("fedrift batched K=4, torch.compile(vmapped step), per client", batched(4, torch.compile),
                        clients=4, reference="fedrift sequential (channels-last kernels, as run)"),
            ]

    # the first steps (compilation too), then the same steps from the start for the drift check
    finals: dict[str, dict] = {}
    alive = []
    for v in variants:
        torch.set_num_threads(v.threads)
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            step, params = v.start()
            for i in range(check_steps):
                step(i % n_batches)
            finals[v.name] = params()
        except Exception as err:  # noqa: BLE001 - a variant that cannot run is reported in one line
            compile_notes.append(f"{v.name}: failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
            continue
        finally:
            torch.set_num_threads(1)
        first = (time.process_time() - c0, time.perf_counter() - w0)
        alive.append((v, first))
        print(f"  ready: {v.name} ({check_steps} first steps: {first[0]:.1f} CPU s, {first[1]:.1f} s wall)", flush=True)

    samples: dict[str, list[float]] = {v.name: [] for v, _ in alive}
    runners = {}
    for v, _ in alive:
        runners[v.name] = v.start()[0]
    for _ in range(passes):  # interleaved: a load change hits every row alike
        for v, _ in alive:
            torch.set_num_threads(v.threads)
            it = iter(range(10**9))
            samples[v.name].append(timed(lambda: runners[v.name](next(it) % n_batches), reps, time.process_time, 2) / v.clients)
        torch.set_num_threads(1)

    base = statistics.median(samples["plain torch (default layout)"])
    print(f"\n| step (ResNet-8 GN, batch {R1_BATCH}, SGD + clip 10) | CPU ms per client-step | x plain | "
          f"samples/CPU-s | max abs param diff after {check_steps} steps (vs) | first {check_steps} steps CPU s |")
    print("|---|---|---|---|---|---|")
    for v, first in alive:
        ms = statistics.median(samples[v.name])
        if v.reference and v.reference in finals:
            diff = max(float((finals[v.name][k] - finals[v.reference][k]).abs().max()) for k in finals[v.reference])
            vs = f"{diff:.1e} ({v.reference.split(' (')[0]})"
        else:
            vs = "-"
        print(f"| {v.name} | {1000 * ms:.1f} | {base / ms:.2f} | {R1_BATCH / ms:.0f} | {vs} | {first[0]:.1f} |", flush=True)
    spread = {v.name: (min(samples[v.name]), max(samples[v.name])) for v, _ in alive}
    print("\npasses (CPU ms, min-max): " + "; ".join(f"{n}: {1000 * a:.0f}-{1000 * b:.0f}" for n, (a, b) in spread.items()))
    for note in compile_notes:
        print(note)

def _tree_cpu(pid: int, seen: dict[int, float]) -> None:
    """Record the CPU seconds (user + system) of ``pid`` and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            seen[p] = max(seen.get(p, 0.0), (int(fields[11]) + int(fields[12])) / tick)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile


def cifar_runs(config: str, root: str, steps: int = 20, rounds: tuple[int, int] = (1, 3)) -> None:
    """CPU seconds of whole R1 runs per executor (``fedrift run`` in a child process; its CPU
    and every descendant's, worker processes included, read from /proc every 0.1 s), every
    client ``steps`` local steps of batch 64, evaluation only after the last round. The
    difference between a run of ``rounds[1]`` and one of ``rounds[0]`` rounds is the CPU of
    the rounds between, start-up and evaluation excluded; samples / that = samples per CPU
    second, which against the one-thread plain step's (x the cores) is the executor's share
    of the compute limit when every core is its own."""
    import subprocess

    import yaml

    cohort = yaml.safe_load(Path(config).read_text())["train"]["clients_per_round"]  # R1: 4 of 20
    runner = "import sys; from fedrift.cli import main; sys.exit(main(sys.argv[1:]))"
    cases = [("sequential", ["engine.threads=1"]), ("processes", ["engine.workers=2", "engine.threads=1"]),
             ("batched", ["engine.threads=1"])]
    print(f"| executor | CPU s, {rounds[0]} round(s) | CPU s, {rounds[1]} rounds | CPU s a round | samples a round | "
          "samples/CPU-s |\n|---|---|---|---|---|---|", flush=True)
    for name, extra in cases:
        cpu = []
        for n in rounds:
            args = [sys.executable, "-c", runner, "run", "-c", config, f"data.root={root}", f"engine.executor={name}",
                    f"train.rounds={n}", f"train.local_steps={steps}", "eval.every=1000", "eval.at_rounds=[]",
                    "output.progress=false", f"output.dir=runs/step_cost_cifar/{name}-{n}", "output.overwrite=true", *extra]
            child, seen = subprocess.Popen(args, stdout=subprocess.DEVNULL), {}
            while child.poll() is None:
                _tree_cpu(child.pid, seen)
                time.sleep(0.1)
            if child.returncode:
                raise SystemExit(f"{name}: fedrift run exited {child.returncode}")
            cpu.append(sum(seen.values()))
        per_round = (cpu[1] - cpu[0]) / (rounds[1] - rounds[0])
        samples = cohort * steps * R1_BATCH
        print(f"| {name} | {cpu[0]:.1f} | {cpu[1]:.1f} | {per_round:.1f} | {samples} | {samples / per_round:.0f} |", flush=True)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--papers", action="store_true", help="the papers' models (issue 12)")
    parser.add_argument("--cifar", action="store_true", help="workload R1's ResNet-8 step on real CIFAR-10 (issue 30)")
    parser.add_argument("--root", default="../shared/data/cifar10-jpeg", help="--cifar: the imagefolder root (or zip)")
    parser.add_argument("--no-compile", action="store_true", help="--cifar: skip the torch.compile rows")
    parser.add_argument("--reps", type=int, default=8, help="--cifar: timed steps a pass")
    parser.add_argument("--passes", type=int, default=3, help="--cifar: interleaved passes (median printed)")
    parser.add_argument("--cifar-runs", metavar="CONFIG", help="R1 runs' CPU seconds per executor (e.g. examples/workload_r1.yaml)")
    args = parser.parse_args()
    if args.cifar_runs:
        cifar_runs(args.cifar_runs, args.root)
    elif args.cifar:
        cifar(Path(args.root), not args.no_compile, args.reps, args.passes)
    elif args.papers:
        papers()
    else:
        main()
