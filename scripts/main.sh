#!/usr/bin/env bash
# The main job on one machine: set up .venv, build the bundled sample from real text that ships in
# packages, and run the whole super pipeline on it with kfp's local runner, a local Ray head per
# stage and local training. Outputs: runs/pipeline/stages/<run id>/..., KFP outputs: runs/pipeline/kfp/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/prepline pipeline run super --local --work-root "${1:-runs/pipeline}" "${@:2}"
