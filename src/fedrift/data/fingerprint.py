"""Fingerprints of a run's data: what a node (a Flower SuperNode) or a resumed run must hold
for its results to be the ones the run's config describes.

A run's numbers follow from its data as much as from its config, and the config names the
data only by place (``data.name``, ``data.root``): a device whose copy of the files differs
(rows permuted, a file of another version, a cut-down copy) trains on other samples than the
server planned, and its run finishes with other numbers and no word. A fingerprint is short
enough to send or store and cheap on large datasets: the sample count, a hash of the labels,
and a hash of up to ``ROWS`` rows spread evenly over the data (every row when there are
fewer), in the order the client reads them. The partition is drawn from the labels on each
side, so a node with permuted rows gets other row numbers, other labels at them, or both.

``data.accept_changed: true`` accepts a difference knowingly (a warning line names it).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

ROWS = 1024  # rows hashed per client (or dataset split): every row up to this many, else this many spread evenly
PARTS = ("samples", "labels", "rows")


def _digest(data: Any) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def rows_fingerprint(x: torch.Tensor, y: torch.Tensor, rows: np.ndarray | None = None) -> str:
    """``"SAMPLES:LABELS:ROWS"`` of the samples ``rows`` of ``(x, y)`` (all of them for None),
    in that order: their count, a hash of their labels, a hash of the shape, type and content
    of up to ``ROWS`` of their inputs, spread evenly."""
    rows = np.arange(len(y), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    take = rows if len(rows) <= ROWS else rows[np.linspace(0, len(rows) - 1, ROWS).astype(np.int64)]
    index = torch.as_tensor(take, device=x.device)
    labels = _digest(_tensor_bytes(y[torch.as_tensor(rows, device=y.device)]))
    h = hashlib.blake2b(f"{tuple(x.shape[1:])} {x.dtype}".encode(), digest_size=8)
    h.update(_tensor_bytes(x[index]))
    return f"{len(rows)}:{labels}:{h.hexdigest()}"


def client_fingerprints(dataset: Any, partition: Any) -> dict[int, str]:
    """Each client's fingerprint of its training samples (``partition.train[k]``)."""
    return {k: rows_fingerprint(dataset.x_train, dataset.y_train, partition.train[k]) for k in range(partition.num_clients)}


def dataset_fingerprint(dataset: Any) -> dict[str, str]:
    """The training and test splits' fingerprints."""
    return {"train": rows_fingerprint(dataset.x_train, dataset.y_train),
            "test": rows_fingerprint(dataset.x_test, dataset.y_test)}


def difference(found: str, expected: str) -> str:
    """What differs between two fingerprints, in words (empty when they are equal)."""
    if found == expected:
        return ""
    a, b = found.split(":"), expected.split(":")
    if len(a) != 3 or len(b) != 3:
        return f"fingerprint {found} where {expected} was expected"
    if a[0] != b[0]:
        return f"{a[0]} samples where {b[0]} were expected"
    if a[1] != b[1]:
        return f"the same {a[0]} samples' labels differ (rows permuted or relabelled?)"
    return f"the same {a[0]} samples with the same labels, but their inputs differ (rows permuted or changed?)"
