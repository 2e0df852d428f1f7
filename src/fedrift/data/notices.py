"""One-line notices about the data a run reads, said once per command.

A compare, tune or select prepares its data once per setting and again in each pool worker;
the line is said the first time only. What was said is kept in the environment
(``FEDRIFT_SAID``, short hashes of the lines), so that the pool's workers, started after the
command's own first preparation, inherit it and stay quiet too. The lines go through the
``fedrift`` logger, as the run's other warning lines do (stderr when nothing configures it).
"""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np

from fedrift.data.base import Dataset

SAID = "FEDRIFT_SAID"
# what a dataset's natural groups are, in the notice's words (others: "groups")
GROUP_WORDS = {"femnist": "writers", "synthetic": "devices"}


def say_once(line: str) -> bool:
    """Log ``line`` as a warning unless this command said it already; True if said now."""
    key = hashlib.sha1(line.encode()).hexdigest()[:12]
    said = [k for k in os.environ.get(SAID, "").split(",") if k]
    if key in said:
        return False
    os.environ[SAID] = ",".join([*said, key])
    logging.getLogger("fedrift").warning(line)
    return True


def natural_groups_notice(dataset: Dataset, partition: str, num_clients: int, by_groups: bool = False) -> str | None:
    """The line for a dataset with natural groups split by another partition, else None: its
    own groups (FEMNIST's writers) are what a federation of it would be, and a run that splits
    it by labels instead measures something else, silently (issue 51). ``by_groups``: the
    partition splits by the groups all the same (``flwr``'s NaturalIdPartitioner)."""
    if dataset.train_groups is None or partition == "natural" or by_groups:
        return None
    word = GROUP_WORDS.get(dataset.name, "groups")
    groups = int(np.unique(np.asarray(dataset.train_groups)).size)
    return (f"{dataset.name} has natural groups ({groups} {word}); this run partitions it by {partition} over "
            f"{num_clients} clients; partition.name=natural uses the {word}")


__all__ = ["GROUP_WORDS", "SAID", "natural_groups_notice", "say_once"]
