"""``fedrift run | config | compare | tune | select | study | report | list | partition [export] | download | flower``: user
mistakes get one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fedrift.errors import ConfigError, FedriftError, writing
from fedrift.version import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedrift", description="Federated learning under client drift.")
    p.add_argument("--version", action="version", version=f"fedrift {__version__}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run one experiment",
        description="Train one federation: the config (the defaults, or -c FILE) with the key=value overrides. Writes "
        "RUN_DIR (output.dir, default runs/<algorithm>-<data>-<partition>-s<seed>): config.yaml (the resolved config), "
        "metrics.jsonl (a line per evaluated round), summary.json, final_model.pt, the partition and "
        "checkpoints (engine.checkpoint_every): a stopped run continues with --resume RUN_DIR. fedrift config show "
        "prints the config it would run.",
    )
    run.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    run.add_argument("--resume", metavar="RUN_DIR", default=None,
                     help="continue the stopped run in RUN_DIR from its last checkpoint, with its own config")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.rounds=10")

    conf = sub.add_parser(
        "config", help="print the resolved config as YAML (fedrift run -c takes it back)",
        description="The config a command would run, written out: fedrift config show prints it (fedrift config "
        "alone prints the defaults, as fedrift config show does).",
    )
    conf.set_defaults(config=None, overrides=[])  # no sub-command: what config show prints for the defaults
    csub = conf.add_subparsers(dest="config_command", metavar="{show}")
    show = csub.add_parser(
        "show", help="print the defaults, or -c FILE with the overrides, resolved, as YAML",
        description="Print the config fedrift run would use (the defaults, or -c FILE, with the key=value overrides), "
        "validated, every section with its full options (the algorithm's, the partition's, the model's, the "
        "dataset's), as YAML that fedrift run -c takes back. Reads no data and writes nothing.",
    )
    show.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    show.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. algorithm.name=fedprox")

    comp = sub.add_parser(
        "compare",
        help="run a grid (algorithms x sweep values x seeds, resumable), then the table and report.html",
        description="Run every combination of algorithms=, sweep.KEY= values and seeds=, each run in "
        "OUT/<setting>/seed<k>; finished runs are reused when run again. Then print the table of mean +- std "
        "over seeds and write results.csv, results.md, figures/ and report.html in OUT.",
    )
    comp.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    comp.add_argument("--out", default=None, help="root folder of the grid (default: runs/compare-<config name>)")
    comp.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (default 1)")
    comp.add_argument("--no-report", action="store_true", help="write the tables only, no figures or report.html")
    comp.add_argument(
        "grid",
        nargs="*",
        metavar="key=value",
        help="algorithms=fedavg,fedprox:mu=0.1  seeds=0,1,2  sweep.partition.alpha=0.1,0.5  tuned=TUNE_DIR  "
        "report.at_rounds=10,20 report.target=fedavg:0.9 report.tsne=fedavg,fedprox report.paper=fedgkd-table3-cifar10  "
        "and overrides for every run",
    )

    tun = sub.add_parser(
        "tune",
        help="tune each algorithm's lr and key hyper-parameters on validation accuracy (Optuna, resumable)",
        description="One Optuna study per algorithm over train.lr and the algorithm's own default space (fedrift list "
        "shows it), scored on validation accuracy (the config needs partition.val_share), pruned from the per-round "
        "validation accuracy; the study lives in OUT/study.db, so stopping and running the same command again "
        "continues it. Writes OUT/best.yaml (fedrift compare ... tuned=OUT), trials.csv, tune.md, tune.html.",
    )
    tun.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    tun.add_argument("--out", default=None, help="the tune folder (default: runs/tune-<config name>)")
    tun.add_argument("--trials", type=int, default=20, help="finished trials per algorithm (default 20)")
    tun.add_argument("--jobs", type=int, default=1, help=(
        "trials at once, in processes (default 1); with engine.executor=stacked (auto on a GPU): TPE's "
        "trials stacked this many at a time, in this process"))
    tun.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    tun.add_argument("--pruner", choices=("median", "none"), default="median", help="stop trials behind the median")
    tun.add_argument("--no-report", action="store_true", help="no figures in tune.html")
    tun.add_argument("grid", nargs="*", metavar="key=value",
                     help="algorithms=fedavg,fedprox  space.mu=log:1e-4:1  space.train.lr=0.01,0.05  and overrides")

    sel = sub.add_parser(
        "select",
        help="which drift remedy for this data, within a compute budget: search, confirm over seeds, recommend",
        description="One Optuna study over (algorithm, its hyper-parameters) with successive halving over rounds, "
        "scored on validation accuracy (the config needs partition.val_share); the best entries and FedAvg then run "
        "again over seeds (fedrift compare in OUT/confirm) and the recommendation says the paired test gain over FedAvg "
        "with its interval. Writes OUT/recommendation.yaml (fedrift run -c takes it), select.md, select.html; "
        "resumable: the same command continues it.",
    )
    sel.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    sel.add_argument("--out", default=None, help="the select folder (default: runs/select-<config name>)")
    sel.add_argument("--budget", default=None, help="wall-clock budget of the whole command: 2h, 90m, 1h30m, 3600s")
    sel.add_argument("--budget-rounds", type=int, default=None, help="training rounds of every trial and confirmation run")
    sel.add_argument("--jobs", type=int, default=1, help="trials and runs at once, in processes (default 1)")
    sel.add_argument("--pruner", choices=("sha", "hyperband"), default="sha", help="successive halving (default) or Hyperband")
    sel.add_argument("--no-report", action="store_true", help="no figures")
    sel.add_argument("--dry-run", action="store_true",
                     help="print the plan (trials per entry, rungs, confirmation runs, estimated time) and run nothing")
    sel.add_argument("grid", nargs="*", metavar="key=value",
                     help="algorithms=fedavg,fedprox  seeds=1,2,3  top=3  startup=2  min_rounds=3  eta=3  "
                          "space.mu=log:1e-4:1  report.metric=accuracy|local_accuracy|local_accuracy_worst10 (what the "
                          "recommendation ranks on)  and overrides")

    rep = sub.add_parser(
        "report",
        help="tables, figures and one self-contained report.html for a folder of runs",
        description="Build results.csv, results.md, figures/ and report.html for a compare root, or for any "
        "folder of run folders (grouped by config minus seed).",
    )
    rep.add_argument("runs_dir", help="a compare root or any folder holding run folders")
    rep.add_argument("--out", default=None, help="the HTML file (default: RUNS_DIR/report.html)")
    rep.add_argument("--trust-plugins", action="store_true",
                     help="import the plugins each run's config.yaml names, running their code: only for run folders "
                     "you trust (without it none is imported; the runs are reported from their files)")
    rep.add_argument("options", nargs="*", metavar="report.key=value",
                     help="report.at_rounds=10,20,50 report.target=0.9|fedavg:0.9|none report.tsne=fedavg|none "
                     "report.tsne_points=1000 report.band=minmax|std report.paper=NAME report.plots=false report.title=... "
                     "report.metric=accuracy|local_accuracy|local_accuracy_worst10; "
                     "plugins=[module,...] (imported first; those each run's config.yaml names only with --trust-plugins)")

    lst = sub.add_parser(
        "list", help="algorithms, datasets, models, partitions, executors, samplers, and where each comes from",
        description="Print every registered name a config can use, a line each, with its options' search space for "
        "fedrift tune and, when not built in, the plugin, entry point or module that registered it.",
    )
    lst.add_argument("options", nargs="*", metavar="plugins=[module,...]", help="plugin modules to import first")

    part = sub.add_parser(
        "partition", help="print the client x class table and write the bubble plot",
        description="Load the config's data and partition it as a run would, without training: print the client x "
        "class table of sample counts and the heterogeneity statistics, and write partition.png (the bubble plot) "
        "and partition.json to --out. A run's own partition, as index files any program reads: fedrift partition "
        "export RUN_DIR.",
    )
    part.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    part.add_argument("--out", default=None, help="folder for partition.png/.json (default: runs/partition-<data>-<name>)")
    part.add_argument("--rows", type=int, default=50, help="most client rows to print (default 50)")
    part.add_argument("overrides", nargs="*", metavar="key=value")

    export = sub.add_parser(  # typed as two words: main() joins them
        "partition export", help="write a run's partition as index files, one per client, to train on it without fedrift",
        description="Write the partition of the run in RUN_DIR as one index file per client (its training samples; "
        "val/ and test/: its validation and local test samples), holdout and global_test, and manifest.json (the "
        "dataset, which rows the indices point into, label hashes to check them, the partition, each client's sizes "
        "and class counts), for a Flower app or any training loop to load without fedrift.",
    )
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (output.dir of fedrift run)")
    export.add_argument("--out", default=None, help="a new or empty folder (default: RUN_DIR-partition)")
    export.add_argument("--format", default="npy", metavar="FORMAT",
                        help="npy (int64 arrays, the default), json (lists) or csv (a column 'index')")
    export.add_argument("--overwrite", action="store_true",
                        help="write into a folder that is not empty, replacing only the files an export writes")
    export.add_argument("--trust-plugins", action="store_true",
                        help="import the plugins the run's config.yaml names, running their code (for a dataset of a plugin)")

    down = sub.add_parser(
        "download",
        help="fetch a dataset's official archive, check its md5 and unpack it into --root",
        description="Download the official archive of cifar10, cifar100 or tinyimagenet, check its published "
        "md5 and unpack it into ROOT in the layout data.root=ROOT reads. A complete copy already there is kept.",
    )
    down.add_argument("name", metavar="NAME", help="cifar10 | cifar100 | tinyimagenet")
    down.add_argument("--root", required=True, help="the folder to unpack into (data.root)")
    down.add_argument("--mirror", default=None, metavar="URL",
                      help="fetch URL/<archive file name> instead of the official host (default: $FEDRIFT_DOWNLOAD_MIRROR)")
    down.add_argument("--force", action="store_true", help="download again even if a complete copy is there")

    study = sub.add_parser(
        "study", help="a paper's table (or your own) as one resumable command: a study file's tunes, runs and report",
        description="A study file (YAML) names the base config, the entries, what is tuned, the seeds, the sweeps, "
        "the reference, the published table and the claims; fedrift study run tunes what is not tuned, runs what is "
        "not run (the reference first; every entry's tune and seed 0 before any other seed) and reports what finished.",
    )
    ssub = study.add_subparsers(dest="study_command", required=True, metavar="{run,status}")
    srun = ssub.add_parser(
        "run", help="tune, run and report what is left (resumable: the same command continues)",
        description="Tune the entries not tuned yet, run the runs not run yet (the reference first; every entry's "
        "tune and seed 0 before any other seed) and report what finished in the study's folder; stopped (Ctrl-C, "
        "--budget), the same command continues.",
    )
    srun.add_argument("file", metavar="FILE", help="the study file")
    srun.add_argument("--out", default=None, help="the study's folder (default: the file's out:, else runs/study-<name>)")
    srun.add_argument("--budget", default=None, help="stop as at Ctrl-C after this long (15m, 2h, 900s); run again to go on")
    srun.add_argument("--jobs", type=int, default=None, help="trials and runs at once, in processes (default: the file's jobs:, 1)")
    srun.add_argument("--no-report", action="store_true", help="the tables only, no figures or report.html")
    srun.add_argument("--dry-run", action="store_true",
                      help="say the runs, trials and rounds and estimate the time from a short probe; run nothing")
    srun.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                      help="for every entry, run and trial (train.rounds=20, seeds=0); a change reruns what it changes")
    sstat = ssub.add_parser(
        "status", help="finished, running and left, with the measured cost and the rest's estimate",
        description="Print the study's tunes and runs: finished, running and left, the time they took and an "
        "estimate of the rest's. Runs nothing.",
    )
    sstat.add_argument("file", metavar="FILE", help="the study file")
    sstat.add_argument("--out", default=None, help="the study's folder (default: the file's out:, else runs/study-<name>)")
    sstat.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="the study at this size (default: the key=value its last study run was given)")

    flower = sub.add_parser(
        "flower", help="deploy a config with Flower (SuperLink, SuperNodes): pip install 'fedrift[flower]'",
        description="Run a config on real machines with Flower: fedrift flower app writes the app project that "
        "flwr run starts on a SuperLink and its SuperNodes.",
    )
    fsub = flower.add_subparsers(dest="flower_command", required=True, metavar="{app}")
    app = fsub.add_parser(
        "app", help="write a Flower app project that runs the config (flwr run DIR SUPERLINK)",
        description="Write DIR/pyproject.toml: a Flower app whose ServerApp runs the config's server half on the "
        "SuperLink's machine (the run folder is written there) and whose ClientApp trains one fedrift client on "
        "each SuperNode (node config partition-id=K, data-root=DIR). Start it with: flwr run DIR SUPERLINK.",
    )
    app.add_argument("dir", metavar="DIR", help="a new folder for the app project")
    app.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    app.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                     help="how long the ServerApp waits for every client's SuperNode (default 600)")
    app.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.rounds=10")
    sub.metavar = "{" + ",".join(name for name in sub.choices if " " not in name) + "}"  # partition export: under partition
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["partition", "export"]:  # a sub-command beside partition's own key=value tokens
        argv[:2] = ["partition export"]
    args, extra = parser.parse_known_args(argv)
    # compare and report take key=value tokens before and after their --options
    tail = {"compare": "grid", "tune": "grid", "select": "grid", "report": "options", "list": "options", "flower": "overrides",
            "config": "overrides", "study": "overrides"}.get(args.command)
    if extra and (tail is None or any(x.startswith("-") or "=" not in x for x in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if tail:
        setattr(args, tail, [*getattr(args, tail), *extra])
    terminated: list[int] = []
    if hasattr(sys.stdout, "reconfigure"):  # a line as it is said, also into a file (a study's log)
        sys.stdout.reconfigure(line_buffering=True)
    try:
        with _stop_on_sigterm(terminated):
            code = _dispatch(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return code
    except BrokenPipeError:
        # the reader of our output went away (fedrift list | head -3): whatever the command
        # wrote to files is complete; stop quietly, as a tool killed by SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except FedriftError as err:
        print(f"fedrift: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as err:
        result = getattr(err, "result", None)  # fedrift.api wrote the interrupted summary
        message = result.summary.get("message") if result is not None else None
        if args.command == "compare":
            message = ("interrupted; the runs in progress were stopped and recorded as interrupted; run the same "
                       "fedrift compare command again to continue (finished runs are kept, stopped ones continue "
                       "from their checkpoints)")
        elif args.command == "tune":
            message = ("interrupted; the trials in progress were stopped and recorded as interrupted; run the same "
                       "fedrift tune command again to continue (finished trials are kept, interrupted ones continue "
                       "from their checkpoints; best.yaml has the best of those finished so far)")
        elif args.command == "study":
            message = ("interrupted; the trials or runs in progress were stopped and recorded as interrupted; run the "
                       "same fedrift study run command again to continue (finished trials and runs are kept)")
        elif args.command == "select":
            message = ("interrupted; the trials or runs in progress were stopped and recorded as interrupted; run the "
                       "same fedrift select command again to continue (finished trials and runs are kept)")
        said = message or "interrupted; metrics written so far are kept"
        if terminated:
            print(f"fedrift: stopped by SIGTERM: {said}", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"fedrift: {said}", file=sys.stderr)
        return 130


@contextmanager
def _stop_on_sigterm(came: list[int]) -> Iterator[None]:
    """SIGTERM (``kill PID``, ``timeout``, a scheduler's stop) stops a command as Ctrl-C does:
    the run's summary says interrupted, its checkpoint is kept, the line names the command
    that continues; ``came`` gets the signal's number (the exit status is then 143). Only in
    the main thread, and the earlier handler is back once the command ends (a library or test
    caller keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if not came:  # once: the stopping itself (summaries, last writes) is not interrupted again
            came.append(signum)
            raise KeyboardInterrupt

    earlier = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, earlier)


def _dispatch(args: argparse.Namespace) -> int:
    commands = {"run": _run, "config": _config, "compare": _compare, "tune": _tune, "select": _select, "report": _report,
                "list": _list, "download": _download, "partition": _partition, "partition export": _partition_export,
                "flower": _flower, "study": _study}
    return commands[args.command](args)


def _run(args: argparse.Namespace) -> int:
    from fedrift.api import resume, run

    if args.resume is not None and args.config is not None:
        raise ConfigError("--resume: the run continues with its own config.yaml; allowed: --resume RUN_DIR without -c")
    result = resume(args.resume, args.overrides) if args.resume is not None else run(args.config, args.overrides)
    s = result.summary
    if args.resume is not None:
        start = s["resumed_from_round"]
        print(f"continued from the checkpoint of round {start}" if start else "no checkpoint: ran again from round 1")
    print(
        f"{s['algorithm']} on {s['dataset']} ({s['partition']}, {s['num_clients']} clients): "
        f"final accuracy {s['final_accuracy']:.4f}, best {s['best_accuracy']:.4f} (round {s['best_round']}), "
        f"{s['wall_seconds']:.1f} s"
    )
    if s.get("best_val_round") is not None:
        print(f"at the best validation accuracy {s['best_val_accuracy']:.4f} (round {s['best_val_round']}): "
              f"test accuracy {s['test_accuracy_at_best_val']:.4f}")
    if s.get("calibrated_accuracy") is not None:  # CCVR: its final model is the calibrated one
        print(f"calibrated model (final_model.pt): test accuracy {s['calibrated_accuracy']:.4f}")
    print(f"results in {result.output_dir}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from fedrift.config import load_config
    from fedrift.engine.build import config_yaml, shared_options

    print(config_yaml(load_config(args.config, args.overrides, shared_options)), end="")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from fedrift.experiments.compare import compare
    from fedrift.experiments.grid import parse_grid_tokens

    grid = parse_grid_tokens(args.grid)
    compare(
        args.config,
        algorithms=grid["algorithms"],
        seeds=grid["seeds"],
        sweep=grid["sweep"],
        overrides=grid["overrides"],
        out=args.out,
        jobs=args.jobs,
        report=not args.no_report,
        report_options=grid["report"],
        tuned=grid["tuned"],
    )
    return 0


def _tune(args: argparse.Namespace) -> int:
    from fedrift.experiments.grid import parse_grid_tokens
    from fedrift.experiments.tune import tune

    grid = parse_grid_tokens(args.grid)
    for what in ("seeds", "tuned"):
        if grid[what] is not None:
            raise ConfigError(f"{what}: not a tune option; a tune runs its trials at the config's seed")
    if grid["sweep"] or grid["report"]:
        raise ConfigError("sweep./report.: not tune options; allowed: algorithms=, space.KEY=SPEC and config overrides")
    space = {}
    overrides = []
    for item in grid["overrides"]:
        key, _, raw = item.partition("=")
        if key.startswith("space."):
            if not key[len("space."):]:
                raise ConfigError(f"{item!r}: name the key, e.g. space.mu=log:1e-4:1")
            space[key[len("space."):]] = raw
        else:
            overrides.append(item)
    tune(args.config, algorithms=grid["algorithms"], space=space, overrides=overrides, out=args.out,
         trials=args.trials, jobs=args.jobs, seed=args.seed, pruner=args.pruner, report=not args.no_report)
    return 0


SELECT_KEYS = {"top": int, "startup": int, "min_rounds": int, "eta": int}


def _select(args: argparse.Namespace) -> int:
    from fedrift.experiments.grid import parse_grid_tokens
    from fedrift.experiments.select import select

    grid = parse_grid_tokens(args.grid)
    report = dict(grid["report"] or {})
    metric = report.pop("metric", None)  # what the verdict ranks on: the one report option select takes
    if grid["sweep"] or report or grid["tuned"] is not None:
        raise ConfigError("sweep./report./tuned=: not select options; allowed: algorithms=, seeds=, top=, startup=, "
                          "min_rounds=, eta=, report.metric=, space.KEY=SPEC and config overrides")
    space, overrides, options = {}, [], {}
    for item in grid["overrides"]:
        key, _, raw = item.partition("=")
        key = key.strip()
        if key.startswith("space.") and key != "space.":
            space[key[len("space."):]] = raw
        elif key in SELECT_KEYS:
            try:
                options[key] = int(raw)
            except ValueError:
                raise ConfigError(f"{key}: {raw!r} is not an integer") from None
        else:
            overrides.append(item)
    select(args.config, algorithms=grid["algorithms"], overrides=overrides, out=args.out, budget=args.budget,
           budget_rounds=args.budget_rounds, seeds=grid["seeds"], jobs=args.jobs, pruner=args.pruner, space=space,
           report=not args.no_report, dry_run=args.dry_run, metric=metric, **options)
    return 0


def _report(args: argparse.Namespace) -> int:
    from fedrift.experiments.compare import write_report

    options = {}
    for item in args.options:
        key, sep, raw = item.partition("=")
        if key.strip() == "plugins" and sep:
            _plugins(raw)
            continue
        if not sep or not key.startswith("report.") or key == "report.":
            raise ConfigError(f"{item!r}: report options are report.key=value, e.g. report.at_rounds=10,20")
        options[key[len("report."):]] = raw
    write_report(args.runs_dir, args.out, trust_plugins=args.trust_plugins, **options)
    return 0


def _plugins(raw: str) -> None:
    """Import the modules of a ``plugins=[a,b]`` token (and the installed entry points)."""
    import yaml

    from fedrift import yamlio
    from fedrift.config import plugin_list
    from fedrift.plugins import load_plugins

    try:
        value = yamlio.load(raw)
    except yaml.YAMLError:
        value = raw
    load_plugins(plugin_list(value))


def _list(args: argparse.Namespace) -> int:
    from fedrift.algorithms import ALGORITHMS
    from fedrift.data import DATASETS
    from fedrift.data.partition import PARTITIONS
    from fedrift.engine.executors import EXECUTORS
    from fedrift.engine.sampling import SAMPLERS
    from fedrift.models import MODELS
    from fedrift.plugins import load_plugins

    load_plugins()  # the installed entry points
    for item in args.options:
        key, sep, raw = item.partition("=")
        if key.strip() != "plugins" or not sep:
            raise ConfigError(f"{item!r}: fedrift list takes only plugins=[module,...]")
        _plugins(raw)
    for title, reg in (
        ("algorithms", ALGORITHMS),
        ("datasets", DATASETS),
        ("models", MODELS),
        ("partitions", PARTITIONS),
        ("executors", EXECUTORS),
        ("samplers", SAMPLERS),
    ):
        print(f"{title}:")
        width = max(len(e.name) for e in reg)
        for e in reg:
            origin = "" if e.source == "built in" else f"[{e.source}] "
            space = f" [tune: {', '.join(f'{k}={v}' for k, v in e.space.items())}]" if e.space else ""
            print(f"  {e.name:<{width}}  {origin}{e.doc}{space}")
    print("(all built in, except those marked [plugin ...], [entry point ...] or [module ...])")
    return 0


def _partition(args: argparse.Namespace) -> int:
    from fedrift.api import prepare
    from fedrift.report.partition_plot import bubble_plot, count_table, heterogeneity

    prep = prepare(args.config, args.overrides)
    cfg = prep.config
    counts = prep.partition.counts(prep.dataset.y_train.numpy(), prep.dataset.num_classes)
    out = Path(args.out) if args.out else Path("runs") / f"partition-{cfg.data.name}-{cfg.partition.name}"
    with writing("--out", "; allowed: a folder this user can create and write", "create or write"):
        out.mkdir(parents=True, exist_ok=True)
    print(count_table(counts, max_rows=args.rows))
    stats = heterogeneity(counts)
    print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()))
    shown = {k: v for k, v in prep.partition.options.items() if k in ("alpha", "classes_per_client")}
    detail = ", ".join(f"{k}={v}" for k, v in shown.items())
    title = f"{cfg.data.name}: {cfg.partition.name}({detail}), {prep.partition.num_clients} clients"
    with writing("--out", "; allowed: a folder this user can create and write"):
        bubble_plot(counts, out / "partition.png", title)
        prep.partition.save(out / "partition.json")
    print(f"plot in {out / 'partition.png'}, partition in {out / 'partition.json'} and {out / 'partition.bin'}")
    return 0


