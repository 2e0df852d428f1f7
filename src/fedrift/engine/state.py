"""Per-client state (SCAFFOLD controls, FedDyn gradients, MOON's previous model, FedProto's
personal prototypes), kept behind a get/put interface by client id, never on client objects,
so that the storage can change without any algorithm noticing.

Two storages, the same answers:

- ``memory``: a dict of client id -> tree. Every state put stays in RAM, so a federation
  costs N x (state bytes): 10,000 SCAFFOLD clients of a 150k-parameter MLP hold 6 GB.
- ``disk``: one fixed-size row per client in a flat file (the run folder's
  ``client_state.bin``); only the rows asked for are in memory, and only while the caller
  holds them. The first put fixes the layout (keys, shapes, dtypes, devices); every later
  state must match it. Rows never written are holes of a sparse file, and the file is
  deleted by :meth:`ClientStateStore.close` (or, failing that, when the store is collected
  or the interpreter exits).
- ``auto``: ``disk`` when ``num_clients x (state bytes)`` exceeds ``threshold`` (1 GiB),
  decided from the first state put; ``memory`` when ``num_clients`` is unknown.

The file is read and written with plain positioned I/O rather than a ``numpy.memmap``:
every page of a mapping that the process touches counts towards its resident memory, so a
mapped 6 GB file reads as 6 GB of RSS by the end of a long run (measured: writing 572 MB of
rows through a memmap grew ``ru_maxrss`` by 572 MB, through ``write`` by 0). Written rows
sit in the kernel's page cache instead, which it reclaims as it needs.

Nothing is allocated for a client before its first put (a million-client federation of
which a few thousand ever train costs those few thousand states, and on disk not even
those: rows are holes until written, and the store's own bookkeeping is one byte per client
id up to the highest one put).

A client never seen gets ``init_client(global params)``. Any other ``get`` returns tensors
of its own: changing them in place changes nothing stored, and a state put may be changed
by its owner afterwards. Round-trips are bit-exact (bytes are copied, never converted),
dtypes, shapes and devices kept; leaves come back contiguous.
"""

from __future__ import annotations

import operator
import os
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Literal, Mapping

import numpy as np
import torch

from fedrift.functional.tree import detach_clone
from fedrift.errors import FedriftError
from fedrift.safe_files import open_new

Tree = dict[str, Any]
Mode = Literal["memory", "disk", "auto"]
GiB = 1 << 30


class ClientStateError(FedriftError):
    """An algorithm's client state that the store cannot keep (a leaf that is not a tensor,
    or, on disk, a state whose layout differs from the first one put)."""


@dataclass(frozen=True)
class _Leaf:
    key: str  # dotted path, for messages
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    nbytes: int


@dataclass(frozen=True)
class _Layout:
    skeleton: dict[str, Any]  # the tree with each leaf replaced by its index in ``leaves``
    leaves: tuple[_Leaf, ...]
    nbytes: int  # one row


def _layout(tree: Mapping[str, Any]) -> tuple[_Layout, list[torch.Tensor]]:
    """The layout of a state tree and its leaves in layout order; refuses non-tensor leaves."""
    specs: list[_Leaf] = []
    tensors: list[torch.Tensor] = []

    def walk(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, Mapping):
                out[key] = walk(value, path + ".")
                continue
            if not isinstance(value, torch.Tensor):
                raise ClientStateError(
                    f"client state {path!r} is a {type(value).__name__}; the leaves of a client state "
                    "must be tensors (wrap numbers as torch.tensor(x))"
                )
            if value.layout != torch.strided or value.is_quantized:
                raise ClientStateError(f"client state {path!r} is a {value.layout} tensor; allowed: dense tensors")
            out[key] = len(specs)
            specs.append(_Leaf(path, tuple(value.shape), value.dtype, value.device, value.numel() * value.element_size()))
            tensors.append(value)
        return out

    skeleton = walk(tree, "")
    return _Layout(skeleton, tuple(specs), sum(s.nbytes for s in specs)), tensors


