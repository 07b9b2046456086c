"""Which backend versions prepline's features need (docs/compatibility.md is this table, checked by
tests/test_docs.py), and the check ``prepline kfp`` makes against a KFP server's version.

A KFP API server reports its version in ``GET /apis/v2beta1/healthz`` as ``tag_name`` (the
``TAG_NAME`` of its deployment; ``backend/src/apiserver/main.go``, 2.4.0 onwards). KubeRay,
Trainer and Elyra versions are not read at run time: the table says what to install.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    system: str  # "KFP backend" | "KubeRay" | "Kubeflow Trainer" | "Elyra"
    feature: str
    minimum: str
    used_by: str
    source: str  # the upstream file or change that decides it


FEATURES = [
    Feature("KFP backend", "container image from a pipeline parameter (launcher_image, trainer_image)", "2.4.0",
            "every compiled pipeline", "kubeflow/pipelines #11404 (backend/src/v2/driver/util.go)"),
    Feature("KFP backend", "exit handler inside a nested pipeline (stop_ray_cluster of each stage)", "2.4.0",
            "super", "backend/src/v2/compiler/argocompiler (nested exit hooks)"),
    Feature("KFP backend", "secret name from a pipeline parameter (secretNameParameter: s3_secret_name, kfp_token_secret)", "2.5.0",
            "every compiled pipeline", "backend/src/v2/driver (kubernetes platform spec)"),
    Feature("KFP backend", "optional secrets (optional: true on secretAsEnv; older drivers drop it and a missing secret fails the pod)",
            "2.15.0", "every compiled pipeline", "backend/src/v2/driver (kubernetes platform spec)"),
    Feature("KFP backend", "nested pipelines' DAG status shown right in the UI", "2.17.0", "super (display only)",
            "kubeflow/pipelines 2.17 release"),
    Feature("KubeRay", "API server V2 (RayCluster proxy, service proxy)", "1.4.0", "provider kuberay (api_version v2)",
            "apiserversdk/proxy.go"),
    Feature("KubeRay", "HeadPodReady / ReplicaFailure conditions (a head pod that cannot be created or scheduled fails "
            "after pending_grace_seconds; feature gate RayClusterStatusConditions, on by default from 1.3.0, alpha in 1.2)", "1.3.0",
            "provider kuberay", "ray-operator/pkg/features/features.go, raycluster_controller.go"),
    Feature("KubeRay", "HeadPodReady carries the head container's waiting reason (ErrImagePull, CrashLoopBackOff, "
            "CreateContainerConfigError: fail fast without reading pods; 1.3.0 to 1.5.0 say only ContainersNotReady, so "
            "there the start step needs get/list on pods, deploy/, to fail fast)", "1.5.1",
            "provider kuberay without pod access", "ray-operator/controllers/ray/utils/util.go (kuberay #4196)"),
    Feature("Kubeflow Trainer", "TrainJob activeDeadlineSeconds and numProcPerNode", "2.2.0",
            "fine_tune train_mode=cluster", "pkg/apis/trainer/v1alpha1/trainjob_types.go"),
    Feature("Elyra", "custom-component nodes: Data Volumes (PVC) apply, Kubernetes secrets and env vars do not", "4.1.1",
            "elyra_templates (S3 credentials from the claim prepline-s3-credentials)", "elyra/pipeline/properties.py"),
]


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """'2.5.0', 'v2.15.1', '2.4.0-rc.1' -> (2, 5, 0); None for 'unknown', 'dev' or nothing."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", (text or "").strip())
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def kfp_backend_notes(tag_name: str | None) -> list[str]:
    """What a KFP backend of this version cannot do of what prepline's compiled pipelines use."""
    have = parse_version(tag_name)
    if have is None:
        return [f"the KFP server does not report a release version (tag_name {tag_name!r}): prepline's pipelines need backend "
                f">= {max((f.minimum for f in FEATURES if f.system == 'KFP backend' and f.used_by != 'super (display only)'), key=parse_version)}"
                " (docs/compatibility.md)"]
    return [f"KFP backend {tag_name} is older than {f.minimum}, which {f.used_by} needs for: {f.feature} (docs/compatibility.md)"
            for f in FEATURES if f.system == "KFP backend" and have < parse_version(f.minimum)]


def table_markdown() -> str:
    rows = ["| system | feature | needs | used by | decided in |", "|---|---|---|---|---|"]
    rows += [f"| {f.system} | {f.feature} | >= {f.minimum} | {f.used_by} | `{f.source}` |" for f in FEATURES]
    return "\n".join(rows) + "\n"
