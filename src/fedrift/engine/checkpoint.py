"""Checkpoints: all a run keeps between rounds, so that a stopped run continues bit for bit.

Every ``engine.checkpoint_every`` rounds the loop saves, after the round's metrics line: the
server state (global model, FedGKD-Vote's model buffer, FedADC's momentum, SCAFFOLD's
control, ...), every client state in the store (SCAFFOLD's controls, FedProto's personal
models, ...), the metrics so far (the history, the totals, and the lengths of
``metrics.jsonl`` and ``clients.csv``, cut back to them on resume), the teacher memo (the
parent's and each ``processes`` worker's) and the round. Nothing else is needed: every
random draw is a pure function of (seed, round, client) (``functional/rng.py``), so the next
round draws the same.

Files, in the run folder's ``checkpoint/``: ``state-r<round>.pt`` (``torch.save``; read back
with ``weights_only=True``), ``clients-r<round>.bin`` (a disk store's rows, when the store is
on disk) and ``manifest.json`` (the round, the config's fingerprint, the data's fingerprints
(``fedrift.data.fingerprint``) and each file's size and SHA-256). Each is written to a temporary file in that folder, flushed to the disk and
renamed into place; the manifest goes last, so it names complete files only, and the files
of older checkpoints are deleted after it. A run killed at any moment leaves the last
complete checkpoint. Loading checks the fingerprint (a checkpoint of another config is
refused, naming a key that differs; ``NOT_RESULTS`` and ``EQUAL_EXECUTORS`` below say what a
resume may change), the data's (files under ``data.root`` replaced since the run started are
refused, unless ``data.accept_changed``) and every file's size and hash (a corrupt or truncated
checkpoint is refused); a refusal is a :class:`CheckpointError`, never a silent fresh start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import torch

from fedrift.config import absolute_root
from fedrift.engine.state import ClientStateStore
from fedrift.errors import FedriftError, writing
from fedrift.safe_files import atomic_file, make_dir

FORMAT = 1
FOLDER = "checkpoint"
MANIFEST = "manifest.json"
# What a resume may change: the one place that says it (docs/howto/resume.md).
# Keys that do not change a run's results: a checkpoint taken under other values is still its own.
# plugins: where names come from; engine.ray_address: which cluster runs the actors (a lost head's
# run continues on another one); engine.divergence_*: where a diverging run stops, not any round's numbers;
# data.accept_changed: whether data that changed under the run is accepted (the data's fingerprint is checked apart)
NOT_RESULTS = ("engine.checkpoint_every", "engine.client_state", "plugins", "engine.ray_address",
               "engine.divergence_factor", "engine.divergence_loss", "data.accept_changed")
# Executors whose results are equal bit for bit (docs/concepts/executors.md): ``processes`` and ``ray`` run
# ``sequential``'s own code on one thread per worker and the server aggregates in client order, so
# on the CPU with ``engine.threads: 1`` a run may stop under one of them and continue under
# another; how many workers share the clients does not change results either.
EQUAL_EXECUTORS = ("sequential", "processes", "ray")
EQUAL_EXECUTOR_KEYS = ("engine.executor", "engine.workers", "engine.max_parallel_clients", "engine.cuda_graphs",
                       "engine.cudnn_benchmark")
# keys added after checkpoints were written: a manifest without one holds the default it had in effect
LATER_KEYS = {"engine.cuda_graphs": True, "engine.compile": False, "engine.cudnn_benchmark": False}


class CheckpointError(FedriftError):
    """A checkpoint that cannot be used: corrupt, truncated, or of another config."""


@dataclass
class Snapshot:
    """What the round loop keeps between rounds, as of the end of round ``round``."""

    round: int
    server: dict[str, Any]
    history: list[dict[str, Any]]
    totals: dict[str, Any]
    best: tuple[float, int]
    metrics_bytes: int  # metrics.jsonl's length after this round's line
    metrics_sha256: str  # of those bytes: a resume continues only the very lines it saw
    memo: list[dict[str, Any]] | None = None  # the loop's TeacherMemo.dump()
    executor: Any = None  # the executor's own (processes: its workers' memos)
    clients: dict[str, Any] = field(default_factory=dict)  # ClientStateStore.dump()
    clients_csv_bytes: int = 0  # clients.csv's length after this round's rows (0: a checkpoint from before it)
    clients_csv_sha256: str = ""  # of those bytes


def result_keys(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened resolved config without the keys that do not change results."""
    flat: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, Mapping) and v:
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(resolved, "")
    return {k: v for k, v in sorted(flat.items()) if not k.startswith("output.") and k not in NOT_RESULTS}


