"""``fedrift tune``: per algorithm, an Optuna study of its learning rate and key hyper-parameters,
scored on validation accuracy, so that a comparison's baselines are tuned as its method is.

The space
    Every algorithm: ``train.lr`` (log-uniform, :data:`LR_SPACE`), plus the default space of its
    registry entry (``ALGORITHMS.register(..., space={"mu": "log:1e-4:1"})``; ``fedrift list``
    shows them). ``space.KEY=SPEC`` replaces or adds a dimension for every
    algorithm of the tune that takes KEY (a bare KEY is an algorithm option, a dotted one any
    config key); ``space.KEY=none`` removes it. SPEC: ``log:LOW:HIGH``, ``float:LOW:HIGH``,
    ``int:LOW:HIGH`` or a list of values ``0.01,0.05,0.1``. When every dimension is a list the
    study is a grid (every combination once, trials capped at the grid's size). Otherwise its
    first :data:`STARTUP` trials are the points of a scrambled Sobol design, and TPE proposes
    the rest: a small budget then spreads over the whole range (with 2**m trials, one in each
    2**-m-th of every dimension) instead of wherever a few random draws fall, and the
    learning rate has a design of its own, so every study of a tune tries the same rates.

Scoring and pruning
    A trial is one run of the config with the trial's values, scored by its best
    ``val_accuracy`` over the evaluated rounds (``val_local_accuracy`` for personal models,
    ``calibrated_val_accuracy`` for a calibrated one, CCVR's: see :func:`score_of`), or, for a
    run that personalises after training (``eval.personalize``), its personalised models'
    ``personalized_val_accuracy``: the test set is never read by the tuner; the
    pruner (median by default) sees each round's score so far (the best validation accuracy up
    to that round: at strong label skew one round's accuracy swings by tens of points) and,
    from the middle round on, stops trials that fall behind the median of earlier trials at
    the same round. A trial that diverges is
    pruned and marked ``diverged``. The config needs a validation split (``partition.val_share``).

The tune folder
    ``study.db`` (SQLite: the studies, one per algorithm entry), ``tune.json`` (what was asked),
    ``trials/<entry>/trial<k>`` (each trial's run folder), ``best.yaml`` (per entry the best
    values as config overrides: what ``fedrift compare ... tuned=DIR`` reads; beside them the
    base they were chosen on, :func:`tune_base`, which ``compare`` checks its runs against, and
    the values at the edge of their range, :meth:`Dim.edge`), ``trials.csv``,
    ``tune.md`` and ``tune.html`` (the best trial's curves and the score against each
    hyper-parameter). Stop it at any time and run the same command again: finished trials are
    kept, trials left running are marked failed and run anew, and only the missing ones run;
    the stop itself writes ``best.yaml``, ``trials.csv`` and ``tune.md`` over the finished trials.
    ``--jobs N`` runs N trials at once, in processes sharing the study. A Ctrl-C records the
    trials in progress as interrupted (state ``fail``, status ``interrupted``) and starts no
    other; each saves the checkpoint of its last whole round, and the next tune runs its point
    first, as a new trial that takes over its folder and continues from that checkpoint (the
    rounds before reported to the pruner again from its metrics).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedrift import yamlio
from fedrift.config import Config, apply_overrides, config_dict, entry_doc
from fedrift.engine.folder_lock import FolderLock
from fedrift.errors import ConfigError, DivergenceError, writing
from fedrift.experiments.naming import safe_name
from fedrift.experiments.studies import (fail_stale, finished_trials, fixed_sampler_class, load_optuna,
                                         one_trial, study_storage, tell_outcome)
from fedrift.experiments.pool import interruptible, run_pool, shielded
from fedrift.experiments.space import Dim, resolve_space, startup_points, takes
from fedrift.experiments.stacked import wants_stack
from fedrift.experiments.tuned import BEST, tune_base
from fedrift.overrides import parse_algorithm
from fedrift.report.table import flatten, short_names
from fedrift.safe_files import make_dir, write_atomic

STARTUP = 10  # trials from the Sobol design before TPE proposes (TPE's own start-up count)
STACK_MOST = 48  # trials in one stack (engine.executor: stacked): the largest stack measured on a GPU
DESCRIPTION = "tune.json"


@dataclass
class Study:
    """One algorithm entry's study: its name in the database, its space, its fixed overrides."""

    entry: str  # as given: fedprox, moon:mu=5:model.projection_dim=256
    name: str  # the study's (and trial folders') name
    dims: list[Dim]
    doc: dict[str, Any]  # the base config with the entry's own overrides

    @property
    def grid(self) -> dict[str, list[Any]] | None:
        """The full grid when every dimension is a list of values, else None (TPE)."""
        if all(d.kind == "choice" for d in self.dims):
            return {d.key: list(d.choices) for d in self.dims}
        return None

    def trial_doc(self, root: Path, number: int, values: Mapping[str, Any], threads_one: bool) -> dict[str, Any]:
        doc = apply_overrides(self.doc, [f"{k}={json.dumps(v)}" for k, v in values.items()])
        doc["output"] = {**(doc.get("output") or {}), "dir": str(root / "trials" / self.name / f"trial{number}"),
                         "overwrite": True, "progress": False, "save_model": False}
        engine = {**(doc.get("engine") or {}), "checkpoint_every": 0}
        if threads_one and engine.get("workers") is None:
            engine["workers"] = 1
        doc["engine"] = engine
        return doc


