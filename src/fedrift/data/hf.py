"""``hf``: a dataset as the field keeps it, read offline with pyarrow alone (the ``hf`` extra).

``data.root`` is one of: a folder written by Hugging Face ``datasets``' ``save_to_disk`` (a
``DatasetDict``: ``dataset_dict.json`` listing the splits, a folder per split holding
``state.json``, ``dataset_info.json`` and the ``data-0000K-of-0000N.arrow`` shards, Arrow IPC
streams; or one ``Dataset``'s folder); a folder of Parquet or Arrow files whose names or
folders name the split, as the Hub publishes them (``train-00000-of-00001.parquet``,
``plain_text/test-...``, ``train/0000.parquet``); or one such file. A source with no test
split (one file, one ``Dataset``) gives ``test_fraction`` of each class to the test split.

Columns: the label (the ``ClassLabel`` column, else ``label``), the input (the one image
column, else the text column(s), else every numeric column as a float matrix) and, for
``partition.name=natural``, a client-id column. Images (the ``Image`` feature: a struct of
``bytes`` and ``path``) are decoded by :func:`fedrift.data.image_cache.read_image` with its
bounds, kept as uint8 and cached per shard file under a SHA-256 of its content; text becomes
MiniLM token ids as ``sst5``'s does. Shards are read one record batch at a time, each
shard's cells bounded against its size as a zip's members are (:data:`~fedrift.data.files.ZIP_RATIO`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field

from fedrift.cache import cache_dir
from fedrift.data import DATASETS
from fedrift.data.base import Dataset, class_count, image_dataset
from fedrift.data.embedded import stratified_split
from fedrift.data.files import ZIP_FLOOR, ZIP_RATIO, DataError, malformed, need_root, read_bounded, size_text
from fedrift.data.image_cache import FORMAT, TEXT_BYTES, cached_into, keep, read_image
from fedrift.data.notices import say_once
from fedrift.errors import ConfigError, first_line
from fedrift.params import params

SUFFIXES = (".parquet", ".arrow", ".feather")
DEPTH = 4  # folders below data.root searched for data files (config/split/shard.parquet is 3)
BATCH_ROWS = 1024  # rows per Parquet read; an Arrow file's record batches are read as written
MEMO = 64  # decoded images of a dictionary-encoded batch kept for the rows that repeat them
EXTRA = "pip install 'fedrift[hf]' (pyarrow)"
HOLDS = ("a save_to_disk folder (dataset_dict.json or state.json), .parquet or .arrow files named "
         "for their split (train-00000-of-00001.parquet), or one such file")
SHARD = "a Parquet file or an Arrow IPC file or stream"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
Side = Annotated[int, Field(ge=1, le=1024)]


@params
class HfParams:
    """``train_split``, ``test_split`` (null: ``test`` where there is one, else ``test_fraction``
    of each class of the train split, drawn from ``split_seed``); ``label`` (null: the
    ClassLabel column, else ``label``); ``input``: a column or a list of them (null: the one
    image column, else the text column, else every numeric column); ``client_id``: the
    column of natural client ids (``partition.name=natural``); images resized to ``size`` x
    ``size``, ``channels`` 3 (RGB) or 1 (grey); text as ``sst5``'s (``max_tokens``,
    ``dynamic_padding``); ``num_classes`` (null: the ClassLabel's names, else the largest id + 1)."""

    train_split: str = "train"
    test_split: str | None = None
    label: str | None = None
    input: str | list[str] | None = None
    client_id: str | None = None
    size: Side = 32
    channels: Literal[1, 3] = 3
    max_tokens: Annotated[int, Field(ge=2, le=512)] = 64
    dynamic_padding: bool = True
    num_classes: Annotated[int, Field(ge=1)] | None = None
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    split_seed: int = 0


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.parquet  # the submodules, reached as pa.compute, pa.ipc, pa.parquet
    except ImportError as err:
        raise ConfigError(f"data.name hf needs pyarrow, missing here ({err.name}); {EXTRA}") from None
    return pa


# ---------------------------------------------------------------------------------------
# Where the splits are


@dataclass
class Split:
    """One split's shard files, in order, and the features ``datasets`` recorded beside them."""

    name: str
    files: list[Path]
    features: dict


def _json(path: Path, expected: str) -> Any:
    if not path.is_file():
        raise DataError(f"data: {path} is missing; expected {expected}")
    try:
        return json.loads(read_bounded(path, TEXT_BYTES, "JSON files"))
    except (ValueError, UnicodeDecodeError) as err:
        raise malformed(path, expected, f"{type(err).__name__}: {err}") from None
    except OSError as err:
        raise DataError(f"data: {path} cannot be read ({err.strerror or err}); expected {expected}") from None


def _saved_split(folder: Path, name: str) -> Split:
    """A ``Dataset.save_to_disk`` folder: its ``state.json``'s ``_data_files``, in order."""
    expected = 'save_to_disk\'s state.json: {"_data_files": [{"filename": "data-00000-of-00001.arrow"}, ...]}'
    state = _json(folder / "state.json", expected)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise malformed(folder / "state.json", expected, "no _data_files")
    files = []
    for entry in entries:
        file = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(file, str) or Path(file).name != file or file.startswith("."):
            raise malformed(folder / "state.json", expected, f"_data_files names {file!r}, not a file in {folder}")
        if not (folder / file).is_file():
            raise DataError(f"data: {folder / file} is missing; expected the Arrow shard that "
                            f"{folder / 'state.json'} names")
        files.append(folder / file)
    info = folder / "dataset_info.json"
    doc = _json(info, "save_to_disk's dataset_info.json") if info.is_file() else {}
    features = doc.get("features") if isinstance(doc, dict) else None
    return Split(name, files, features if isinstance(features, dict) else {})


def _saved_dict(root: Path, options: HfParams) -> tuple[Split, Split | None]:
    """A ``DatasetDict.save_to_disk`` folder: ``dataset_dict.json``'s splits, a folder each."""
    expected = 'save_to_disk\'s dataset_dict.json: {"splits": ["train", "test"]}'
    doc = _json(root / "dataset_dict.json", expected)
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) and s and Path(s).name == s for s in splits):
        raise malformed(root / "dataset_dict.json", expected, "no list of split names")

    def pick(key: str, name: str) -> Split:
        if name not in splits:
            raise DataError(f"data.{key}: {root / 'dataset_dict.json'} lists no split {name!r}; "
                            f"allowed: one of {', '.join(splits) or 'none'}")
        return _saved_split(root / name, name)

    train = pick("train_split", options.train_split)
    test_name = options.test_split or ("test" if "test" in splits else None)
    return train, (pick("test_split", test_name) if test_name else None)


