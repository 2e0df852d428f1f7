"""``fedrift select``: which drift remedy for this federation, within a compute budget, with
the evidence.

The search
    One Optuna study over (algorithm, its hyper-parameters) as a single conditional space: a
    categorical ``algorithm`` choice, then that entry's own space (the learning rate and its
    registry entry's, as ``fedrift tune`` searches it; parameters named ``<entry>/<key>``).
    Every entry first runs ``startup`` points: the centre of its space (the geometric middle
    of a log range), then its Sobol design's first points, so each gets a look at a sensible
    setting before an extreme one; then TPE proposes (entry and values together), so the
    budget flows to the methods that do well on this data. Trials run the config's full ``train.rounds`` under successive
    halving (asynchronous, Optuna's ``SuccessiveHalvingPruner``; ``pruner=hyperband`` for
    Hyperband): at each rung (``min_rounds`` x ``eta``^k rounds) a trial goes on only while its
    best validation accuracy so far is in the top 1/``eta`` of the trials that reached the
    rung, and while it beats every trial already stopped at that rung (ties with a stopped
    trial stop too: trials stuck at chance level would otherwise promote each other). FedAvg's
    first point (its space's centre) is never stopped by a rung: the reference of every gain
    runs its full rounds (one trial's worth of the budget). Scores are validation accuracy of
    the global model (``calibrated_val_accuracy`` for CCVR, whose output is the calibrated
    model); the test set is not read by the search.

The budget
    ``--budget 2h`` (wall clock of the whole command) and/or ``--budget-rounds N`` (training
    rounds of every trial and confirmation run, each round counting one). The confirmation's
    share is kept back: ``(top + 1) x seeds x train.rounds`` rounds, and in time the
    candidates' measured seconds per round times that. The search stops starting trials when
    what is left would not also pay for the confirmation; a budget that cannot pay for the
    confirmation and one trial per entry is refused before anything runs, and a search that
    leaves no time for it is said, with no recommendation. Time spent before a Ctrl-C counts;
    a rerun's time check counts only the confirmation runs not finished (compare reuses them).

The confirmation
    The best ``top`` entries (by their best trial: the most rounds reached, then the score)
    and FedAvg at its own best trial run again at ``seeds`` other than the search's, through
    ``fedrift compare`` (``<out>/confirm``, its report beside). The recommendation is the
    entry with the best mean validation accuracy there, stated with its paired gain in test
    accuracy (at the best validation round) over FedAvg and the interval; when that gain is
    not significant by the project's rule (exact sign-flip p < 0.05 and the t interval
    excluding 0, so at least 6 seeds), it says so plainly, and when the interval does not
    exclude 0 the answer is FedAvg at its own setting (where it does, the candidate is
    recommended as "ahead, not tested" below 6 seeds, "ahead, not significant" from 6). The same command with more ``seeds``
    (or another ``top``) keeps the search and reuses the confirmation runs that finished: three
    seeds cannot make a gain significant, six can.

The folder
    ``study.db`` (the study), ``select.json`` (what was asked, the budget spent), ``trials/``,
    ``candidates.yaml`` (the confirmed entries' values, in ``best.yaml``'s format: ``tuned=``
    takes it), ``confirm/``, ``recommendation.yaml`` (a config ``fedrift run -c`` takes as
    it is), ``select.md`` and ``select.html``. Run the same command again to continue it
    (finished trials are kept; a larger budget searches on).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from fedrift.config import Config, apply_overrides, config_dict, entry_doc
from fedrift.engine.folder_lock import FolderLock
from fedrift.errors import ConfigError, DivergenceError, writing
from fedrift.experiments.naming import safe_name
from fedrift.experiments.pool import interruptible, run_pool, shielded
from fedrift.experiments.space import Dim, resolve_space, startup_points
from fedrift.experiments.studies import fail_stale, finished_trials, fixed_sampler_class, load_optuna, one_trial
from fedrift.experiments.tuned import BEST, tune_base
from fedrift.overrides import parse_algorithm
from fedrift.experiments.select_verdict import REFERENCE, recommend, values_text, wrap
from fedrift.report.select_page import duration_text, render_select_page

CONFIRMATION = ("seeds", "top")  # what a rerun of the same select may change
STUDY = "select"
STUDY_DB = "study.db"
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

    @property
    def storage(self) -> str:
        return f"sqlite:///{(self.root / STUDY_DB).resolve()}"

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
        entries.append(Entry(entry, folder, dims, doc))

    if len(entries) < 2:
        raise ConfigError("algorithms: select needs FedAvg and at least one other entry that builds on this config"
                          + (f" (left out: {'; '.join(f'{k}: {v}' for k, v in left_out.items())})" if left_out else ""))
    plan = Select(Path(out) if out is not None else Path("runs") / (
        f"select-{Path(config).stem}" if isinstance(config, (str, Path)) else "select"),
        entries, left_out, rounds, seed, seed_list, min(top, len(entries) - 1), startup, r0, eta, pruner,
        seconds, budget_rounds)
    need = plan.confirmation_rounds + len(entries) * plan.rungs[0]
    if budget_rounds is not None and budget_rounds < need:
        raise ConfigError(
            f"--budget-rounds: {budget_rounds} leaves nothing to search with: confirming {plan.top} candidates and "
            f"FedAvg over {len(seed_list)} seeds of {rounds} rounds takes {plan.confirmation_rounds} rounds, and one "
            f"trial of each of the {len(entries)} entries to the first rung {len(entries) * plan.rungs[0]}; allowed: "
            f"at least {need}, or fewer top=, seeds=, algorithms= or train.rounds")
    plan.description = {
        "version": 1, "base": base, "entries": {e.entry: {k.key: k.describe() for k in e.dims} for e in entries},
        "left_out": left_out, "rounds": rounds, "seed": seed, "seeds": seed_list, "top": plan.top,
        "startup": startup, "min_rounds": r0, "eta": eta, "pruner": pruner,
    }
    return plan


# ---------------------------------------------------------------------------------------
# The search


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
        return optuna.create_study(study_name=STUDY, storage=plan.storage, direction="maximize", load_if_exists=True,
                                   sampler=sampler, pruner=_pruner(plan))


def _points(plan: Select, st: Any) -> list[dict[str, Any]]:
    """The start-up design's points no finished trial has run: ``startup`` per entry, the
    space's centre first and then its Sobol design, in turns (every entry's first point, then
    every entry's second...). The centre first, because a design's first scrambled point may
    lie at an extreme (a learning rate of 0.25 on workload A) where every method fails alike."""
    per = [[{"algorithm": e.entry, **{e.param(k): v for k, v in p.items()}}
            for p in [_centre(e), *startup_points(e.dims, plan.startup - 1, plan.seed)]]
           for e in plan.entries]
    seen = {json.dumps(t.params, sort_keys=True) for t in finished_trials(st)}
    order = [p for k in range(plan.startup) for pts in per for p in pts[k:k + 1]]
    return [p for p in order if json.dumps(p, sort_keys=True) not in seen]


def _centre(entry: Entry) -> dict[str, Any]:
    """The centre of an entry's space: its first start-up point."""
    return {d.key: d.at(0.5) for d in entry.dims}


