import pytest
import torch

from fedrift.functional.tree import stack, tree_bytes, weighted_sum


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
    from fedrift.functional.tree import stack, unstack

    trees = [{"w": torch.full((2, 3), float(k)), "s": {"b": torch.tensor([k, -k])}} for k in range(3)]
    back = unstack(stack(trees))
    assert len(back) == 3
    for a, b in zip(trees, back):
        assert torch.equal(a["w"], b["w"]) and torch.equal(a["s"]["b"], b["s"]["b"])


def test_the_upload_stack_reuses_its_memory_only_when_nothing_holds_it():
    from fedrift.engine.server import UploadStack

    def uploads(seed):
        g = torch.Generator().manual_seed(seed)
        return [{"params": {"w": torch.randn(3, 2, generator=g)}} for _ in range(4)]

    reuse = UploadStack(reuse=True)
    first = reuse(uploads(0))
    reuse.release_if_held({"params": {"w": first["params"]["w"].sum(0)}})  # a new tensor: not held
    second = reuse(uploads(1))
    assert second["params"]["w"].data_ptr() == first["params"]["w"].data_ptr()
    assert torch.equal(second["params"]["w"], torch.stack([u["params"]["w"] for u in uploads(1)]))
    reuse.release_if_held({"kept": second["params"]["w"][0]})  # the state keeps a view of a row
    third = reuse(uploads(2))
    assert third["params"]["w"].data_ptr() != second["params"]["w"].data_ptr()
    assert torch.equal(second["params"]["w"], torch.stack([u["params"]["w"] for u in uploads(1)]))
    assert reuse(uploads(3) + uploads(4))["params"]["w"].shape == (8, 3, 2)  # other shapes: a new stack

    fresh = UploadStack(reuse=False)
    a, b = fresh(uploads(0)), fresh(uploads(1))
    assert a["params"]["w"].data_ptr() != b["params"]["w"].data_ptr()
    assert torch.equal(a["params"]["w"], torch.stack([u["params"]["w"] for u in uploads(0)]))


def test_weighted_sum_is_the_weighted_mean_row_by_row():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 70_003, generator=g)
    w = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25], dtype=torch.float64)
    got = weighted_sum({"big": x, "small": x[:, :10]}, w)
    want = (w.float().view(-1, 1) * x).sum(0)
    torch.testing.assert_close(got["big"], want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got["small"], want[:10], rtol=1e-6, atol=1e-6)
    # by hand on two rows: 0.25 * [4, 8] + 0.75 * [8, 4] = [7, 5]
    two = weighted_sum({"v": torch.tensor([[4.0, 8.0], [8.0, 4.0]])}, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert torch.equal(two["v"], torch.tensor([7.0, 5.0]))
    assert not torch.equal(x[0], got["big"])  # a new tensor, the stack untouched
    assert torch.equal(x, torch.randn(5, 70_003, generator=torch.Generator().manual_seed(0)))


def test_a_running_sum_equals_weighted_sum_of_the_stack_bit_for_bit():
    """Streamed aggregation's promise: the rows one at a time give the stacked sum exactly."""
    from fedrift.functional.tree import RunningSum

    g = torch.Generator().manual_seed(1)
    rows = [{"params": {"w": torch.randn(300, 257, generator=g), "b": torch.randn(7, generator=g)},
             "n": torch.randn((), generator=g).double(),
             "t": torch.randn(40, 30, generator=g).t()}  # not contiguous, as no stack row is
            for _ in range(9)]
    w = torch.rand(9, generator=g, dtype=torch.float64)
    w = w / w.sum()
    acc = RunningSum(w)
    for r in rows:
        acc.add(r)
    got, want = acc.result(), weighted_sum(stack(rows), w)
    for (path, a), (_, b) in zip(_flat(got), _flat(want)):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    with pytest.raises(ValueError, match="10 weights"):
        RunningSum(torch.ones(10)).result()
    with pytest.raises(ValueError, match="there are 9 weights"):
        acc.add(rows[0])


def _flat(tree, prefix=""):
    for k in sorted(tree):
        v = tree[k]
        yield from (_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)])
