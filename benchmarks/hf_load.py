"""Loading CIFAR-10 from Parquet (``data.name: hf``) against the zip path (``imagefolder`` on
the same images' zip), first load (an empty decode cache) and second load (from the cache),
both measured in this run, best of ``--reps`` each (issue 70 item 4).

The Parquet files are written from ``../shared/data/cifar10-jpeg/cifar10-jpeg.zip`` as the Hub
publishes an image dataset (``data/train-00000-of-00001.parquet``, ``data/test-...``: an
``img`` struct of the image's bytes and path, a ``label`` ClassLabel column, the ``huggingface``
schema metadata), the JPEG bytes as stored in the zip: both paths decode the same files.

    .venv/bin/python benchmarks/hf_load.py --reps 3
    .venv/bin/python benchmarks/hf_load.py --memory   # peak memory of each load, in its own process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ZIP = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg" / "cifar10-jpeg.zip"


def write_parquet(zip_path: Path, out: Path) -> None:
    """The zip's train/ and test/ as two Parquet files of the Hub's image layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with zipfile.ZipFile(zip_path) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".jpg"))
        classes = sorted({n.split("/")[1] for n in names})
        info = {"features": {"img": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": classes}}}
        meta = {b"huggingface": json.dumps({"info": info}).encode()}
        (out / "data").mkdir(parents=True)
        for split in ("train", "test"):
            rows = [n for n in names if n.startswith(split + "/")]
            img = pa.array([{"bytes": z.read(n), "path": n} for n in rows],
                           type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            label = pa.array([classes.index(n.split("/")[1]) for n in rows], type=pa.int64())
            table = pa.table({"img": img, "label": label}).replace_schema_metadata(meta)
            pq.write_table(table, out / "data" / f"{split}-00000-of-00001.parquet", row_group_size=1000)


def load(name: str, root: Path) -> tuple[float, Any]:
    """Seconds to load (with the loader's checks, as a run loads it), and the dataset."""
    from fedrift.data import DATASETS, load_dataset

    options = DATASETS.get(name, "data.name").params()  # the defaults: 32x32 RGB
    start = time.perf_counter()
    ds = load_dataset(name, root, options)
    return time.perf_counter() - start, ds


CHILD = """
import json, resource, sys
from pathlib import Path
from fedrift.data import DATASETS, load_dataset
name, root = sys.argv[1], Path(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ds = load_dataset(name, root, DATASETS.get(name, "data.name").params())
tensors = sum(t.numel() * t.element_size() for t in (ds.x_train, ds.y_train, ds.x_test, ds.y_test))
print(json.dumps({"before": before / 1024, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tensors": tensors / 2**20}))
"""


def memory(name: str, root: Path, cache: Path) -> dict[str, float]:
    """One load in a new process: its peak RSS before the load (Python, torch, fedrift imported)
    and after, in MiB, and the loaded tensors' size: the load's own memory is the difference."""
    env = {**os.environ, "FEDRIFT_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(root)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--memory", action="store_true",
                   help="instead of times: each path's peak memory, first and second load, each in its own process")
    args = p.parse_args()
    if args.memory:
        return main_memory()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        write_parquet(ZIP, tmp_path / "parquet")
        print(f"Parquet written in {time.perf_counter() - t0:.1f} s "
              f"({sum(f.stat().st_size for f in (tmp_path / 'parquet').rglob('*.parquet')) / 1e6:.1f} MB)")
        rows, data = [], {}
        for name, root in (("imagefolder", ZIP), ("hf", tmp_path / "parquet")):
            first, second = [], []
            for k in range(args.reps):
                os.environ["FEDRIFT_CACHE"] = str(tmp_path / f"cache-{name}-{k}")  # empty: a first load
                s, ds = load(name, root)
                first.append(s)
                s, ds = load(name, root)
                second.append(s)
            data[name] = ds
            rows.append((name, len(ds.y_train), min(first), min(second)))
        base = rows[0]
        print("| path | train images | first load s | second load s | first x zip | second x zip |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, n, f, s in rows:
            print(f"| {name} | {n:,} | {f:.2f} | {s:.2f} | {f / base[2]:.2f} | {s / base[3]:.2f} |")
        a, b = data["imagefolder"], data["hf"]
        same = all(bool((x == y).all()) for x, y in ((a.x_train, b.x_train), (a.y_train, b.y_train),
                                                      (a.x_test, b.x_test), (a.y_test, b.y_test)))
        print(f"the same tensors from both paths: {same}")
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (this process, both paths)")


def main_memory() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        write_parquet(ZIP, tmp_path / "parquet")
        shard = max(f.stat().st_size for f in (tmp_path / "parquet").rglob("*.parquet")) / 2**20
        print(f"largest Parquet file {shard:.1f} MiB")
        print("| path | load | RSS before MiB | peak RSS MiB | load's own MiB | uint8 tensors MiB | own / tensors |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for name, root in (("imagefolder", ZIP), ("hf", tmp_path / "parquet")):
            cache = tmp_path / f"cache-{name}"
            for which in ("first", "second"):
                m = memory(name, root, cache)
                own = m["peak"] - m["before"]
                print(f"| {name} | {which} | {m['before']:.0f} | {m['peak']:.0f} | {own:.0f} | {m['tensors']:.0f} | "
                      f"{own / m['tensors']:.2f} |")


if __name__ == "__main__":
    main()
