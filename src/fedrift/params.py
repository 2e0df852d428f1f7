"""Hyper-parameter classes: frozen dataclasses validated by pydantic.

Every registered dataset, partition, model and algorithm declares its options as one of
these; the config section ``{name: X, **options}`` is validated against X's class, so an
unknown key or an out-of-range value is refused with the key's name before anything runs.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as _pydantic_dataclass

T = TypeVar("T")


def params(cls: type[T]) -> type[T]:
    """Decorate an options class: frozen, typed, unknown keys refused."""
    return _pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))(cls)

