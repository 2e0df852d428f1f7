#!/bin/bash
# Issue 35: the newer entries on workload A at alpha 0.1, one at a time, most informative first
# (BENCHMARKS.md "The newer remedies on workload A"). Resumable: tune and compare reuse finished
# trials and runs; each entry's tune and seeds are committed as they finish.
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src"
F=.venv/bin/fedrift
R=benchmarks/results
T="-c examples/workload_a.yaml partition.val_share=0.1 engine.executor=sequential engine.threads=1 --jobs 2"
commit() {
  for _ in 1 2 3 4 5 6; do
    (git add "$@" && git commit -q -m "A alpha 0.1, issue 35: $MSG" -- "$@") && return 0
    sleep 7
  done
}
DONE=""
for a in fedacg fedadam fedlc feddecorr fedsam feddc fedexp elastic fedyogi fedasam ccvr fedadagrad; do
  DONE=${DONE:+$DONE,}$a
  echo "== $(date -u +%H:%M) tune $a"
  $F tune $T train.rounds=12 --trials 8 algorithms=$DONE --out $R/tune-a01-new || continue
  MSG="tune $a"; commit $R/tune-a01-new
  # the table's tuned values (benchmarks/tuned/workload-a.yaml, FedAvg's among them) and the new entries'
  .venv/bin/python - $R/tune-a01-new/best.yaml benchmarks/tuned/workload-a.yaml $R/tune-a01-new/with-table.yaml <<'PY'
import sys, yaml
new, old, out = sys.argv[1:]
doc = yaml.safe_load(open(old)); doc.update(yaml.safe_load(open(new)))
yaml.safe_dump(doc, open(out, "w"), sort_keys=False)
PY
  echo "== $(date -u +%H:%M) compare fedavg,$DONE"
  $F compare $T train.rounds=30 seeds=0,1,2 tuned=$R/tune-a01-new/with-table.yaml sweep.partition.alpha=0.1 \
    report.at_rounds=10,20,30 report.tsne=none report.reference=fedavg report.claims=papers algorithms=fedavg,$DONE \
    --out $R/workload-a-new || continue
  MSG="3 seeds of $a"; commit $R/workload-a-new
done
echo "== $(date -u +%H:%M) done"
