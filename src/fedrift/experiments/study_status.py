"""``fedrift study status FILE``: what a study has finished, what is running, what is left, and
an estimate of the rest from the cost measured so far.

Read from the folders alone (no data is loaded, nothing is validated but the study file): the
tune folder's database (finished trials of each entry's study), the run folders' summaries, and
``<runs>/study.json`` (each entry's settings' hash at the last ``study run``). An entry new or
changed since that run is said so. The estimate is the
seconds a round measured here (each entry's own runs and trials, else all of them) times the
rounds left, in one process (``--jobs N`` divides it by about N).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedrift.config import entry_doc
from fedrift.engine.folder_lock import holder
from fedrift.experiments.naming import fmt_value, safe_name
from fedrift.experiments.study_file import Entry, Study, load_study
from fedrift.overrides import parse_value
from fedrift.report.table import short_names

FINISHED = ("completed", "diverged", "no_clients")  # compare's finished runs: not run again


def tune_target(study: Study, entry: Entry) -> int:
    """The trials an entry's tune runs: the study's ``trials``, at most its grid's size."""
    from fedrift.experiments.space import resolve_space

    if study.file.tune is None or not entry.tuned:
        return 0
    dims = resolve_space(entry.name, entry.space)
    size = math.prod(len(d.choices) for d in dims) if all(d.kind == "choice" for d in dims) else None
    return min(study.file.tune.trials, size) if size is not None else study.file.tune.trials


@functools.lru_cache(maxsize=None)
def _storage(folder: Path) -> Any:
    """One storage per database and process (opening one checks its schema: half a second)."""
    from fedrift.experiments.studies import load_optuna, study_storage

    return load_optuna().storages.RDBStorage(study_storage(folder))


def finished_trials(study: Study, name: str) -> int | None:
    """Finished (complete or pruned) trials of the tune folder's study ``name``; None without one."""
    from fedrift.experiments.studies import finished_trials as finished, load_optuna
    from fedrift.experiments.studies import STUDY_DB

    db = study.tune_dir / STUDY_DB
    if not db.is_file():
        return None
    try:
        st = load_optuna().load_study(study_name=name, storage=_storage(study.tune_dir.resolve()))
    except KeyError:
        return None
    return len(finished(st))


