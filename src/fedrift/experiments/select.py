"""``fedrift select``: which drift remedy for this federation, within a compute budget, with
the evidence.

The plan (:mod:`fedrift.experiments.select_plan`)
    Made before anything runs and again after every trial, from each entry's measured
    seconds per round and start-up (from its trials' round times, not their whole wall time):
    the confirmation's share first (the ``top`` best entries and FedAvg over every seed, or,
    when the budget truly cannot pay for that beside the least search, fewer candidates and
    then fewer seeds, never under two), the search the rest. A budget that cannot pay for the
    least search (one trial of each entry to its first rung) and the least confirmation
    (FedAvg and one candidate over two seeds, kept back with its margin) is refused before
    anything is written (:func:`check_budget`: a ``--budget`` is checked at the folder's
    measured costs, else at a timed probe of FedAvg, every entry assumed to cost as much), in
    one line naming the budget that would do. ``--dry-run`` prints the plan and runs no trial:
    its times come from a timed probe of each entry (a start-up and two rounds at its space's
    centre, in a temporary folder), said as such; it writes nothing.

The search
    One Optuna study over (algorithm, its hyper-parameters) as a single conditional space: a
    categorical ``algorithm`` choice, then that entry's own space (the learning rate and its
    registry entry's, as ``fedrift tune`` searches it; parameters named ``<entry>/<key>``).
    The order is by information, not the field's: FedAvg's first trial (its space's centre)
    runs first (alone, under the default ``min_rounds``: it sets the first rung), then every entry's ``startup`` points in turns (the centre first,
    then its Sobol design), the cheapest measured entries first; then TPE proposes (entry and
    values together), so the budget flows to the methods that do well on this data. Trials
    run the config's ``train.rounds`` under successive halving (asynchronous, Optuna's
    ``SuccessiveHalvingPruner``; ``pruner=hyperband`` for Hyperband): at each rung
    (``min_rounds`` x ``eta``^k rounds) a trial goes on only while its best validation accuracy
    so far is in the top 1/``eta`` of the trials that reached the rung, and while it beats
    every trial already stopped at that rung (ties with a stopped trial stop too: trials stuck
    at chance level would otherwise promote each other). Scores are validation accuracy of
    the global model (``calibrated_val_accuracy`` for CCVR, whose output is the calibrated
    model; select sets CCVR's ``calibrate_at`` to the rungs, so its rungs compare calibrated
    scores at a bounded cost); the test set is not read by the search.

A fair search
    - The first rung is not below the round where FedAvg's first trial moves off the majority
      class on validation (its accuracy above the majority class's share by two standard
      errors of a proportion on the validation set): earlier, every entry scores the majority
      class alike and a rung would judge luck. Measured once, kept in ``select.json``; an
      explicit ``min_rounds=`` is taken as given.
    - The reference is tuned at least as hard as the candidates: whenever it has had fewer
      trials than the median other entry, the next trial is FedAvg's (the next point of its
      Sobol design), so it ends at most the one trial running behind; and a FedAvg trial that
      is FedAvg's best at a rung so far (its first trial is) is never stopped by a rung: its
      best setting reaches the last round, unless the budget stops it (said in ``missing``).
    - An entry that trains as FedAvg in its first rounds (``Algorithm.same_as_fedavg_until``:
      FedGKD's round 1, its buffer empty) is judged from the first rung at least that many
      rounds after the first: it gets as many rounds of its own method as the others.
    - Per entry the tuning it got (trials, the furthest round) goes to the page and the verdict.

The budget
    ``--budget 2h`` (wall clock of the whole command) and/or ``--budget-rounds N`` (training
    rounds of every trial and confirmation run, each round counting one). The search stops
    starting trials when what is left would not pay for the planned confirmation (kept back
    with its margin; the least one when the measured costs leave none planned) and the next
    trial's first rung at the measured costs; a trial running past that is stopped by the
    budget (``budget`` on the page: not counted as its entry's tuning), and after it only
    the first look of an entry not yet tried starts. After the search the confirmation is
    fitted again to what is really left: all asked when it fits (``recommended``), else what
    fits (``provisional``), else the least, run all the same (``provisional``; the page says
    by how much it passed the budget, if it did): a budget that passed the check never ends
    in "no recommendation" because the search spent it. The progress lines' time left is the
    budget less the command's wall clock: it only goes down. Time spent before a Ctrl-C
    counts; a rerun counts only the confirmation runs not finished (compare reuses them).

The confirmation
    The best ``top`` entries (by their best trial: the most rounds reached, then the score)
    and FedAvg at its own best trial run again at ``seeds`` other than the search's, through
    ``fedrift compare`` (``<out>/confirm``, its report beside). The words of the
    recommendation are :func:`fedrift.experiments.select_verdict.recommend`'s; ``metric``
    (``report.metric=`` on the command line: ``accuracy``, ``local_accuracy``,
    ``local_accuracy_worst10``) is what it ranks the confirmed entries on and judges the gain on
    (default: validation accuracy, the gain in test accuracy at best validation); the search
    scores validation accuracy whatever it is, and a rerun may change it (it reads the
    confirmation again).

More seeds later
    The same command with other ``seeds=`` (six, to test a gain) confirms the candidates of the
    last confirmation over them, reusing the finished runs, outside the search's budget: no
    trial runs, no budget is checked, it never ends in "no recommendation" because the search
    spent the budget. Another ``top=`` or a larger budget with the same seeds searches on
    and confirms within the budget.

The page
    ``select.md`` and ``select.html`` are written at every ending past the budget's check (a
    budget refused writes nothing): ``recommended``, ``provisional``, ``no recommendation``
    (nothing to confirm) or ``stopped`` (Ctrl-C), with the plan as it ran (the confirmation
    that ran, and the plan before the search when it was re-planned), what ran and what is
    missing.

The folder
    ``study.db`` (the study), ``select.json`` (what was asked, the budget spent, the floor
    measured, the last confirmation), ``trials/``, ``candidates.yaml`` (the confirmed entries'
    values, in ``best.yaml``'s format: ``tuned=`` takes it), ``confirm/``,
    ``recommendation.yaml`` (a config ``fedrift run -c`` takes as it is), ``select.md`` and
    ``select.html``. Run the same command again to continue it (finished trials are kept; a
    larger budget searches on).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedrift import yamlio
from fedrift.config import Config, apply_overrides, config_dict, entry_doc
from fedrift.engine.folder_lock import FolderLock
from fedrift.errors import ConfigError, DivergenceError, writing
from fedrift.experiments.naming import safe_name
from fedrift.experiments.pool import interruptible, run_pool, shielded
from fedrift.experiments.space import Dim, resolve_space, startup_points
from fedrift.experiments.studies import (STUDY_DB, fail_stale, finished_trials, fixed_sampler_class, load_optuna,
                                         one_trial, study_storage)
from fedrift.experiments.tuned import BEST, tune_base
from fedrift.overrides import parse_algorithm
from fedrift.experiments.select_plan import (
    LEAST_SEEDS, OVERHEAD_S, REPORT_OVERHEAD_S, Confirmation, Cost, confirmation_line, cost_of_trial, estimate_room,
    fit_confirmation, kept_back, make_plan, measured_costs, order as entry_order,
)
from fedrift.experiments.select_verdict import REFERENCE, recommend, values_text, wrap
from fedrift.report.select_page import duration_text, render_select_page
from fedrift.report.table import check_metric, describe_data
from fedrift.safe_files import make_dir, write_atomic

CONFIRMATION = ("seeds", "top")  # what a rerun of the same select may change
LATER = ("floor", "confirmation")  # what a select learns as it runs (select.json), not its identity
STUDY = "select"
STATE = "select.json"
CANDIDATES = "candidates.yaml"
RECOMMENDATION = "recommendation.yaml"
SCORES = ("calibrated_val_accuracy", "val_accuracy")  # a global model's validation accuracy, CCVR's calibrated


def parse_duration(text: str) -> float:
    """``2h``, ``90m``, ``1h30m``, ``45s`` or a number of seconds -> seconds."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    raw = raw.replace(" ", "")  # 2 h, 1h 30m
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", raw)
    if not raw or m is None:  # each unit at most once, in the order h, m, s
        raise ConfigError(f"--budget: {text!r} is not a duration; allowed: 2h, 90m, 1h30m, 3600s or seconds")
    return sum(float(n or 0) * unit for n, unit in zip(m.groups(), (3600, 60, 1)))


