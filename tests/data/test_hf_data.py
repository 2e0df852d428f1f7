"""``data.name: hf``: datasets as Hugging Face keeps them, read with pyarrow alone, on small
datasets written here in each format: the ``save_to_disk`` layout (written by hand as
``datasets`` writes it: Arrow IPC streams, ``state.json``, ``dataset_info.json``,
``dataset_dict.json``), Parquet as the Hub publishes it, and Arrow IPC files and streams."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
import torch
from agreement import BITS, agree
from conftest import tiny_config

import fedrift
from fedrift.cli import main
from fedrift.data import DATASETS, hf, image_cache, load_dataset
from fedrift.data.partition import PARTITIONS, partition_dataset
from fedrift.errors import DataError

NAMES = ["red", "green", "blue"]
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 40, 230)]
IMAGE = pa.struct({"bytes": pa.binary(), "path": pa.string()})  # datasets' Image feature's storage


def load(root, **options):
    return load_dataset("hf", Path(root), DATASETS.get("hf").params(**options))


def _png(rgb, size=6, mode="RGB") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (size, size), rgb if mode == "RGB" else rgb[0]).save(buf, format="PNG")
    return buf.getvalue()


def _schema(fields: dict, features: dict) -> pa.Schema:
    """A schema carrying ``datasets``' features in its metadata, as its writers leave it."""
    return pa.schema(fields).with_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def images(n: int, seed: int, writers: int = 4):
    """An image split: a PNG of its class's colour (a little noise), a ClassLabel, a writer id."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    cells = [{"bytes": _png(tuple(int(v) for v in np.clip(np.asarray(COLOURS[c]) + rng.integers(-20, 20, 3), 0, 255))),
              "path": None} for c in labels]
    features = {"img": {"_type": "Image"}, "label": {"names": NAMES, "_type": "ClassLabel"},
                "writer": {"dtype": "int64", "_type": "Value"}}
    schema = _schema({"img": IMAGE, "label": pa.int64(), "writer": pa.int64()}, features)
    columns = {"img": pa.array(cells, IMAGE), "label": labels, "writer": rng.integers(0, writers, n)}
    return pa.table(columns, schema=schema)


def texts(n: int, seed: int):
    rng = np.random.default_rng(seed)
    words = {0: "awful dull boring", 1: "fine plain average", 2: "brilliant superb lovely"}
    labels = rng.integers(0, 3, n)
    features = {"text": {"dtype": "string", "_type": "Value"},
                "label": {"names": ["neg", "mid", "pos"], "_type": "ClassLabel"}}
    schema = _schema({"text": pa.string(), "label": pa.int64()}, features)
    rows = [f"{words[int(c)]} film number {i}" for i, c in enumerate(labels)]
    return pa.table({"text": rows, "label": labels}, schema=schema)


def numbers(n: int, seed: int, devices=("ann", "bob", "cy", "dee")):
    """Numeric columns (two floats, an int, a list of two), a plain int label, a device name."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    a = labels + rng.normal(0, 0.3, n)
    return pa.table({
        "a": a, "b": rng.normal(0, 1, n).astype(np.float32), "k": rng.integers(0, 5, n),
        "v": pa.array([[float(x), float(-x)] for x in a], pa.list_(pa.float64())),
        "label": labels, "device": pa.array([devices[i % len(devices)] for i in range(n)]),
    })


# ---------------------------------------------------------------------------------------
# The formats, written as the field writes them


