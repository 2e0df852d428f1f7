"""Issue 49 item 4: what one vectorised ResNet-8 step costs the device per client, by how the
clients' convolutions are laid out; the measurement that says which formulation can reach
the issue's 10x.

Why: the H200's profile of a 12-run stack (BENCHMARKS.md G) trained 101,214 samples in 97
steps, about 16 clients a step, with 18.98 ms of kernels a step: about 1.16 ms a client-step,
18 us an image, against the sequential step's 1.32 ms (21 us an image). The vectorised step
runs no more efficient kernels than one client's; it only stopped the host's launches from
being the limit (device busy 0.07 -> 0.89). At 18 us an image the device tops out near 55,000
samples a second, whatever the stack's width (48 runs measured 47,133; 96 runs 45,534): the
kernels, not the schedule, bound it. A quarter of them convert layouts: under ``vmap`` each
convolution of K clients becomes one grouped convolution (clients merged into the channels)
and each GroupNorm a normalisation over clients x batch, so the activations are moved between
the two arrangements at every layer, and cuDNN converts NCHW to NHWC around each grouped call.

Variants of one local step (forward, loss, backward, SGD with momentum 0.9, weight decay 1e-5,
gradients clipped at norm 10; fedrift's ResNet-8, GroupNorm 16, batch ``--batch`` of 3x32x32,
10 classes), for K clients with their own weights and batches:

- ``vmap``: the engine's step before its stacked form, and still for BatchNorm, DP-SGD and
  runs at other values: ``torch.func.vmap`` over clients of ``make_step``'s step
  (``torch.func.grad`` through ``functional_call``), FedAvg's loss and optimiser.
- ``stacked``: the engine's step now (``engine.stacked_step.make_vstep``): each client's loss
  under ``vmap`` with the model call run as K channel groups of one network (activations
  ``(N, K*C, H, W)`` throughout, each convolution one call grouped by client, each GroupNorm
  one call with K times its groups), one backward of the summed losses.
- ``compiled``: ``stacked`` with the stacked form compiled by ``torch.compile`` (inductor;
  ``engine.compile``): a GroupNorm, its ReLU and a residual add as one kernel, forward and
  backward; one compile per K (tens of seconds: outside the timing, in the warm-up).
- ``channels`` and ``channels_last``: the channel-group network alone (``ResNet8.stacked``, no
  ``vmap`` at all), in the default and in channels-last memory format
  (``ResNet8.stacked_channels_last``: cuDNN's NHWC grouped kernels without conversions;
  GroupNorm may convert instead), with a stacked SGD update of their own: what the layout
  alone would give.
- ``gemm``: the channel-group network alone with each convolution as a batched product of
  each image's patches (``F.unfold``) and each client's kernel (:func:`gemm_conv`): cuBLAS's
  batched GEMM in place of cuDNN's grouped kernels, at kh*kw times the activations' memory.
  Another formulation of the vectorised convolution, where cuDNN's grouped kernels cost as
  much an image as one client's convolutions (on this CPU, 0.37-0.55x ``vmap``'s speed at 1-16
  clients: oneDNN's direct convolutions win there).

Before timing, the variants are checked against ``vmap`` at K = 3 (the engine's steps'
parameters after one step, the standalone variants' gradients; each tensor within 1e-4 of
its largest value; the script stops if not); for ResNet-8, the stacked form's gradients,
uncompiled and compiled, against float64's (``gradient_error_vs_float64``). Timing: the whole step captured as one CUDA graph (``--eager``: launched op by
op) and replayed ``--reps`` times between CUDA events, at K in ``--widths``, fp32 and bf16
(autocast around forward and loss); a case that fails (memory, capture) is written with its
error. Per case: ms a step, ms a client-step, us an image, images a second, and the ratio to
``vmap`` at the same K and precision. JSON and a markdown table to ``--out``. ``--model``: the
FedAvg CNN, the MLP or logistic regression instead (their inputs 1x28x28), or FedADC's CNN,
ResNet-18 or ResNet-50 (3x32x32; ``vmap`` and ``stacked`` only): the figures behind
``FedModel.stacked_step``. ``--cudnn-benchmark``: cuDNN times its convolution algorithms on
each shape (in the warm-up, before the capture) and keeps the fastest
(``engine.cudnn_benchmark``), where by default it picks by heuristics (on the H200's profile:
FFT and "alg0" kernels for one client, a direct grouped kernel at 1.5 ms a call for 16
clients); give the call its own ``--series``. ``--profile VARIANT:K:PRECISION,...``: those
cases' timed steps again under ``torch.profiler``, their kernels by name (calls and
microseconds a step, share of the step's kernel time; on a CPU, aten operators' own CPU time):
which kernels the step's time goes to, where the totals say only how much.

    python benchmarks/step_kernels.py --device cuda --out benchmarks/results/gpu-throughput
    # here, to check it end to end (the gradient check, then tiny timings, a minute):
    .venv/bin/python benchmarks/step_kernels.py --device cpu --quick --out /tmp/step-kernels
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn import functional as F

from fedrift.models.resnet import ResNet8

GN_CHANNELS = 16  # channels per GroupNorm group (R1's ResNet-8)


MODELS = {"resnet8": ({"name": "resnet8", "group_channels": GN_CHANNELS}, (3, 32, 32)),  # R1's
          "cnn": ({"name": "cnn"}, (1, 28, 28)), "mlp": ({"name": "mlp"}, (1, 28, 28)),  # workload A's, S2's
          "logreg": ({"name": "logreg"}, (1, 28, 28)),
          "fedadc_cnn": ({"name": "fedadc_cnn"}, (3, 32, 32)),  # R2's (FedADC Table I)
          # FedGKD's CIFAR-100 and Tiny-ImageNet, FedCSD's CIFAR-100 models (GroupNorm, 16 channels a group)
          "resnet18": ({"name": "resnet18", "group_channels": GN_CHANNELS}, (3, 32, 32)),
          "resnet50": ({"name": "resnet50", "group_channels": GN_CHANNELS}, (3, 32, 32))}
SHAPE = MODELS["resnet8"][1]  # the input shape of the run's model (main sets it)


def build(name: str, device: str) -> torch.nn.Module:
    """fedrift's model ``name`` (:data:`MODELS`) for its input shape and 10 classes; its
    ``stacked_step`` on, so that the engine's step through its form is timed even where the
    engine does not take it (``FedModel.stacked_step``: where it was measured faster)."""
    from fedrift.api import prepare
    from fedrift.models import build_model

    options, shape = MODELS[name]
    prep = prepare({"data": {"name": "digits"}, "model": options})
    model = build_model(name, prep.options["model"], shape, 10, 0).to(device)
    type(model).stacked_step = True
    return model


def stacked_params(model: torch.nn.Module, k: int) -> dict[str, torch.Tensor]:
    """K clients' parameters, each the model's plus its own small perturbation (seeded)."""
    g = torch.Generator().manual_seed(0)
    return {n: (p.detach().cpu().unsqueeze(0) + 0.01 * torch.randn(k, *p.shape, generator=g)).to(p.device)
            for n, p in model.named_parameters()}


def batch(k: int, n: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K clients' batches of n images (seeded), labels, and sample weights 1/n."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(k, n, *SHAPE, generator=g).to(device)
    y = torch.randint(0, 10, (k, n), generator=g).to(device)
    return x, y, torch.full((k, n), 1.0 / n, device=device)


def engine_tools(model: torch.nn.Module, name: str, device: str) -> Any:
    """The engine's ``RoundTools`` for FedAvg at R1's settings on ``model`` (``name``)."""
    from fedrift.api import prepare
    from fedrift.engine.build import build_algorithm
    from fedrift.engine.local import make_tools

    prep = prepare({"data": {"name": "digits"}, "model": MODELS[name][0], "algorithm": {"name": "fedavg"},
                    "train": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-5, "clip_grad_norm": 10.0}})
    x = torch.zeros(2, *SHAPE, device=device)
    return make_tools(model, build_algorithm(prep, model), prep.config.train, x, torch.zeros(2, dtype=torch.int64, device=device), 0)


def engine_step(model: torch.nn.Module, tools: Any, variant: str) -> Callable[..., Any]:
    """The engine's vectorised step: ``vmap`` of ``make_step``'s, or ``make_vstep``'s."""
    from fedrift.engine.local import make_step
    from fedrift.engine.stacked_step import make_vstep
    from torch.func import vmap

    if variant in ("stacked", "compiled"):
        step = make_vstep(tools, None, compiled=variant == "compiled")
        assert step is not None, "make_vstep: the model has no stacked form"
        return step
    step = make_step(tools.algorithm, tools.vmap_apply, tools.optimizer, functional=True, precision=tools.precision)
    return vmap(step, in_dims=(0, 0, 0, None, 0))