def _rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def _clock(seconds: float) -> str:
    """``26 s``, ``5 min 26 s``, ``1 h 02 min``: to the second below an hour (how far a budget was passed)."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def score_of(row: Mapping[str, Any]) -> float | None:
    """The search's score of a round: the global model's validation accuracy (CCVR: of its
    calibrated model). Test metrics are never read."""
    for key in SCORES:
        if row.get(key) is not None:
            return float(row[key])
    return None


@dataclass
class Entry:
    """One algorithm entry of the field: its space and its base config."""

    entry: str  # as given: fedprox, moon:mu=5:model.projection_dim=256
    name: str  # folder-safe
    dims: list[Dim]
    doc: dict[str, Any]
    same_until: int = 0  # rounds it trains as FedAvg (Algorithm.same_as_fedavg_until)
    calibrates: bool = False  # takes algorithm.calibrate_at (CCVR): select calibrates at the rungs

    def param(self, key: str) -> str:
        return f"{self.entry}/{key}"


@dataclass
class Select:
    root: Path
    entries: list[Entry]
    left_out: dict[str, str]  # entry -> why it is not in the field
    rounds: int  # a trial's (and a confirmation run's) rounds
    seed: int
    seeds: list[int]  # the confirmation's
    top: int
    startup: int
    min_rounds: int
    eta: int
    pruner: str
    budget_seconds: float | None
    budget_rounds: int | None
    description: dict[str, Any] = field(default_factory=dict)
    majority: float | None = None  # the validation set's majority-class share
    n_val: int = 0  # validation samples
    auto_rungs: bool = False  # min_rounds not given: the first rung waits for the floor
    probed: dict[str, Cost] = field(default_factory=dict)  # the timed probe's (--dry-run's, the budget check's)
    overhead: float = OVERHEAD_S  # a confirmation's seconds beside its runs (REPORT_OVERHEAD_S with its reports)
    setting: str = ""  # the base config's data and partition, for the page's title
    metric: str | None = None  # report.metric: what the verdict ranks the confirmed entries on (not the search)

    @property
    def reference(self) -> str:
        return next(e.entry for e in self.entries if parse_algorithm(e.entry)[0] == REFERENCE)

    @property
    def storage(self) -> str:
        return study_storage(self.root)

    @property
    def rungs(self) -> list[int]:
        out, r = [], self.min_rounds
        while r < self.rounds:
            out.append(r)
            r *= self.eta
        return out + [self.rounds]

    @property
    def confirmation_rounds(self) -> int:
        return (self.top + 1) * len(self.seeds) * self.rounds

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.entry == name)


# ---------------------------------------------------------------------------------------
# Building and validating


def build_select(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    budget: str | float | None = None,
    budget_rounds: int | None = None,
    seeds: Sequence[int] | None = None,
    top: int = 3,
    startup: int = 2,
    min_rounds: int | None = None,
    eta: int = 3,
    pruner: str = "sha",
    space: Mapping[str, Any] | None = None,
) -> Select:
    """The field (every entry that builds on this config, or ``algorithms``; FedAvg always),
    each entry's space, the rungs and the budget, validated; nothing is written."""
    from fedrift.algorithms import ALGORITHMS
    from fedrift.api import build_run, prepare, resolve_options
    from fedrift.config import load_config
    from fedrift.engine.build import config_yaml

    if budget is None and budget_rounds is None:
        raise ConfigError("select needs a budget; allowed: --budget DURATION (2h, 90m) and/or --budget-rounds N")
    seconds = parse_duration(str(budget)) if budget is not None else None
    if seconds is not None and seconds <= 0:
        raise ConfigError(f"--budget: {budget!r} is no time; allowed: a positive duration such as 2h")
    if budget_rounds is not None and budget_rounds < 1:
        raise ConfigError(f"--budget-rounds: {budget_rounds} is no rounds; allowed: a positive number")
    for what, value, least in (("top", top, 1), ("startup", startup, 1), ("eta", eta, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{what}: {value!r}; allowed: an integer >= {least}")
    if pruner not in ("sha", "hyperband"):
        raise ConfigError(f"pruner: {pruner!r}; allowed: sha (successive halving), hyperband")
    overrides = list(overrides or [])
    for o in overrides:
        key = o.partition("=")[0].strip()
        if key == "output.progress" and apply_overrides({}, [o])["output"]["progress"] is False:
            continue  # what select does anyway (no run of it shows a progress bar); a script may say so
        if key.startswith("output."):
            raise ConfigError(f"{key}: select sets every run's output keys (no progress bar); allowed: --out for its "
                              "folder, output.progress=false")
    base = apply_overrides(config_dict(config), overrides)
    base.pop("output", None)
    cfg = load_config(base)
    if getattr(cfg.partition, "val_share", 0) <= 0:
        raise ConfigError("partition.val_share: select scores trials on validation accuracy and never reads the test set "
                          "while it searches, so the clients need a validation share; allowed: a share in (0, 1), "
                          "e.g. partition.val_share=0.1")
    rounds, seed = cfg.train.rounds, cfg.seed
    seed_list = [int(s) for s in (seeds if seeds is not None else [seed + 1 + k for k in range(3)])]
    if len(seed_list) < 2 or len(set(seed_list)) != len(seed_list) or any(s < 0 for s in seed_list):
        raise ConfigError(f"seeds: {seed_list}; allowed: at least 2 distinct seeds >= 0 (the confirmation never "
                          "recommends on one seed)")
    r0 = min_rounds if min_rounds is not None else max(1, rounds // eta ** 2)
    if not 1 <= r0 <= rounds:
        raise ConfigError(f"min_rounds: {r0}; allowed: 1 to train.rounds ({rounds})")

    asked = list(algorithms) if algorithms else [e.name for e in ALGORITHMS]
    if len(set(asked)) != len(asked):
        raise ConfigError("algorithms: an entry is given twice")
    if REFERENCE not in [parse_algorithm(a)[0] for a in asked]:
        asked = [REFERENCE, *asked]  # the reference of every gain
    prep = prepare(cfg)
    entries, left_out, names = [], {}, set()
    for entry in asked:
        name = parse_algorithm(entry)[0]
        doc = entry_doc(base, entry)
        try:
            dims = resolve_space(name, dict(space or {}))
            probe = apply_overrides(doc, [f"{d.key}={json.dumps(d.middle())}" for d in dims])
            c = load_config(probe)
            same_data = c.data == cfg.data and c.partition == cfg.partition
            _, algorithm = build_run(replace(prep if same_data else prepare(c), config=c, options=resolve_options(c)))
        except ConfigError as err:
            if algorithms:
                raise ConfigError(f"{err} (algorithms: {entry})") from None
            left_out[entry] = str(err)
            continue
        if algorithm.personal or algorithm.client_model is not None:
            why = ("per-client models (scored on each client's own validation samples); select compares one global "
                   "model's validation accuracy: compare it with fedrift tune and fedrift compare")
            if algorithms:
                raise ConfigError(f"algorithms: {entry} has {why}")
            left_out[entry] = why
            continue
        folder = safe_name(entry.replace(":", "-"))
        if folder in names:
            raise ConfigError(f"algorithms: {entry!r} gives the same folder name as another entry")
        names.add(folder)
        params = getattr(ALGORITHMS.get(name), "params", None)
        entries.append(Entry(entry, folder, dims, doc, int(getattr(algorithm, "same_as_fedavg_until", 0) or 0),
                             "calibrate_at" in getattr(params, "__dataclass_fields__", {})))

    if len(entries) < 2:
        raise ConfigError("algorithms: select needs FedAvg and at least one other entry that builds on this config"
                          + (f" (left out: {'; '.join(f'{k}: {v}' for k, v in left_out.items())})" if left_out else ""))
    plan = Select(Path(out) if out is not None else Path("runs") / (
        f"select-{Path(config).stem}" if isinstance(config, (str, Path)) else "select"),
        entries, left_out, rounds, seed, seed_list, min(top, len(entries) - 1), startup, r0, eta, pruner,
        seconds, budget_rounds)
    plan.auto_rungs = min_rounds is None
    plan.setting = describe_data([yamlio.load(config_yaml(cfg, prep.options))])
    val = getattr(prep.partition, "val", None)
    idx = getattr(val, "values", None)
    if idx is not None and len(idx):
        counts = prep.dataset.y_train[idx].bincount()
        plan.majority, plan.n_val = float(counts.max()) / len(idx), len(idx)
    plan.description = {
        "version": 1, "base": base, "entries": {e.entry: {k.key: k.describe() for k in e.dims} for e in entries},
        "left_out": left_out, "rounds": rounds, "seed": seed, "seeds": seed_list, "top": plan.top,
        "startup": startup, "min_rounds": r0, "eta": eta, "pruner": pruner,
    }
    return plan


# ---------------------------------------------------------------------------------------
# The search


_STORAGES: dict[tuple[int, str, int | None], Any] = {}


def _storage(plan: Select) -> Any:
    """The study's storage, one per process and folder: opening an SQLite storage (its engine,
    its schema check) took 0.3 s, and the search opens the study several times a trial."""
    db = plan.root / STUDY_DB
    key = (os.getpid(), plan.storage, db.stat().st_ino if db.is_file() else None)  # a folder deleted and made again
    if key[2] is None or key not in _STORAGES:
        storage = load_optuna().storages.RDBStorage(plan.storage)
        if key[2] is None:
            return storage
        _STORAGES[key] = storage
    return _STORAGES[key]


def _pruner(plan: Select) -> Any:
    optuna = load_optuna()
    if plan.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=plan.min_rounds, max_resource=plan.rounds,
                                             reduction_factor=plan.eta)
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=plan.min_rounds, reduction_factor=plan.eta)


def _open(plan: Select, seed: int, point: Mapping[str, Any] | None = None) -> Any:
    optuna = load_optuna()
    sampler = (fixed_sampler_class()(dict(point)) if point is not None else
               optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=0))
    with shielded():
        return optuna.create_study(study_name=STUDY, storage=_storage(plan), direction="maximize", load_if_exists=True,
                                   sampler=sampler, pruner=_pruner(plan))