def save_to_disk(root: Path, splits: dict, shards: int = 2) -> Path:
    """``DatasetDict.save_to_disk``'s layout: dataset_dict.json, and per split the
    data-0000K-of-0000N.arrow IPC streams (datasets' ArrowWriter), state.json, dataset_info.json."""
    root.mkdir(parents=True)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for name, table in splits.items():
        folder = root / name
        folder.mkdir()
        n = table.num_rows
        bounds = np.linspace(0, n, shards + 1).astype(int)
        files = []
        for k in range(shards):
            file = f"data-{k:05d}-of-{shards:05d}.arrow"
            with pa.OSFile(str(folder / file), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
                for batch in part.to_batches(max_chunksize=7):
                    writer.write_batch(batch)
            files.append({"filename": file})
        state = {"_data_files": files, "_fingerprint": "0123456789abcdef", "_format_columns": None,
                 "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None}
        (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        meta = json.loads(table.schema.metadata[b"huggingface"]) if table.schema.metadata else None
        features = meta["info"]["features"] if meta else {}
        info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
        (folder / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return root


def parquet(root: Path, splits: dict, shards: int = 1, folder: str = "data") -> Path:
    """The Hub's layout: ``data/{split}-0000K-of-0000N.parquet`` (push_to_hub's names)."""
    (root / folder).mkdir(parents=True)
    for name, table in splits.items():
        bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
        for k in range(shards):
            part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
            pq.write_table(part, root / folder / f"{name}-{k:05d}-of-{shards:05d}.parquet", row_group_size=11)
    return root


def arrow(root: Path, splits: dict, stream: bool = False) -> Path:
    """``{split}.arrow`` files: the IPC file format, or the stream format."""
    root.mkdir(parents=True)
    for name, table in splits.items():
        new = pa.ipc.new_stream if stream else pa.ipc.new_file
        with pa.OSFile(str(root / f"{name}.arrow"), "wb") as sink, new(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=9):
                writer.write_batch(batch)
    return root


WRITERS = {
    "save_to_disk": save_to_disk,
    "parquet": parquet,
    "arrow_file": arrow,
    "arrow_stream": lambda root, splits: arrow(root, splits, stream=True),
}


@pytest.fixture(scope="module")
def image_splits():
    return {"train": images(60, 0), "test": images(24, 1)}


def _tensors(ds) -> dict:
    out = {"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
           "classes": ds.num_classes}
    for key in ("train_groups", "test_groups"):
        value = getattr(ds, key)
        out[key] = None if value is None else torch.from_numpy(value)
    return out


# ---------------------------------------------------------------------------------------
# Loading


def test_images_come_back_as_written_with_classlabel_and_writers(tmp_path, image_splits):
    ds = load(save_to_disk(tmp_path / "saved", image_splits), size=6, client_id="writer")
    assert ds.name == "hf" and ds.num_classes == 3 and ds.pixel_norm is not None
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.shape == (60, 3, 6, 6) and ds.x_test.shape == (24, 3, 6, 6)
    train = image_splits["train"]
    assert ds.y_train.tolist() == train.column("label").to_pylist()
    from PIL import Image

    first = Image.open(io.BytesIO(train.column("img")[0].as_py()["bytes"])).convert("RGB")
    assert np.array_equal(ds.x_train[0].numpy(), np.asarray(first).transpose(2, 0, 1))
    assert ds.train_groups.tolist() == train.column("writer").to_pylist()  # ids 0..3: sorted, as written
    assert ds.source == str(tmp_path / "saved")


@pytest.mark.agreement
@pytest.mark.parametrize("kind", ["images", "texts", "numbers"])
def test_every_format_loads_the_same_tensors(tmp_path, kind, image_splits):
    splits = {"images": image_splits, "texts": {"train": texts(30, 0), "test": texts(12, 1)},
              "numbers": {"train": numbers(40, 0), "test": numbers(16, 1)}}[kind]
    options = {"images": {"size": 6, "client_id": "writer"}, "texts": {}, "numbers": {"client_id": "device"}}[kind]
    loaded = {name: _tensors(load(write(tmp_path / name, splits), **options)) for name, write in WRITERS.items()}
    for name in WRITERS:
        agree(loaded[name], loaded["parquet"], BITS, where=f"{kind}: {name} against parquet")
    ds = loaded["parquet"]
    if kind == "numbers":  # a, b, k, v (two numbers): five columns of float32, in the schema's order
        train = splits["train"]
        want = np.stack([train.column("a").to_numpy(), train.column("b").to_numpy(), train.column("k").to_numpy(),
                         train.column("a").to_numpy(), -train.column("a").to_numpy()], 1).astype(np.float32)
        assert torch.equal(ds["x_train"], torch.from_numpy(want))
        assert ds["train_groups"].tolist() == [i % 4 for i in range(40)]  # names sorted: ann 0, bob 1, ...
    if kind == "texts":
        from fedrift.data.text import encode

        ids = encode(splits["train"].column("text").to_pylist()[:1], 64, "test")[0]
        assert ds["x_train"][0, : len(ids)].tolist() == ids and ds["x_train"].dtype == torch.int64


def test_shards_of_a_split_are_read_in_order_and_sharded_parquet_equals_one_file(tmp_path, image_splits):
    one = load(parquet(tmp_path / "one", image_splits), size=6)
    three = load(parquet(tmp_path / "three", image_splits, shards=3), size=6)
    assert torch.equal(one.x_train, three.x_train) and torch.equal(one.y_train, three.y_train)


def test_the_hub_layouts_a_configuration_folder_and_a_folder_per_split(tmp_path):
    splits = {"train": numbers(20, 0), "test": numbers(8, 1)}
    parquet(tmp_path / "hub", splits, folder="plain_text")  # plain_text/train-00000-of-00001.parquet
    converted = tmp_path / "converted" / "default"  # the Hub's parquet conversion: default/train/0000.parquet
    for name, table in splits.items():
        (converted / name).mkdir(parents=True)
        pq.write_table(table, converted / name / "0000.parquet")
    a, b = load(tmp_path / "hub", client_id="device"), load(tmp_path / "converted", client_id="device")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test) and a.x_train.shape == (20, 5)


def test_one_file_or_one_split_gives_test_fraction_of_each_class_to_the_test_set(tmp_path):
    pq.write_table(numbers(50, 0), tmp_path / "mine.parquet")
    ds = load(tmp_path / "mine.parquet", test_fraction=0.2, client_id="device")
    assert ds.x_train.shape[0] + ds.x_test.shape[0] == 50 and 8 <= ds.x_test.shape[0] <= 12
    assert len(ds.train_groups) == ds.x_train.shape[0] and len(ds.test_groups) == ds.x_test.shape[0]
    only_train = parquet(tmp_path / "hub", {"train": numbers(50, 0)})  # a Hub dataset with a train split only
    held = load(only_train, test_fraction=0.2)
    assert torch.equal(held.x_test, load(tmp_path / "mine.parquet", test_fraction=0.2).x_test)


def test_labels_by_name_a_chosen_label_column_and_text_columns_joined(tmp_path):
    table = pa.table({"title": ["Big win", "Storm hits", "New chip", "Vote today"] * 3,
                      "body": ["team scores", "rain floods", "faster cpu", "polls open"] * 3,
                      "topic": ["sport", "weather", "tech", "politics"] * 3, "stars": [1, 2, 3, 4] * 3})
    root = parquet(tmp_path / "p", {"train": table, "test": table.slice(0, 4)})
    ds = load(root, label="topic", input=["title", "body"])
    assert ds.num_classes == 4 and ds.y_train[:4].tolist() == [1, 3, 2, 0]  # politics, sport, tech, weather
    from fedrift.data.text import encode

    assert ds.x_train[0, :6].tolist() == encode(["Big win team scores"], 64, "test")[0][:6]


# ---------------------------------------------------------------------------------------
# Images: the decode cache and the bounds


def test_a_second_load_reads_the_decoded_images_from_the_cache(tmp_path, monkeypatch, image_splits):
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))
    root = parquet(tmp_path / "p", image_splits, shards=2)
    first = load(root, size=6)
    assert len(list((tmp_path / "cache").glob("images-*.npy"))) == 4  # one entry per shard file

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(hf, "read_image", no_decoding)
    again = load(root, size=6)
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.x_test, again.x_test)
    with pytest.raises(AssertionError, match="decoded again"):  # another size: another key
        load(root, size=5)


