"""A grid of runs (algorithm entries x swept values x seeds): its expansion and validation
before anything runs, each run's state on disk (reuse, resume or run), and running it.
``fedrift compare`` (:mod:`fedrift.experiments.compare`) is this and a report."""

from __future__ import annotations

import copy
import hashlib
import json
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from fedrift import yamlio
from fedrift.config import Config, apply_overrides, config_dict, load_config, same_root, to_yaml
from fedrift.engine.checkpoint import FOLDER as CHECKPOINTS, MANIFEST
from fedrift.engine.outputs import OWNED, mark, unfinished
from fedrift.engine.step_values import fedavg_step
from fedrift.errors import ConfigError, writing
from fedrift.experiments.naming import fmt_value, safe_name
from fedrift.experiments.pool import execute_run, run_pool
from fedrift.experiments.stacked import stack_key, stack_results, wants_stack
from fedrift.experiments.tuned import base_check, base_warning, read_tuned
from fedrift.overrides import parse_algorithm, parse_value, split_list
from fedrift.report.table import EXECUTION_KEYS, flatten, short_names
from fedrift.safe_files import copy_file, make_dir, write_atomic


GRID_FILE = "compare.json"


@dataclass(frozen=True)
class Setting:
    """One cell of the grid without its seed: an algorithm entry and swept values."""

    algorithm: str  # the grid entry as given, e.g. "fedprox:mu=0.1"
    sweep: tuple[tuple[str, Any], ...]  # (dotted key, value) in the grid's key order
    label: str  # for tables: "fedprox:mu=0.1 alpha=0.5"
    dir: str  # folder name under the root

    def as_json(self) -> dict[str, Any]:
        return {"label": self.label, "dir": self.dir, "algorithm": self.algorithm, "sweep": dict(self.sweep)}


@dataclass
class RunSpec:
    setting: Setting
    seed: int
    dir: Path
    doc: dict[str, Any]  # the config dict handed to fedrift.run
    expected: dict[str, Any] = field(default_factory=dict)  # resolved config.yaml, flattened
    fedavg_step: bool = False  # its method trains clients as FedAvg does (engine.step_values.fedavg_step)
    requested: frozenset[str] = frozenset()  # dotted keys the grid sets explicitly

    @property
    def name(self) -> str:
        return f"{self.setting.dir}/seed{self.seed}"


@dataclass
class Grid:
    root: Path
    settings: list[Setting]
    seeds: list[int]
    runs: list[RunSpec]
    description: dict[str, Any]  # what compare.json holds


def parse_grid_tokens(tokens: Sequence[str]) -> dict[str, Any]:
    """Split CLI ``key=value`` tokens into the grid (algorithms, seeds, sweep), report options
    and ordinary overrides."""
    out: dict[str, Any] = {"algorithms": None, "seeds": None, "sweep": {}, "report": {}, "overrides": [], "tuned": None}
    for token in tokens:
        key, sep, raw = token.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"argument {token!r} is not of the form key=value (e.g. seeds=0,1,2)")
        if key == "algorithms":
            out["algorithms"] = split_list(raw)
        elif key == "seeds":
            out["seeds"] = [parse_value(s) for s in split_list(raw)]
        elif key.startswith("sweep."):
            sub = key[len("sweep."):]
            if not sub:
                raise ConfigError(f"{token!r}: name the swept key, e.g. sweep.partition.alpha=0.1,0.5")
            out["sweep"][sub] = split_list(raw)
        elif key.startswith("report."):
            out["report"][key[len("report."):]] = raw
        elif key == "tuned":
            out["tuned"] = raw
        else:
            out["overrides"].append(token)
    return out


def _resolved(cfg: Config, options: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    as_dict = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else {}) for k, v in options.items()}
    return flatten(yamlio.load(to_yaml(cfg, as_dict)))


def _check_seeds(seeds: Iterable[Any]) -> list[int]:
    out = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"seeds: {s!r} is not a seed; allowed: integers >= 0, e.g. seeds=0,1,2")
        if s in out:
            raise ConfigError(f"seeds: {s} given twice")
        out.append(s)
    if not out:
        raise ConfigError("seeds: no seeds given; e.g. seeds=0,1,2")
    return out


