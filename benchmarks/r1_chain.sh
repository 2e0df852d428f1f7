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
#   bash benchmarks/r1_chain.sh r2     # R2: FedADC Table I's design at C = 0.2 (fedadc-table1-cifar10-c0.2.yaml),
#       58 of its 500 rounds (as the GPU's first table: at 20 every FedAvg is still at chance), tuned and
#       run at 58 over the union of the paper's two grids {0.01, 0.03, 0.05, 0.1}, on a validation split,
#       into r2-tune and r2-c02; paired against FedAvg without local momentum (the better FedAvg there).
#       About 24 minutes of a core a run (a median 20 s a round with both cores busy); compare copies each method's
#       seed 0 from its chosen tune trial (the same run), so step 1 (FedAvg, FedADC) is 8 trials and 4 runs,
#       about 5 core-hours, and the whole chain (5 methods) about 12.
#   RESULTS=/tmp/x R2_ROUNDS=1 GRID=0.05 bash benchmarks/r1_chain.sh r2   # a smoke test (nothing committed)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src"
F=.venv/bin/fedrift
R=${RESULTS:-benchmarks/results}
W=${1:-r1}
G=0.01,0.05,0.1 REF=fedavg MORE=""  # G: the paper's lr grid
case $W in
  r1) CFG=examples/workload_r1.yaml TR=20 PAPER=fedgkd-table3-cifar10 ;;
  r3) CFG=examples/workload_r3.yaml TR=15 PAPER=fedgkd-table3-tinyimagenet ;;
  r2) CFG=examples/papers/fedadc-table1-cifar10-c0.2.yaml TR=${R2_ROUNDS:-58} PAPER=fedadc-table1-cifar10
      G=0.01,0.03,0.05,0.1 REF=fedavg:train.momentum=0 MORE="partition.val_share=0.1 train.rounds=$TR" ;;
  *) echo "r1_chain.sh: unknown workload '$W' (allowed: r1, r2, r3)" >&2; exit 2 ;;
esac
GRID=${GRID:-$G} ALPHA=${ALPHA:-0.1}
T="-c $CFG --jobs 2 $MORE" TUNE=$R/$W-tune OUT=$R/$W-a01  # the configs' own alpha, 0.1
[ "$W" != r2 ] || OUT=$R/r2-c02
LABEL="${W^^} alpha $ALPHA"; [ "$W" != r2 ] || LABEL="R2 C = 0.2"
if [ "$ALPHA" != 0.1 ]; then T="$T partition.alpha=$ALPHA" TUNE=$R/$W-tune-a${ALPHA/./} OUT=$R/$W-a${ALPHA/./}; fi
commit() {
  [ "$R" = benchmarks/results ] || return 0
  for i in 1 2 3 4 5 6; do
    (git add "$@" && git commit -q -m "$LABEL: $MSG" -- "$@") && return 0
    sleep 7
  done
}
STEP=0
step() {  # $1 algorithms, $2 dropped space keys
  STEP=$((STEP + 1)); [ "$STEP" -lt "${FROM:-1}" ] && return 0
  A=$1; SP="train.rounds=$TR space.train.lr=$GRID $2"
  echo "== $(date -u +%H:%M) tune $A"; $F tune $T $SP algorithms=$A --out $TUNE || return 1
  MSG="tune $A"; commit $TUNE
  echo "== $(date -u +%H:%M) compare $A"; $F compare $T seeds=0,1,2 tuned=$TUNE algorithms=$A report.reference=$REF \
    report.tsne=none report.paper=$PAPER --out $OUT || return 1
  MSG="3 seeds of $A"; commit $OUT
}
N="space.gamma=none space.beta=none"
if [ "$W" = r1 ]; then
  step fedavg,fedgkd,fedadc "$N" && step fedavg,fedgkd,fedadc,fedcsd "$N space.mu=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01 "$N space.mu=none space.lam=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedgkd_vote,fedprox:mu=0.01,scaffold,fedadc_plus,fedadc:variant=nesterov "$N space.mu=none space.lam=none"
elif [ "$W" = r2 ]; then  # the best FedAvg and FedADC first, then Table I's FedADC+, FedGKD, FedProx,
  # then FedGKD without local momentum (like for like with the reference: with the paper's momentum
  # 0.9 it stays at chance as long as FedAvg with it), then the file's FedAvg (momentum 0.9) (step sets A)
  B=fedavg:train.momentum=0,fedadc G=fedgkd:T=0.5:train.momentum=0
  P=fedadc_plus:variant=nesterov,fedgkd:T=0.5,fedprox:mu=0.01:train.momentum=0 K="space.beta=none space.lam=none space.gamma=none space.mu=none"
  step $B "space.beta=none" && step $B,$P "$K" && step $B,$P,$G "$K" && step $B,$P,$G,fedavg "$K"
else  # the issue's five for R3 first
  step fedavg,fedgkd,fedadc "$N" && step fedavg,fedgkd,fedadc,fedcsd "$N space.mu=none" && \
  step fedavg,fedgkd,fedadc,fedcsd,fedprox:mu=0.01 "$N space.mu=none"
fi
echo "== $(date -u +%H:%M) done"