def _bad_image_table(cells):
    return pa.table({"img": pa.array(cells, IMAGE), "label": [0] * len(cells)})


@pytest.mark.parametrize("cell, patch, message", [
    ({"bytes": b"not a png", "path": None}, None,
     r"row 1 of column 'img' is truncated or malformed \(UnidentifiedImageError"),
    ({"bytes": None, "path": "/somewhere/x.png"}, None, r"row 1 of column 'img' holds no image bytes \(a path only\)"),
    ({"bytes": _png((1, 2, 3), size=6), "path": None}, ("IMAGE_BYTES", 40),
     r"row 0 of column 'img' is \d+ bytes; allowed: image files of at most 40"),
    ({"bytes": _png((1, 2, 3), size=6), "path": None}, ("IMAGE_PIXELS", 30),
     "row 0 of column 'img' is 6x6 pixels; allowed: images of at most 30 pixels"),
])
def test_bad_images_are_refused_naming_the_file_row_and_column(tmp_path, monkeypatch, cell, patch, message):
    if patch:
        monkeypatch.setattr(image_cache, *patch)
    good = {"bytes": _png((9, 9, 9)), "path": None}
    root = parquet(tmp_path / "p", {"train": _bad_image_table([good, cell] if not patch else [cell]),
                                    "test": _bad_image_table([good])})
    with pytest.raises(DataError, match=message) as err:
        load(root, size=6)
    assert "train-00000-of-00001.parquet" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("dictionary", [False, True])
