"""``fedrift study run FILE --dry-run``: what a study will run and about how long it takes here,
before anything runs.

The size is the study file's (with the command's ``key=value``): entries x swept values x
seeds runs, and each tuned entry's trials, with their rounds. The time is each run's start-up
plus its rounds at the cost measured on this machine (:func:`fedrift.experiments.study_status.run_cost`):
the study's own finished runs and trials where there are any, else a probe: the reference
entry's first run for ``PROBE_ROUNDS`` rounds in a temporary folder (its data loaded, its
model built, each round evaluated), at that cost for every entry. Nothing is written to the
study's folder.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Sequence

from fedrift.experiments.study_file import Study, load_study
from fedrift.experiments.study_status import entry_progress, progress, run_cost

PROBE_ROUNDS = 2


def probe(study: Study) -> tuple[tuple[float, float], str]:
    """The reference entry's first run (first seed, first swept values) for ``PROBE_ROUNDS``
    rounds in a temporary folder: its (start-up seconds, seconds a round) and a line saying so."""
    from fedrift.api import run
    from fedrift.experiments.grid import build_grid

    ref = study.reference
    first = {k: v[:1] for k, v in study.sweep.items()}
    with tempfile.TemporaryDirectory(prefix="fedrift-probe-") as tmp:
        grid = build_grid(study.config, [ref.entry], study.seeds[:1], first or None,
                          [*study.overrides, f"train.rounds={PROBE_ROUNDS}"], Path(tmp) / "probe")
        spec = grid.runs[0]
        doc = {**spec.doc, "engine": {**(spec.doc.get("engine") or {}), "checkpoint_every": 0}}
        summary = run(doc).summary
    cost = run_cost(summary)
    assert cost is not None, "a finished run's summary has run_seconds"
    where = f" ({spec.setting.label.partition(' ')[2]})" if study.sweep else ""
    return cost, (f"probe: {ref.entry} seed {spec.seed}{where}, {PROBE_ROUNDS} rounds on this machine: start-up "
                  f"{cost[0]:.1f} s, {cost[1]:.2f} s a round with its evaluation")


def size_lines(study: Study) -> list[str]:
    """What the study runs: its runs and trials, and their rounds."""
    from fedrift.experiments.study_status import _rounds, tune_target

    combos = math.prod(len(v) for v in study.sweep.values()) if study.sweep else 1
    runs = len(study.entries) * combos * len(study.seeds)
    rounds = sum(_rounds(study, e) for e in study.entries) * combos * len(study.seeds)
    sweep = "".join(f" x {len(v)} {k} values" for k, v in study.sweep.items())
    lines = [f"runs: {len(study.entries)} entries{sweep} x {len(study.seeds)} seeds = {runs} runs of "
             f"{_rounds(study, study.reference)} rounds ({rounds:,} rounds in all)"]
    tuned = study.tuned_entries
    if tuned:
        trials = sum(tune_target(study, e) for e in tuned)
        lines.append(f"tune: {len(tuned)} entries, {trials} trials of {_rounds(study, tuned[0], tune=True)} rounds")
    if study.overrides:
        lines.append("overrides (every run): " + " ".join(study.overrides))
    return lines


def dry_run(path: str | Path, out: str | Path | None = None, jobs: int | None = None,
            overrides: Sequence[str] = ()) -> list[str]:
    """The lines ``study run FILE --dry-run`` prints: the size, the cost it is estimated from
    (measured here, or the probe's) and the estimate of what is left."""
    from fedrift.experiments.study_status import _ledger

    study = load_study(path, out, overrides)
    lines = [f"dry run of {study.path} (nothing runs but a probe; nothing is written to {study.out})", *size_lines(study)]
    measured = sum(1 for e in study.entries if entry_progress(study, e, _ledger(study))["cost"] is not None)
    cost = None
    if measured:
        lines.append(f"cost: as measured by this study's finished runs and trials ({measured} of "
                     f"{len(study.entries)} entries)")
    else:
        cost, said = probe(study)
        lines.append(said + " (every entry at this cost: methods that distil or keep ensembles cost more)")
    rest = progress(study, probe=cost)
    lines += rest
    jobs = jobs if jobs is not None else study.file.jobs
    if jobs > 1 and "about " in rest[-1]:
        lines.append(f"with --jobs {jobs}: about 1/{jobs} of that where the cores allow (each process one thread)")
    lines.append(f"then: fedrift study run {study.path}" + (" " + " ".join(overrides) if overrides else "")
                 + " (--budget 30m stops it with a checkpoint of each run in progress; the same command continues)")
    return lines


__all__ = ["PROBE_ROUNDS", "dry_run", "probe", "size_lines"]
