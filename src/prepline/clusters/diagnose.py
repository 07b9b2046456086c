"""Why a RayCluster is not ready, from what KubeRay and Kubernetes really report: fail fast with the reason.

The operator never sets ``status.state = failed`` (``raycluster_controller.go``
``calculateStatus`` sets ``ready``, or ``suspended``). What it does report:

* condition ``HeadPodReady`` (``utils.FindHeadPodReadyCondition``, ``ray-operator/controllers/ray/utils/util.go``):
  the head pod's ``PodReady`` condition; from KubeRay 1.5.1 (kuberay #4196), when that says
  ``ContainersNotReady`` the reason becomes the first not-ready container's waiting/terminated
  reason (``ErrImagePull``, ``ImagePullBackOff``, ``CreateContainerConfigError``,
  ``CrashLoopBackOff``, ``OOMKilled``...) and the message gains ``<container>: <its message>``;
  **before 1.5.1 (1.3.0-1.5.0) it stays ``ContainersNotReady``**, which tells nothing: there the
  pods are what fail fast (read in the cluster's own namespace with the RBAC of deploy/);
  ``HeadPodNotFound`` while there is no head pod;
* condition ``ReplicaFailure`` (reason ``FailedCreateHeadPod``/``FailedCreateWorkerPod``..., the
  create error as message, e.g. a quota);
* V1 only: Warning events of the RayCluster (``resource_manager.go`` ``GetClusterEvents``).

An unschedulable head leaves no trace in those (the pod has no ``Ready`` condition yet), nor does a
worker pod that no node can hold (the cluster just never becomes ``ready``: ``calculateStatus``
wants every pod running): the pods themselves tell it (``PodScheduled`` False, reason
``Unschedulable``, the scheduler's "0/N nodes are available: ..." message), read through the
Kubernetes API where the step may (in the cluster with the RBAC of deploy/, or a kubeconfig's
server); without that access the wait ends with the timeout and says what it last saw. A finding
names the pod's group (its ``ray.io/group`` label: ``headgroup``, ``workers``, ``gpu-workers``) so
that a GPU group no node can hold is said as such.

Container errors count as fatal once seen on ``confirm`` consecutive polls (an image pull can fail
once and then succeed); ``Unschedulable`` and ``ReplicaFailure`` only after ``grace`` seconds (a
cluster autoscaler may add a node, a quota may free up).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from prepline.clusters.http import ApiError, AuthError, JsonHttp, NotFound

log = logging.getLogger("prepline.clusters")

FATAL_CONTAINER = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                   "CreateContainerError", "RunContainerError", "CrashLoopBackOff", "OOMKilled", "ContainerCannotRun"}
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: the label KubeRay puts on every Ray pod with its group's name (ray-operator/controllers/ray/utils/constant.go)
GROUP_LABEL = "ray.io/group"


@dataclass(frozen=True)
class Finding:
    kind: str  # "fatal" (a container error) | "grace" (may resolve: unschedulable, a failed create) | "info"
    key: str  # what is tracked across polls, e.g. "HeadPodReady/ErrImagePull"
    text: str


def from_raycluster(obj: dict) -> list[Finding]:
    """Findings from a RayCluster's status conditions (V2)."""
    out = []
    for c in (obj.get("status") or {}).get("conditions") or []:
        reason, msg = c.get("reason") or "", (c.get("message") or "").strip()
        text = f"{c.get('type')}: {reason}" + (f" ({msg})" if msg else "")
        if c.get("type") == "HeadPodReady" and c.get("status") == "False":
            out.append(Finding("fatal" if reason in FATAL_CONTAINER else "info", f"HeadPodReady/{reason}", text))
        elif c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            out.append(Finding("grace", f"ReplicaFailure/{reason}", text))
    return out


def from_v1_events(obj: dict) -> list[Finding]:
    """Findings from a V1 Cluster's events (Warning ones about creating pods)."""
    out = []
    for e in obj.get("events") or []:
        if e.get("type") == "Warning":
            reason = e.get("reason") or ""
            kind = "fatal" if reason in FATAL_CONTAINER else "grace" if "Fail" in reason else "info"
            out.append(Finding(kind, f"event/{reason}", f"event {reason}: {e.get('message', '')}".strip()))
    return out