def test_cells_expanding_past_the_bound_are_refused_as_a_bomb(tmp_path, monkeypatch, dictionary):
    """One image repeated: dictionary-encoded (held once in the file), or compressed; either
    way the cells expand more than ZIP_RATIO times the file."""
    monkeypatch.setattr(hf, "ZIP_FLOOR", 4096)
    cell = {"bytes": _png((5, 5, 5), size=40) + bytes(3000), "path": None}  # trailing zeros: Pillow ignores them
    table = _bad_image_table([cell] * 2000)
    (tmp_path / "p").mkdir()
    pq.write_table(table, tmp_path / "p" / "train.parquet", use_dictionary=dictionary, compression="zstd")
    pq.write_table(table.slice(0, 2), tmp_path / "p" / "test.parquet")
    with pytest.raises(DataError, match=r"train.parquet: its column img expands to .* allowed: at most 100:1"):
        load(tmp_path / "p", size=6)


# ---------------------------------------------------------------------------------------
# Training on each


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_fedrift_trains_two_rounds_on_each_format(tmp_path, fmt, image_splits):
    root = WRITERS[fmt](tmp_path / "data", image_splits)
    result = fedrift.run(tiny_config(tmp_path, data={"name": "hf", "root": str(root), "size": 6}))
    assert [row["round"] for row in result.history] == [1, 2]
    assert 0 <= result.summary["final_accuracy"] <= 1


def test_numbers_train_and_the_natural_partition_uses_the_client_id_column(tmp_path):
    root = save_to_disk(tmp_path / "saved", {"train": numbers(48, 0), "test": numbers(16, 1)})
    ds = load(root, client_id="device")
    part = partition_dataset(ds, "natural", PARTITIONS.get("natural").params(), 0, 0.0)
    assert part.num_clients == 4
    for k, rows in enumerate(part.train):  # client k: every row of the k-th device name, sorted
        assert sorted(rows.tolist()) == [i for i in range(48) if i % 4 == k]
    cfg = tiny_config(tmp_path, data={"name": "hf", "root": str(root), "client_id": "device"},
                      partition={"name": "natural"}, train={"clients_per_round": 2})
    result = fedrift.run(cfg)
    assert [row["round"] for row in result.history] == [1, 2]
    saved = json.loads((result.output_dir / "partition.json").read_text())
    assert saved["name"] == "natural" and saved["num_clients"] == 4


def test_text_trains_two_rounds_on_the_frozen_text_model(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))
    root = parquet(tmp_path / "p", {"train": texts(30, 0), "test": texts(12, 1)})
    cfg = tiny_config(tmp_path, data={"name": "hf", "root": str(root)}, model={"name": "text", "freeze_encoder": True},
                      partition={"name": "iid", "num_clients": 3, "min_local_test": 1},
                      train={"clients_per_round": 3, "batch_size": 8})
    result = fedrift.run(cfg)
    assert [row["round"] for row in result.history] == [1, 2]


