"""The run folder: config.yaml, partition.json (+ partition.bin), metrics.jsonl, clients.csv,
summary.json, final_model.pt.

Metrics are appended and flushed after each evaluated round, so a run that stops (divergence,
Ctrl-C, a crash) keeps every line it wrote. An existing run is never overwritten unless asked,
and then only in a folder that carries fedrift's mark (``.fedrift-run``, written in a folder the
run made or found empty), and only fedrift's own files in it (:func:`remove_owned`): never the
root or home folder, never a file another program put there. Nothing is written through a link
(``fedrift.safe_files``); whole files are renamed into place.
A folder that cannot be created or written, or a full disk, is an :class:`OutputError` (one
line, exit 2); a metrics line that could not be written whole is cut off again, so the file
holds exactly the rounds before it. ``clients.csv`` (each evaluated client's local test
samples and correct ones, a row a client a scored model an evaluated round) is appended the same
way, a round's rows just before its metrics line, and holds the rounds ``metrics.jsonl`` holds:
rows whose line was not written are cut off again when the run stops, or on resume.
"""

from __future__ import annotations

import json
import os
import math
import time
from pathlib import Path
from typing import Any

import torch

from fedrift.data.partition_base import Partition
from fedrift.engine.checkpoint import FOLDER as CHECKPOINTS, remove_checkpoints
from fedrift.engine.deployed_run import AGAIN, MARKER, deployed
from fedrift.engine.tensorboard import FOLDER as BOARD, remove_events
from fedrift.engine.folder_lock import LOCK_NAME, FolderLock
from fedrift.errors import ConfigError, OutputError, describe_os_error, writing
from fedrift.safe_files import atomic_file, open_append, open_update, refuse_link, write_atomic
from fedrift.version import __version__

CLIENTS = "clients.csv"  # appended, as metrics.jsonl: one found in a new run's folder is a run's, never added to
CLIENT_COLUMNS = ("round", "client", "model", "n_test", "correct")
OWNED = ("config.yaml", "partition.json", "partition.bin", "metrics.jsonl", CLIENTS, "summary.json", "final_model.pt",
         MARKER)  # the last: a Flower deployment's run
MARK = ".fedrift-run"  # fedrift made this folder (or found it empty): its own files in it may be removed
EXTRA = ("personalization.json", "client_state.bin")  # written by some runs only
WHAT = "output.dir"
ALLOWED = "; allowed: a folder this user can create and write, on a disk with free space"


