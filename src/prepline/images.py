"""The one place image tags live. Components, cluster specs, Dockerfiles and compiled YAML use these."""

REGISTRY = "ghcr.io/prepline"
VERSION = "0.1.0"
#: Ray runtime image: Ray + prepline with the transform extras + the offline models
RAY_IMAGE = f"{REGISTRY}/prepline-ray:{VERSION}"
#: lightweight launcher image for the KFP components (prepline[kfp], kubernetes clients)
LAUNCHER_IMAGE = f"{REGISTRY}/prepline-launcher:{VERSION}"