# ---------------------------------------------------------------------------------------
# Refusals: one line each


@pytest.mark.parametrize("write, options, message", [
    (lambda r: parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}), {"label": "nope"},
     (r"data.label: .*train-00000-of-00001.parquet has no column 'nope'; allowed: one of its columns: "
      r"a, b, k, v, label, device")),
    (lambda r: parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}), {"client_id": "who"},
     r"data.client_id: .* has no column 'who'"),
    (lambda r: parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}), {"input": ["a", "device"]},
     r"data.input: a \(double\), device \(string\) of .*; allowed: one image column, text columns"),
    (lambda r: parquet(r, {"train": numbers(9, 0).drop_columns(["label"]), "test": numbers(4, 1)}), {},
     r"data.label: .* has no ClassLabel column and no column 'label'"),
    (lambda r: parquet(r, {"train": numbers(9, 0).set_column(4, "label", pa.array([0, 1, -1, 2, 0, 1, 2, 0, 1])),
                           "test": numbers(4, 1)}), {},
     r"data.root: .*: y_train holds class id -1; allowed: class ids from 0"),
    (lambda r: parquet(r, {"train": texts(9, 0).set_column(1, "label", pa.array([0, 1, 2, 5, 0, 1, 2, 0, 1])),
                           "test": texts(4, 1)}), {},
     (r"column 'label' of the train split holds class id 5, but its ClassLabel names 3 classes; allowed: ids 0..2 "
      r"\(or data.num_classes=6 or more\)")),
    (lambda r: parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1).slice(0, 0)}), {},
     r"data.root: split 'test' \(.*test-00000-of-00001.parquet\) holds no rows"),
    (lambda r: (parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}),
                (r / "data" / "test-00000-of-00001.parquet").write_bytes(b"PAR1" + bytes(40))), {},
     r"data: .*test-00000-of-00001.parquet is truncated or malformed \(.*\); expected a Parquet file or an Arrow IPC"),
    (lambda r: (r.mkdir(), (r / "train.arrow").write_bytes(b"not arrow at all"),
                pq.write_table(numbers(4, 1), r / "test.parquet")), {},
     r"data: .*train.arrow is truncated or malformed"),
    (lambda r: (parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}),
                pq.write_table(numbers(9, 0).drop_columns(["b"]), r / "data" / "train-00001-of-00002.parquet")),
     {"client_id": "device"},
     r"data: .*train-00001-of-00002.parquet has no column 'b' \(which .*train-00000-of-00001.parquet has\)"),
    (lambda r: parquet(r, {"train": numbers(9, 0), "test": numbers(4, 1)}), {"test_split": "validation"},
     (r"data.test_split: no file under .* is named for the split 'validation' \(found "
      r"data/test-00000-of-00001.parquet, data/train-00000-of-00001.parquet\)")),
    (lambda r: parquet(r, {"training": numbers(9, 0)}), {},
     r"data.train_split: no file under .* is named for the split 'train'"),
    (lambda r: (parquet(r / "cola", {"train": numbers(9, 0)}, folder="."),
                parquet(r / "sst2", {"train": numbers(9, 0)}, folder=".")), {},
     r"data.root: .* holds 'train' files in 2 folders \(cola, sst2\); allowed: data.root=the one folder"),
    (lambda r: save_to_disk(r, {"train": numbers(9, 0), "validation": numbers(4, 1)}), {"test_split": "test"},
     r"data.test_split: .*dataset_dict.json lists no split 'test'; allowed: one of train, validation"),
    (lambda r: (save_to_disk(r, {"train": numbers(9, 0), "test": numbers(4, 1)}),
                (r / "test" / "state.json").write_text('{"_data_files": [{"filename": "../../etc/passwd"}]}')), {},
     r"state.json is truncated or malformed \(_data_files names '../../etc/passwd', not a file in"),
    (lambda r: (save_to_disk(r, {"train": numbers(9, 0), "test": numbers(4, 1)}),
                (r / "train" / "data-00001-of-00002.arrow").unlink()), {},
     r"data: .*data-00001-of-00002.arrow is missing; expected the Arrow shard that .*state.json names"),
    (lambda r: r.mkdir(), {}, r"data: .* holds no .parquet or .arrow files"),
])
def test_bad_sources_are_one_line_naming_the_file_and_what_is_allowed(tmp_path, write, options, message):
    root = tmp_path / "d"
    write(root)
    with pytest.raises(DataError, match=message) as err:
        load(root, **options)
    assert "\n" not in str(err.value)