def _data_files(root: Path) -> list[Path]:
    """The .parquet / .arrow / .feather files under ``root`` (hidden folders and those deeper
    than :data:`DEPTH` left out), sorted by their path below it."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError as err:
            raise DataError(f"data: {folder} cannot be listed ({err.strerror or err})") from None
        for p in entries:
            if p.name.startswith("."):
                continue
            if p.is_dir():
                if depth < DEPTH:
                    walk(p, depth + 1)
            elif p.suffix.lower() in SUFFIXES and p.is_file():
                found.append(p)

    walk(root, 1)
    return found


def _names_split(rel: Path, split: str) -> bool:
    """Whether a file (its path below data.root) belongs to ``split``: the split's name in the
    file's name between separators (``train-00000-of-00001``, ``cifar10-train``, ``test``), or
    as one of its folders (``train/0000.parquet``), as the Hub infers splits."""
    word = rf"(^|[-._ ]){re.escape(split)}($|[-._ 0-9])"
    return re.search(word, rel.stem) is not None or split in rel.parent.parts


def _named(files: list[Path]) -> str:
    shown = ", ".join(str(f) for f in files[:4])
    return shown + (f" and {len(files) - 4} more" if len(files) > 4 else "")


def _files_by_split(root: Path, options: HfParams) -> tuple[Split, Split | None]:
    files = _data_files(root)
    if not files:
        raise DataError(f"data: {root} holds no .parquet or .arrow files (nor dataset_dict.json or state.json); "
                        f"expected {HOLDS}")
    rel = [f.relative_to(root) for f in files]
    train = [f for f, r in zip(files, rel) if _names_split(r, options.train_split)]
    if not train:
        raise DataError(f"data.train_split: no file under {root} is named for the split {options.train_split!r} "
                        f"(found {_named(rel)}); allowed: data.train_split naming the split in their names or "
                        f"folders, or data.root=ONE FILE (data.test_fraction of it is then the test set)")
    test_name = options.test_split or "test"
    test = [f for f, r in zip(files, rel) if _names_split(r, test_name)]
    both = set(train) & set(test)
    if both:
        raise DataError(f"data.test_split: {min(both)} is named for both {options.train_split!r} and "
                        f"{test_name!r}; allowed: a file named for one split")
    if not test and options.test_split is not None:
        raise DataError(f"data.test_split: no file under {root} is named for the split {test_name!r} "
                        f"(found {_named(rel)}); allowed: a split named in their names or folders, or null "
                        f"(data.test_fraction of the train split)")
    _one_place(root, options.train_split, train, test_name, test)
    return Split(options.train_split, train, {}), (Split(test_name, test, {}) if test else None)


def _one_place(root: Path, train_name: str, train: list[Path], test_name: str, test: list[Path]) -> None:
    """Refuse splits gathered from several of the Hub's configurations (``cola/``, ``sst2/``):
    a split's files share one folder (that folder, or its parent when it is named for the
    split), and both splits the same."""

    def home(files: list[Path], name: str) -> Path:
        homes = {f.parent.parent if f.parent.name == name and f.parent != root else f.parent for f in files}
        if len(homes) > 1:
            names = ", ".join(str(h.relative_to(root)) or "." for h in sorted(homes))
            raise DataError(f"data.root: {root} holds {name!r} files in {len(homes)} folders ({names}); "
                            f"allowed: data.root=the one folder of the configuration to read")
        return homes.pop()

    a = home(train, train_name)
    if test and home(test, test_name) != a:
        raise DataError(f"data.root: {root} holds the {train_name!r} files in {a} and the {test_name!r} files in "
                        f"{home(test, test_name)}; allowed: data.root=the one folder of the configuration to read")


def _splits(root: Path, options: HfParams) -> tuple[Split, Split | None]:
    if options.test_split is not None and options.test_split == options.train_split:
        raise ConfigError(f"data.test_split: {options.test_split!r} is data.train_split too; allowed: another split, "
                          f"or null (data.test_fraction of the train split)")
    if root.is_file():
        return Split(root.stem, [root], {}), None
    if (root / "dataset_dict.json").is_file():
        return _saved_dict(root, options)
    if (root / "state.json").is_file():
        return _saved_split(root, root.name), None
    return _files_by_split(root, options)


def _missing(root: Path) -> DataError:
    """The refusal of a ``data.root`` that is not here: a Hub name gets how to save a local copy."""
    text = str(root)
    if HUB_ID.fullmatch(text) and text not in (".", ".."):
        return DataError(
            f"data.root: {text} is no local folder or file, and data.name hf reads local copies only (offline); "
            f"save one, then set data.root=DIR: python -c \"import datasets; datasets.load_dataset('{text}')"
            f".save_to_disk('DIR')\" (or download the dataset's .parquet files into DIR)")
    return DataError(f"data: {root} is missing; expected {HOLDS}")


# ---------------------------------------------------------------------------------------
# Reading a shard


class Shard:
    """One data file: its format (from its first bytes), its Arrow schema, and its record
    batches of some columns; every pyarrow failure is a refusal naming the file."""

    def __init__(self, path: Path):
        self.path = path
        pa = _pa()
        try:
            with path.open("rb") as f:
                head = f.read(8)
        except OSError as err:
            raise DataError(f"data: {path} cannot be read ({err.strerror or err}); expected {SHARD}") from None
        self.kind = "parquet" if head[:4] == b"PAR1" else "arrow-file" if head[:6] == b"ARROW1" else "arrow-stream"
        self.size = max(path.stat().st_size, 1)
        with _Reading(path):
            if self.kind == "parquet":
                self.meta = pa.parquet.read_metadata(str(path))
                self.schema = self.meta.schema.to_arrow_schema()
            else:
                with pa.memory_map(str(path)) as source:
                    self.schema = self._ipc(pa, source).schema

    def _ipc(self, pa: Any, source: Any) -> Any:
        return pa.ipc.open_file(source) if self.kind == "arrow-file" else pa.ipc.open_stream(source)

    def features(self) -> dict:
        """The features ``datasets`` wrote into the schema's metadata (``huggingface``), or {}."""
        raw = (self.schema.metadata or {}).get(b"huggingface")
        try:
            doc = json.loads(raw) if raw else {}
        except (ValueError, UnicodeDecodeError):
            return {}
        info = doc.get("info") if isinstance(doc, dict) else None
        features = info.get("features") if isinstance(info, dict) else None
        return features if isinstance(features, dict) else {}

    def check_parquet_expansion(self, columns: list[str]) -> None:
        """A Parquet file's columns, decompressed, from its footer before a page is read."""
        if self.kind != "parquet":
            return
        total = 0
        for g in range(self.meta.num_row_groups):
            group = self.meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if any(chunk.path_in_schema == name or chunk.path_in_schema.startswith(name + ".") for name in columns):
                    total += chunk.total_uncompressed_size
        _bound(self, total, columns)

    def batches(self, columns: list[str], dictionary: list[str]) -> Iterator[Any]:
        """Record batches of ``columns``, one at a time; Parquet's ``dictionary`` columns (binary
        and string leaves) stay dictionary-encoded, so a repeated cell is held once."""
        pa = _pa()
        with _Reading(self.path):
            if self.kind == "parquet":
                with pa.parquet.ParquetFile(str(self.path), read_dictionary=dictionary or None) as reader:
                    for group in range(reader.num_row_groups):  # a batch within one row group: one dictionary
                        yield from reader.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns,
                                                       use_threads=False)
                return
            with pa.memory_map(str(self.path)) as source:
                ipc = self._ipc(pa, source)
                if self.kind == "arrow-file":
                    for i in range(ipc.num_record_batches):
                        yield ipc.get_batch(i).select(columns)
                else:
                    for batch in ipc:
                        yield batch.select(columns)