def build_grid(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    sweep: Mapping[str, Sequence[Any]] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    jobs: int = 1,
    tuned: str | Path | None = None,
) -> Grid:
    """Expand and validate the grid; nothing is written. ``tuned``: a ``fedrift tune`` folder
    whose best values each algorithm entry of the grid takes (by entry, else by name)."""
    from fedrift.api import build_run, prepare, resolve_options, shared_options

    overrides = list(overrides or [])
    sweep = dict(sweep or {})
    base = config_dict(config)
    user = apply_overrides(base, overrides, shared_options)  # the file plus every-run overrides (validates the syntax)
    over_keys = [o.partition("=")[0].strip() for o in overrides]

    for key in over_keys:
        if key == "output.dir":
            raise ConfigError("output.dir: compare puts every run in its own folder; use --out (out=...) for the root")
        if key in sweep:
            raise ConfigError(f"{key}: both swept and overridden; give it one way")
    if algorithms is not None and "algorithm.name" in over_keys:
        raise ConfigError("algorithm.name: both overridden and given as algorithms=; give it one way")
    if seeds is not None and "seed" in over_keys:
        raise ConfigError("seed: both overridden and given as seeds=; give it one way")
    for key in sweep:
        if key in ("seed", "algorithm.name") or key.startswith("output."):
            raise ConfigError(f"sweep.{key}: not sweepable; use {'seeds=' if key == 'seed' else 'algorithms=' if key == 'algorithm.name' else '--out'}")
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"sweep.{key}: not a dotted config key")
        if not sweep[key]:
            raise ConfigError(f"sweep.{key}: no values given")

    file_alg = dict(user.get("algorithm") or {})
    file_alg_name = file_alg.get("name", "fedavg")
    entries = list(algorithms) if algorithms is not None else [str(file_alg_name)]
    if not entries:
        raise ConfigError("algorithms: no algorithms given; e.g. algorithms=fedavg,fedprox")
    dup = {e for e in entries if entries.count(e) > 1}
    if dup:
        raise ConfigError(f"algorithms: {sorted(dup)[0]} given twice")
    seed_list = _check_seeds(seeds if seeds is not None else [int(user.get("seed", 0) or 0)])
    tuned_values = _tuned_overrides(tuned, entries, over_keys, list(sweep)) if tuned is not None else {}

    # Sweep values: strings from the command line are YAML, typed values are used as they are.
    sweep_keys = list(sweep)
    sweep_vals: dict[str, list[tuple[str, Any]]] = {}
    for key in sweep_keys:
        pairs = []
        for v in sweep[key]:
            value = parse_value(v) if isinstance(v, str) else v
            raw = v if isinstance(v, str) else json.dumps(v)
            pairs.append((raw, value))
        if len({fmt_value(p[1]) for p in pairs}) != len(pairs):
            raise ConfigError(f"sweep.{key}: a value is given twice")
        sweep_vals[key] = pairs
    short = short_names(sweep_keys)

    combos: list[list[tuple[str, str, Any]]] = [[]]
    for key in sweep_keys:
        combos = [c + [(key, raw, val)] for c in combos for raw, val in sweep_vals[key]]

    root = Path(out) if out is not None else Path("runs") / (
        f"compare-{Path(config).stem}" if isinstance(config, (str, Path)) else "compare"
    )

    settings: list[Setting] = []
    runs: list[RunSpec] = []
    dirs: set[str] = set()
    for combo in combos:
        for entry in entries:
            name, opts = parse_algorithm(entry)
            swept = tuple((k, v) for k, _, v in combo)
            label = " ".join([entry, *(f"{short[k]}={fmt_value(v)}" for k, v in swept)])
            dname = safe_name("_".join([entry.replace(":", "-"), *(f"{short[k]}={fmt_value(v)}" for k, v in swept)]))
            if dname in dirs:
                dname = safe_name(dname + "-" + hashlib.sha1(label.encode()).hexdigest()[:6])
            dirs.add(dname)
            setting = Setting(entry, swept, label, dname)
            settings.append(setting)
            for seed in seed_list:
                doc = copy.deepcopy(base)
                if str(name) != str(file_alg_name):
                    doc["algorithm"] = {"name": name}  # the file's options belong to its own algorithm
                run_dir = root / dname / f"seed{seed}"
                grid_over = [
                    *overrides,
                    f"algorithm.name={name}",
                    *tuned_values.get(entry, []),
                    *opts,
                    *(f"{k}={raw}" for k, raw, _ in combo),
                    f"seed={seed}",
                ]
                doc = apply_overrides(doc, grid_over, shared_options)
                doc.setdefault("output", {})
                doc["output"] = {**(doc["output"] or {}), "dir": str(run_dir), "overwrite": True, "progress": False}
                if jobs > 1 and (doc.get("engine") or {}).get("workers") is None:
                    doc["engine"] = {**(doc.get("engine") or {}), "workers": 1}
                runs.append(RunSpec(setting, seed, run_dir, doc, requested=frozenset(flatten(doc))))

    # Validate every run before anything runs: config and options, the partition of each
    # distinct (data, partition) section (its first seed; an impossible partition is so for
    # all), and each setting's model and algorithm (what needs both, e.g. a personal-model
    # method with eval.drift, or FedDF without held-out data).
    prepared: dict[str, Any] = {}
    fedavg_steps: dict[str, bool] = {}  # per setting: whether its method trains clients as FedAvg does
    for spec in runs:
        try:
            cfg = load_config(spec.doc)
            options = resolve_options(cfg)
            spec.expected = _resolved(cfg, options)
            pkey = json.dumps([cfg.data.model_dump(), cfg.partition.model_dump()], sort_keys=True, default=str)
            if pkey not in prepared:
                prepared[pkey] = prepare(cfg)
            if spec.setting.label not in fedavg_steps:
                algorithm = build_run(replace(prepared[pkey], config=cfg, options=options))[1]
                fedavg_steps[spec.setting.label] = fedavg_step(algorithm)
            spec.fedavg_step = fedavg_steps[spec.setting.label]
        except ConfigError as err:
            raise ConfigError(f"{err} (in run {spec.name})") from None

    description = {
        "version": 1,
        "config": str(config) if isinstance(config, (str, Path)) else None,
        "base": base,
        "overrides": overrides,
        "algorithms": entries,
        "seeds": seed_list,
        "sweep": {k: [v for _, v in sweep_vals[k]] for k in sweep_keys},
        "settings": [s.as_json() for s in settings],
    }
    if tuned is not None:  # with where the runs differ from the base the values were tuned on
        check = base_check(tuned, [(spec.setting.algorithm, spec.doc) for spec in runs])
        description["tuned"] = {"dir": str(tuned), "overrides": tuned_values, "base": check,
                                "warnings": base_warning(tuned, check)}
    return Grid(root, settings, seed_list, runs, description)


