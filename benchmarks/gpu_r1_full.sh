#!/usr/bin/env bash
# Workloads R1 and R2 on ALL of CIFAR-10 (JPEG q75 copy) on a lent GPU. The zip (65 MB) does not
# travel beside the repository (45 MB by 2026-11-26 evening; 64 MB travel in a call), so it
# travels in parts, one a call, stashed in the machine's /tmp (kept while it is held).
#
# Here:   STEP=parts bash benchmarks/gpu_r1_full.sh: ../shared's zip cut into stored zips, each as
#         large as a call leaves room for beside the tree (what git would send: tracked and
#         untracked-not-ignored files), the last one beside $WHL too: .gpu/cifarA/a.zip,
#         .gpu/cifarB/b.zip ...; it prints the calls to make. TRAVEL_LIMIT (64000000 bytes: the
#         limit the device tool enforced, in bytes, not MiB), MARGIN (2000000: room for the tree
#         to grow before the calls).
# Device, a call for each part but the last (carry [".gpu/cifarA"] ...):  STEP=stash bash benchmarks/gpu_r1_full.sh
#         (each call at once after the last: the machine is held 30 s idle; about 15 s of device time each)
# Device, last call (carry [WHL, ".gpu/cifar<last>"]):   bash benchmarks/gpu_r1_full.sh
# A table longer than a call (paper scale: about 49 device-minutes for R1's three methods at
# alpha 0.1; a session lends 15) runs over several: each call's archives ($OUT/<grid>.tar.gz)
# hold the unfinished runs' last checkpoints; here, copy them into STATE (.gpu/r1-state, git
# ignores .gpu) and carry it in the next call's last call (STEP=parts leaves room for it):
# the grids are unpacked into $OUT first, compare reuses the finished runs and continues the
# others from their checkpoints (engine.checkpoint_every=1: a cut call loses one round a run).
# The last call joins the parts into one zip with the published layout (60,000 images), then runs
# one of three things. By default `fedrift compare` for $ALGORITHMS, seeds $SEEDS, at each alpha of $ALPHAS (R1's settings, the
# CPU tune's learning rates: tuned=benchmarks/results/r1-tune), engine.device=cuda, $JOBS
# processes, into $OUT/r1-gpu-a<alpha>. Environment: ALGORITHMS (fedavg,fedgkd,fedadc), SEEDS
# (0,1,2), ALPHAS (0.1 0.5), JOBS (3), DEVICE (cuda), INSTALL (1: $WHL into $SITE), BUDGET (500 s for the compares; SIGINT at the end of it,
# so that finished runs and the report stay), PY (python3), SITE (/tmp/site), R1_MORE (more key=value for
# the alpha compares: paper scale is "engine.executor=stacked train.local_epochs=20 train.rounds=100
# data.augment=true engine.checkpoint_every=1", a setting's seeds then one stack, JOBS stacks at once),
# STATE (.gpu/r1-state: the archives an earlier call brought back, unpacked into $OUT first; the
# alphas and R2 continue from them, a CHAIN starts again from TUNE_FROM and FROM).
# CHAIN="...": a tune-and-compare chain (the block below says what it runs; R1 by default, any
# workload by CFG and the rest).
# R2_ROUNDS=N: FedADC Table I at s = 2, C = 0.2 without tuning (the block below): R2_ROUNDS (the
# most rounds), R2_ALGORITHMS (fedavg,fedadc), R2_EXECUTORS (the probe's: batched sequential),
# R2_FIXED (1: exactly R2_ROUNDS, else what the budget fits; with one executor named, no probe:
# how a call continues Table I's 500 rounds from STATE, R2_ROUNDS=500 R2_FIXED=1 R2_EXECUTORS=batched),
# R2_REFERENCE (fedavg), PROBE_TIMEOUT, R2_CFG (examples/papers/fedadc-table1-cifar10-c0.2.yaml; the
# c0.1 file is Table I's C = 0.1), R2_OUT (r2-gpu), R2_FIRST (0: the seed run first; empty: none, e.g. a
# second call for SEEDS=3,4,5). An entry may name its own sampling
# (fedadc:engine.sampling=class_coverage: FedADC's client-selection experiment, section IV-E).
# WHL (.gpu/whl, from gpu_prepare.sh): the wheels to install. A tune needs optuna (the whole
# folder, 8 MB); R2_ROUNDS and the alphas do not: .gpu/whlmin, pydantic and its four
# dependencies (2.7 MB: `mkdir -p .gpu/whlmin && cp .gpu/whl/{pydantic,pydantic_core,annotated_types,typing_extensions,typing_inspection}-*.whl .gpu/whlmin`),
# leaves room for a larger last part. Name the same WHL to STEP=parts and to the last call.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; OUT=${OUT:-$PWD/runs/gpu-out}; STASH=/tmp/r1-halves
ALGORITHMS=${ALGORITHMS:-fedavg,fedgkd,fedadc}; SEEDS=${SEEDS:-0,1,2}; ALPHAS=${ALPHAS:-0.1 0.5}
JOBS=${JOBS:-3}; BUDGET=${BUDGET:-500}; START=$(date +%s); STATE=${STATE:-.gpu/r1-state}
mkdir -p "$OUT" "$STASH"
if [ "${STEP:-run}" = parts ]; then
  rm -rf .gpu/cifar[A-Z]
  exec "${PREP_PY:-.venv/bin/python}" - "${CIFAR_ZIP:-../shared/data/cifar10-jpeg/cifar10-jpeg.zip}" "${WHL:-.gpu/whl}" \
    "${TRAVEL_LIMIT:-64000000}" "${MARGIN:-2000000}" "$STATE" <<'PY'