class _Reading:
    """Turns pyarrow's failures (and a file cut short) into a refusal naming the file."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, err: BaseException | None, tb: object) -> bool:
        if err is None or isinstance(err, (DataError, GeneratorExit)):
            return False
        pa = _pa()
        if isinstance(err, (pa.ArrowException, OSError, ValueError, EOFError, MemoryError)):
            raise malformed(self.path, SHARD, first_line(err)) from None
        return False


def _bound(shard: Shard, total: int, columns: list[str]) -> None:
    """Refuse a shard whose cells expand past :data:`ZIP_FLOOR` at more than :data:`ZIP_RATIO`
    bytes per byte of the file (a decompression bomb: a repeated cell, a compressed page)."""
    if total > max(ZIP_FLOOR, ZIP_RATIO * shard.size):
        raise DataError(
            f"data.root: {shard.path}: its {'columns' if len(columns) > 1 else 'column'} {', '.join(columns)} "
            f"{'expand' if len(columns) > 1 else 'expands'} to {size_text(total)} from {size_text(shard.size)} "
            f"({total // shard.size:,}:1); allowed: at most {ZIP_RATIO}:1 beyond "
            f"{size_text(ZIP_FLOOR)} (a decompression bomb?)")


def _decoded_bytes(arr: Any) -> int:
    """What a column's cells hold decoded: a dictionary-encoded cell counted at each row that
    repeats it, 8 bytes a row besides."""
    pa = _pa()
    t = arr.type
    if pa.types.is_dictionary(t):
        sizes = _value_sizes(arr.dictionary)
        idx = arr.indices.drop_null().to_numpy(zero_copy_only=False)  # a null cell has none (nor an empty dictionary)
        return int(sizes[idx].sum()) + 8 * len(arr)
    if pa.types.is_struct(t):
        return sum(_decoded_bytes(arr.field(i)) for i in range(t.num_fields))
    return int(arr.nbytes)


def _value_sizes(values: Any) -> np.ndarray:
    pa = _pa()
    t = values.type
    if _binary_like(t):
        return pa.compute.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(getattr(t, "bit_width", 64) // 8, 1)
    return np.full(len(values), width, dtype=np.int64)


def _binary_like(t: Any) -> bool:
    pa = _pa()
    return any(f(t) for f in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string,
                              pa.types.is_large_string, pa.types.is_binary_view, pa.types.is_string_view))


# ---------------------------------------------------------------------------------------
# Columns


def _kind(field: Any, feature: Any) -> str:
    """``image``, ``text``, ``number``, ``vector`` (a list of numbers), ``binary`` or ``other``."""
    pa = _pa()
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if isinstance(feature, dict) and feature.get("_type") == "Image":
        return "image"
    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        return "image" if idx >= 0 and _binary_like(t.field(idx).type) else "other"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if _binary_like(t):
        return "binary"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        v = t.value_type
        return "vector" if pa.types.is_integer(v) or pa.types.is_floating(v) or pa.types.is_boolean(v) else "other"
    return "other"


@dataclass(frozen=True)
class Columns:
    """The columns read: the label, the inputs and their kind, the client ids (or None)."""

    label: str
    inputs: tuple[str, ...]
    kind: str  # image | text | number
    client_id: str | None
    class_names: tuple[str, ...] | None  # the label's ClassLabel names, when recorded

    @property
    def small(self) -> list[str]:
        """The columns read in the first pass: all but an image input."""
        cols = [self.label, *([self.client_id] if self.client_id else [])]
        return cols + ([] if self.kind == "image" else [c for c in self.inputs if c not in cols])


def _columns(shard: Shard, features: dict, options: HfParams) -> Columns:
    names = list(shard.schema.names)
    listed = ", ".join(names)
    kinds = {n: _kind(shard.schema.field(n), features.get(n)) for n in names}

    def need(key: str, name: str) -> str:
        if name not in kinds:
            raise DataError(f"data.{key}: {shard.path} has no column {name!r}; allowed: one of its columns: {listed}")
        return name

    if options.label is not None:
        label = need("label", options.label)
    else:
        classes = [n for n in names if isinstance(features.get(n), dict) and features[n].get("_type") == "ClassLabel"]
        if len(classes) > 1:
            raise DataError(f"data.label: {shard.path} has {len(classes)} ClassLabel columns ({', '.join(classes)}); "
                            f"allowed: data.label naming one")
        if not classes and "label" not in kinds:
            raise DataError(f"data.label: {shard.path} has no ClassLabel column and no column 'label'; allowed: "
                            f"data.label naming one of its columns: {listed}")
        label = classes[0] if classes else "label"
    if kinds[label] not in ("number", "text"):
        raise DataError(f"data.label: column {label!r} of {shard.path} is {shard.schema.field(label).type}; allowed: "
                        f"a column of class ids (integers from 0) or class names")
    client = need("client_id", options.client_id) if options.client_id is not None else None
    if client is not None and (client == label or kinds[client] not in ("number", "text")):
        raise DataError(f"data.client_id: column {client!r} of {shard.path} is "
                        f"{'the label' if client == label else shard.schema.field(client).type}; allowed: a column of "
                        f"client ids (integers or names), not the label")
    taken = {label, client}
    if options.input is not None:
        inputs = [options.input] if isinstance(options.input, str) else list(options.input)
        if not inputs:
            raise ConfigError("data.input: an empty list; allowed: a column, a list of columns, or null")
        inputs = list(dict.fromkeys(inputs))
        for name in inputs:
            need("input", name)
            if name in taken:
                raise DataError(f"data.input: {name!r} is the {'label' if name == label else 'client-id'} column; "
                                f"allowed: other columns of {shard.path}: {listed}")
        found = {"image" if kinds[n] == "binary" else kinds[n] for n in inputs}
        kind = found.pop() if len(found) == 1 else "mixed"
        if kind in ("vector", "number"):
            kind = "number"
        if kind in ("mixed", "other") or (kind == "image" and len(inputs) > 1):
            shown = ", ".join(f"{n} ({shard.schema.field(n).type})" for n in inputs)
            raise DataError(f"data.input: {shown} of {shard.path}; allowed: one image column, text columns "
                            f"(joined by a space), or numeric columns (a float matrix)")
    else:
        free = [n for n in names if n not in taken]
        images = [n for n in free if kinds[n] == "image"]
        texts = [n for n in free if kinds[n] == "text"]
        numbers = [n for n in free if kinds[n] in ("number", "vector")]
        if len(images) > 1 or (not images and len(texts) > 1):
            many = images if len(images) > 1 else texts
            raise DataError(f"data.input: {shard.path} has {len(many)} {'image' if many is images else 'text'} columns "
                            f"({', '.join(many)}); allowed: data.input naming the column (or text columns) to read")
        if images or texts:
            inputs, kind = (images, "image") if images else (texts, "text")
        elif numbers:
            inputs, kind = numbers, "number"
        else:
            raise DataError(f"data.input: {shard.path} has no image, text or numeric column besides the label "
                            f"({listed}); allowed: data.input naming the input column(s)")
    feature = features.get(label)
    names_ = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    class_names = tuple(str(n) for n in names_) if isinstance(names_, list) and names_ else None
    return Columns(label, tuple(inputs), kind, client, class_names)


def _check_schema(shard: Shard, first: Shard, cols: Columns) -> None:
    """Every shard has the columns read, of the kind the first shard's have."""
    for name in dict.fromkeys([cols.label, *cols.inputs, *([cols.client_id] if cols.client_id else [])]):
        if name not in shard.schema.names:
            raise DataError(f"data: {shard.path} has no column {name!r} (which {first.path} has); allowed: shards "
                            f"with the same columns; its columns: {', '.join(shard.schema.names)}")
        a, b = (_kind(s.schema.field(name), None) for s in (first, shard))
        if a != b and {a, b} != {"image", "binary"}:
            raise DataError(f"data: column {name!r} is {shard.schema.field(name).type} in {shard.path} but "
                            f"{first.schema.field(name).type} in {first.path}; allowed: one type in every shard")