def _tuned_overrides(tuned: str | Path, entries: Sequence[str], over_keys: Sequence[str],
                     swept: Sequence[str]) -> dict[str, list[str]]:
    """Per grid entry, the ``key=value`` overrides of its tuned values; an entry the tune did
    not cover keeps the config's values. A key both tuned and overridden or swept is refused."""
    best = read_tuned(tuned)
    by_name = {parse_algorithm(e)[0]: v for e, v in best.items()}
    out: dict[str, list[str]] = {}
    for entry in entries:
        found = best.get(entry) or by_name.get(parse_algorithm(entry)[0])
        if found is None:
            continue
        for key in found["overrides"]:
            if key in over_keys or key in swept:
                raise ConfigError(f"{key}: both tuned (tuned={tuned}) and {'overridden' if key in over_keys else 'swept'}; "
                                  "give it one way")
        out[entry] = [f"{k}={json.dumps(v)}" for k, v in found["overrides"].items()]
    return out


def config_differences(stored: Mapping[str, Any], expected: Mapping[str, Any], requested: Iterable[str]) -> list[str]:
    """Keys on which a finished run's config.yaml (flattened) and the wanted one disagree.

    Compared: every key both hold, and every key the grid sets explicitly; not the
    execution keys (``EXECUTION_KEYS``, ``output.*``). A key only one side knows and the grid
    does not set (a default added or removed since the run) is not a difference. ``data.root``
    compares as the path it names from here (an older run stored it relative).
    """
    skip = set(EXECUTION_KEYS)
    keys = (set(stored) & set(expected)) | (set(requested) & (set(stored) | set(expected)))
    out = []
    for k in sorted(keys):
        if k in skip or k.startswith("output."):
            continue
        a, b = stored.get(k, "<absent>"), expected.get(k, "<absent>")
        if a != b and not (k == "data.root" and same_root(a, b)):
            out.append(f"{k}: {a!r} -> {b!r}")
    return out


