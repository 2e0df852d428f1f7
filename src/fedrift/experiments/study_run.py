"""``fedrift study run FILE``: a study file's tunes and runs, most informative first, resumable, then its report.

The order
    The reference entry first, then the others in the file's order: each entry's tune (when the
    study tunes it) and its seed-0 runs (every swept value), so that after k steps the first k
    entries stand beside the reference on one seed; then every entry's seed 1, then seed 2 ...
    A tune at the runs' rounds and seed gives an entry's seed-0 runs for free (compare copies
    the chosen trial: :func:`fedrift.experiments.grid.copy_trial`). Where an entry's runs
    train as one stack (compare's ``engine.executor: stacked``, or ``auto`` on a GPU), its
    seeds run together right after its tune: a stack costs about what one run does.

The machinery is ``fedrift tune``'s and ``fedrift compare``'s, called as they are
    One tune folder (``folders.tune``: one Optuna study per entry, ``best.yaml``) and one compare
    root (``folders.runs``), laid out as those commands lay them out, so a study runs over the
    folders of earlier hand-run tunes and compares, and reruns nothing they finished: a trial
    or run is finished by their rules (a completed trial is kept; a run whose ``summary.json``
    says completed and whose config is the one wanted is reused). Each step is one ``tune``
    (the entries so far) or one ``compare`` (the entries of the step, ``--jobs`` processes).
    Killed at any point (SIGKILL too), the next ``study run`` continues: finished trials and
    runs are kept, stopped runs continue from their checkpoints.

What the study adds
    - Every entry takes its own values: its tune's best, the ``tuned:`` file's (entries the
      study does not tune), else the config's (``<tune>/study-best.yaml``, what compare reads).
    - ``<runs>/study.json`` records each entry's settings (its hash: the entry, the base it runs
      on, its tuning or values) and each tune study's space. The next run says which entries are
      new (tuned and run alone), changed (said with the keys that changed; its tune starts again
      when its space changed, the old study moved to ``<tune>/retired/``; its runs rerun where
      their config changed) or gone (kept on disk, no longer reported).
    - ``--budget 15m`` stops the study as a Ctrl-C does when the time is up, counted from the
      command's start (the trial or run in progress records itself as interrupted; nothing
      finished is lost) and writes the report of what finished; the same command continues it.
    - One ``study run`` a folder at a time (``<runs>/.study`` holds its lock; ``study status``
      names the process holding it).
    - The report (``<runs>/report.html``, ``results.md``, ``claims.md``, and ``study.md`` which
      holds them with the progress): compare's report of the whole grid, with the published
      table (``report.paper``) and the claims (``report.claims``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedrift import yamlio
from fedrift.engine.folder_lock import FolderLock
from fedrift.errors import ConfigError, writing
from fedrift.experiments.space import takes
from fedrift.experiments.study_file import Entry, Study, load_study
from fedrift.experiments.studies import study_storage
from fedrift.experiments.study_status import finished_trials, progress, tune_target
from fedrift.report.table import flatten
from fedrift.safe_files import make_dir, write_atomic

LEDGER = "study.json"
LOCK = ".study"  # in the runs folder: the folder whose lock a study run holds
VALUES = "study-best.yaml"  # in the tune folder: every entry's values, what compare's tuned= reads
RETIRED = "retired"
STUDY_MD = "study.md"

Echo = Callable[[str], None]


@dataclass
class Outcome:
    """What a ``study run`` did: finished, or stopped by the budget; where its report is."""

    finished: bool
    budget_hit: bool = False
    report: Path | None = None
    lines: list[str] = field(default_factory=list)  # the progress, as study.md says it


class _Budget:
    """``--budget``: a Ctrl-C to this process (SIGINT, which tune and compare handle: the work
    in progress records itself as interrupted) when the time is up."""

    def __init__(self, seconds: float | None) -> None:
        self.hit = False
        self._timer = None if seconds is None else threading.Timer(max(0.0, seconds), self._fire)
        self._restore: Any = None
        if self._timer is not None:
            # a process started with SIGINT ignored (a background job of a script, a test
            # runner's worker) would never see the budget's Ctrl-C: Python's own handler while it runs
            held = signal.getsignal(signal.SIGINT)
            if held in (signal.SIG_IGN, signal.SIG_DFL) and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.default_int_handler)
                self._restore = held
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        self.hit = True
        os.kill(os.getpid(), signal.SIGINT)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._restore is not None:
            signal.signal(signal.SIGINT, self._restore)
            self._restore = None


# ---------------------------------------------------------------------------------------
# The tune folder


def _tune_studies(study: Study) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every tuned entry's :class:`fedrift.experiments.tune.Study` with its part of ``tune.json``
    (``{"entry", "space"}``), and the rest of ``tune.json`` (base, sampler seed, pruner): as
    ``build_tune`` makes them, without its checks (:func:`_validate_tunes` runs those for the
    tunes that will run)."""
    from fedrift.config import apply_overrides, config_dict, entry_doc
    from fedrift.experiments.space import resolve_space
    from fedrift.experiments.tune import Study as TuneStudy

    t = study.file.tune
    base = apply_overrides(config_dict(study.config), study.tune_overrides)
    built = {}
    for e in study.tuned_entries:
        dims = resolve_space(e.name, e.space)
        built[e.entry] = (TuneStudy(e.entry, e.study_name, dims, entry_doc(base, e.entry)),
                          {"entry": e.entry, "space": {d.key: d.describe() for d in dims}})
    return built, {"version": 1, "base": base, "seed": 0, "pruner": t.pruner if t is not None else "median"}


