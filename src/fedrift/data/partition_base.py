"""A partition: which training samples each client holds, and its local test split.

Every per-client split is held as one :class:`Ragged` array pair (offsets + indices), not a
Python object per client, so a million clients cost a few arrays. On disk a partition is a
small JSON header (``partition.json``: name, options, client count, the arrays' layout) next
to a flat binary file (``partition.bin``: the arrays back to back, little-endian; see
:meth:`Partition.save`). Files of the earlier format, one JSON file listing every index,
are still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, overload

import numpy as np

from fedrift.errors import FedriftError
from fedrift.safe_files import atomic_file, write_atomic

FORMAT = "fedrift-partition"
VERSION = 2
_I32_MAX = np.iinfo(np.int32).max
_BLOCK = 1 << 16  # clients per block of vectorised work
_CHUNK = 1 << 20  # array entries converted and written at a time


class PartitionFileError(FedriftError):
    """A partition file that cannot be read (torn, changed, or of an unknown format)."""


class Ragged(Sequence[np.ndarray]):
    """Client k's indices are ``values[offsets[k]:offsets[k + 1]]`` (int64 both).

    Indexing gives a view into ``values``; iteration and ``len`` behave as the list of
    per-client arrays it replaces, so code that reads ``part.train[k]`` is unchanged.
    """

    __slots__ = ("offsets", "values")
    __hash__ = None  # type: ignore[assignment]  # equality is by content

    def __init__(self, offsets: np.ndarray, values: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        values = np.asarray(values, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != values.size or (
            np.any(np.diff(offsets) < 0)
        ):
            raise ValueError("offsets must start at 0, never decrease, and end at len(values)")
        self.offsets, self.values = offsets, values

    @classmethod
    def of(cls, parts: "Ragged | Iterable[Any]") -> "Ragged":
        """``parts`` as a Ragged: a Ragged is kept, a list of index arrays is packed."""
        if isinstance(parts, Ragged):
            return parts
        arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(offsets, values)

    @classmethod
    def from_owners(cls, owners: np.ndarray, values: np.ndarray, count: int) -> "Ragged":
        """Client ``owners[i]`` holds ``values[i]``; each client's values in their given
        order (a stable sort by owner), clients ``0 .. count - 1``."""
        owners = np.asarray(owners, dtype=np.int64)
        order = np.argsort(owners, kind="stable")
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(np.bincount(owners, minlength=count), out=offsets[1:])
        return cls(offsets, np.asarray(values, dtype=np.int64)[order])

    def __len__(self) -> int:
        return self.offsets.size - 1

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, k: slice) -> list[np.ndarray]: ...
    def __getitem__(self, k):  # type: ignore[no-untyped-def]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        k = int(k)
        if k < -n or k >= n:
            raise IndexError(f"client {k} outside 0..{n - 1}")
        k %= n
        return self.values[self.offsets[k] : self.offsets[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for k in range(len(self)):
            yield self.values[self.offsets[k] : self.offsets[k + 1]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Ragged):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.values, other.values)
        if not isinstance(other, (list, tuple)) or len(self) != len(other):
            return False
        return all(np.array_equal(a, b) for a, b in zip(self, other))

    def __add__(self, other: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(self) + list(other)

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The client of each entry of ``values``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes())

    def __repr__(self) -> str:
        return f"Ragged({len(self)} clients, {self.values.size} indices)"


def _empty() -> Ragged:
    return Ragged(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Partition:
    """``train[k]``/``test[k]``: int64 index arrays into the dataset's train/test tensors.

    ``test[k]`` is client k's local test split, drawn from the global test set with k's
    label proportions (for personalisation); splits of different clients may overlap.
    ``holdout``: training samples kept by the server (``partition.holdout``), in no client's
    ``train``; FedDF's proxy and validation data come from it.
    ``val[k]``: client k's validation samples (``partition.val_share``), taken out of its
    ``train[k]``; the global model is evaluated on their union (``val_accuracy``). Empty
    (no validation) when the share is 0.
    ``train``, ``test`` and ``val`` may be given as lists of arrays; they are held as
    :class:`Ragged`.
    """

    name: str
    train: Ragged
    test: Ragged
    options: dict[str, Any] = field(default_factory=dict)
    holdout: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    val: Ragged = field(default_factory=_empty)

    def __post_init__(self) -> None:
        for name in ("train", "test", "val"):
            object.__setattr__(self, name, Ragged.of(getattr(self, name)))
        object.__setattr__(self, "holdout", np.asarray(self.holdout, dtype=np.int64))

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def sizes(self) -> np.ndarray:
        return self.train.sizes()

    def val_union(self) -> np.ndarray:
        """Every client's validation samples, sorted (indices into the training set)."""
        return np.sort(self.val.values).astype(np.int64)

    def counts(self, labels: np.ndarray, num_classes: int, dtype: Any = np.int64) -> np.ndarray:
        """Client x class sample counts of the training split: one bincount per block of
        clients (no per-client loop, and temporaries bounded by the block)."""
        labels = np.asarray(labels)
        out = np.empty((self.num_clients, num_classes), dtype=dtype)
        o = self.train.offsets
        for a in range(0, self.num_clients, _BLOCK):
            b = min(a + _BLOCK, self.num_clients)
            owner = np.repeat(np.arange(b - a, dtype=np.int64) * num_classes, np.diff(o[a : b + 1]))
            owner += labels[self.train.values[o[a] : o[b]]]
            out[a:b] = np.bincount(owner, minlength=(b - a) * num_classes).reshape(b - a, num_classes)
        return out

    # -- files ----------------------------------------------------------------------------

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"train_offsets": self.train.offsets, "train": self.train.values,
                  "test_offsets": self.test.offsets, "test": self.test.values, "holdout": self.holdout}
        if len(self.val):  # absent without a validation split
            arrays |= {"val_offsets": self.val.offsets, "val": self.val.values}
        return arrays

    def save(self, path: Path) -> None:
        """``path`` (the JSON header) and ``path.with_suffix('.bin')`` (the arrays).

        Offsets are int64; indices are int32 when every index fits (always, below 2**31
        samples), else int64; the header names each array's dtype, byte offset and length.
        Both files are written whole under temporary names and then renamed, the binary
        first, so a reader never sees a header without its arrays.
        """
        path = Path(path)
        data = path.with_suffix(".bin")
        layout, at = {}, 0
        arrays = self._arrays()
        for name, arr in arrays.items():
            small = not name.endswith("_offsets") and (arr.size == 0 or int(arr.max()) <= _I32_MAX)
            dtype = np.dtype("<i4" if small else "<i8")
            layout[name] = {"dtype": dtype.str, "offset": at, "count": int(arr.size)}
            at += arr.size * dtype.itemsize
        doc = {"format": FORMAT, "version": VERSION, "name": self.name, "options": self.options,
               "num_clients": self.num_clients, "data": data.name, "bytes": at, "arrays": layout}

        with atomic_file(data) as f:  # whole or not at all, never through a link
            for name, arr in arrays.items():
                for i in range(0, arr.size, _CHUNK):  # converted a chunk at a time: no full copy
                    f.write(np.ascontiguousarray(arr[i : i + _CHUNK], dtype=layout[name]["dtype"]).tobytes())
        write_atomic(path, json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Partition":
        """A partition saved by :meth:`save`, or one in the earlier all-JSON format."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except ValueError as err:
            raise PartitionFileError(f"{path}: not a partition file ({err})") from None
        if not isinstance(doc, dict):
            raise PartitionFileError(f"{path}: not a partition file (a JSON object expected)")
        if "format" not in doc and isinstance(doc.get("train"), list):
            return cls._load_lists(doc)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise PartitionFileError(
                f"{path}: unknown partition format {doc.get('format')!r} version {doc.get('version')!r}; "
                f"allowed: {FORMAT} version {VERSION}, or the earlier JSON lists"
            )
        try:
            return cls._load_binary(path, doc)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise PartitionFileError(f"{path}: a damaged partition header or data file ({type(err).__name__}: {err})") from None

    @classmethod
    def _load_binary(cls, path: Path, doc: dict[str, Any]) -> "Partition":
        if Path(doc["data"]).name != doc["data"]:
            raise ValueError(f"data file {doc['data']!r} is not a name beside the header")
        data = path.parent / doc["data"]
        if not data.is_file():
            raise PartitionFileError(f"{data}: missing (its header {path.name} names it; the two files go together)")
        size = data.stat().st_size
        if size != doc["bytes"]:
            raise PartitionFileError(f"{data}: {size} bytes, but its header {path.name} says {doc['bytes']}")
        arrays = {}
        for name, spec in doc["arrays"].items():
            dtype = np.dtype(spec["dtype"])
            if dtype.kind != "i" or spec["offset"] + spec["count"] * dtype.itemsize > size:
                raise ValueError(f"array {name!r} of dtype {dtype} lies outside {data.name}")
            raw = np.fromfile(data, dtype=dtype, count=spec["count"], offset=spec["offset"])
            arrays[name] = raw.astype(np.int64)
        val = Ragged(arrays["val_offsets"], arrays["val"]) if "val" in arrays else _empty()
        part = cls(
            name=doc["name"], options=doc.get("options", {}), holdout=arrays["holdout"], val=val,
            train=Ragged(arrays["train_offsets"], arrays["train"]), test=Ragged(arrays["test_offsets"], arrays["test"]),
        )
        if len(part.test) != part.num_clients or part.num_clients != doc["num_clients"]:
            raise ValueError(f"the header says {doc['num_clients']} clients, the arrays hold {part.num_clients}")
        return part

    @classmethod
    def _load_lists(cls, doc: dict[str, Any]) -> "Partition":
        """The earlier format: ``train``/``test``/``val`` lists of index lists."""
        return cls(
            name=doc["name"],
            train=[np.asarray(ix, dtype=np.int64) for ix in doc["train"]],
            test=[np.asarray(ix, dtype=np.int64) for ix in doc["test"]],
            options=doc.get("options", {}),
            holdout=np.asarray(doc.get("holdout", []), dtype=np.int64),
            val=[np.asarray(ix, dtype=np.int64) for ix in doc.get("val", [])],
        )