def _points(plan: Select, st: Any) -> list[dict[str, Any]]:
    """The start-up design's points no finished (or failed with an error) trial has run: ``startup`` per entry, the
    space's centre first and then its Sobol design, in turns (every entry's first point, then
    every entry's second...). The centre first, because a design's first scrambled point may
    lie at an extreme (a learning rate of 0.25 on workload A) where every method fails alike.
    A point whose trial the budget stopped is proposed again: a larger budget reruns it."""
    done = finished_trials(st)
    measured = [{"entry": t.params.get("algorithm"), "rounds": t.user_attrs.get("rounds", 0),
                 "seconds": t.user_attrs.get("seconds", 0.0), "first_round": t.user_attrs.get("first_round", 0),
                 "first_seconds": t.user_attrs.get("first_seconds", 0.0)} for t in done]
    names = entry_order([e.entry for e in plan.entries], plan.reference,
                  measured_costs(measured, [e.entry for e in plan.entries], plan.probed))
    per = [[{"algorithm": e.entry, **{e.param(k): v for k, v in p.items()}}
            for p in [_centre(e), *startup_points(e.dims, plan.startup - 1, plan.seed)]]
           for e in sorted(plan.entries, key=lambda e: names.index(e.entry))]
    # a point whose run failed with an error (the entry's bug) is not proposed again; one
    # interrupted (Ctrl-C) is: the same command continues it
    failed = [t for t in st.get_trials(deepcopy=False, states=None)
              if t.state.name == "FAIL" and str(t.user_attrs.get("status", "")).startswith("error")]
    seen = {json.dumps(t.params, sort_keys=True) for t in [*done, *failed] if t.user_attrs.get("status") != "budget"}
    order = [p for k in range(plan.startup) for pts in per for p in pts[k:k + 1]]
    return [p for p in order if json.dumps(p, sort_keys=True) not in seen]


def _centre(entry: Entry) -> dict[str, Any]:
    """The centre of an entry's space: its first start-up point."""
    return {d.key: d.at(0.5) for d in entry.dims}


def _owed_reference(plan: Select, trials: Sequence[Mapping[str, Any]],
                    submitted: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """FedAvg's next point while it has had fewer trials than the median other entry (the
    reference tuned as hard as the candidates; trials the budget stopped count for none): the
    next unrun point of its Sobol design (the one its start-up points begin), None when it is
    not owed one or the design (16) is spent."""
    ref = plan.entry(plan.reference)
    count = {e.entry: 0 for e in plan.entries}
    trials = [t for t in trials if t["status"] != "budget"]
    for t in trials:
        if t["state"] != "fail" and t["entry"] in count:
            count[t["entry"]] += 1
    for p in submitted:
        count[p["algorithm"]] = count.get(p["algorithm"], 0) + 1
    others = [v for k, v in count.items() if k != ref.entry]
    if not others or count[ref.entry] >= statistics.median(others):
        return None
    seen = {json.dumps({k: v for k, v in t["values"].items()}, sort_keys=True) for t in trials
            if t["entry"] == ref.entry and t["state"] != "fail"}
    seen |= {json.dumps({k.split("/", 1)[1]: v for k, v in p.items() if k != "algorithm"}, sort_keys=True)
             for p in submitted if p["algorithm"] == ref.entry}
    for p in [_centre(ref), *startup_points(ref.dims, 16, plan.seed)]:
        if json.dumps(p, sort_keys=True) not in seen:
            return {"algorithm": ref.entry, **{ref.param(k): v for k, v in p.items()}}
    return None


def floor_round(curve: Mapping[int, float], majority: float | None, n_val: int) -> int | None:
    """The first round whose validation accuracy is above the majority class's share by two
    standard errors of a proportion over ``n_val`` samples (before it, a model that predicts
    one class scores as well), or None when no round is."""
    if majority is None:
        return None
    bar = majority + 2 * math.sqrt(majority * (1 - majority) / max(1, n_val))
    return next((r for r, v in sorted(curve.items()) if v > bar), None)


def judged_from(plan: Select, entry: Entry) -> int:
    """The first rung at which an entry's trials may be stopped: for one that trains as
    FedAvg in its first ``same_until`` rounds, the first rung at least that many rounds after
    the first rung, so it gets as many rounds of its own method as the others."""
    least = plan.rungs[0] + entry.same_until
    return next((r for r in plan.rungs if r >= least), plan.rounds)


def _best_reference(plan: Select, trial: Any, rnd: int, score: float) -> bool:
    """Whether this FedAvg trial is FedAvg's best at round ``rnd`` so far (strictly ahead of
    every other FedAvg trial that reached it; the first to reach it is): then no rung stops it,
    so FedAvg's best setting reaches the last round."""
    ref = plan.reference
    for t in trial.study.get_trials(deepcopy=False):
        if t.number != trial.number and t.params.get("algorithm") == ref and rnd in t.intermediate_values \
                and t.intermediate_values[rnd] >= score:
            return False
    return True


def _objective(plan: Select, echo: Callable[[str], None], threads_one: bool, cap: int | None = None,
               deadline: float | Callable[[], float | None] | None = None,
               measure_floor: bool = False, budget_end: float | None = None) -> Callable[[Any], float]:
    """A trial: the entry and values the sampler gives, run to the full rounds unless the
    pruner stops it at a rung, or the budget at ``cap`` rounds or at the ``deadline`` (epoch
    seconds: what is left once the confirmation's share is kept back; a callable is asked
    again at each round, with the costs measured so far). ``measure_floor``: FedAvg's first
    trial, run before the rungs are known: no rung judges it. ``budget_end``: the whole
    budget's end (epoch seconds), whose time left the progress lines say: one clock, so it
    only goes down."""
    from fedrift.api import run

    optuna = load_optuna()

    def objective(trial: Any) -> float:
        with shielded():
            choice = trial.suggest_categorical("algorithm", [e.entry for e in plan.entries])
            entry = plan.entry(choice)
            values = {d.key: replace(d, key=entry.param(d.key)).suggest(trial) for d in entry.dims}
            trial.set_user_attr("overrides", values)
        doc = apply_overrides(entry.doc, [f"{k}={json.dumps(v)}" for k, v in values.items()])
        doc["output"] = {"dir": str(plan.root / "trials" / f"trial{trial.number}"), "overwrite": True,
                         "progress": False, "save_model": False}
        doc["engine"] = {**(doc.get("engine") or {}), "checkpoint_every": 0,
                         **({"workers": 1} if threads_one and (doc.get("engine") or {}).get("workers") is None else {})}
        if entry.calibrates and "calibrate_at" not in (doc.get("algorithm") or {}):
            doc["algorithm"] = {**doc["algorithm"], "calibrate_at": list(plan.rungs)}  # calibrated scores at the rungs
        shown = f"{choice} ({values_text(values)})"
        # FedAvg's best trial so far at a rung runs on, pruner or not: the reference every gain
        # is measured against reaches the last round at its best setting (its first trial is
        # its best when it reaches each rung); the budget still stops it
        is_ref = choice == plan.reference
        first_judged = judged_from(plan, entry)
        best = [-math.inf]
        rungs = set(plan.rungs)
        start = time.perf_counter()
        first: list[int] = []
        echo(f"trial {trial.number} {shown}: starts" + (" (FedAvg's first: it sets the first rung)" if measure_floor else ""))

        def on_round(row: dict[str, Any]) -> None:
            score = score_of(row)
            if entry.calibrates and row.get("calibrated_val_accuracy") is None:
                # the calibrated model is CCVR's output: a round it did not calibrate (between
                # the rungs) keeps the last calibrated score, never its uncalibrated model's
                score = best[0] if math.isfinite(best[0]) else None
            if score is None:
                return
            rnd = int(row["round"])
            with shielded():
                best[0] = max(best[0], score)
                trial.report(best[0], rnd)
                trial.set_user_attr("rounds", rnd)
                trial.set_user_attr("seconds", time.perf_counter() - start)
                if not first:  # the round times the plan reads: per round and start-up apart
                    first.append(rnd)
                    trial.set_user_attr("first_round", rnd)
                    trial.set_user_attr("first_seconds", time.perf_counter() - start)
                prune = False
                if not measure_floor:
                    prune = trial.should_prune() or (rnd in rungs and _no_better_than_stopped(plan, trial, rnd, best[0]))
                    if prune and (rnd < first_judged or (is_ref and _best_reference(plan, trial, rnd, best[0]))):
                        prune = False
                if prune:
                    trial.set_user_attr("status", "pruned")
            until = deadline() if callable(deadline) else deadline
            over = (cap is not None and rnd >= cap and rnd < plan.rounds) or (
                until is not None and time.time() > until and rnd < plan.rounds)
            by_budget = over and not prune  # a trial the pruner stops at this round is its rung's, not the budget's
            if by_budget:
                prune = True
                with shielded():
                    trial.set_user_attr("status", "budget")
            if rnd in rungs or prune:
                left = ("" if budget_end is None else
                        f"; {duration_text(max(0.0, budget_end - time.time()))} of the budget left")
                what = ("stopped by the budget" if by_budget else "stopped" if prune else "goes on" if rnd < plan.rounds
                        else "done")
                echo(f"trial {trial.number} {shown}: {_rounds(rnd)}, val {best[0]:.4f}, {what}{left}")
            if prune:
                raise optuna.TrialPruned(f"round {rnd}")

        try:
            with interruptible():
                run(doc, on_round=on_round)
        except DivergenceError as err:
            with shielded():
                trial.set_user_attr("status", "diverged")
            echo(f"trial {trial.number} {shown}: diverged ({str(err).split(';')[0]})")
            raise optuna.TrialPruned("diverged") from None
        except optuna.TrialPruned:
            raise
        except Exception as err:  # an entry that fails (a bug, a library error) fails its trial, not the search
            with shielded():
                trial.set_user_attr("status", f"error: {type(err).__name__}: {err}"[:300])
            echo(f"trial {trial.number} {shown}: failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                 "the search goes on without it")
            return math.nan  # told as failed: no score
        with shielded():
            trial.set_user_attr("status", "completed")
            trial.set_user_attr("seconds", time.perf_counter() - start)
        return best[0] if math.isfinite(best[0]) else math.nan

    return objective


def _no_better_than_stopped(plan: Select, trial: Any, rnd: int, score: float) -> bool:
    """Whether a trial stopped by the pruner at this rung (its last round before the next rung)
    scored at least ``score`` there: asynchronous halving promotes the top 1/eta of a rung, and
    when many trials tie at chance level the tie itself is the cut-off, so they go on together."""
    optuna = load_optuna()
    later = [r for r in plan.rungs if r > rnd]
    until = later[0] if later else plan.rounds + 1
    for t in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)):
        steps = t.intermediate_values
        if (t.number != trial.number and t.user_attrs.get("status") == "pruned" and rnd in steps
                and max(steps) < until and steps[rnd] >= score):
            return True
    return False


