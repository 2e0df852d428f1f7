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
#      ones tuned here with 4 trials of 8 rounds (the same design's first 4 points: a smaller budget
#      than the global entries had), then 3 seeds of 20 rounds.
#   Then FedBABU's fine-tuning rate (eval.personalize_lr), which the first tune does not search,
#   tuned on its fine-tuned models at its tuned training rate, 4 trials of 8 rounds, and 3 seeds
#   of it (<w>-personal-babu).
# Usage (repository root): bash benchmarks/personal_comparison.sh [d] [a]   # default both, D first
set -uo pipefail
cd "$(dirname "$0")/.."
F=${F:-.venv/bin/fedrift}; R=${R:-benchmarks/results}; W=${W:-runs/personal}
ENG="engine.executor=sequential engine.threads=1"
# FedBABU is scored after its paper's fine-tuning: the whole model, 5 epochs, on each client's data
BABU=fedbabu:eval.personalize=true:eval.personalize_epochs=5:eval.personalize_part=all
PERSONAL=fedper,lgfedavg,fedrep,$BABU,ditto,apfl,fedrod
REPORT="report.metric=local_accuracy report.tsne=none report.reference=fedavg"
mkdir -p "$W"
# The per-client entries skip the whole test set and validation union except at eval.at_rounds
# and the last round (eval.per_client_test=at_rounds: a pass of each set per client per round
# otherwise, most of their cost); their local accuracies, and so the tuner's score, are the same.
PC="eval.per_client_test=at_rounds"
merge() {  # merge OUT GLOBAL_TUNED [RENAME_FROM RENAME_TO] PERSONAL_BEST: one tuned file for compare
  .venv/bin/python - "$@" <<'PY' || exit 1
import sys, yaml
out, glob_file, *rest = sys.argv[1:]
personal = yaml.safe_load(open(rest[-1]))
glob = yaml.safe_load(open(glob_file))
if len(rest) == 3:  # a global entry's values under this comparison's entry name
    glob[rest[1]] = glob.pop(rest[0])
yaml.safe_dump({**glob, **personal}, open(out, "w"), sort_keys=False)
PY
}
value() {  # value TUNED_YAML ENTRY KEY: the tuned value of KEY for ENTRY
  .venv/bin/python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]]["overrides"][sys.argv[3]])' "$@"
}
babu() {  # babu W CONFIG_ARGS RUN_ARGS: FedBABU's fine-tuning rate tuned on its fine-tuned models'
  # validation accuracy (personalized_val_accuracy) at its tuned training rate, then 3 seeds of it
  local - w=$1 args=$2 runs=$3 lr plr
  set -f  # the bracketed round lists are words, not globs
  lr=$(value "$W/tuned-$w.yaml" "$BABU" train.lr) || exit 1
  echo "== $(date -u +%T) $w: FedBABU's fine-tuning rate, at its training rate $lr"
  $F tune $args train.rounds=8 $PC train.lr=$lr --trials 4 --jobs 2 --no-report space.train.lr=none \
      "space.eval.personalize_lr=log:0.001:0.1" algorithms=$BABU --out "$W/tune-$w-babu" || exit 1
  plr=$(value "$W/tune-$w-babu/best.yaml" "$BABU" eval.personalize_lr) || exit 1
  $F compare $args $runs --jobs 2 seeds=0,1,2 report.metric=local_accuracy report.tsne=none \
      algorithms=fedbabu:train.lr=$lr:eval.personalize=true:eval.personalize_epochs=5:eval.personalize_part=all:eval.personalize_lr=$plr \
      --out "$R/$w-personal-babu" || exit 1
}
for w in ${@:-d a}; do
  if [ "$w" = d ]; then
    GLOBAL=fedavg,fedprox,fedgkd,fedadc:eval.personalize=true,scaffold
    D="-c examples/workload_d.yaml $ENG"
    echo "== $(date -u +%T) D: tune"
    $F tune $D train.rounds=8 --trials 4 --jobs 2 --no-report algorithms=$GLOBAL --out "$W/tune-d" || exit 1
    $F tune $D train.rounds=8 $PC --trials 4 --jobs 2 --no-report algorithms=$PERSONAL --out "$W/tune-d-personal" || exit 1
    merge "$W/tuned-d.yaml" "$W/tune-d/best.yaml" "$W/tune-d-personal/best.yaml"
    echo "== $(date -u +%T) D: 3 seeds of 15 rounds"
    $F compare $D train.rounds=15 $PC "eval.at_rounds=[5,10,15]" --jobs 2 seeds=0,1,2 tuned="$W/tuned-d.yaml" \
        report.at_rounds=5,10,15 $REPORT algorithms=$GLOBAL,$PERSONAL --out "$R/d-personal" || exit 1
    babu d "$D" "train.rounds=15 $PC eval.at_rounds=[5,10,15] report.at_rounds=5,10,15"
  else
    A="-c examples/workload_a.yaml partition.val_share=0.1 $ENG"
    echo "== $(date -u +%T) A: tune the personalised entries"
    $F tune $A train.rounds=8 $PC --trials 4 --jobs 2 --no-report algorithms=$PERSONAL --out "$W/tune-a-personal" || exit 1
    # the global entries' committed values (FedADC's under this comparison's entry name, its
    # calibration on) and the personalised entries' tune
    merge "$W/tuned-a.yaml" benchmarks/tuned/workload-a.yaml fedadc:variant=nesterov \
        fedadc:variant=nesterov:eval.personalize=true "$W/tune-a-personal/best.yaml"
    echo "== $(date -u +%T) A: 3 seeds of 20 rounds"
    $F compare $A train.rounds=20 $PC "eval.at_rounds=[10,20]" --jobs 2 seeds=0,1,2 tuned="$W/tuned-a.yaml" \
        report.at_rounds=10,20 $REPORT \
        algorithms=fedavg,fedprox,fedgkd,fedadc:variant=nesterov:eval.personalize=true,scaffold,$PERSONAL \
        --out "$R/a-personal" || exit 1
    babu a "$A" "train.rounds=20 $PC eval.at_rounds=[10,20] report.at_rounds=10,20"
  fi
done
echo "== $(date -u +%T) done"