def _validate_tunes(study: Study, entries: Sequence[Entry], built: Mapping[str, Any]) -> None:
    """``build_tune``'s checks (each study's config at a point of its space, the validation
    split), entries of one space together; its studies must be those :func:`_tune_studies` made."""
    from fedrift.experiments.tune import build_tune

    t = study.file.tune
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(json.dumps(e.space, sort_keys=True, default=str), []).append(e)
    for group in groups.values():
        space = {k: v for k, v in group[0].space.items() if "." in k or any(takes(e.name, k) for e in group)}
        tune = build_tune(study.config, [e.entry for e in group], space, study.tune_overrides, study.tune_dir,
                          t.trials, 0, t.pruner)
        for s in tune.studies:
            assert tune.description["studies"][s.name] == built[s.entry][1], "tune.json's format changed"


def _storage(study: Study) -> str:
    return study_storage(study.tune_dir)


def _retire(study: Study, name: str, echo: Echo) -> Path:
    """Move study ``name`` (its Optuna study and its trial folders) to ``<tune>/retired/NAME-K``."""
    from fedrift.experiments.studies import load_optuna
    from fedrift.experiments.tune import DESCRIPTION

    optuna = load_optuna()
    k = 1
    while (study.tune_dir / RETIRED / f"{name}-{k}").exists():
        k += 1
    dest = study.tune_dir / RETIRED / f"{name}-{k}"
    dest.mkdir(parents=True)
    try:
        optuna.copy_study(from_study_name=name, from_storage=_storage(study),
                          to_storage=study_storage(dest))
        optuna.delete_study(study_name=name, storage=_storage(study))
    except KeyError:  # no such study in the database: only its folders
        pass
    trials = study.tune_dir / "trials" / name
    if trials.is_dir():
        (dest / "trials").mkdir()
        shutil.move(str(trials), str(dest / "trials" / name))
    desc = _read_json(study.tune_dir / DESCRIPTION)  # the tune's description forgets it
    if name in (desc.get("studies") or {}):
        del desc["studies"][name]
        _write_json(study.tune_dir / DESCRIPTION, desc)
    return dest


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Written whole or not at all (a kill mid-write leaves the old file)."""
    write_atomic(path, json.dumps(doc, indent=1, default=str) + "\n")


def _check_tune_head(study: Study, head: Mapping[str, Any]) -> None:
    """The tune folder goes on with the tune it holds: the same base config, sampler seed and
    pruner (its studies may grow, shrink or change one by one: the study handles those)."""
    from fedrift.experiments.tune import DESCRIPTION

    stored = _read_json(study.tune_dir / DESCRIPTION)
    if not stored:
        return
    now = json.loads(json.dumps(head, default=str))
    there, here = flatten({k: stored.get(k) for k in now}), flatten(now)
    diff = [f"{k}: {there.get(k, '<absent>')!r} there, {here.get(k, '<absent>')!r} here"
            for k in sorted(set(there) | set(here)) if there.get(k, "<absent>") != here.get(k, "<absent>")]
    if diff:
        raise ConfigError(f"study: the tune folder {str(study.tune_dir)!r} holds a tune of another base config "
                          f"({'; '.join(diff[:3])}{' ...' if len(diff) > 3 else ''}); allowed: the study's base, "
                          "overrides and tune: as they were, or another out: or folders.tune")


def _stored_spec(study: Study, name: str, ledger: Mapping[str, Any]) -> dict[str, Any] | None:
    """The space study ``name`` of the tune folder was run with: its ``tune.json``'s, else the
    ledger's (a study the tune left out of ``tune.json`` stays in its database)."""
    from fedrift.experiments.tune import DESCRIPTION

    stored = _read_json(study.tune_dir / DESCRIPTION).get("studies") or {}
    return stored.get(name) or (ledger.get("tune") or {}).get(name)


