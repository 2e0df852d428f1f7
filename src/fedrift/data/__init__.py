"""Datasets (registry ``DATASETS``) and partitions (registry ``PARTITIONS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedrift.data.base import Dataset, arrays_dataset, check_dataset
from fedrift.errors import ConfigError
from fedrift.registry import Registry

DATASETS: Registry = Registry("dataset")

# Importing the modules registers their loaders.
from fedrift.data import cifar, embedded, femnist, folders, mnist1d, npz, synthetic, text  # noqa: E402,F401
from fedrift.data import domains  # noqa: E402,F401
from fedrift.data import hf  # noqa: E402,F401  (pyarrow is imported when an hf dataset loads)
# The "devices" partition registers itself in PARTITIONS (data/partition.py), building on its helpers.
from fedrift.data import devices  # noqa: E402,F401
from fedrift.data import flwr_partition  # noqa: E402,F401  ("flwr": flwr_datasets is imported when it partitions)


# The built-in datasets read from data.root; the other built-in ones are embedded (installed
# packages, generators) and read no folder (tests/test_refusals.py checks both lists against
# the loaders). A plugin's dataset gets data.root whatever it does with it.
FROM_ROOT = ("cifar10", "cifar100", "tinyimagenet", "femnist", "imagefolder", "npz", "sst5", "agnews")
FROM_ROOT += ("office_caltech10", "hf")


def load_dataset(name: str, root: Path | None, options: Any) -> Dataset:
    """Load dataset ``name``; ``options`` is an instance of its registered params class. A
    ``root`` given to an embedded dataset is refused: the user meant files it would ignore.
    Data read from files (and a plugin's) passes :func:`~fedrift.data.base.check_dataset` once
    here: empty splits, class ids beyond the model's head, non-finite or absurd features are a
    DataError naming the file, before anything is sized from them."""
    entry = DATASETS.get(name, "data.name")
    generated = name not in FROM_ROOT and entry.source == "built in"  # embedded: no file of the user's
    if root is not None and generated:
        raise ConfigError(
            f"data.root: {name} is embedded and reads no folder; allowed: no data.root with {name}, "
            f"or a dataset read from data.root ({', '.join(FROM_ROOT)})"
        )
    dataset = entry.factory(root=root, options=options)
    return dataset if generated else check_dataset(dataset, root)


__all__ = ["DATASETS", "FROM_ROOT", "Dataset", "arrays_dataset", "check_dataset", "load_dataset"]
