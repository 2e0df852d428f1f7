"""Hyper-parameter classes: frozen dataclasses validated by pydantic.

Every registered dataset, partition, model and algorithm declares its options as one of
these; the config section ``{name: X, **options}`` is validated against X's class, so an
unknown key or an out-of-range value is refused with the key's name before anything runs.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as _pydantic_dataclass

T = TypeVar("T")


def params(cls: type[T]) -> type[T]:
    """Decorate an options class: frozen, typed, unknown keys refused."""
    return _pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))(cls)


def with_options(options: T, **changes: Any) -> T:
    """A copy of an options object with ``changes``, not validated again: the object was
    validated when the config was read, and the new values are the caller's (a resolved
    form; a stacked run's values as tensors, which no field's type admits:
    ``engine.step_values``)."""
    new = copy.copy(options)
    for key, value in changes.items():
        object.__setattr__(new, key, value)
    return new
