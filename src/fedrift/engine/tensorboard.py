"""TensorBoard event files of a run (``output.tensorboard``), to watch long comparisons live.

Each evaluated round's metrics row goes in as scalars at step = round: every numeric value
of the ``metrics.jsonl`` line (accuracies, losses, bytes, seconds, client counts, epsilon,
an algorithm's own terms), in ``<output.dir>/tensorboard/``. metrics.jsonl stays the record;
the event files are a view of it. The ``tensorboard`` package is imported only when asked
for, so it stays an optional extra (``pip install 'fedrift[tensorboard]'``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedrift.errors import ConfigError
from fedrift.safe_files import make_dir

FOLDER = "tensorboard"
SUFFIX = ".fedrift"  # on fedrift's event files: the only ones a new run in the folder removes


def remove_events(folder: Path) -> None:
    """Delete fedrift's own event files in ``folder`` (an earlier run's, which would show as
    one curve with the new one's); event files another program wrote there stay."""
    for p in folder.glob(f"events.out.tfevents.*{SUFFIX}"):
        if p.is_file() or p.is_symlink():
            p.unlink()


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter``, or a ConfigError naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "output.tensorboard: true needs the tensorboard package, which is not installed; allowed: "
            "pip install 'fedrift[tensorboard]' (or tensorboard), or output.tensorboard false"
        ) from None
    return SummaryWriter


class Board:
    """The run's event files. ``resume_from``: None for a new run in this folder, whose
    earlier event files are removed first (they would show as one curve); else the first
    round a resumed run computes again: its new file starts with a session START at that
    step, on which TensorBoard's reader drops the earlier files' steps from there on (the
    rounds redone after the checkpoint), as it does for a restarted TensorFlow job."""

    def __init__(self, out_dir: Path, resume_from: int | None = None) -> None:
        writer_class = summary_writer_class()
        folder = make_dir(Path(out_dir) / FOLDER, parents=False)  # a link there is refused, not written through
        if resume_from is None:
            remove_events(folder)
        self._writer = writer_class(log_dir=str(folder), filename_suffix=SUFFIX)
        if resume_from is not None:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            start = Event(session_log=SessionLog(status=SessionLog.START))
            self._writer._get_file_writer().add_event(start, resume_from)  # torch's writer has no public call for it

    def log(self, row: dict[str, Any]) -> None:
        """The row's numeric values at step ``row["round"]``, flushed so a viewer sees them now."""
        step = int(row["round"])
        for key, value in row.items():
            if key != "round" and _number(value):
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _number(v: Any) -> bool:
    """JSON numbers only: no booleans, no NaN/inf (metrics.jsonl writes those as null)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


__all__ = ["FOLDER", "SUFFIX", "Board", "remove_events", "summary_writer_class"]