def _dictionary_leaves(shard: Shard, columns: list[str]) -> list[str]:
    """The Parquet leaves read dictionary-encoded: binary and string columns, an image's bytes."""
    pa = _pa()
    out = []
    for name in columns:
        t = shard.schema.field(name).type
        if pa.types.is_struct(t):
            out += [f"{name}.{t.field(i).name}" for i in range(t.num_fields) if _binary_like(t.field(i).type)]
        elif _binary_like(t):
            out.append(name)
    return out if shard.kind == "parquet" else []


def _null(shard: Shard, arr: Any, column: str, start: int, what: str) -> None:
    if arr.null_count:
        row = start + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"data: {shard.path}: row {row} of column {column!r} is empty (null); "
                        f"allowed: {what} in every row")


def _plain(arr: Any) -> Any:
    pa = _pa()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _values(shard: Shard, arr: Any, column: str, start: int, what: str) -> np.ndarray:
    """A label or client-id column's cells: numbers, or names (object array)."""
    _null(shard, arr, column, start, what)
    arr = _plain(arr)
    if _binary_like(arr.type):
        return np.asarray(arr.to_pylist(), dtype=object)
    return np.array(arr.to_numpy(zero_copy_only=False))  # a copy: not a view of a mapped file


def _numbers(shard: Shard, arr: Any, column: str, start: int) -> np.ndarray:
    """A numeric column as float64 rows ``(n, k)``: a number, or a list of k numbers, a row."""
    pa = _pa()
    _null(shard, arr, column, start, "a number")
    arr = _plain(arr)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        lengths = pa.compute.list_value_length(arr).to_numpy(zero_copy_only=False)
        flat = arr.flatten()
        if len(lengths) and (lengths != lengths[0]).any():
            row = start + int(np.flatnonzero(lengths != lengths[0])[0])
            raise DataError(f"data: {shard.path}: row {row} of column {column!r} holds {lengths[row - start]} numbers "
                            f"where row {start} holds {lengths[0]}; allowed: as many numbers in every row")
        _null(shard, flat, column, start, "numbers (no null inside a list)")
        width = int(lengths[0]) if len(lengths) else 0
        return flat.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(arr), width)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, 1)


