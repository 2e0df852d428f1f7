"""Plugins: the user's own modules that register algorithms, models, datasets and partitions.

Two ways in, both imported before a config is validated (``config.load_config`` calls
:func:`load_plugins`, so the CLI, ``compare``'s worker processes and the executors' workers,
which all rebuild the run from its config, import the same plugins):

- the config's ``plugins: [module, ...]`` (``plugins=[my_pkg.algos]`` on the command line);
- the ``fedrift.plugins`` entry-point group of installed packages, loaded once per process:
  an entry point names a module (imported) or a callable (called with no arguments).

A plugin that fails to import is refused with one line naming it and its error
(:class:`ConfigError`), and what it had registered before failing is removed again.

A run folder's ``config.yaml`` may come from anyone, and importing the plugins it names runs
their code: ``fedrift report`` reads its run folders inside :func:`run_folders`, which imports
them only when asked (``--trust-plugins``).
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator

from fedrift.errors import ConfigError
from fedrift.registry import loading_plugin

GROUP = "fedrift.plugins"

_entry_points_loaded: set[tuple[str, str]] = set()  # (name, value) of the entry points imported here
_entry_points_done = False  # all of them loaded: the installed packages are looked up once per process
# inside run_folders: None when its plugins are imported (trusted), else the names left unimported
_not_imported: ContextVar[list[str] | None] = ContextVar("fedrift_plugins_not_imported", default=None)
_trusting: ContextVar[bool] = ContextVar("fedrift_plugins_trusting", default=False)


@contextmanager
def run_folders(trust: bool) -> Iterator[list[str]]:
    """Read run folders (their ``config.yaml`` may name plugins) inside this block.

    ``trust=False``: a plugin module that is not imported yet is not imported; its name goes
    to the list yielded (a module already imported, by ``plugins=[...]`` on the command line
    or an installed entry point, is used as usual). ``trust=True``: they are imported, and the
    hint for one Python cannot find says that its code then runs.
    """
    skipped: list[str] = []
    names = _not_imported.set(None if trust else skipped)
    trusting = _trusting.set(trust)
    try:
        yield skipped
    finally:
        _not_imported.reset(names)
        _trusting.reset(trusting)


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Import the installed entry-point plugins (once) and then ``modules``, in order."""
    load_entry_points()
    for name in modules:
        import_plugin(name)


def import_plugin(module: str) -> None:
    """Import plugin ``module`` (nothing to do when it is imported already)."""
    if module in sys.modules:
        return
    skipped = _not_imported.get()
    if skipped is not None:  # a run folder's plugin, not trusted: its code does not run
        if module not in skipped:
            skipped.append(module)
        return
    with loading_plugin(f"plugin {module}"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            raise ConfigError(f"plugins: cannot import {module!r}: {_describe(err)}{_not_found(module, err)}") from None
        except Exception as err:
            raise ConfigError(f"plugins: cannot import {module!r}: {_describe(err)}") from None


def _not_found(module: str, err: ModuleNotFoundError) -> str:
    """What to do about a plugin Python cannot find: make the plugin importable, or install
    what the plugin itself imports."""
    missing = err.name or ""
    if not missing or not (module == missing or module.startswith(missing + ".")):
        return f", which {module} imports; install that package"
    top = module.split(".")[0]
    here = next((f"./{p}" for p in (Path(*module.split(".")).with_suffix(".py"), Path(top)) if p.exists()), None)
    hint = f" ({here} is here: run with PYTHONPATH=.)" if here else ""
    if here and _trusting.get():  # fedrift report --trust-plugins: the file may have come with the runs
        hint += f"; {here}'s code then runs: only for a file you trust"
    return ("; a plugin must be importable: an installed package (pip install DIR of its project), or a module "
            f"in a folder on PYTHONPATH{hint}")


def load_entry_points() -> None:
    """Load every ``fedrift.plugins`` entry point of the installed packages not loaded yet
    (looked up once per process: about 5 ms, and load_config calls this)."""
    global _entry_points_done
    if _entry_points_done:
        return
    for ep in entry_points(group=GROUP):
        key = (ep.name, ep.value)
        if key in _entry_points_loaded:
            continue
        dist = f" of {ep.dist.name}" if getattr(ep, "dist", None) is not None else ""
        with loading_plugin(f"entry point {ep.name}{dist}"):
            try:
                _load(ep)
            except Exception as err:
                raise ConfigError(
                    f"{GROUP} entry point {ep.name!r}{dist} ({ep.value}): cannot import: {_describe(err)}; "
                    "fix or uninstall that package"
                ) from None
        _entry_points_loaded.add(key)
    _entry_points_done = True


def _load(ep: EntryPoint) -> None:
    target = ep.load()
    if not isinstance(target, ModuleType) and callable(target):
        target()


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


__all__ = ["GROUP", "import_plugin", "load_entry_points", "load_plugins", "run_folders"]
