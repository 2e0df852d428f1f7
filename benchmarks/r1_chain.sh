#!/bin/bash
# R1 chain: tune then 3 seeds, most informative first. Resumable (tune and compare reuse finished runs).
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src"
F=.venv/bin/fedrift
R=benchmarks/results
T="-c examples/workload_r1.yaml --jobs 2"
commit() {
  for i in 1 2 3 4 5 6; do
    (git add "$@" && git commit -q -m "R1 alpha 0.1: $MSG" -- "$@") && return 0
    sleep 7
  done
}
step() {  # $1 algorithms, $2 dropped space keys
  A=$1; SP="train.rounds=20 space.train.lr=0.01,0.05,0.1 $2"
  echo "== $(date -u +%H:%M) tune $A"; $F tune $T $SP algorithms=$A --out $R/r1-tune || return 1
  MSG="tune $A"; commit benchmarks/results/r1-tune
  echo "== $(date -u +%H:%M) compare $A"; $F compare $T seeds=0,1,2 tuned=$R/r1-tune algorithms=$A report.reference=fedavg \
    report.tsne=none report.paper=fedgkd-table3-cifar10 --out $R/r1-a01 || return 1
  MSG="3 seeds of $A"; commit benchmarks/results/r1-a01
}
N="space.gamma=none space.beta=none"
step fedavg,fedgkd,fedadc "$N" && step fedavg,fedgkd,fedadc,fedcsd "$N space.mu=none" && \
step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01 "$N space.mu=none space.lam=none" && \
step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01,scaffold,fedadc_plus,fedadc:variant=nesterov "$N space.mu=none space.lam=none"
echo "== $(date -u +%H:%M) done"