def _objective(plan: Select, echo: Callable[[str], None], threads_one: bool, cap: int | None = None,
               deadline: float | None = None) -> Callable[[Any], float]:
    """A trial: the entry and values the sampler gives, run to the full rounds unless the
    pruner stops it at a rung, or the budget at ``cap`` rounds or at the ``deadline`` (epoch
    seconds: what is left once the confirmation's share is kept back)."""
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
        shown = f"{choice} ({values_text(values)})"
        # FedAvg at its space's centre runs every round, pruner or not: the reference that every
        # gain is measured against is not judged after 3 rounds (where a method with server
        # momentum leads by luck of the start); the budget still stops it
        protected = parse_algorithm(choice)[0] == REFERENCE and values == _centre(entry)
        best = [-math.inf]
        rungs = set(plan.rungs)
        start = time.perf_counter()

        def on_round(row: dict[str, Any]) -> None:
            score = score_of(row)
            if score is None:
                return
            rnd = int(row["round"])
            with shielded():
                best[0] = max(best[0], score)
                trial.report(best[0], rnd)
                trial.set_user_attr("rounds", rnd)
                trial.set_user_attr("seconds", time.perf_counter() - start)
                prune = not protected and (trial.should_prune()
                                           or (rnd in rungs and _no_better_than_stopped(plan, trial, rnd, best[0])))
                if prune:
                    trial.set_user_attr("status", "pruned")
            over = (cap is not None and rnd >= cap and rnd < plan.rounds) or (
                deadline is not None and time.time() > deadline and rnd < plan.rounds)
            if over and not prune:
                prune = True
                with shielded():
                    trial.set_user_attr("status", "budget")
            if rnd in rungs or prune:
                left = "" if deadline is None else f"; {duration_text(max(0.0, deadline - time.time()))} of the search's budget left"
                what = "stopped by the budget" if over else "stopped" if prune else "goes on" if rnd < plan.rounds else "done"
                echo(f"trial {trial.number} {shown}: {rnd} rounds, val {best[0]:.4f}, {what}{left}")
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


