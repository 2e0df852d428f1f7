"""BatchNorm models (``model.norm: batch``, ``models/norm.py``): the running statistics are
model state the engine carries. Executors agree (processes = sequential bit for bit, batched
to float rounding with padded and masked steps), the server's statistics are the weighted
average of the uploaded ones whatever the algorithm does with parameters, only the trained
model's call updates them, evaluation and teachers run in eval mode, checkpoints carry them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from agreement import BITS, agree, untimed
from conftest import ctrl_c_in_round, one_line_refusal

import fedrift
from fedrift.algorithms.base import Algorithm
from fedrift.algorithms.terms import weighted_ce
from fedrift.api import prepare, run_prepared
from fedrift.data.partition_base import Partition
from fedrift.engine.build import build_run
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.local import make_apply, make_step, optimizer_init
from fedrift.functional.optim import sgd
from fedrift.engine.outputs import RunWriter
from fedrift.engine.server import Server
from fedrift.models import build_model
from fedrift.models.norm import model_state, running_stat_names
from fedrift.models.resnet import ResNetParams

BN = {"name": "resnet8", "width": 4, "norm": "batch"}  # digits are 1x8x8: the smallest a ResNet takes


def _bn(tiny, tmp_path, ex: str = "sequential", model: dict | None = None, **sections) -> dict:
    return tiny(model=model or BN, engine={"executor": ex, "threads": 1, "workers": 2, **sections.pop("engine", {})},
                output={"dir": str(tmp_path / ex), "progress": False}, **sections)


def _stats(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var"))}


@pytest.mark.process
@pytest.mark.agreement
@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "moon", "mu": 1.0}])
def test_executors_agree_and_statistics_travel(tiny, tmp_path, algorithm):
    """Two rounds: processes equals sequential bit for bit (statistics, MOON's previous models
    with theirs, metrics); batched equals it to float rounding; the statistics moved off their
    initial values and num_batches_tracked stayed 0 (module docstring)."""
    model = {**BN, "projection_dim": 8} if algorithm["name"] == "moon" else BN
    runs = {ex: fedrift.run(_bn(tiny, tmp_path, ex, model, algorithm=algorithm))
            for ex in ("sequential", "processes", "batched")}
    seq, par, bat = (runs[k] for k in ("sequential", "processes", "batched"))
    stats = _stats(seq.global_state)
    assert len(stats) == 2 * 9  # resnet8: stem, 2 + 3 + 3 block norms (two with a shortcut)
    assert not torch.equal(stats["stem_norm.running_mean"], torch.zeros(4))
    assert not torch.equal(stats["stem_norm.running_var"], torch.ones(4))
    assert int(seq.global_state["stem_norm.num_batches_tracked"]) == 0
    agree(seq.global_state, par.global_state, BITS)
    agree(untimed(seq.history), untimed(par.history), BITS)
    agree(seq.global_state, bat.global_state)
    agree(untimed(seq.history), untimed(bat.history))


@pytest.mark.agreement
def test_padded_and_masked_steps_leave_statistics_as_sequential(tiny, tmp_path):
    """Clients of 1, 2, 3 and 150 samples in one vectorised group: padded last batches (zero
    weight rows kept out of the batch statistics) and masked steps (statistics kept)."""
    results = {}
    for ex in ("sequential", "batched"):
        prep = prepare(_bn(tiny, tmp_path, ex, train={"rounds": 2, "clients_per_round": 4, "local_epochs": 2,
                                                      "batch_size": 8}))
        ix = np.random.default_rng(0).permutation(prep.dataset.num_train)
        cuts = np.cumsum([0, 1, 2, 3, 150])
        train = [np.sort(ix[a:b]) for a, b in zip(cuts, cuts[1:])]
        prep = dataclasses.replace(prep, partition=Partition("manual", train, [np.arange(10)] * 4))
        results[ex] = run_prepared(prep)
    agree(results["sequential"].global_state, results["batched"].global_state)
    agree(untimed(results["sequential"].history), untimed(results["batched"].history))


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedavgm", "beta": 0.9, "eta_s": 2.0},
                                       {"name": "feddyn", "alpha": 0.1}])
@pytest.mark.parametrize("aggregation", ["samples", "uniform"])
def test_server_statistics_are_the_weighted_average_of_the_uploads(tiny, tmp_path, algorithm, aggregation):
    """Round by round, the new global statistics are ``sum_k p_k s_k`` over what the clients
    uploaded (p_k = n_k / sum n_j, or 1/K), computed here by hand in float64, even where the
    algorithm's server rule moves the parameters elsewhere (FedAvgM's momentum, FedDyn's h)."""
    prep = prepare(_bn(tiny, tmp_path, algorithm={**algorithm, "aggregation": aggregation},
                       train={"rounds": 2, "clients_per_round": 3}))
    model, alg = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(Path(prep.config.output.dir), overwrite=False)
    server = Server(prep.config, fed, model, alg, writer)
    keys = running_stat_names(model)
    try:
        for t in server.rounds():
            rnd = server.open(t)
            outputs = SequentialExecutor().run_round(rnd.tools, rnd.payload, rnd.jobs, t)
            uploads = [{k: o.upload["params"][k].double() for k in keys} for o in outputs]
            n = torch.tensor([float(fed.sizes[o.client_id]) for o in outputs], dtype=torch.float64)
            p = torch.full_like(n, 1 / len(n)) if aggregation == "uniform" else n / n.sum()
            expected = {k: sum(pk * u[k] for pk, u in zip(p, uploads)) for k in keys}
            params_mean = {k: sum(pk * o.upload["params"][k].double() for pk, o in zip(p, outputs))
                           for k in ("stem.weight",)}
            server.close(rnd, outputs, [])
            got = server.state["params"]
            for k in keys:
                assert torch.allclose(got[k].double(), expected[k], rtol=1e-6, atol=1e-7), k
                assert bool((got[k] > 0).all()) if k.endswith("running_var") else True
            moved = not torch.allclose(got["stem.weight"].double(), params_mean["stem.weight"], rtol=1e-6, atol=1e-7)
            assert moved == (algorithm["name"] != "fedavg")  # the parameters follow the algorithm's own rule
    finally:
        server.release()
        writer.close()
        writer.release()


