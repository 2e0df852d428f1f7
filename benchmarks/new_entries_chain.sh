#!/bin/bash
# Issue 35 after workload A at alpha 0.1 (benchmarks/a_new_chain.sh): the probes that say
# whether FedACG's and FedDC's A rows are the methods or faults, then workload D (FedBN first),
# workload B, and A at alpha 0.5 and 1.0, each entry tuned and run with the budget and commands
# of its workload's table (BENCHMARKS.md). Resumable: tune and compare reuse finished trials and
# runs; every finished step is committed. Usage (repository root):
#   bash benchmarks/new_entries_chain.sh [probes] [a01] [d] [b] [a05]     # default: all, in this order
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src"
F=.venv/bin/fedrift
R=benchmarks/results
A01="fedacg fedadam fedlc feddecorr fedsam feddc fedexp elastic fedyogi fedasam ccvr fedadagrad"  # a_new_chain.sh's
# FedDC with its authors' gradient clipping at norm 10 (unclipped, it collapses on A: the probes)
DC=feddc:train.clip_grad_norm=10
NEW="fedacg fedadam fedlc feddecorr fedsam $DC fedexp elastic fedyogi fedasam ccvr fedadagrad"
R8="model.name=resnet8:model.norm=batch"  # FedBN needs BatchNorm: ResNet-8's (learns too slowly on D: a record)
BN="model.norm=batch"  # and the FedAvg CNN's (BatchNorm after both convolutions): FedBN's row

commit() {  # commit "message" paths...: retried, the other chain may hold git's lock
  local msg=$1; shift
  for _ in 1 2 3 4 5 6; do
    (git add "$@" && git commit -q -m "issue 35: $msg" -- "$@") && return 0
    sleep 7
  done
}

merge_tuned() {  # merge_tuned TABLE_FILE NEW_BEST OUT: the table's tuned values, the new entries' added
  .venv/bin/python - "$@" <<'PY'
import sys, yaml
old, new, out = sys.argv[1:]
doc = yaml.safe_load(open(old)) if old != "-" else {}
doc.update(yaml.safe_load(open(new)))
yaml.safe_dump(doc, open(out, "w"), sort_keys=False)
PY
}

# grow WORKLOAD TUNE_ARGS COMPARE_ARGS TABLE_TUNED REFERENCE ENTRIES... (TABLE_TUNED "-": none;
# REFERENCE "": the entries hold it): one entry at a time
# (tune, then its seeds beside the reference), the tune and the compare folders growing.
grow() {
  local w=$1 targs=$2 cargs=$3 table=$4 ref=$5; shift 5
  local done="" e
  for e in "$@"; do
    done=${done:+$done,}$e
    echo "== $(date -u +%H:%M) $w: tune $e"
    $F tune $targs algorithms=$done --out $R/tune-$w-new || continue
    commit "$w, tune $e" $R/tune-$w-new
    merge_tuned "$table" $R/tune-$w-new/best.yaml $R/tune-$w-new/with-table.yaml
    echo "== $(date -u +%H:%M) $w: compare ${ref:+$ref,}$done"
    $F compare $cargs tuned=$R/tune-$w-new/with-table.yaml algorithms=${ref:+$ref,}$done --out $R/workload-$w-new || continue
    commit "$w, 3 seeds of $e" $R/workload-$w-new
  done
}

A="-c examples/workload_a.yaml partition.val_share=0.1 engine.executor=sequential engine.threads=1 --jobs 2"
for stage in ${@:-probes a01 d b a05}; do
  case $stage in
  probes)
    # FedDC at its tuned rate with its authors' gradient clipping at norm 10, and at FedAvg's
    # rate; FedACG with a small look-ahead at FedAvg's rate; on A's seeds at A's 30 rounds
    echo "== $(date -u +%H:%M) probes"
    $F compare $A train.rounds=30 seeds=0,1,2 sweep.partition.alpha=0.1 report.at_rounds=10,20,30 report.tsne=none \
      report.reference=fedavg output.save_model=false --out $R/probes-a01-new \
      algorithms=fedavg:train.lr=0.0124,feddc:alpha=0.0232:train.lr=0.0514:train.clip_grad_norm=10,fedacg:lam=0.3:beta=0.001:train.lr=0.0124,feddc:alpha=0.0232:train.lr=0.0124 \
      && commit "A alpha 0.1, FedACG and FedDC probes" $R/probes-a01-new ;;
  a01)
    # clipped FedDC joins A's alpha 0.1 tune and seeds (a_new_chain.sh's commands, its entries kept)
    all=$(echo $A01 | tr ' ' ,),$DC
    echo "== $(date -u +%H:%M) A alpha 0.1: tune $DC"
    $F tune $A train.rounds=12 --trials 8 algorithms=$all --out $R/tune-a01-new || exit 1
    commit "A alpha 0.1, tune $DC" $R/tune-a01-new
    merge_tuned benchmarks/tuned/workload-a.yaml $R/tune-a01-new/best.yaml $R/tune-a01-new/with-table.yaml
    $F compare $A train.rounds=30 seeds=0,1,2 tuned=$R/tune-a01-new/with-table.yaml sweep.partition.alpha=0.1 \
      report.at_rounds=10,20,30 report.tsne=none report.reference=fedavg report.claims=papers algorithms=fedavg,$all \
      --out $R/workload-a-new && commit "A alpha 0.1, 3 seeds of $DC" $R/workload-a-new ;;
  d)
    # D's budget (BENCHMARKS.md "D"): 8 rounds a trial, 15 rounds a run; 8 trials as A and B now.
    # FedAvg on the CNN, and with BatchNorm (ResNet-8's, then the CNN's): the references of the
    # CNN rows and of FedBN's.
    grow d "-c examples/workload_d.yaml engine.threads=1 --jobs 2 train.rounds=8 --trials 8" \
      "-c examples/workload_d.yaml engine.threads=1 --jobs 2 train.rounds=15 seeds=0,1,2 report.at_rounds=5,10,15 report.tsne=none report.reference=fedavg output.save_model=false" \
      - "" fedavg fedavg:$R8 fedbn:$R8 fedavg:$BN fedbn:$BN $NEW ;;
  b)
    grow b "-c examples/workload_b.yaml engine.executor=sequential engine.threads=1 --jobs 2 train.rounds=30 --trials 8" \
      "-c examples/workload_b.yaml engine.executor=sequential engine.threads=1 --jobs 2 seeds=0,1,2 output.save_model=false report.at_rounds=10,20,50,100 report.tsne=none report.reference=fedavg report.claims=papers" \
      benchmarks/tuned/workload-b.yaml fedavg $NEW ;;
  a05)
    # A's table runs alpha 0.5 and 1.0 with the values tuned at 0.1 (BENCHMARKS.md "A, every algorithm tuned")
    all=fedavg,$(echo $NEW | tr ' ' ,)
    echo "== $(date -u +%H:%M) A at alpha 0.5 and 1.0"
    $F compare $A train.rounds=30 seeds=0,1,2 tuned=$R/tune-a01-new/with-table.yaml sweep.partition.alpha=0.1,0.5,1.0 \
      report.at_rounds=10,20,30 report.tsne=none report.reference=fedavg report.claims=papers algorithms=$all \
      --out $R/workload-a-new && commit "A alpha 0.5 and 1.0" $R/workload-a-new ;;
  esac
done
echo "== $(date -u +%H:%M) done"
