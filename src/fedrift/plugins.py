"""Plugins: the user's own modules that register algorithms, models, datasets and partitions.

Two ways in, both imported before a config is validated (``config.load_config`` calls
:func:`load_plugins`, so the CLI, ``compare``'s worker processes and the executors' workers,
which all rebuild the run from its config, import the same plugins):

- the config's ``plugins: [module, ...]`` (``plugins=[my_pkg.algos]`` on the command line);
- the ``fedrift.plugins`` entry-point group of installed packages, loaded once per process:
  an entry point names a module (imported) or a callable (called with no arguments).

A plugin that fails to import is refused with one line naming it and its error
(:class:`ConfigError`), and what it had registered before failing is removed again.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Iterable

from fedrift.errors import ConfigError
from fedrift.registry import loading_plugin

GROUP = "fedrift.plugins"

_entry_points_loaded: set[tuple[str, str]] = set()  # (name, value) of the entry points imported here
_entry_points_done = False  # all of them loaded: the installed packages are looked up once per process


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Import the installed entry-point plugins (once) and then ``modules``, in order."""
    load_entry_points()
    for name in modules:
        import_plugin(name)


def import_plugin(module: str) -> None:
    """Import plugin ``module`` (nothing to do when it is imported already)."""
    if module in sys.modules:
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


__all__ = ["GROUP", "import_plugin", "load_entry_points", "load_plugins"]
