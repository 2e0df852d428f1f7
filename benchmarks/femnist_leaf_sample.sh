#!/usr/bin/env bash
# A real FEMNIST sample in LEAF's own layout, for `fedrift select` on a natural partition
# (issue 51; BENCHMARKS.md "S. select on FEMNIST"): LEAF's niid sample (its
# data/femnist/data/{train,test}/all_data_K_niid_05_keep_0_*_9.json shards) as committed to the
# public GitHub repository slz-ai/leaf-torch at commit 5a94e3b721bf5920a25d59d800481380602b7862.
# The commit has 35 train and 35 test shards; the search tool's snapshot of it holds 20 of the
# train shards (the others' blobs are absent), so the sample is 20 train shards (105 writers,
# 14,708 samples) and 35 test shards (184 writers, 4,088 samples; 79 of those writers have no
# training data, 2,403 test samples). Get the repository with the search tool's
# `fetch github:slz-ai/leaf-torch` (or `git clone https://github.com/slz-ai/leaf-torch`).
#
#   benchmarks/femnist_leaf_sample.sh LEAF_TORCH_GIT_DIR OUT_DIR     # then data.root=OUT_DIR
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 LEAF_TORCH_GIT_DIR OUT_DIR" >&2
  exit 2
fi
repo=$1 out=$2 commit=${LEAF_COMMIT:-5a94e3b721bf5920a25d59d800481380602b7862}
if [ -e "$out/train" ] || [ -e "$out/test" ]; then
  echo "$out/train or $out/test exists: remove it first, or choose another OUT_DIR" >&2
  exit 2
fi
git -C "$repo" ls-tree -r "$commit" data/femnist/data | while read -r _mode _type blob path; do
  case "$path" in
    *.json)
      split=$(basename "$(dirname "$path")")
      mkdir -p "$out/$split"
      # a blob the snapshot lacks (its largest files may be absent) is skipped, and counted below
      git -C "$repo" cat-file blob "$blob" > "$out/$split/$(basename "$path")" 2>/dev/null || rm -f "$out/$split/$(basename "$path")"
      ;;
  esac
done
echo "$out: $(ls "$out/train" | wc -l) train shards, $(ls "$out/test" | wc -l) test shards"
