"""BENCHMARKS.md Z's rows: each setting of one or more result folders against FedAvg's runs of
the first folder, paired by seed (a comparison whose extra rows were run in folders of their own).

Per setting: test %, local % and worst 10 % (mean +- std over completed seeds), and the paired
differences to FedAvg by fedrift's own rule (``fedrift.report.paired.differences``: mean +- the
95% t half-width, ``*`` only with the sign-flip test); where the setting fine-tunes per client
(``eval.personalize``) a second row, its fine-tuned models against FedAvg's local accuracies.

    .venv/bin/python benchmarks/paired_rows.py benchmarks/results/a-personal benchmarks/results/a-personal-babu
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedrift.report.paired import LOCAL_METRICS, PERSONALIZED_METRICS, differences, fmt_diff
from fedrift.report.table import fmt_acc, load_groups, mean_std


def main(folders: list[str]) -> None:
    groups = [g for folder in folders for g in load_groups(Path(folder))[0]]
    ref = next(g for g in groups if g.algorithm == "fedavg")  # the first folder's
    local = [k for k, _ in LOCAL_METRICS]
    print("| setting | runs | test % | local % | worst 10% % | local vs FedAvg | worst 10% vs FedAvg |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for g in groups:
        done = g.done()

        def acc(key: str) -> str:
            return fmt_acc(*mean_std([r.summary.get(key) for r in done]))

        for keys, label, test in ((local, g.algorithm, acc("final_accuracy")),
                                  ([k for k, _ in PERSONALIZED_METRICS], f"{g.algorithm}, fine-tuned per client", "-")):
            if not any(keys[0] in r.summary for r in done):
                continue
            d = differences(g, ref, keys, local) if g is not ref else {}
            diffs = [fmt_diff(d.get(f"{k}_diff_mean"), d.get(f"{k}_diff_ci95"), d.get(f"{k}_diff_significant"))
                     if d else "ref" for k in keys]
            print(f"| {label} | {len(done)}/{len(g.runs)} | {test} | {acc(keys[0])} | {acc(keys[1])} | {' | '.join(diffs)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
