"""The hooks FedAvg leaves unused, exercised by a toy algorithm with hand-checkable effects."""

import pytest
import torch

import fedrift
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams
from fedrift.algorithms.fedavg import ce_loss
from fedrift.engine.sampling import SAMPLERS
from fedrift.functional.tree import weighted_sum
from fedrift.models import MODELS, build_model
from fedrift.registry import Entry

C = 10  # digits classes


def _toy(hp, setup):
    def init_server(params):
        return {"params": params, "visits": torch.zeros(setup.num_clients)}

    def client_summary(payload, ctx, data, apply):
        return {"counts": torch.bincount(data.y, minlength=C).float()}

    def pre_combine(payload, summaries, weights):
        return {"global_counts": summaries["counts"].sum(0)}

    def client_start(payload, ctx, data, apply):
        # the pre-phase result is in the payload, and the engine's label counts agree with the data
        assert torch.equal(ctx["label_counts"], torch.bincount(data.y, minlength=C).float())
        return {"share": ctx["label_counts"] / payload["global_counts"].clamp(min=1)}

    def local_loss(params, batch, payload, ctx, apply):
        loss, aux = ce_loss(params, batch, payload, ctx, apply)
        return loss + 0.0 * ctx["share"].sum(), aux

    def grad_correction(grads, params, payload, ctx):
        return {k: 0.0 * g for k, g in grads.items()}  # freezes training: the model must not move

    def client_result(payload, end, ctx):
        visits = ctx["state"]["visits"] + 1
        return {"params": end, "visits": visits}, {"visits": visits}

    def aggregate(state, uploads, weights, info):
        visits = state["visits"].clone()
        visits[list(info.sampled)] = uploads["visits"]
        return {**state, "params": weighted_sum(uploads["params"], weights), "visits": visits}

    return Algorithm(
        name="toy", hparams=hp, local_loss=local_loss, init_server=init_server,
        init_client=lambda params: {"visits": torch.tensor(0.0)}, client_summary=client_summary,
        pre_combine=pre_combine, client_start=client_start, grad_correction=grad_correction,
        client_result=client_result, aggregate=aggregate,
    )


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ALGORITHMS._entries, "toy", Entry("toy", _toy, "test only", AlgorithmParams))


def test_state_prephase_and_corrections_flow_through_the_engine(tiny, toy):
    rounds = 4
    result = fedrift.run(tiny(algorithm={"name": "toy"}, train={"rounds": rounds, "momentum": 0.0, "weight_decay": 0.0}))
    # client state persisted across rounds: visits == times sampled
    expected = torch.zeros(6)
    for t in range(1, rounds + 1):
        for k in SAMPLERS.get("uniform").factory(6, 3, 0, t, None):
            expected[k] += 1
    assert torch.equal(result.server_state["visits"], expected)
    # grad_correction zeroed every step: the global model is the initial one
    init = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), (1, 8, 8), C, seed=0)
    for k, v in init.named_parameters():  # equal up to the rounding of sum_k p_k w (one training step moves ~1e-3)
        torch.testing.assert_close(result.global_state[k], v.detach(), rtol=0, atol=1e-6)
    # bytes: down = 3 x (params) + 3 x global_counts; up = 3 x (params + visits) + 3 x counts
    pbytes = sum(v.numel() * 4 for v in result.global_state.values())
    row = result.history[-1]
    assert row["bytes_down"] == 3 * pbytes + 3 * C * 4
    assert row["bytes_up"] == 3 * (pbytes + 4) + 3 * C * 4


def test_a_pre_phase_needs_both_of_its_hooks():
    with pytest.raises(ValueError, match="client_summary and pre_combine"):
        Algorithm(name="half", hparams=None, local_loss=ce_loss, client_summary=lambda *a: {})
    with pytest.raises(ValueError, match="client_summary and pre_combine"):
        Algorithm(name="half", hparams=None, local_loss=ce_loss, pre_combine=lambda *a: {})


def test_step_noise_is_a_pure_function_whose_rows_ignore_padding():
    from fedrift.functional.rng import step_noise

    a = step_noise(0, 2, 5, 3, rows=4, dim=8, device=torch.device("cpu"))
    assert torch.equal(a, step_noise(0, 2, 5, 3, rows=4, dim=8, device=torch.device("cpu")))
    assert torch.equal(a, step_noise(0, 2, 5, 3, rows=10, dim=8, device=torch.device("cpu"))[:4])
    for other in [(1, 2, 5, 3), (0, 3, 5, 3), (0, 2, 6, 3), (0, 2, 5, 4)]:
        assert not torch.equal(a, step_noise(*other, rows=4, dim=8, device=torch.device("cpu")))
    assert a.dtype == torch.float32 and abs(float(step_noise(0, 1, 1, 1, 4000, 8, torch.device("cpu")).std()) - 1) < 0.05
