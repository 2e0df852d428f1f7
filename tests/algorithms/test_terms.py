import math

import pytest
import torch
from agreement import agree

from fedrift.algorithms.terms import kl_to_target, logit_mse


def test_kl_by_hand_and_its_zeros():
    target = torch.tensor([[0.5, 0.5, 0.0]])
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))  # softmax gives (0.25, 0.25, 0.5)
    w = torch.tensor([1.0])
    # KL = 0.5 log(0.5/0.25) * 2 = log 2; the zero target entry contributes nothing
    assert math.isclose(kl_to_target(target, logits, w).item(), math.log(2), rel_tol=1e-6)
    assert kl_to_target(torch.softmax(logits, -1), logits, w).abs().item() < 1e-7
    # temperature divides the logits
    assert math.isclose(kl_to_target(target, 2 * logits, w, T=2.0).item(), math.log(2), rel_tol=1e-6)


@pytest.mark.agreement
def test_weights_mask_and_scale_samples():
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z = torch.tensor([[0.0, 0.0], [3.0, -1.0]])
    each = [kl_to_target(t[i : i + 1], z[i : i + 1], torch.ones(1)) for i in range(2)]
    both = kl_to_target(t, z, torch.tensor([0.25, 0.0]))
    agree(both, 0.25 * each[0])
    assert torch.allclose(logit_mse(z, torch.zeros_like(z), torch.tensor([0.0, 1.0])), torch.tensor(5.0))
