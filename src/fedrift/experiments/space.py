"""Search spaces: a dimension (``log:LOW:HIGH``, ``float:LOW:HIGH[:STEP]``, ``int:LOW:HIGH``
or a list of values), an algorithm's default space (the learning rate and its registry
entry's), and the scrambled Sobol start-up design that spreads a small budget over the whole
range.

Values as typed: a float drawn from a range is rounded where it is drawn, to
:data:`DIGITS` significant digits (to the step's multiples and decimals where the space
gives a step), and Optuna stores the rounded value: the value a trial runs is the one its
study, ``best.yaml``, ``recommendation.yaml`` and every printed line show (``0.05``, never
``0.05000000000000001``). A list's values are kept as given."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError
from fedrift.overrides import parse_value, split_list


LR_SPACE = {"train.lr": "log:0.005:0.5"}
DIGITS = 3  # significant digits of a float drawn from a range with no step
EDGE = 0.05  # a chosen value this close to an end of its range (share of the range; of its log for log:) is flagged


@dataclass(frozen=True)
class Dim:
    """One dimension of a search space: a config key and how its values are drawn."""

    key: str  # dotted config key: train.lr, algorithm.mu
    kind: str  # log | float | int | choice
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()
    step: float | None = None  # float only: values are LOW + k x STEP

    @classmethod
    def parse(cls, key: str, spec: Any) -> "Dim":
        """``log:1e-4:1`` | ``float:0:1`` | ``float:0:1:0.05`` | ``int:1:5`` | ``0.01,0.05`` (or a
        list) -> a Dim."""
        where = f"space.{key}"
        if isinstance(spec, (list, tuple)):
            values = list(spec)
        else:
            text = str(spec).strip()
            kind, _, rest = text.partition(":")
            if kind in ("log", "float", "int"):
                lo, sep, hi = rest.partition(":")
                hi, has_step, st = hi.partition(":")
                if has_step and kind != "float":
                    raise ConfigError(f"{where}: {text!r}: a step goes with float:LOW:HIGH:STEP only; allowed: "
                                      f"{kind}:LOW:HIGH (a log range's values keep {DIGITS} significant digits)")
                try:
                    low, high = (int(lo), int(hi)) if kind == "int" else (float(lo), float(hi))
                    step = float(st) if has_step else None
                except ValueError:
                    raise ConfigError(f"{where}: {text!r} is not {kind}:LOW:HIGH with numbers (e.g. {kind}:1:5)") from None
                if not sep or not low < high or (kind == "log" and low <= 0) or not math.isfinite(high):
                    raise ConfigError(f"{where}: {text!r} needs LOW < HIGH" + (" and LOW > 0" if kind == "log" else ""))
                if step is not None and not (math.isfinite(step) and 0 < step <= high - low):
                    raise ConfigError(f"{where}: {text!r}: the step must be > 0 and at most HIGH - LOW; allowed: "
                                      "float:LOW:HIGH:STEP such as float:0:1:0.05")
                if step is not None:  # the highest multiple of the step inside the range (Optuna's rule)
                    high = _decimals(low + math.floor((high - low) / step + 1e-9) * step, step, low)
                return cls(key, kind, low, high, step=step)
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
            return self.typed(math.sqrt(self.low * self.high))
        return self.typed((self.low + self.high) / 2) if self.kind == "float" else int((self.low + self.high) // 2)

    def typed(self, value: Any) -> Any:
        """A float of a range as one would type it: :data:`DIGITS` significant digits, or the
        nearest multiple of the step (with the step's decimals), kept inside [LOW, HIGH]. Other
        kinds' values (ints, a list's values) are returned as they are."""
        if self.kind not in ("log", "float") or isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        v = float(value)
        if not math.isfinite(v):
            return v
        if self.step is not None:
            v = _decimals(self.low + round((v - self.low) / self.step) * self.step, self.step, self.low)
        else:
            v = float(f"{v:.{DIGITS}g}")
        return float(min(max(v, self.low), self.high))  # the range's own ends are kept as typed

    def suggest(self, trial: Any) -> Any:
        """Optuna's value for this dimension, a float rounded by :meth:`typed` before Optuna
        stores it (so the trial's params, what runs and what is shown agree): the joint
        proposal of a multivariate sampler is rounded in the trial's ``relative_params``, an
        independent one through a sampler that rounds it, for this call only."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        relative = trial.relative_params  # drawn once per trial, as Optuna's own suggest would
        if self.key in relative:
            relative[self.key] = self.typed(relative[self.key])
        study = trial.study
        sampler = study.sampler
        study.sampler = _Typed(sampler, self)
        try:
            return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log", step=self.step)
        finally:
            study.sampler = sampler

    def describe(self) -> str:
        if self.kind == "choice":
            return ",".join(map(str, self.choices))
        return f"{self.kind}:{self.low:g}:{self.high:g}" + (f":{self.step:g}" if self.step is not None else "")

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
        return self.typed(v)


class _Typed:
    """A sampler that rounds one dimension's independent draw (:meth:`Dim.typed`) and passes
    everything else to the sampler it wraps."""

    def __init__(self, sampler: Any, dim: Dim) -> None:
        self._sampler, self._dim = sampler, dim

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        value = self._sampler.sample_independent(study, trial, name, distribution)
        return self._dim.typed(value) if name == self._dim.key else value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


def _decimals(value: float, *typed: float) -> float:
    """``value`` with no more decimals than the numbers ``typed`` have (a step of 0.1 from 0:
    ``0.30000000000000004`` -> ``0.3``)."""
    places = max(max(0, -int(Decimal(repr(float(t))).normalize().as_tuple().exponent)) for t in typed)
    return round(value, places)


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


__all__ = ["DIGITS", "EDGE", "LR_SPACE", "Dim", "default_space", "resolve_space", "startup_points", "takes"]