def _tune_ready(study: Study, entry: Entry, built: Mapping[str, Any], ledger: Mapping[str, Any]) -> bool:
    """Whether an entry's tune is finished, with the space it has now."""
    tstudy, spec = built[entry.entry]
    old = _stored_spec(study, tstudy.name, ledger)
    have = finished_trials(study, tstudy.name)
    return have is not None and have >= tune_target(study, entry) and (old is None or old == spec)


def _tune_step(study: Study, upto: Sequence[Entry], built: Mapping[str, Any], head: Mapping[str, Any],
               ledger: dict[str, Any], jobs: int, echo: Echo) -> bool:
    """Tune the last of ``upto`` (its study joining those of the entries before it): nothing
    when its study is finished with the same space. A study of another space is retired first.
    Returns whether trials ran."""
    from fedrift.experiments.tune import DESCRIPTION, Tune, run_tune, write_results

    entry = upto[-1]
    tstudy, spec = built[entry.entry]
    known = ledger.setdefault("tune", {})
    if _tune_ready(study, entry, built, ledger):
        known[tstudy.name] = spec
        return False
    old = _stored_spec(study, tstudy.name, ledger)
    if old is not None and old != spec and (finished_trials(study, tstudy.name) is not None
                                            or (study.tune_dir / "trials" / tstudy.name).is_dir()):
        here = spec.get("space") or {}
        what = "; ".join(f"{k}: {(old.get('space') or {}).get(k, '<absent>')!r} there, {here.get(k, '<absent>')!r} here"
                         for k in sorted(set(old.get("space") or {}) | set(here))
                         if (old.get("space") or {}).get(k) != here.get(k)) or "its entry"
        dest = _retire(study, tstudy.name, echo)
        known.pop(tstudy.name, None)
        echo(f"{entry.entry}: its tune's space changed ({what}); its trials are moved to {dest}, its tune starts again")
    wanted = [built[e.entry] for e in upto if e.tuned]
    names = {s.name for s, _ in wanted}
    with writing("out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(study.tune_dir)
    if (study.tune_dir / DESCRIPTION).is_file():  # the tune goes on with the entries so far (the others stay in
        desc = _read_json(study.tune_dir / DESCRIPTION)  # its database, their spaces in the ledger)
        for k, v in (desc.get("studies") or {}).items():
            known.setdefault(k, v)
        desc["studies"] = {k: v for k, v in (desc.get("studies") or {}).items() if k in names}
        _write_json(study.tune_dir / DESCRIPTION, desc)
    known[tstudy.name] = spec
    _save_ledger(study, ledger)
    tune = Tune(study.tune_dir, [s for s, _ in wanted], study.file.tune.trials, int(head.get("seed", 0)),
                str(head.get("pruner", "median")), {**head, "studies": {s.name: d for s, d in wanted}})
    echo(f"== study: tune {entry.entry} ({tune_target(study, entry)} trials, in {study.tune_dir})")
    run_tune(tune, jobs, echo)
    write_results(tune, echo, figures=False)
    return True


def _values(study: Study, entries: Sequence[Entry], built: Mapping[str, Any], echo: Echo) -> Path | None:
    """``<tune>/study-best.yaml`` (``<runs>/`` when the study tunes nothing): each entry's values (its tune's best, the ``tuned:`` file's,
    or none: the config's), what compare's ``tuned=`` reads (by entry, so that an entry not
    tuned never takes another entry's values by its algorithm name). None when no entry
    takes any."""
    from fedrift.experiments.tune import Tune, write_results
    from fedrift.experiments.tuned import BEST

    if not study.tuned_entries and not study.table:
        return None
    tuned = [e for e in entries if e.tuned]
    best = _read_best(study.tune_dir / BEST)
    if any(e.entry not in best for e in tuned):  # a tune stopped after its trials, before its best.yaml
        done = [built[e.entry] for e in study.tuned_entries if finished_trials(study, built[e.entry][0].name)]
        tune = Tune(study.tune_dir, [s for s, _ in done], study.file.tune.trials, 0, study.file.tune.pruner,
                    {"studies": {s.name: d for s, d in done}})
        write_results(tune, lambda _m: None, figures=False)
        best = _read_best(study.tune_dir / BEST)
    doc: dict[str, Any] = {}
    for e in entries:
        if e.tuned and e.entry in best:
            doc[e.entry] = best[e.entry]
        elif e.tuned:  # every trial failed or diverged: said, and its runs take the config's values
            echo(f"{e.entry}: its tune chose no values (no trial finished, see {study.tune_dir / 'tune.md'}); "
                 "its runs take the config's")
            doc[e.entry] = {"overrides": {}, "base": {}}
        else:  # the tuned: file's values, else none (base {}: nothing to check against)
            doc[e.entry] = study.table_values(e) or {"overrides": {}, "base": {}}
    folder = study.tune_dir if study.tuned_entries else study.runs_dir  # beside the trials compare may copy
    with writing("out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(folder)
        path = folder / VALUES
        text = ("# fedrift study: each entry's values (its tune's best, the study's tuned: file's, or none: the "
                "config's); what compare's tuned= reads\n" + yamlio.dump(doc))
        if not path.is_file() or path.read_text() != text:
            write_atomic(path, text)
    return path


_BEST_CACHE: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def _read_best(path: Path) -> dict[str, Any]:
    """A tune's ``best.yaml`` ({} without one), read again only when it changed (a large one
    takes a while to parse, and every step reads it)."""
    from fedrift.experiments.tuned import read_tuned

    if not path.is_file():
        return {}
    st = path.stat()
    key = (st.st_mtime_ns, st.st_size)
    cached = _BEST_CACHE.get(path.resolve())
    if cached is None or cached[0] != key:
        cached = (key, read_tuned(path))
        _BEST_CACHE[path.resolve()] = cached
    return cached[1]


# ---------------------------------------------------------------------------------------
# The ledger: what the last run knew of each entry


def _ledger_path(study: Study) -> Path:
    return study.runs_dir / LEDGER


def _save_ledger(study: Study, ledger: Mapping[str, Any]) -> None:
    with writing("out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(study.runs_dir)
        _write_json(_ledger_path(study), ledger)


def _changes(study: Study, old: Mapping[str, Any]) -> list[str]:
    """Lines saying which entries are new, changed (and in what) or gone since the last run."""
    before = old.get("entries") or {}
    lines = []
    for e in study.entries:
        was = before.get(e.entry)
        if was is None:
            if before:
                lines.append(f"{e.entry}: new since the last run: tuned and run alone" if e.tuned
                             else f"{e.entry}: new since the last run: run alone")
        elif was.get("hash") != study.entry_hash(e):
            a, b = flatten(was.get("settings") or {}), flatten(json.loads(json.dumps(study.settings(e), default=str)))
            keys = [k for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]
            shown = "; ".join(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in keys[:3])
            lines.append(f"{e.entry}: changed since the last run ({shown}{' ...' if len(keys) > 3 else ''}): its tune "
                         "and runs are checked again and rerun where they changed; the other entries are kept")
    names = {e.entry for e in study.entries}
    lines += [f"{name}: no longer in the study; its tune and runs are kept on disk, not reported"
              for name in before if name not in names]
    return lines


# ---------------------------------------------------------------------------------------
# Running


def _run_step(study: Study, entries: Sequence[Entry], seeds: Sequence[int], values: Path | None, jobs: int,
              verbose: bool, after: Callable[[Any, dict[str, Any]], None], deadline: float | None) -> None:
    from fedrift.experiments.compare import compare

    compare(study.config, algorithms=[e.entry for e in entries], seeds=list(seeds), sweep=study.sweep or None,
            overrides=study.overrides, out=study.runs_dir, jobs=jobs, report=False, verbose=verbose,
            tuned=values, after=after, deadline=deadline)


def run_study(path: str | Path, out: str | Path | None = None, budget: str | float | None = None,
              jobs: int | None = None, verbose: bool = True, report: bool = True,
              overrides: Sequence[str] = ()) -> Outcome:
    """Tune what is not tuned, run what is not run, report what is finished (module docstring).
    ``budget``: a duration (``15m``, ``2h``, seconds) after which the study stops as at Ctrl-C.
    ``overrides``: ``key=value`` for every entry, run and trial (and ``seeds=``), recorded in
    ``study.json``: a change reruns what it changes, as an edited file does.
    A Ctrl-C raises KeyboardInterrupt after the work in progress recorded itself; the budget's
    stop returns an :class:`Outcome` that is not ``finished``."""
    from fedrift.experiments.select import parse_duration

    echo: Echo = print if verbose else (lambda _m: None)
    study = load_study(path, out, overrides)
    jobs = jobs if jobs is not None else study.file.jobs
    if jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1 (got {jobs})")
    seconds = parse_duration(str(budget)) if budget is not None else None
    if seconds is not None and seconds <= 0:
        raise ConfigError(f"--budget: {budget!r} is no time; allowed: a positive duration such as 15m")
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(study.runs_dir / LOCK)
        lock = FolderLock(study.runs_dir / LOCK, "study")  # one study run a folder at a time
    with lock:
        return _run(study, jobs, seconds, verbose, report, echo, list(overrides))


def _run(study: Study, jobs: int, seconds: float | None, verbose: bool, report: bool, echo: Echo,
         overrides: list[str]) -> Outcome:
    """The study under its lock: prepared, its steps run, its report written (run_study)."""
    from fedrift.experiments.heartbeat import Heartbeat

    timer = _Budget(seconds)  # from the command's start: a device's quarter hour counts its set-up too
    deadline = time.time() + seconds if seconds is not None else None
    finished = False
    description: dict[str, Any] | None = None
    try:
        description, opts, steps = _prepare(study, jobs, echo, overrides)
        with Heartbeat([study.runs_dir, study.tune_dir], echo):
            steps(verbose, _Reports(study, description, opts, report), deadline)
        finished = True
    except KeyboardInterrupt:
        if not timer.hit:
            timer.cancel()
            if description is not None:
                _write_description(study, description)
            raise
    finally:
        timer.cancel()
    if description is None:  # stopped before anything ran
        echo("study: stopped at the budget before any trial or run started")
        return Outcome(False, True)
    try:
        return _finish(study, description, opts, finished, timer.hit, seconds, report, echo)
    except KeyboardInterrupt:
        if timer.hit and not finished:  # the budget's signal came as the last step ended
            return _finish(study, description, opts, finished, True, seconds, report, echo)
        raise


def _prepare(study: Study, jobs: int, echo: Echo,
             overrides: list[str]) -> tuple[dict[str, Any], Any, Callable[..., None]]:
    """Everything checked before anything runs (every run of the grid, the tunes that will
    run), the entries' changes said, the ledger written; returns the grid's description, the
    report options and the steps to run."""
    from fedrift.experiments.grid import build_grid, run_state
    from fedrift.experiments.stacked import wants_stack
    from fedrift.report.html import ReportOptions

    built, head = _tune_studies(study) if study.tuned_entries else ({}, {})
    if study.tuned_entries:
        from fedrift.experiments.studies import load_optuna

        load_optuna()
        _check_tune_head(study, head)
    old = _read_json(_ledger_path(study))
    for line in _changes(study, old):
        echo(line)
    # the steps whose runs all finished before, at the values they take now, are known now
    ready = [e for e in study.entries if not e.tuned or _tune_ready(study, e, built, old)]
    _validate_tunes(study, [e for e in study.tuned_entries if e not in ready], built)
    grid = build_grid(study.config, [e.entry for e in study.entries], study.seeds, study.sweep or None,
                      study.overrides, study.runs_dir, jobs, _values(study, ready, built, echo))
    names = {e.entry for e in ready}
    left = {(spec.setting.algorithm, spec.seed) for spec in grid.runs
            if spec.setting.algorithm not in names or run_state(spec)[0] != "reuse"}
    opts = ReportOptions.parse(study.report)
    ledger: dict[str, Any] = {
        "version": 1, "file": str(study.path), "overrides": overrides, "order": [e.entry for e in study.entries],
        "seeds": study.seeds,
        "entries": {e.entry: {"hash": study.entry_hash(e), "tuned": e.tuned,
                              "study": e.study_name if e.tuned else None,
                              "settings": json.loads(json.dumps(study.settings(e), default=str))}
                    for e in study.entries},
        "tune": dict(old.get("tune") or {}),
    }
    _save_ledger(study, ledger)

    # an entry whose runs train as one stack (compare's engine.executor: stacked, or auto on a
    # GPU) runs all its seeds at once: a stack costs about what one run does
    stacked = {spec.setting.algorithm for spec in grid.runs if wants_stack(spec.doc)}

    def steps(verbose: bool, after: Callable[[Any, dict[str, Any]], None], deadline: float | None) -> None:
        values = None
        for k, entry in enumerate(study.entries):  # each entry's tune and seed 0, the reference first
            if entry.tuned:
                _tune_step(study, study.entries[:k + 1], built, head, ledger, jobs, echo)
            values = _values(study, study.entries[:k + 1], built, echo)
            seeds = [s for s in (study.seeds if entry.entry in stacked else study.seeds[:1]) if (entry.entry, s) in left]
            if seeds:
                echo(f"== study: {entry.entry}, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}")
                _run_step(study, [entry], seeds, values, jobs, verbose, after, deadline)
        for seed in study.seeds[1:]:  # then each seed of every entry
            todo = [e for e in study.entries if (e.entry, seed) in left and e.entry not in stacked]
            if todo:
                echo(f"== study: seed {seed} of " + ("every entry" if len(todo) == len(study.entries)
                                                     else ", ".join(e.entry for e in todo)))
                _run_step(study, todo, [seed], values, jobs, verbose, after, deadline)
        _save_ledger(study, ledger)

    return {**grid.description, "report": opts.as_json(), "study": str(study.path)}, opts, steps


def _write_description(study: Study, description: Mapping[str, Any]) -> None:
    """The whole grid's ``compare.json`` (each step's compare wrote its own part's)."""
    from fedrift.experiments.grid import GRID_FILE

    if study.runs_dir.is_dir():
        _write_json(study.runs_dir / GRID_FILE, description)


class _Reports:
    """The report files (``results.md``, ``report.html``, ``study.md``) written again together
    when a run ends, so that a kill leaves them saying the same; at most about a sixth of the
    time goes to them (a rewrite waits five times its own cost since the last), the last one
    is the study's end's (:func:`_finish`)."""

    PACE = 5.0  # a rewrite waits PACE times the last one's cost

    def __init__(self, study: Study, description: Mapping[str, Any], opts: Any, html: bool) -> None:
        self.study, self.description, self.opts, self.html = study, description, opts, html
        self.last, self.cost = 0.0, 0.0

    def __call__(self, spec: Any = None, result: Mapping[str, Any] | None = None) -> None:
        if result is not None and result.get("status") in ("not started", "interrupted"):
            return
        if time.monotonic() - self.last < self.PACE * self.cost:
            return
        start = time.monotonic()
        _write_reports(self.study, self.description, self.opts, self.html, lambda _m: None)
        self.last = time.monotonic()
        self.cost = self.last - start


def _write_reports(study: Study, description: Mapping[str, Any], opts: Any, html: bool,
                   echo: Echo) -> tuple[list[str], Path | None]:
    """The whole grid's ``compare.json``, the tables (and ``report.html``) and ``study.md``;
    the progress lines and the report's path."""
    from fedrift.report.html import build_report, write_tables

    _write_description(study, description)
    lines, page = progress(study), None
    if any(study.runs_dir.glob("*/seed*/summary.json")):
        if html:
            _, page = build_report(study.runs_dir, opts, echo=echo)
        else:
            write_tables(study.runs_dir, opts, echo=echo)
        _write_markdown(study, lines)
    return lines, page


def _finish(study: Study, description: Mapping[str, Any], opts: Any, finished: bool, budget_hit: bool,
            seconds: float | None, report: bool, echo: Echo) -> Outcome:
    lines, page = _write_reports(study, description, opts, report, echo)
    outcome = Outcome(finished, budget_hit and not finished, report=page, lines=lines)
    for line in lines:
        echo(line)
    if outcome.budget_hit:
        from fedrift.report.select_page import duration_text

        echo(f"study: stopped at the budget ({duration_text(seconds or 0)}); what finished is kept: run the same "
             f"command again to continue")
    elif finished:
        echo(f"study: finished; report in {outcome.report or study.runs_dir / 'results.md'}")
    return outcome


def _write_markdown(study: Study, lines: Sequence[str]) -> None:
    """``study.md``: how to reproduce, the progress, the table and the claims in one page."""
    parts = [f"# Study {study.path.name}", "",
             f"Reproduce (resumable; `fedrift study status {study.path}` says what is left): "
             f"`fedrift study run {study.path}`", "", "## Progress", "", *[f"- {line}" for line in lines], ""]
    for title, name in (("Results", "results.md"), ("Claims", "claims.md")):
        p = study.runs_dir / name
        if p.is_file():
            parts += [f"## {title}", "", p.read_text().rstrip(), ""]
    with writing("report", f"; the runs in {study.runs_dir} are unchanged; allowed: a folder this user can write"):
        write_atomic(study.runs_dir / STUDY_MD, "\n".join(parts))


__all__ = ["LEDGER", "Outcome", "VALUES", "run_study"]
