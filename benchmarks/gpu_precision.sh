#!/usr/bin/env bash
# Issue 49 item 4: what `train.precision: bf16` does to R1's accuracy, over 3 seeds, in one device
# call. `fedrift compare` of examples/workload_r1.yaml (FedAvg, ResNet-8 GN16, Dirichlet 0.1, 20
# clients, 4 a round, 2 local epochs, $ROUNDS rounds) at train.precision fp32 and bf16, seeds
# 0,1,2, each precision's seeds one stack (engine.executor stacked, steps captured as CUDA
# graphs), the two stacks in two processes, on the CIFAR-10 subset that travels
# (.gpu/cifar/SUBSET.txt). SIGINT at $BUDGET s: finished runs and the table stay (a rerun of the
# compare resumes the rest from their checkpoints).
#
# The subset's zip (43 MB) does not travel beside the tree (45 MB; 64 MB a call), so it travels
# in parts, one a call, stashed in the machine's /tmp while it is held (30 s idle), as
# gpu_r1_full.sh's zip does. Here, once:
#   STEP=parts CIFAR_ZIP=.gpu/cifar/cifar10-jpeg-subset.zip WHL=.gpu/whlmin bash benchmarks/gpu_r1_full.sh
# Device, each call at once after the last: carry [".gpu/cifarA"]: STEP=stash bash benchmarks/gpu_precision.sh;
#   the same for each part but the last; then carry [".gpu/whlmin", ".gpu/cifar<last>"]:
#   bash benchmarks/gpu_precision.sh (joins the parts: 40,000 images, then the compare)
# Here, to check it end to end (minutes on this CPU):
#   DEVICE=cpu ROUNDS=1 INSTALL=0 PY=.venv/bin/python OUT=/tmp/gpu-prec bash benchmarks/gpu_precision.sh
# Environment: ROUNDS (40: R1's on the CPU), SEEDS (0,1,2), BUDGET (330), JOBS (2), DEVICE (cuda),
# PY (python3), INSTALL (1), WHL (.gpu/whlmin), SITE (/tmp/site), OUT (the device's $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; WHL=${WHL:-.gpu/whlmin}; OUT=${OUT:-$PWD/runs/gpu-out}
DEVICE=${DEVICE:-cuda}; ROUNDS=${ROUNDS:-40}; SEEDS=${SEEDS:-0,1,2}; BUDGET=${BUDGET:-330}; JOBS=${JOBS:-2}
STASH=/tmp/precision-parts; DATA=/tmp/cifar-subset
mkdir -p "$OUT" "$STASH" "$DATA"
for z in .gpu/cifar[A-Z]/*.zip; do [ -f "$z" ] && cp "$z" "$STASH/"; done
if [ "${STEP:-run}" = stash ]; then
  ls -l "$STASH" && exit 0
fi
if [ "${INSTALL:-1}" = 1 ] && ls "$WHL"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    || { echo "gpu_precision: installing $WHL failed"; exit 1; }
fi
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c 'import torch; print("torch", torch.__version__, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")'
# the data: the subset whole where it travelled (.gpu/cifar), else the parts joined
if [ -f .gpu/cifar/SUBSET.txt ]; then DATA=.gpu/cifar; else
  "$PY" benchmarks/join_parts.py "$DATA/cifar10-jpeg-subset.zip" 40000 "$STASH"/*.zip || exit 1
fi
echo "data: the CIFAR-10 JPEG q75 subset (.gpu/cifar/SUBSET.txt: 3,000 training images a class, all 10,000 test images) in $DATA"
t0=$(date +%s)
"$PY" -c 'import sys; from pathlib import Path; from fedrift.data import DATASETS, load_dataset
d = load_dataset("imagefolder", Path(sys.argv[1]), DATASETS.get("imagefolder").params(size=32))
print(f"decoded once (the runs read the cache): {len(d.y_train)} train, {len(d.y_test)} test images")' "$DATA"
echo "decoded in $(($(date +%s) - t0)) s"
t0=$(date +%s)
timeout -s INT -k 30 "$BUDGET" "$PY" -c 'import sys; from fedrift.cli import main; sys.exit(main(sys.argv[1:]))' \
  compare -c examples/workload_r1.yaml --out "$OUT/r1-precision" --jobs "$JOBS" --no-report seeds="$SEEDS" \
  sweep.train.precision=fp32,bf16 data.root="$DATA" engine.device="$DEVICE" engine.executor=stacked \
  engine.threads=null train.rounds="$ROUNDS" "eval.at_rounds=[10,20,$ROUNDS]" output.progress=false 2>&1 | tail -n 30
echo "compare: exit ${PIPESTATUS[0]} after $(($(date +%s) - t0)) s"
# what each run measured, for the note: final accuracy, mean s/round (rounds 2..), rounds done
"$PY" - "$OUT/r1-precision" <<'EOF'
import json, statistics, sys
from pathlib import Path
for d in sorted(Path(sys.argv[1]).glob("*/seed*")):
    s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if l.strip()] if (d / "metrics.jsonl").is_file() else []
    secs = [r["seconds"] for r in rows if r.get("round", 0) >= 2 and "seconds" in r]
    print(f"{d.parent.name}/{d.name}: {s.get('status', 'no summary')}, final {s.get('final_accuracy')}, "
          f"rounds {rows[-1]['round'] if rows else 0}, s/round {statistics.mean(secs) if secs else float('nan'):.2f}")
EOF
find "$OUT/r1-precision" -name "final_model.pt" -delete 2>/dev/null
find "$OUT/r1-precision" -type d -name checkpoint -prune -exec rm -rf {} + 2>/dev/null
ls "$OUT/r1-precision"