def _pick(layout: _Layout, tree: Mapping[str, Any], client: int) -> list[torch.Tensor]:
    """The leaves of ``tree`` in ``layout``'s order, refusing a tree of another layout."""
    out: list[torch.Tensor | None] = [None] * len(layout.leaves)

    def walk(skeleton: Mapping[str, Any], node: Any) -> bool:
        if not isinstance(node, Mapping) or node.keys() != skeleton.keys():
            return False
        for key, index in skeleton.items():
            if isinstance(index, Mapping):
                if not walk(index, node[key]):
                    return False
                continue
            value, spec = node[key], layout.leaves[index]
            if not isinstance(value, torch.Tensor) or (tuple(value.shape), value.dtype) != (spec.shape, spec.dtype):
                return False
            out[index] = value
        return True

    if not walk(layout.skeleton, tree):
        got = _describe(_layout(tree)[0])  # raises first if a leaf is not a tensor
        raise ClientStateError(
            f"client {client}'s state has layout {got}, but the first state put had {_describe(layout)}; "
            "engine.client_state=disk needs every client's state to have the same keys, shapes and dtypes "
            "(engine.client_state=memory keeps any)"
        )
    return out  # type: ignore[return-value]


def _rebuild(skeleton: Mapping[str, Any], leaves: list[torch.Tensor]) -> Tree:
    return {k: _rebuild(v, leaves) if isinstance(v, Mapping) else leaves[v] for k, v in skeleton.items()}


