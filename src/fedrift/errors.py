"""The one error type users see: a message that names what is wrong and what is allowed."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class FedriftError(Exception):
    """A user mistake (bad config, missing folder, impossible partition).

    The CLI prints the message on one line and exits with status 2; anything that is not a
    FedriftError is a bug and keeps its traceback.
    """

    exit_code = 2


class ConfigError(FedriftError):
    """A config key or value that is refused before anything runs."""


class DivergenceError(FedriftError):
    """Training produced a non-finite loss; the metrics written so far are kept.

    ``result`` holds the partial :class:`fedrift.api.RunResult` when the engine had one.
    """

    exit_code = 3
    status = "diverged"  # the summary's status

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result


class NoClientsError(DivergenceError):
    """A round in which no client returned (all dropped out or failed): the run stops there,
    the metrics written so far are kept."""

    status = "no_clients"


class ClusterLostError(FedriftError):
    """The cluster the clients train on went away mid-run (a Ray head node lost): not a user
    mistake and not the run's fault, so the run stops as at Ctrl-C: ``summary.json`` says
    ``interrupted`` with the message, the last checkpoint is kept, and the message names the
    ``fedrift run --resume`` command (at another head address, or under an executor with equal
    results; ``engine/checkpoint.py`` says which keys a resume may change).

    ``hint``: what the resume command may add (``; on another cluster: add ...``), after it;
    ``result`` holds the partial :class:`fedrift.api.RunResult` once the engine has one.
    """

    exit_code = 4
    status = "interrupted"  # the summary's status: a resume continues it

    def __init__(self, message: str, hint: str = "", result: object | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        self.result = result


class DataError(FedriftError):
    """A dataset file that is missing, truncated or not in its published format; the message
    names the file and what was expected. Raised while loading, before any output is written."""


class OutputError(FedriftError):
    """A file or folder fedrift writes that cannot be created or written (no permission, a
    full disk, a read-only file system); what was written before is kept."""


@contextmanager
def writing(what: str, note: str = "", verb: str = "write", path: object = None) -> Iterator[None]:
    """Turn an ``OSError`` raised inside into an :class:`OutputError`: one line naming
    ``what`` was being written, the file (``path`` when the error names none) and the
    system's reason, then ``note``."""
    try:
        yield
    except OSError as err:
        raise OutputError(f"{what}: {describe_os_error(err, path, verb)}{note}") from None
    except RuntimeError as err:  # torch.save's writer, failing again after the file's OSError
        cause = err.__cause__ or err.__context__
        if isinstance(cause, KeyboardInterrupt):  # Ctrl-C mid-save: the writer's exit raised over it
            raise KeyboardInterrupt from None
        if not isinstance(cause, OSError):
            raise
        raise OutputError(f"{what}: {describe_os_error(cause, path, verb)}{note}") from None


def describe_os_error(err: OSError, path: object = None, verb: str = "write") -> str:
    """``cannot write /x/y (No space left on device)``: the file (``path`` when the error names
    none) and the system's reason, on one line."""
    reason = err.strerror or " ".join(str(err).split()) or type(err).__name__
    name = err.filename if err.filename is not None else path
    where = f" {name}" if name is not None else ""
    if err.filename2 is not None:
        where += f" -> {err.filename2}"
    return f"cannot {verb}{where} ({reason})"


def first_line(err: BaseException) -> str:
    """``Type: the message's first line``: how a warning names an exception it passes over (a
    device's or a library's message may run to many lines)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