@dataclass
class Tune:
    root: Path
    studies: list[Study]
    trials: int
    seed: int
    pruner: str
    description: dict[str, Any]

    @property
    def storage(self) -> str:
        return study_storage(self.root)


def build_tune(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    space: Mapping[str, Any] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    trials: int = 20,
    seed: int = 0,
    pruner: str = "median",
) -> Tune:
    """Expand and validate the tune (every study's config at a value inside its space, the
    validation split); nothing is written."""
    from dataclasses import replace

    from fedrift.api import build_run, prepare, resolve_options
    from fedrift.config import load_config

    if trials < 1:
        raise ConfigError(f"trials: must be at least 1 (got {trials})")
    if pruner not in ("median", "none"):
        raise ConfigError(f"pruner: {pruner!r}; allowed: median, none")
    overrides = list(overrides or [])
    for o in overrides:
        if o.partition("=")[0].strip().startswith("output."):
            raise ConfigError(f"{o.partition('=')[0]}: the tuner sets every trial's output keys (its folder in the tune "
                              "folder, no progress bar); allowed: --out for the tune folder, no output.* key")
    base = apply_overrides(config_dict(config), overrides)
    entries = list(algorithms) if algorithms else [str((base.get("algorithm") or {}).get("name", "fedavg"))]
    if len(set(entries)) != len(entries):
        raise ConfigError("algorithms: an entry is given twice")
    extra = dict(space or {})
    studies, names = [], set()
    for entry in entries:
        name = parse_algorithm(entry)[0]
        doc = entry_doc(base, entry)
        dims = resolve_space(name, extra)
        study_name = safe_name(entry.replace(":", "-"))
        if study_name in names:
            raise ConfigError(f"algorithms: {entry!r} gives the same study name as another entry")
        names.add(study_name)
        studies.append(Study(entry, study_name, dims, doc))
    for key in extra:
        if "." not in key and not any(takes(parse_algorithm(e)[0], key) for e in entries):
            raise ConfigError(f"space.{key}: no algorithm of the tune takes {key!r}; a dotted key (e.g. train.lr) "
                              "names any config key")

    for study in studies:  # validate a trial of each study, and the validation split
        probe = apply_overrides(study.doc, [f"{d.key}={json.dumps(d.middle())}" for d in study.dims])
        probe.pop("output", None)
        try:
            cfg = load_config(probe)
            if getattr(cfg.partition, "val_share", 0) <= 0:
                raise ConfigError(
                    "partition.val_share: the tuner scores trials on validation accuracy and never reads the test "
                    "set, so the clients need a validation share; allowed: a share in (0, 1), e.g. partition.val_share=0.1"
                )
            prep = prepare(cfg)
            build_run(replace(prep, options=resolve_options(cfg)))
        except ConfigError as err:
            raise ConfigError(f"{err} (in the study of {study.entry})") from None

    root = Path(out) if out is not None else Path("runs") / (
        f"tune-{Path(config).stem}" if isinstance(config, (str, Path)) else "tune")
    description = {
        "version": 1,
        "base": base,
        "studies": {s.name: {"entry": s.entry, "space": {d.key: d.describe() for d in s.dims}} for s in studies},
        "seed": seed,
        "pruner": pruner,
    }
    return Tune(root, studies, trials, seed, pruner, description)