def vmap_grads(model: torch.nn.Module) -> Callable[..., dict[str, torch.Tensor]]:
    """Per-client gradients, ``vmap`` over clients of ``grad`` through ``functional_call``."""
    from torch.func import functional_call, grad, vmap

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, params, (x,))
        return (F.cross_entropy(logits.float(), y, reduction="none") * w).sum()

    return vmap(grad(loss))


def gemm_conv(h: torch.Tensor, p: dict[str, torch.Tensor], name: str, module: torch.nn.Conv2d, k: int) -> torch.Tensor:
    """``models.base.grouped_conv`` without a grouped convolution: each image's patches
    (``F.unfold``: ``(N, K*C*kh*kw, L)``) times each client's kernel, one batched product over
    images and clients (cuBLAS's batched GEMM, where cuDNN's grouped kernels cost on the H200's
    profile as much an image as K separate convolutions); the patches take kh*kw times the
    activations' memory, and their gradient is a ``fold``."""
    w, b = p[f"{name}.weight"], p.get(f"{name}.bias")
    (kh, kw), (sh, sw), (ph, pw) = module.kernel_size, module.stride, module.padding
    n, _, hi, wi = h.shape
    ho, wo = (hi + 2 * ph - kh) // sh + 1, (wi + 2 * pw - kw) // sw + 1
    cols = F.unfold(h, (kh, kw), padding=(ph, pw), stride=(sh, sw))
    out = torch.matmul(w.reshape(1, k, w.shape[1], -1), cols.view(n, k, -1, ho * wo))  # (N, K, C_out, L)
    if b is not None:
        out = out + b.view(1, k, -1, 1)
    return out.reshape(n, -1, ho, wo)