def resumable_keys(keys: Mapping[str, Any]) -> dict[str, Any]:
    """``result_keys`` as a resume compares them: the keys that do not change results left out
    (also of a manifest written before a key joined ``NOT_RESULTS``), and under one of the
    ``EQUAL_EXECUTORS`` on one CPU thread, the executor and its worker count left out too.
    ``data.root`` as the path it names from here (a manifest written before relative roots
    were stored absolute holds the relative one); a key of ``LATER_KEYS`` that a manifest lacks,
    as its default."""
    out = {**LATER_KEYS, **{k: v for k, v in keys.items() if k not in NOT_RESULTS}}
    if isinstance(out.get("data.root"), str):
        out["data.root"] = absolute_root(out["data.root"])
    if out.get("engine.executor") in EQUAL_EXECUTORS and out.get("engine.threads") == 1 and out.get("engine.device") == "cpu":
        out = {k: v for k, v in out.items() if k not in EQUAL_EXECUTOR_KEYS}
        out["engine.executor"] = "|".join(EQUAL_EXECUTORS) + " (engine.threads 1, cpu)"
    return json.loads(json.dumps(out, sort_keys=True, default=str))  # as a manifest holds them


def fingerprint(keys: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


class Checkpointer:
    """Saves and loads a run folder's checkpoint (see the module docstring).

    ``config``: the run's resolved config (``config.yaml``'s content) plus the facts that
    change results but are resolved at run time (the executor ``auto`` chose).
    """

    def __init__(self, run_dir: Path, config: Mapping[str, Any], every: int, data: Mapping[str, str] | None = None,
                 accept_changed: bool = False) -> None:
        self.dir = Path(run_dir) / FOLDER
        self.keys = result_keys(config)
        self.fingerprint = fingerprint(self.keys)
        self.every = every
        self.last_round = 0  # of the last checkpoint saved or loaded
        # the data's fingerprints (fedrift.data.fingerprint.dataset_fingerprint): a resume refuses
        # data that changed under the run (data.root's files replaced), unless accept_changed
        self.data, self.accept_changed = dict(data or {}), accept_changed

    def due(self, t: int, rounds: int) -> bool:
        """After round ``t``: every ``every`` rounds, not after the last (the run ends then)."""
        return self.every > 0 and t % self.every == 0 and t < rounds

    # -- saving ------------------------------------------------------------------------

    def save(self, snap: Snapshot, store: ClientStateStore) -> None:
        """Write the checkpoint of ``snap``; a write that fails (a full disk) stops the run
        with an :class:`OutputError`, the last whole checkpoint left as it was."""
        with writing("output.dir", "; the last whole checkpoint is kept; allowed: a disk with free space", path=self.dir):
            self._save(snap, store)

    def _save(self, snap: Snapshot, store: ClientStateStore) -> None:
        make_dir(self.dir, parents=False)
        files: dict[str, dict[str, Any]] = {}
        if store.storage == "disk":
            name = f"clients-r{snap.round:06d}.bin"
            with _Atomic(self.dir / name) as f:
                snap.clients = store.dump(f.file)
            files[name] = {"bytes": f.size, "sha256": f.sha256}
        else:
            snap.clients = store.dump(None)
        name = f"state-r{snap.round:06d}.pt"
        with _Atomic(self.dir / name) as f:
            torch.save(vars(snap), f.file)
        files[name] = {"bytes": f.size, "sha256": f.sha256}
        manifest = {"format": FORMAT, "round": snap.round, "fingerprint": self.fingerprint, "config": self.keys, "files": files,
                    "data": self.data}
        with _Atomic(self.dir / MANIFEST) as f:
            f.file.write((json.dumps(manifest, indent=1, default=str) + "\n").encode())
        _sync_dir(self.dir)
        for old in self.dir.iterdir():  # older checkpoints, and temporary files of a killed save
            if old.name != MANIFEST and old.name not in files and ours(old.name):
                old.unlink()
        self.last_round = snap.round

    def remove(self) -> None:
        """Delete the checkpoint (the run finished: nothing is left to continue)."""
        if self.dir.is_dir() and not self.dir.is_symlink():
            remove_checkpoints(self.dir)
            try:
                self.dir.rmdir()
            except OSError:  # another program's files are in it: they stay, and so does the folder
                pass

    # -- loading -----------------------------------------------------------------------

    def exists(self) -> bool:
        return (self.dir / MANIFEST).is_file()

    def load(self, device: torch.device) -> Snapshot | None:
        """The checkpoint's snapshot (None when the run saved none), its clients' rows kept
        open for :meth:`load_clients`; refuses (CheckpointError) what it cannot trust."""
        path = self.dir / MANIFEST
        if not path.is_file():
            return None
        try:
            manifest = json.loads(path.read_text())
            files, fp, rnd = manifest["files"], manifest["fingerprint"], int(manifest["round"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise self._corrupt(f"{path.name} is unreadable ({type(err).__name__})") from None
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{self.dir}: checkpoint format {manifest.get('format')!r}; this fedrift reads {FORMAT}")
        stored = manifest.get("config")
        if fp != self.fingerprint and (not isinstance(stored, dict) or resumable_keys(stored) != resumable_keys(self.keys)):
            raw = stored if isinstance(stored, dict) else {}
            there, here = resumable_keys(raw), resumable_keys(self.keys)
            diff = [k for k in sorted(set(there) | set(here)) if there.get(k, "<absent>") != here.get(k, "<absent>")]
            shown = lambda keys, k: keys.get(k, "<absent>")  # noqa: E731 - as the configs say it
            # a key the configs really differ in first: engine.executor differs in resumable_keys
            # when engine.threads or engine.device does (the executors are equal at one cpu thread only)
            diff.sort(key=lambda k: shown(raw, k) == shown(self.keys, k))
            what = f" ({diff[0]}: {shown(raw, diff[0])!r} there, {shown(self.keys, diff[0])!r} here)" if diff else ""
            raise CheckpointError(
                f"{self.dir}: the checkpoint is of another config{what}; a run resumes only with the config it "
                "started with (keys that do not change results may differ: output.*, engine.checkpoint_every, "
                "engine.client_state, engine.ray_address, engine.divergence_*, plugins, and with engine.threads=1 on the cpu, "
                "engine.executor among sequential, processes and ray, and engine.workers)"
            )
        self._check_data(manifest.get("data"))
        for name, want in files.items():
            p = self.dir / name
            if not p.is_file() or p.stat().st_size != want["bytes"] or _sha256(p) != want["sha256"]:
                raise self._corrupt(f"{name} is missing, truncated or changed")
        state_name = f"state-r{rnd:06d}.pt"
        if state_name not in files:
            raise self._corrupt(f"{MANIFEST} names no {state_name}")
        try:
            saved = torch.load(self.dir / state_name, map_location=device, weights_only=True)
            snap = Snapshot(**saved)
        except Exception as err:  # a file that hashes right but does not load: not ours
            raise self._corrupt(f"{state_name} does not load ({type(err).__name__}: {err})") from None
        if snap.round != rnd:
            raise self._corrupt(f"{state_name} holds round {snap.round}, the manifest says {rnd}")
        self.last_round = rnd
        return snap

    def _check_data(self, stored: Any) -> None:
        """Refuse (or, under ``data.accept_changed``, say in a warning line) data whose
        fingerprints differ from those the run started with: the run would continue on other
        samples than its checkpoint trained on, and finish with numbers of neither."""
        from fedrift.data.fingerprint import difference

        if not isinstance(stored, dict) or not self.data:  # a checkpoint written before fingerprints were kept
            return
        diff = [f"{split}: {difference(self.data.get(split, ''), want)}" for split, want in stored.items()
                if difference(self.data.get(split, ""), want)]
        if not diff:
            return
        root = self.keys.get("data.root") or f"the embedded {self.keys.get('data.name')}"
        said = (f"data.root: the data read from {root} differs from the data the run started with "
                f"({'; '.join(diff)})")
        if self.accept_changed:
            logging.getLogger("fedrift").warning(f"{said}; the run continues on it (data.accept_changed)")
            return
        raise CheckpointError(f"{said}; a run resumes only on its own data; allowed: the files it started with, or "
                              "data.accept_changed=true to continue on these knowingly")

    def load_clients(self, snap: Snapshot, store: ClientStateStore) -> None:
        path = self.dir / f"clients-r{snap.round:06d}.bin"
        if not snap.clients.get("ids"):
            store.load(snap.clients, None)
            return
        with open(path, "rb") as f:
            store.load(snap.clients, f)

    def _corrupt(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self.dir}: the checkpoint is corrupt ({what}); it is not used: delete the folder "
            "to run again from round 1, or set output.overwrite=true"
        )


class _Atomic:
    """A file written beside its final name, then flushed to the disk and renamed into
    place (``fedrift.safe_files.atomic_file``: never through a link); its size and SHA-256
    counted on the way (no second read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size, self.sha256 = 0, ""

    def __enter__(self) -> "_Atomic":
        self._context = atomic_file(self.path, durable=True)
        self.file = _Hashing(self._context.__enter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        if exc[0] is None:
            self.size, self.sha256 = self.file.size, self.file.hash.hexdigest()


class _Hashing:
    """A write-only file that hashes what goes through it (``torch.save`` only writes)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += view.nbytes
        return self.raw.write(view)

    def flush(self) -> None:
        self.raw.flush()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def prefix_sha256(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path`` (fewer if it is shorter)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0:
            block = f.read(min(size, 1 << 20))
            if not block:
                break
            h.update(block)
            size -= len(block)
    return h.hexdigest()


OURS = re.compile(r"\.?(state-r\d+\.pt|clients-r\d+\.bin|manifest\.json)(\.\d+\.\d+)?(\.tmp)?")


def ours(name: str) -> bool:
    """Whether ``name`` in a checkpoint folder is fedrift's (a checkpoint's file, or the
    temporary file of a save a kill interrupted), not a file someone else put there."""
    return OURS.fullmatch(name) is not None


def remove_checkpoints(folder: Path) -> None:
    """Delete fedrift's checkpoint files in ``folder`` (the folder stays: its remover decides)."""
    for p in folder.iterdir():
        if ours(p.name) and not p.is_dir():
            p.unlink()


def _sync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable (POSIX: fsync the folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - folders cannot be opened on some systems
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