def _worker(args: tuple[Select, int, dict[str, Any] | None, int | None, float | None]) -> None:
    """A pool process: one trial (a start-up point, or TPE's proposal) within its limits."""
    plan, seed, point, cap, deadline = args
    one_trial(_open(plan, seed, point), _objective(plan, print, True, cap, deadline))


def _trials(plan: Select) -> list[dict[str, Any]]:
    """Every trial as plain data (entry, values, rounds reached, best validation score so far
    at each reported round, status, seconds): what the budget, the ranking and the page read.
    ``charged``: the rounds the budget counts, at least the first rung's for a trial that
    ended, so that trials ending before any scored round (an entry that fails at once, a
    divergence in round 1) still spend budget and a search cannot loop on them for free."""
    optuna = load_optuna()
    st = optuna.load_study(study_name=STUDY, storage=plan.storage)
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
    return out


def _seconds_per_round(trials: Sequence[Mapping[str, Any]], entry: str) -> float | None:
    own = [t["seconds"] / t["rounds"] for t in trials if t["entry"] == entry and t["rounds"] and t["seconds"]]
    every = [t["seconds"] / t["rounds"] for t in trials if t["rounds"] and t["seconds"]]
    pick = own or every
    return sum(pick) / len(pick) if pick else None


def ranking(plan: Select, trials: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per entry its best trial (most rounds reached, then the best validation score), best
    first: the order in which entries are confirmed."""
    best: dict[str, dict[str, Any]] = {}
    for t in trials:
        if t["score"] is None or not math.isfinite(t["score"]) or t["status"] == "diverged":
            continue
        key = (t["rounds"], t["score"])
        if t["entry"] not in best or key > (best[t["entry"]]["rounds"], best[t["entry"]]["score"]):
            best[t["entry"]] = t
    return sorted(best.values(), key=lambda t: (t["rounds"], t["score"]), reverse=True)


def candidates(plan: Select, trials: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``top`` best entries and FedAvg's best trial (the reference)."""
    ranked = ranking(plan, trials)
    others = [t for t in ranked if parse_algorithm(t["entry"])[0] != REFERENCE][: plan.top]
    ref = next((t for t in ranked if parse_algorithm(t["entry"])[0] == REFERENCE), None)
    return ([ref] if ref is not None else []) + others


def _confirmation_seconds(plan: Select, trials: Sequence[Mapping[str, Any]], jobs: int) -> float:
    picked = candidates(plan, trials) or []
    per = [_seconds_per_round(trials, t["entry"]) for t in picked]
    if not per or any(p is None for p in per):
        return 0.0
    runs = len(plan.seeds)
    return sum(p * plan.rounds * runs for p in per) / max(1, min(jobs, runs * len(per)))


def _to_confirm(plan: Select, picked: Sequence[Mapping[str, Any]], tuned: Path, jobs: int) -> float:
    """The share of the confirmation's runs not finished in ``<out>/confirm``: a rerun of a
    select reuses the finished ones (compare's rule), so only the others need time."""
    from fedrift.experiments.grid import build_grid, run_state

    if not (plan.root / "confirm").is_dir():
        return 1.0
    grid = build_grid(plan.description["base"], [t["entry"] for t in picked], plan.seeds, out=plan.root / "confirm",
                      jobs=jobs, tuned=tuned)
    return sum(run_state(r)[0] != "reuse" for r in grid.runs) / max(1, len(grid.runs))


def _spent(plan: Select, trials: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(t["charged"]) for t in trials)


def search(plan: Select, jobs: int = 1, echo: Callable[[str], None] = print,
           progress: Callable[[float], None] | None = None) -> None:
    """Run trials while the budget, less what the confirmation will need, lasts; ``progress``
    is told the seconds spent so far after each trial (select records them: a search killed
    outright, by SIGKILL or a machine lost, still has its time counted)."""
    optuna = load_optuna()
    started = time.time()
    plan.description["started"] = started
    with shielded():
        st = optuna.create_study(study_name=STUDY, storage=plan.storage, direction="maximize", load_if_exists=True)
    stale = fail_stale(st)
    before = _trials(plan)
    echo(f"select: {len(plan.entries)} entries, {len(before)} trials before" + (f" ({stale} left running marked failed)" if stale else "")
         + f"; rungs at {', '.join(map(str, plan.rungs))} rounds; confirmation: top {plan.top} and FedAvg x "
         f"{len(plan.seeds)} seeds x {plan.rounds} rounds")
    for entry, why in plan.left_out.items():
        echo(f"select: {entry} left out: {why}")

    def limits(trials: Sequence[Mapping[str, Any]], reserved: int) -> tuple[int | None, float | None] | None:
        """The next trial's round cap and deadline, or None when the budget has no room for it:
        rounds left once the confirmation's and the running trials' caps are kept back; time
        left once the confirmation's estimate is."""
        cap = deadline = None
        if plan.budget_rounds is not None:
            done = sum(int(t["charged"]) for t in trials if t["state"] != "running")
            left = plan.budget_rounds - plan.confirmation_rounds - done - reserved
            if left < plan.rungs[0]:
                return None
            cap = min(plan.rounds, left)
        if plan.budget_seconds is not None:
            deadline = started + plan.budget_seconds - plan.description.get("spent", 0.0) \
                - _confirmation_seconds(plan, trials, jobs)
            finished = sorted(t["seconds"] for t in trials if t["seconds"] and t["state"] != "running")
            typical = finished[len(finished) // 2] if finished else 0.0
            if time.time() + min(typical, 60.0) > deadline:
                return None
        return cap, deadline

    seed = plan.seed + 1 + len(before)
    try:  # the time of a search stopped by Ctrl-C counts too
        if jobs <= 1:
            while (lim := limits(_trials(plan), 0)) is not None:
                points = _points(plan, _open(plan, seed))
                one_trial(_open(plan, seed, points[0] if points else None), _objective(plan, echo, False, *lim))
                seed += 1
                if progress is not None:
                    progress(time.time() - started)
        else:
            with run_pool(jobs) as pool:
                running: dict[Any, int] = {}  # future -> its round cap
                queued = _points(plan, st)
                while True:
                    trials = _trials(plan)
                    while len(running) < jobs and (lim := limits(trials, sum(running.values()))) is not None:
                        point = queued.pop(0) if queued else None
                        running[pool.submit(_worker, (plan, seed, point, *lim))] = lim[0] or 0
                        seed += 1
                    if not running:
                        break
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        running.pop(fut)
                        fut.result()
                    if progress is not None:
                        progress(time.time() - started)
    finally:
        plan.description["spent"] = plan.description.get("spent", 0.0) + (time.time() - started)


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
    path.write_text("# fedrift select: the confirmed entries' values (the best trial of each), in the format of "
                    f"a tune's {BEST}\n" + yaml.safe_dump(doc, sort_keys=False))
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
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------
# The command


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
) -> dict[str, Any]:
    """Search (algorithm, hyper-parameters) within the budget, confirm the best over seeds
    against FedAvg, and recommend (see the module docstring). Returns the recommendation
    (``choice``, ``verdict``, ``text``) with ``trials`` and the confirmation's ``rows``.

    ``fedrift.select("my.yaml", budget="2h", jobs=2, out="runs/select")``
    """
    from fedrift.experiments.compare import compare

    if jobs < 1:
        raise ConfigError(f"jobs: must be at least 1 (got {jobs})")
    echo = print if verbose else (lambda _msg: None)
    plan = build_select(config, algorithms, overrides, out, budget, budget_rounds, seeds, top, startup, min_rounds, eta,
                        pruner, space)
    load_optuna()
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        plan.root.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(plan.root, "--out")
    with lock:
        state_path = plan.root / STATE
        if state_path.is_file():
            stored = json.loads(state_path.read_text())
            # the search's identity; seeds= and top= shape only the confirmation: a rerun may
            # change them (more seeds: the runs already confirmed are reused)
            asked = {k: v for k, v in plan.description.items() if k not in ("spent", "started", *CONFIRMATION)}
            was = {k: v for k, v in stored.items() if k not in ("spent", "started", "budget", *CONFIRMATION)}
            if json.loads(json.dumps(asked, default=str)) != was:
                diff = [k for k in sorted(set(asked) | set(was)) if json.dumps(asked.get(k), default=str, sort_keys=True)
                        != json.dumps(was.get(k), default=str, sort_keys=True)]
                raise ConfigError(f"--out: {plan.root} holds a select of another config or field (differs in "
                                  f"{', '.join(diff)}); allowed: the same command again, or another folder")
            plan.description["spent"] = float(stored.get("spent", 0.0))

        def save(running: float = 0.0) -> None:  # running: seconds of a search still going
            doc = {k: v for k, v in plan.description.items() if k != "started"}
            doc["spent"] = doc.get("spent", 0.0) + running
            doc["budget"] = {"seconds": plan.budget_seconds, "rounds": plan.budget_rounds}
            tmp = state_path.with_name(state_path.name + ".tmp")  # whole, whenever the process ends
            tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
            os.replace(tmp, state_path)

        save()
        try:
            search(plan, jobs, echo, save)
        finally:
            save()
        trials = _trials(plan)
        picked = candidates(plan, trials)
        if not picked or parse_algorithm(picked[0]["entry"])[0] != REFERENCE or len(picked) < 2:
            raise ConfigError(f"--budget: the search finished no trial of FedAvg and of another entry ({len(trials)} "
                              "trials); nothing to confirm: run the same command with a larger budget (the trials are kept)")
        tuned = write_candidates(plan, picked)
        if plan.budget_seconds is not None:
            left = plan.budget_seconds - plan.description["spent"]
            need = _confirmation_seconds(plan, trials, jobs) * _to_confirm(plan, picked, tuned, jobs)
            if need > 0 and need > left:
                raise ConfigError(f"--budget: the search left {duration_text(max(left, 0))} and the confirmation needs about "
                                  f"{duration_text(need)}: no recommendation; run the same command with a larger --budget "
                                  "(the search is kept and goes on)")
        echo("select: confirming " + ", ".join(f"{t['entry']} (val {t['score']:.4f} at {t['rounds']} rounds)" for t in picked)
             + f" over seeds {','.join(map(str, plan.seeds))}")
        started = time.time()
        try:  # the time of a confirmation stopped by Ctrl-C counts too
            rows = compare(plan.description["base"], algorithms=[t["entry"] for t in picked], seeds=plan.seeds,
                           out=plan.root / "confirm", jobs=jobs, tuned=tuned, verbose=verbose, report=report,
                           report_options={"reference": REFERENCE, "tsne": "none"})
        finally:
            plan.description["spent"] += time.time() - started
            save()
        rec = recommend(plan, rows, picked)
        path = write_recommendation(plan, rec, picked)
        page = {"recommendation": rec, "trials": trials, "picked": picked, "rungs": plan.rungs,
                "entries": [e.entry for e in plan.entries], "left_out": plan.left_out, "rounds": plan.rounds,
                "budget": {"seconds": plan.budget_seconds, "rounds": plan.budget_rounds,
                           "spent_seconds": plan.description["spent"], "spent_rounds": _spent(plan, trials)
                           + plan.confirmation_rounds},
                "seeds": plan.seeds, "confirm": str(plan.root / "confirm")}
        html_path = render_select_page(plan.root, page, figures=report)
        echo(f"select: {rec['text']}")
        echo(f"recommendation in {path} (fedrift run -c {path}); report in {html_path}")
        return {**rec, "trials": trials, "rows": rows, "recommendation": str(path)}


__all__ = ["Select", "build_select", "candidates", "parse_duration", "ranking", "recommend", "score_of", "search", "select"]
