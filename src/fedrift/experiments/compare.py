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
    A run is finished when its ``summary.json`` says ``completed`` (its ``final_model.pt``
    need not be kept: a clone of committed results reuses them) or ``diverged`` (kept and
    reported as diverged, not rerun), and its ``config.yaml`` agrees with the run's resolved
    config on every key both know and on every key the grid sets. How a run executes
    (``output.*``, ``engine.executor``, ``engine.workers``, ``engine.threads``,
    ``engine.max_parallel_clients``, ``engine.cuda_graphs``,
    ``engine.teacher_cache``, ``engine.client_state``) does not make it a different run;
    the executors give the same results. Any other difference reruns it, and says which key.
    A run that stopped (killed, Ctrl-C) continues from its last checkpoint
    (``engine.checkpoint_every``) instead of from round 1; a checkpoint that cannot be used
    (another config, corrupt) is named and the run rerun from round 1.
    With ``tuned=DIR``, a new run that one of the tune's completed trials already is (by the
    same rule) is copied from it instead of run (:func:`fedrift.experiments.grid.copy_trial`).

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

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedrift.config import Config
from fedrift.engine.folder_lock import FolderLock
from fedrift.errors import ConfigError, writing
from fedrift.experiments.grid import build_grid, run_grid
from fedrift.overrides import parse_algorithm
from fedrift.report.html import ReportOptions, build_report, check_report_names, write_tables
from fedrift.safe_files import make_dir


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
    after: Callable[[Any, dict[str, Any]], None] | None = None,
    deadline: float | None = None,
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
    ``after`` and ``deadline``: see ``fedrift.experiments.grid.run_grid`` (a study's).
    """
    if jobs < 1:
        raise ConfigError(f"jobs: must be at least 1 (got {jobs})")
    echo = print if verbose else (lambda _msg: None)
    opts = ReportOptions.parse(report_options or {})
    grid = build_grid(config, algorithms, seeds, sweep, overrides, out, jobs, tuned)
    check_report_names(opts, [str(a) for a in grid.description["algorithms"]])
    for entry in grid.description["algorithms"] if tuned is not None else []:
        own = {o.partition("=")[0] for o in parse_algorithm(str(entry))[1]}  # the entry's options win
        values = [v if v.partition("=")[0] not in own else f"({v}: the entry's own value instead)"
                  for v in grid.description["tuned"]["overrides"].get(entry) or []]
        echo(f"tuned {entry}: {' '.join(values)}" if values else f"tuned {entry}: not in {tuned}, the config's values")
    for line in grid.description["tuned"]["warnings"] if tuned is not None else []:
        echo(line)
    description = dict(grid.description)
    description["report"] = opts.as_json()
    grid.description = description
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        make_dir(grid.root)
        lock = FolderLock(grid.root, "--out")
    with lock:  # a second compare on this root is refused while this one runs
        run_grid(grid, jobs, echo, after, deadline)
        if report:
            rows, html = build_report(grid.root, opts, echo=echo)
            echo(f"report in {html}")
        else:
            rows = write_tables(grid.root, opts, echo=echo)
    return rows


def write_report(runs_dir: str | Path, out: str | Path | None = None, verbose: bool = True, trust_plugins: bool = False,
                 **options: Any) -> list[dict[str, Any]]:
    """Tables, figures and one self-contained ``report.html`` for a folder of runs.

    ``runs_dir`` is a ``compare`` root (its ``compare.json`` names the grid) or any folder
    holding run folders (found by their ``summary.json``, grouped by config minus seed).
    ``options`` are the ``report.*`` options, e.g. ``at_rounds=[10, 20]``, ``target="fedavg:0.9"``,
    ``tsne=["fedavg"]``. Writes ``results.csv``, ``results.md``, ``figures/`` and
    ``report.html`` (or ``out``) and returns the table's rows. ``trust_plugins``: import the
    plugins the runs' configs name (their code runs: only for folders you trust).
    """
    echo = print if verbose else (lambda _msg: None)
    ReportOptions.parse(options)  # refuses a bad option before anything is read
    rows, html = build_report(Path(runs_dir), options, html_path=out, echo=echo, trust_plugins=trust_plugins)
    echo(f"report in {html}")
    return rows


__all__ = ["compare", "write_report"]
