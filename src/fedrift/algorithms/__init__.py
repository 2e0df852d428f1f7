"""Algorithms (registry ``ALGORITHMS``): one module per family, each a factory of hooks.

Every module in this package is imported here, so adding an algorithm is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedrift.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")

_SUPPORT = {"base", "terms"}
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in _SUPPORT:
        importlib.import_module(f"{__name__}.{_mod}")
