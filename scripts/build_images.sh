#!/usr/bin/env bash
# Build the runtime images (ray, trainer FROM ray, launcher), push them with --push, and compile the
# pipelines and the Elyra catalog for them: one registry and one tag for everything. Tags come from
# src/prepline/images.py (ImageSet), the Ray and Python versions from pyproject.toml; they reach the
# Dockerfiles as build args.
#
#   bash scripts/build_images.sh                                   # build the three images (default registry/tag)
#   bash scripts/build_images.sh --registry ghcr.io/me --tag 0.1.0 --push
#                       # build, push, then `prepline compile --registry ghcr.io/me --tag 0.1.0` (compiled/, elyra_templates/,
#                       # deploy/images/: the registry and tag deploy/base, deploy/proxy and deploy/elyra pull)
#   bash scripts/build_images.sh --only trainer                    # or ray / launcher (trainer needs the ray image)
#   bash scripts/build_images.sh --dry-run ...                     # print the commands, run nothing (no Docker needed)
set -euo pipefail
cd "$(dirname "$0")/.."

push=0 dry=0 only="" registry="" tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --push) push=1 ;;
    --dry-run) dry=1 ;;
    --only) only="${2:?--only needs ray, trainer or launcher}"; shift ;;
    --registry) registry="${2:?--registry needs a registry/prefix, e.g. ghcr.io/my-org}"; shift ;;
    --tag) tag="${2:?--tag needs a tag, e.g. 0.1.0}"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "build_images: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$only" in ""|ray|trainer|launcher) ;; *) echo "build_images: --only takes ray, trainer or launcher, not '$only'" >&2; exit 2 ;; esac

PY="${PYTHON:-python3}"
# KEY=VALUE lines from the one image setting and the pins (Python >= 3.11 for tomllib; no install needed)
vars="$(REGISTRY="$registry" TAG="$tag" "$PY" - <<'EOF'
import os, re, shlex, sys, tomllib
sys.path.insert(0, "src")
from prepline import images
from prepline.errors import PreplineError

try:
    s = images.ImageSet(os.environ["REGISTRY"] or images.REGISTRY, os.environ["TAG"] or images.VERSION)
except PreplineError as e:
    sys.exit(f"build_images: {e.message} ({e.fix})")
proj = tomllib.load(open("pyproject.toml", "rb"))["project"]
(ray_pin,) = [r for r in proj["optional-dependencies"]["ray"] if r.startswith("ray")]
ray_version = re.fullmatch(r"ray(\[[^\]]*\])?==([0-9.]+)", ray_pin).group(2)
py = re.fullmatch(r">=(3\.\d+),<3\.\d+", proj["requires-python"]).group(1)
for k, v in {"RAY_IMAGE": s.ray, "TRAINER_IMAGE": s.trainer, "LAUNCHER_IMAGE": s.launcher, "REGISTRY": s.registry, "TAG": s.tag,
             "VERSION": images.VERSION, "RAY_VERSION": ray_version, "PYTHON_VERSION": py, "PYTHON_TAG": "py" + py.replace(".", "")}.items():
    print(f"{k}={shlex.quote(v)}")
EOF
)"
eval "$vars"

run() {
  if [ "$dry" -eq 1 ]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

if [ "$dry" -eq 0 ] && ! docker info >/dev/null 2>&1; then
  echo "build_images: no Docker engine here (docker info failed); the commands it would run:" >&2
  dry=1
  nodocker=1
fi
if [ "$dry" -eq 0 ] && ! docker buildx version >/dev/null 2>&1; then
  echo "build_images: the Dockerfiles need BuildKit (RUN --network=none): install the docker buildx plugin" >&2
  exit 1
fi

export DOCKER_BUILDKIT=1  # RUN --network=none and the per-Dockerfile .dockerignore need BuildKit
if [ -z "$only" ] || [ "$only" = ray ]; then
  run docker build -f runtime_images/ray/Dockerfile -t "$RAY_IMAGE" \
    --build-arg "IMAGE=$RAY_IMAGE" --build-arg "PREPLINE_VERSION=$VERSION" \
    --build-arg "RAY_VERSION=$RAY_VERSION" --build-arg "PYTHON_TAG=$PYTHON_TAG" .
  if [ "$push" -eq 1 ]; then run docker push "$RAY_IMAGE"; fi
fi
if [ -z "$only" ] || [ "$only" = trainer ]; then
  run docker build -f runtime_images/trainer/Dockerfile -t "$TRAINER_IMAGE" \
    --build-arg "IMAGE=$TRAINER_IMAGE" --build-arg "PREPLINE_VERSION=$VERSION" --build-arg "RAY_IMAGE=$RAY_IMAGE" .
  if [ "$push" -eq 1 ]; then run docker push "$TRAINER_IMAGE"; fi
fi
if [ -z "$only" ] || [ "$only" = launcher ]; then
  run docker build -f runtime_images/launcher/Dockerfile -t "$LAUNCHER_IMAGE" \
    --build-arg "IMAGE=$LAUNCHER_IMAGE" --build-arg "PREPLINE_VERSION=$VERSION" \
    --build-arg "PYTHON_VERSION=$PYTHON_VERSION" .
  if [ "$push" -eq 1 ]; then run docker push "$LAUNCHER_IMAGE"; fi
fi
if [ -n "$registry$tag" ]; then
  # the pipelines, the Elyra catalog and deploy/ for these images (their image parameters' defaults, the components'
  # images, deploy/images/kustomization.yaml)
  PREPLINE="${PREPLINE:-.venv/bin/prepline}"
  run "$PREPLINE" compile --registry "$REGISTRY" --tag "$TAG"
fi
if [ "${nodocker:-0}" -eq 1 ]; then
  exit 1
fi
