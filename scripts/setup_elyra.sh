#!/usr/bin/env bash
# Set up .venv-elyra: the Elyra CLI (elyra-metadata, elyra-pipeline) that tests/elyra runs on
# elyra_templates/. A venv of its own: elyra 4.1.1 pins click==8.1.8, and the pii extra's spaCy needs
# click>=8.2.1, so the two cannot share .venv. Installed with uv (from .venv, the test extra): about
# 10 s, where pip takes 3 minutes to resolve JupyterLab's tree. Idempotent, like scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/uv ] || bash scripts/setup.sh
stamp=".venv-elyra/.prepline-installed"
want="$(cat pyproject.toml scripts/setup_elyra.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing prepline[kfp,elyra] into .venv-elyra" >&2
  [ -x .venv-elyra/bin/python ] || .venv/bin/uv venv -q --python "$PY" .venv-elyra
  .venv/bin/uv pip install -q --python .venv-elyra/bin/python -e ".[kfp,elyra]"
  echo "$want" > "$stamp"
fi
