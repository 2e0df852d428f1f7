"""``train.precision: bf16``: local training under bfloat16 autocast, the rest in float32."""

import pytest
import torch

import fedrift
from agreement import agree
from fedrift.errors import ConfigError


def test_bf16_trains_as_well_as_fp32_on_a_small_case(tiny, tmp_path):
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[precision] = fedrift.run(tiny(train={"rounds": 3, "precision": precision},
                                           output={"dir": str(tmp_path / precision)}))
    fp32, bf16 = runs["fp32"], runs["bf16"]
    # it is another arithmetic (the models differ) ...
    assert any(not torch.equal(fp32.global_state[k], bf16.global_state[k]) for k in fp32.global_state)
    # ... that learns as fp32 does on this case, within a few points
    assert bf16.summary["final_accuracy"] > 0.5
    assert bf16.summary["final_accuracy"] == pytest.approx(fp32.summary["final_accuracy"], abs=0.05)
    # parameters stay float32
    assert all(v.dtype == torch.float32 for v in bf16.global_state.values() if v.is_floating_point())


@pytest.mark.agreement
@pytest.mark.parametrize("executor,model", [
    ("batched", None), ("stacked", None),
    ("batched", {"name": "fedadc_cnn", "channels": [4, 4, 6, 6], "hidden": [16, 12, 8]}),  # R2's model, narrowed
])
def test_bf16_under_vmap_is_close_to_bf16_one_client_at_a_time(tiny, tmp_path, executor, model):
    """Under bf16 the stacked and batched executors step through the model's stacked form (the
    MLP's, FedADC's CNN's: engine/stacked_step.py), so one round's bf16 training equals the
    sequential executor's to float rounding, not only to bfloat16's (0.0 apart here; vmap's own
    step was 1e-2 of a tensor's largest value away: under vmap and autocast F.linear with a bias
    returns float32, pytorch/pytorch issue 192617), and is not fp32's training."""
    def run(precision, ex):
        return fedrift.run(tiny(train={"rounds": 1, "precision": precision}, engine={"executor": ex},
                                output={"dir": str(tmp_path / f"{precision}-{ex}")},
                                **({"model": model} if model else {}))).global_state

    ref, got, fp32 = run("bf16", "sequential"), run("bf16", executor), run("fp32", executor)
    agree(ref, got)
    assert any(not torch.equal(got[k], fp32[k]) for k in got)


def test_an_unknown_precision_is_refused_in_one_line(tiny):
    with pytest.raises(ConfigError, match=r"train.precision.*fp32.*bf16"):
        fedrift.run(tiny(train={"precision": "fp16"}))
