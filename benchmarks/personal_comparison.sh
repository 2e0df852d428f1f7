#!/usr/bin/env bash
# Issue 71 item 4: the global remedies (FedAvg, FedProx, FedGKD, FedADC, SCAFFOLD) against the
# personalised ones (FedPer, LG-FedAvg, FedRep, FedBABU, Ditto, APFL, FedRoD) and FedADC's
# per-client classifier calibration (eval.personalize), on the clients' own test splits: the mean
# and the worst 10% of clients. Tuned on validation data (10% of each client's samples; tune
# scores val_local_accuracy for the per-client methods, val_accuracy for the global ones), then
# 3 seeds. Resumable: tune and compare keep what finished; run the same command again.
#   D: every entry tuned here, 4 trials of 8 rounds (train.lr and its key value: the first 4
#      points of the tuner's seeded Sobol design), then 3 seeds of 15 rounds.
#   A (alpha 0.1): the global entries at benchmarks/tuned/workload-a.yaml's values (8 trials of 12
#      rounds, BENCHMARKS.md "A, every algorithm tuned on a space-filling design"), the personalised
#      ones tuned here with 4 trials of 12 rounds (the same design's first 4 points), then 3 seeds
#      of 20 rounds.
# Usage (repository root): bash benchmarks/personal_comparison.sh [d] [a]   # default both, D first
set -uo pipefail
cd "$(dirname "$0")/.."
F=${F:-.venv/bin/fedrift}; R=${R:-benchmarks/results}; W=${W:-runs/personal}
ENG="engine.executor=sequential engine.threads=1"
PERSONAL=fedper,lgfedavg,fedrep,fedbabu,ditto,apfl,fedrod
REPORT="report.metric=local_accuracy report.tsne=none report.reference=fedavg"
mkdir -p "$W"
for w in ${@:-d a}; do
  if [ "$w" = d ]; then
    ALGS=fedavg,fedprox,fedgkd,fedadc:eval.personalize=true,scaffold,$PERSONAL
    echo "== $(date -u +%T) D: tune"
    $F tune -c examples/workload_d.yaml train.rounds=8 $ENG --trials 4 --jobs 2 --no-report \
        algorithms=$ALGS --out "$W/tune-d" || exit 1
    echo "== $(date -u +%T) D: 3 seeds of 15 rounds"
    $F compare -c examples/workload_d.yaml train.rounds=15 $ENG --jobs 2 seeds=0,1,2 tuned="$W/tune-d" \
        report.at_rounds=5,10,15 $REPORT algorithms=$ALGS --out "$R/d-personal" || exit 1
  else
    A="-c examples/workload_a.yaml partition.val_share=0.1 $ENG"
    echo "== $(date -u +%T) A: tune the personalised entries"
    $F tune $A train.rounds=12 --trials 4 --jobs 2 --no-report algorithms=$PERSONAL --out "$W/tune-a" || exit 1
    # one tuned file: the global entries' committed values (FedADC's under this comparison's entry
    # name, its calibration on) and the personalised entries' tune
    .venv/bin/python - "$W/tune-a/best.yaml" "$W/tuned-a.yaml" <<'PY' || exit 1
import sys, yaml
glob = yaml.safe_load(open("benchmarks/tuned/workload-a.yaml"))
mine = {k: glob[k] for k in ("fedavg", "fedprox", "fedgkd", "scaffold")}
mine["fedadc:variant=nesterov:eval.personalize=true"] = glob["fedadc:variant=nesterov"]
mine.update(yaml.safe_load(open(sys.argv[1])))
yaml.safe_dump(mine, open(sys.argv[2], "w"), sort_keys=False)
PY
    echo "== $(date -u +%T) A: 3 seeds of 20 rounds"
    $F compare $A train.rounds=20 --jobs 2 seeds=0,1,2 tuned="$W/tuned-a.yaml" report.at_rounds=10,20 $REPORT \
        algorithms=fedavg,fedprox,fedgkd,fedadc:variant=nesterov:eval.personalize=true,scaffold,$PERSONAL \
        --out "$R/a-personal" || exit 1
  fi
done
echo "== $(date -u +%T) done"
