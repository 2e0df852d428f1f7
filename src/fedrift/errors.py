"""The one error type users see: a message that names what is wrong and what is allowed."""

from __future__ import annotations


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


class DataError(FedriftError):
    """A dataset file that is missing, truncated or not in its published format; the message
    names the file and what was expected. Raised while loading, before any output is written."""
