"""The ``key=value`` grammar of the command line, shared by ``fedrift run``'s overrides and the
experiments' grids (``compare``, ``tune``, ``select``): values are YAML, lists split on commas
outside brackets and quotes, and an algorithm entry carries its own options
(``fedprox:mu=0.1``, ``moon:mu=5:model.projection_dim=256``)."""

from __future__ import annotations

from typing import Any

import yaml

from fedrift import yamlio
from fedrift.errors import ConfigError


def split_list(raw: str) -> list[str]:
    """``"0.1,0.5,[64,64]"`` -> ``["0.1", "0.5", "[64,64]"]``: commas outside brackets and quotes."""
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]") and _depth_zero_close(raw):
        raw = raw[1:-1]
    parts, depth, quote, cur = [], 0, "", []
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _depth_zero_close(raw: str) -> bool:
    """Whether the opening ``[`` of ``raw`` closes at its last character (a YAML list)."""
    depth = 0
    for i, ch in enumerate(raw):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            return i == len(raw) - 1
    return False


def parse_value(raw: str, where: str = "") -> Any:
    """A value as YAML reads it (``0.1``, ``[64, 64]``, ``none``); text that is not YAML as it is.
    A mapping that gives a key twice (``{a: 1, a: 2}``) is refused, naming ``where`` (the
    override) or the value."""
    try:
        return yamlio.load(raw) if raw.strip() else None
    except yamlio.DuplicateKeyError as err:
        raise ConfigError(f"{where or f'value {raw.strip()!r}'}: {err.problem}") from None
    except yaml.YAMLError:
        return raw


ENTRY_SECTIONS = ("data", "partition", "model", "train", "engine", "eval")


def parse_algorithm(entry: str) -> tuple[str, list[str]]:
    """``"fedprox:mu=0.1:aggregation=uniform"`` -> ``("fedprox", ["algorithm.mu=0.1",
    "algorithm.aggregation=uniform"])``: the entry's overrides. A dotted key overrides that
    config key for this entry's runs only (``moon:mu=5:model.projection_dim=256``)."""
    name, *opts = [p.strip() for p in entry.split(":")]
    if not name:
        raise ConfigError(f"algorithms: entry {entry!r} has no algorithm name")
    out = []
    for o in opts:
        key, sep, _ = o.partition("=")
        key = key.strip()
        dotted = "." in key
        if not sep or not key or (dotted and key.split(".")[0] not in ENTRY_SECTIONS):
            raise ConfigError(
                f"algorithms: option {o!r} of {entry!r} is not of the form key=value or section.key=value "
                f"with a section among {', '.join(ENTRY_SECTIONS)} (e.g. fedprox:mu=0.1, moon:model.projection_dim=256)"
            )
        out.append(o if dotted else f"algorithm.{o}")
    return name, out


__all__ = ["ENTRY_SECTIONS", "parse_algorithm", "parse_value", "split_list"]