def _texts(shard: Shard, arr: Any, column: str, start: int) -> list[str]:
    pa = _pa()
    _null(shard, arr, column, start, "a text")
    if pa.types.is_dictionary(arr.type):
        words = arr.dictionary.to_pylist()
        return [words[i] for i in arr.indices.to_numpy(zero_copy_only=False)]
    return arr.to_pylist()


# ---------------------------------------------------------------------------------------
# Images


class _Cell:
    """One image cell, read as :func:`~fedrift.data.files.read_bounded` reads a zip member: its
    size first (refused unread past ``IMAGE_BYTES``), then its bytes."""

    def __init__(self, values: Any, k: int, size: int, where: str):
        self.values, self.k, self.size, self.where = values, k, size, where

    def info(self) -> SimpleNamespace:
        return SimpleNamespace(file_size=self.size)

    def read_bytes(self) -> bytes:
        return self.values[self.k].as_py()

    def __str__(self) -> str:
        return self.where


def _image_cells(shard: Shard, arr: Any, column: str, start: int) -> tuple[Any, np.ndarray, bool]:
    """The values holding a batch's image bytes, each row's index into them, and whether
    they are a dictionary (rows may share a value)."""
    pa = _pa()
    if pa.types.is_struct(arr.type):
        _null(shard, arr, column, start, "an image")
        arr = arr.field("bytes")
        if arr.null_count:
            row = start + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"data: {shard.path}: row {row} of column {column!r} holds no image bytes (a path only); "
                            f"allowed: images stored in the file (save_to_disk and push_to_hub embed them)")
    _null(shard, arr, column, start, "an image")
    if pa.types.is_dictionary(arr.type):
        return arr.dictionary, arr.indices.to_numpy(zero_copy_only=False).astype(np.int64), True
    return arr, np.arange(len(arr), dtype=np.int64), False


