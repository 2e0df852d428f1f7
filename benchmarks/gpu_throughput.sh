#!/usr/bin/env bash
# Issue 49's device call (BENCH.md G1 then G2), prepared to run at once in a session with a lent
# GPU: the throughput rows, most informative first, each written to $OUT as it is measured (a call
# cut short keeps its rows; the next call, given the JSON back under
# benchmarks/results/gpu-throughput/, skips them), then the profile of one round.
#
# Here, once: `PARTS=r1 bash benchmarks/gpu_prepare.sh` (its .gpu/whl; only pydantic and its four
# dependencies are needed: `mkdir -p .gpu/whlmin && cp .gpu/whl/{pydantic,pydantic_core,annotated_types,typing_extensions,typing_inspection}-*.whl .gpu/whlmin`).
# Device (carry [".gpu/whlmin"], timeout_s 600):
#   bash benchmarks/gpu_throughput.sh
# Here, to check it end to end on the CPU (tiny sizes):
#   QUICK=1 DEVICE=cpu PY=.venv/bin/python INSTALL=0 OUT=/tmp/gpu-tp bash benchmarks/gpu_throughput.sh
# Environment: BUDGET (420 s for the throughput rows; the profile runs first, about a minute),
# PROFILE (1), DEVICE (cuda), PY (python3), INSTALL (1), WHL (.gpu/whlmin), SITE (/tmp/site),
# OUT (the device's $OUT; default runs/gpu-out), ROWS (default: the script's order), QUICK,
# SERIES (the call's own files, throughput-<device>-<series>.json: its own baseline row),
# PROFILE_CASES (default sequential:1:eager,stacked:12:eager), KERNELS (1: benchmarks/step_kernels.py
# first, in parts, each skipped where its file is in $OUT, a few cases of each profiled (their
# kernels by name): "main" (vmap, the stacked form, the channel groups in both layouts;
# MAIN_TIMEOUT 120 s), "tuned" (vmap, the form and channels-last with engine.cudnn_benchmark:
# cuDNN's algorithms timed, not picked by heuristics; TUNED_TIMEOUT 90 s), "gemm" (the channel groups'
# convolutions as cuBLAS's batched products of patches and kernels; GEMM_TIMEOUT 45 s), "compiled-tuned" (the
# form compiled, K = 48; COMPILED_TIMEOUT 180 s), FedADC's CNN's form (R2's model; 40 s)),
# THROUGHPUT (1: G1's rows after the kernels; 0: none).
# The next GPU session's calls (two; the machine stays warm between them):
#   SERIES=graphs3 THROUGHPUT=0 PROFILE=0 bash benchmarks/gpu_throughput.sh            (timeout_s 520)
#   SERIES=graphs3 KERNELS=0 PROFILE=0 BUDGET=200 ROWS=cudnn bash benchmarks/gpu_throughput.sh   (timeout_s 330)
# (ROWS=cudnn: G1's sequential and 48-run rows with cuDNN's heuristics and with its algorithms timed)
# The third H200 call (captured steps): SERIES=graphs PROFILE_CASES=sequential:1:eager,stacked:12:graphs;
# the next (the host's mends: one index copy a group, one device copy of a stack's data):
# SERIES=graphs2 PROFILE_CASES=sequential:1:eager,stacked:48:graphs PROFILE_TIMEOUT=200
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; WHL=${WHL:-.gpu/whlmin}; OUT=${OUT:-$PWD/runs/gpu-out}
DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-420}
if [ "${ROWS:-}" = cudnn ]; then
  ROWS=sequential:1:fp32:eager,sequential:1:fp32:eager+cudnn,stacked:48:fp32:graphs,stacked:48:fp32:graphs+cudnn
  ROWS+=,stacked:48:bf16:graphs+cudnn,stacked:48:fp32:compiled+cudnn
