"""The ``kuberay`` cluster provider: RayClusters through the KubeRay API server, Ray jobs on their heads.

**Clusters, V2** (default, KubeRay >= 1.4): the API server proxies the Kubernetes API for
``ray.io/v1`` resources (``apiserversdk/proxy.go``)::

    POST   {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters              create
    GET    {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}       state and conditions
    GET    {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters?labelSelector=...   the sweep
    DELETE {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}

**V1** (``api_version="v1"``, deprecated): compute templates ``<cluster>-head`` /
``<cluster>-workers`` (deleted with the cluster), ``/apis/v1/.../clusters``; prepline's labels
are stored as the cluster's annotations there.

**Jobs** (``job_access``):

* ``"direct"`` (default): Ray's job REST API on the head Service,
  ``http://<cluster>-head-svc.<ns>.svc.cluster.local:8265`` (``head_url``, a template with
  ``{name}`` and ``{namespace}``), which is what the KubeRay V1 server itself calls. KFP steps
  run inside the cluster, so this needs no RBAC at all.
* ``"apiserver"``: through the API server, for use from outside the cluster (the CLI on a
  laptop). V2: its service proxy ``/api/v1/namespaces/{ns}/services/{name}-head-svc:8265/proxy``.
  A POST there is the RBAC verb ``create`` on ``services/proxy``, which the API server's own
  ClusterRole does not grant (``helm-chart/kuberay-apiserver/templates/rbac/cluster_role.yaml``):
  submit and stop need the Role of ``deploy/`` bound to the identity of ``token`` (the proxy keeps
  a caller's Authorization header). V1: ``/apis/v1/namespaces/{ns}/jobsubmissions/{cluster}``.

**Ready** = ``status.state == "ready"`` and the dashboard answering ``/api/version`` (it lags).
**Failures** fail fast with the reason the operator reports (:mod:`prepline.clusters.diagnose`):
the ``HeadPodReady``/``ReplicaFailure`` conditions, V1's events, and the pods themselves where the
Kubernetes API may be read (``kube`` option).

**Create is idempotent**: after any error the cluster is read back; if it exists and carries our
labels for this run, stage and branch it is reused (a retried step; a lost answer; V1 answers 500
for an existing cluster: the AlreadyExists is wrapped in an internal error), else the error
stands with the server's message.

Transport and errors: :mod:`prepline.clusters.http` (bounded retries, ``Retry-After``, token
from ``token=`` / ``$PREPLINE_KUBERAY_TOKEN`` / a token file re-read on every call).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from prepline.clusters import diagnose
from prepline.clusters.base import LABEL_BRANCH, LABEL_MANAGED, LABEL_RUN, LABEL_STAGE, ClusterError, ClusterInfo, ClusterProvider, ClusterSpec
from prepline.clusters.http import (SECURITY_PROXY_FIX, ApiError, AuthError, Conflict, JsonHttp, NotFound, RequestError, Unavailable,
                                    from_security_proxy)
from prepline.clusters.kuberay_bodies import DASHBOARD_PORT, GPU_GROUP, cluster_v1_body, compute_template_bodies, raycluster_body, template_names
from prepline.clusters.ray_jobs import JobClient, RayJobClient, V1JobClient
from prepline.errors import ConfigError

__all__ = [
    "ClusterFailed", "KubeRayAuthError", "KubeRayClient", "KubeRayConflict", "KubeRayError", "KubeRayNotFound",
    "KubeRayProvider", "KubeRayRequestError", "KubeRayTimeout", "KubeRayUnavailable", "raycluster_body",
]

log = logging.getLogger("prepline.clusters.kuberay")

ENV_SERVER = "PREPLINE_KUBERAY_SERVER"
ENV_TOKEN = "PREPLINE_KUBERAY_TOKEN"
ENV_TOKEN_FILE = "PREPLINE_KUBERAY_TOKEN_FILE"
ENV_CA = "PREPLINE_KUBERAY_CA"
RAY_GROUP = "/apis/ray.io/v1"
V1 = "/apis/v1"
HEAD_URL = "http://{name}-head-svc.{namespace}.svc.cluster.local:" + str(DASHBOARD_PORT)
JOB_ACCESS = ("direct", "apiserver")

# the error family (prepline.clusters.http) under the names callers know
KubeRayError, KubeRayUnavailable, KubeRayAuthError = ApiError, Unavailable, AuthError
KubeRayNotFound, KubeRayConflict, KubeRayRequestError = NotFound, Conflict, RequestError


class KubeRayTimeout(ApiError):
    """A cluster did not become ready in time."""


class ClusterFailed(ApiError):
    """The cluster cannot become ready: the operator or the pods report why."""


class KubeRayClient(JsonHttp):
    """The KubeRay API server's V2 and V1 paths. Every method returns the decoded JSON answer."""

    describe = "KubeRay API server"
    user_agent = "prepline-kuberay"

    def __init__(self, server: str | None = None, token: str | None = None, token_file: str | None = None, **kw):
        from prepline.stage_params import DEFAULT_KUBERAY_SERVER

        # an explicit server, else $PREPLINE_KUBERAY_SERVER, else the in-cluster address of the Helm chart's Service
        server = server or os.environ.get(ENV_SERVER) or DEFAULT_KUBERAY_SERVER
        if not server.startswith(("http://", "https://")):
            raise ConfigError(f"KubeRay API server URL '{server}' is missing or not http(s)",
                              f"pass server='http://kuberay-apiserver-service.<ns>.svc.cluster.local:8888' or set {ENV_SERVER}")
        token = token if token is not None else os.environ.get(ENV_TOKEN) or None
        token_file = None if token else (token_file or os.environ.get(ENV_TOKEN_FILE) or None)
        kw["ca_cert"] = kw.get("ca_cert") or os.environ.get(ENV_CA)
        super().__init__(server, token=token, token_file=token_file, **kw)

    def unavailable_fix(self, path: str) -> str:
        return (f"check that the KubeRay API server runs and is reachable at {self.server} ({ENV_SERVER})"
                + ("; a 5xx through the service proxy means the Ray head's dashboard is not serving (yet)" if "/proxy" in path else ""))

    def fix_for(self, method: str, path: str, status: int, body: str) -> str:
        if from_security_proxy(status, body):
            return SECURITY_PROXY_FIX
        if status == 401:
            return (("the token was rejected: " if self.auth_headers() else "no token was sent: ")
                    + f"pass token=..., set {ENV_TOKEN}, or {ENV_TOKEN_FILE} to a service-account token file")
        if status == 403:
            return ("the identity lacks permission: grant it RBAC on rayclusters.ray.io in that namespace (deploy/), "
                    "or use another token")
        if status == 404:
            return "check the name and the namespace (and the server's API version: v2 or v1)"
        return super().fix_for(method, path, status, body)

    # -- V2: RayCluster custom resources ----------------------------------------------------------
    def create_raycluster(self, body: dict, retries: int | None = None) -> dict:
        return self.request("POST", f"{RAY_GROUP}/namespaces/{body['metadata']['namespace']}/rayclusters", body, retries=retries)

    def get_raycluster(self, namespace: str, name: str, retries: int | None = None) -> dict:
        return self.request("GET", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters/{name}", retries=retries)

    def delete_raycluster(self, namespace: str, name: str) -> dict:
        return self.request("DELETE", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters/{name}")

    def list_rayclusters(self, namespace: str, label_selector: str = "", limit: int = 200) -> list[dict]:
        items, cont = [], ""
        while True:
            params = {"limit": str(limit), **({"labelSelector": label_selector} if label_selector else {}), **({"continue": cont} if cont else {})}
            page = _dict(self.request("GET", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters", params=params), "list RayClusters")
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items

    def dashboard_address(self, namespace: str, name: str) -> str:
        """The head's dashboard through the service proxy (use from outside the cluster)."""
        return f"{self.server}/api/v1/namespaces/{namespace}/services/{name}-head-svc:{DASHBOARD_PORT}/proxy"

    # -- V1 ---------------------------------------------------------------------------------------
    def create_compute_template(self, body: dict) -> dict:
        return self.request("POST", f"{V1}/namespaces/{body['namespace']}/compute_templates", body)

    def get_compute_template(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"{V1}/namespaces/{namespace}/compute_templates/{name}")

    def delete_compute_template(self, namespace: str, name: str) -> dict:
        return self.request("DELETE", f"{V1}/namespaces/{namespace}/compute_templates/{name}")

    def create_cluster_v1(self, body: dict, retries: int | None = None) -> dict:
        return self.request("POST", f"{V1}/namespaces/{body['namespace']}/clusters", body, retries=retries)

    def get_cluster_v1(self, namespace: str, name: str, retries: int | None = None) -> dict:
        return self.request("GET", f"{V1}/namespaces/{namespace}/clusters/{name}", retries=retries)

    def delete_cluster_v1(self, namespace: str, name: str) -> dict:
        return self.request("DELETE", f"{V1}/namespaces/{namespace}/clusters/{name}")

    def list_clusters_v1(self, namespace: str, limit: int = 200) -> list[dict]:
        items, cont = [], ""
        while True:
            params = {"limit": str(limit), **({"continue": cont} if cont else {})}
            page = _dict(self.request("GET", f"{V1}/namespaces/{namespace}/clusters", params=params), "list clusters")
            items += page.get("clusters") or []
            cont = page.get("continue") or ""
            if not cont:
                return items


def _dict(reply, what: str) -> dict:
    if not isinstance(reply, dict):
        raise KubeRayError(f"unexpected answer to {what}: {str(reply)[:300]!r}",
                           "check that the server URL points at the KubeRay API server (not a UI or another proxy)")
    return reply


def _fix_for(fatal: str) -> str:
    if f"(group {GPU_GROUP}) Unschedulable" in fatal:
        return ("no node can hold a pod of the GPU worker group (cluster_json gpu_workers): check that a node pool offers that GPU "
                "resource (kubectl describe nodes: Allocatable nvidia.com/gpu), that gpu_workers.node_selector matches its labels and "
                "gpu_workers.tolerations its taints, or ask for fewer GPUs per pod; a cluster autoscaler adding a GPU node may need "
                "longer (provider_json pending_grace_seconds); then run the step again: the exit task deletes the cluster")
    return ("fix the cause (image name and pull secret, resources and quotas, the secrets it mounts), "
            "then run the step again; the exit task deletes the cluster")


def _template_key(t: dict) -> tuple:
    """What must match for an existing V1 compute template to be reused (int64 may come back as strings)."""
    import json

    return (str(t.get("cpu") or ""), str(t.get("memory") or ""), t.get("memoryUnit") or "Gi", str(t.get("gpu") or "0"),
            t.get("gpuAccelerator") or "", json.dumps(t.get("tolerations") or [], sort_keys=True))


def _ours(labels: dict, spec: ClusterSpec) -> bool:
    """Our cluster for this run, stage and branch (the labels prepline.stages.cluster_spec sets)."""
    want = {k: spec.labels[k] for k in (LABEL_RUN, LABEL_STAGE, LABEL_BRANCH) if k in spec.labels}
    return labels.get(LABEL_MANAGED) == "true" and all(labels.get(k) == v for k, v in want.items()) \
        and (LABEL_BRANCH in spec.labels or LABEL_BRANCH not in labels)


class KubeRayProvider(ClusterProvider):
    """``ClusterProvider`` on a KubeRay API server. ``namespace`` ('' = the pod's own, else
    'default') is the default for calls that do not name one. Options: see the module doc."""

    def __init__(self, server: str | None = None, namespace: str = "", token: str | None = None, api_version: str = "v2",
                 poll_interval: float = 5.0, token_file: str | None = None, timeout: float = 30.0, connect_timeout: float = 5.0,
                 retries: int = 4, backoff: float = 0.5, backoff_max: float = 8.0, ca_cert: str | None = None, user: str = "prepline",
                 job_access: str = "direct", head_url: str = HEAD_URL, pending_grace_seconds: float = 120.0,
                 kube: dict | str | None = None, client: KubeRayClient | None = None):
        if api_version not in ("v2", "v1"):
            raise ConfigError(f"api_version '{api_version}' is not supported", "use 'v2' (KubeRay >= 1.4) or 'v1'")
        if job_access not in JOB_ACCESS:
            raise ConfigError(f"job_access '{job_access}' is not one of {', '.join(JOB_ACCESS)}",
                              "'direct' (the head Service, inside the cluster) or 'apiserver' (through the API server, from outside)")
        if "{name}" not in head_url or not head_url.startswith(("http://", "https://")):
            raise ConfigError(f"head_url '{head_url}' must be an http(s) URL template with {{name}} (and {{namespace}})", f"e.g. {HEAD_URL}")
        if poll_interval <= 0 or pending_grace_seconds < 0:
            raise ConfigError("poll_interval must be > 0 and pending_grace_seconds >= 0", "e.g. poll_interval=5, pending_grace_seconds=120")
        self.client = client or KubeRayClient(server, token=token, token_file=token_file, timeout=timeout,
                                              connect_timeout=connect_timeout, retries=retries, backoff=backoff,
                                              backoff_max=backoff_max, ca_cert=ca_cert)
        self.namespace = namespace or diagnose.namespace_of_pod()
        self.api_version, self.poll_interval, self.user = api_version, poll_interval, user
        self.job_access, self.head_url, self.grace = job_access, head_url, pending_grace_seconds
        self._retry_opts = dict(timeout=timeout, connect_timeout=connect_timeout, retries=retries, backoff=backoff, backoff_max=backoff_max)
        self.pods = diagnose.KubePods.from_options(kube)

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def job_address(self, namespace: str, name: str) -> str:
        if self.job_access == "direct":
            return self.head_url.format(name=name, namespace=namespace)
        return self.client.dashboard_address(namespace, name)

    # -- conversions ------------------------------------------------------------------------------
    def _info_v2(self, obj: dict) -> ClusterInfo:
        md = obj.get("metadata") or {}
        ns, name = md.get("namespace", ""), md.get("name", "")
        return ClusterInfo(name=name, namespace=ns, state=(obj.get("status") or {}).get("state") or "pending",
                           job_address=self.job_address(ns, name), labels=dict(md.get("labels") or {}), created=md.get("creationTimestamp", ""))

    def _info_v1(self, obj: dict) -> ClusterInfo:
        ns, name = obj.get("namespace", ""), obj.get("name", "")
        labels = {k: v for k, v in (obj.get("annotations") or {}).items() if k.startswith("prepline.dev/")}
        return ClusterInfo(name=name, namespace=ns, state=obj.get("clusterState") or "pending",
                           job_address=self.job_address(ns, name), labels=labels, created=obj.get("createdAt", ""))

    # -- clusters ---------------------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> ClusterInfo:
        spec = replace(spec, namespace=self._ns(spec.namespace))  # '' = the provider's (the step's own) namespace
        if self.api_version == "v1":
            templates = compute_template_bodies(spec)
            body = cluster_v1_body(spec, user=self.user)  # validate everything before creating anything
            for t in templates:
                self._create_template(t)
            return self._create_once(spec, lambda r: self.client.create_cluster_v1(body, retries=r),
                                     lambda: self.client.get_cluster_v1(spec.namespace, spec.name, retries=0), self._info_v1, "annotations")
        body = raycluster_body(spec)
        return self._create_once(spec, lambda r: self.client.create_raycluster(body, retries=r),
                                 lambda: self.client.get_raycluster(spec.namespace, spec.name, retries=0), self._info_v2, "labels")

    def _create_once(self, spec: ClusterSpec, post, get, info, label_field: str) -> ClusterInfo:
        """POST once per attempt; after any error read the cluster back and reuse it if it is ours."""
        attempts = self.client.retries + 1
        for attempt in range(attempts):
            try:
                return info(_dict(post(0), "create cluster"))
            except ApiError as e:
                err = e
            try:
                existing = _dict(get(), "get cluster")
            except NotFound:
                existing = None
            except Unavailable:
                existing = None  # cannot tell yet: retry the create (bounded)
            except ApiError:
                raise err from None
            if existing is not None:
                labels = (existing.get("metadata") or {}).get("labels") if label_field == "labels" else existing.get("annotations")
                if not _ours(labels or {}, spec):
                    raise ClusterError(f"a RayCluster '{spec.name}' not created by prepline for this run and stage exists in namespace "
                                       f"'{spec.namespace}' (creating it answered: {err.message})",
                                       "delete it or choose another cluster name (cluster_name(run, stage, branch))") from err
                log.info("RayCluster %s/%s exists already (ours): reusing it", spec.namespace, spec.name)
                return info(existing)
            if not (isinstance(err, Unavailable) or err.status in (429, 500, 502, 503, 504)):
                raise err
            if attempt + 1 < attempts:
                time.sleep(self.client._delay(attempt + 1, None))
        raise Unavailable(f"creating cluster {spec.namespace}/{spec.name} failed after {attempts} attempt(s): {err.message}",
                          err.fix, status=err.status, body=err.body)

    def _create_template(self, t: dict) -> None:
        try:
            self.client.create_compute_template(t)
        except Conflict:
            have = _dict(self.client.get_compute_template(t["namespace"], t["name"]), "get compute template")
            if _template_key(have) != _template_key(t):
                raise ClusterError(f"compute template '{t['name']}' exists with other resources "
                                   f"(cpu, memory, unit, gpu, accelerator, tolerations = {_template_key(have)} instead of {_template_key(t)})",
                                   "delete the stale template (DELETE /apis/v1/namespaces/<ns>/compute_templates/<name>) or use another cluster name") from None
            log.info("compute template %s/%s exists already: reusing it", t["namespace"], t["name"])

    def _get_raw(self, ns: str, name: str) -> dict:
        return _dict(self.client.get_cluster_v1(ns, name) if self.api_version == "v1" else self.client.get_raycluster(ns, name), "get cluster")

    def get(self, name: str, namespace: str | None = None) -> ClusterInfo:
        obj = self._get_raw(self._ns(namespace), name)
        return self._info_v1(obj) if self.api_version == "v1" else self._info_v2(obj)

    def condition(self, name: str, namespace: str | None = None) -> str:
        ns = self._ns(namespace)
        obj = self._get_raw(ns, name)
        info = self._info_v1(obj) if self.api_version == "v1" else self._info_v2(obj)
        return "; ".join([f"the cluster is now {info.state or 'without a state'}", *(f.text for f in self.findings(obj, ns, name)[:3])])

    def findings(self, obj: dict, ns: str, name: str) -> list:
        """What is wrong with the cluster now: conditions/events, and its pods where they can be read."""
        found = diagnose.from_v1_events(obj) if self.api_version == "v1" else diagnose.from_raycluster(obj)
        if self.pods is not None:
            try:
                pods = self.pods.pods(ns, name)
            except (AuthError, NotFound):
                self.pods, pods = None, None  # no access: stop asking (logged once)
            found += diagnose.from_pods(pods or [])
        return found

    def wait_ready(self, name: str, namespace: str | None = None, timeout: float = 900) -> ClusterInfo:
        """Poll until the state is ready, then until the dashboard answers (it lags the state).
        Raises ``ClusterFailed`` with the reason as soon as one is fatal, ``KubeRayTimeout`` with
        what was last seen."""
        ns = self._ns(namespace)
        deadline = time.monotonic() + timeout
        watch = diagnose.FailureWatch(grace=self.grace)
        while True:
            try:
                obj = self._get_raw(ns, name)
            except NotFound as e:
                raise ClusterError(f"cluster {ns}/{name} does not exist (deleted while waiting?)", "create it first; check the namespace") from e
            info = self._info_v1(obj) if self.api_version == "v1" else self._info_v2(obj)
            state = info.state.lower()
            if state == "ready":
                break
            if state == "suspended":
                raise ClusterError(f"cluster {ns}/{name} is suspended", "resume it (spec.suspend: false) or delete it")
            fatal = watch.observe(self.findings(obj, ns, name))
            if fatal:
                raise ClusterFailed(f"cluster {ns}/{name} cannot start: {fatal}", _fix_for(fatal))
            if time.monotonic() >= deadline:
                seen = watch.summary() or "no condition or event gave a reason"
                old = ("; KubeRay before 1.5.1 says only ContainersNotReady for a container that cannot start (image pull, crash "
                       "loop, a missing secret): KubeRay >= 1.5.1 or get/list on pods fails fast with the reason"
                       if "ContainersNotReady" in seen and self.pods is None else "")
                raise KubeRayTimeout(f"cluster {ns}/{name} not ready after {timeout:.0f}s (state: {info.state}; last seen: {seen})",
                                     f"check the head pod (kubectl -n {ns} describe pod -l ray.io/cluster={name}): image pull, "
                                     "unschedulable resources, quotas, secrets; grant the step get/list on pods (deploy/) for reasons "
                                     f"here; or raise the timeout{old}")
            time.sleep(self.poll_interval)
        return self._wait_dashboard(info, ns, name, deadline, timeout)

    def _wait_dashboard(self, info: ClusterInfo, ns: str, name: str, deadline: float, timeout: float) -> ClusterInfo:
        client, last = self.job_client(name, ns), ""
        while True:
            try:
                client.ping() if isinstance(client, V1JobClient) else client.version(retries=0)
                return info
            except AuthError:
                raise
            except ApiError as e:
                last = e.message
            if time.monotonic() >= deadline:
                raise KubeRayTimeout(f"cluster {ns}/{name} is ready but its dashboard did not answer within {timeout:.0f}s: {last}",
                                     "check the head pod's dashboard (port 8265, rayStartParams dashboard-host 0.0.0.0); with "
                                     "job_access='direct' the step must run in the cluster (or set head_url)")
            time.sleep(self.poll_interval)

    def delete(self, name: str, namespace: str | None = None) -> bool:
        ns = self._ns(namespace)
        try:
            self.client.delete_cluster_v1(ns, name) if self.api_version == "v1" else self.client.delete_raycluster(ns, name)
            existed = True
        except NotFound:
            existed = False
        if self.api_version == "v1":
            for t in template_names(name):
                try:
                    self.client.delete_compute_template(ns, t)
                except NotFound:
                    pass
        return existed

    def list(self, namespace: str | None = None, labels: dict | None = None) -> list[ClusterInfo]:
        """prepline's clusters (``prepline.dev/managed=true``) carrying all these labels."""
        ns = self._ns(namespace)
        want = {LABEL_MANAGED: "true", **{str(k): str(v) for k, v in (labels or {}).items()}}
        if self.api_version == "v2":
            selector = ",".join(f"{k}={v}" for k, v in sorted(want.items()))
            infos = [self._info_v2(o) for o in self.client.list_rayclusters(ns, selector)]
        else:
            infos = [self._info_v1(o) for o in self.client.list_clusters_v1(ns)]
        # V1 cannot select by label on the server; V2 filters twice to be safe against a lax proxy
        return [i for i in infos if all(i.labels.get(k) == v for k, v in want.items())]

    # -- jobs -------------------------------------------------------------------------------------
    def job_client(self, name: str, namespace: str | None = None) -> JobClient:
        ns = self._ns(namespace)
        if self.job_access == "apiserver" and self.api_version == "v1":
            return V1JobClient(self.client, ns, name)
        headers = self.client.auth_headers() if self.job_access == "apiserver" else {}
        return RayJobClient(self.job_address(ns, name), headers=headers, **self._retry_opts)