def _sampler(study: Study, seed: int, point: Mapping[str, Any] | None = None) -> Any:
    """The one point this trial runs (a grid's or the start-up design's: the caller hands each
    missing point to one trial, so no point runs twice, in parallel too); else TPE."""
    optuna = load_optuna()
    if point is not None:
        return fixed_sampler_class()(dict(point))
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=STARTUP)


def _pruner(name: str, rounds: int) -> Any:
    optuna = load_optuna()
    if name == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=max(1, rounds // 2))


def _rounds(doc: Mapping[str, Any]) -> int:
    return int(((doc.get("train") or {}).get("rounds")) or 50)


def _open_study(tune: Tune, study: Study, seed: int, pruner: Any = None, point: Mapping[str, Any] | None = None) -> Any:
    optuna = load_optuna()
    with shielded():  # a database write: a Ctrl-C waits for its end
        return optuna.create_study(
            study_name=study.name, storage=tune.storage, direction="maximize", load_if_exists=True,
            sampler=_sampler(study, seed, point),
            pruner=pruner if pruner is not None else _pruner(tune.pruner, _rounds(study.doc)),
        )


PERSONAL = "personalized_val_accuracy"  # eval.personalize's models on their clients' validation samples


def score_of(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """What a round's row scores, and its name: ``val_local_accuracy`` where the run reports it
    (personal models, each on its own client's validation samples: what such a method is for;
    their global ``val_accuracy`` would tune them for another task), ``calibrated_val_accuracy``
    where the run calibrates its model (CCVR: the calibrated model is its output), else
    ``val_accuracy``."""
    for key in ("val_local_accuracy", "calibrated_val_accuracy", "val_accuracy"):
        if row.get(key) is not None:
            return key, float(row[key])
    return None


class _TrialRun:
    """One trial's run: its values and config, the ``on_round`` that reports each round's score
    so far to the pruner (and prunes), and what its end tells the study."""

    def __init__(self, tune: Tune, study: Study, trial: Any, threads_one: bool, echo: Callable[[str], None],
                 stacked: bool = False) -> None:
        with shielded():
            self.values = {d.key: d.suggest(trial) for d in study.dims}
        self.doc = study.trial_doc(tune.root, trial.number, self.values, threads_one)
        if stacked:  # one of a stack of trials (experiments.stacked): auto on a GPU says stacked
            self.doc["engine"]["executor"] = "stacked"
        names = short_names(list(self.values))  # the table's rule: the last part unless two share it
        self.shown = " ".join(f"{names[k]}={_short(v)}" for k, v in self.values.items())
        self.label = f"{study.entry} trial {trial.number} ({self.shown})"
        self.trial, self.echo, self.best = trial, echo, -1.0
        self.start = time.perf_counter()
        self.resumed = 0 if stacked else _take_stopped(tune, study, trial.number, self.values, self.doc)
        if self.resumed:
            echo(f"{self.label}: continues stopped trial's run from its checkpoint of round {self.resumed}")

    def replay(self) -> None:
        """A continued trial's rounds up to its checkpoint, reported to the pruner again (it
        may prune the trial here, before any round runs)."""
        path = Path(self.doc["output"]["dir"]) / "metrics.jsonl"
        for line in path.read_text().splitlines() if self.resumed else []:
            row = json.loads(line)
            if int(row.get("round", 0)) <= self.resumed:
                self.on_round(row)

    def on_round(self, row: dict[str, Any]) -> None:
        scored = score_of(row)
        if scored is None:
            return
        metric, val = scored
        trial = self.trial
        with shielded():  # database writes: a Ctrl-C stops the run after them
            trial.set_user_attr("metric", metric)
            self.best = max(self.best, val)
            trial.report(self.best, int(row["round"]))  # the score so far: a noisy round does not prune
            prune = trial.should_prune()
            if prune:
                trial.set_user_attr("status", "pruned")
                trial.set_user_attr("rounds", int(row["round"]))
        if prune:
            self.echo(f"{self.label}: pruned at round {row['round']}, val {self.best:.4f}")
            raise load_optuna().TrialPruned(f"round {row['round']}")

    def outcome(self, ended: Any) -> float:
        """The trial's score from its run's end (a ``RunResult``), or raised: a divergence as a
        pruned trial marked ``diverged``, any other exception as it is."""
        if isinstance(ended, DivergenceError):
            with shielded():
                self.trial.set_user_attr("status", "diverged")
            self.echo(f"{self.label}: diverged ({str(ended).split(';')[0]})")
            raise load_optuna().TrialPruned("diverged") from None
        if isinstance(ended, BaseException):
            raise ended
        scored = [sc for sc in map(score_of, ended.history) if sc is not None]
        # a run that calibrates (CCVR, by default only after its last round) is scored on its
        # calibrated rounds only: its output is the calibrated model, not the rounds before
        if any(name == "calibrated_val_accuracy" for name, _ in scored):
            scored = [sc for sc in scored if sc[0] == "calibrated_val_accuracy"]
        # one that personalises after training (eval.personalize) on its personalised models:
        # its output, fine-tuned by eval.personalize_* (FedBABU's learning rate is tuned there)
        if ended.summary.get(PERSONAL) is not None:
            scored = [(PERSONAL, float(ended.summary[PERSONAL]))]
        score = max((v for _, v in scored), default=math.nan)
        with shielded():
            if scored:  # what was scored (the rounds' own metric was set as each round came)
                self.trial.set_user_attr("metric", scored[0][0])
            self.trial.set_user_attr("status", "completed")
            self.trial.set_user_attr("rounds", int(ended.summary.get("rounds", 0)))
        self.echo(f"{self.label}: val {score:.4f}, {time.perf_counter() - self.start:.1f} s")
        return score


def _objective(tune: Tune, study: Study, threads_one: bool, echo: Callable[[str], None]) -> Callable[[Any], float]:
    from fedrift.api import run

    def objective(trial: Any) -> float:
        from fedrift.engine.checkpoint import CheckpointError

        one = _TrialRun(tune, study, trial, threads_one, echo)
        one.replay()
        try:
            with interruptible():  # in a pool worker, the pool's stop is the run's Ctrl-C
                try:
                    ended: Any = run(one.doc, on_round=one.on_round, resume=bool(one.resumed))
                except CheckpointError as err:  # a checkpoint it cannot use: the trial from round 1
                    echo(f"{one.label}: checkpoint not used ({err}), runs from round 1")
                    one.best = -1.0
                    ended = run(one.doc, on_round=one.on_round)
        except DivergenceError as err:
            ended = err
        return one.outcome(ended)

    return objective


def _stacked_trials(tune: Tune, study: Study, asked: list[tuple[Any, Any]], echo: Callable[[str], None]) -> None:
    """``asked`` (each a study object and a trial it asked) trained as one stack
    (``experiments.stacked``: trials that differ in the learning rate and the options of the
    algorithm's tune space share one step), each trial told as its run ended; a Ctrl-C tells
    the trials it stopped as interrupted and is raised once all are told. Trials that differ in
    another key cannot share a step: they run one after another, as without a stack."""
    from fedrift.api import run
    from fedrift.experiments.stacked import prepare_stack, stacked_outcomes

    runs = [_TrialRun(tune, study, trial, False, echo, stacked=True) for _, trial in asked]
    try:
        preps = prepare_stack([r.doc for r in runs])
    except ConfigError as err:
        if len(runs) > 1:
            echo(f"{study.entry}: trials {', '.join(str(r.trial.number) for r in runs)} run one by one ({err})")
        outcomes: list[Any] = []
        stopped = False
        for one in runs:
            if stopped:
                outcomes.append(KeyboardInterrupt())
                continue
            try:
                outcomes.append(run(one.doc, on_round=one.on_round))
            except KeyboardInterrupt as stop:
                outcomes.append(stop)
                stopped = True
            except BaseException as ended:  # noqa: BLE001 - the trial's own end, told below
                outcomes.append(ended)
    else:
        if len(runs) > 1:
            echo(f"{study.entry}: trials {', '.join(str(r.trial.number) for r in runs)} trained as one stack")
        outcomes, stopped = stacked_outcomes(preps, on_round=[r.on_round for r in runs])
    errors = []
    for (st, trial), one, ended in zip(asked, runs, outcomes):
        try:
            tell_outcome(st, trial, lambda: one.outcome(ended))
        except KeyboardInterrupt:
            stopped = True
        except BaseException as err:  # noqa: BLE001 - every trial told first, then the first error raised
            errors.append(err)
    if stopped:
        raise KeyboardInterrupt
    if errors:
        raise errors[0]


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _target(tune: Tune, study: Study) -> int:
    grid = study.grid
    return min(tune.trials, math.prod(len(v) for v in grid.values())) if grid is not None else tune.trials


def _trial_dir(tune: Tune, study: Study, number: int) -> Path:
    return tune.root / "trials" / study.name / f"trial{number}"


def _stopped(st: Any, tune: Tune, study: Study) -> list[Any]:
    """The study's failed trials (interrupted, or left running by a killed tune) whose folder
    holds a checkpoint: their points run first, continued from it."""
    from fedrift.engine.checkpoint import FOLDER, MANIFEST

    failed = st.get_trials(deepcopy=False, states=(load_optuna().trial.TrialState.FAIL,))
    return [t for t in failed if (_trial_dir(tune, study, t.number) / FOLDER / MANIFEST).is_file()]


def _take_stopped(tune: Tune, study: Study, number: int, values: Mapping[str, Any], doc: Mapping[str, Any]) -> int:
    """Trial ``number`` at ``values`` takes over the folder of a stopped trial at the same point
    (:func:`_stopped`): the round of its checkpoint, or 0 when there is none."""
    from fedrift.engine.checkpoint import FOLDER, MANIFEST

    st = _open_study(tune, study, tune.seed)
    here = json.dumps(dict(values), sort_keys=True, default=str)
    for old in _stopped(st, tune, study):
        if json.dumps(old.params, sort_keys=True, default=str) != here or old.number == number:
            continue
        src, dest = _trial_dir(tune, study, old.number), Path(doc["output"]["dir"])
        if dest.exists() or dest.is_symlink() or src.is_symlink():  # a link is no trial folder fedrift made
            return 0
        try:
            src.rename(dest)
        except OSError:  # taken by another worker's trial at the same point
            return 0
        try:
            return int(json.loads((dest / FOLDER / MANIFEST).read_text())["round"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0
    return 0


def _worker(args: tuple[Tune, int, int, dict[str, Any] | None]) -> None:
    """A pool process: one trial of one study (the parent sends exactly as many as are
    missing; for a grid, each with its own point)."""
    tune, index, seed, point = args
    study = tune.studies[index]
    one_trial(_open_study(tune, study, seed, point=point), _objective(tune, study, True, print))


def _missing_points(st: Any, study: Study, tune: Tune) -> list[dict[str, Any]]:
    """The points no finished trial has run, in order: a grid's, or the first ``STARTUP`` (at
    most the tune's trials) of the start-up design."""
    import itertools

    grid = study.grid
    if grid is not None:
        points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    else:
        points = startup_points(study.dims, min(tune.trials, STARTUP), tune.seed)
    seen = {json.dumps(t.params, sort_keys=True) for t in finished_trials(st)}
    return [p for p in points if json.dumps(p, sort_keys=True) not in seen]


def run_tune(tune: Tune, jobs: int = 1, echo: Callable[[str], None] = print, pruner: Any = None) -> None:
    """Run every study's missing trials (``pruner``: an Optuna pruner object instead of the
    named one). Exactly the missing number runs: in this process, or one pool task per trial
    (each of a grid's missing points goes to one trial, so none runs twice)."""
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(tune.root)
        lock = FolderLock(tune.root, "--out")
    with lock:  # one tune a folder at a time: a trial it finds running was left by a stopped one
        _run_studies(tune, jobs, echo, pruner)


def _run_studies(tune: Tune, jobs: int, echo: Callable[[str], None], pruner: Any) -> None:
    desc_path = tune.root / DESCRIPTION
    if desc_path.is_file():
        _check_same_tune(tune, json.loads(desc_path.read_text()))
    write_atomic(desc_path, json.dumps(tune.description, indent=1, default=str) + "\n")
    for i, study in enumerate(tune.studies):
        st = _open_study(tune, study, tune.seed, pruner)
        stale = fail_stale(st)
        target = _target(tune, study)
        have = len(finished_trials(st))
        echo(f"{study.entry}: {have} of {target} trials finished before" + (f", {stale} left running marked failed" if stale else "")
             + f"; space {', '.join(f'{d.key}={d.describe()}' for d in study.dims)}")
        missing = target - have
        if missing <= 0:
            continue
        stopped: list[Any] = []  # continued first, from their checkpoints
        for t in _stopped(st, tune, study):
            stopped += [dict(t.params)] if dict(t.params) not in stopped else []
        points: list[Any] = [*stopped, *(p for p in _missing_points(st, study, tune) if p not in stopped)][:missing]
        points += [None] * (missing - len(points))  # None: a trial TPE proposes
        # TPE's samplers get seeds no earlier call used (past the trials the study holds):
        # seeded as before, a resumed study would replay the proposals of its finished trials.
        offset = len(st.trials)
        if wants_stack(study.doc):
            _run_stacks(tune, study, points, pruner, jobs, echo, offset)
            continue
        if jobs <= 1 or missing == 1:
            objective = _objective(tune, study, False, echo)
            for point in (p for p in points if p is not None):
                one_trial(_open_study(tune, study, tune.seed, pruner, point), objective)
            if None in points:
                st = _open_study(tune, study, tune.seed + 1 + len(st.trials), pruner)
                for _ in range(points.count(None)):
                    one_trial(st, objective)
            continue
        with run_pool(min(jobs, missing)) as pool:
            for fut in [pool.submit(_worker, (tune, i, tune.seed + 1 + offset + k, p)) for k, p in enumerate(points)]:
                fut.result()


def _run_stacks(tune: Tune, study: Study, points: list[Any], pruner: Any, jobs: int, echo: Callable[[str], None],
                held: int) -> None:
    """A study's missing trials as stacks (``engine.executor: stacked``, or ``auto`` on a GPU):
    the design's or grid's points together (at most :data:`STACK_MOST` a stack), then TPE's
    proposals ``jobs`` at a time (asked together, as parallel workers ask them). ``held``: the
    trials the study held before (TPE is seeded past them and the ones asked here)."""
    fixed = [p for p in points if p is not None]
    for start in range(0, len(fixed), STACK_MOST):
        asked = []
        for point in fixed[start : start + STACK_MOST]:
            st = _open_study(tune, study, tune.seed, pruner, point)
            with shielded():
                asked.append((st, st.ask()))
        _stacked_trials(tune, study, asked, echo)
    proposed, held = points.count(None), held + len(fixed)
    while proposed > 0:  # TPE seeded past the trials the study holds, as without a stack
        st = _open_study(tune, study, tune.seed + 1 + held, pruner)
        with shielded():
            asked = [(st, st.ask()) for _ in range(min(jobs, proposed))]
        _stacked_trials(tune, study, asked, echo)
        proposed -= len(asked)
        held += len(asked)


def _check_same_tune(tune: Tune, stored: Mapping[str, Any]) -> None:
    """A folder goes on with the tune it holds: the same base config, seed, pruner and every
    stored study unchanged. New algorithms may join it (their studies start empty), so a
    table's tune grows by ``algorithms=`` without re-running the ones it has."""
    now = json.loads(json.dumps(tune.description, default=str))  # compared as stored
    diff = [d for k in sorted((set(stored) | set(now)) - {"studies"})
            for d in _differences(stored.get(k, "<absent>"), now.get(k, "<absent>"), "" if k == "base" else k)]
    old_studies, new_studies = stored.get("studies") or {}, now["studies"]
    left_out = [name for name in old_studies if name not in new_studies]
    changed = [name for name in old_studies if name in new_studies and old_studies[name] != new_studies[name]]
    if diff:
        why = _some(diff)
    elif changed:
        why = f"the space or entry of {', '.join(changed)} differs: " + _some(
            [d for name in changed for d in _differences(old_studies[name], new_studies[name], name)])
    elif left_out:
        why = f"it also tunes {', '.join(left_out)}, which algorithms= leaves out"
    else:
        return
    raise ConfigError(f"--out: {str(tune.root)!r} holds a tune of another config or space ({why}); "
                      "allowed: the same config with the same or more algorithms, or another folder")


def _differences(there: Any, here: Any, prefix: str) -> list[str]:
    """``key: value there, value here`` for each dotted key on which two parts of a tune's
    description differ (``prefix``: the part's own key, none for the base config's)."""
    a = flatten(there, f"{prefix}." if prefix else "") if isinstance(there, Mapping) else {prefix: there}
    b = flatten(here, f"{prefix}." if prefix else "") if isinstance(here, Mapping) else {prefix: here}
    return [f"{k}: {a.get(k, '<absent>')!r} there, {b.get(k, '<absent>')!r} here"
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]


def _some(items: Sequence[str], most: int = 3) -> str:
    return "; ".join(items[:most]) + (f"; and {len(items) - most} more" if len(items) > most else "")


def collect(tune: Tune) -> dict[str, dict[str, Any]]:
    """Per study: its trials (number, state, status, score, values, rounds) and the best."""
    optuna = load_optuna()
    out = {}
    for study in tune.studies:
        try:
            st = optuna.load_study(study_name=study.name, storage=tune.storage)
        except KeyError:  # not begun: the tune stopped before it
            out[study.name] = {"entry": study.entry, "space": {d.key: d.describe() for d in study.dims},
                               "trials": [], "best": None}
            continue
        rows = []
        for t in st.get_trials(deepcopy=False):
            inter = t.intermediate_values
            rows.append({
                "entry": study.entry, "trial": t.number, "state": t.state.name.lower(),
                "status": t.user_attrs.get("status", t.state.name.lower()),
                "val_accuracy": t.value if t.value is not None else (max(inter.values()) if inter else None),
                "rounds": t.user_attrs.get("rounds", max(inter) if inter else 0),
                "metric": t.user_attrs.get("metric", "val_accuracy"),
                "params": dict(t.params),
                "dir": str(tune.root / "trials" / study.name / f"trial{t.number}"),
            })
        done = [r for r in rows if r["state"] == "complete" and r["val_accuracy"] is not None
                and not math.isnan(r["val_accuracy"])]
        best = max(done, key=lambda r: (r["val_accuracy"], -r["trial"])) if done else None
        out[study.name] = {"entry": study.entry, "space": {d.key: d.describe() for d in study.dims},
                           "trials": rows, "best": best}
    return out


def write_results(tune: Tune, echo: Callable[[str], None] = print, figures: bool = True) -> dict[str, dict[str, Any]]:
    """``best.yaml``, ``trials.csv``, ``tune.md`` and ``tune.html``; prints the best per entry."""
    from fedrift.report.tune_page import render_tune_page

    results = collect(tune)
    best = {}
    for study in tune.studies:
        r = results[study.name]
        b = r["best"]
        n = len(r["trials"])
        if b is None:
            echo(f"{r['entry']}: no trial finished ({n} tried); nothing to choose")
            continue
        r["edges"] = {d.key: side for d in study.dims if (side := d.edge(b["params"].get(d.key))) is not None}
        r["base"] = tune_base(study.doc, list(b["params"]))
        best[r["entry"]] = {"overrides": dict(b["params"]), "val_accuracy": b["val_accuracy"], "trial": b["trial"],
                            "trials": n, **({"metric": b["metric"]} if b["metric"] != "val_accuracy" else {}),
                            **({"edges": r["edges"]} if r["edges"] else {}), "space": r["space"], "base": r["base"]}
        shown = " ".join(f"{k}={_short(v)}" for k, v in b["params"].items())
        scored = "val" if b["metric"] == "val_accuracy" else b["metric"]
        echo(f"{r['entry']}: best {shown} ({scored} {b['val_accuracy']:.4f}, trial {b['trial']} of {n})")
        for key, side in r["edges"].items():
            echo(f"{r['entry']}: {key}={_short(b['params'][key])} is at the {side} edge of its range {r['space'][key]}: "
                 f"the best may lie {'below' if side == 'low' else 'above'} it; widen space.{key} and tune again "
                 "(another --out: a tune folder keeps its space)")
    write_atomic(tune.root / BEST,
        "# fedrift tune: per algorithm entry, the best trial's values (fedrift compare ... tuned=DIR), the space\n"
        "# searched, the values at its edge, and the base they were chosen on (compare warns when its runs differ)\n"
        + yamlio.dump(best))
    keys = sorted({k for r in results.values() for t in r["trials"] for k in t["params"]})
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(["entry", "trial", "state", "status", "val_accuracy", "rounds", *keys])
    for r in results.values():
        for t in r["trials"]:
            w.writerow([t["entry"], t["trial"], t["state"], t["status"], t["val_accuracy"], t["rounds"],
                        *(t["params"].get(k, "") for k in keys)])
    write_atomic(tune.root / "trials.csv", table.getvalue())
    html_path, md = render_tune_page(tune.root, results, figures=figures)
    write_atomic(tune.root / "tune.md", md)
    echo(f"best settings in {tune.root / BEST}; trials in {tune.root / 'trials.csv'}; report in {html_path}")
    return results


def tune(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    algorithms: Sequence[str] | None = None,
    space: Mapping[str, Any] | None = None,
    overrides: Sequence[str] | None = None,
    out: str | Path | None = None,
    trials: int = 20,
    jobs: int = 1,
    seed: int = 0,
    pruner: Any = "median",
    report: bool = True,
    verbose: bool = True,
) -> dict[str, dict[str, Any]]:
    """Tune each algorithm's learning rate and key hyper-parameters on validation accuracy
    (resumable; see the module docstring). Returns per study its trials and best trial.

    ``fedrift.tune("my.yaml", algorithms=["fedavg", "fedprox"], trials=20,
    overrides=["partition.val_share=0.1"], out="runs/tune")``; ``pruner``: ``"median"``,
    ``"none"`` or an Optuna pruner object.
    """
    if jobs < 1:
        raise ConfigError(f"jobs: must be at least 1 (got {jobs})")
    echo = print if verbose else (lambda _msg: None)
    named = pruner if isinstance(pruner, str) else "median"
    t = build_tune(config, algorithms, space, overrides, out, trials, seed, named)
    if not isinstance(pruner, str):
        t.description["pruner"] = type(pruner).__name__
        if jobs > 1:
            raise ConfigError("pruner: an Optuna pruner object runs in this process only; allowed with jobs=1")
    load_optuna()
    try:
        run_tune(t, jobs, echo, None if isinstance(pruner, str) else pruner)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the trials that finished are summarised as at the end
        _summarise_stopped(t)
        raise
    return write_results(t, echo, figures=report)


def _summarise_stopped(t: Tune) -> None:
    """A stopped tune's ``best.yaml``, ``trials.csv`` and ``tune.md`` over the trials that
    finished (what ``compare tuned=DIR`` can use before the rest run); nothing when none did,
    and never an error of its own in place of the stop."""
    try:
        if (t.root / "study.db").is_file() and any(r["best"] for r in collect(t).values()):
            write_results(t, lambda _msg: None, figures=False)
    except Exception:  # noqa: BLE001 - the stop is what the caller must see
        pass


__all__ = ["Study", "Tune", "build_tune", "collect", "run_tune", "score_of", "tune", "write_results"]
