"""Algorithms (registry ``ALGORITHMS``): one module per family, each a factory of hooks.

Every module in this package is imported here, so adding an algorithm is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedrift.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")



def make(name: str, setup, **options):
    """Algorithm ``name`` for ``setup``, its options validated as a config section's are
    (for notebooks and tests; runs build theirs from the config)."""
    from fedrift.config import validate_options  # fedrift.config does not import algorithms

    entry = ALGORITHMS.get(name, "algorithm.name")
    return entry.factory(validate_options("algorithm", entry.params, options), setup)


_SUPPORT = {"base", "terms"}
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in _SUPPORT:
        importlib.import_module(f"{__name__}.{_mod}")
