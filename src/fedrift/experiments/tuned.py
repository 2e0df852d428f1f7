"""What ``fedrift tune`` chose, as the experiments read it back: ``best.yaml`` (per algorithm
entry the best values as config overrides) and the base they were chosen on, which
``compare ... tuned=DIR`` checks its runs against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from fedrift import yamlio
from fedrift.config import load_config
from fedrift.errors import ConfigError
from fedrift.overrides import parse_algorithm
from fedrift.report.table import flatten


BASE_SECTIONS = ("data", "model", "partition", "train")  # what a tune's choice is for (best.yaml's base)
BEST = "best.yaml"


def tune_base(doc: Mapping[str, Any], tuned: Sequence[str] = ()) -> dict[str, Any]:
    """What a choice of values is for: the resolved (defaults filled in) ``data``, ``model``,
    ``partition`` and ``train`` keys of a config, flattened, less the ``tuned`` keys."""
    resolved = json.loads(json.dumps(load_config({k: v for k, v in doc.items() if k != "output"}).model_dump(),
                                     default=str))
    flat = flatten({k: resolved.get(k) or {} for k in BASE_SECTIONS})
    return {k: v for k, v in flat.items() if k not in set(tuned)}


def base_check(path: str | Path, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The runs (grid entry, config) that take a tune's values against the base each entry's
    values were chosen on: ``differences`` (per key: the values tuned on and those here, and
    the entries) and ``unrecorded`` (entries whose ``best.yaml`` predates stored bases)."""
    best = read_tuned(path)
    by_name = {parse_algorithm(e)[0]: v for e, v in best.items()}
    diffs: dict[str, dict[str, list[Any]]] = {}
    unrecorded: list[str] = []
    for entry, doc in runs:
        found = best.get(entry) or by_name.get(parse_algorithm(entry)[0])
        if found is None:
            continue
        base = found.get("base")
        if not isinstance(base, dict):
            unrecorded += [entry] if entry not in unrecorded else []
            continue
        here = tune_base(doc, list(found["overrides"]))
        for key, value in base.items():
            if key in here and json.dumps(value, sort_keys=True) != json.dumps(here[key], sort_keys=True):
                d = diffs.setdefault(key, {"tuned": [], "here": [], "entries": []})
                for name, v in (("tuned", value), ("here", here[key]), ("entries", entry)):
                    if v not in d[name]:
                        d[name].append(v)
    return {"differences": diffs, "unrecorded": unrecorded}


def base_warning(path: str | Path, check: Mapping[str, Any]) -> list[str]:
    """The lines ``compare`` prints for :func:`base_check`'s findings (none when all agree)."""
    def show(values: Sequence[Any]) -> str:
        return ",".join(v if isinstance(v, str) else json.dumps(v) for v in values)

    lines = []
    diffs = check.get("differences") or {}
    if diffs:
        keys = "; ".join(f"{k}: tuned on {show(d['tuned'])}, here {show(d['here'])}" for k, d in diffs.items())
        lines.append(f"tuned: {path} chose its values on another base than these runs ({keys}); values tuned for one "
                     "setting may not be the best for another: tune on the runs' own config to compare at their best")
    if check.get("unrecorded"):
        lines.append(f"tuned: {path} records no base for {', '.join(check['unrecorded'])} (a best.yaml from before "
                     "fedrift stored one): not checked against these runs")
    return lines


def read_tuned(path: str | Path) -> dict[str, dict[str, Any]]:
    """A tune folder's (or its ``best.yaml``'s) best values per entry, refused clearly when it
    is not one."""
    p = Path(path)
    p = p / BEST if p.is_dir() else p
    if not p.is_file():
        raise ConfigError(f"tuned: {str(path)!r} holds no {BEST}; allowed: a folder written by fedrift tune")
    try:
        doc = yamlio.load(p.read_text()) or {}
    except (yaml.YAMLError, ValueError):
        raise ConfigError(f"tuned: {p} is not valid YAML") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) and isinstance(v.get("overrides"), dict) for v in doc.values()):
        raise ConfigError(f"tuned: {p} is not a fedrift tune's {BEST} (entry: {{overrides: {{key: value}}}})")
    return doc


__all__ = ["BASE_SECTIONS", "BEST", "base_check", "base_warning", "read_tuned", "tune_base"]
