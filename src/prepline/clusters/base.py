"""The cluster provider interface and the cluster spec every provider understands."""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from prepline.errors import ConfigError, ServiceError

#: labels every prepline cluster carries (the sweep finds leftovers by them)
LABEL_MANAGED = "prepline.dev/managed"
LABEL_RUN = "prepline.dev/run"
LABEL_STAGE = "prepline.dev/stage"
LABEL_BRANCH = "prepline.dev/branch"

_DNS = re.compile(r"[^a-z0-9-]+")

#: annotations every Ray pod gets unless cluster_json's ``pod_annotations`` says otherwise (a JSON null
#: removes one). Istio's sidecar is off: Ray's processes talk on ports chosen at random (raylet, object
#: manager, workers), which an Envoy sidecar's mTLS/authorization blocks, and the KFP step pods call the head
#: directly (kubeflow/manifests experimental/ray/raycluster_example.yaml needs fixed ports, a headless Service
#: and an AuthorizationPolicy to run Ray with sidecars)
DEFAULT_POD_ANNOTATIONS = {"sidecar.istio.io/inject": "false"}


def cluster_name(run_id: str, stage: str, branch: str = "", prefix: str = "pl") -> str:
    """A valid DNS-1123 label that also starts with a letter (KubeRay derives Service names from it),
    <= 40 chars (KubeRay adds suffixes), unique per run, stage and branch: readable parts plus a
    hash of the unambiguously encoded triple (the hash is never truncated)."""
    digest = hashlib.sha256(json.dumps([run_id, stage, branch]).encode()).hexdigest()[:12]
    head = _DNS.sub("-", prefix.lower()).strip("-")[:10] or "pl"
    if not head[0].isalpha():
        head = "pl-" + head
    readable = "-".join(p for p in (_DNS.sub("-", stage.lower()).strip("-")[:14], _DNS.sub("-", branch.lower()).strip("-")[:6]) if p)
    name = re.sub("-+", "-", f"{head}-{readable}-" if readable else f"{head}-")
    return name[: 40 - len(digest)] + digest


#: the extended resource a GPU is asked for by (NVIDIA's device plugin); ``gpu_resource`` names another
#: (e.g. amd.com/gpu). KubeRay gives a pod's Ray node ``--num-gpus`` from a limit whose name ends in
#: "gpu" (ray-operator/controllers/ray/utils/resources.go IsGPUResourceKey, common/pod.go)
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeGroup:
    """Resources of the head or of one worker group (Kubernetes quantities as strings), and where
    its pods may go: ``tolerations`` and ``node_selector`` are added to the cluster-wide ones for
    this group's pods only (e.g. a GPU node pool's taint and label)."""

    cpu: str = "1"
    memory: str = "2Gi"
    gpu: int = 0
    replicas: int = 1  # workers only
    min_replicas: int = 0
    max_replicas: int = 0  # 0: = replicas
    gpu_resource: str = GPU_RESOURCE
    tolerations: list = field(default_factory=list)
    node_selector: dict = field(default_factory=dict)

    def cpus(self) -> float:
        c = self.cpu
        return float(c[:-1]) / 1000 if c.endswith("m") else float(c)

    def pods(self) -> int:
        """Pods of the group at most (0: the group is not created)."""
        return max(self.replicas, self.max_replicas)


#: what a GPU worker group is unless cluster_json says otherwise (replicas 0: none)
DEFAULT_GPU_WORKERS = dict(cpu="4", memory="16Gi", gpu=1, replicas=0)


