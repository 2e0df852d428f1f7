#!/usr/bin/env bash
# Rebuild Tiny-ImageNet-200 exactly as fedrift's R3 tables read it (docs/tutorials/your-own-data.md, "Tiny-ImageNet-200, rebuilt exactly").
#
#   benchmarks/tiny_imagenet_tree.sh DLA_REPO IMAGENET_REPO OUT_DIR
#
# DLA_REPO: a clone of the public GitHub repository Sachitbansal/DLA (100,000 train images,
# 500 a class; 10,000 labelled val images, 50 a class; 64x64 JPEG), read at commit
# 44579204a3d8506f5aa76fb6695aa3b81eefe66a. Its wnids.txt was edited by its owner (9 lines),
# so the class list comes from IMAGENET_REPO, a clone of rangeetpan/IMagenet at commit
# 6125d8a1069df02232eb57678fd46c700411dd45 (its images are the same blobs): the first lines of
# its tiny-imagenet-200/wnids.txt, as many as there are train folders (200), which must name
# exactly those folders. Writes OUT_DIR/tiny-imagenet-200; then data.root=OUT_DIR.
# DLA_COMMIT / IMAGENET_COMMIT in the environment read other commits (the tests do).
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 DLA_REPO IMAGENET_REPO OUT_DIR" >&2
  exit 2
fi
dla=$1 imagenet=$2 out=$3
dla_commit=${DLA_COMMIT:-44579204a3d8506f5aa76fb6695aa3b81eefe66a}
imagenet_commit=${IMAGENET_COMMIT:-6125d8a1069df02232eb57678fd46c700411dd45}
tree=$out/tiny-imagenet-200
if [ -e "$tree" ]; then
  echo "$tree exists: remove it first, or choose another OUT_DIR" >&2
  exit 2
fi
mkdir -p "$out"
git -C "$dla" archive "$dla_commit" tiny-imagenet-200 | tar -x -C "$out"
classes=$(find "$tree/train" -mindepth 1 -maxdepth 1 -type d | wc -l)
git -C "$imagenet" show "$imagenet_commit:tiny-imagenet-200/wnids.txt" | head -n "$classes" > "$tree/wnids.txt"
if ! diff -q <(sort "$tree/wnids.txt") <(find "$tree/train" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort) >/dev/null; then
  echo "the first $classes lines of $imagenet's wnids.txt do not name the $classes train folders of $dla" >&2
  exit 1
fi
echo "$tree: $classes classes, $(find "$tree/train" -name '*.JPEG' | wc -l) train and $(find "$tree/val/images" -name '*.JPEG' | wc -l) val images"