def _worker(args: tuple[Select, int, dict[str, Any] | None, int | None, float | None, float | None]) -> None:
    """A pool process: one trial (a start-up point, or TPE's proposal) within its limits."""
    plan, seed, point, cap, deadline, budget_end = args
    one_trial(_open(plan, seed, point), _objective(plan, print, True, cap, deadline, budget_end=budget_end))


def _trials(plan: Select) -> list[dict[str, Any]]:
    """Every trial as plain data (entry, values, rounds reached, best validation score so far
    at each reported round, status, seconds): what the budget, the ranking and the page read.
    ``charged``: the rounds the budget counts, at least the first rung's for a trial that
    ended, so that trials ending before any scored round (an entry that fails at once, a
    divergence in round 1) still spend budget and a search cannot loop on them for free."""
    optuna = load_optuna()
    if not (plan.root / STUDY_DB).is_file():
        return []
    try:
        st = optuna.load_study(study_name=STUDY, storage=_storage(plan))
    except KeyError:  # a study.db without the study: nothing ran
        return []
    out = []
    for t in st.get_trials(deepcopy=False):
        if "algorithm" not in t.params:
            continue
        inter = dict(sorted(t.intermediate_values.items()))
        out.append({"trial": t.number, "entry": t.params["algorithm"], "state": t.state.name.lower(),
                    "status": t.user_attrs.get("status", t.state.name.lower()),
                    "values": t.user_attrs.get("overrides", {}), "curve": inter,
                    "rounds": max(inter) if inter else 0, "score": inter[max(inter)] if inter else None,
                    "seconds": float(t.user_attrs.get("seconds", 0.0))})
        done = t.state.name not in ("RUNNING", "WAITING")
        out[-1]["charged"] = max(out[-1]["rounds"], plan.rungs[0]) if done else out[-1]["rounds"]
        out[-1]["first_round"] = int(t.user_attrs.get("first_round", 0))
        out[-1]["first_seconds"] = float(t.user_attrs.get("first_seconds", 0.0))
    return out