def from_pods(pods: list[dict]) -> list[Finding]:
    """Findings from the cluster's pods (``ray.io/cluster=<name>``): waiting/terminated container
    reasons (OOMKilled is read from lastState too) and unschedulable pods."""
    out = []
    for p in pods:
        md, st = p.get("metadata") or {}, p.get("status") or {}
        name, group = md.get("name", "?"), (md.get("labels") or {}).get(GROUP_LABEL, "")
        for c in st.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                of = f" (group {group})" if group else ""
                out.append(Finding("grace", f"{name}/Unschedulable", f"pod {name}{of} Unschedulable: {c.get('message', '')}".strip()))
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            now = (cs.get("state") or {}).get("waiting") or (cs.get("state") or {}).get("terminated") or {}
            last = ((cs.get("lastState") or {}).get("terminated") or {}).get("reason") or ""
            reasons = [r for r in (now.get("reason") or "", last) if r in FATAL_CONTAINER]
            if reasons:
                msg = (now.get("message") or "").strip()
                text = f"pod {name} container {cs.get('name')}: {reasons[0]}" + (f" ({msg})" if msg else "")
                if last and last != reasons[0]:
                    text += f", last terminated: {last} (exit code {cs['lastState']['terminated'].get('exitCode', '?')})"
                out.append(Finding("fatal", f"{name}/{cs.get('name')}/{reasons[0]}", text))
    return out


@dataclass
class FailureWatch:
    """Remembers findings across polls and decides when one is fatal."""

    grace: float = 120.0
    confirm: int = 2
    first_seen: dict = field(default_factory=dict)
    streak: dict = field(default_factory=dict)
    last: list = field(default_factory=list)

    def observe(self, findings: list[Finding], now: float | None = None) -> str:
        """The fatal reason ('' if none yet); keeps the findings for a timeout message."""
        now = time.monotonic() if now is None else now
        keys = {f.key for f in findings}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in keys}
        self.streak = {k: v for k, v in self.streak.items() if k in keys}
        fatal = []
        for f in findings:
            self.first_seen.setdefault(f.key, now)
            self.streak[f.key] = self.streak.get(f.key, 0) + 1
            if (f.kind == "fatal" and self.streak[f.key] >= self.confirm) or (f.kind == "grace" and now - self.first_seen[f.key] >= self.grace):
                fatal.append(f.text)
        self.last = [f.text for f in findings]
        return "; ".join(dict.fromkeys(fatal))

    def summary(self) -> str:
        return "; ".join(dict.fromkeys(self.last))


class KubePods(JsonHttp):
    """Reads a cluster's pods from the Kubernetes API (not through the KubeRay API server: its V2
    proxy serves only ray.io resources and their events)."""

    describe = "Kubernetes API"
    user_agent = "prepline-diagnose"

    @classmethod
    def from_options(cls, kube: dict | str | None) -> "KubePods | None":
        """``kube``: {"server", "token", "token_file", "ca_cert"}; '' or None = in the cluster (the pod's
        service account) if there, else no pod diagnostics; "off" = none."""
        if kube == "off":
            return None
        if isinstance(kube, dict) and kube.get("server"):
            return cls(kube["server"], token=kube.get("token"), token_file=kube.get("token_file"), ca_cert=kube.get("ca_cert"),
                       retries=1, timeout=10)
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if host and os.path.isfile(f"{SA_DIR}/token"):
            host = f"[{host}]" if ":" in host else host
            return cls(f"https://{host}:{port}", token_file=f"{SA_DIR}/token", ca_cert=f"{SA_DIR}/ca.crt", retries=1, timeout=10)
        return None

    def pods(self, namespace: str, cluster: str) -> list[dict] | None:
        """The cluster's pods, or None when they cannot be read (logged once)."""
        try:
            d = self.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"ray.io/cluster={cluster}"})
        except (AuthError, NotFound) as e:
            log.warning("cannot read the pods of %s/%s for diagnostics (%s): grant get/list on pods (deploy/)", namespace, cluster, e.message)
            raise
        except ApiError as e:
            log.debug("pods of %s/%s: %s", namespace, cluster, e.message)
            return None
        return (d.get("items") if isinstance(d, dict) else None) or []


def namespace_of_pod(default: str = "default") -> str:
    """The namespace a pod runs in (its service account's), else ``default``."""
    try:
        with open(f"{SA_DIR}/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default
