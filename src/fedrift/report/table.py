"""The results table of a comparison: one row per setting, mean and std over its seeds.

Runs are read from their folders (``config.yaml``, ``summary.json``, ``metrics.jsonl``) and
grouped into settings: by a compare root's ``compare.json`` when there is one, else by
config minus seed (and minus how the run executed), the setting named by the keys in which
the groups differ (:func:`discover_groups`: the algorithm options that tell an algorithm's
settings apart, the keys only some algorithms change, the swept keys).

Statistics, per setting, over its runs:

- ``*_mean`` is the mean; ``*_std`` the sample standard deviation (ddof=1, ``statistics.stdev``),
  0 for a single run; None (shown ``-``) when no run has the value.
- Accuracy statistics (best, final, at rounds) are over the runs that *completed*; diverged
  runs are counted in ``diverged`` and left out of them; interrupted runs (Ctrl-C, killed)
  are listed in ``interrupted_at`` by the last round they finished, and left out too.
- With a validation split (``partition.val_share``): ``test_accuracy_at_best_val`` (the test
  accuracy at the round of the best validation accuracy, "at best val" in the tables: the
  model a user would pick without looking at the test set) and ``best_val_accuracy``.
- With clients' own test splits (a partition's local test parts): ``final_local_accuracy``
  ("final local" in the tables), the final model's accuracy on each client's own split,
  averaged over the clients: each client's own model for a personal-model method (FedProto),
  the global model for the others, so the two stand side by side on the same samples.
- Calibration, when runs report it: ``calibrated_accuracy`` ("calibrated" in the tables: the
  final model after CCVR's calibration, on the test set) and ``calibrated_local_accuracy``
  (on the clients' own splits), and ``personalized_accuracy`` (``eval.personalize``: each
  client's classifier calibrated on its data, on its own split), beside "final local": the
  global model's accuracy on those same splits.
- The worst 10% of clients, when runs report it: ``final_local_accuracy_worst10`` ("worst 10%
  local" in the tables, beside "final local"), each run's mean accuracy of its worst
  ``ceil(n/10)`` evaluated clients on their own test splits (:mod:`fedrift.metrics.client_spread`),
  then its mean and std over the seeds as for any other column, with its paired difference to
  the reference. (``final_local_accuracy_std`` in these rows is its std over the seeds, not the
  run's spread over its clients, which ``summary.json`` calls by the same name.)
- With ``report.metric`` (``accuracy``, ``local_accuracy``, ``local_accuracy_worst10``): ``rank``,
  each setting's place among the settings with the same swept values by the mean over seeds of
  that metric (``rank_metric`` names its summary key: for ``accuracy`` the test accuracy at best
  validation, else the best accuracy, as the claims judge), 1 the highest, equal means sharing a
  place; none without the metric. Without ``report.metric`` nothing is ranked.
- Accuracy at round r: the global test accuracy at the last evaluated round <= r, for runs
  that reached round r.
- Rounds to target: the first evaluated round whose test accuracy is >= the target; the mean
  is over the runs that reached it, ``rounds_to_target_reached`` counts them. The target is
  an accuracy (``0.9``), or ``ALG:FRACTION`` (``fedavg:0.9``: 90% of the best-accuracy mean of
  the ``fedavg`` setting with the same swept values), or none.
- Paired differences to a reference method (``report.reference``), per seed, with a 95%
  t interval over seeds: see :mod:`fedrift.report.paired`.
- With ``report.paper=NAME``, the seed paper's published numbers for the row's method and
  setting beside the measured ones: see :mod:`fedrift.report.published`.
- Seconds per round (training, no evaluation) and wall seconds (the run's own: start-up, rounds,
  evaluation; ``run_seconds``, the training's ``wall_seconds`` for runs from before it) are from ``summary.json``; bytes
  down and up per round are the summary's totals over its rounds, averaged over runs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from fedrift import yamlio
from fedrift.config import Config, load_config
from fedrift.errors import ConfigError, FedriftError, describe_os_error
from fedrift.report import paired, published

# summary keys of runs with a validation split (partition.val_share)
VALIDATION_KEYS = ("test_accuracy_at_best_val", "best_val_accuracy")
LOCAL_KEY = "final_local_accuracy"  # on the clients' own test splits: a column when runs report it
WORST10_KEY = "final_local_accuracy_worst10"  # the worst 10% of those clients: a column beside it, paired
# report.metric: what a report ranks, its claims judge and select recommends on
RANK_METRICS = ("accuracy", "local_accuracy", "local_accuracy_worst10")
METRIC_NAMES = {"test_accuracy_at_best_val": "at best val", "best_accuracy": "best acc", LOCAL_KEY: "final local",
                WORST10_KEY: "worst 10% local"}
# the final model calibrated (CCVR, on the test set and on the clients' own splits) and FedADC's
# per-client calibration (eval.personalize, on the clients' own splits): columns when runs report them
CALIBRATED_KEYS = (("calibrated_accuracy", "calibrated %"), ("calibrated_local_accuracy", "calibrated local %"),
                   ("personalized_accuracy", "personalized %"),
                   ("personalized_accuracy_worst10", "personalized worst 10% %"))

EXECUTION_KEYS = (
    "engine.executor",
    "engine.workers",
    "engine.threads",
    "engine.max_parallel_clients",
    "engine.cuda_graphs",
    "engine.compile",  # the same step, compiled: the same results up to float rounding
    "engine.cudnn_benchmark",  # cuDNN's algorithms timed, not picked by heuristics: float rounding only
    "engine.teacher_cache",
    "engine.client_state",
    "engine.checkpoint_every",
    "eval.batch_size",  # inference chunking: the same results up to float rounding
    "plugins",  # where the names come from (a plugins= list or an installed entry point), not a result
)


# ---------------------------------------------------------------------------------------
# Reading runs


@dataclass
class Run:
    dir: Path
    config: dict[str, Any] = field(default_factory=dict)  # config.yaml, parsed
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    seed: int | None = None
    problem: str = ""  # why config.yaml was not read ("config.yaml: not valid YAML (...)"), else ""

    @property
    def status(self) -> str:
        """completed | diverged | interrupted (Ctrl-C's summary, or killed: no summary) | missing."""
        if self.summary.get("status"):
            return str(self.summary["status"])
        return "interrupted" if self.metrics or self.config else "missing"

    @property
    def last_round(self) -> int:
        """The last round the run finished (its summary's, else its last metrics line's)."""
        if self.summary.get("rounds") is not None:
            return int(self.summary["rounds"])
        return max((int(m["round"]) for m in self.metrics if m.get("round") is not None), default=0)

    def accuracy_curve(self) -> list[tuple[int, float]]:
        return [(int(m["round"]), float(m["test_accuracy"])) for m in self.metrics
                if m.get("test_accuracy") is not None and m.get("round") is not None]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows; a torn or damaged line (a run killed mid-write) is skipped."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(row, dict) and _is_round(row.get("round")):
            rows.append(row)
    return rows


def _is_round(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_mapping(path: Path, parse: Callable[[str], Any]) -> tuple[dict[str, Any], str]:
    """A run file's mapping and, when it is there but cannot be used, why in a few words; {}
    when it is missing or damaged (the run then reads as interrupted or missing, or is skipped
    with the reason: its report says so, it is never a crash)."""
    if not path.is_file():
        return {}, ""
    try:
        doc = parse(path.read_text())
    except OSError as err:
        return {}, describe_os_error(err, path, "read")
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except yaml.YAMLError as err:  # a tag such as !!python/object: safe YAML refuses it
        return {}, f"not valid YAML ({_yaml_problem(err)})"
    except ValueError as err:
        return {}, f"not valid JSON ({' '.join(str(err).split())})"
    if not isinstance(doc, dict):
        return {}, f"not a mapping of keys (a {type(doc).__name__})" if doc is not None else "empty"
    return doc, "" if doc else "empty"


def _yaml_problem(err: yaml.YAMLError) -> str:
    """``could not determine a constructor for the tag '...', line 3``: PyYAML's message on one line."""
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    mark = getattr(err, "problem_mark", None)
    return f"{problem}, line {mark.line + 1}" if mark is not None else str(problem)


def load_run(d: Path) -> Run:
    d = Path(d)
    run = Run(d)
    config, why = _read_mapping(d / "config.yaml", yamlio.load)
    run.config = _with_defaults(config) if config else {}
    run.problem = f"config.yaml: {why}" if why else ""
    run.summary, _ = _read_mapping(d / "summary.json", json.loads)
    run.metrics = read_metrics(d / "metrics.jsonl")
    seed = run.summary.get("seed", run.config.get("seed"))
    run.seed = int(seed) if isinstance(seed, int) else None
    return run


def _with_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """A run's config with the keys it predates filled in with today's defaults, so that runs
    of an older fedrift group with new ones; as written when it no longer validates."""
    try:
        return load_config(doc).model_dump()
    except (FedriftError, TypeError, ValueError):
        return doc


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@dataclass
class Group:
    """A setting: its runs over seeds."""

    label: str  # "fedprox:mu=0.1 alpha=0.5"
    algorithm: str  # "fedprox:mu=0.1"
    sweep: dict[str, Any]  # dotted key -> value
    runs: list[Run]
    dir: str = ""

    def done(self) -> list[Run]:
        return [r for r in self.runs if r.status == "completed"]


def short_names(keys: Sequence[str]) -> dict[str, str]:
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _fmt_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _fmt_short(v: Any) -> str:
    """A label's value of a key that only tells algorithms apart (a tuned learning rate): 4
    significant digits, since the label need not be unique by it."""
    return f"{v:.4g}" if isinstance(v, float) else _fmt_value(v)


def _usual(values: list[Any], default: Any) -> str:
    """The value a label leaves unsaid: the one most settings share, when at least two share
    it and no other value is as common; else the config's default (tuned learning rates, each
    its own: every setting says its own)."""
    counts = Counter(json.dumps(v, default=str) for v in values)
    (top, n), *rest = counts.most_common()
    if n >= 2 and (not rest or rest[0][1] < n):
        return top
    return json.dumps(default, default=str)


def load_groups(root: Path, notes: list[str] | None = None) -> tuple[list[Group], dict[str, Any] | None]:
    """The settings under ``root`` and the grid description (None without compare.json);
    ``notes`` gets a line for each run folder skipped or whose config.yaml was not read, and why."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"runs folder {str(root)!r} does not exist")
    grid_file = root / "compare.json"
    if grid_file.is_file():
        try:
            grid = json.loads(grid_file.read_text())
        except ValueError:
            raise ConfigError(f"{grid_file}: not valid JSON; delete it to group the runs by their configs") from None
        groups = []
        for s in grid["settings"]:
            runs = []
            for seed in grid["seeds"]:
                run = load_run(root / s["dir"] / f"seed{seed}")
                run.seed = seed
                runs.append(run)
                if run.problem and notes is not None:  # the grid says which setting it is: kept
                    notes.append(f"{run.dir}: {run.problem}; reported from its summary.json and metrics.jsonl")
            groups.append(Group(s["label"], s["algorithm"], dict(s["sweep"]), runs, s["dir"]))
        return groups, grid
    return discover_groups(root, notes), None


def discover_groups(root: Path, notes: list[str] | None = None) -> list[Group]:
    """Group every run folder under ``root`` (one with config.yaml) by config minus seed; a
    folder whose config.yaml cannot be read is skipped, with a line in ``notes`` saying why."""
    found = [load_run(p.parent) for p in sorted(Path(root).rglob("config.yaml"))]
    runs = [r for r in found if r.config]
    skipped = [f"{r.dir}: {r.problem or 'config.yaml: empty'}" for r in found if not r.config]
    if notes is not None:
        notes += [f"{line}; skipped" for line in skipped]
    if not runs:
        if not skipped:
            raise ConfigError(f"no runs under {str(root)!r} (no folder with config.yaml and summary.json)")
        more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        raise ConfigError(f"no runs under {str(root)!r}: every folder with config.yaml was skipped: "
                          + "; ".join(skipped[:3]) + more)
    keyed: dict[str, list[Run]] = {}
    flat: dict[str, dict[str, Any]] = {}
    for r in runs:
        f = {k: v for k, v in flatten(r.config).items()
             if k != "seed" and not k.startswith("output.") and k not in EXECUTION_KEYS}
        key = json.dumps(f, sort_keys=True, default=str)
        keyed.setdefault(key, []).append(r)
        flat[key] = f
    keys = list(keyed)
    all_keys = sorted({k for f in flat.values() for k in f})
    defaults = flatten(Config().model_dump())

    def differs(k: str, among: Iterable[str]) -> bool:
        return len({json.dumps(flat[g].get(k, "<absent>"), default=str) for g in among}) > 1

    by_name: dict[Any, list[str]] = {}
    for g in keys:
        by_name.setdefault(flat[g].get("algorithm.name"), []).append(g)
    # A key that varies within one algorithm's runs is swept; one that only tells algorithms
    # apart (MOON's projection head, FedDF's held-out data) belongs to those algorithms' labels.
    varying = [k for k in all_keys if not k.startswith("algorithm.") and differs(k, keys)]
    sweep_keys = [k for k in varying if any(differs(k, same) for same in by_name.values())]
    own_keys = [k for k in varying if k not in sweep_keys]
    usual = {k: _usual([flat[g].get(k) for g in keys], defaults.get(k)) for k in own_keys}
    # An option that tells one algorithm's settings apart names every setting that has it
    # (FedADC+ shows its variant beside FedADC's two), so that claims pair like with like.
    options = [k for k in all_keys if k.startswith("algorithm.") and k != "algorithm.name"
               and any(differs(k, same) for same in by_name.values())]
    short = short_names(sweep_keys)
    own_short = short_names(own_keys)
    groups = []
    for g in keys:
        f = flat[g]
        name = str(f.get("algorithm.name", "?"))
        opts = [k for k in options if k in f]
        own = [k for k in own_keys if json.dumps(f.get(k), default=str) != usual[k]]
        algorithm = ":".join([name, *(f"{k.split('.', 1)[1]}={_fmt_value(f[k])}" for k in opts),
                              *(f"{own_short[k]}={_fmt_short(f.get(k))}" for k in own)])
        sweep = {k: f.get(k) for k in sweep_keys}
        label = " ".join([algorithm, *(f"{short[k]}={_fmt_value(v)}" for k, v in sweep.items())])
        members = sorted(keyed[g], key=lambda r: (r.seed is None, r.seed or 0, str(r.dir)))
        common = Path(*_common_parts([m.dir for m in members]))
        groups.append(Group(label, algorithm, sweep, members, str(common)))
    groups.sort(key=lambda grp: (json.dumps(list(grp.sweep.values()), default=str), grp.algorithm))
    return groups


# partition options every partition may have: not what tells one split from another
_PARTITION_PLUMBING = ("name", "holdout", "val_share", "num_clients", "min_size", "max_redraws", "min_local_test")
# switches to another definition of a partition, named only when set (issue 69's settings that
# reproduce Flower Datasets' partitioners): at these values the partition is the usual one
_PARTITION_USUAL = {"balance": False, "mode": "classes"}


def describe_data(configs: Iterable[Mapping[str, Any]]) -> str:
    """``mnist (dirichlet alpha=0.1, 20 clients)``: the data and partition the configs share
    (a value they differ in is left out, a dataset or partition name listed); "" without any."""
    flats = [flatten(c) for c in configs if c]
    if not flats:
        return ""

    def values(key: str) -> list[Any]:
        return list(dict.fromkeys(json.dumps(f.get(key), default=str) for f in flats))

    def one(key: str) -> Any:
        found = values(key)
        return json.loads(found[0]) if len(found) == 1 else None

    names = [json.loads(v) for v in values("data.name") if v != "null"]
    kinds = [json.loads(v) for v in values("partition.name") if v != "null"]
    keys = dict.fromkeys(k for f in flats for k in f if k.startswith("partition."))
    options = [f"{k.split('.', 1)[1]}={_fmt_value(one(k))}" for k in keys
               if k.split(".", 1)[1] not in _PARTITION_PLUMBING and one(k) is not None
               and _PARTITION_USUAL.get(k.split(".", 1)[1], object()) != one(k)]
    clients = one("partition.num_clients")
    split = " ".join([", ".join(map(str, kinds)), *options]).strip()
    detail = ", ".join(x for x in (split, f"{clients} clients" if clients else "") if x)
    return " ".join(x for x in (", ".join(map(str, names)), f"({detail})" if detail else "") if x)


def describe_groups(groups: Sequence[Group]) -> str:
    """``fedavg, fedprox on mnist (dirichlet alpha=0.1, 20 clients)``: what a table compares
    (its algorithms, and the data and partition of its runs' configs); "" without groups."""
    algorithms = ", ".join(dict.fromkeys(g.algorithm.split(":")[0] for g in groups))
    data = describe_data(r.config for g in groups for r in g.runs)
    return f"{algorithms} on {data}" if algorithms and data else algorithms


def _common_parts(paths: list[Path]) -> list[str]:
    parts = [p.parts for p in paths]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return out or ["."]


# ---------------------------------------------------------------------------------------
# Statistics


def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof=1; 0 for one value) of the values that are not None/NaN."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def accuracy_at(run: Run, r: int) -> float | None:
    """Test accuracy at the last evaluated round <= r, if the run reached round r."""
    curve = run.accuracy_curve()
    if not curve or curve[-1][0] < r:
        return None
    before = [acc for t, acc in curve if t <= r]
    return before[-1] if before else None


def rounds_to(run: Run, target: float) -> int | None:
    for t, acc in run.accuracy_curve():
        if acc >= target:
            return t
    return None


def parse_target(spec: Any) -> tuple[str, float | str | None, float | None]:
    """``("none"|"absolute"|"relative", value or algorithm, fraction)`` from a target option."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("none", "off", "")):
        return ("none", None, None)
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if not 0 < float(spec) <= 1:
            raise ConfigError(f"report.target: {spec} is not an accuracy in (0, 1]; or give ALG:FRACTION, e.g. fedavg:0.9")
        return ("absolute", float(spec), None)
    text = str(spec).strip()
    alg, sep, frac = text.rpartition(":")
    if sep and alg:
        try:
            f = float(frac)
        except ValueError:
            f = -1.0
        if not 0 < f <= 2:
            raise ConfigError(f"report.target: fraction {frac!r} in {text!r} must be a number in (0, 2], e.g. fedavg:0.9")
        return ("relative", alg, f)
    try:
        return parse_target(float(text))
    except ValueError:
        raise ConfigError(f"report.target: {text!r}; allowed: an accuracy (0.9), ALG:FRACTION (fedavg:0.9) or none") from None


def default_target(groups: Sequence[Group]) -> str | None:
    """90% of FedAvg's best when FedAvg is in the grid (BENCH.md's rule), else no target."""
    return "fedavg:0.9" if any(g.algorithm == "fedavg" for g in groups) else None


def check_metric(value: Any) -> str | None:
    """``report.metric``'s value, refused in one line when it is not one of :data:`RANK_METRICS`
    (None, or ``none``: nothing ranked, today's tables)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    if value not in RANK_METRICS:
        raise ConfigError(f"report.metric: {value!r} is not a metric to rank on; allowed: {', '.join(RANK_METRICS)}")
    return str(value)


def metric_key(metric: str | None, summaries: Iterable[Mapping[str, Any]]) -> str | None:
    """The summary key ``report.metric`` stands for: ``local_accuracy`` -> ``final_local_accuracy``,
    ``local_accuracy_worst10`` -> ``final_local_accuracy_worst10``, ``accuracy`` -> the test
    accuracy at best validation when a run has a validation split, else the best accuracy (the
    claims' rule); None for None."""
    if metric is None:
        return None
    if metric != "accuracy":
        return f"final_{metric}"
    val = any("test_accuracy_at_best_val" in s for s in summaries)
    return "test_accuracy_at_best_val" if val else "best_accuracy"


def add_ranks(groups: Sequence[Group], rows: Sequence[dict[str, Any]], key: str) -> None:
    """``rank`` (1 the highest mean of ``key``; equal means share the place; None without a
    value) among the rows of the same swept values, and ``rank_metric`` = ``key``."""
    by_sweep: dict[str, list[dict[str, Any]]] = {}
    for g, row in zip(groups, rows):
        by_sweep.setdefault(json.dumps(g.sweep, sort_keys=True, default=str), []).append(row)
    for same in by_sweep.values():
        values = [r.get(f"{key}_mean") for r in same]
        for r, v in zip(same, values):
            r["rank_metric"] = key
            r["rank"] = None if v is None else 1 + sum(o is not None and o > v for o in values)


def summarize(
    groups: Sequence[Group], at_rounds: Sequence[int] = (), target: Any = None, reference: str | None = None,
    metric: str | None = None,
) -> list[dict[str, Any]]:
    """One dict per setting (see the module docstring for every statistic); with a
    ``reference`` algorithm label, the paired differences to it (:mod:`fedrift.report.paired`);
    with ``metric`` (``report.metric``), each setting's ``rank`` on it."""
    metric = check_metric(metric)
    kind, tval, frac = parse_target(target)
    rows: list[dict[str, Any]] = []
    for g in groups:
        done = g.done()
        row: dict[str, Any] = {"setting": g.label, "algorithm": g.algorithm, **g.sweep}
        row["runs"] = len(g.runs)
        row["completed"] = len(done)
        row["diverged"] = sum(r.status == "diverged" for r in g.runs)
        row["interrupted_at"] = [r.last_round for r in g.runs if r.status == "interrupted"]  # rounds done
        row["seeds"] = ",".join(str(r.seed) for r in done if r.seed is not None)
        optional = (*VALIDATION_KEYS, LOCAL_KEY, WORST10_KEY, *(k for k, _ in CALIBRATED_KEYS))
        for key in ("best_accuracy", "final_accuracy", *optional):
            if key in optional and not any(key in r.summary for r in g.runs):
                continue  # no validation split, no local test splits, no calibration: no columns
            row[f"{key}_mean"], row[f"{key}_std"] = mean_std(r.summary.get(key) for r in done)
            if key in optional[len(VALIDATION_KEYS):]:  # runs from before the metric lack it: say over how many it is
                row[f"{key}_n"] = sum(r.summary.get(key) is not None for r in done)
        for t in at_rounds:
            row[f"accuracy_at_{t}_mean"], row[f"accuracy_at_{t}_std"] = mean_std(accuracy_at(r, t) for r in done)
        row["rounds_mean"], _ = mean_std(r.summary.get("rounds") for r in done)
        row["seconds_per_round_mean"], _ = mean_std(r.summary.get("seconds_per_round") for r in done)
        row["wall_seconds_mean"], row["wall_seconds_std"] = mean_std(
            r.summary.get("run_seconds", r.summary.get("wall_seconds")) for r in done)
        row["bytes_down_per_round"], _ = mean_std(_per_round(r, "bytes_down_total") for r in done)
        row["bytes_up_per_round"], _ = mean_std(_per_round(r, "bytes_up_total") for r in done)
        rows.append(row)

    for g, row in zip(groups, rows):
        goal: float | None = None
        if kind == "absolute":
            goal = float(tval)  # type: ignore[arg-type]
        elif kind == "relative":
            ref = [r for g2, r in zip(groups, rows) if g2.algorithm == tval and g2.sweep == g.sweep]
            if ref and ref[0]["best_accuracy_mean"] is not None:
                goal = float(frac) * ref[0]["best_accuracy_mean"]  # type: ignore[arg-type]
        row["target"] = goal
        if goal is None:
            row["rounds_to_target_mean"], row["rounds_to_target_std"], row["rounds_to_target_reached"] = None, None, None
        else:
            hits = [rounds_to(r, goal) for r in g.done()]
            row["rounds_to_target_mean"], row["rounds_to_target_std"] = mean_std(hits)
            row["rounds_to_target_reached"] = sum(h is not None for h in hits)
    key = metric_key(metric, (r.summary for g in groups for r in g.runs))
    paired.add_paired(groups, rows, reference, extra=[key] if key == LOCAL_KEY else [])
    if key is not None:
        add_ranks(groups, rows, key)
    return rows


def _per_round(run: Run, key: str) -> float | None:
    total, rounds = run.summary.get(key), run.summary.get("rounds")
    if total is None or not rounds:
        return None
    return float(total) / float(rounds)


# ---------------------------------------------------------------------------------------
# Formatting: CSV, Markdown, terminal


def fmt_acc(mean: float | None, std: float | None, pm: str = "+-") -> str:
    """``19.1 +- 2.3`` in percent; ``19.1`` alone when ``std`` is None (one seed: no spread)."""
    if mean is None:
        return "-"
    if std is None:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} {pm} {100 * std:.1f}"


def _spread(row: Mapping[str, Any], key: str, n: int | None = None) -> float | None:
    """The std of ``key`` in ``row``, None when it is over one run (``n``, else the completed runs)."""
    return None if (n if n else row.get("completed")) == 1 else row.get(f"{key}_std")


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def display_table(rows: Sequence[dict[str, Any]], at_rounds: Sequence[int] = (), pm: str = "+-") -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells (accuracies in percent) for the terminal, Markdown and HTML."""
    targets = {r["target"] for r in rows if r.get("target") is not None}
    several = len(targets) > 1
    validated = any(r.get("test_accuracy_at_best_val_mean") is not None for r in rows)
    local = any(r.get(f"{LOCAL_KEY}_mean") is not None for r in rows)
    worst10 = any(r.get(f"{WORST10_KEY}_mean") is not None for r in rows)
    calibrated = [(k, h) for k, h in CALIBRATED_KEYS if any(r.get(f"{k}_mean") is not None for r in rows)]
    ranked = rank_header(rows)
    headers = ["setting", "runs", *([ranked] if ranked else []), "best acc %", "final acc %",
               *(["at best val %"] if validated else []), *(["final local %"] if local else []),
               *(["worst 10% local %"] if worst10 else []), *(h for _, h in calibrated), *(f"acc@{t} %" for t in at_rounds)]
    pairs = paired.headers(rows)
    headers += [h for _, h in pairs]
    if several:
        headers.append("target %")
    headers += [f"rounds to {100 * next(iter(targets)):.1f}%" if len(targets) == 1 else "rounds to target",
                "s/round", "wall s", "down/round", "up/round"]
    cells = []
    for r in rows:
        runs = f"{r['completed']}/{r['runs']}" + _not_completed(r)
        if r.get("target") is None:
            reach = "-"
        elif r["rounds_to_target_reached"]:
            reach = f"{r['rounds_to_target_mean']:.1f} ({r['rounds_to_target_reached']}/{r['completed']})"
        else:
            reach = f"never (0/{r['completed']})"
        cells.append([
            r["setting"],
            runs,
            *([_fmt_rank(r)] if ranked else []),
            fmt_acc(r["best_accuracy_mean"], _spread(r, "best_accuracy"), pm),
            fmt_acc(r["final_accuracy_mean"], _spread(r, "final_accuracy"), pm),
            *([fmt_acc(r.get("test_accuracy_at_best_val_mean"), _spread(r, "test_accuracy_at_best_val"), pm)]
              if validated else []),
            *([_fmt_some(r, LOCAL_KEY, pm)] if local else []),
            *([_fmt_some(r, WORST10_KEY, pm)] if worst10 else []),
            *(_fmt_some(r, k, pm) for k, _ in calibrated),
            *(fmt_acc(r[f"accuracy_at_{t}_mean"], _spread(r, f"accuracy_at_{t}"), pm) for t in at_rounds),
            *(paired.cell(r, key, pm) for key, _ in pairs),
            *([_fmt_num(None if r.get("target") is None else 100 * r["target"], 1)] if several else []),
            reach,
            _fmt_num(r["seconds_per_round_mean"]),
            _fmt_num(r["wall_seconds_mean"], 1),
            fmt_bytes(r["bytes_down_per_round"]),
            fmt_bytes(r["bytes_up_per_round"]),
        ])
    if published.shown(rows):
        _insert_published(rows, headers, cells, pm)
    return headers, cells


def _insert_published(rows: Sequence[dict[str, Any]], headers: list[str], cells: list[list[str]], pm: str) -> None:
    """``report.paper``'s columns, each beside its measured counterpart: the paper's setting
    after the setting, the published accuracy after the best accuracy, the published gap to
    FedAvg after the measured paired gap on the best accuracy (after the published accuracy
    when there is none)."""
    setting_h, acc_h, gap_h = published.HEADERS
    best_vs = next((h for key, h in paired.headers(rows) if key == "best_accuracy"), None)
    after = [("setting", setting_h), ("best acc %", acc_h), (best_vs or acc_h, gap_h)]
    values = [published.cells(r, pm) for r in rows]
    for (anchor, header), k in zip(after, range(3)):
        at = headers.index(anchor) + 1
        headers.insert(at, header)
        for row, vals in zip(cells, values):
            row.insert(at, vals[k])


def rank_header(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """``rank (worst 10% local)``: the rank column's header when the rows are ranked (``report.metric``)."""
    key = next((r["rank_metric"] for r in rows if r.get("rank_metric")), None)
    return None if key is None else f"rank ({METRIC_NAMES.get(key, key)})"


def _fmt_rank(row: Mapping[str, Any]) -> str:
    return "-" if row.get("rank") is None else str(row["rank"])


def rank_note(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The tables' line on the rank column, or None without one."""
    key = next((r["rank_metric"] for r in rows if r.get("rank_metric")), None)
    if key is None:
        return None
    return (f"rank: by the mean over seeds of {METRIC_NAMES.get(key, key)} ({key}; report.metric), 1 the highest, "
            "among the settings of the same swept values; '-' where no completed run reports it.")


WORST10_NOTE = ("worst 10% local: per run, the mean accuracy of its worst 10% of evaluated clients (ceil(n/10), at "
                "least one) on their own test splits at the last evaluation, then mean {pm} std over seeds.")


def notes(rows: Sequence[Mapping[str, Any]], pm: str = "+-") -> list[str]:
    """The lines under a table: the worst 10% column's, the rank column's, the paired columns',
    the published table's."""
    worst10 = WORST10_NOTE.format(pm=pm) if any(r.get(f"{WORST10_KEY}_mean") is not None for r in rows) else None
    return [n for n in (worst10, rank_note(rows), paired.note(rows, pm=pm), published.note(rows, pm=pm)) if n]


def _fmt_some(row: Mapping[str, Any], key: str, pm: str) -> str:
    """mean +- std, and "(n/m runs)" when only n of the m completed runs have the value."""
    n = row.get(f"{key}_n") or 0
    cell = fmt_acc(row.get(f"{key}_mean"), _spread(row, key, n), pm)
    return cell if not n or n == row["completed"] else f"{cell} ({n}/{row['completed']} runs)"


def _not_completed(row: Mapping[str, Any]) -> str:
    """" (1 diverged, 2 interrupted at rounds 3, 7)" for a table's runs cell."""
    parts = [f"{row['diverged']} diverged"] if row["diverged"] else []
    stopped = row.get("interrupted_at") or []
    if stopped:
        s = "s" if len(stopped) > 1 else ""
        parts.append(f"{len(stopped)} interrupted at round{s} {', '.join(map(str, stopped))}")
    return f" ({', '.join(parts)})" if parts else ""


def markdown_lines(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines (a ``|`` in a cell escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]


def text_lines(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Plain aligned columns: the first left-aligned, the others right-aligned."""
    width = [max(len(x) for x in col) for col in zip(headers, *cells)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, width))).rstrip()

    return [line(headers), "  ".join("-" * w for w in width), *(line(r) for r in cells)]


def to_markdown(rows: Sequence[dict[str, Any]], at_rounds: Sequence[int] = ()) -> str:
    lines = markdown_lines(*display_table(rows, at_rounds))
    return "\n".join(lines + [f"\n{n}" for n in notes(rows)]) + "\n"


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Every key of every row as a column (raw numbers: accuracies as fractions, bytes)."""
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else (json.dumps(r[k]) if isinstance(r[k], (list, dict)) else r[k]))
                    for k in columns})
    return buf.getvalue()


def to_text(rows: Sequence[dict[str, Any]], at_rounds: Sequence[int] = ()) -> str:
    """Plain aligned columns (the terminal fallback when ``rich`` is not installed)."""
    return "\n".join(text_lines(*display_table(rows, at_rounds)))


def print_table(rows: Sequence[dict[str, Any]], at_rounds: Sequence[int] = (), title: str | None = None) -> None:
    """Print the table: with ``rich`` on a terminal wide enough for it, else as plain text
    (also what goes to a log file or pipe)."""
    import shutil
    import sys

    text = to_text(rows, at_rounds)
    footnote = "\n".join(notes(rows))
    width = max(len(line) for line in text.splitlines())
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is optional
        Console = None  # type: ignore[assignment]
    cols = len(display_table(rows, at_rounds)[0])
    if Console is None or not sys.stdout.isatty() or width + 3 * cols + 1 > shutil.get_terminal_size().columns:
        if title:
            print(title)
        print(text)
        if footnote:
            print(footnote)
        return
    headers, cells = display_table(rows, at_rounds, pm="±")
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for row in cells:
        table.add_row(*row)
    Console().print(table)
    for n in notes(rows, pm="±"):
        print(n)


__all__ = [
    "METRIC_NAMES",
    "RANK_METRICS",
    "WORST10_KEY",
    "Group",
    "Run",
    "accuracy_at",
    "add_ranks",
    "check_metric",
    "default_target",
    "describe_data",
    "describe_groups",
    "display_table",
    "load_groups",
    "load_run",
    "markdown_lines",
    "mean_std",
    "metric_key",
    "notes",
    "parse_target",
    "print_table",
    "rank_header",
    "rank_note",
    "rounds_to",
    "summarize",
    "text_lines",
    "to_csv",
    "to_markdown",
    "to_text",
]