fi
mkdir -p "$OUT"
if [ "${INSTALL:-1}" = 1 ] && ls "$WHL"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    || { echo "gpu_throughput: installing $WHL failed"; exit 1; }
fi
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
kernels() {  # SERIES TIMEOUT ARGS...: one part of step_kernels.py, skipped where its file is in $OUT already
  local series=$1 limit=$2; shift 2
  ls "$OUT"/step-kernels-*-"$series".json >/dev/null 2>&1 && { echo "step_kernels $series: in $OUT already"; return; }
  timeout -k 10 "$limit" "$PY" benchmarks/step_kernels.py --device "$DEVICE" --out "$OUT" --series "$series" "$@" \
    ${QUICK:+--quick} 2>&1 | tail -n 40
}
# first the vectorised step's kernels by formulation (vmap against the model's stacked form,
# compiled or not, and the channel-group layouts; cuDNN's algorithms by heuristics or timed):
# what decides where the step goes next
if [ "${KERNELS:-1}" = 1 ]; then
  kernels main "${MAIN_TIMEOUT:-120}" --variants vmap,stacked,channels,channels_last --widths 1,16,48,192 \
    --profile stacked:48:fp32,channels_last:48:fp32,stacked:1:fp32
  # cuDNN's algorithms timed on each shape (engine.cudnn_benchmark): its heuristics chose FFT,
  # "alg0" and a direct grouped kernel at 1.5 ms a call on the last profile (BENCHMARKS.md G)
  kernels tuned "${TUNED_TIMEOUT:-90}" --variants vmap,stacked,channels_last --widths 1,16,48,192 --cudnn-benchmark \
    --profile stacked:48:fp32,channels_last:48:fp32,stacked:1:fp32
  # the channel groups' convolutions as batched products of each image's patches and each
  # client's kernel (cuBLAS's batched GEMM in place of cuDNN's grouped kernels, at kh*kw times
  # the activations' memory): whether another formulation of the vectorised convolution is
  # what the 10x needs, where cuDNN's grouped kernels cost as much an image as one client's
  kernels gemm "${GEMM_TIMEOUT:-45}" --variants gemm --widths 16,48,192 --profile gemm:48:fp32
  # the stacked form compiled (engine.compile: inductor's fused kernels; its convolutions are
  # cuDNN's), at one width only: a compile a case, tens of seconds each, and two more for the
  # checks against vmap and float64 (K = 3); 48 clients is about a 48-run stack's usual group
  kernels compiled-tuned "${COMPILED_TIMEOUT:-180}" --variants stacked,compiled --widths 48 --cudnn-benchmark \
    --profile compiled:48:fp32,compiled:48:bf16
  # FedADC's CNN's form (R2's model, FedADC Table I: 20 clients a round, batch 50; off by default:
  # as fast as vmap on a CPU): whether a GPU wants it
  kernels form 40 --model fedadc_cnn --widths 1,20,80 --batch 50 --variants vmap,stacked --precisions fp32,bf16 \
    --cudnn-benchmark
fi
[ "${THROUGHPUT:-1}" = 1 ] || { ls -la "$OUT"; exit 0; }
# the rows measured by earlier calls, committed here: this call measures the others
mkdir -p benchmarks/results/gpu-throughput
cp benchmarks/results/gpu-throughput/throughput-*.json "$OUT"/ 2>/dev/null
args=(--device "$DEVICE" --out "$OUT")
[ -n "${QUICK:-}" ] && args+=(--quick)
[ -n "${SERIES:-}" ] && args+=(--series "$SERIES")
timeout -s INT -k 20 "$((BUDGET + 60))" "$PY" benchmarks/gpu_throughput.py "${args[@]}" --budget "$BUDGET" ${ROWS:+--rows "$ROWS"} 2>&1 | tail -n 40
# the profile after the rows (they are what the issue's bound reads); a call that ends first keeps the rows
if [ "${PROFILE:-1}" = 1 ] && ! ls "$OUT"/profile-*"${SERIES:-}".json >/dev/null 2>&1; then
  timeout -k 10 "${PROFILE_TIMEOUT:-150}" "$PY" benchmarks/gpu_throughput.py "${args[@]}" --profile \
    ${PROFILE_CASES:+--profile-cases "$PROFILE_CASES"} 2>&1 | tail -n 30
fi
ls -la "$OUT"
