"""The data of a run on its device, and the per-client facts the engine hands to hooks."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from fedrift.config import TrainConfig
from fedrift.data.base import Dataset
from fedrift.data.partition_base import Partition
from fedrift.engine import batches
from fedrift.engine.failures import steps_done
from fedrift.engine.round_types import ClientJob


_COPIES: dict[tuple[int, str], torch.Tensor] = {}
_COPIES_LOCK = threading.Lock()


def on_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``: ``t`` itself where it is already there, else one copy per source
    tensor and device in this process, kept while ``t`` lives. The runs of a stack share one
    dataset (``experiments.stacked.prepare_stack``): on a GPU each run had made its own copy of
    it (48 runs, 48 copies of the training set), and their batches, in different tensors, were
    gathered and augmented run by run each vectorised step, where one gather serves every run
    whose data is one tensor (``executors.batched._step_batch``)."""
    device = torch.device(device)
    if t.device == device:
        return t
    key = (id(t), str(device))
    with _COPIES_LOCK:
        copy = _COPIES.get(key)
        if copy is None:
            copy = _COPIES[key] = t.to(device)
            weakref.finalize(t, _COPIES.pop, key, None)  # gone with its source (no stale id)
    return copy


class Federation:
    """The data of a run, on its device, and the per-client facts the engine hands hooks.

    Per-client index lists are two flat arrays each (``train``/``test``: offsets into one
    index array, as the partition holds them; one tensor of all indices on the device), so
    a federation of a million clients holds a few arrays, and a client's indices are a view.
    """

    def __init__(self, dataset: Dataset, partition: Partition, device: torch.device) -> None:
        self.x, self.y = on_device(dataset.x_train, device), on_device(dataset.y_train, device)
        self.x_test, self.y_test = on_device(dataset.x_test, device), on_device(dataset.y_test, device)
        self.prepare = dataset.prepare  # uint8 images, token ids: how a batch becomes model input
        self.num_clients = partition.num_clients
        self.train, self.test = partition.train, partition.test  # Ragged: offsets + indices (numpy)
        self._train_t = torch.from_numpy(self.train.values).to(device)
        self._test_t = torch.from_numpy(self.test.values).to(device)
        # the union of the clients' validation splits (empty without one): val_accuracy
        union = partition.val_union()
        val = torch.as_tensor(union, dtype=torch.int64)
        self.x_val, self.y_val = dataset.x_train[val].to(device), dataset.y_train[val].to(device)
        # client k's validation samples as positions in that union (personal models' val_local_accuracy)
        self._val_offsets = partition.val.offsets
        self._val_pos_t = torch.from_numpy(np.searchsorted(union, partition.val.values)).to(device)
        self.sizes = partition.sizes()
        # client x class counts, made once as float32 (exact below 2**24 samples of a class):
        # hooks read rows of the tensor; samplers the numpy array (the same memory on the CPU)
        counts = partition.counts(dataset.y_train.numpy(), dataset.num_classes, dtype=np.float32)
        self.label_counts = torch.from_numpy(counts).to(device)
        self.label_counts_np = counts
        self.device = device
        self._scalars: dict[float, torch.Tensor] = {}

    def indices(self, k: int) -> torch.Tensor:
        """Client k's training indices on the device (a view)."""
        o = self.train.offsets
        return self._train_t[o[k] : o[k + 1]]

    def test_indices(self, k: int) -> torch.Tensor:
        """Client k's local test split on the device (a view): indices into the test set."""
        o = self.test.offsets
        return self._test_t[o[k] : o[k + 1]]

    def val_positions(self, k: int) -> torch.Tensor:
        """Client k's validation samples as positions in ``x_val``/``y_val`` (a view)."""
        o = self._val_offsets
        return self._val_pos_t[o[k] : o[k + 1]]

    def scalar(self, value: float) -> torch.Tensor:
        """A 0-d float tensor of ``value`` on the device, made once (contexts hold a few per
        client each round; a fresh ``torch.tensor`` costs more than the rest of a job here)."""
        t = self._scalars.get(value)
        if t is None:
            t = self._scalars[value] = torch.tensor(float(value), device=self.device)
        return t


def client_job(
    fed: Federation, k: int, state: dict[str, Any], tc: TrainConfig, seed: int, round_: int, epochs: int | None = None,
    work: float = 1.0,
) -> ClientJob:
    """Client k's work for a round: its batch schedule (a pure function of seed, round, k)
    and the context hooks see: num_samples, num_steps (H_k), label_counts, state. A
    straggler (``work`` < 1) runs the first steps of that schedule only."""
    ix, own = fed.indices(k), fed.train[k]
    steps = None if epochs is not None else tc.local_steps
    pos = batches.schedule_table(len(own), tc.batch_size, epochs or tc.local_epochs, steps, seed, round_, k)
    if work < 1.0:
        pos = pos[: steps_done(len(pos), work)]
    # one gather for the whole schedule, in numpy (cheaper per call than torch)
    table = torch.from_numpy(np.where(pos >= 0, own[np.maximum(pos, 0)], -1)).to(ix.device)
    ctx = {
        "num_samples": fed.scalar(len(own)),
        "num_steps": fed.scalar(len(pos)),
        "label_counts": fed.label_counts[k],
        "state": state,
    }
    return ClientJob(k, ix, table, ctx)
