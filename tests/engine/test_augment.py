"""Augmentation: crop and flip on tensors, a pure function of (seed, round, client, step),
the same batches in every executor, and a teacher that sees the student's view."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fedrift
from fedrift.api import build_algorithm, prepare
from fedrift.cli import main
from fedrift.engine.augment import Augment
from fedrift.engine.executors.base import ClientJob, RoundTools
from fedrift.engine.teacher import with_teacher
from fedrift.models import build_model


def test_crop_and_flip_by_hand():
    x = torch.tensor([[[[1, 2, 3], [4, 5, 6]]]], dtype=torch.uint8)  # (1, 1, 2, 3)
    aug = Augment(padding=1)
    # offsets (1, 1): the image itself; (0, 0): one row and column of zeros at the top left
    assert torch.equal(aug(x, torch.tensor([[1, 1, 0]])), x)
    assert aug(x, torch.tensor([[0, 0, 0]]))[0, 0].tolist() == [[0, 0, 0], [0, 1, 2]]
    assert aug(x, torch.tensor([[2, 2, 0]]))[0, 0].tolist() == [[5, 6, 0], [0, 0, 0]]
    # flipped: the crop, mirrored left-right
    assert aug(x, torch.tensor([[1, 1, 1]]))[0, 0].tolist() == [[3, 2, 1], [6, 5, 4]]
    assert aug(x, torch.tensor([[0, 0, 1]]))[0, 0].tolist() == [[0, 0, 0], [2, 1, 0]]


def test_equals_pad_slice_flip_per_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 6, 5), dtype=torch.uint8, generator=g)
    aug = Augment(padding=2)
    views = aug.views(0, 1, 2, 3, 16, torch.device("cpu"))
    out = aug(x, views)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i, (dy, dx, f) in enumerate(views.tolist()):
        want = padded[i, :, dy : dy + 6, dx : dx + 5]
        assert torch.equal(out[i], want.flip(-1) if f else want), i
    assert out.dtype == torch.uint8 and out.is_contiguous()


def test_views_are_a_pure_function_of_seed_round_client_step():
    aug, cpu = Augment(padding=4), torch.device("cpu")
    a = aug.views(3, 2, 7, 5, 64, cpu)
    assert torch.equal(a, aug.views(3, 2, 7, 5, 64, cpu))
    for other in [(4, 2, 7, 5), (3, 3, 7, 5), (3, 2, 8, 5), (3, 2, 7, 6)]:
        assert not torch.equal(a, aug.views(*other, 64, cpu)), other
    # row i does not depend on how many rows are drawn (the batched executor pads batches)
    assert torch.equal(aug.views(3, 2, 7, 5, 10, cpu), a[:10])
    big = aug.views(0, 1, 1, 1, 20_000, cpu)
    assert big[:, :2].min() == 0 and big[:, :2].max() == 8
    counts = torch.bincount(big[:, 0], minlength=9).double() / len(big)
    assert (counts - 1 / 9).abs().max() < 0.02  # uniform offsets, as RandomCrop's
    assert abs(big[:, 2].double().mean().item() - 0.5) < 0.02
    assert Augment(padding=0, flip=False).views(0, 1, 1, 1, 50, cpu).abs().sum() == 0
    # a vectorised group's whole round of views at once: each step's views, drawn as they are
    table = aug.draws(3, 2, 7, range(4, 8), 64)
    assert table.shape == (4, 64, 3)
    assert torch.equal(torch.from_numpy(table[1]), a)


def _npz(tmp_path):
    rng = np.random.default_rng(0)
    y = np.arange(120) % 4
    x = rng.integers(0, 256, (120, 8, 8, 3), dtype=np.uint8)
    x[..., 0] = (y * 60)[:, None, None]  # learnable: class in the red channel
    np.savez(tmp_path / "d.npz", x_train=x[:96], y_train=y[:96], x_test=x[96:], y_test=y[96:])
    return str(tmp_path)


@pytest.mark.process
@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedgkd", "M": 2}])
def test_every_executor_trains_on_the_same_augmented_batches(tiny, tmp_path, algorithm):
    """uint8 images, augmented: processes equals sequential bit for bit (same operations in
    the same order); batched within float tolerance (vmap's kernels round differently)."""
    root = _npz(tmp_path)
    results = {}
    for ex in ("sequential", "batched", "processes", "stacked"):
        cfg = tiny(data={"name": "npz", "root": root, "augment": True, "crop_padding": 2},
                   model={"name": "mlp", "hidden": [16]}, algorithm=algorithm,
                   train={"rounds": 2, "clients_per_round": 3, "local_epochs": 2, "batch_size": 8},
                   engine={"executor": ex, "threads": 1, "workers": 2}, output={"dir": str(tmp_path / ex)})
        results[ex] = fedrift.run(cfg)
    seq = results["sequential"].global_state
    for k in seq:
        assert torch.equal(seq[k], results["processes"].global_state[k]), k
        scale = seq[k].abs().max().clamp(min=1e-3)
        assert ((seq[k] - results["batched"].global_state[k]).abs().max() / scale).item() < 1e-4, k
        assert torch.equal(results["stacked"].global_state[k], results["batched"].global_state[k]), k  # a stack of one
    plain = fedrift.run(tiny(data={"name": "npz", "root": root}, model={"name": "mlp", "hidden": [16]}, algorithm=algorithm,
                             train={"rounds": 2, "clients_per_round": 3, "local_epochs": 2, "batch_size": 8},
                             output={"dir": str(tmp_path / "plain")}))
    assert any(not torch.equal(seq[k], plain.global_state[k]) for k in seq)  # augmentation did change training
    # and it trains: the red channel names the class (chance: 0.25; fedavg measured 0.625)
    assert results["sequential"].summary["final_accuracy"] > 0.4


def test_the_teacher_sees_the_students_augmented_view(tiny):
    """No teacher table with augmentation (the views change every step): the teacher hook
    runs on the very batch the student trains on."""
    cfg = tiny(algorithm={"name": "fedgkd"}, data={"augment": True, "crop_padding": 3})
    prep = prepare(cfg)
    algorithm = dataclasses.replace(
        build_algorithm(prep, build_model("mlp", None, (1, 8, 8), 10, 0)),
        teacher=lambda payload, x, apply: {"seen": x.clone()},
    )
    x, y = prep.dataset.x_train, prep.dataset.y_train
    tools = RoundTools(algorithm, None, None, None, x, y, augment=Augment(3), teacher_memo=None)
    job = ClientJob(0, torch.arange(10), torch.arange(10).view(2, 5), {})
    assert with_teacher(tools, {}, [job], cache=True) is tools  # no table built
    idx = torch.arange(5)
    batch = tools.batch({}, idx, torch.full((5,), 0.2), views=tools.views(1, 0, 0, 5))
    assert torch.equal(batch["teacher"]["seen"], batch["x"])
    assert not torch.equal(batch["x"], x[idx])  # the view is not the stored image
    # nor a cross-round memo: a model's outputs on the stored images are never the student's view
    from fedrift.engine.local import make_tools

    model = build_model("mlp", None, (1, 8, 8), 10, 0)
    assert make_tools(model, algorithm, prep.config.train, x, y, 0).teacher_memo is not None
    assert make_tools(model, algorithm, prep.config.train, x, y, 0, augment=Augment()).teacher_memo is None


def test_augment_needs_images(capsys, tmp_path):
    code = main(["run", "data.name=mnist1d", "data.augment=true", f"output.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 2 and "data.augment" in err and "allowed: false" in err and not (tmp_path / "r").exists()
