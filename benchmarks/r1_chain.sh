#!/bin/bash
# The real-image chains on the CPU (issue 30): each step tunes the learning rate of the methods so
# far on the papers' grid {0.01, 0.05, 0.1} (their other keys at their defaults: space.KEY=none),
# then runs their 3 seeds beside FedAvg's, most informative first. Resumable (tune and compare
# reuse finished trials and runs); every finished step is committed.
#   bash benchmarks/r1_chain.sh        # R1: examples/workload_r1.yaml, tuned at 20 of its 40 rounds
#   bash benchmarks/r1_chain.sh r3     # R3: examples/workload_r3.yaml (Tiny-ImageNet 32x32), 15 of its 30
#   ALPHA=0.5 bash benchmarks/r1_chain.sh   # another alpha: tuned at it, into r1-tune-a05 and r1-a05
#   FROM=3 bash benchmarks/r1_chain.sh r3   # from step 3 on (a tune folder refuses a shorter list of methods
#                                           # than it holds, so a chain resumes at its first unfinished step)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src"
F=.venv/bin/fedrift
R=benchmarks/results
W=${1:-r1}
case $W in
  r1) CFG=examples/workload_r1.yaml TR=20 PAPER=fedgkd-table3-cifar10 ;;
  r3) CFG=examples/workload_r3.yaml TR=15 PAPER=fedgkd-table3-tinyimagenet ;;
  *) echo "r1_chain.sh: unknown workload '$W' (allowed: r1, r3)" >&2; exit 2 ;;
esac
ALPHA=${ALPHA:-0.1}
T="-c $CFG --jobs 2" TUNE=$R/$W-tune OUT=$R/$W-a01  # the configs' own alpha, 0.1
if [ "$ALPHA" != 0.1 ]; then T="$T partition.alpha=$ALPHA" TUNE=$R/$W-tune-a${ALPHA/./} OUT=$R/$W-a${ALPHA/./}; fi
commit() {
  for i in 1 2 3 4 5 6; do
    (git add "$@" && git commit -q -m "${W^^} alpha $ALPHA: $MSG" -- "$@") && return 0
    sleep 7
  done
}
STEP=0
step() {  # $1 algorithms, $2 dropped space keys
  STEP=$((STEP + 1)); [ "$STEP" -lt "${FROM:-1}" ] && return 0
  A=$1; SP="train.rounds=$TR space.train.lr=0.01,0.05,0.1 $2"
  echo "== $(date -u +%H:%M) tune $A"; $F tune $T $SP algorithms=$A --out $TUNE || return 1
  MSG="tune $A"; commit $TUNE
  echo "== $(date -u +%H:%M) compare $A"; $F compare $T seeds=0,1,2 tuned=$TUNE algorithms=$A report.reference=fedavg \
    report.tsne=none report.paper=$PAPER --out $OUT || return 1
  MSG="3 seeds of $A"; commit $OUT
}
N="space.gamma=none space.beta=none"
if [ "$W" = r1 ]; then
  step fedavg,fedgkd,fedadc "$N" && step fedavg,fedgkd,fedadc,fedcsd "$N space.mu=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01 "$N space.mu=none space.lam=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01,scaffold,fedadc_plus,fedadc:variant=nesterov "$N space.mu=none space.lam=none"
else  # the issue's five for R3 first
  step fedavg,fedgkd,fedadc "$N" && step fedavg,fedgkd,fedadc,fedcsd "$N space.mu=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedprox:mu=0.01 "$N space.mu=none"
fi
echo "== $(date -u +%H:%M) done"
