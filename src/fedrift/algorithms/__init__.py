"""Algorithms (registry ``ALGORITHMS``): one module per family, each a factory of hooks."""

from __future__ import annotations

from fedrift.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")

from fedrift.algorithms import fedavg, fedprox  # noqa: E402,F401