@dataclass(frozen=True)
class ClusterSpec:
    """What a stage asks for. Every field is a pipeline parameter (JSON), never compile-time env."""

    name: str
    #: '' = the provider's namespace: ``provider_json.namespace``, else the namespace the step runs in
    #: (its service account's), else ``default``; a value here (``cluster_json.namespace``) wins
    namespace: str = ""
    image: str = ""  # '' = the project's Ray runtime image (prepline.images.RAY_IMAGE)
    ray_version: str = "2.60.0"
    head: NodeGroup = field(default_factory=lambda: NodeGroup(cpu="1", memory="2Gi"))
    workers: NodeGroup = field(default_factory=lambda: NodeGroup(cpu="2", memory="4Gi", replicas=1))
    #: a second worker group of GPU pods (KubeRay group ``gpu-workers``), next to ``workers``; none by default
    gpu_workers: NodeGroup = field(default_factory=lambda: NodeGroup(**DEFAULT_GPU_WORKERS))
    env: dict = field(default_factory=dict)
    #: environment from Kubernetes secrets: [{"name": ENV, "secret": NAME, "key": KEY}] or [{"secret": NAME}] (all keys)
    env_from_secrets: list = field(default_factory=list)
    tolerations: list = field(default_factory=list)
    node_selector: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)  # of the RayCluster
    pod_annotations: dict = field(default_factory=lambda: dict(DEFAULT_POD_ANNOTATIONS))  # of the head and worker pods
    service_account: str = ""
    image_pull_secrets: list = field(default_factory=list)
    ray_start_params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.name) or len(self.name) > 63:
            raise ConfigError(f"cluster name '{self.name}' is not a valid DNS-1123 label", "use cluster_name(run, stage, branch)")
        if self.namespace and (not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", str(self.namespace)) or len(self.namespace) > 63):
            raise ConfigError(f"namespace '{self.namespace}' is not a valid Kubernetes namespace name (DNS-1123 label)",
                              "use the namespace's metadata.name, or leave it out: the step's own namespace is the default")

    def gpus(self) -> int:
        """GPUs of the whole cluster when every pod is up (head and the GPU group)."""
        return int(self.head.gpu or 0) + self.gpu_workers.pods() * int(self.gpu_workers.gpu or 0)

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterSpec":
        """The spec ``dataclasses.asdict`` gave (a local head's state file)."""
        groups = {k: NodeGroup(**d[k]) for k in ("head", "workers", "gpu_workers") if k in d}
        return cls(**{**d, **groups})


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    namespace: str
    state: str  # provider's word: ready, pending, suspended, dead (KubeRay never reports "failed")
    job_address: str  # the Ray dashboard address jobs go to (what ray.job_submission.JobSubmissionClient takes)
    labels: dict = field(default_factory=dict)
    created: str = ""  # ISO time


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    message: str = ""
    error_type: str = ""  # Ray's JobErrorType of a failed job (dashboard/modules/job/common.py), "" when not given

    def setup_failed(self) -> bool:
        """The job failed before its entrypoint ran: Ray could not set up the runtime environment of
        its supervisor actor (job_manager.py writes RUNTIME_ENV_SETUP_FAILURE with the message
        "runtime_env setup failed: ..."; the KubeRay V1 API gives only the message)."""
        return self.status == "FAILED" and (self.error_type == "RUNTIME_ENV_SETUP_FAILURE"
                                            or self.message.startswith("runtime_env setup failed"))


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class ClusterError(ServiceError):
    """A cluster could not be created, became unhealthy, timed out, or a provider call failed."""


class ClusterProvider(ABC):
    """Create/wait/delete clusters and run Ray jobs on them. Implementations retry transient errors."""

    @abstractmethod
    def create(self, spec: ClusterSpec) -> ClusterInfo:
        """Create the cluster (idempotent: an existing cluster of that name is reused)."""

    @abstractmethod
    def wait_ready(self, name: str, namespace: str = "", timeout: float = 900) -> ClusterInfo:
        """Block until the cluster accepts jobs (dashboard answering), or raise with the reason."""

    @abstractmethod
    def delete(self, name: str, namespace: str = "") -> bool:
        """Delete it; True if it existed. Raises when deletion fails (never silently leaks)."""

    def recover(self, name: str, namespace: str = "", timeout: float = 900) -> ClusterInfo:
        """The head stopped answering: wait until it answers again. On KubeRay the operator restarts a
        failed head pod by itself (raycluster_controller.go recreates missing head pods), so waiting is
        all there is to do; a provider that runs the head itself starts it again."""
        return self.wait_ready(name, namespace, timeout)

    def condition(self, name: str, namespace: str = "") -> str:
        """What the provider says of the cluster now, in a few words (for an error message)."""
        for c in self.list(namespace):
            if c.name == name:
                return f"the cluster is now {c.state or 'without a state'}"
        return "the cluster is gone"

    @abstractmethod
    def list(self, namespace: str = "", labels: dict | None = None) -> list[ClusterInfo]:
        """Clusters (with these labels), for the sweep."""

    @abstractmethod
    def job_client(self, name: str, namespace: str | None = None):
        """The :class:`prepline.clusters.ray_jobs.JobClient` of the cluster's Ray head."""

    def submit_job(self, name: str, namespace: str | None, entrypoint: str, runtime_env: dict | None = None,
                   submission_id: str | None = None, entrypoint_num_cpus: float | None = None) -> str:
        """Submit a Ray job; returns its submission id (safe to retry)."""
        return self.job_client(name, namespace).submit(entrypoint, submission_id, runtime_env, entrypoint_num_cpus)

    def job(self, name: str, namespace: str | None, job_id: str) -> JobInfo:
        return self.job_client(name, namespace).info(job_id)

    def job_logs(self, name: str, namespace: str | None, job_id: str) -> str:
        return self.job_client(name, namespace).logs(job_id)

    def stop_job(self, name: str, namespace: str | None, job_id: str) -> None:
        self.job_client(name, namespace).stop(job_id)
