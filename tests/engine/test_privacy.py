"""Differential privacy (engine/privacy.py): clipping and noise by hand, the FedAvg
identities, the noise's scale, epsilon against dp-accounting, and the refusals."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.func import grad

import fedrift
from agreement import BITS, agree
from fedrift.config import PrivacyConfig
from fedrift.data.partition_base import Partition
from fedrift.functional import rng
from fedrift.engine.privacy import clip_change, dp_grad_and_value, private_mean
from fedrift.errors import ConfigError


def _run(tiny, d, **sections):
    cfg = tiny(**sections)
    cfg["output"]["dir"] += d
    return fedrift.run(cfg)


# ----------------------------------------------------------------------------------------
# Client level


def test_clip_change_by_hand():
    ref = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])}
    moved = {"a": torch.tensor([4.0, 1.0]), "b": torch.tensor([4.0])}  # Delta = (3, 0, 4), norm 5
    out = clip_change(moved, ref, 1.0)
    torch.testing.assert_close(out["a"], torch.tensor([1.6, 1.0]))
    torch.testing.assert_close(out["b"], torch.tensor([0.8]))
    assert clip_change(moved, ref, 10.0) is moved  # inside the ball: untouched
    assert clip_change(moved, ref, None) is moved


@pytest.mark.agreement
@pytest.mark.parametrize("algorithm", [{"name": "fedavg", "aggregation": "uniform"},
                                       {"name": "fedgkd", "M": 2, "aggregation": "uniform"}])
def test_client_level_without_clip_or_noise_is_exactly_uniform_fedavg(tiny, algorithm):
    plain = _run(tiny, "a", algorithm=algorithm, train={"rounds": 3})
    private = _run(tiny, "b", algorithm=algorithm, train={"rounds": 3},
                   privacy={"level": "client", "clip": None, "noise_multiplier": 0.0})
    agree(plain.global_state, private.global_state, BITS)
    assert private.summary["epsilon"] is None  # no noise: no finite guarantee


def test_client_noise_has_the_stated_scale():
    """m identical uploads equal to the reference: the mean's offset is the noise alone,
    N(0, (z S / m)^2) per coordinate; 200,000 coordinates pin its std to within 1%."""
    ref = {"w": torch.zeros(200_000)}
    pc = PrivacyConfig(level="client", clip=0.5, noise_multiplier=1.2)
    up, weight = private_mean([{"params": ref}] * 4, ref, pc, seed=3, round_=7, name="fedavg")
    assert torch.equal(weight, torch.ones(1, dtype=torch.float64)) and up["params"]["w"].shape == (1, 200_000)
    noise = up["params"]["w"][0]
    want = 1.2 * 0.5 / 4
    assert abs(float(noise.std()) / want - 1) < 0.01
    assert abs(float(noise.mean())) < 5 * want / math.sqrt(200_000)
    again, _ = private_mean([{"params": ref}] * 4, ref, pc, seed=3, round_=7, name="fedavg")
    assert torch.equal(again["params"]["w"], up["params"]["w"])  # a pure function of (seed, round)


def test_client_level_epsilon_is_the_accountants(tiny):
    res = _run(tiny, "", train={"rounds": 3, "clients_per_round": 3},
               privacy={"level": "client", "clip": 1.0, "noise_multiplier": 1.5, "delta": 1e-4})
    import dp_accounting  # scipy: seconds to import, in the one test process that runs this

    acc = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(3 / 6, dp_accounting.GaussianDpEvent(1.5))
    eps = []
    for _ in range(3):
        acc.compose(event)
        eps.append(acc.get_epsilon(1e-4))
    assert [r["epsilon"] for r in res.history] == eps
    assert res.summary["epsilon"] == eps[-1] and res.summary["delta"] == 1e-4
    assert eps[0] < eps[1] < eps[2]


# ----------------------------------------------------------------------------------------
# Sample level


def _logreg():
    g = torch.Generator().manual_seed(0)
    params = {"fc.weight": torch.randn(3, 4, generator=g), "fc.bias": torch.randn(3, generator=g)}
    batch = {"x": 3 * torch.randn(5, 4, generator=g), "y": torch.tensor([0, 1, 2, 0, 1]),
             "w": torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0])}  # the last row: padding
    return params, batch


def _loss(params, batch, payload, ctx):
    logits = batch["x"] @ params["fc.weight"].T + params["fc.bias"]
    ce = torch.nn.functional.cross_entropy(logits, batch["y"], reduction="none")
    return (batch["w"] * ce).sum(), {"ce": (batch["w"] * ce).sum()}


def test_dp_sgd_gradient_by_hand():
    """sum_i w_i clip(g_i) + z C max(w) xi, with each g_i taken on its own (a loop here)."""
    params, batch = _logreg()
    noise = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in params.items()}
    C, z = 0.1, 0.7
    grads, (loss, aux) = dp_grad_and_value(_loss, C, z)(params, {**batch, "dp_noise": noise}, {}, {})
    want = {k: z * C * 0.25 * noise[k] for k in params}
    clipped = 0
    for i in range(4):
        one = {"x": batch["x"][i : i + 1], "y": batch["y"][i : i + 1], "w": torch.ones(1)}
        g = grad(lambda p: _loss(p, one, {}, {})[0])(params)
        norm = math.sqrt(sum(float(v.pow(2).sum()) for v in g.values()))
        clipped += norm > C
        for k in params:
            want[k] = want[k] + 0.25 * g[k] * min(1.0, C / norm)
    assert 0 < clipped < 4  # samples inside and outside the ball
    for k in params:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, _loss(params, batch, {}, {})[0])


def test_dp_sgd_without_clipping_or_noise_is_the_batch_gradient():
    """A clip no gradient reaches and zero noise: the per-sample sum is the batch gradient
    (the same sum in another order: float32 rounding, a few units in the last place)."""
    params, batch = _logreg()
    zero = {k: torch.zeros_like(v) for k, v in params.items()}
    grads, _ = dp_grad_and_value(_loss, 1e9, 0.0)(params, {**batch, "dp_noise": zero}, {}, {})
    want = grad(lambda p: _loss(p, batch, {}, {})[0])(params)
    for k in params:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.agreement
def test_sample_level_without_clip_or_noise_is_exactly_fedavg(tiny):
    plain = _run(tiny, "a", train={"rounds": 2})
    private = _run(tiny, "b", train={"rounds": 2}, privacy={"level": "sample", "clip": None, "noise_multiplier": 0.0})
    agree(plain.global_state, private.global_state, BITS)


def test_step_noise_is_standard_normal_and_pure():
    shapes = [("a", (300, 300)), ("b", (50_000,))]
    n1 = rng.gaussian(shapes, torch.device("cpu"), 0, rng.PRIVACY_SAMPLE, 1, 2, 3)
    n2 = rng.gaussian(shapes, torch.device("cpu"), 0, rng.PRIVACY_SAMPLE, 1, 2, 3)
    n3 = rng.gaussian(shapes, torch.device("cpu"), 0, rng.PRIVACY_SAMPLE, 1, 2, 4)
    flat = torch.cat([n1["a"].reshape(-1), n1["b"]])
    assert abs(float(flat.std()) - 1) < 0.01 and abs(float(flat.mean())) < 5 / math.sqrt(flat.numel())
    assert torch.equal(n1["a"], n2["a"]) and not torch.equal(n1["a"], n3["a"])


@pytest.mark.process
@pytest.mark.agreement
def test_sample_level_epsilon_and_executors_agree(tiny):
    """epsilon: the smallest client's rate B/n and steps, every round; processes equals
    sequential bit for bit (one thread); batched agrees within 1e-3, far below what one step
    of misplaced noise moves (lr z C / B = 0.05 x 1.1 x 1 / 8 = 7e-3 per coordinate)."""
    runs = {ex: _run(tiny, ex, train={"rounds": 2, "batch_size": 8}, privacy={"level": "sample", "noise_multiplier": 1.1},
                     engine={"executor": ex, "threads": 1, **({"workers": 2} if ex == "processes" else {})})
            for ex in ("sequential", "processes", "batched")}
    agree(runs["sequential"].global_state, runs["processes"].global_state, BITS)
    for k, v in runs["sequential"].global_state.items():  # vmap sums in another order; the noise's
        torch.testing.assert_close(runs["batched"].global_state[k], v, rtol=0, atol=1e-3)  # step is lr z C / B = 7e-3
    n = int(Partition.load(runs["sequential"].output_dir / "partition.json").sizes().min())
    import dp_accounting  # scipy: seconds to import, in the one test process that runs this

    acc = dp_accounting.rdp.RdpAccountant()
    step = dp_accounting.PoissonSampledDpEvent(8 / n, dp_accounting.GaussianDpEvent(1.1))
    acc.compose(dp_accounting.SelfComposedDpEvent(step, math.ceil(n / 8)), 2)  # tiny: one local epoch
    assert runs["sequential"].summary["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)


# ----------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("level,algorithm,sampling,says", [
    ("client", "fedcsd", "uniform", "pre-phase"),
    ("client", "fedproto", "uniform", "personal"),
    ("sample", "fedproto", "uniform", "after them"),
    ("sample", "fedrs", "uniform", "label counts"),
    ("sample", "fedavg", "class_coverage", "engine.sampling"),
])
def test_refused_before_anything_is_written(tiny, level, algorithm, sampling, says):
    cfg = tiny(algorithm={"name": algorithm}, privacy={"level": level}, engine={"sampling": sampling})
    with pytest.raises(ConfigError, match=says):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()


@pytest.mark.parametrize("algorithm", ["scaffold", "fednova", "feddistill_plus", "fedgen"])
def test_client_level_refuses_uploads_beyond_the_model(tiny, algorithm, monkeypatch):
    """Known before the run (nothing written); an algorithm not in the list (a plugin's) is
    refused at its first upload all the same."""
    from fedrift.engine import privacy

    cfg = tiny(algorithm={"name": algorithm}, privacy={"level": "client"})
    with pytest.raises(ConfigError, match=privacy.UPLOADS_MORE[algorithm].split(",")[0]):
        fedrift.run(cfg)
    assert not Path(cfg["output"]["dir"]).exists()
    monkeypatch.delitem(privacy.UPLOADS_MORE, algorithm)
    with pytest.raises(ConfigError, match=r"uploads more \(" + privacy.UPLOADS_MORE.get(algorithm, "")):
        fedrift.run(cfg)


@pytest.mark.process
def test_cli_refusal_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedrift.cli", "run", "-c", "examples/demo.yaml", "privacy.level=client",
                           "privacy.clip=null", f"output.dir={tmp_path / 'r'}"], capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "privacy.clip" in proc.stderr