import pathlib, string, subprocess, sys, zipfile
src, whl, limit, margin, state = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), pathlib.Path(sys.argv[5])
names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True).stdout
tree = sum(p.stat().st_size for n in names.split(b"\0") if n and (p := pathlib.Path(n.decode())).is_file())
beside = sum(p.stat().st_size for p in [*whl.glob("*.whl"), *state.glob("*.tar.gz")])  # what the last call carries too
room, last_room = limit - margin - tree, limit - margin - tree - beside
if last_room < 1_000_000:
    sys.exit(f"gpu_r1_full: the tree ({tree / 1e6:.1f} MB), {whl} and {state} ({beside / 1e6:.1f} MB) leave no room for a part")
cost = lambda i: i.file_size + 100 + 2 * len(i.filename)  # a stored member: its bytes, its two headers
with zipfile.ZipFile(src) as zin:
    members = sorted((i for i in zin.infolist() if not i.is_dir()), key=lambda i: i.filename)
    cut, size = len(members), 0  # the last part: members from the end while they fit beside the wheels
    while cut and size + cost(members[cut - 1]) <= last_room:
        cut -= 1; size += cost(members[cut])
    groups, group, size = [], [], 0
    for info in members[:cut]:
        if group and size + cost(info) > room:
            groups.append(group); group, size = [], 0
        group.append(info); size += cost(info)
    groups += [g for g in (group, members[cut:]) if g]
    for k, group in enumerate(groups):
        folder = pathlib.Path(".gpu") / f"cifar{string.ascii_uppercase[k]}"
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(folder / f"{string.ascii_lowercase[k]}.zip", "w", zipfile.ZIP_STORED) as out:
            for info in group:
                out.writestr(info, zin.read(info))
print(f"gpu_r1_full: {len(members)} images in {len(groups)} parts under .gpu/ (tree {tree / 1e6:.1f} MB, "
      f"{whl} and {state} {beside / 1e6:.1f} MB); the calls:")
for k in range(len(groups) - 1):
    print(f'  carry [".gpu/cifar{string.ascii_uppercase[k]}"]: STEP=stash bash benchmarks/gpu_r1_full.sh')
