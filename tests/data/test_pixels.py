"""uint8 images normalised per batch on the device: the same run as pre-normalised floats."""

import dataclasses

import numpy as np
import pytest
import torch

import fedrift
from fedrift.api import prepare, resolve_options, run_prepared
from fedrift.data.base import Dataset, PixelNorm
from fedrift.models import build_model


def test_pixel_norm_matches_numpy_statistics():
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (37, 3, 5, 4), dtype=np.uint8))
    norm = PixelNorm.of(x)
    ref = x.numpy().astype(np.float64) / 255.0
    assert np.allclose(norm.mean, ref.mean(axis=(0, 2, 3)), rtol=0, atol=1e-12)
    assert np.allclose(norm.std, ref.std(axis=(0, 2, 3)), rtol=0, atol=1e-12)
    out = norm(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    want = (ref - np.array(norm.mean)[:, None, None]) / np.array(norm.std)[:, None, None]
    assert np.allclose(out.numpy(), want, atol=1e-5)
    # the training split's own statistics: each channel comes out with mean 0 and std 1
    assert np.allclose(out.double().mean((0, 2, 3)).numpy(), 0, atol=1e-6)
    assert np.allclose(out.double().std((0, 2, 3), unbiased=False).numpy(), 1, atol=1e-5)


def test_constant_channel_is_shifted_not_divided_by_zero():
    x = torch.full((4, 2, 3, 3), 7, dtype=torch.uint8)
    x[:, 1] = torch.arange(4, dtype=torch.uint8).view(4, 1, 1)
    norm = PixelNorm.of(x)
    assert norm.std[0] == 1.0 and norm(x)[:, 0].abs().max() < 1e-6


def test_dataset_refuses_uint8_without_norm_and_floats_with_one():
    x8, y = torch.zeros((2, 1, 2, 2), dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError):
        Dataset("d", x8, y, x8, y, 1)
    with pytest.raises(ValueError):
        Dataset("d", x8.float(), y, x8.float(), y, 1, pixel_norm=PixelNorm((0.0,), (1.0,)))


def _image_version(prep):
    """digits as 3-channel uint8 images (pixels spread over 0..255) and the same pre-normalised."""
    ds = prep.dataset

    def to_uint8(x):
        lo, hi = x.min(), x.max()
        g = ((x - lo) / (hi - lo) * 255).round().to(torch.uint8)
        return torch.cat([g, 255 - g, g // 2], dim=1)  # (n, 3, 8, 8)

    x8, t8 = to_uint8(ds.x_train), to_uint8(ds.x_test)
    norm = PixelNorm.of(x8)
    as_uint8 = dataclasses.replace(ds, x_train=x8, x_test=t8, pixel_norm=norm)
    as_float = dataclasses.replace(ds, x_train=norm(x8), x_test=norm(t8), pixel_norm=None)
    return as_uint8, as_float


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedgkd", "M": 2}])
def test_uint8_run_equals_the_prenormalised_float_run(tiny, tmp_path, executor, algorithm):
    """Normalising each batch where it is read gives the very same bits as normalising the
    whole set first (the same element-wise operations), through training, teachers,
    evaluation and drift diagnostics."""
    results = {}
    for kind in ("uint8", "float"):
        cfg = tiny(algorithm=algorithm, engine={"executor": executor}, eval={"drift": True},
                   output={"dir": str(tmp_path / f"{executor}-{kind}")})
        prep = prepare(cfg)
        as_uint8, as_float = _image_version(prep)
        prep = dataclasses.replace(prep, dataset=as_uint8 if kind == "uint8" else as_float)
        results[kind] = run_prepared(prep)
    a, b = results["uint8"], results["float"]
    def metrics(history):
        return [{k: v for k, v in row.items() if "seconds" not in k} for row in history]

    assert metrics(a.history) == metrics(b.history)
    assert "drift_logit_kl" in a.history[0]  # the drift diagnostics ran on the uint8 test set
    for k in a.global_state:
        assert torch.equal(a.global_state[k], b.global_state[k]), k


def test_federation_keeps_images_as_uint8(tiny):
    from fedrift.engine.federation import Federation

    prep = prepare(tiny())
    as_uint8, _ = _image_version(prep)
    fed = Federation(as_uint8, prep.partition, torch.device("cpu"))
    assert fed.x.dtype == torch.uint8 and fed.x_test.dtype == torch.uint8
    assert fed.x.element_size() * fed.x.numel() == as_uint8.x_train.numel()


def test_tsne_features_of_a_uint8_run_are_those_of_the_normalised_images(tiny, tmp_path):
    """The report rebuilds the model and feeds it the test images: normalised, as in training."""
    from fedrift.report.table import load_run
    from fedrift.report.tsne import run_features

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 6, 6, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x_train=x[:30], y_train=np.arange(30) % 3, x_test=x[30:], y_test=np.arange(10) % 3)
    result = fedrift.run(tiny(data={"name": "npz", "root": str(tmp_path)}, partition={"name": "iid", "num_clients": 3}))
    h, y = run_features(load_run(result.output_dir), points=10)
    prep = prepare(tiny(data={"name": "npz", "root": str(tmp_path)}))
    model = build_model("mlp", resolve_options(prep.config)["model"], (3, 6, 6), 3, 0)
    model.load_state_dict(result.global_state)
    with torch.no_grad():
        want = model(prep.dataset.pixel_norm(prep.dataset.x_test), mode="features")
    assert np.allclose(h, want.double().numpy(), atol=1e-6) and y.tolist() == prep.dataset.y_test.tolist()
