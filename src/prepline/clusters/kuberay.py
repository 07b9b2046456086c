"""The ``kuberay`` cluster provider: RayClusters through the KubeRay API server, and our own small
HTTP client for it (there is no official Python client).

**V2** (default, KubeRay >= 1.4): the API server proxies the Kubernetes API for ``ray.io/v1``
resources, so a cluster is a RayCluster custom resource::

    POST   {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters              create
    GET    {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}       state: status.state
    GET    {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters?labelSelector=...   the sweep
    DELETE {server}/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}

and the head's dashboard is reached through the server's service proxy (``job_address``)::

    {server}/api/v1/namespaces/{ns}/services/{name}-head-svc:8265/proxy

Ready = ``status.state == "ready"`` *and* the dashboard answering ``/api/version`` through the
proxy (it lags the state). Jobs use Ray's job REST API under that address (``/api/jobs/``...), a
few calls made here directly. ``job_address`` also works with Ray's own client::

    JobSubmissionClient(info.job_address, headers=provider.client.auth_headers())

**V1** (``api_version="v1"``, deprecated but still served): compute templates named
``<cluster>-head`` / ``<cluster>-workers`` (deleted with the cluster), ``/apis/v1/.../clusters``
(ready = ``clusterState == "ready"`` and the job-submission endpoint answering) and jobs through
``/apis/v1/namespaces/{ns}/jobsubmissions/{cluster}``. V1 cannot label the RayCluster: prepline's
labels are stored as its annotations and ``list`` filters on them. ``job_address`` is the same
service-proxy URL (served by the one API-server binary that serves both versions).

Transport: ``urllib3`` (always installed: botocore depends on it), one pooled connection manager
per client. Every call has a connect and a read timeout; connection errors, 429 and 5xx are
retried with bounded exponential backoff (``Retry-After`` honoured, capped). Non-idempotent calls
are made safe to retry: create treats "already exists" as reuse of our own cluster, and jobs get a
client-side submission id so a retried submit that finds its job already there is a success.
4xx answers raise at once with the server's message and the fix. Authentication: an optional
``Authorization: Bearer <token>`` from ``token=``, ``$PREPLINE_KUBERAY_TOKEN``, or a token file
(``token_file=`` / ``$PREPLINE_KUBERAY_TOKEN_FILE``, re-read on every request so rotated
service-account tokens keep working).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

import urllib3

from prepline.clusters.base import LABEL_MANAGED, ClusterError, ClusterInfo, ClusterProvider, ClusterSpec, JobInfo
from prepline.clusters.kuberay_bodies import (
    DASHBOARD_PORT,
    cluster_v1_body,
    compute_template_bodies,
    job_submission_v1_body,
    ray_job_body,
    raycluster_body,
    template_names,
)
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
RETRY_STATUS = (429, 500, 502, 503, 504)
RAY_GROUP = "/apis/ray.io/v1"
V1 = "/apis/v1"


# -- errors ---------------------------------------------------------------------------------------
class KubeRayError(ClusterError):
    """A KubeRay API-server call failed. ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, fix: str | None = None, status: int | None = None, body: str = ""):
        super().__init__(message, fix)
        self.status = status
        self.body = body


class KubeRayUnavailable(KubeRayError):
    """No usable answer after the bounded retries (connection errors, timeouts, 429, 5xx)."""


class KubeRayAuthError(KubeRayError):
    """401 / 403."""


class KubeRayNotFound(KubeRayError):
    """404."""


class KubeRayConflict(KubeRayError):
    """409: it already exists."""


class KubeRayRequestError(KubeRayError):
    """Another 4xx: the server rejected the request (its message says why)."""


class KubeRayTimeout(KubeRayError):
    """A cluster did not become ready in time."""


class ClusterFailed(KubeRayError):
    """The cluster reached a failed state."""