def _decode_shard(shard: Shard, column: str, out: np.ndarray, size: int, channels: int, bar: Any) -> None:
    """A shard's images into ``out`` (its rows), one record batch at a time."""
    pa = _pa()
    shard.check_parquet_expansion([column])
    row, total = 0, 0
    for batch in shard.batches([column], _dictionary_leaves(shard, [column])):
        arr = batch.column(0)
        total += _decoded_bytes(arr)
        _bound(shard, total, [column])
        values, idx, repeats = _image_cells(shard, arr, column, row)
        sizes = pa.compute.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        if row + len(idx) > len(out):  # more rows than the first pass read: the file changed meanwhile
            row += len(idx)
            break
        done: dict[int, np.ndarray] = {}  # a dictionary's repeated cells decoded once (a few held)
        for i, k in enumerate(idx.tolist()):
            pixels = done.get(k)
            if pixels is None:
                cell = _Cell(values, k, int(sizes[k]), f"{shard.path}: row {row + i} of column {column!r}")
                pixels = read_image(cell, size, channels)
                if repeats and len(done) < MEMO:
                    done[k] = pixels
            out[row + i] = pixels
        row += len(idx)
        bar.update(len(idx))
    if row != len(out):
        raise malformed(shard.path, SHARD, f"column {column!r} has {row} rows where its first read found {len(out)}")