def _summary(d: Path) -> dict[str, Any]:
    try:
        doc = json.loads((d / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def setting_dirs(study: Study, entry: Entry) -> list[str]:
    """The folders of an entry's settings in the compare root, one per swept combination, by
    compare's rule (:func:`fedrift.experiments.grid.build_grid`: the entry and the swept values)."""
    short = short_names(list(study.sweep))
    combos: list[list[tuple[str, Any]]] = [[]]
    for key, values in study.sweep.items():
        combos = [c + [(key, parse_value(v) if isinstance(v, str) else v)] for c in combos for v in values]
    return [safe_name("_".join([entry.entry.replace(":", "-"), *(f"{short[k]}={fmt_value(v)}" for k, v in c)]))
            for c in combos]


def _rounds(study: Study, entry: Entry, tune: bool = False) -> int:
    doc = entry_doc(study.base, entry.entry)
    if tune and study.file.tune is not None and study.file.tune.rounds is not None:
        return study.file.tune.rounds
    return int((doc.get("train") or {}).get("rounds") or 50)


def _trial_is_run(study: Study, entry: Entry) -> bool:
    """Whether an entry's chosen trial is its seed-0 run (tuned at the runs' rounds, seed and
    config: compare copies it), so that run costs nothing more."""
    t = study.file.tune
    if not entry.tuned or t is None or study.sweep or t.overrides:
        return False
    seed = t.seed if t.seed is not None else int(study.base.get("seed", 0) or 0)
    return t.rounds in (None, _rounds(study, entry)) and seed == study.seeds[0]


def run_cost(summary: Mapping[str, Any]) -> tuple[float, float] | None:
    """A finished run's (start-up seconds, seconds a round with its evaluation), from its
    ``summary.json`` (``run_seconds``, ``setup_seconds``; older runs: the training's
    ``seconds_per_round``, no start-up); None without either."""
    rounds = int(summary.get("rounds") or 0)
    if summary.get("run_seconds") is not None and summary.get("setup_seconds") is not None and rounds:
        setup = float(summary["setup_seconds"])
        return setup, max(0.0, float(summary["run_seconds"]) - setup) / rounds
    if summary.get("seconds_per_round"):
        return 0.0, float(summary["seconds_per_round"])
    return None


def _mean_cost(costs: list[tuple[float, float]]) -> tuple[float, float] | None:
    if not costs:
        return None
    return sum(c[0] for c in costs) / len(costs), sum(c[1] for c in costs) / len(costs)


def entry_progress(study: Study, entry: Entry, ledger: dict[str, Any]) -> dict[str, Any]:
    """An entry's trials (finished, target) and runs (finished, running, stopped, total), whether
    it is new or changed since the last ``study run`` (by ``study.json``), and the cost its runs
    and trials measured (:func:`run_cost`, their mean)."""
    combos = math.prod(len(v) for v in study.sweep.values()) if study.sweep else 1
    total = combos * len(study.seeds)
    known = (ledger.get("entries") or {}).get(entry.entry)
    last = bool(ledger.get("entries"))  # folders no study ran (an earlier hand-run tune and compare) know no last run
    state = "" if not last else "new" if known is None else "changed" if known.get("hash") != study.entry_hash(entry) else ""
    finished = stopped = running = free = 0
    costs: list[tuple[float, float]] = []
    per_run: list[float] = []
    for d in setting_dirs(study, entry):
        for seed in study.seeds:
            run = study.runs_dir / d / f"seed{seed}"
            s = _summary(run)
            if s.get("status") in FINISHED:
                finished += 1
                cost = run_cost(s) if not s.get("resumed_from_round") else None
                costs += [cost] if cost is not None else []
                whole = s.get("run_seconds", s.get("wall_seconds"))
                per_run += [float(whole)] if whole else []
            elif holder(run) is not None:
                running += 1
            else:
                stopped += bool(s or (run / "metrics.jsonl").is_file())
                free += seed == study.seeds[0] and _trial_is_run(study, entry)
    trials = target = 0
    if entry.tuned:
        target = tune_target(study, entry)
        trials = finished_trials(study, entry.study_name) or 0
        for t in (study.tune_dir / "trials" / entry.study_name).glob("trial*"):
            s = _summary(t)
            cost = run_cost(s) if s.get("status") == "completed" else None
            costs += [cost] if cost is not None else []
    return {"entry": entry.entry, "state": state, "trials": trials, "target": target, "runs": finished,
            "running": running, "stopped": stopped, "total": total, "free": free, "cost": _mean_cost(costs),
            "per_run": sum(per_run) / len(per_run) if per_run else None}


def _ledger(study: Study) -> dict[str, Any]:
    try:
        doc = json.loads((study.runs_dir / "study.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def left_work(study: Study, e: Entry, r: Mapping[str, Any]) -> tuple[int, int]:
    """An entry's runs and trials left (a seed-0 run its chosen trial gives costs nothing)."""
    return r["total"] - r["runs"] - r["free"], max(0, r["target"] - r["trials"])


def seconds_of(study: Study, e: Entry, runs: int, trials: int, cost: tuple[float, float]) -> float:
    """The time of ``runs`` runs and ``trials`` trials of entry ``e`` at ``cost`` (start-up, a round)."""
    setup, per_round = cost
    return runs * (setup + _rounds(study, e) * per_round) + trials * (setup + _rounds(study, e, tune=True) * per_round)


def progress(study: Study, probe: tuple[float, float] | None = None) -> list[str]:
    """One line per entry and a last line with the totals and the estimate of the rest (each
    entry at its measured cost, else the others' mean, else ``probe``'s)."""
    from fedrift.report.select_page import duration_text

    rows = [entry_progress(study, e, _ledger(study)) for e in study.entries]
    measured = [r["cost"] for r in rows if r["cost"] is not None]
    overall = _mean_cost(measured) or probe
    lines, left_s, unknown = [], 0.0, False
    runs_left = trials_left = 0
    for e, r in zip(study.entries, rows):
        cost = r["cost"] or overall
        runs, trials = left_work(study, e, r)
        runs_left, trials_left = runs_left + runs, trials_left + trials
        if cost is None and (runs or trials):
            unknown = True
        left_s += seconds_of(study, e, runs, trials, cost) if cost is not None else 0.0
        parts = [f"tune {r['trials']}/{r['target']} trials" if e.tuned else "not tuned",
                 f"runs {r['runs']}/{r['total']} finished" + (f", {r['running']} running" if r["running"] else "")
                 + (f" ({r['stopped']} stopped, continued next run)" if r["stopped"] else "")]
        if r["per_run"] is not None:
            parts.append(f"{duration_text(r['per_run'])} a run")
        if r["cost"] is not None:
            parts.append(f"{r['cost'][1]:.2f} s a round measured" + (f" after {r['cost'][0]:.1f} s of start-up"
                                                                      if r["cost"][0] else ""))
        note = {"new": " (new since the last run)", "changed": " (changed since the last run: rerun where it differs)"}
        ref = " (reference)" if e is study.reference else ""
        lines.append(f"{e.entry}{ref}{note.get(r['state'], '')}: " + ", ".join(parts))
    t_done, t_all = sum(min(r["trials"], r["target"]) for r in rows), sum(r["target"] for r in rows)
    r_done, r_all = sum(r["runs"] for r in rows), sum(r["total"] for r in rows)
    size = f"{runs_left} runs of {_rounds(study, study.reference)} rounds" + (
        f" and {trials_left} trials of {_rounds(study, study.reference, tune=True)} rounds" if trials_left else "")
    if t_done == t_all and r_done == r_all:
        rest = "nothing left"
    elif overall is None:
        rest = (f"left: {size}; no cost measured yet (fedrift study run {study.path} --dry-run measures the cost "
                "on this machine)")
    else:
        rest = f"left: {size}, about {duration_text(left_s)} in one process" + (
            " (entries not measured yet at the others' cost)" if unknown or len(measured) < len(rows) else "")
    lines.append(f"finished: {t_done} of {t_all} tune trials, {r_done} of {r_all} runs; {rest}")
    return lines


def study_status(path: str | Path, out: str | Path | None = None, overrides: Sequence[str] = ()) -> list[str]:
    """The lines ``fedrift study status`` prints: the study at the size its last ``study run``
    was given (``key=value`` recorded in ``study.json``) unless ``overrides`` say another; the
    process running it, and each run or trial in progress with its round."""
    import time

    from fedrift.experiments.heartbeat import in_progress

    study = load_study(path, out, overrides)
    recorded = _ledger(study).get("overrides") or []
    if not overrides and recorded:
        study = load_study(path, out, recorded)
    head = [f"study {study.path}: runs in {study.runs_dir}" + (f", tune in {study.tune_dir}" if study.tuned_entries else "")
            + (f"; run with {' '.join(recorded)}" if recorded and not overrides else "")]
    for folder, what in ((study.runs_dir / ".study", "study"), (study.runs_dir, "runs"), (study.tune_dir, "tune")):
        who = holder(folder)
        if who is not None:
            head.append(f"running: the {what} folder is held by {who}" if what != "study" else f"running: {who}")
    now = time.time()
    for r in in_progress([study.runs_dir, study.tune_dir]):
        head.append(f"in progress: {r.line(now)} ({r.holder})")
    return head + progress(study)


__all__ = ["entry_progress", "finished_trials", "left_work", "progress", "run_cost", "seconds_of", "setting_dirs",
           "study_status", "tune_target"]
