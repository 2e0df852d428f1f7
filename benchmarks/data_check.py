"""What checking a dataset as it loads costs (issue 68, F5/F6/F11: ``data.base.check_dataset``),
as a ratio against loading the same arrays from an ``.npz`` (``np.load`` and the float32
conversion the loader makes), both measured in this run, best of ``--reps``.

    .venv/bin/python benchmarks/data_check.py --reps 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedrift.data.base import Dataset, check_dataset, image_dataset


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    n, m = 60_000, 10_000  # MNIST's splits
    y, yt = rng.integers(0, 10, n), rng.integers(0, 10, m)
    floats = rng.random((n, 784), dtype=np.float32), rng.random((m, 784), dtype=np.float32)
    pixels = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 256, (m, 1, 28, 28), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        for kind, (x, xt) in (("float features (60,000 x 784)", floats), ("uint8 images (60,000 x 1 x 28 x 28)", pixels)):
            path = Path(tmp) / "d.npz"
            np.savez(path, x_train=x, y_train=y, x_test=xt, y_test=yt)

            def load() -> None:
                with np.load(path, allow_pickle=False) as z:
                    a, at = z["x_train"], z["x_test"]
                    if a.dtype != np.uint8:
                        torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
                        torch.from_numpy(np.ascontiguousarray(at, dtype=np.float32))

            if x.dtype == np.uint8:
                ds = image_dataset("bench", x, y, xt, yt, 10)
            else:
                ds = Dataset("bench", torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt), torch.from_numpy(yt), 10)
            base, check = best(load, args.reps), best(lambda: check_dataset(ds, path), args.reps)
            print(f"{kind}: load {base * 1e3:.1f} ms, check {check * 1e3:.2f} ms, check / load {check / base:.3f}")


if __name__ == "__main__":
    main()
