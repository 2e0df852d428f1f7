#!/usr/bin/env bash
# Issue 34 item 4: `fedrift select` on workloads A (alpha 0.1) and B at one fifth of the compute
# their full tuned tables took, then the tables' best methods at the confirmation's seeds (1,2,3),
# so that the pick's regret pairs by seed. Resumable: select and the study reuse what finished.
#   A's table: 21 entries x 8 trials x 12 rounds + 189 runs x 30 rounds = 7,686 rounds -> 1,537.
#   B's table: 21 entries x 8 trials x 30 rounds + 63 runs x 100 rounds = 11,340 rounds -> 2,268.
# The tables' best methods are study files (benchmarks/studies/select-a-table-best.yaml,
# select-b-table-best.yaml); this script is the select searches and those studies, in order.
# Usage (repository root; a git worktree keeps a long run off the checkout being edited):
#   bash benchmarks/select_regret.sh [a] [b]     # default both; results in $R
set -uo pipefail
cd "$(dirname "$0")/.."
F=${F:-.venv/bin/fedrift}; R=${R:-benchmarks/results}
ENG="engine.executor=sequential engine.threads=1"
A="-c examples/workload_a.yaml partition.val_share=0.1 $ENG train.rounds=30"
B="-c examples/workload_b.yaml $ENG"
for w in ${@:-a b}; do
  echo "== $(date -u +%T) select $w"
  if [ "$w" = a ]; then
    # select-a01: the first study, before FedAvg's protected centre point; select-a01-r2: since
    $F select $A --budget-rounds 1537 --jobs 2 seeds=1,2,3 --out "$R/select-a01-r2" || exit 1
    echo "== $(date -u +%T) A's table best (FedCSD, tuned) at seeds 1,2,3"
    $F study run benchmarks/studies/select-a-table-best.yaml --out "$R" || exit 1
  else
    $F select $B --budget-rounds 2268 --jobs 2 seeds=1,2,3 --out "$R/select-b" || exit 1
    echo "== $(date -u +%T) B's table best (SlowMo and FedDistill+, tied, tuned) at its seeds"
    $F study run benchmarks/studies/select-b-table-best.yaml --out "$R" || exit 1
  fi
done
echo "== $(date -u +%T) done"
