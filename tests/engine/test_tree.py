import torch

from fedrift.engine.tree import stack, tree_bytes, weighted_sum


def test_tree_bytes_counts_a_shared_tensor_once():
    w = torch.zeros(10)  # 40 bytes
    assert tree_bytes({"params": {"w": w}}) == 40
    assert tree_bytes({"params": {"w": w}, "teacher": {"w": w}}) == 40
    assert tree_bytes({"params": {"w": w}, "teacher": {"w": w.clone()}}) == 80
    assert tree_bytes({"a": torch.zeros(3, dtype=torch.float64)}) == 24


def test_weighted_sum_by_hand():
    trees = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}]
    out = weighted_sum(stack(trees), torch.tensor([0.25, 0.75]))
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0]))


def test_unstack_inverts_stack():
    from fedrift.engine.tree import stack, unstack

    trees = [{"w": torch.full((2, 3), float(k)), "s": {"b": torch.tensor([k, -k])}} for k in range(3)]
    back = unstack(stack(trees))
    assert len(back) == 3
    for a, b in zip(trees, back):
        assert torch.equal(a["w"], b["w"]) and torch.equal(a["s"]["b"], b["s"]["b"])
