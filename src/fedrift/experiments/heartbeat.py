"""Lines while runs train: a study or compare is never silent for more than a minute.

A thread of the command watches the run folders under its roots (``compare``'s settings,
a study's tune trials too). A run in progress is one whose folder lock is held by a live
process (:func:`fedrift.engine.folder_lock.holder`): in this process, a pool worker or
a stack's thread alike, so the watcher needs no word from them. It says when each run starts,
and every ``EVERY`` seconds, for each run in progress, its round, last accuracy and an
estimate of the rest (its time so far over its rounds so far, times the rounds left); with
none in progress (a run loading its data before it locks its folder), that it is working.
``study status`` reads the same facts (:func:`in_progress`) from another process.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from fedrift.engine.folder_lock import LOCK_NAME, holder

EVERY = 60.0  # seconds between a run's progress lines
POLL = 5.0  # seconds between looks at the folders (a run's start is said within this)
PATTERNS = ("*/seed*", "trials/*/trial*")  # compare's run folders, a tune's trial folders


@dataclass
class Running:
    """A run in progress, as its folder shows it."""

    folder: Path
    name: str  # the folder relative to its root: setting/seedN, trials/study/trialN
    holder: str  # "pid N on HOST since ..."
    started: float  # epoch seconds (its lock's)
    round: int  # the last evaluated round (0: none yet)
    rounds: int | None  # planned
    accuracy: float | None

    def line(self, now: float) -> str:
        """``NAME: round 14/50, accuracy 41.2%, 5 min in, about 13 min left``."""
        from fedrift.report.select_page import duration_text

        spent = max(0.0, now - self.started)
        parts = [f"round {self.round}/{self.rounds or '?'}" if self.round else "before its first evaluated round"]
        if self.accuracy is not None:
            parts.append(f"accuracy {100 * self.accuracy:.1f}%")
        parts.append(f"{duration_text(spent)} in")
        if self.round and self.rounds:
            parts.append(f"about {duration_text(spent / self.round * max(0, self.rounds - self.round))} left")
        return f"{self.name}: " + ", ".join(parts)


def _last_row(path: Path) -> dict | None:
    """The last whole line of a metrics.jsonl (its tail only: a long run's file is not read whole)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            row = json.loads(raw)
        except ValueError:
            continue  # torn (being written) or cut at the tail's start
        if isinstance(row, dict):
            return row
    return None


def _planned_rounds(folder: Path) -> int | None:
    import yaml

    from fedrift import yamlio

    try:
        doc = yamlio.load((folder / "config.yaml").read_text()) or {}
        return int((doc.get("train") or {}).get("rounds"))
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return None


def in_progress(roots: Sequence[Path]) -> list[Running]:
    """The runs in progress under ``roots``: folders whose lock a live process holds."""
    out = []
    for root in roots:
        for pattern in PATTERNS:
            for folder in sorted(root.glob(pattern)):
                who = holder(folder)
                if who is None:
                    continue
                try:
                    started = (folder / LOCK_NAME).stat().st_mtime
                except OSError:
                    continue
                row = _last_row(folder / "metrics.jsonl") or {}
                acc = row.get("test_accuracy")
                out.append(Running(folder, str(folder.relative_to(root)), who, started, int(row.get("round") or 0),
                                   _planned_rounds(folder), float(acc) if isinstance(acc, (int, float)) else None))
    return out


class Heartbeat:
    """The watcher thread (a context manager): a line when a run starts and, every ``every``
    seconds, one per run in progress. Nested ones (a study's compare) leave it to the outer one."""

    _active = 0
    _guard = threading.Lock()

    def __init__(self, roots: Sequence[Path], echo: Callable[[str], None], every: float | None = None,
                 poll: float | None = None) -> None:
        self.roots, self.echo = list(roots), echo
        self.every, self.poll = every if every is not None else EVERY, poll if poll is not None else POLL
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Heartbeat":
        with Heartbeat._guard:
            outer = Heartbeat._active > 0
            Heartbeat._active += 1
        if not outer:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="fedrift-heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.poll + 5)
        with Heartbeat._guard:
            Heartbeat._active -= 1

    def _watch(self) -> None:
        seen: set[Path] = set()
        last_beat = time.time()
        while not self._stop.wait(self.poll):
            try:
                now, running = time.time(), in_progress(self.roots)
            except (OSError, ValueError):  # a folder changing under the watcher: look again next time
                continue
            for r in running:
                if r.folder not in seen:
                    self.echo(f"{r.name}: starts ({r.rounds or '?'} rounds; {r.holder.split(' since ')[0]})")
            seen = {r.folder for r in running}
            if now - last_beat >= self.every:
                for r in running:
                    self.echo(r.line(now))
                if not running:  # a run's data loading (its folder is locked after it), a report being written
                    self.echo("working: no run has its folder yet (a run loading its data, or the report being "
                              "written)")
                last_beat = now


__all__ = ["EVERY", "Heartbeat", "Running", "in_progress"]