def channels_grads(model: torch.nn.Module, channels_last: bool,
                   conv: Callable[..., torch.Tensor] | None = None) -> Callable[..., dict[str, torch.Tensor]]:
    """Per-client gradients from one backward of the clients' summed losses through the
    model's stacked form alone (``ResNet8.stacked``, no ``vmap``), in ``channels_last`` or not,
    its convolutions by ``conv`` where given (in place of ``grouped_conv``)."""
    from fedrift.models import resnet

    def grads(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
        model.stacked_channels_last, grouped = channels_last, resnet.grouped_conv
        resnet.grouped_conv = conv or grouped
        try:
            logits = model.stacked(leaves, x)  # (K, N, classes)
        finally:
            del model.stacked_channels_last  # the class's again
            resnet.grouped_conv = grouped
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        total = (ce * w.flatten()).sum()
        return dict(zip(leaves, torch.autograd.grad(total, list(leaves.values()))))

    return grads


def update(params: dict[str, torch.Tensor], mom: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
           lr: float = 0.05, wd: float = 1e-5, clip: float = 10.0) -> None:
    """SGD with momentum and weight decay, each client's gradient clipped to norm ``clip``,
    in place on the stacked tensors (the same for every variant)."""
    names = list(params)
    norms = torch.stack([grads[n].flatten(1).pow(2).sum(1) for n in names]).sum(0).sqrt()  # (K,)
    scale = (clip / (norms + 1e-6)).clamp(max=1.0)
    for n in names:
        s = scale.view(-1, *[1] * (grads[n].dim() - 1))
        g = grads[n] * s + wd * params[n]
        mom[n].mul_(0.9).add_(g)
        params[n].sub_(lr * mom[n])


STANDALONE: dict[str, Callable[[torch.nn.Module], Callable[..., dict[str, torch.Tensor]]]] = {
    "channels": lambda model: channels_grads(model, False),
    "channels_last": lambda model: channels_grads(model, True),
    "gemm": lambda model: channels_grads(model, False, gemm_conv),
}
ENGINE = ("vmap", "stacked", "compiled")  # the engine's steps (compiled: engine.compile)
VARIANTS = (*ENGINE, *STANDALONE)


def check(model: torch.nn.Module, tools: Any, device: str, n: int, variants: list[str]) -> dict[str, float]:
    """The variants at K = 3 against ``vmap``: the engine's steps' parameters after one step,
    the standalone variants' gradients; the largest difference over each tensor's largest
    value (raises past 1e-4: a formulation that computes something else is not timed)."""
    from fedrift.engine.local import optimizer_init
    from torch.func import vmap

    params, (x, y, w) = stacked_params(model, 3), batch(3, n, device)
    opt = vmap(lambda p: optimizer_init(tools.optimizer, p, tools.apply))(params)
    payload, inputs = {"params": {k: v.detach() for k, v in model.named_parameters()}}, {"x": x, "y": y, "w": w}
    engine = [v for v in ENGINE[1:] if v in variants]
    after = {v: engine_step(model, tools, v)(params, opt, inputs, payload, {})[0] for v in ("vmap", *engine)}
    ref = vmap_grads(model)(params, x, y, w)
    got = {v: (after[v], after["vmap"]) for v in engine}
    if isinstance(model, ResNet8):  # the channel-group network alone: ResNet-8's
        got.update({name: (make(model)(params, x, y, w), ref) for name, make in STANDALONE.items() if name in variants})
    out = {}
    for name, (a, b) in got.items():
        out[name] = max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in b)
        if out[name] > 1e-4:
            raise AssertionError(f"{name}: differs from vmap's by {out[name]:.2e} (relative)")
    return out


