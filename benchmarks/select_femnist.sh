#!/usr/bin/env bash
# Issue 51 item 7: `fedrift select` on a real natural partition (FEMNIST, LEAF's layout, 105
# writers with training data: benchmarks/femnist_leaf_sample.sh) within 15 minutes, against a
# tuned compare of the same 4 entries (FedAvg, FedProx, FedGKD, FedADC): each tuned by `fedrift
# tune` (6 finished trials each, median pruning), then run at the select's confirmation seeds
# (1,2,3), so that the pick's regret pairs by seed (benchmarks/select_regret.py).
# Resumable: tune's study, compare's finished runs and select's trials are kept.
#
#   bash benchmarks/select_femnist.sh DATA_ROOT [reference] [select] [small]
#     reference: the tuned table (benchmarks/results/femnist-tune, femnist-table)
#     select:    select --budget 15m (benchmarks/results/femnist-select-15m)
#     small:     select --budget 2m  (benchmarks/results/femnist-select-2m)
set -uo pipefail
cd "$(dirname "$0")/.."
root=${1:?usage: $0 DATA_ROOT [reference] [select] [small]}; shift
F=${F:-.venv/bin/fedrift}; R=${R:-benchmarks/results}
C="-c examples/workload_femnist.yaml data.root=$root"
ALGS=algorithms=fedavg,fedprox,fedgkd,fedadc
for step in ${@:-reference select small}; do
  echo "== $(date -u +%T) $step"
  case $step in
    reference)
      $F tune $C $ALGS --trials 6 --out "$R/femnist-tune" --no-report || exit 1
      $F compare $C $ALGS seeds=1,2,3 tuned="$R/femnist-tune" --out "$R/femnist-table" report.tsne=none || exit 1 ;;
    select) /usr/bin/time -f "select 15m: %e s wall" $F select $C $ALGS --budget 15m seeds=1,2,3 --out "$R/femnist-select-15m" ;;
    small) /usr/bin/time -f "select 2m: %e s wall" $F select $C $ALGS --budget 2m seeds=1,2,3 --out "$R/femnist-select-2m" ;;
    *) echo "unknown step $step; allowed: reference, select, small" >&2; exit 2 ;;
  esac
done
echo "== $(date -u +%T) done"
