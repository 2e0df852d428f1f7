"""Name -> factory registries, read by `fedrift list` and by config validation."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, TypeVar

from fedrift.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]
    doc: str
    params: type | None  # a pydantic dataclass of the entry's options, or None if it takes none
    source: str = "built in"  # or the plugin that registered it (``fedrift list`` shows it)
    # the default search space of `fedrift tune` over the entry's options ({"mu": "log:1e-4:1"}; fedrift/experiments/space.py)
    space: dict[str, str] | None = None


class Registry(Generic[F]):
    """A named set of factories of one kind (algorithm, dataset, model, partition, executor)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, doc: str, params: type | None = None, source: str | None = None,
                 space: dict[str, str] | None = None, replace: bool = False) -> Callable[[F], F]:
        """``source``: who registers (default: from the factory's module, see :func:`source_of`);
        ``space``: the default search space of ``fedrift tune`` over the entry's options. A name
        taken already is refused unless ``replace=True``, or unless the new factory is the same
        definition again (same module and qualified name: a notebook cell or a script run
        twice), which then replaces the old one."""

        def add(factory: F) -> F:
            old = self._entries.get(name)
            if old is not None and not replace and not _same_definition(old.factory, factory):
                raise ValueError(
                    f"{self.kind} {name!r} is registered already (by {old.factory.__module__}."
                    f"{old.factory.__qualname__}); pass replace=True to register() to replace it"
                )
            self._entries[name] = Entry(name, factory, doc, params, source or source_of(factory.__module__), space)
            if _loading is not None:
                _loading[1].append((self, name))
            return factory

        return add

    def get(self, name: str, key: str | None = None) -> Entry:
        if name not in self._entries:
            where = f"{key}: " if key else ""
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


# The plugin being imported (fedrift.plugins), and what it has registered so far.
_loading: tuple[str, list[tuple[Registry, str]]] | None = None


def source_of(module: str) -> str:
    """Where an entry registered from ``module`` comes from: "built in" for fedrift's own
    modules, else the plugin being loaded, else the module (a user's script)."""
    if module == "fedrift" or module.startswith("fedrift."):
        return "built in"
    return _loading[0] if _loading is not None else f"module {module}"


@contextmanager
def loading_plugin(label: str) -> Iterator[None]:
    """Entries registered inside are labelled ``label``; if the block raises, they are
    removed again, so a plugin that failed half-way leaves nothing behind."""
    global _loading
    before, _loading = _loading, (label, [])
    added = _loading[1]
    try:
        yield
    except BaseException:
        for registry, name in added:
            registry._entries.pop(name, None)
        raise
    finally:
        _loading = before


def _same_definition(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return key(a) == key(b)