last = f'"{whl}", ".gpu/cifar{string.ascii_uppercase[len(groups) - 1]}"' + (f', "{state}"' if any(state.glob("*.tar.gz")) else "")
print(f'  carry [{last}]: WHL={whl} ... bash benchmarks/gpu_r1_full.sh')
PY
fi
# the parts carried in this call (.gpu/cifarA/a.zip, .gpu/cifarB/b.zip, or more parts when the
# repository has grown: .gpu/cifarC/c.zip ...) join those stashed by earlier calls
for z in .gpu/cifar[A-Z]/*.zip; do [ -f "$z" ] && cp "$z" "$STASH/"; done
if [ "${STEP:-run}" = stash ]; then
  ls -l "$STASH" && exit 0
fi
[ -f "$STASH/a.zip" ] || { echo "gpu_r1_full: no first part (call 1 first)"; exit 1; }
[ "${INSTALL:-1}" = 0 ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${WHL:-.gpu/whl}"/*.whl || exit 1
export PYTHONPATH="$PWD/src:$SITE" PYTHONUNBUFFERED=1
mkdir -p /tmp/cifar10-jpeg
"$PY" benchmarks/join_parts.py /tmp/cifar10-jpeg/cifar10-jpeg.zip 60000 "$STASH"/*.zip || exit 1
nvidia-smi -L
# the grids an earlier call brought back (STATE: their archives, each unfinished run's last
# checkpoint within): compare reuses the finished runs and continues the others from their
# checkpoints, so a table longer than a call (or than a session's quarter hour) runs over several
for t in "$STATE"/*.tar.gz; do
  [ -f "$t" ] || continue
  tar -xzf "$t" -C "$OUT" || { echo "gpu_r1_full: $t does not unpack"; exit 1; }
  echo "gpu_r1_full: $(basename "$t") unpacked into $OUT: its finished runs reused, the others continued"
done
FEDRIFT=("$PY" -c 'import sys; from fedrift.cli import main; sys.exit(main(sys.argv[1:]))')
# the joined zip where the configs name it (../shared/data/cifar10-jpeg), so that a run's config
# equals the CPU's (the chain and R2; the alphas pass data.root=/tmp/cifar10-jpeg instead)
place_zip() {
  mkdir -p ../shared/data/cifar10-jpeg && mv /tmp/cifar10-jpeg/cifar10-jpeg.zip ../shared/data/cifar10-jpeg/ || exit 1
}
if [ -n "${CHAIN:-}" ]; then
  # CHAIN="fedcsd fedgkd_vote ...": each method tuned on the learning rate alone (GRID, TUNE_ROUNDS
  # rounds; its other keys at their defaults: the device time does not buy a second dimension)
  # and then its $SEEDS seeds beside FedAvg's, one method after another until BUDGET. R1 by
  # default (alpha 0.1, the paper's grid, 20 rounds, as benchmarks/r1_chain.sh on the CPU, into a
  # copy of the CPU's tune TUNE_FROM so that its description is the same). Another workload:
  # CFG (its config), TUNE_FROM (none: a new tune folder), BASE_ALGS (the studies every tune
  # call lists: fedavg,fedgkd,fedadc), GRID, TUNE_ROUNDS, MORE (overrides for the tune and the
  # compare alike, e.g. a validation split), COMPARE_MORE (the compare's alone, e.g. its
  # rounds), PAPER, CHAIN_OUT; R2's: the command in BENCHMARKS.md, section R2. The zip sits where
  # the config names it, so the configs equal the CPU's.
  CFG=${CFG:-examples/workload_r1.yaml}; GRID=${GRID:-0.01,0.05,0.1}; TUNE_ROUNDS=${TUNE_ROUNDS:-20}
  BASE_ALGS=${BASE_ALGS:-fedavg,fedgkd,fedadc}; PAPER=${PAPER:-fedgkd-table3-cifar10}
  CHAIN_OUT=${CHAIN_OUT:-r1-gpu-chain}; TUNE_FROM=${TUNE_FROM-benchmarks/results/r1-tune}; MORE=${MORE:-}
  COMPARE_MORE=${COMPARE_MORE:-}; TUNE_DIR="$OUT/$(basename "${TUNE_FROM:-$CHAIN_OUT-tune}")"
  place_zip
  rm -rf "$TUNE_DIR" "${OUT:?}/$CHAIN_OUT"; [ -z "$TUNE_FROM" ] || cp -r "$TUNE_FROM" "$TUNE_DIR"
  # a chain goes on from the runs an earlier one brought back (FROM), which compare reuses
  FROM=${FROM-benchmarks/results/r1-gpu-h100}; [ -z "$FROM" ] || [ ! -d "$FROM" ] || cp -r "$FROM" "$OUT/$CHAIN_OUT"
  done_new=""
  for m in $CHAIN; do
    for step in tune compare; do
      left=$((BUDGET - ($(date +%s) - START)))
      [ "$left" -gt 30 ] || { echo "gpu_r1_full: budget spent before $step $m"; break 2; }
      echo "== $(date -u +%T) $step $m, $left s left"
      if [ $step = tune ]; then
        # the studies the folder holds stay in the list (a tune refuses to leave one out)
        held=""; [ ! -f "$TUNE_DIR/tune.json" ] || held=$("$PY" -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["studies"]))' "$TUNE_DIR/tune.json")
        algs=$(echo "$held,$BASE_ALGS$done_new,$m" | tr , '\n' | awk 'NF && !seen[$0]++' | paste -sd,)
        # lr only: every key the listed entries' spaces would search, fixed (space.KEY=none)
        # shellcheck disable=SC2046
        NONE=$("$PY" -c 'import sys; from fedrift.algorithms import ALGORITHMS
keys = {k for e in sys.argv[1].split(",") for k in (ALGORITHMS.get(e.split(":")[0]).space or {})}
print(" ".join(f"space.{k}=none" for k in sorted(keys)))' "$algs") || break 2
        # shellcheck disable=SC2086
        timeout -s INT -k 20 "$left" "${FEDRIFT[@]}" tune -c "$CFG" --jobs "$JOBS" train.rounds="$TUNE_ROUNDS" $MORE \
          space.train.lr="$GRID" $NONE algorithms="$algs" --out "$TUNE_DIR" || break 2
      else
        # shellcheck disable=SC2086
        timeout -s INT -k 20 "$left" "${FEDRIFT[@]}" compare -c "$CFG" --jobs "$JOBS" seeds="$SEEDS" $MORE $COMPARE_MORE \
          algorithms=fedavg$done_new,$m tuned="$TUNE_DIR" report.reference=fedavg report.tsne=none \
          report.paper="$PAPER" output.progress=false --out "$OUT/$CHAIN_OUT" || break 2
      fi
      echo "== exit $? after $(($(date +%s) - START)) s"
    done
    done_new=$done_new,$m
  done
  ALPHAS=""
fi
if [ -n "${R2_ROUNDS:-}" ]; then
  # R2_ROUNDS=100: workload R2 (FedADC Table I, s = 2, C = 0.2: 100 clients of 500 images, 20 a
  # round, examples/papers/fedadc-table1-cifar10-c0.2.yaml as written, its rounds cut to
  # at most R2_ROUNDS, as many as the budget fits). First a 3-round probe of FedAvg under each of $R2_EXECUTORS (one process alone
  # on the GPU: s/round of rounds 2-3, into $OUT/r2-probe.md); the faster one runs the
  # comparison of $R2_ALGORITHMS: seed 0 of each first (so that a cut budget still pairs one
  # seed), then $SEEDS, $JOBS processes at once, into $OUT/$R2_OUT (r2-gpu).
  place_zip
  R2=${R2_CFG:-examples/papers/fedadc-table1-cifar10-c0.2.yaml}; R2_OUT=${R2_OUT:-r2-gpu}
  R2_ALGORITHMS=${R2_ALGORITHMS:-fedavg,fedadc}; R2_EXECUTORS=${R2_EXECUTORS:-batched sequential}
  echo "| executor | s/round (rounds 2-3, FedAvg alone, evaluation excluded) | wall s (data load included) |" >"$OUT/r2-probe.md"
  echo "|---|---|---|" >>"$OUT/r2-probe.md"
  best=""; best_s=""; best_wall=""
  # one executor and a fixed number of rounds: nothing for a probe to decide
  [ -n "${R2_FIXED:-}" ] && [ "$(echo $R2_EXECUTORS | wc -w)" = 1 ] && best=$R2_EXECUTORS
  [ -n "$best" ] || for ex in $R2_EXECUTORS; do
    t0=$(date +%s)
    timeout -k 5 "${PROBE_TIMEOUT:-150}" "${FEDRIFT[@]}" run -c "$R2" algorithm.name=fedavg train.rounds=3 engine.executor="$ex" \
      output.dir="/tmp/r2-probe-$ex" output.overwrite=true output.progress=false >"/tmp/r2-probe-$ex.log" 2>&1 \
      || { echo "gpu_r1_full: probe $ex failed:"; tail -n 15 "/tmp/r2-probe-$ex.log"; continue; }
    # s/round without evaluation (the table's) and with it (round 3's wall time: what a run costs)
    read -r spr wall3 < <("$PY" -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%.3f" % statistics.mean(r["seconds"] for r in rows if r["round"] >= 2), "%.3f" % (rows[2]["wall_seconds"] - rows[1]["wall_seconds"]))' "/tmp/r2-probe-$ex/metrics.jsonl")
    echo "| $ex | $spr | $(($(date +%s) - t0)) |" | tee -a "$OUT/r2-probe.md"
    if [ -z "$best" ] || "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$spr" "$best_s"; then
      best=$ex; best_s=$spr; best_wall=$wall3
    fi
  done
  [ -n "$best" ] || { echo "gpu_r1_full: no executor ran R2"; exit 1; }
  # the rounds that fit what is left: every run's rounds one after another at the probe's cost
  # with evaluation, sped up by 1.25 for running $JOBS at once (3 at once gave 1.25x in R1)
  left=$((BUDGET - ($(date +%s) - START)))
  nruns=$(( $(echo "$R2_ALGORITHMS" | tr , '\n' | wc -l) * $(echo "$SEEDS" | tr , '\n' | wc -l) ))
  fit=$R2_ROUNDS  # R2_FIXED=1: exactly R2_ROUNDS (to pair with an earlier call's runs)
  [ -n "${R2_FIXED:-}" ] || fit=$("$PY" -c 'import sys; left, n, t, cap = map(float, sys.argv[1:]); print(int(max(10, min(cap, 1.25 * (left - 60) / (n * t)))))' \
    "$left" "$nruns" "$best_wall" "$R2_ROUNDS")
  echo "gpu_r1_full: R2 under $best${best_wall:+ ($best_wall s a round with evaluation, from the probe)}, $nruns runs, $left s left: $fit rounds"
  R2_ROUNDS=$fit
  for seeds in ${R2_FIRST-0} "$SEEDS"; do  # R2_FIRST: the seed run first ("" none)
    left=$((BUDGET - ($(date +%s) - START)))
    [ "$left" -gt 30 ] || { echo "gpu_r1_full: budget spent before R2 seeds $seeds"; break; }
    echo "== $(date -u +%T) R2 seeds $seeds, $best, $left s left"
    timeout -s INT -k 20 "$left" "${FEDRIFT[@]}" compare -c "$R2" --jobs "$JOBS" seeds="$seeds" \
      algorithms="$R2_ALGORITHMS" train.rounds="$R2_ROUNDS" engine.executor="$best" report.reference="${R2_REFERENCE:-fedavg}" \
      report.tsne=none report.paper=fedadc-table1-cifar10 output.progress=false --out "$OUT/$R2_OUT"
    echo "== exit $? after $(($(date +%s) - START)) s"
  done
  ALPHAS=""
fi
for alpha in $ALPHAS; do
  left=$((BUDGET - ($(date +%s) - START)))
  [ "$left" -gt 30 ] || { echo "gpu_r1_full: budget spent before alpha $alpha"; break; }
  echo "== $(date -u +%T) alpha $alpha, $left s left"
  timeout -s INT -k 20 "$left" "${FEDRIFT[@]}" compare -c examples/workload_r1.yaml --jobs "$JOBS" seeds="$SEEDS" \
    algorithms="$ALGORITHMS" tuned=benchmarks/results/r1-tune data.root=/tmp/cifar10-jpeg engine.device="${DEVICE:-cuda}" \
    partition.alpha="$alpha" report.reference=fedavg report.tsne=none report.paper=fedgkd-table3-cifar10 \
    output.progress=false ${R1_MORE:-} --out "$OUT/r1-gpu-a$alpha"
  echo "== exit $? after $(($(date +%s) - START)) s"
done
# what comes back from the device is limited in number of files (8), size (16 MiB each) and
# depth: each grid keeps results.md and travels as one archive (its report, csv, figures and run
# folders: metrics, configs, logs, and an unfinished run's last checkpoint, which the next call
# continues from when the archive is carried back in STATE; no final models)
for d in "$OUT"/r1-gpu-a* "$OUT"/*-chain "$OUT"/*-tune "$OUT"/r2-gpu*; do
  [ -d "$d" ] || continue
  rm -f "$d/.fedrift.lock"
  g=$(basename "$d")
  tar -czf "$OUT/$g.tar.gz" --exclude='final_model.pt' -C "$OUT" "$g" && find "$d" -mindepth 1 ! -name results.md -delete
  size=$(stat -c %s "$OUT/$g.tar.gz")
  [ "$size" -le 16777216 ] || echo "gpu_r1_full: $g.tar.gz is $size bytes, over the 16 MiB a file that comes back may have"
done