def float64_error(model: torch.nn.Module, device: str, variants: list[str], n: int) -> dict[str, Any]:
    """How far the stacked form's gradients are from float64's, uncompiled and compiled: 3
    clients' summed losses on ``n`` images each (the timed batch), each gradient tensor's largest difference over
    its largest entry; the largest over the model and the first layer's (where a network's
    rounding has grown most). On a GPU this includes cuDNN's TF32 convolutions (torch's default)."""
    from fedrift.engine.stacked_step import compiled_form

    params, (x, y, w) = stacked_params(model, 3), batch(3, n, device)
    forms = {"stacked": type(model).stacked}
    if "compiled" in variants:
        forms["compiled"] = compiled_form(model)

    def grads(form: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        leaves = {n: t.detach().to(dtype).requires_grad_() for n, t in params.items()}
        logits = form(model, leaves, x.to(dtype), "logits")
        total = (F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none") * w.flatten().to(dtype)).sum()
        return dict(zip(leaves, torch.autograd.grad(total, list(leaves.values()))))

    ref = grads(forms["stacked"], torch.float64)
    first = next(iter(ref))
    out = {}
    for name, form in forms.items():
        got = grads(form, torch.float32)
        rel = {k: float((got[k].double() - ref[k]).abs().max() / ref[k].abs().max()) for k in ref}
        out[name] = {"max": max(rel.values()), "worst": max(rel, key=rel.get), f"first_layer ({first})": rel[first]}
    return out


def kernel_table(run: Callable[[], None], reps: int, device: str, top: int = 15) -> dict[str, Any]:
    """``reps`` calls of ``run`` under ``torch.profiler``: the kernels (on a CPU, aten operators'
    own time) by name, the ``top`` by time, each with its calls and microseconds a step and its
    share of the whole; kernels a step and their microseconds a step in all."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}  # name -> [calls, microseconds]
    if device == "cuda":
        for e in prof.events():
            if e.device_type.name == "CUDA":
                got = by_name.setdefault(e.name, [0, 0.0])
                got[0], got[1] = got[0] + 1, got[1] + e.device_time_total
    else:
        by_name = {e.key: [e.count, e.self_cpu_time_total] for e in prof.key_averages() if e.key.startswith("aten::")}
    total = sum(us for _, us in by_name.values()) or 1.0
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"what": "CUDA kernels" if device == "cuda" else "aten operators (their own CPU time)",
            "kernels_per_step": sum(c for c, _ in by_name.values()) / reps, "kernel_us_per_step": total / reps,
            "top": [{"name": name[:140], "calls_per_step": calls / reps, "us_per_step": us / reps, "share": us / total}
                    for name, (calls, us) in rows]}


def time_case(model: torch.nn.Module, tools: Any, variant: str, k: int, n: int, precision: str, device: str, reps: int,
              graphs: bool, profiled: bool = False) -> dict[str, Any]:
    """One case's step, captured (or not) and timed: ms a step over ``reps`` steps; with
    ``profiled``, its kernels too (:func:`kernel_table`)."""
    from fedrift.engine.local import optimizer_init
    from torch.func import vmap
    from torch.utils._pytree import tree_leaves

    params, (x, y, w) = stacked_params(model, k), batch(k, n, device)
    dtype = torch.bfloat16 if precision == "bf16" else None
    if variant in STANDALONE:
        mom = {name: torch.zeros_like(p) for name, p in params.items()}
        grads_of = STANDALONE[variant](model)

        def step() -> None:
            with torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
                g = grads_of(params, x, y, w)
            update(params, mom, g)
    else:
        from dataclasses import replace

        opt = vmap(lambda p: optimizer_init(tools.optimizer, p, tools.apply))(params)
        run_tools = replace(tools, precision=precision)
        fn = engine_step(model, run_tools, variant)
        payload, inputs = {"params": {k: v.detach() for k, v in model.named_parameters()}}, {"x": x, "y": y, "w": w}
        held = tree_leaves((params, opt))

        def step() -> None:  # the step's new tensors written into the held ones (as StepGraphs keeps its buffers)
            new_params, new_opt = fn(params, opt, inputs, payload, {})[:2]
            torch._foreach_copy_(held, tree_leaves((new_params, new_opt)))

    run = step
    if graphs and device == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        step()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / reps
    else:
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        ms = 1e3 * (time.perf_counter() - t0) / reps
    out = {"ms_per_step": ms, "ms_per_client_step": ms / k, "us_per_image": 1e3 * ms / (k * n),
           "images_per_second": 1e3 * k * n / ms}
    if profiled:
        try:
            out["profile"] = kernel_table(run, reps, device)
        except Exception as err:  # noqa: BLE001 - the timing stands; the profile's failure is written down
            out["profile_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-throughput"))
    ap.add_argument("--widths", default="1,4,16,48,96,192", help="clients a step (K)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", default="resnet8", choices=list(MODELS), help="the model (the channel-group "
                    "network alone: resnet8 only)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--eager", action="store_true", help="launch op by op (default on a GPU: one captured graph a step)")
    ap.add_argument("--quick", action="store_true", help="K 1 and 3, batch 8, 2 reps: a check on a CPU")
    ap.add_argument("--series", default="", help="a name for this call's files, step-kernels-<device>[-<model>]-<series>")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN's algorithms timed on each shape, not picked "
                    "by heuristics (torch.backends.cudnn.benchmark, engine.cudnn_benchmark)")
    ap.add_argument("--profile", default="", help="VARIANT:K:PRECISION,...: those cases' kernels by name too "
                    "(torch.profiler over their timed steps)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    profiled = {tuple(c.split(":")) for c in args.profile.split(",") if c}
    if args.device == "cuda" and not torch.cuda.is_available():
        print("step_kernels: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    if args.quick:
        args.widths, args.batch, args.reps = "1,3", 8, 2
    torch.manual_seed(0)
    global SHAPE
    SHAPE = MODELS[args.model][1]
    model = build(args.model, args.device)
    tools = engine_tools(model, args.model, args.device)
    if args.model != "resnet8":
        args.variants = ",".join(v for v in args.variants.split(",") if v not in STANDALONE)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    tag = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:40]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (f"step-kernels-{tag}{'' if args.model == 'resnet8' else '-' + args.model}"
                       f"{'-' + args.series if args.series else ''}.json")
    doc: dict[str, Any] = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "date": str(datetime.date.today()),
                           "batch": args.batch, "graphs": not args.eager and args.device == "cuda",
                           "cudnn_benchmark": args.cudnn_benchmark,
                           "check": check(model, tools, args.device, min(args.batch, 16), args.variants.split(",")), "cases": []}
    print(f"against vmap's (largest relative difference): {doc['check']}", flush=True)
    if isinstance(model, ResNet8):
        doc["gradient_error_vs_float64"] = float64_error(model, args.device, args.variants.split(","), args.batch)
        print(f"gradients against float64's: {doc['gradient_error_vs_float64']}", flush=True)
    for precision in args.precisions.split(","):
        for k in (int(v) for v in args.widths.split(",")):
            for variant in args.variants.split(","):
                case: dict[str, Any] = {"variant": variant, "clients": k, "precision": precision}
                try:
                    case.update(time_case(model, tools, variant, k, args.batch, precision, args.device, args.reps,
                                          doc["graphs"], (variant, str(k), precision) in profiled))
                except Exception as err:  # noqa: BLE001 - written down; the other cases go on
                    case["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                doc["cases"].append(case)
                base = next((c for c in doc["cases"] if c["variant"] == "vmap" and c["clients"] == k
                             and c["precision"] == precision and "ms_per_step" in c), None)
                if base and "ms_per_step" in case:
                    case["x_vmap"] = base["ms_per_step"] / case["ms_per_step"]
                path.write_text(json.dumps(doc, indent=1) + "\n")
                print(json.dumps(case), flush=True)
    lines = [f"# Step kernels, {args.model}, {name} (torch {torch.__version__}, batch {args.batch}, "
             f"{'captured' if doc['graphs'] else 'op by op'}, cuDNN's algorithms "
             f"{'timed' if args.cudnn_benchmark else 'by heuristics'})", "",
             "| precision | clients | variant | ms a step | ms a client-step | us an image | images/s | x vmap |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for c in doc["cases"]:
        if "error" in c:
            lines.append(f"| {c['precision']} | {c['clients']} | {c['variant']} | {c['error']} | | | | |")
        else:
            ratio = f"{c['x_vmap']:.2f}" if "x_vmap" in c else ""  # none where vmap was not timed at this K
            lines.append(f"| {c['precision']} | {c['clients']} | {c['variant']} | {c['ms_per_step']:.2f} | "
                         f"{c['ms_per_client_step']:.3f} | {c['us_per_image']:.2f} | {c['images_per_second']:,.0f} | "
                         f"{ratio} |")
    for c in doc["cases"]:
        if "profile" in c:
            prof = c["profile"]
            lines += ["", f"{c['variant']}, {c['clients']} clients, {c['precision']}: {prof['kernels_per_step']:.0f} "
                      f"{prof['what']} a step, {prof['kernel_us_per_step']:,.0f} us of them", "",
                      "| name | calls a step | us a step | share |", "|---|---:|---:|---:|"]
            lines += [f"| `{r['name'][:90]}` | {r['calls_per_step']:.1f} | {r['us_per_step']:,.1f} | {r['share']:.3f} |"
                      for r in prof["top"]]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
