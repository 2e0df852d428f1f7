"""Search spaces: a dimension (``log:LOW:HIGH``, ``float:LOW:HIGH``, ``int:LOW:HIGH`` or a
list of values), an algorithm's default space (the learning rate and its registry entry's),
and the scrambled Sobol start-up design that spreads a small budget over the whole range."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError
from fedrift.overrides import parse_value, split_list


LR_SPACE = {"train.lr": "log:0.005:0.5"}
EDGE = 0.05  # a chosen value this close to an end of its range (share of the range; of its log for log:) is flagged


@dataclass(frozen=True)
class Dim:
    """One dimension of a search space: a config key and how its values are drawn."""

    key: str  # dotted config key: train.lr, algorithm.mu
    kind: str  # log | float | int | choice
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()

    @classmethod
    def parse(cls, key: str, spec: Any) -> "Dim":
        """``log:1e-4:1`` | ``float:0:1`` | ``int:1:5`` | ``0.01,0.05`` (or a list) -> a Dim."""
        where = f"space.{key}"
        if isinstance(spec, (list, tuple)):
            values = list(spec)
        else:
            text = str(spec).strip()
            kind, _, rest = text.partition(":")
            if kind in ("log", "float", "int"):
                lo, sep, hi = rest.partition(":")
                try:
                    low, high = (int(lo), int(hi)) if kind == "int" else (float(lo), float(hi))
                except ValueError:
                    raise ConfigError(f"{where}: {text!r} is not {kind}:LOW:HIGH with numbers (e.g. {kind}:1:5)") from None
                if not sep or not low < high or (kind == "log" and low <= 0) or not math.isfinite(high):
                    raise ConfigError(f"{where}: {text!r} needs LOW < HIGH" + (" and LOW > 0" if kind == "log" else ""))
                return cls(key, kind, low, high)
            values = [_number(parse_value(v)) for v in split_list(text)]
        if not values or len({json.dumps(v, default=str) for v in values}) != len(values):
            raise ConfigError(f"{where}: {spec!r} gives no values or one twice; allowed: log:LOW:HIGH, float:LOW:HIGH, "
                              "int:LOW:HIGH or a list such as 0.01,0.05")
        return cls(key, "choice", choices=tuple(values))

    def middle(self) -> Any:
        """A value inside the space (validation before anything runs)."""
        if self.kind == "choice":
            return self.choices[0]
        if self.kind == "log":
            return math.sqrt(self.low * self.high)
        return (self.low + self.high) / 2 if self.kind == "float" else int((self.low + self.high) // 2)

    def suggest(self, trial: Any) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log")

    def describe(self) -> str:
        return ",".join(map(str, self.choices)) if self.kind == "choice" else f"{self.kind}:{self.low:g}:{self.high:g}"

    def edge(self, value: Any) -> str | None:
        """``low`` or ``high`` when ``value`` lies within :data:`EDGE` of that end of the range
        (in the log for ``log``), or is the least or greatest of a list of three or more
        numbers (two are all edges; words have none); else None. A best value at an edge
        says the best may lie beyond the range searched."""
        if self.kind == "choice":
            nums = [c for c in self.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
            if len(nums) < 3 or len(nums) != len(self.choices) or value not in nums:
                return None
            return "low" if value == min(nums) else "high" if value == max(nums) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        if self.kind == "int":
            if self.high - self.low < 2:
                return None
            return "low" if value <= self.low else "high" if value >= self.high else None
        scale = math.log if self.kind == "log" else float
        u = (scale(value) - scale(self.low)) / (scale(self.high) - scale(self.low))
        return "low" if u <= EDGE else "high" if u >= 1 - EDGE else None

    def at(self, u: float) -> Any:
        """The value at ``u`` in [0, 1) of the space: uniform in the log for ``log``."""
        if self.kind == "choice":
            return self.choices[min(len(self.choices) - 1, int(u * len(self.choices)))]
        if self.kind == "int":
            return int(min(self.high, self.low + math.floor(u * (self.high - self.low + 1))))
        if self.kind == "log":
            v = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        else:
            v = self.low + u * (self.high - self.low)
        return float(min(max(v, self.low), self.high))


def startup_points(dims: Sequence[Dim], n: int, seed: int) -> list[dict[str, Any]]:
    """The first ``n`` points (``n`` <= 16) of a scrambled Sobol design of the space; a prefix
    of the same sequence for any ``n``, so a tune that grows keeps the points it ran. The first
    dimension (the learning rate) is a one-dimensional design seeded by the tune's seed alone,
    the same in every study; the others are one joint design."""
    from scipy.stats import qmc

    if not dims or n <= 0:
        return []
    cols = [qmc.Sobol(1, scramble=True, seed=seed).random_base2(4)[:n, 0]]
    if len(dims) > 1:
        cols += list(qmc.Sobol(len(dims) - 1, scramble=True, seed=seed + 1).random_base2(4)[:n].T)
    return [{d.key: d.at(float(c[i])) for d, c in zip(dims, cols)} for i in range(n)]


def _number(value: Any) -> Any:
    """``"1e-5"`` (a string to YAML 1.1, which wants ``1.0e-5``) as the float it means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def default_space(name: str) -> dict[str, str]:
    """An algorithm's default space as dotted keys: the learning rate and its registry entry's."""
    from fedrift.algorithms import ALGORITHMS

    entry = ALGORITHMS.get(name, "algorithm.name")
    return {**LR_SPACE, **{f"algorithm.{k}": v for k, v in (entry.space or {}).items()}}


def takes(name: str, key: str) -> bool:
    """Whether algorithm ``name`` has option ``key`` (its params class)."""
    from fedrift.algorithms import ALGORITHMS
    from fedrift.config import _fields

    params = ALGORITHMS.get(name, "algorithm.name").params
    return params is not None and key in _fields(params)


def resolve_space(name: str, extra: Mapping[str, Any]) -> list[Dim]:
    """The dimensions of one algorithm's study: its default space with ``extra`` applied."""
    spec = default_space(name)
    for key, value in extra.items():
        dotted = key if "." in key else f"algorithm.{key}"
        if "." not in key and not takes(name, key):
            continue  # another algorithm's option (checked over the whole tune in `build_tune`)
        if value is None or str(value).strip().lower() == "none":
            spec.pop(dotted, None)
        else:
            spec[dotted] = value
    if not spec:
        raise ConfigError(f"space: nothing left to tune for {name}; allowed: at least one dimension")
    return [Dim.parse(k, v) for k, v in spec.items()]


__all__ = ["EDGE", "LR_SPACE", "Dim", "default_space", "resolve_space", "startup_points", "takes"]