def _partition_export(args: argparse.Namespace) -> int:
    from fedrift.data.partition_export import export_partition

    out, doc = export_partition(args.run_dir, args.out, args.format, args.overwrite, args.trust_plugins)
    n, files = doc["partition"]["num_clients"], doc["files"]
    kinds = ", ".join(f["path"].replace("{id:05d}", "*") for f in files.values())
    print(f"{doc['partition']['name']} partition of {n} clients in {out}: {kinds}, manifest.json")
    space = doc["index_spaces"].get("source") or doc["index_spaces"]["train"]
    print(f"client indices point into {space['what']}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from fedrift.data.download import download

    print(download(args.name, Path(args.root).expanduser(), mirror=args.mirror, force=args.force))
    return 0


def _study(args: argparse.Namespace) -> int:
    if args.study_command == "status":
        from fedrift.experiments.study_status import study_status

        print("\n".join(study_status(args.file, args.out, args.overrides)))
        return 0
    from fedrift.experiments.study_run import run_study

    if args.dry_run:
        from fedrift.experiments.study_plan import dry_run

        print("\n".join(dry_run(args.file, args.out, args.jobs, args.overrides)))
        return 0
    run_study(args.file, out=args.out, budget=args.budget, jobs=args.jobs, report=not args.no_report,
              overrides=args.overrides)
    return 0


def _flower(args: argparse.Namespace) -> int:
    from fedrift.deploy.project import CHECKLIST, write_app

    out = write_app(Path(args.dir).expanduser(), args.config, args.overrides, wait_seconds=args.wait)
    print(f"Flower app in {out}; run it with: flwr run {out} SUPERLINK  (SuperNodes: --node-config 'partition-id=K')")
    print("\n".join((out / CHECKLIST).read_text().splitlines()[2:]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