def ranking(plan: Select, trials: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per entry its best trial (most rounds reached, then the best validation score), best
    first: the order in which entries are confirmed. A trial the budget stopped is not one of
    the entry's tuning: it stands for the entry only when the entry has no other scored trial."""
    best: dict[str, tuple[bool, int, float, dict[str, Any]]] = {}
    for t in trials:
        if t["score"] is None or not math.isfinite(t["score"]) or t["status"] == "diverged":
            continue
        key = (t.get("status") != "budget", t["rounds"], t["score"], t)
        if t["entry"] not in best or key[:3] > best[t["entry"]][:3]:
            best[t["entry"]] = key
    return sorted((k[3] for k in best.values()), key=lambda t: (t["rounds"], t["score"]), reverse=True)


def candidates(plan: Select, trials: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``top`` best entries and FedAvg's best trial (the reference)."""
    ranked = ranking(plan, trials)
    others = [t for t in ranked if parse_algorithm(t["entry"])[0] != REFERENCE][: plan.top]
    ref = next((t for t in ranked if parse_algorithm(t["entry"])[0] == REFERENCE), None)
    return ([ref] if ref is not None else []) + others


def _ranked(plan: Select, trials: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """What the confirmation would be now: FedAvg and the ``top`` best entries, padded (before
    the search has found them) with the entries next in the search's order."""
    picks = [t["entry"] for t in candidates(plan, trials)]
    if not picks or picks[0] != plan.reference:
        picks = [plan.reference, *[p for p in picks if p != plan.reference]]
    return (picks + [e for e in names if e not in picks])[: plan.top + 1]


def budget_plan(plan: Select, trials: Sequence[Mapping[str, Any]], jobs: int = 1, before: float = 0.0) -> dict[str, Any]:
    """The plan (:func:`fedrift.experiments.select_plan.make_plan`) with the costs measured so
    far; ``before``: seconds the budget check counts as spent before the search (the probe's)."""
    names = [e.entry for e in plan.entries]
    costs = measured_costs(trials, names, plan.probed)
    floor = plan.description.get("floor")
    return make_plan(entries=names, reference=plan.reference, rounds=plan.rounds, rungs=plan.rungs, eta=plan.eta,
                     seeds=plan.seeds, top=plan.top, costs=costs, budget_seconds=plan.budget_seconds,
                     budget_rounds=plan.budget_rounds, spent_seconds=float(plan.description.get("spent", 0.0)),
                     spent_rounds=_spent(plan, trials), ranked=_ranked(plan, trials, entry_order(names, plan.reference, costs)),
                     jobs=jobs, floor=None if not floor else floor.get("text"), before_seconds=before,
                     overhead=plan.overhead)


def _to_confirm(plan: Select, picked: Sequence[Mapping[str, Any]], tuned: Path, jobs: int) -> float:
    """The share of the confirmation's runs not finished in ``<out>/confirm``: a rerun of a
    select reuses the finished ones (compare's rule), so only the others need time."""
    done = _finished_runs(plan, [t["entry"] for t in picked], tuned, jobs)
    runs = len(picked) * len(plan.seeds)
    return sum((t["entry"], s) not in done for t in picked for s in plan.seeds) / max(1, runs)


def _finished_runs(plan: Select, entries: Sequence[str], tuned: Path, jobs: int) -> set[tuple[str, int]]:
    """(entry, seed) of the confirmation runs finished in ``<out>/confirm`` that compare reuses."""
    from fedrift.experiments.grid import build_grid, run_state

    if not (plan.root / "confirm").is_dir() or not tuned.is_file():
        return set()
    grid = build_grid(plan.description["base"], list(entries), plan.seeds, out=plan.root / "confirm", jobs=jobs,
                      tuned=tuned)
    return {(r.setting.algorithm, r.seed) for r in grid.runs if run_state(r)[0] == "reuse"}


def _spent(plan: Select, trials: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(t["charged"]) for t in trials)


def apply_floor(plan: Select, trials: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first rung's floor from FedAvg's first trial (its curve), stored in
    ``plan.description["floor"]`` and applied to ``plan.min_rounds``; None before that trial
    reported a round or when the rungs were given (``min_rounds=``)."""
    if not plan.auto_rungs:
        return None
    if plan.description.get("floor") is None:
        ref = [t for t in trials if t["entry"] == plan.reference and t["curve"] and t["state"] != "fail"]
        if not ref:
            return None
        first = min(ref, key=lambda t: t["trial"])
        at = floor_round(first["curve"], plan.majority, plan.n_val)
        share = "-" if plan.majority is None else f"{100 * plan.majority:.1f}%"
        text = (f"round {at}, where FedAvg's first trial moved off the majority class (validation {share})" if at else
                f"not measured: FedAvg's first trial stayed at the majority class ({share}) for its {first['rounds']} rounds")
        plan.description["floor"] = {"rounds": at, "majority": plan.majority, "text": text}
    at = plan.description["floor"].get("rounds")
    if at:
        plan.min_rounds = max(plan.min_rounds, min(int(at), plan.rounds))
    return plan.description["floor"]


def _unlooked(plan: Select, trials: Sequence[Mapping[str, Any]],
              submitted: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Entries owed their first look: no trial yet (a running one counts; one whose trial failed
    with an error is broken and owed nothing; one interrupted by Ctrl-C is owed its look again)."""
    seen = {t["entry"] for t in trials if t["state"] != "fail" or str(t["status"]).startswith("error")}
    seen |= {p["algorithm"] for p in submitted}
    return [e.entry for e in plan.entries if e.entry not in seen]


def _cut(trials: Sequence[Mapping[str, Any]], since: int) -> bool:
    """Whether a trial numbered ``since`` or later was stopped by the budget: the search's end."""
    return any(t["trial"] >= since and t["status"] == "budget" for t in trials)


def search(plan: Select, jobs: int = 1, echo: Callable[[str], None] = print,
           progress: Callable[[float], None] | None = None) -> None:
    """Run trials while the budget, less what the planned confirmation will need (with its
    margin: :func:`~fedrift.experiments.select_plan.kept_back`), lasts (:func:`budget_plan`, made
    again after every trial and while one runs). Once a trial is stopped by the budget no other
    starts, but an entry not yet looked at still gets a trial to its first rung (the least search
    the budget was checked for). ``progress`` is told the seconds spent so far after each trial
    (select records them: a search killed outright still has its time counted)."""
    optuna = load_optuna()
    started = time.time()
    before_spent = float(plan.description.get("spent", 0.0))
    plan.description["started"] = started
    end = None if plan.budget_seconds is None else started + plan.budget_seconds - before_spent  # the budget's end
    with shielded():
        st = optuna.create_study(study_name=STUDY, storage=_storage(plan), direction="maximize", load_if_exists=True)
    stale = fail_stale(st)
    before = _trials(plan)
    since = max((t["trial"] for t in before), default=-1) + 1  # this search's trials are numbered from here
    apply_floor(plan, before)
    echo(f"select: {len(plan.entries)} entries, {len(before)} trials before" + (f" ({stale} left running marked failed)" if stale else "")
         + f"; rungs at {', '.join(map(str, plan.rungs))} rounds" + (" (the first waits for FedAvg's first trial)"
                                                                      if plan.auto_rungs and not plan.description.get("floor") else "")
         + f"; confirmation: top {plan.top} and FedAvg x {len(plan.seeds)} seeds x {plan.rounds} rounds")
    for entry, why in plan.left_out.items():
        echo(f"select: {entry} left out: {why}")

    def first_rung_seconds(bp: Mapping[str, Any]) -> float:
        costs = list(bp["costs"].values())
        return (statistics.median(c["startup"] for c in costs) + plan.rungs[0] *
                statistics.median(c["per_round"] for c in costs)) if costs else 0.0

    def kept(bp: Mapping[str, Any]) -> tuple[float, int]:
        """Seconds and rounds kept back for the planned confirmation; for the least one when
        none fits the plan any more (the measured costs grew): the search never takes its time."""
        conf, least = bp["confirmation"], bp["least"]
        return (kept_back(conf["seconds"] if conf else least["confirmation_seconds"], plan.overhead),
                conf["rounds"] if conf else least["confirmation_rounds"])

    def overrun(bp: Mapping[str, Any]) -> float:
        """What the trial a deadline stops takes past it: it ends at its next round, then ends its run."""
        costs = list(bp["costs"].values())
        return max(c["per_round"] + c["startup"] for c in costs) if costs else 0.0

    def deadline_of(trials: Sequence[Mapping[str, Any]], keep: int = 0) -> tuple[float | None, dict[str, Any]]:
        """The search's deadline (epoch seconds): the budget's end less the planned confirmation
        kept back, the overrun of the trial the deadline stops and ``keep`` entries' first rungs
        (those not looked at yet) at the costs measured so far; the plan made."""
        bp = budget_plan(plan, trials, jobs)
        if end is None:
            return None, bp
        return end - kept(bp)[0] - overrun(bp) - keep * first_rung_seconds(bp), bp

    def limits(trials: Sequence[Mapping[str, Any]], reserved: int, entry: str | None,
               submitted: Sequence[Mapping[str, Any]] = ()) -> tuple[int | None, float | None] | None:
        """The next trial's round cap and deadline (of ``entry``'s trial; None: TPE's, entry
        not known), or None when the budget has no room for it: rounds left once the planned
        confirmation's and the running trials' caps are kept back; time left once the planned
        confirmation's is, enough for the next trial's first rung at the median measured cost.
        After a trial stopped by the budget, or past the search's end, only an entry owed its
        look starts: to its first rung, whatever the clock."""
        owed = _unlooked(plan, trials, submitted)
        look = entry in owed
        keep = len(owed) - look  # the other entries' looks stay owed
        deadline, bp = deadline_of(trials)
        room: tuple[int | None, float | None] | None = (None, deadline)
        if plan.budget_rounds is not None:
            done = sum(int(t["charged"]) for t in trials if t["state"] != "running")
            left = plan.budget_rounds - kept(bp)[1] - done - reserved
            room = None if left < plan.rungs[0] else (min(plan.rounds, max(plan.rungs[0], left - keep * plan.rungs[0])),
                                                      deadline)
        if room is not None and deadline is not None:
            f = first_rung_seconds(bp)
            room = None if time.time() + f > deadline else (room[0], max(time.time() + f, deadline - keep * f))
        if room is None or bp["refused"] or _cut(trials, since):
            return (plan.rungs[0], None) if look else None
        return room

    cache: dict[str, float] = {}

    def live_deadline() -> float | None:
        """The deadline asked again while a trial runs (every 2 s at most): the plan moves with
        the costs the running trial measures."""
        if end is None:
            return None
        now = time.time()
        if "at" not in cache or now - cache["at"] > 2.0:
            trials = _trials(plan)
            cache["value"] = deadline_of(trials, len(_unlooked(plan, trials)))[0] or end
            cache["at"] = now
        return cache["value"]

    def run_one(point: dict[str, Any] | None, lim: tuple[int | None, float | None], floor: bool = False) -> None:
        until = live_deadline if lim[1] is not None else None  # an owed look runs to its first rung
        one_trial(_open(plan, seed, point), _objective(plan, echo, False, lim[0], until, floor, end))
        if progress is not None:
            progress(time.time() - started)

    seed = plan.seed + 1 + len(before)
    try:  # the time of a search stopped by Ctrl-C counts too
        if plan.auto_rungs and plan.description.get("floor") is None:
            # FedAvg's first trial, alone: it measures the costs and sets the first rung's floor
            lim = limits(before, 0, plan.reference)
            if lim is not None:
                ref = plan.entry(plan.reference)
                run_one({"algorithm": ref.entry, **{ref.param(k): v for k, v in _centre(ref).items()}}, lim, True)
                seed += 1
                floor = apply_floor(plan, _trials(plan))
                if floor is not None:
                    echo(f"select: first rung at {_rounds(plan.rungs[0])}; the floor: {floor['text']}")
        if jobs <= 1:
            while True:
                trials = _trials(plan)
                owed = _unlooked(plan, trials)
                points = sorted(_points(plan, _open(plan, seed)), key=lambda p: p["algorithm"] not in owed)
                point = points[0] if points else _owed_reference(plan, trials)
                lim = limits(trials, 0, point["algorithm"] if point else None)
                if lim is None:
                    break
                run_one(point, lim)
                seed += 1
        else:
            _search_pool(plan, jobs, st, limits, end, progress, started, seed)
    finally:
        plan.description["spent"] = plan.description.get("spent", 0.0) + (time.time() - started)


def _search_pool(plan: Select, jobs: int, st: Any, limits: Callable[..., Any], end: float | None,
                 progress: Callable[[float], None] | None, started: float, seed: int) -> None:
    """The search's trials ``jobs`` at a time in a pool of processes, each within the limits
    :func:`search` gives when it starts."""
    with run_pool(jobs) as pool:
        running: dict[Any, tuple[int, dict[str, Any] | None]] = {}  # future -> its round cap, its point
        while True:
            trials = _trials(plan)
            while len(running) < jobs:
                submitted = [p for _, p in running.values() if p is not None]
                owed = _unlooked(plan, trials, submitted)
                queued = sorted((p for p in _points(plan, st) if p not in submitted),
                                key=lambda p: p["algorithm"] not in owed)
                point = queued[0] if queued else _owed_reference(plan, trials, submitted)
                lim = limits(trials, sum(r[0] for r in running.values()), point["algorithm"] if point else None,
                             submitted)
                if lim is None:
                    break
                running[pool.submit(_worker, (plan, seed, point, *lim, end))] = (lim[0] or 0, point)
                seed += 1
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                running.pop(fut)
                fut.result()
            if progress is not None:
                progress(time.time() - started)


# ---------------------------------------------------------------------------------------
# Confirmation and the recommendation


def write_candidates(plan: Select, picked: Sequence[Mapping[str, Any]]) -> Path:
    """``candidates.yaml`` in ``best.yaml``'s format, so that ``compare ... tuned=`` takes it."""
    doc = {}
    for t in picked:
        entry = plan.entry(t["entry"])
        values = dict(t["values"])
        doc[t["entry"]] = {"overrides": values, "val_accuracy": t["score"], "trial": t["trial"],
                           "rounds": t["rounds"], "base": tune_base(entry.doc, list(values))}
    path = plan.root / CANDIDATES
    write_atomic(path, "# fedrift select: the confirmed entries' values (the best trial of each), in the format of "
                 f"a tune's {BEST}\n" + yamlio.dump(doc))
    return path


def write_recommendation(plan: Select, rec: Mapping[str, Any], picked: Sequence[Mapping[str, Any]]) -> Path:
    """``recommendation.yaml``: the base config with the chosen entry and its values; ``fedrift
    run -c`` takes it as it is (its runs go to the default folder)."""
    entry = plan.entry(rec["choice"])
    values = next(t["values"] for t in picked if t["entry"] == rec["choice"])
    doc = apply_overrides(entry.doc, [f"{k}={json.dumps(v)}" for k, v in values.items()])
    doc.pop("output", None)
    path = plan.root / RECOMMENDATION
    lines = ["# fedrift select: " + line for line in wrap(rec["text"])]
    write_atomic(path, "\n".join(lines) + "\n" + yamlio.dump(doc))
    return path


# ---------------------------------------------------------------------------------------
# The command


def probe(plan: Select, echo: Callable[[str], None] = print, entries: Sequence[Entry] | None = None) -> dict[str, Cost]:
    """A timed probe: each entry (``--dry-run``: all; the budget check: FedAvg) at its space's
    centre for a start-up and two rounds (one when ``train.rounds`` is 1), in a temporary
    folder removed after; its round times give the entry's per-round and start-up seconds on
    this machine."""
    import tempfile

    from fedrift.api import run

    out: dict[str, Cost] = {}
    with tempfile.TemporaryDirectory(prefix="fedrift-select-probe-") as tmp:
        for entry in plan.entries if entries is None else entries:
            doc = apply_overrides(entry.doc, [f"{k}={json.dumps(v)}" for k, v in _centre(entry).items()])
            doc["train"] = {**doc.get("train", {}), "rounds": min(2, plan.rounds)}
            doc["output"] = {"dir": str(Path(tmp) / entry.name), "overwrite": True, "progress": False, "save_model": False}
            doc["engine"] = {**(doc.get("engine") or {}), "checkpoint_every": 0}
            times: dict[int, float] = {}
            start = time.perf_counter()
            try:
                with interruptible():
                    run(doc, on_round=lambda row: times.setdefault(int(row["round"]), time.perf_counter() - start))
            except (DivergenceError, ConfigError) as err:
                echo(f"select: the probe of {entry.entry} failed ({str(err).splitlines()[0]}); its cost is assumed")
                continue
            total = time.perf_counter() - start
            if not times:
                continue
            last = max(times)
            got = cost_of_trial({"rounds": last, "seconds": times[last], "first_round": min(times),
                                 "first_seconds": times[min(times)]})
            if got is not None:  # the start-up with the run's end (its last evaluation, summary), as every run has
                out[entry.entry] = Cost(got[0], got[1] + max(0.0, total - times[last]), "probe")
    return out


def _tuning(plan: Select, trials: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per entry the tuning it got: trials, the furthest round, trials that ran every round;
    trials the budget stopped apart (``cut``): they are not its tuning."""
    out = {}
    for e in plan.entries:
        mine = [t for t in trials if t["entry"] == e.entry and t["state"] != "fail"]
        own = [t for t in mine if t["status"] != "budget"]
        out[e.entry] = {"trials": len(own), "furthest": max((t["rounds"] for t in own), default=0),
                        "full": sum(t["rounds"] >= plan.rounds for t in own), "cut": len(mine) - len(own)}
    return out


def _missing(plan: Select, trials: Sequence[Mapping[str, Any]], conf: Confirmation | None) -> list[str]:
    """What the search and the confirmation could not do, one line each."""
    out = []
    tuning = _tuning(plan, trials)
    none = [e for e, v in tuning.items() if not v["trials"] and not v["cut"]]
    if none:
        out.append(f"no trial of {', '.join(none)}")
    cut = [f"{e} ({v['cut']})" for e, v in tuning.items() if v["cut"]]
    if cut:
        out.append(f"trials stopped by the budget, not counted as tuning (a larger --budget on the same command runs "
                   f"their start-up points again): {', '.join(cut)}")
    ref = [t for t in trials if t["entry"] == plan.reference and t["curve"] and t["state"] != "fail"]
    shared = [r for r in plan.rungs if sum(r in t["curve"] for t in ref) >= 2]
    if ref and shared:
        at = shared[-1]
        best = max((t for t in ref if at in t["curve"]), key=lambda t: t["curve"][at])
        if best["rounds"] < plan.rounds:
            out.append(f"FedAvg's best setting at round {at} (trial {best['trial']}) stopped at round {best['rounds']} "
                       f"of {plan.rounds} ({best['status']})")
    others = sorted(v["trials"] for e, v in tuning.items() if e != plan.reference)
    if ref and others and tuning[plan.reference]["trials"] < statistics.median(others):
        out.append(f"FedAvg had {tuning[plan.reference]['trials']} trials, fewer than the median entry's "
                   f"{statistics.median(others):g} (the budget ended first)")
    if conf is not None and not conf.full:
        out.append(f"the confirmation ran {len(conf.entries) - 1} of {plan.top} candidate{'s' if plan.top > 1 else ''} "
                   f"and FedAvg over {len(conf.seeds)} of {len(plan.seeds)} seeds (what the budget could pay): a larger "
                   "--budget confirms the rest")
    return out


def _write_page(plan: Select, page: dict[str, Any], figures: bool) -> Path:
    """``select.html`` and ``select.md`` by the page's renderer; a plain page of the outcome, the
    plan and what is missing when the renderer does not take this page (it must exist in every
    ending)."""
    try:
        return render_select_page(plan.root, page, figures=figures)
    except (KeyError, TypeError, AttributeError, ValueError):
        lines = [f"# fedrift select: {page['outcome']}", ""]
        rec = page.get("recommendation")
        lines += [f"**{rec['text']}**", ""] if rec else []
        lines += [page["reason"], ""] if page.get("reason") else []
        lines += ["## The plan", "", *(f"- {ln}" for ln in page["plan"]["lines"]), ""]
        lines += ["## Missing", "", *(f"- {ln}" for ln in page["missing"]), ""] if page["missing"] else []
        write_atomic(plan.root / "select.md", "\n".join(lines))
        html = ["<!doctype html>", "<html><head><meta charset='utf-8'><title>fedrift select</title></head><body>",
                *(f"<p>{ln.replace('&', '&amp;').replace('<', '&lt;')}</p>" for ln in lines if ln), "</body></html>", ""]
        out = plan.root / "select.html"
        write_atomic(out, "\n".join(html))
        return out


def _recommend(plan: Select, rows: Any, picked: Sequence[Mapping[str, Any]], trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if plan.metric is not None:
        return recommend(plan, rows, picked, trials=trials, metric=plan.metric)
    try:
        return recommend(plan, rows, picked, trials=trials)
    except TypeError as err:  # a verdict without the tuning words
        if "trials" not in str(err):
            raise
        return recommend(plan, rows, picked)


def _stored(plan: Select) -> dict[str, Any]:
    """The folder's ``select.json`` ({} when there is none), refused when it holds a select of
    another config or field: ``seeds=`` and ``top=`` shape only the confirmation, a rerun may
    change them (more seeds: the runs already confirmed are reused)."""
    path = plan.root / STATE
    if not path.is_file():
        return {}
    stored = json.loads(path.read_text())
    asked = {k: v for k, v in plan.description.items() if k not in ("spent", "started", *CONFIRMATION)}
    was = {k: v for k, v in stored.items() if k not in ("spent", "started", "budget", *LATER, *CONFIRMATION)}
    if json.loads(json.dumps(asked, default=str)) != was:
        diff = [k for k in sorted(set(asked) | set(was)) if json.dumps(asked.get(k), default=str, sort_keys=True)
                != json.dumps(was.get(k), default=str, sort_keys=True)]
        raise ConfigError(f"--out: {plan.root} holds a select of another config or field (differs in "
                          f"{', '.join(diff)}); allowed: the same command again, or another folder")
    return stored


def check_budget(plan: Select, stored: Mapping[str, Any], jobs: int = 1, echo: Callable[[str], None] = print,
                 since: float | None = None) -> None:
    """Refuse, before anything is written, a budget that cannot pay for the least search and
    the least confirmation (:func:`~fedrift.experiments.select_plan.make_plan`), in one line
    naming the budget that would do. Costs: the folder's trials, else a timed probe of FedAvg
    (a start-up and two rounds, in a temporary folder), every entry assumed to cost as much.
    ``since``: the command's start (epoch seconds): what it spent so far (the field built, the
    probe) counts against ``--budget``. A select that confirmed before is not checked (its
    rerun reuses the confirmation, or searches on)."""
    if (stored.get("confirmation") or {}).get("entries"):
        return
    trials = _trials(plan)
    if plan.budget_seconds is not None and not measured_costs(trials, [e.entry for e in plan.entries]):
        echo(f"select: timing FedAvg (a start-up and {_rounds(min(2, plan.rounds))} at its space's centre, in a "
             "temporary folder) to check the budget")
        plan.probed = probe(plan, echo, [plan.entry(plan.reference)])
    bp = budget_plan(plan, trials, jobs, before=0.0 if since is None else time.time() - since)
    if bp["refused"]:
        raise ConfigError(bp["refused"])


def confirmation_to_run(plan: Select, ranked: Sequence[str], costs: Mapping[str, Cost],
                        trials: Sequence[Mapping[str, Any]], jobs: int,
                        done: Callable[[str, int], bool]) -> tuple[Confirmation, str | None]:
    """The confirmation after the search: the largest that fits what is left, kept back with its
    margin; else the least (FedAvg and the best candidate over two seeds), run past the budget,
    with the line saying so: a budget that passed :func:`check_budget` always ends with an answer."""
    left_s = None if plan.budget_seconds is None else plan.budget_seconds - plan.description["spent"]
    left_r = None if plan.budget_rounds is None else plan.budget_rounds - _spent(plan, trials)
    conf = fit_confirmation(ranked, plan.seeds, plan.rounds, costs, estimate_room(left_s, plan.overhead), left_r, jobs,
                            done=done)
    over = None
    if conf is None:
        conf = fit_confirmation(ranked[:2], plan.seeds[:LEAST_SEEDS], plan.rounds, costs, None, None, jobs, done=done)
        need = (f"about {duration_text(kept_back(conf.seconds, plan.overhead))} with its margin" if left_s is not None
                and conf.seconds is not None else _rounds(conf.rounds))
        left = duration_text(max(left_s, 0.0)) if left_s is not None else _rounds(max(left_r or 0, 0))
        over = (f"the search left {left} and the least confirmation (FedAvg and {ranked[1]} over {LEAST_SEEDS} seeds) "
                f"needs {need}: it runs all the same, and may pass the budget (the runs cost more than the estimate "
                "the budget was checked with)")
    full = list(conf.entries) == list(ranked) and list(conf.seeds) == list(plan.seeds)
    return replace(conf, full=full), over


def _shown_plan(plan: Select, before: Mapping[str, Any], final: Mapping[str, Any], conf: Confirmation | None,
                over: str | None) -> dict[str, Any]:
    """The plan the page shows: the plan made before the search, its confirmation line replaced
    by the confirmation that ran (with a line saying it was re-planned, when its shape changed),
    its search line said as planned, and the costs measured by the end."""
    lines, planned = [], before.get("confirmation")
    for line in before["lines"]:
        if line.startswith("confirmation: ") and conf is not None:
            ran = {"entries": conf.entries, "seeds": conf.seeds, "seconds": conf.seconds, "runs": conf.runs,
                   "full": conf.full}
            lines.append("confirmation (what ran): " + confirmation_line(ran, plan.seeds, plan.top, plan.rounds)[14:])
            if planned is None or (len(planned["entries"]), len(planned["seeds"])) != (len(conf.entries), len(conf.seeds)):
                lines.append(f"re-planned: the plan before the search was {line[14:]}; the confirmation was fitted "
                             "again to what the search left, at the costs its trials measured"
                             + ("; the least one, though the search left less than it needs (what is missing says "
                                "by how much)" if over else ""))
        elif line.startswith("search: "):
            lines.append("search (as planned before it ran): " + line[8:])
        else:
            lines.append(line)
    lines += [f"at the end: {line}" for line in final["lines"] if line.startswith(("costs on this machine", "refused"))]
    return {**before, "lines": lines, "final": final}


def select(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    budget: str | float | None = None,
    budget_rounds: int | None = None,
    seeds: Sequence[int] | None = None,
    top: int = 3,
    jobs: int = 1,
    startup: int = 2,
    min_rounds: int | None = None,
    eta: int = 3,
    pruner: str = "sha",
    space: Mapping[str, Any] | None = None,
    report: bool = True,
    verbose: bool = True,
    dry_run: bool = False,
    metric: str | None = None,
) -> dict[str, Any]:
    """Search (algorithm, hyper-parameters) within the budget, confirm the best over seeds
    against FedAvg, and recommend (see the module docstring). Returns the recommendation
    (``choice``, ``verdict``, ``text``) with ``outcome``, ``trials`` and the confirmation's
    ``rows``; ``dry_run``: prints the plan and returns it (``plan``), writing nothing.
    ``metric``: ``report.metric`` (``accuracy``, ``local_accuracy``, ``local_accuracy_worst10``),
    what the recommendation ranks the confirmed entries on and judges the gain on.

    ``fedrift.select("my.yaml", budget="2h", jobs=2, out="runs/select")``
    """
    from fedrift.experiments.compare import compare

    if jobs < 1:
        raise ConfigError(f"jobs: must be at least 1 (got {jobs})")
    began = time.time()  # --budget is the whole command's wall clock
    echo = print if verbose else (lambda _msg: None)
    metric = check_metric(metric)  # refused before anything runs
    plan = build_select(config, algorithms, overrides, out, budget, budget_rounds, seeds, top, startup, min_rounds, eta,
                        pruner, space)
    plan.metric = metric
    load_optuna()
    plan.overhead = REPORT_OVERHEAD_S if report else OVERHEAD_S
    if dry_run:
        return dry_run_plan(plan, jobs, echo)
    stored = _stored(plan)
    previous = stored.get("confirmation") or {}
    more_seeds = bool(previous.get("entries")) and list(previous.get("asked", [])) != list(plan.seeds)
    check_budget(plan, stored, jobs, echo, began)  # refused here: nothing written
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(plan.root)
        lock = FolderLock(plan.root, "--out")
    with lock:
        state_path = plan.root / STATE
        stored = _stored(plan)  # again, under the lock
        before = time.time() - began  # the field built, FedAvg timed
        plan.description["spent"] = float(stored.get("spent", 0.0)) + before
        for key in LATER:
            if stored.get(key) is not None:
                plan.description[key] = stored[key]

        def save(running: float = 0.0) -> None:  # running: seconds of a search still going
            doc = {k: v for k, v in plan.description.items() if k != "started"}
            doc["spent"] = doc.get("spent", 0.0) + running
            doc["budget"] = {"seconds": plan.budget_seconds, "rounds": plan.budget_rounds}
            write_atomic(state_path, json.dumps(doc, indent=1, default=str) + "\n")  # whole, whenever the process ends

        state: dict[str, Any] = {"conf": None, "picked": [], "rows": None, "over": None, "past": None}
        upfront: dict[str, Any] = {}

        def page(outcome: str, reason: str | None, rec: Mapping[str, Any] | None = None) -> Path:
            trials = _trials(plan)
            conf: Confirmation | None = state["conf"]
            bp = budget_plan(plan, trials, jobs)
            shown = _shown_plan(plan, upfront.get("plan") or bp, bp, conf, state["over"])
            confirm = plan.root / "confirm"
            missing = _missing(plan, trials, conf) + [line for line in (state["over"], state["past"]) if line]
            doc = {"outcome": outcome, "reason": reason, "recommendation": rec, "plan": shown,
                   "missing": missing + ([] if conf is not None or outcome == "stopped" else
                                         ["no confirmation: nothing was run over seeds"]),
                   "trials": trials, "picked": state["picked"], "rungs": plan.rungs,
                   "entries": [e.entry for e in plan.entries], "left_out": plan.left_out, "rounds": plan.rounds,
                   "setting": plan.setting,
                   "tuning": _tuning(plan, trials),
                   "budget": {"seconds": plan.budget_seconds, "rounds": plan.budget_rounds,
                              "spent_seconds": plan.description.get("spent", 0.0),
                              "spent_rounds": _spent(plan, trials) + (conf.rounds if conf is not None else 0)},
                   "seeds": conf.seeds if conf is not None else plan.seeds, "asked_seeds": plan.seeds,
                   "confirm": str(confirm) if confirm.is_dir() else None}
            return _write_page(plan, doc, report and outcome in ("recommended", "provisional"))

        def ended(outcome: str, reason: str) -> ConfigError:
            path = page(outcome, reason)
            echo(f"select: {outcome}: the page is {path}")
            return ConfigError(f"{reason}; the page: {path}")

        try:
            upfront["plan"] = budget_plan(plan, _trials(plan), jobs, before=before)
            save()
            if more_seeds:
                echo(f"select: seeds changed after a confirmation: confirming {', '.join(previous['entries'])} over seeds "
                     f"{','.join(map(str, plan.seeds))}, outside the search's budget (no trial runs)")
            else:
                try:
                    search(plan, jobs, echo, save)
                finally:
                    save()
            started = time.time()  # the confirmation's time, from the search's end
            trials = _trials(plan)
            picked = candidates(plan, trials)
            if more_seeds:
                picked = [t for t in picked if t["entry"] in previous["entries"]]
            if not picked or picked[0]["entry"] != plan.reference or len(picked) < 2:
                raise ended("no recommendation", f"--budget: the search finished no trial of FedAvg and of another entry "
                            f"({len(trials)} trials); nothing to confirm: run the same command with a larger budget "
                            "(the trials are kept)")
            tuned = write_candidates(plan, picked)
            done = _finished_runs(plan, [t["entry"] for t in picked], tuned, jobs)
            ranked = [t["entry"] for t in picked]
            costs = measured_costs(trials, [e.entry for e in plan.entries], plan.probed)
            if more_seeds:
                conf = Confirmation(ranked, list(plan.seeds), None, len(ranked) * len(plan.seeds) * plan.rounds,
                                    len(ranked) - 1 >= plan.top)
            else:
                conf, state["over"] = confirmation_to_run(plan, ranked, costs, trials, jobs, lambda e, s: (e, s) in done)
                if state["over"]:
                    echo(f"select: {state['over']}")
            state["conf"], state["picked"] = conf, [t for t in picked if t["entry"] in conf.entries]
            picked = state["picked"]
            tuned = write_candidates(plan, picked)
            echo("select: confirming " + ", ".join(f"{t['entry']} (val {t['score']:.4f} at {t['rounds']} rounds)" for t in picked)
                 + f" over seeds {','.join(map(str, conf.seeds))}"
                 + ("" if conf.full else f" (what the budget pays for of {plan.top} candidate{'s' if plan.top > 1 else ''} "
                                         f"and FedAvg over {len(plan.seeds)} seeds)"))
            try:  # the time of a confirmation stopped by Ctrl-C counts too
                rows = compare(plan.description["base"], algorithms=[t["entry"] for t in picked], seeds=conf.seeds,
                               out=plan.root / "confirm", jobs=jobs, tuned=tuned, verbose=verbose, report=report,
                               report_options={"reference": REFERENCE, "tsne": "none",
                                               **({"metric": plan.metric} if plan.metric else {})})
            finally:
                plan.description["spent"] += time.time() - started
                spent = plan.description["spent"]
                if plan.budget_seconds is not None and spent > plan.budget_seconds and not more_seeds:
                    state["past"] = (f"past the budget: the select took {_clock(spent)} of a "
                                     f"{_clock(plan.budget_seconds)} --budget, {_clock(spent - plan.budget_seconds)} "
                                     "more (its runs cost more than estimated)")
                if not more_seeds or not previous:
                    plan.description["confirmation"] = {"entries": conf.entries, "seeds": conf.seeds,
                                                        "asked": list(plan.seeds), "full": conf.full}
                else:
                    plan.description["confirmation"] = {**previous, "seeds": conf.seeds, "asked": list(plan.seeds)}
                save()
            rec = _recommend(plan, rows, picked, trials)
            outcome = "recommended" if conf.full else "provisional"
            path = write_recommendation(plan, rec, picked)
            html_path = page(outcome, None if conf.full else _missing(plan, trials, conf)[-1], rec)
            echo(f"select: {rec['text']}")
            echo(f"recommendation in {path} (fedrift run -c {path}); report in {html_path}")
            return {**rec, "outcome": outcome, "trials": trials, "rows": rows, "recommendation": str(path),
                    "confirmed": {"entries": conf.entries, "seeds": conf.seeds}}
        except KeyboardInterrupt:
            with shielded():
                save()
                try:  # the page is a courtesy here: the interrupt, and its one line, come first
                    page("stopped", "stopped by Ctrl-C: run the same command again to continue (finished trials and "
                         "runs are kept)")
                except Exception:  # noqa: BLE001
                    pass
            raise


def dry_run_plan(plan: Select, jobs: int = 1, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """``--dry-run``: the plan from a timed probe of each entry (:func:`probe`); no study, no
    folder. When the folder holds a select, its trials' costs are read instead (nothing written)."""
    trials: list[dict[str, Any]] = []
    if (plan.root / STUDY_DB).is_file():
        trials = _trials(plan)
        how = f"times from the {len(trials)} trials in {plan.root}"
    else:
        echo(f"select --dry-run: probing {len(plan.entries)} entries (a start-up and {_rounds(min(2, plan.rounds))} each, "
             "at its space's centre, in a temporary folder) to estimate the time on this machine")
        started = time.time()
        plan.probed = probe(plan, echo)
        how = (f"times from a timed probe of each entry: a start-up and {_rounds(min(2, plan.rounds))} at its space's "
               f"centre ({duration_text(time.time() - started)} in all)")
    # the command itself times FedAvg first (check_budget) when its folder holds no trial: that counts too
    before = plan.probed[plan.reference].run(min(2, plan.rounds)) if not trials and plan.budget_seconds is not None \
        and plan.reference in plan.probed else 0.0
    bp = budget_plan(plan, trials, jobs, before=before)
    rungs = "the first rung at least where FedAvg's first trial moves off the majority class" if plan.auto_rungs else ""
    lines = [*bp["lines"], f"estimate: {how}; a confirmation run costs its start-up and its rounds, "
             f"{jobs} at a time" + (f"; {rungs}" if rungs else ""), "nothing was written (dry run)"]
    for line in lines:
        echo(f"select --dry-run: {line}")
    return {"outcome": "dry run", "plan": {**bp, "lines": lines}}


__all__ = ["Select", "budget_plan", "build_select", "candidates", "check_budget", "confirmation_to_run", "dry_run_plan",
           "floor_round", "judged_from",
           "parse_duration", "probe", "ranking", "recommend", "score_of", "search", "select"]