def _shard_key(shard: Shard, column: str, size: int, channels: int) -> str:
    """The cache key of a shard's decoded images: the file's content, the column, size, channels."""
    h = hashlib.sha256(f"{FORMAT}:hf:{column}:{size}:{channels}\n".encode())
    try:
        with shard.path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as err:
        raise DataError(f"data: {shard.path} cannot be read ({err.strerror or err}); expected {SHARD}") from None
    return h.hexdigest()[:40]


def _images(shards: list[Shard], counts: list[int], column: str, size: int, channels: int, label: str) -> np.ndarray:
    """uint8 ``(n, channels, size, size)``: each shard's images from fedrift's cache when this
    very file was decoded at this size before, else decoded and cached."""
    from tqdm.auto import tqdm

    out = np.empty((sum(counts), channels, size, size), dtype=np.uint8)
    at = 0
    with tqdm(total=len(out), desc=f"decoding {label}", unit="img", disable=None, leave=False) as bar:
        for shard, n in zip(shards, counts):
            part = out[at:at + n]
            entry = cache_dir() / f"images-{_shard_key(shard, column, size, channels)}.npy"
            if cached_into(entry, part):
                bar.update(n)
            else:
                _decode_shard(shard, column, part, size, channels, bar)
                keep(entry, part)
            at += n
    return out


# ---------------------------------------------------------------------------------------
# One split


@dataclass
class Rows:
    """What the first pass read of one split: labels, client ids, text or numeric inputs."""

    labels: np.ndarray
    groups: np.ndarray | None
    texts: list[str] | None
    numbers: np.ndarray | None
    counts: list[int]  # rows per shard


def _read_split(split: Split, shards: list[Shard], cols: Columns) -> Rows:
    labels: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    texts: list[str] = []
    numbers: list[np.ndarray] = []
    counts: list[int] = []
    small = cols.small
    for shard in shards:
        shard.check_parquet_expansion(small)
        row, total = 0, 0
        for batch in shard.batches(small, _dictionary_leaves(shard, small)):
            arrays = dict(zip(small, batch.columns))
            total += sum(_decoded_bytes(a) for a in arrays.values())
            _bound(shard, total, small)
            labels.append(_values(shard, arrays[cols.label], cols.label, row, "a class"))
            if cols.client_id:
                groups.append(_values(shard, arrays[cols.client_id], cols.client_id, row, "a client id"))
            if cols.kind == "text":
                parts = [_texts(shard, arrays[c], c, row) for c in cols.inputs]
                texts += [" ".join(words) for words in zip(*parts)]
            elif cols.kind == "number":
                numbers.append(np.hstack([_numbers(shard, arrays[c], c, row) for c in cols.inputs]))
            row += batch.num_rows
        counts.append(row)
    if not sum(counts):
        raise DataError(f"data.root: split {split.name!r} ({_named(split.files)}) holds no rows; allowed: at least "
                        f"one row in the training and the test split")
    if numbers and len({m.shape[1] for m in numbers}) > 1:
        raise DataError(f"data.input: the columns {', '.join(cols.inputs)} hold lists of another length in some "
                        f"shards of split {split.name!r}; allowed: as many numbers in every row")
    return Rows(
        np.concatenate(labels), np.concatenate(groups) if groups else None, texts if cols.kind == "text" else None,
        np.concatenate(numbers) if numbers else None, counts,
    )


