"""Cost of one local step per client, single-threaded, for the ways fedrift can take it.

- plain: an nn.Module, loss.backward(), torch.optim.SGD (the usual loop without its
  DataLoader and deepcopy);
- sequential: fedrift's step as the one-client-at-a-time executors take it (functional_call,
  convolution kernels channels-last on the CPU, autograd, SGD in place);
- func.grad: the same step with torch.func.grad_and_value (what vmap needs);
- batched K: fedrift's vmapped step over K clients, per client;

then the cost of inference (evaluation, teacher tables) per sample for the convolutional
models, by memory layout and chunk size.

``--papers``: instead, the papers' models (issue 12): ResNet-8 and ResNet-18 on 3x32x32
batches (SGD) and the MiniLM text model on 32-token batches (AdamW, encoder trained), plain
against fedrift's sequential step, timed in **CPU seconds** of this one-thread process
(``time.process_time``), so that the figures hold on a machine shared with other jobs: a
step's CPU time does not count the time the process waited for a core. Samples per CPU
second x the cores is the compute limit of the throughput table (BENCHMARKS.md).

    .venv/bin/python benchmarks/step_cost.py
    .venv/bin/python benchmarks/step_cost.py --papers
"""

from __future__ import annotations

import sys
import time

import torch
from torch.func import vmap

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Setup
from fedrift.engine.local import make_apply, make_step, prefers_channels_last
from fedrift.engine.optim import adamw, sgd
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


PAPERS = [("resnet8", (3, 32, 32), "sgd"), ("resnet18", (3, 32, 32), "sgd"), ("text", (32,), "adamw")]


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


if __name__ == "__main__":
    papers() if "--papers" in sys.argv[1:] else main()