def auto_dir(base: Path, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{label}-{stamp}"
    n = 2
    while path.exists():
        path = base / f"{label}-{stamp}-{n}"
        n += 1
    return path


def unfinished(out_dir: Path) -> str | None:
    """How a run folder's run stopped before its end ("interrupted in round 7", "stopped
    after round 3"), or None when it holds no unfinished run."""
    summary, metrics = out_dir / "summary.json", out_dir / "metrics.jsonl"
    if summary.is_file():
        try:
            s = json.loads(summary.read_text())
        except ValueError:
            return None
        return f"was interrupted after round {s.get('rounds')}" if s.get("status") == "interrupted" else None
    if not (out_dir / "config.yaml").is_file():
        return None
    last = 0
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                last = int(json.loads(line)["round"])
            except (ValueError, KeyError, TypeError):
                pass  # a line torn by the kill
    return f"stopped after round {last}"


class RunWriter:
    """``resume``: continue the run already in ``out_dir``, its ``metrics.jsonl`` cut back to
    ``resume`` bytes (the checkpoint's length: later lines are of rounds to be redone), and its
    ``clients.csv`` to ``resume_clients`` bytes."""

    def __init__(self, out_dir: Path, overwrite: bool, resume: int | None = None, resume_clients: int = 0) -> None:
        if out_dir.exists() and not out_dir.is_dir():
            raise ConfigError(f"output.dir: {str(out_dir)!r} is a file, not a folder")
        held = [name for name in (*OWNED, CHECKPOINTS) if os.path.lexists(out_dir / name)]
        if resume is not None and deployed(out_dir):
            raise ConfigError(f"--resume: {str(out_dir)!r} holds a Flower deployment's run; {AGAIN}")
        if held and not overwrite and resume is None:
            stopped = unfinished(out_dir)
            if stopped and deployed(out_dir):
                raise ConfigError(f"output.dir: {str(out_dir)!r} holds a deployed run that {stopped}; {AGAIN}")
            if stopped:
                raise ConfigError(
                    f"output.dir: {str(out_dir)!r} holds a run that {stopped}; continue it with "
                    f"fedrift run --resume {out_dir}, or choose another folder or set output.overwrite=true"
                )
            raise ConfigError(
                f"output.dir: {str(out_dir)!r} already holds a run ({held[0]}); "
                "choose another folder or set output.overwrite=true"
            )
        if held and resume is None:
            may_clear(out_dir)
        self.created = not out_dir.exists()
        self.rows = 0  # metrics lines written by this run
        clients_size = 0
        with writing(WHAT, ALLOWED, "create or write"):
            fresh = self.created or not any(out_dir.iterdir())
            out_dir.mkdir(parents=True, exist_ok=True)
            self._lock = FolderLock(out_dir, "output.dir")  # before anything in it changes
            try:
                if fresh:
                    mark(out_dir)
                if resume is not None:
                    summary = out_dir / "summary.json"
                    refuse_link(summary)
                    summary.unlink(missing_ok=True)  # an interrupted run's
                    with open_update(out_dir / "metrics.jsonl") as f:
                        f.truncate(resume)
                    if os.path.lexists(out_dir / CLIENTS):
                        with open_update(out_dir / CLIENTS) as f:
                            f.truncate(resume_clients)
                        clients_size = resume_clients
                elif held:  # overwrite, checked by may_clear
                    remove_owned(out_dir)
                # unbuffered: a line is on its way to the disk once log returns, and a failed
                # write leaves nothing pending that closing the file would try again
                self._metrics = open_append(out_dir / "metrics.jsonl", buffering=0)
            except BaseException:
                self._lock.release()  # nothing of this run will use the folder
                raise
        self.dir = out_dir
        self._good = self._metrics.tell()  # bytes of whole lines
        self._last_round: Any = None
        self._clients: Any = None  # clients.csv, opened at its first rows
        # its bytes written whole, and those of rounds whose metrics line is written too
        self._clients_good = self._clients_kept = clients_size

    def write_text(self, name: str, text: str) -> None:
        """A whole file of the run (renamed into place: a kill never leaves a torn config.yaml)."""
        with writing(WHAT, ALLOWED, path=self.dir / name):
            write_atomic(self.dir / name, text)

    def write_partition(self, partition: Partition) -> None:
        """``partition.json`` (a small header) and ``partition.bin`` (the index arrays)."""
        with writing(WHAT, ALLOWED):
            partition.save(self.dir / "partition.json")

    def log_clients(self, round_: int, model: str, clients: list[int], scores: Any) -> None:
        """Append ``clients.csv``'s rows of round ``round_`` for one scored ``model`` (``global``,
        ``personal``, ``calibrated``, ``personal_proto``, ...): per client with test samples its
        ``n_test`` and ``correct`` (``scores``: a ``ClientScores`` over ``clients``, in order).
        They count only once the round's metrics line follows (:meth:`log`)."""
        n_test, correct = scores.n_test.tolist(), scores.correct.tolist()
        text = "".join(f"{round_},{k},{model},{n},{c}\n" for k, n, c in zip(clients, n_test, correct) if n)
        if not text:
            return
        path = self.dir / CLIENTS
        with writing(WHAT, ALLOWED, path=path):
            if self._clients is None:
                self._clients = open_append(path, buffering=0)
                self._clients_good = self._clients_kept = self._clients.tell()
        if not self._clients_good:
            text = ",".join(CLIENT_COLUMNS) + "\n" + text
        self._append(self._clients, text, self._clients_good, path, round_)
        self._clients_good = self._clients.tell()

    def log(self, row: dict[str, Any]) -> None:
        """Append one metrics line; on a write error (a full disk) the part written is cut
        off again (and the round's ``clients.csv`` rows) and the run stops with an
        :class:`OutputError`."""
        try:
            self._append(self._metrics, json.dumps(_jsonable(row)) + "\n", self._good, self.dir / "metrics.jsonl",
                         row.get("round"))
        except OutputError:
            self.cut_clients()
            raise
        self._good = self._metrics.tell()
        self._last_round = row.get("round")
        self._clients_kept = self._clients_good
        self.rows += 1

    def _append(self, f: Any, text: str, good: int, path: Path, round_: Any) -> None:
        """Write all of ``text`` at the end of ``f``; on a write error, cut ``f`` back to
        ``good`` bytes and raise an :class:`OutputError`."""
        view = memoryview(text.encode())
        try:
            while view:
                view = view[f.write(view):]
        except OSError as err:
            try:
                os.ftruncate(f.fileno(), good)
            except OSError:
                pass
            kept = f"rounds up to {self._last_round}" if self._last_round is not None else "no round"
            raise OutputError(
                f"{WHAT}: {describe_os_error(err, path)} at round {round_}; {path} keeps {kept}"
            ) from None

    def cut_clients(self) -> None:
        """Cut ``clients.csv`` back to the rounds whose metrics line was written (a stop between
        a round's rows and its line leaves neither)."""
        if self._clients is None or self._clients.closed or self._clients_good == self._clients_kept:
            return
        try:
            os.ftruncate(self._clients.fileno(), self._clients_kept)
            self._clients_good = self._clients_kept
        except OSError:
            pass  # the next resume cuts it to its checkpoint's length

    @property
    def clients_bytes(self) -> int:
        """``clients.csv``'s length up to the last round with its metrics line (a checkpoint's place in it)."""
        return self._clients_kept

    def discard(self) -> None:
        """Remove what this run wrote, for a run refused before its first round ended (a check
        only the first round can make): a refused config leaves no folder to block the rerun."""
        self._close_files()
        remove_owned(self.dir)
        if self.created:
            for name in (MARK, LOCK_NAME):
                (self.dir / name).unlink(missing_ok=True)
            try:
                self.dir.rmdir()  # left when something else was put in it meanwhile
            except OSError:
                pass

    def sync(self) -> int:
        """Push metrics.jsonl (and clients.csv) to the disk; its length (a checkpoint's place in it)."""
        with writing(WHAT, ALLOWED, path=self.dir / "metrics.jsonl"):
            os.fsync(self._metrics.fileno())
        if self._clients is not None:
            with writing(WHAT, ALLOWED, path=self.dir / CLIENTS):
                os.fsync(self._clients.fileno())
        return self._good

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Atomically (written beside, then renamed): a run killed meanwhile leaves no torn file."""
        with writing(WHAT, ALLOWED, path=self.dir / "summary.json"):
            write_atomic(self.dir / "summary.json", json.dumps(_jsonable(summary), indent=2) + "\n")

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        # through a Python file, so that a failed write is an OSError (torch's own writer
        # raises a RuntimeError that does not say why)
        path = self.dir / "final_model.pt"
        with writing(WHAT, ALLOWED, path=path), atomic_file(path) as f:
            torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, f)

    def close(self) -> None:
        self._close_files()

    def release(self) -> None:
        """Let another process use the folder (after the run's last file)."""
        self._close_files()
        self._lock.release()

    def _close_files(self) -> None:
        self.cut_clients()
        self._metrics.close()
        if self._clients is not None:
            self._clients.close()


def mark(folder: Path) -> None:
    """Write fedrift's mark in a run folder it made or found empty (see :func:`may_clear`)."""
    write_atomic(folder / MARK, json.dumps({"fedrift": __version__, "made": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")


def marked(folder: Path) -> bool:
    path = folder / MARK
    return path.is_file() and not path.is_symlink()


def may_clear(folder: Path, what: str = "output.overwrite") -> None:
    """Refuse (ConfigError) to clear ``folder`` of an earlier run unless fedrift made it: never
    the root or the home folder, never a folder without fedrift's mark (its config.yaml or
    metrics.jsonl could be the user's own)."""
    real = folder.resolve()
    if real == Path(real.anchor) or real == Path.home().resolve():
        raise ConfigError(f"{what}: {str(folder)!r} is the {'root' if real == Path(real.anchor) else 'home'} folder, "
                          "which fedrift never clears; allowed: a run folder of its own, e.g. output.dir=runs/NAME")
    if not marked(folder):
        raise ConfigError(
            f"{what}: {str(folder)!r} holds files but no {MARK} mark (the folder was not made by a fedrift run, or "
            "by one older than the mark), so fedrift cannot tell its files from yours and removes none; allowed: "
            "another folder, or remove the earlier run's files yourself"
        )


def remove_owned(folder: Path) -> None:
    """Remove an earlier run's files from ``folder``: fedrift's own names only (a link at one
    of them is removed, never followed), its checkpoint files only, the checkpoint folder
    when that leaves it empty; anything else stays."""
    for name in (*OWNED, *EXTRA):
        path = folder / name
        if os.path.lexists(path) and not (path.is_dir() and not path.is_symlink()):
            path.unlink()
    for sub, clear in ((CHECKPOINTS, remove_checkpoints), (BOARD, remove_events)):
        path = folder / sub
        if path.is_symlink():
            path.unlink()
        elif path.is_dir():
            clear(path)
            try:
                path.rmdir()  # another program's files are in it: they stay, and so does the folder
            except OSError:
                pass


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null rather than emit invalid JSON."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out
