"""``fedrift run | list | partition``: user mistakes get one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrift.errors import FedriftError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedrift", description="Federated learning under client drift.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,list,partition}")

    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.rounds=10")

    sub.add_parser("list", help="algorithms, datasets, models, partitions, executors, samplers")

    part = sub.add_parser("partition", help="print the client x class table and write the bubble plot")
    part.add_argument("-c", "--config", help="YAML config file (defaults when omitted)")
    part.add_argument("--out", default=None, help="folder for partition.png/.json (default: runs/partition-<data>-<name>)")
    part.add_argument("--rows", type=int, default=50, help="most client rows to print (default 50)")
    part.add_argument("overrides", nargs="*", metavar="key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "list":
            return _list()
        return _partition(args)
    except FedriftError as err:
        print(f"fedrift: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("fedrift: interrupted; metrics written so far are kept", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    from fedrift.api import run

    result = run(args.config, args.overrides)
    s = result.summary
    print(
        f"{s['algorithm']} on {s['dataset']} ({s['partition']}, {s['num_clients']} clients): "
        f"final accuracy {s['final_accuracy']:.4f}, best {s['best_accuracy']:.4f} (round {s['best_round']}), "
        f"{s['wall_seconds']:.1f} s"
    )
    print(f"results in {result.output_dir}")
    return 0


def _list() -> int:
    from fedrift.algorithms import ALGORITHMS
    from fedrift.data import DATASETS
    from fedrift.data.partition import PARTITIONS
    from fedrift.engine.executors import EXECUTORS
    from fedrift.engine.sampling import SAMPLERS
    from fedrift.models import MODELS

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
            print(f"  {e.name:<{width}}  {e.doc}")
    return 0


def _partition(args: argparse.Namespace) -> int:
    from fedrift.api import prepare
    from fedrift.report.partition_plot import bubble_plot, count_table, heterogeneity

    prep = prepare(args.config, args.overrides)
    cfg = prep.config
    counts = prep.partition.counts(prep.dataset.y_train.numpy(), prep.dataset.num_classes)
    out = Path(args.out) if args.out else Path("runs") / f"partition-{cfg.data.name}-{cfg.partition.name}"
    out.mkdir(parents=True, exist_ok=True)
    print(count_table(counts, max_rows=args.rows))
    stats = heterogeneity(counts)
    print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()))
    shown = {k: v for k, v in prep.partition.options.items() if k in ("alpha", "classes_per_client")}
    detail = ", ".join(f"{k}={v}" for k, v in shown.items())
    title = f"{cfg.data.name}: {cfg.partition.name}({detail}), {prep.partition.num_clients} clients"
    bubble_plot(counts, out / "partition.png", title)
    prep.partition.save(out / "partition.json")
    print(f"plot in {out / 'partition.png'}, partition in {out / 'partition.json'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