def _raw(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, as a uint8 array sharing its memory."""
    return t.reshape(-1).view(torch.uint8).numpy()


class ClientStateStore:
    """Client id -> state tree, in memory or in a file (see the module docstring).

    ``init_client(params)`` gives an unseen client's state (``None``: the algorithm keeps
    none; ``get`` returns ``{}`` and ``put`` does nothing). ``path``: the disk file (a new
    temporary file if ``None``); ``num_clients``: ids are ``0 .. num_clients - 1``.
    """

    def __init__(
        self,
        init_client: Callable[[dict[str, torch.Tensor]], Tree] | None,
        params: dict[str, torch.Tensor],
        mode: Mode = "memory",
        path: str | Path | None = None,
        num_clients: int | None = None,
        threshold: int = GiB,
    ) -> None:
        if mode not in ("memory", "disk", "auto"):
            raise ValueError(f"mode: {mode!r}; allowed: memory, disk, auto")
        self._init = init_client
        self._params = params
        self._path = Path(path) if path is not None else None
        self._num_clients = num_clients
        self._threshold = threshold
        self.storage: Literal["memory", "disk"] | None = None if mode == "auto" else mode  # auto: set by the first put
        self._states: dict[int, Tree] = {}  # memory
        self._layout: _Layout | None = None  # disk, from here on
        self._file: BinaryIO | None = None
        self._present = np.zeros(0, dtype=bool)  # disk: rows written; grown to the highest id put
        self._count = 0
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    # -- the interface the engine uses -------------------------------------------------

    def get(self, client: int) -> Tree:
        self._check_open()
        if self._init is None:
            return {}
        k = self._index(client)
        if self._layout is not None:  # disk, with rows written
            if k < len(self._present) and self._present[k]:
                return self._read(k)
        elif k in self._states:
            return detach_clone(self._states[k])
        return self._init(self._params)

    def put(self, client: int, state: Tree) -> None:
        self._check_open()
        if self._init is None:
            return
        k = self._index(client)
        if self._layout is not None:  # disk: the layout is fixed
            self._write(k, _pick(self._layout, state, k))
            return
        layout, leaves = _layout(state)  # refuses leaves that are not tensors
        if self.storage is None:  # auto, first put
            big = self._num_clients is not None and self._num_clients * layout.nbytes > self._threshold
            self.storage = "disk" if big else "memory"
        if self.storage == "memory":
            self._count += k not in self._states
            self._states[k] = detach_clone(state)
        else:
            self._open(layout)
            self._write(k, leaves)

    def dump(self, file: BinaryIO | None) -> dict[str, Any]:
        """Every stored state, for a checkpoint: in memory, as trees in the returned dict; on
        disk, the rows written byte for byte into ``file`` (in client-id order; the dict
        names the ids and holds one row as the layout's template). ``load`` takes both back.
        In memory, the trees are the store's own (no copy of every state: a checkpoint only
        writes them out); do not change them."""
        self._check_open()
        if self._layout is None:
            return {"states": dict(sorted(self._states.items()))}
        assert self._file is not None and file is not None
        ids = [int(k) for k in np.flatnonzero(self._present)]
        for k in ids:
            self._file.seek(k * self._layout.nbytes)
            data = self._file.read(self._layout.nbytes)
            if len(data) != self._layout.nbytes:
                raise OSError(f"{self._file.name}: client {k}'s row ends early; was the file changed?")
            file.write(data)
        return {"ids": ids, "template": self._read(ids[0])}

    def load(self, dumped: Mapping[str, Any], file: BinaryIO | None) -> None:
        """Put back every state a :meth:`dump` gave (into this store, whatever its storage)."""
        for k, state in dumped.get("states", {}).items():
            self.put(k, state)
        if dumped.get("ids"):
            assert file is not None
            layout = _layout(dumped["template"])[0]
            for k in dumped["ids"]:
                self.put(k, _read_row(file, layout, f"client {k}'s saved row"))

    def __len__(self) -> int:
        """The number of clients whose state has been put."""
        return self._count

    def flush(self) -> None:
        """Push written rows to the disk (durability only: reads never need it)."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Drop every state and delete the disk file; the store cannot be used afterwards."""
        self._closed = True
        self._states.clear()
        if self._finalizer is not None:
            self._finalizer()
        self._file = None

    def __enter__(self) -> "ClientStateStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- disk --------------------------------------------------------------------------

    def _write(self, k: int, leaves: list[torch.Tensor]) -> None:
        assert self._layout is not None and self._file is not None
        # detach().cpu().contiguous() is the tensor itself when it already is all three: no copy
        srcs = [t.detach().cpu().resolve_conj().resolve_neg().contiguous() for t in leaves]
        self._file.seek(k * self._layout.nbytes)
        for src in srcs:
            view = memoryview(_raw(src))
            while view.nbytes:
                view = view[self._file.write(view) :]
        if k >= len(self._present):  # grown by doubling: nothing kept for clients never put
            grown = np.zeros(max(k + 1, 2 * len(self._present)), dtype=bool)
            grown[: len(self._present)] = self._present
            self._present = grown
        self._count += not self._present[k]
        self._present[k] = True

    def _read(self, k: int) -> Tree:
        assert self._layout is not None and self._file is not None
        self._file.seek(k * self._layout.nbytes)
        return _read_row(self._file, self._layout, f"client {k}'s row")

    def _open(self, layout: _Layout) -> None:
        if self._path is None:
            fd, name = tempfile.mkstemp(prefix="fedrift-client-state-", suffix=".bin")
            os.close(fd)
            self._path = Path(name)
        self._file = open_new(self._path)  # closed by the finalizer; never through a link
        self._finalizer = weakref.finalize(self, _remove, self._file, self._path)
        self._layout = layout

    def _index(self, client: int) -> int:
        k = operator.index(client)
        if k < 0 or (self._num_clients is not None and k >= self._num_clients):
            raise IndexError(f"client id {k} outside 0..{(self._num_clients or 0) - 1}")
        return k

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client-state store was closed")


def _read_row(file: BinaryIO, layout: _Layout, what: str) -> Tree:
    """One row of ``layout`` read from ``file``'s position, as a tree on the layout's devices."""
    leaves = [torch.empty(s.shape, dtype=s.dtype) for s in layout.leaves]
    for t in leaves:
        view = memoryview(_raw(t))
        while view.nbytes:
            n = file.readinto(view)
            if not n:
                raise OSError(f"{file.name}: {what} ends early; was the file changed?")
            view = view[n:]
    return _rebuild(layout.skeleton, [t.to(s.device) for t, s in zip(leaves, layout.leaves)])


def _remove(file: BinaryIO, path: Path) -> None:
    file.close()
    path.unlink(missing_ok=True)


def _describe(layout: _Layout) -> str:
    return "{" + ", ".join(f"{s.key}: {str(s.dtype).removeprefix('torch.')}{list(s.shape)}" for s in layout.leaves) + "}"