def _stored_run(d: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A run folder's summary and its config.yaml flattened; None when either is unreadable."""
    try:
        return json.loads((d / "summary.json").read_text()), flatten(yamlio.load((d / "config.yaml").read_text()) or {})
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None


def tune_trials(tuned: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """A tune folder's completed trials (each run folder with its flattened config), which
    :func:`copy_trial` may reuse; none when ``tuned`` is a ``best.yaml`` outside its folder."""
    p = Path(tuned)
    read = ((d, _stored_run(d)) for d in sorted((p if p.is_dir() else p.parent).glob("trials/*/trial*")))
    return [(d, r[1]) for d, r in read if r is not None and r[0].get("status") == "completed"]


def run_state(spec: RunSpec) -> tuple[str, str]:
    """``("reuse", status)`` for a finished run, ``("resume", why)`` for a stopped one with a
    checkpoint, else ``("run", why)``."""
    d = spec.dir
    summary_p = d / "summary.json"
    stopped = unfinished(d)
    if stopped and (d / CHECKPOINTS / MANIFEST).is_file():
        return ("resume", f"{stopped}, continued from its checkpoint")
    if not summary_p.is_file():
        return ("run", "interrupted before, rerun" if (d / "metrics.jsonl").is_file() else "new")
    read = _stored_run(d)
    if read is None:
        return ("run", "unreadable summary.json or config.yaml, rerun")
    summary, stored = read
    status = summary.get("status")
    if status not in ("completed", "diverged", "no_clients"):  # finished: a rerun gives the same
        return ("run", f"status {status!r}, rerun")
    diff = config_differences(stored, spec.expected, spec.requested)
    if diff:
        return ("run", "config changed (" + "; ".join(diff[:3]) + (" ..." if len(diff) > 3 else "") + "), rerun")
    # no final_model.pt check: a committed compare folder keeps no models (benchmarks/results's
    # .gitignore), and a completed summary is written after the model: one deleted since only
    # leaves the t-SNE figure without this run
    return ("reuse", status)


def copy_trial(spec: RunSpec, trials: Sequence[tuple[Path, Mapping[str, Any]]]) -> Path | None:
    """Copy into the run's (new) folder the first of a tune's completed trials that is this
    run, by :func:`config_differences`' rule (so a tune at the runs' rounds and seed saves the
    compare that seed's run of each entry); its ``config.yaml`` keeps the trial's
    ``output.dir``, which says where the run came from. The trial, or None when none is."""
    for trial, stored in trials:
        if config_differences(stored, spec.expected, spec.requested):
            continue
        names = [n for n in OWNED if n not in ("summary.json", "final_model.pt") and (trial / n).is_file()]
        with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
            fresh = not spec.dir.exists() or not any(spec.dir.iterdir())
            make_dir(spec.dir)
            if fresh:
                mark(spec.dir)  # a run folder like any other: a later overwrite may clear it
            for name in [*names, "summary.json"]:  # the summary last: it marks the run finished
                copy_file(trial / name, spec.dir / name)
        return trial
    return None


def _describe_result(r: dict[str, Any]) -> str:
    if r["status"] != "completed":
        return f"{r['status']} ({r.get('message', '').split(';')[0]})"
    rounds = f"{r['rounds']} rounds, " if r.get("rounds") else ""
    return (f"{r.get('note', '')}final {r['final_accuracy']:.4f}, best {r['best_accuracy']:.4f}, "
            f"{rounds}{r['seconds']:.1f} s")


def first_round_seconds(root: Path) -> float | None:
    """What a run of this grid needs to reach its first checkpoint (its start-up and one round,
    evaluation included), as its finished runs measured it (the median); None before any."""
    import statistics

    need = []
    for p in root.glob("*/seed*/summary.json"):
        try:
            s = json.loads(p.read_text())
            setup, whole, rounds = float(s["setup_seconds"]), float(s["run_seconds"]), int(s["rounds"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if s.get("status") == "completed" and rounds > 0 and not s.get("resumed_from_round"):
            need.append(setup + (whole - setup) / rounds)
    return statistics.median(need) if need else None


def run_grid(grid: Grid, jobs: int = 1, echo: Callable[[str], None] = print,
             after: Callable[[RunSpec, dict[str, Any]], None] | None = None,
             deadline: float | None = None) -> dict[str, str]:
    """Run the grid's unfinished runs; returns run name -> status (reused ones included).
    A line when each run starts and ends, and every minute one per run in progress
    (:class:`fedrift.experiments.heartbeat.Heartbeat`); ``after(spec, result)`` when a run ends.
    ``deadline`` (epoch seconds: a budget's end): a run is not started when it could not reach
    its first round's checkpoint before it (:func:`first_round_seconds`), so a budget's stop
    leaves every stopped run something to continue from."""
    from fedrift.experiments.heartbeat import Heartbeat

    with Heartbeat([grid.root], echo):
        return _run_grid(grid, jobs, echo, after, deadline)


def _run_grid(grid: Grid, jobs: int, echo: Callable[[str], None],
              after: Callable[[RunSpec, dict[str, Any]], None] | None, deadline: float | None) -> dict[str, str]:
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(grid.root)
        write_atomic(grid.root / GRID_FILE, json.dumps(grid.description, indent=1, default=str) + "\n")
    statuses: dict[str, str] = {}
    todo: list[RunSpec] = []
    resume: set[str] = set()  # names of the runs continued from their checkpoints
    tuned = (grid.description.get("tuned") or {}).get("dir")
    trials = tune_trials(tuned) if tuned is not None else []
    copied = 0
    for spec in grid.runs:
        action, why = run_state(spec)
        trial = copy_trial(spec, trials) if action == "run" and why == "new" else None
        if trial is not None:
            copied += 1
            statuses[spec.name] = "completed"
            echo(f"{spec.name}: the tune's {trial} is this run (the same config but how it ran), copied")
        elif action == "reuse":
            statuses[spec.name] = why
        else:
            todo.append(spec)
            if action == "resume":
                resume.add(spec.name)
            if why != "new":
                echo(f"{spec.name}: {why}")
    total = len(grid.runs)
    reused = total - len(todo)
    echo(f"grid: {len(grid.settings)} settings x {len(grid.seeds)} seeds = {total} runs in {grid.root}; "
         f"{reused} finished before" + (f" ({copied} of them copied from the tune)" if copied else "")
         + f", {len(todo)} to run" + (f" on {jobs} processes" if jobs > 1 and todo else ""))
    done = reused

    def report(spec: RunSpec, result: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        statuses[spec.name] = result["status"]
        echo(f"[{done}/{total}] {spec.setting.label} seed {spec.seed}: {_describe_result(result)}")
        if after is not None:
            after(spec, result)

    tasks = stacks_of(todo)  # a setting's seeds (and settings at other values) as one stack (experiments.stacked)
    for task in tasks:
        if len(task) > 1:
            echo(f"{', '.join(dict.fromkeys(s.setting.label for s in task))}: seeds "
                 f"{', '.join(dict.fromkeys(str(s.seed) for s in task))} trained as one stack")

    need = first_round_seconds(grid.root) if deadline is not None else None

    def start(task: list[RunSpec]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if len(task) == 1:
            limit = (deadline, need) if deadline is not None else ()
            return execute_run, (task[0].doc, task[0].name in resume, *limit)
        return stack_results, ([s.doc for s in task], [s.name in resume for s in task])

    def finish(task: list[RunSpec], result: Any) -> None:
        for spec, res in zip(task, result if len(task) > 1 else [result]):
            report(spec, res)

    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            fn, args = start(task)
            finish(task, fn(*args))
        return statuses

    with run_pool(min(jobs, len(tasks))) as pool:
        pending = {}
        for task in tasks:
            fn, args = start(task)
            pending[pool.submit(fn, *args)] = task
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                finish(pending.pop(fut), fut.result())
    return statuses


def stacks_of(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs to run, as tasks: where runs stack (:func:`fedrift.experiments.stacked.wants_stack`:
    ``engine.executor: stacked``, or ``auto`` on a GPU), those that differ only in each run's
    own keys (seed, partition, ...) and the values a stack's step takes per run (``train.lr``,
    the options of the algorithm's tune space: a sweep over them) together, and the methods
    that train their clients as FedAvg does together whatever their options; each other run
    alone; in the grid's order."""
    tasks: list[list[RunSpec]] = []
    by_key: dict[Any, list[RunSpec]] = {}
    for spec in specs:
        if wants_stack(spec.doc):
            key = stack_key(spec.expected, spec.expected["algorithm.name"], spec.fedavg_step) if spec.expected \
                else spec.setting
            if key not in by_key:
                by_key[key] = []
                tasks.append(by_key[key])
            spec.doc = {**spec.doc, "engine": {**(spec.doc.get("engine") or {}), "executor": "stacked"}}
            by_key[key].append(spec)
        else:
            tasks.append([spec])
    return tasks


__all__ = ["GRID_FILE", "Grid", "RunSpec", "Setting", "build_grid", "config_differences", "copy_trial", "parse_grid_tokens",
           "run_grid", "run_state", "stacks_of", "tune_trials"]
