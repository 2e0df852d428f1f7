"""``flwr``: Flower Datasets' partitioners by name (the ``flwr-datasets`` extra).

``partition: {name: flwr, partitioner: DirichletPartitioner, args: {alpha: 0.3}}`` builds
``flwr_datasets.partitioner.DirichletPartitioner(num_partitions=num_clients,
partition_by="label", alpha=0.3, seed=<the run's seed>)``, hands it the training set as a
``datasets.Dataset`` and trains on the clients it makes, sample for sample: client k holds
exactly the rows of the partitioner's ``load_partition(k)``, in its order.

The Dataset the partitioner sees has a row per training sample, in fedrift's order: a
``label`` column (the class ids), and, when ``partition_by`` names anything else and the
dataset has natural groups (``synthetic``'s devices, FEMNIST's writers, an ``hf`` dataset's
``data.client_id``), a column of that name holding them (fedrift's ``train_groups``), so a
Flower config's ``partition_by: writer_id`` works as written; plus a column of row numbers,
which the partitioner carries along wherever it moves rows (ShardPartitioner sorts the set),
so each client's rows are read back as fedrift's indices. Once it has drawn them, the
partitioner's own index lists (its ``_partition_id_to_indices``, positions in its
``dataset``) are read directly: a ``load_partition`` per client costs tens of milliseconds on
60,000 rows (3,500 writers: 27 s, against 4 s in all this way). They are checked against its
``load_partition(0)``, and where a partitioner keeps none (``IidPartitioner`` takes
``Dataset.shard`` blocks) or they disagree, every client is read with ``load_partition``.

As ``FederatedDataset`` does by default (``shuffle=True``), the training set is shuffled
before the partitioner sees it (``Dataset.shuffle(seed=shuffle_seed)``; ``shuffle_dataset:
false`` leaves fedrift's order): the partition is the one a Flower user's
``FederatedDataset(..., partitioners={"train": P(...)})`` gives on the same training rows.
Seeds: the partitioner's ``seed`` argument and ``shuffle_seed`` default to the run's ``seed``
(not Flower's 42; a run with ``seed: 42`` and the defaults gives Flower's defaults), so the
same config always gives the same partition; ``args.seed: null`` (a fresh draw each time) is
refused.

Why ``args:``, a mapping, and not the partitioner's keywords beside ``name``: the
partitioner's arguments and fedrift's own keys stay apart (both have a ``seed``, a
``shuffle``; Flower's ``num_partitions`` is fedrift's ``num_clients``), the mapping is
exactly the keyword arguments passed, checked against the partitioner's signature, and it
reads the same in YAML (``args: {alpha: 0.3, min_partition_size: 5}``) and on the command
line (``partition.args.alpha=0.3``). ``num_clients`` is passed as ``num_partitions`` to the
partitioners that take one (null: 20); for those that make their own count
(``NaturalIdPartitioner``, ``GroupedNaturalIdPartitioner``, ``SizePartitioner`` and
``InnerDirichletPartitioner`` from ``partition_sizes``) a number must equal that count.
``partition_by`` defaults to ``label``, and to the groups (as a column named ``client_id``)
for the natural-id partitioners.

Supported: every class of ``flwr_datasets.partitioner`` that gives clients rows (samples)
from a labels or ids column, found by enumerating the module (Continuous, Dirichlet,
Distribution, Exponential, GroupedNaturalId, Iid, InnerDirichlet, Linear, NaturalId,
Pathological, Shard, Size, Square), less :data:`LEFT_OUT`: the abstract ``Partitioner``;
``IdToSizeFncPartitioner``, whose ``partition_id_to_size_fn`` is a Python function a config
cannot hold (its named forms Linear, Square and Exponential are here); the two ``Vertical*``
partitioners, which split the columns (features) among parties that all hold every sample:
vertical federated learning, where fedrift's clients hold samples.

Local test splits are drawn as the label partitions draw them (:func:`local_test_splits`),
except under a natural-id partitioner of the groups, where a client's test samples are its
groups' own when the dataset marks them (as ``natural`` does). A partitioner's refusal (too
few samples, ``min_partition_size`` never reached) is one line naming the call; its warnings
are said once each, in one line; its progress bar is not shown. A client left with no
sample is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import sys
import warnings
from typing import Annotated, Any, Iterator

import numpy as np
from pydantic import Field

from fedrift.data.base import Dataset
from fedrift.data.notices import say_once
from fedrift.data.partition import PARTITIONS, PartitionParams, labels_of, local_test_splits, partition_rng
from fedrift.data.partition_base import Partition
from fedrift.errors import ConfigError
from fedrift.params import params

EXTRA = "partition.name: flwr needs the flwr-datasets extra: pip install 'fedrift[flwr-datasets]'"
LABEL = "label"  # the column of class ids
GROUPS = "client_id"  # the natural-id partitioners' default partition_by: the dataset's groups
INDEX = "__fedrift_row__"  # each row's index in fedrift's training set
DEFAULT_CLIENTS = 20
NATURAL = ("NaturalIdPartitioner", "GroupedNaturalIdPartitioner")  # partition_by defaults to the groups
LEFT_OUT = {
    "Partitioner": "is the abstract base class",
    "IdToSizeFncPartitioner": "takes a Python function (partition_id_to_size_fn), which a config cannot hold; "
                              "its named forms LinearPartitioner, SquarePartitioner and ExponentialPartitioner are here",
    "VerticalEvenPartitioner": "splits the columns (features) among parties that all hold every sample (vertical "
                               "federated learning); fedrift's clients hold samples",
    "VerticalSizePartitioner": "splits the columns (features) among parties that all hold every sample (vertical "
                               "federated learning); fedrift's clients hold samples",
}
_PASSED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@params
class FlwrParams(PartitionParams):
    """Options of ``partition.name: flwr``.

    partitioner: the class name in ``flwr_datasets.partitioner`` (``DirichletPartitioner``,
        ``ShardPartitioner``, ``PathologicalPartitioner``, ``NaturalIdPartitioner``, ...).
    args: the partitioner's own keyword arguments, as its signature names them (``alpha``,
        ``partition_by``, ``min_partition_size``, ``seed``, ...); ``partition_by`` defaults
        to ``label`` (another name: the dataset's natural groups), ``seed`` to the run's seed.
    num_clients: passed as ``num_partitions`` where the partitioner takes one (null: 20); for
        one that makes its own count (natural ids, ``partition_sizes``), null or that count.
    min_local_test: the smallest local test split (a client's split is otherwise the global
        test set scaled by its share of the training samples).
    shuffle_dataset: shuffle the training set before the partitioner sees it, as Flower's
        ``FederatedDataset`` does by default (false: fedrift's order).
    shuffle_seed: that shuffle's seed (``FederatedDataset``'s ``seed``); null: the run's seed.
    """

    partitioner: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    num_clients: Annotated[int, Field(ge=1)] | None = None
    shuffle_dataset: bool = True
    shuffle_seed: Annotated[int, Field(ge=0)] | None = None


# ---------------------------------------------------------------------------------------
# The partitioners


def _modules() -> tuple[Any, Any]:
    """``datasets`` and ``flwr_datasets.partitioner``, imported now (the extra's packages)."""
    try:
        import datasets
        import flwr_datasets.partitioner as partitioners
    except ImportError:
        raise ConfigError(EXTRA) from None
    return datasets, partitioners


def supported(partitioners: Any) -> dict[str, type]:
    """The partitioner classes ``partition.partitioner`` may name, by name."""
    base = partitioners.Partitioner
    return {name: cls for name, cls in sorted(inspect.getmembers(partitioners, inspect.isclass))
            if issubclass(cls, base) and not inspect.isabstract(cls) and name not in LEFT_OUT}


def _partitioner_class(name: str | None, partitioners: Any) -> type:
    found = supported(partitioners)
    allowed = ", ".join(found)
    if name is None:
        raise ConfigError(f"partition.partitioner: partition.name flwr needs one; allowed: {allowed}")
    if name in LEFT_OUT:
        raise ConfigError(f"partition.partitioner: {name} is left out: it {LEFT_OUT[name]}; allowed: {allowed}")
    if name not in found:
        raise ConfigError(f"partition.partitioner: unknown partitioner {name!r}; allowed: {allowed}")
    return found[name]


def _arguments(cls: type) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(cls).parameters.items() if p.kind in _PASSED}


def _allowed_args(name: str, signature: dict[str, inspect.Parameter]) -> str:
    own = [n for n in signature if n != "num_partitions"]
    tail = " (num_partitions: partition.num_clients)" if "num_partitions" in signature else ""
    return f"allowed: {name}'s arguments {', '.join(own) or 'none'}{tail}"


def partitioner_kwargs(cls: type, options: FlwrParams, seed: int) -> dict[str, Any]:
    """The keyword arguments ``cls`` is built with: ``options.args`` checked against its
    signature, ``num_partitions`` from ``num_clients``, ``partition_by`` and ``seed`` defaulted."""
    name = cls.__name__
    signature = _arguments(cls)
    args = dict(options.args)
    for key in args:
        if key == "num_partitions" and "num_partitions" in signature:
            raise ConfigError(f"partition.args.num_partitions: fedrift's partition.num_clients sets it; allowed: "
                              f"partition.num_clients={args[key]}")
        if key not in signature:
            raise ConfigError(f"partition.args.{key}: not an argument of {name}; {_allowed_args(name, signature)}")
    if "seed" in args and args["seed"] is None:
        raise ConfigError(f"partition.args.seed: null draws another partition each time; allowed: a whole number "
                          f"(absent: the run's seed, {seed})")
    kwargs: dict[str, Any] = {}
    if "num_partitions" in signature:
        kwargs["num_partitions"] = options.num_clients or DEFAULT_CLIENTS
    if "partition_by" in signature:
        kwargs["partition_by"] = GROUPS if name in NATURAL else LABEL
    if "seed" in signature:
        kwargs["seed"] = int(seed)
    for key, value in args.items():
        kwargs[key] = _coerced(signature[key], value)
    missing = [n for n, p in signature.items() if p.default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise ConfigError(f"partition.args.{missing[0]}: {name} needs it (no default); {_allowed_args(name, signature)}")
    return kwargs


def _coerced(param: inspect.Parameter, value: Any) -> Any:
    """A list for an argument that takes a numpy array and no list (DistributionPartitioner's
    ``distribution_array``) as that array; every other value as the config gives it."""
    kind = str(param.annotation)
    if isinstance(value, list) and "ndarray" in kind and "list" not in kind.lower() and "Sequence" not in kind:
        return np.asarray(value)
    return value


def _call(name: str, kwargs: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={np.asarray(v).tolist() if isinstance(v, np.ndarray) else v!r}" for k, v in kwargs.items())
    return f"{name}({shown})"


# ---------------------------------------------------------------------------------------
# Running one


@contextlib.contextmanager
def _quiet(cls: type) -> Iterator[None]:
    """The partitioner's progress bar hidden (NaturalIdPartitioner's module-level ``tqdm``, run
    with ``disable=True`` meanwhile: the process's stderr is left alone), its warnings said once
    each on one line through fedrift's notices (a re-draw warning repeated with a count: the
    last one); deprecation notes of the libraries under it are not the user's business."""
    module = sys.modules.get(cls.__module__)
    bar = getattr(module, "tqdm", None)
    if bar is not None:
        setattr(module, "tqdm", functools.partial(bar, disable=True))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        if bar is not None:
            setattr(module, "tqdm", bar)
    lines: dict[str, str] = {}
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            continue  # the libraries' notes to their callers (pyarrow's under ShardPartitioner's sort)
        text = " ".join(str(w.message).split())
        lines[re.sub(r"\d+", "#", text)] = text
    for text in lines.values():
        say_once(f"partition flwr: {cls.__name__}: {text}")


def _training_rows(datasets: Any, dataset: Dataset, by: str | None, options: FlwrParams, seed: int) -> Any:
    """The ``datasets.Dataset`` the partitioner sees: labels, the groups as ``by``, row numbers."""
    y = labels_of(dataset.y_train)
    columns: dict[str, Any] = {LABEL: y}
    if by is not None and by != LABEL:
        if by == INDEX:
            raise ConfigError(f"partition.args.partition_by: {INDEX} is fedrift's own column; allowed: {LABEL}, or a "
                              f"name for the dataset's natural groups")
        if dataset.train_groups is None:
            given = "partition_by" in options.args
            what = f"{by!r} names" if given else f"{options.partitioner} partitions by {by!r} (its default here):"
            raise ConfigError(f"partition.args.partition_by: {what} the dataset's natural groups, and {dataset.name!r} "
                              f"has none; allowed: {LABEL} (or a dataset with groups, such as synthetic)")
        columns[by] = np.asarray(dataset.train_groups, dtype=np.int64)
    columns[INDEX] = np.arange(y.size, dtype=np.int64)
    rows = datasets.Dataset.from_dict(columns)
    if options.shuffle_dataset:
        rows = rows.shuffle(seed=seed if options.shuffle_seed is None else options.shuffle_seed)
    return rows


def _row_numbers(rows: Any) -> np.ndarray:
    """The row-number column of a ``datasets.Dataset``, in its order, in one Arrow read (a
    ``Column`` of datasets 4 turned into an array reads row by row: 60,000 rows in seconds)."""
    column = rows.select_columns([INDEX]).with_format("arrow")[:][INDEX]
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _client_rows(partitioner: Any, first: Any) -> list[np.ndarray]:
    """Every client's rows, as fedrift's training indices, in the partitioner's order."""
    count = int(partitioner.num_partitions)
    table = getattr(partitioner, "_partition_id_to_indices", None)  # positions in partitioner.dataset
    head = _row_numbers(first)
    if isinstance(table, dict) and sorted(table) == list(range(count)):
        rows = _row_numbers(partitioner.dataset)  # after its own sort, if any
        out = [rows[np.asarray(table[k], dtype=np.int64).reshape(-1)] for k in range(count)]
        if np.array_equal(out[0], head):
            return out
    return [head, *(_row_numbers(partitioner.load_partition(k)) for k in range(1, count))]


def _groups_tests(partitioner: Any, dataset: Dataset, count: int) -> list[np.ndarray] | None:
    """Client k's test samples: those of its natural ids, for a natural-id partitioner of the
    groups on a dataset whose test samples carry them; else None."""
    if dataset.test_groups is None:
        return None
    ids = getattr(partitioner, "partition_id_to_natural_ids", None)  # GroupedNaturalIdPartitioner
    if ids is None:
        single = getattr(partitioner, "partition_id_to_natural_id", None)  # NaturalIdPartitioner
        ids = None if single is None else {k: [v] for k, v in single.items()}
    if not isinstance(ids, dict) or sorted(ids) != list(range(count)):
        return None
    test_groups = np.asarray(dataset.test_groups, dtype=np.int64)
    return [np.flatnonzero(np.isin(test_groups, np.asarray(ids[k], dtype=np.int64))).astype(np.int64)
            for k in range(count)]


_REFUSED = (ValueError, TypeError, KeyError, IndexError, AssertionError, ZeroDivisionError, FloatingPointError)


@PARTITIONS.register(
    "flwr",
    "Flower Datasets' partitioners by name (partitioner: DirichletPartitioner, ShardPartitioner, ...; args: its "
    "keyword arguments): the partition Flower makes, sample for sample",
    FlwrParams,
)
def flwr_partition(dataset: Dataset, options: FlwrParams, seed: int) -> Partition:
    """Client k holds the rows of ``partitioner.load_partition(k)`` (module docstring)."""
    partition_rng(seed, "flwr", "check")  # a bad run seed: refused as every partition refuses it
    datasets, partitioners = _modules()
    cls = _partitioner_class(options.partitioner, partitioners)
    name = cls.__name__
    kwargs = partitioner_kwargs(cls, options, seed)
    by = kwargs.get("partition_by")
    rows = _training_rows(datasets, dataset, by if isinstance(by, str) else None, options, seed)
    call = _call(name, kwargs)
    try:
        with _quiet(cls):
            partitioner = cls(**kwargs)
            partitioner.dataset = rows
            first = partitioner.load_partition(0)
            train = _client_rows(partitioner, first)
    except ConfigError:
        raise
    except _REFUSED as err:
        text = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"partition.args: {call} refused the training set ({rows.num_rows} samples): {text}") from None
    count = len(train)
    if options.num_clients is not None and "num_partitions" not in kwargs and options.num_clients != count:
        raise ConfigError(f"partition.num_clients: {options.num_clients} but {call} makes {count} clients; "
                          f"allowed: {count} or null (as many as it makes)")
    empty = [k for k, ix in enumerate(train) if ix.size == 0]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        raise ConfigError(f"partition.args: {call} leaves client {shown} of {count} with no training sample; "
                          f"allowed: arguments that give every client one (fewer clients, a min_partition_size)")
    y_train, y_test = labels_of(dataset.y_train), labels_of(dataset.y_test)
    test = _groups_tests(partitioner, dataset, count) if name in NATURAL and by != LABEL else None
    if test is None:
        test = local_test_splits(y_train, train, y_test, options.min_local_test, partition_rng(seed, "flwr", "test"))
    resolved = {k: np.asarray(v).tolist() if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    shuffle_seed = (seed if options.shuffle_seed is None else options.shuffle_seed) if options.shuffle_dataset else None
    opts = dataclasses.asdict(options) | {"partitioner_arguments": resolved, "shuffle_seed": shuffle_seed,
                                          "by_groups": by != LABEL}
    return Partition(name="flwr", train=train, test=test, options=opts)


__all__ = ["EXTRA", "LEFT_OUT", "FlwrParams", "flwr_partition", "partitioner_kwargs", "supported"]