def _server_message(status: int, raw: bytes) -> str:
    """The useful part of an error answer: a Kubernetes Status / gRPC-gateway ``message``, else the
    text (Ray's dashboard answers with a plain traceback: its last line)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("message"):
            return str(data["message"])
    except ValueError:
        pass
    if "Traceback (most recent call last)" in text:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else text
    return text[:2000] or f"HTTP {status}"


# -- the HTTP client ------------------------------------------------------------------------------
class KubeRayClient:
    """A small client for the KubeRay API server (V2 and V1 paths) and the Ray job REST API behind
    its service proxy. Every method returns the decoded JSON answer."""

    def __init__(self, server: str | None = None, token: str | None = None, token_file: str | None = None,
                 timeout: float = 30.0, connect_timeout: float = 5.0, retries: int = 4, backoff: float = 0.5,
                 backoff_max: float = 8.0, ca_cert: str | None = None):
        server = server or os.environ.get(ENV_SERVER, "")
        if not server.startswith(("http://", "https://")):
            raise ConfigError(f"KubeRay API server URL '{server}' is missing or not http(s)",
                              f"pass server='http://kuberay-apiserver.<ns>:8888' or set {ENV_SERVER}")
        if retries < 0 or backoff < 0 or timeout <= 0 or connect_timeout <= 0:
            raise ConfigError("retries/backoff must be >= 0 and timeouts > 0", "e.g. retries=4, backoff=0.5, timeout=30")
        self.server = server.rstrip("/")
        self._token = token if token is not None else os.environ.get(ENV_TOKEN) or None
        self._token_file = None if self._token else (token_file or os.environ.get(ENV_TOKEN_FILE) or None)
        if self._token_file and not Path(self._token_file).is_file():
            raise ConfigError(f"token file '{self._token_file}' does not exist",
                              f"mount the service-account token there, or pass token= / set {ENV_TOKEN}")
        self.retries, self.backoff, self.backoff_max = retries, backoff, backoff_max
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=timeout)
        ca = ca_cert or os.environ.get(ENV_CA)
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=8, **({"ca_certs": ca} if ca else {}))

    def __repr__(self) -> str:  # never show the token
        return f"KubeRayClient({self.server!r}, auth={'yes' if self._token or self._token_file else 'no'})"

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header (or nothing), e.g. for ``JobSubmissionClient(headers=...)``."""
        token = self._token
        if not token and self._token_file:
            try:
                token = Path(self._token_file).read_text().strip()
            except OSError as e:
                raise KubeRayAuthError(f"cannot read token file '{self._token_file}': {e}", "check the mounted token") from e
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        base = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
        if retry_after:
            try:
                base = min(self.backoff_max, max(base, float(retry_after)))
            except ValueError:
                pass
        return base * random.uniform(0.8, 1.2)

    @staticmethod
    def _log_retry(method: str, path: str, last: str, attempt: int, attempts: int) -> None:
        level = logging.WARNING if attempt + 1 < attempts else logging.DEBUG  # the last one raises instead
        log.log(level, "kuberay %s %s: %s (attempt %d/%d)", method, path, last, attempt + 1, attempts)

    def request(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
                retries: int | None = None):
        """One call with the retry policy; ``retries`` overrides the client's (0: a single try)."""
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        attempts = (self.retries if retries is None else retries) + 1
        started, last, retry_after, last_status, last_body = time.monotonic(), "", None, None, ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self._delay(attempt, retry_after))
            headers = {"Accept": "application/json", "User-Agent": "prepline-kuberay", **self.auth_headers()}
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                resp = self._pool.request(method, url, body=data, headers=headers, timeout=self._timeout,
                                          retries=False, redirect=False)
            except urllib3.exceptions.HTTPError as e:
                last = str(getattr(e, "reason", None) or e).split(">: ", 1)[-1]
                last, retry_after, last_status = f"{type(e).__name__}: {last}", None, None
                self._log_retry(method, path, last, attempt, attempts)
                continue
            status = resp.status
            if status in RETRY_STATUS:
                last_status, last_body = status, resp.data.decode("utf-8", "replace")
                last = f"HTTP {status}: {_server_message(status, resp.data)}"
                retry_after = resp.headers.get("Retry-After")
                self._log_retry(method, path, last, attempt, attempts)
                continue
            if status >= 400:
                raise self._error(method, path, status, resp.data)
            if not resp.data:
                return {}
            try:
                return json.loads(resp.data)
            except ValueError:
                return resp.data.decode("utf-8", "replace")
        waited = time.monotonic() - started
        raise KubeRayUnavailable(
            f"KubeRay API server {self.server}: {method} {path} failed after {attempts} attempt(s) in {waited:.1f}s: {last}",
            f"check that the KubeRay API server runs and is reachable at {self.server} ({ENV_SERVER})"
            + ("; a 5xx through the service proxy means the Ray head's dashboard is not serving (yet)" if "/proxy" in path else ""),
            status=last_status, body=last_body)

    def _error(self, method: str, path: str, status: int, raw: bytes) -> KubeRayError:
        msg = _server_message(status, raw)
        text = f"KubeRay API server {self.server}: {method} {path} -> HTTP {status}: {msg}"
        body = raw.decode("utf-8", "replace")
        if status == 401:
            sent = bool(self.auth_headers())
            return KubeRayAuthError(text, ("the token was rejected: " if sent else "no token was sent: ")
                                    + f"pass token=..., set {ENV_TOKEN}, or {ENV_TOKEN_FILE} to a service-account token file",
                                    status, body)
        if status == 403:
            return KubeRayAuthError(text, "the identity lacks permission: grant it RBAC on rayclusters.ray.io and "
                                    "services/proxy in that namespace (or use another token)", status, body)
        if status == 404:
            return KubeRayNotFound(text, "check the name and the namespace (and the server's API version: v2 or v1)", status, body)
        if status == 409:
            return KubeRayConflict(text, "the object exists already: reuse it or delete it first", status, body)
        return KubeRayRequestError(text, "the server rejected the request: fix the ClusterSpec field or job argument "
                                   "named in the message", status, body)

    # -- V2: RayCluster custom resources ----------------------------------------------------------
    def create_raycluster(self, body: dict) -> dict:
        ns = body["metadata"]["namespace"]
        return self.request("POST", f"{RAY_GROUP}/namespaces/{ns}/rayclusters", body)

    def get_raycluster(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters/{name}")

    def delete_raycluster(self, namespace: str, name: str) -> dict:
        return self.request("DELETE", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters/{name}")

    def list_rayclusters(self, namespace: str, label_selector: str = "", limit: int = 200) -> list[dict]:
        items, cont = [], ""
        while True:
            params = {"limit": str(limit)}
            if label_selector:
                params["labelSelector"] = label_selector
            if cont:
                params["continue"] = cont
            page = _dict(self.request("GET", f"{RAY_GROUP}/namespaces/{namespace}/rayclusters", params=params), "list RayClusters")
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items

    # -- the head's dashboard through the service proxy (Ray job REST API) --------------------------
    def dashboard_path(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/services/{name}-head-svc:{DASHBOARD_PORT}/proxy"

    def dashboard_address(self, namespace: str, name: str) -> str:
        return self.server + self.dashboard_path(namespace, name)

    def dashboard_version(self, namespace: str, name: str, retries: int | None = 0) -> dict:
        return self.request("GET", self.dashboard_path(namespace, name) + "/api/version", retries=retries)

    def submit_ray_job(self, namespace: str, name: str, body: dict) -> dict:
        return self.request("POST", self.dashboard_path(namespace, name) + "/api/jobs/", body)

    def get_ray_job(self, namespace: str, name: str, job_id: str) -> dict:
        return self.request("GET", self.dashboard_path(namespace, name) + f"/api/jobs/{quote(job_id, safe='')}")

    def get_ray_job_logs(self, namespace: str, name: str, job_id: str) -> dict:
        return self.request("GET", self.dashboard_path(namespace, name) + f"/api/jobs/{quote(job_id, safe='')}/logs")

    def stop_ray_job(self, namespace: str, name: str, job_id: str) -> dict:
        return self.request("POST", self.dashboard_path(namespace, name) + f"/api/jobs/{quote(job_id, safe='')}/stop")

    # -- V1 ---------------------------------------------------------------------------------------
    def create_compute_template(self, body: dict) -> dict:
        return self.request("POST", f"{V1}/namespaces/{body['namespace']}/compute_templates", body)

    def get_compute_template(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"{V1}/namespaces/{namespace}/compute_templates/{name}")

    def delete_compute_template(self, namespace: str, name: str) -> dict:
        return self.request("DELETE", f"{V1}/namespaces/{namespace}/compute_templates/{name}")

    def create_cluster_v1(self, body: dict) -> dict:
        return self.request("POST", f"{V1}/namespaces/{body['namespace']}/clusters", body)

    def get_cluster_v1(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"{V1}/namespaces/{namespace}/clusters/{name}")

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

    def _jobs_v1(self, namespace: str, cluster: str) -> str:
        return f"{V1}/namespaces/{namespace}/jobsubmissions/{cluster}"

    def submit_job_v1(self, namespace: str, cluster: str, body: dict) -> dict:
        return self.request("POST", self._jobs_v1(namespace, cluster), body)

    def list_jobs_v1(self, namespace: str, cluster: str, retries: int | None = None) -> dict:
        return self.request("GET", self._jobs_v1(namespace, cluster), retries=retries)

    def get_job_v1(self, namespace: str, cluster: str, job_id: str) -> dict:
        return self.request("GET", f"{self._jobs_v1(namespace, cluster)}/{quote(job_id, safe='')}")

    def get_job_log_v1(self, namespace: str, cluster: str, job_id: str) -> dict:
        return self.request("GET", f"{self._jobs_v1(namespace, cluster)}/log/{quote(job_id, safe='')}")

    def stop_job_v1(self, namespace: str, cluster: str, job_id: str) -> dict:
        return self.request("POST", f"{self._jobs_v1(namespace, cluster)}/{quote(job_id, safe='')}")


# -- the provider ---------------------------------------------------------------------------------
def _dict(reply, what: str) -> dict:
    if not isinstance(reply, dict):
        raise KubeRayError(f"unexpected answer to {what}: {str(reply)[:300]!r}",
                           "check that the server URL points at the KubeRay API server (not a UI or another proxy)")
    return reply


def _v2_failure(obj: dict) -> str:
    st = obj.get("status") or {}
    parts = [st["reason"]] if st.get("reason") else []
    for c in st.get("conditions") or []:
        bad = (c.get("type") == "ReplicaFailure" and c.get("status") == "True") or (c.get("type") == "HeadPodReady" and c.get("status") == "False")
        if bad and c.get("message"):
            parts.append(f"{c.get('type')}: {c.get('reason', '')} {c['message']}".strip())
    return "; ".join(parts) or "no reason given (see `kubectl describe raycluster` and the head pod's events)"


def _v1_failure(obj: dict) -> str:
    events = [e for e in obj.get("events") or [] if e.get("type") == "Warning"] or obj.get("events") or []
    parts = [f"{e.get('reason', '')}: {e.get('message', '')}".strip(": ") for e in events[-3:]]
    return "; ".join(p for p in parts if p) or "no reason given (see `kubectl describe raycluster` and the head pod's events)"


def _template_key(t: dict) -> tuple:
    """What must match for an existing V1 compute template to be reused (int64 may come back as strings)."""
    return (str(t.get("cpu") or ""), str(t.get("memory") or ""), t.get("memoryUnit") or "Gi", str(t.get("gpu") or "0"),
            json.dumps(t.get("tolerations") or [], sort_keys=True))


class KubeRayProvider(ClusterProvider):
    """``ClusterProvider`` on a KubeRay API server. ``namespace`` is the default for calls that do
    not name one (``create`` always uses ``spec.namespace``). ``poll_interval`` paces the waits."""

    def __init__(self, server: str | None = None, namespace: str = "default", token: str | None = None,
                 api_version: str = "v2", poll_interval: float = 5.0, token_file: str | None = None,
                 timeout: float = 30.0, connect_timeout: float = 5.0, retries: int = 4, backoff: float = 0.5,
                 backoff_max: float = 8.0, ca_cert: str | None = None, user: str = "prepline",
                 client: KubeRayClient | None = None):
        if api_version not in ("v2", "v1"):
            raise ConfigError(f"api_version '{api_version}' is not supported", "use 'v2' (KubeRay >= 1.4) or 'v1'")
        if poll_interval <= 0:
            raise ConfigError("poll_interval must be > 0", "e.g. poll_interval=5")
        self.client = client or KubeRayClient(server, token=token, token_file=token_file, timeout=timeout,
                                              connect_timeout=connect_timeout, retries=retries, backoff=backoff,
                                              backoff_max=backoff_max, ca_cert=ca_cert)
        self.namespace = namespace
        self.api_version = api_version
        self.poll_interval = poll_interval
        self.user = user

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    # -- conversions ------------------------------------------------------------------------------
    def _info_v2(self, obj: dict) -> ClusterInfo:
        md = obj.get("metadata") or {}
        ns, name = md.get("namespace", ""), md.get("name", "")
        return ClusterInfo(name=name, namespace=ns, state=(obj.get("status") or {}).get("state") or "pending",
                           job_address=self.client.dashboard_address(ns, name), labels=dict(md.get("labels") or {}),
                           created=md.get("creationTimestamp", ""))

    def _info_v1(self, obj: dict) -> ClusterInfo:
        ns, name = obj.get("namespace", ""), obj.get("name", "")
        labels = {k: v for k, v in (obj.get("annotations") or {}).items() if k.startswith("prepline.dev/")}
        return ClusterInfo(name=name, namespace=ns, state=obj.get("clusterState") or "pending",
                           job_address=self.client.dashboard_address(ns, name), labels=labels, created=obj.get("createdAt", ""))

    # -- clusters ---------------------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> ClusterInfo:
        if self.api_version == "v1":
            return self._create_v1(spec)
        body = raycluster_body(spec)
        try:
            return self._info_v2(_dict(self.client.create_raycluster(body), "create RayCluster"))
        except KubeRayConflict:
            existing = _dict(self.client.get_raycluster(spec.namespace, spec.name), "get RayCluster")
            self._check_ours(existing.get("metadata", {}).get("labels") or {}, spec)
            log.info("RayCluster %s/%s exists already: reusing it", spec.namespace, spec.name)
            return self._info_v2(existing)

    def _check_ours(self, labels: dict, spec: ClusterSpec) -> None:
        if labels.get(LABEL_MANAGED) != "true":
            raise ClusterError(f"a RayCluster '{spec.name}' not created by prepline exists in namespace '{spec.namespace}'",
                               "delete it or choose another cluster name (cluster_name(run, stage, branch))")

    def _create_v1(self, spec: ClusterSpec) -> ClusterInfo:
        templates = compute_template_bodies(spec)
        body = cluster_v1_body(spec, user=self.user)  # validate everything before creating anything
        for t in templates:
            try:
                self.client.create_compute_template(t)
            except KubeRayConflict:
                have = _dict(self.client.get_compute_template(t["namespace"], t["name"]), "get compute template")
                if _template_key(have) != _template_key(t):
                    raise ClusterError(f"compute template '{t['name']}' exists with other resources "
                                       f"(cpu, memory, unit, gpu = {_template_key(have)} instead of {_template_key(t)})",
                                       "delete the stale template (DELETE /apis/v1/namespaces/<ns>/compute_templates/<name>) or use another cluster name")
                log.info("compute template %s/%s exists already: reusing it", t["namespace"], t["name"])
        try:
            return self._info_v1(_dict(self.client.create_cluster_v1(body), "create cluster"))
        except KubeRayConflict:
            existing = _dict(self.client.get_cluster_v1(spec.namespace, spec.name), "get cluster")
            self._check_ours(existing.get("annotations") or {}, spec)
            return self._info_v1(existing)

    def get(self, name: str, namespace: str | None = None) -> ClusterInfo:
        ns = self._ns(namespace)
        if self.api_version == "v1":
            return self._info_v1(_dict(self.client.get_cluster_v1(ns, name), "get cluster"))
        return self._info_v2(_dict(self.client.get_raycluster(ns, name), "get RayCluster"))

    def wait_ready(self, name: str, namespace: str | None = None, timeout: float = 900) -> ClusterInfo:
        """Poll until the state is ready, then until the dashboard answers (it lags the state).
        Raises ``ClusterFailed`` with the operator's reason, ``KubeRayTimeout`` with the last state."""
        ns = self._ns(namespace)
        deadline = time.monotonic() + timeout
        state, info = "", None
        while True:
            try:
                obj = _dict(self.client.get_cluster_v1(ns, name) if self.api_version == "v1" else self.client.get_raycluster(ns, name), "get cluster")
            except KubeRayNotFound as e:
                raise ClusterError(f"cluster {ns}/{name} does not exist (deleted while waiting?)",
                                   "create it first; check the namespace") from e
            info = self._info_v1(obj) if self.api_version == "v1" else self._info_v2(obj)
            state = info.state.lower()
            if state == "ready":
                break
            if state == "failed":
                reason = _v1_failure(obj) if self.api_version == "v1" else _v2_failure(obj)
                raise ClusterFailed(f"cluster {ns}/{name} failed: {reason}",
                                    "fix the cause (image, resources, quotas, secrets), delete the cluster and run again")
            if state == "suspended":
                raise ClusterError(f"cluster {ns}/{name} is suspended", "resume it (spec.suspend: false) or delete it")
            if time.monotonic() >= deadline:
                raise KubeRayTimeout(f"cluster {ns}/{name} not ready after {timeout:.0f}s (state: {info.state})",
                                     "check the head pod (kubectl describe pod -l ray.io/cluster=" + name + "): image pull, "
                                     "unschedulable resources, quotas; or raise the timeout")
            time.sleep(self.poll_interval)
        last = ""
        while True:  # the dashboard: up when it answers through the proxy
            try:
                if self.api_version == "v1":
                    self.client.list_jobs_v1(ns, name, retries=0)
                else:
                    self.client.dashboard_version(ns, name, retries=0)
                return info
            except KubeRayAuthError:
                raise
            except KubeRayError as e:
                last = e.message
            if time.monotonic() >= deadline:
                raise KubeRayTimeout(f"cluster {ns}/{name} is ready but its dashboard did not answer within {timeout:.0f}s: {last}",
                                     "check the head pod's dashboard (port 8265, rayStartParams dashboard-host 0.0.0.0) "
                                     "and that the API server may proxy to services; or raise the timeout")
            time.sleep(self.poll_interval)

    def delete(self, name: str, namespace: str | None = None) -> bool:
        ns = self._ns(namespace)
        if self.api_version == "v2":
            try:
                self.client.delete_raycluster(ns, name)
                return True
            except KubeRayNotFound:
                return False
        try:
            self.client.delete_cluster_v1(ns, name)
            existed = True
        except KubeRayNotFound:
            existed = False
        for t in template_names(name):
            try:
                self.client.delete_compute_template(ns, t)
            except KubeRayNotFound:
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
    def submit_job(self, name: str, namespace: str | None, entrypoint: str, runtime_env: dict | None = None,
                   submission_id: str | None = None, entrypoint_num_cpus: float | None = None) -> str:
        ns = self._ns(namespace)
        sid = submission_id or f"prepline-{uuid.uuid4().hex[:16]}"
        try:
            if self.api_version == "v1":
                body = job_submission_v1_body(entrypoint, sid, runtime_env, entrypoint_num_cpus)
                reply = _dict(self.client.submit_job_v1(ns, name, body), "submit job")
                return reply.get("submissionId") or sid
            body = ray_job_body(entrypoint, sid, runtime_env, entrypoint_num_cpus)
            reply = _dict(self.client.submit_ray_job(ns, name, body), "submit job")
            return reply.get("submission_id") or sid
        except KubeRayError as e:
            # a retry after a lost answer finds our own job there: that is a success
            if "already exists" not in str(e):
                raise
            try:
                existing = _dict(self.client.get_job_v1(ns, name, sid) if self.api_version == "v1" else self.client.get_ray_job(ns, name, sid), "get job")
            except KubeRayError:
                raise e from None
            if existing.get("entrypoint") != entrypoint:
                raise KubeRayConflict(f"job '{sid}' exists on {ns}/{name} with another entrypoint",
                                      "use a new submission id", status=e.status) from e
            return sid

    def job(self, name: str, namespace: str | None, job_id: str) -> JobInfo:
        ns = self._ns(namespace)
        d = _dict(self.client.get_job_v1(ns, name, job_id) if self.api_version == "v1" else self.client.get_ray_job(ns, name, job_id), "get job")
        return JobInfo(job_id=job_id, status=str(d.get("status") or "PENDING").upper(), message=d.get("message") or "")

    def job_logs(self, name: str, namespace: str | None, job_id: str) -> str:
        ns = self._ns(namespace)
        if self.api_version == "v1":
            return _dict(self.client.get_job_log_v1(ns, name, job_id), "job logs").get("log") or ""
        return _dict(self.client.get_ray_job_logs(ns, name, job_id), "job logs").get("logs") or ""

    def stop_job(self, name: str, namespace: str | None, job_id: str) -> None:
        ns = self._ns(namespace)
        if self.api_version == "v1":
            self.client.stop_job_v1(ns, name, job_id)
        else:
            self.client.stop_ray_job(ns, name, job_id)
