#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and run the whole test suite, Ray, S3 and slow tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest "$@"
