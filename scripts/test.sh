#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and .venv-elyra (scripts/setup_elyra.sh) and run the whole test
# suite, Ray, S3, Elyra and slow tests included. PREPLINE_ELYRA=0 leaves the Elyra CLI out (its
# tests then skip); otherwise they must find it and fail if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${PREPLINE_ELYRA:-1}" != 0 ]; then
  bash scripts/setup_elyra.sh
  export PREPLINE_ELYRA_BIN="$PWD/.venv-elyra/bin" PREPLINE_REQUIRE_ELYRA=1
fi
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
# two pytest-xdist workers (PREPLINE_TEST_WORKERS=0: one process): much of the suite waits on
# subprocesses, Ray heads and timeouts; a test file stays on one worker (module fixtures run once),
# and files go out in collection order (tests/conftest.py puts the minutes-long ones first)
workers="${PREPLINE_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