def _toy(params_calls: list[str]) -> Algorithm:
    """FedAvg's cross-entropy, plus calls on the broadcast model and on a 'previous model' in
    ctx (as MOON's and FedGKD's losses make) whose outputs do not enter the loss."""

    def local_loss(params, batch, payload, ctx, apply):
        apply(payload["params"], batch["x"])  # fixed models: eval mode
        apply(ctx["prev"], batch["x"], mode="features")
        params_calls.append("trained")
        return weighted_ce(apply(params, batch["x"]), batch["y"], batch["w"]), {}

    return Algorithm(name="toy", hparams=None, local_loss=local_loss)


@pytest.mark.agreement
def test_only_the_trained_models_call_updates_statistics():
    """One local step: the statistics it returns are torch.nn.BatchNorm2d's train-mode update
    from the trained model's call alone (the two fixed models' calls leave them and their own
    statistics unchanged); weight decay and momentum never touch them; the parameters get the
    gradient of the train-mode forward pass."""
    torch.manual_seed(0)
    model = build_model("resnet8", ResNetParams(width=4, norm="batch"), (1, 8, 8), 3, seed=0)
    state = model_state(model)
    state = {k: (v + 0.3 if k.endswith("running_mean") else v * 1.7 if k.endswith("running_var") else v)
             for k, v in state.items()}
    prev = {k: v.clone() + 0.1 for k, v in state.items()}
    apply = make_apply(model, dict(model.named_buffers()))
    opt = sgd(0.1, momentum=0.9, weight_decay=0.1)
    calls: list[str] = []
    step = make_step(_toy(calls), apply, opt)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    batch = {"x": x, "y": y, "w": torch.full((6,), 1 / 6)}
    before = {k: v.clone() for k, v in state.items()}
    new, _, loss, _ = step(dict(state), optimizer_init(opt, state, apply), batch, {"params": state}, {"prev": prev})
    assert calls == ["trained"]
    assert all(torch.equal(before[k], state[k]) for k in state)  # the broadcast model: untouched
    # the reference: torch's own BatchNorm in train mode, one forward pass from the same state
    ref = build_model("resnet8", ResNetParams(width=4, norm="batch"), (1, 8, 8), 3, seed=0)
    for (name, m), (_, r) in zip(model.named_modules(), ref.named_modules()):
        if isinstance(m, torch.nn.BatchNorm2d):
            torch_bn = torch.nn.BatchNorm2d(m.num_features)
            parent, _, leaf = name.rpartition(".")
            setattr(ref.get_submodule(parent) if parent else ref, leaf, torch_bn)
    ref.load_state_dict({**model.state_dict(), **state}, strict=True)
    ref.train()
    logits = ref(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    agree({k: new[k] for k in running_stat_names(model)}, {k: dict(ref.named_buffers())[k] for k in running_stat_names(model)})
    grads = dict(ref.named_parameters())
    first = "stem.weight"  # SGD from zero momentum: w - lr (g + wd w)
    expected = state[first] - 0.1 * (grads[first].grad + 0.1 * state[first])
    assert torch.allclose(new[first], expected, rtol=1e-4, atol=1e-6)
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert list(new) == list(state)  # the model state's order: parameters, then statistics


@pytest.mark.agreement
def test_evaluation_and_teachers_use_running_statistics(tiny, tmp_path):
    """The reported test accuracy and loss are those of the final model in eval mode (torch's
    own BatchNorm loaded with final_model.pt), which differ from batch statistics' outputs."""
    cfg = _bn(tiny, tmp_path, train={"rounds": 2, "clients_per_round": 3})
    result = fedrift.run(cfg)
    prep = prepare(cfg)
    ref = build_model("resnet8", ResNetParams(width=4, norm="batch"), prep.dataset.input_shape,
                      prep.dataset.num_classes, seed=0)
    ref.load_state_dict(torch.load(result.output_dir / "final_model.pt"), strict=True)
    x, y = prep.dataset.inputs(prep.dataset.x_test), prep.dataset.y_test
    ref.eval()
    with torch.no_grad():
        logits = ref(x)
        ref.train()
        batch_logits = ref(x)
    last = result.history[-1]
    assert last["test_accuracy"] == pytest.approx((logits.argmax(1) == y).double().mean().item(), abs=1e-12)
    assert last["test_loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits.double(), y).item(), rel=1e-5)
    assert not torch.allclose(logits, batch_logits, atol=1e-3)  # so the test tells the two apart
    # a teacher (FedGKD) runs the buffered model the same way: apply on a model state is eval mode
    model, _ = build_run(prep)
    apply = make_apply(model, dict(model.named_buffers()))
    final = {k: v for k, v in result.global_state.items() if not k.endswith("num_batches_tracked")}
    with torch.no_grad():
        agree(apply(final, x[:50]), logits[:50])


@pytest.mark.agreement
def test_checkpoint_and_resume_carry_statistics_exactly(tiny, tmp_path):
    """Ctrl-C in round 3, resumed from round 2's checkpoint: the same bits as an uninterrupted
    run, global statistics and MOON's previous models (client states) with theirs."""
    sections = dict(model={**BN, "projection_dim": 8}, algorithm={"name": "moon"},
                    train={"rounds": 4, "clients_per_round": 3})
    ref = fedrift.run(_bn(tiny, tmp_path / "whole", **sections))
    cfg = _bn(tiny, tmp_path / "stopped", engine={"checkpoint_every": 2}, **sections)
    with pytest.MonkeyPatch.context() as mp_:
        ctrl_c_in_round(mp_, 3)
        with pytest.raises(KeyboardInterrupt):
            fedrift.run(cfg)
    resumed = fedrift.resume(cfg["output"]["dir"])
    assert resumed.summary["resumed_from_round"] == 2
    assert _stats(resumed.global_state)
    agree(ref.global_state, resumed.global_state, BITS)
    agree(untimed(ref.history), untimed(resumed.history), BITS)


@pytest.mark.process
@pytest.mark.agreement
def test_the_cnn_with_batchnorm_keeps_every_layers_statistics_and_executors_agree(tiny, tmp_path):
    """``cnn`` with ``norm: batch`` (FedBN's model on workload D): BatchNorm after both
    convolutions, carried like ResNet-8's; processes equals sequential bit for bit, batched to
    float rounding; FedBN keeps both layers on the clients. The default CNN has none."""
    cnn = {"name": "cnn", "hidden": 16, "norm": "batch"}
    runs = {ex: fedrift.run(_bn(tiny, tmp_path, ex, cnn)) for ex in ("sequential", "processes", "batched")}
    seq = runs["sequential"]
    stats = _stats(seq.global_state)
    assert sorted(stats) == sorted(f"{n}.{s}" for n in ("norm1", "norm2") for s in ("running_mean", "running_var"))
    assert stats["norm2.running_mean"].shape == (64,)
    assert not torch.equal(stats["norm2.running_var"], torch.ones(64))
    agree(seq.global_state, runs["processes"].global_state, BITS)
    agree(seq.global_state, runs["batched"].global_state)
    fedbn = fedrift.run(_bn(tiny, tmp_path / "fedbn", model=cnn, algorithm={"name": "fedbn"}))
    for key in stats:  # the server's are the initial statistics: every client keeps its own
        initial = torch.zeros(32 if "norm1" in key else 64) if key.endswith("mean") else torch.ones(32 if "norm1" in key else 64)
        assert torch.equal(fedbn.global_state[key], initial), key
    plain = fedrift.run(_bn(tiny, tmp_path / "plain", model={"name": "cnn", "hidden": 16}))
    assert not _stats(plain.global_state) and not any("norm" in k for k in plain.global_state)


@pytest.mark.agreement
def test_norm_group_is_the_default_and_unchanged(tiny, tmp_path):
    """``norm`` left out is ``group``: the same run, bit for bit, as ``norm: group`` spelled out,
    with no statistics in the model state."""
    a = fedrift.run(_bn(tiny, tmp_path / "a", model={"name": "resnet8", "width": 4}))
    b = fedrift.run(_bn(tiny, tmp_path / "b", model={"name": "resnet8", "width": 4, "norm": "group"}))
    assert not _stats(a.global_state)
    agree(a.global_state, b.global_state, BITS)


@pytest.mark.parametrize("args, key", [
    (["privacy.level=sample", "privacy.clip=1.0", "privacy.noise_multiplier=1.0"], "privacy.level"),
    (["privacy.level=client", "privacy.clip=1.0", "privacy.noise_multiplier=1.0"], "privacy.level"),
    (["eval.personalize=true"], "eval.personalize"),
])
def test_refusals_are_one_line(tmp_path, capsys, args, key):
    base = ["data.name=digits", "model.name=resnet8", "model.width=4", "model.norm=batch", "train.rounds=1",
            "partition.num_clients=4", "train.clients_per_round=2", f"output.dir={tmp_path / 'run'}", "output.progress=false"]
    line = one_line_refusal(capsys, ["run", *base, *args], key, "batch")
    assert "allowed" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.agreement
def test_flower_records_carry_statistics(tiny, tmp_path):
    """The Flower transport (deploy/flower.py): the payload, the uploads and the devices' own
    client states (MOON's previous models) go through Flower records, the devices start from
    their own initial model state; the result equals the in-process run bit for bit."""
    from fedrift.deploy.flower import Device, decode, encode
    from fedrift.engine.client import train_client
    from fedrift.engine.executors.base import ClientOutput
    from fedrift.engine.teacher import with_teacher

    sections = dict(model={**BN, "projection_dim": 8}, algorithm={"name": "moon"})
    ref = fedrift.run(_bn(tiny, tmp_path / "ref", **sections))
    cfg = _bn(tiny, tmp_path / "flower", **sections)
    prep = prepare(cfg)
    model, alg = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(Path(prep.config.output.dir), overwrite=False)
    server = Server(prep.config, fed, model, alg, writer, clients_build_teacher=True, prephase_on_clients=True)
    devices: dict[int, Device] = {}
    held: dict[int, dict] = {}  # each device's client state, as its records keep it
    wire = lambda tree, name: decode(encode(tree, name), name)  # noqa: E731
    try:
        for t in server.rounds():
            rnd = server.open(t)
            outputs = []
            for job in rnd.jobs:
                k = job.client_id
                dev = devices.setdefault(k, Device(cfg, None, k))
                assert set(running_stat_names(model)) <= set(dev.params)
                state = held.get(k) or alg.init_client(dev.params)
                payload = wire(rnd.payload, "payload")
                assert set(running_stat_names(model)) <= set(payload["params"])
                mine = client_job(dev.fed, k, state, dev.cfg.train, dev.cfg.seed, t)
                out = train_client(with_teacher(dev.tools, payload, [mine], True), payload, mine, t)
                held[k] = wire(out.state, "state")
                outputs.append(ClientOutput(k, wire(out.upload, "upload"), None, out.loss, out.aux, {}))
            server.close(rnd, outputs, [])
    finally:
        server.release()
        writer.close()
        writer.release()
    final = server.result().global_params
    assert _stats(final)
    agree(final, {k: ref.global_state[k] for k in final}, BITS)
    assert any(not torch.equal(s["prev"]["stem_norm.running_var"], torch.ones(4)) for s in held.values())