def test_a_hub_name_says_how_to_save_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load("uoft-cs/cifar10")
    line = str(err.value)
    assert line.startswith("data.root: uoft-cs/cifar10 is no local folder or file") and "\n" not in line
    assert "python -c \"import datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('DIR')\"" in line
    assert ".parquet files" in line
    out = tmp_path / "run"  # and through fedrift run: the config leaves a Hub name to the loader
    assert main(["run", "data.name=hf", "data.root=uoft-cs/cifar10", f"output.dir={out}"]) == 2
    assert not out.exists()


def test_a_refusal_through_the_command_line_is_one_line_exit_2_and_no_run_folder(capsys, tmp_path):
    root = parquet(tmp_path / "p", {"train": numbers(9, 0), "test": numbers(4, 1)})
    out = tmp_path / "run"
    code = main(["run", "data.name=hf", f"data.root={root}", "data.label=nope", f"output.dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("fedrift: error: data.label: "), err
    assert not out.exists()


# ---------------------------------------------------------------------------------------
# Written by the datasets library itself


def _with_datasets(splits: dict):
    """The same splits as a ``datasets.DatasetDict``, features and all (images as the Image
    feature, the label as a ClassLabel): what a Hugging Face user holds."""
    import datasets  # installed by make setup (the flwr-datasets extra)

    return datasets.DatasetDict({name: datasets.Dataset(table) for name, table in splits.items()})


@pytest.mark.agreement
def test_save_to_disk_and_to_parquet_by_datasets_load_as_the_hand_written_layouts(tmp_path, image_splits):
    dd = _with_datasets(image_splits)
    assert type(dd["train"].features["img"]).__name__ == "Image" and dd["train"].features["label"].names == NAMES
    dd.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "pq").mkdir()
    for name, split in dd.items():
        split.to_parquet(str(tmp_path / "pq" / f"{name}.parquet"))
    want = _tensors(load(parquet(tmp_path / "hand", image_splits), size=6, client_id="writer"))
    for root in ("saved", "pq"):
        agree(_tensors(load(tmp_path / root, size=6, client_id="writer")), want, BITS, where=root)


@pytest.mark.parametrize("written", ["save_to_disk", "to_parquet"])
def test_compare_runs_over_a_folder_saved_by_datasets(tmp_path, image_splits, written):
    dd = _with_datasets(image_splits)
    if written == "save_to_disk":
        dd.save_to_disk(str(tmp_path / "saved"))
    else:  # the Hub's layout: data/<split>-00000-of-00001.parquet
        (tmp_path / "saved" / "data").mkdir(parents=True)
        for name, split in dd.items():
            split.to_parquet(str(tmp_path / "saved" / "data" / f"{name}-00000-of-00001.parquet"))
    cfg = tiny_config(tmp_path, data={"name": "hf", "root": str(tmp_path / "saved"), "size": 6},
                      partition={"name": "natural"}, train={"rounds": 2, "clients_per_round": 2})
    cfg["data"]["client_id"] = "writer"
    rows = fedrift.compare(cfg, algorithms=["fedavg", "fedprox"], seeds=[0], out=tmp_path / "cmp", verbose=False)
    assert sorted(r["algorithm"] for r in rows) == ["fedavg", "fedprox"]
    assert all(r["runs"] == 1 and 0 <= r["final_accuracy_mean"] <= 1 for r in rows), rows
    assert (tmp_path / "cmp" / "report.html").is_file()