def _ids(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
    """Values as ids 0..K-1: the training split's distinct values sorted, then those seen only
    in the test split (as femnist numbers its writers)."""
    if train.dtype == object or test.dtype == object:  # names (one type in every shard: _check_schema)
        train, test = train.astype(str), test.astype(str)
    seen = list(np.unique(train))
    extra = sorted(set(np.unique(test).tolist()) - set(seen))
    names = seen + extra
    index = {v: k for k, v in enumerate(names)}
    return (np.asarray([index[v] for v in train.tolist()], dtype=np.int64),
            np.asarray([index[v] for v in test.tolist()], dtype=np.int64), names)


def _labels(
    cols: Columns, train: np.ndarray, test: np.ndarray, options: HfParams, where: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """Class ids from 0 (names: sorted, both splits) and the class count, checked."""
    if train.dtype == object or test.dtype == object:
        names = sorted(set(train.tolist()) | set(test.tolist()), key=str)
        index = {v: k for k, v in enumerate(names)}
        train = np.asarray([index[v] for v in train.tolist()], dtype=np.int64)
        test = np.asarray([index[v] for v in test.tolist()], dtype=np.int64)
        count = options.num_classes or len(names)
    else:
        count = options.num_classes or (len(cols.class_names) if cols.class_names else None)
        if cols.class_names and options.num_classes is None:
            for split, y in (("train", train), ("test", test)):
                high = y.max() if len(y) else 0
                if high >= len(cols.class_names):
                    raise DataError(f"{where}: column {cols.label!r} of the {split} split holds class id {high:g}, "
                                    f"but its ClassLabel names {len(cols.class_names)} classes; allowed: ids "
                                    f"0..{len(cols.class_names) - 1} (or data.num_classes={int(high) + 1} or more)")
    count = class_count(train, test, count, where)
    return train.astype(np.int64), test.astype(np.int64), count


def _hold_out(parts: dict, y: np.ndarray, options: HfParams) -> tuple[dict, dict]:
    """Train and test parts of one split: ``test_fraction`` of each class to the test side."""
    train, test = stratified_split(y, options.test_fraction, options.split_seed)

    def take(value: Any, rows: np.ndarray) -> Any:
        if value is None:
            return None
        return [value[i] for i in rows] if isinstance(value, list) else value[rows]

    return {k: take(v, train) for k, v in parts.items()}, {k: take(v, test) for k, v in parts.items()}


def held_out_rows(root: Path, options: HfParams) -> tuple[str, np.ndarray, np.ndarray] | None:
    """For a dataset stored without a test split: the split's name, and which of its stored
    rows :func:`load_hf` makes its train and its test samples (in that order), from the labels
    as stored, as it draws them; None when the dataset has a test split (its rows are as
    stored). ``fedrift partition export`` indexes the stored rows with them."""
    train_split, test_split = _splits(need_root(root, "hf", HOLDS, file_ok=True), options)
    if test_split is not None:
        return None
    shards = [Shard(p) for p in train_split.files]
    cols = _columns(shards[0], train_split.features or shards[0].features(), options)
    labels = _read_split(train_split, shards, cols).labels
    return (train_split.name, *stratified_split(labels, options.test_fraction, options.split_seed))


@DATASETS.register(
    "hf",
    "your data as the field keeps it: a save_to_disk folder, Parquet or Arrow files in data.root (images, text or "
    "numbers; client_id column: natural)",
    params=HfParams,
)
def load_hf(root: Path | None, options: HfParams) -> Dataset:
    root = need_root(root, "hf", HOLDS, file_ok=True)
    if not root.exists():
        raise _missing(root)
    _pa()
    train_split, test_split = _splits(root, options)
    splits = [s for s in (train_split, test_split) if s is not None]
    shards = {s.name: [Shard(p) for p in s.files] for s in splits}
    first = shards[train_split.name][0]
    features = train_split.features or first.features()
    cols = _columns(first, features, options)
    for s in splits:
        for shard in shards[s.name]:
            _check_schema(shard, first, cols)
    rows = {s.name: _read_split(s, shards[s.name], cols) for s in splits}
    where = f"data.root: {root}"

    def parts(split: Split) -> dict:
        r = rows[split.name]
        x: Any = r.texts if cols.kind == "text" else r.numbers
        if cols.kind == "image":
            x = _images(shards[split.name], r.counts, cols.inputs[0], options.size, options.channels, split.name)
        return {"x": x, "y": r.labels, "g": r.groups}

    train = parts(train_split)
    if test_split is None:
        train, test = _hold_out(train, train["y"], options)
        say_once(f"hf: {root} holds no test split; data.test_fraction {options.test_fraction:g} of each class of "
                 f"{train_split.name!r} is the test set (drawn with data.split_seed {options.split_seed})")
    else:
        test = parts(test_split)
    y_train, y_test, classes = _labels(cols, train["y"], test["y"], options, where)
    g_train = g_test = None
    if cols.client_id:
        g_train, g_test, _ = _ids(train["g"], test["g"])
    if cols.kind == "image":
        ds = image_dataset("hf", train["x"], y_train, test["x"], y_test, classes, g_train, g_test)
    elif cols.kind == "text":
        from fedrift.data.text import TextParams, text_dataset

        text = TextParams(max_tokens=options.max_tokens, dynamic_padding=options.dynamic_padding)
        ds = text_dataset("hf", (train["x"], y_train), (test["x"], y_test), classes, text)
        ds = replace(ds, train_groups=g_train, test_groups=g_test)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused by check_dataset
            xs = [torch.from_numpy(np.ascontiguousarray(part["x"], dtype=np.float32)) for part in (train, test)]
        ds = Dataset("hf", xs[0], torch.from_numpy(y_train), xs[1], torch.from_numpy(y_test), classes, g_train, g_test)
    return replace(ds, source=str(root))


__all__ = ["HfParams", "held_out_rows", "load_hf"]
