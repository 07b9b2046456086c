"""A local fake of the KubeRay API server (V2 and V1 paths) and of the Ray dashboard behind its
service proxy, for tests: real HTTP on 127.0.0.1, bodies checked against the published schemas.

What it does (and what it does not):
* V2 RayCluster bodies are validated against the RayCluster CRD's ``v1`` openAPIV3Schema with
  unknown fields rejected (like ``kubectl --validate=strict`` / ``fieldValidation=Strict``), plus
  list-map key uniqueness and ObjectMeta name/label syntax -> 422 ``Invalid`` Status on failure.
  It does not run the operator's webhook or CEL rules.
* V1 bodies are validated against the V1 swagger definitions (``$ref`` resolved, unknown and
  read-only fields rejected) plus the API server's own checks (validations.go) -> 400
  ``InvalidArgument`` as gRPC-gateway answers.
* State machine: a cluster has no status on its first GET, is pending (HeadPodReady False) until
  ``ready_after`` GETs, then ``ready``. The state is never ``failed``: the operator does not set it
  (``ray-operator/controllers/ray/raycluster_controller.go`` calculateStatus: ``ready`` or
  ``suspended``). A cluster that cannot start stays pending and says why the way the operator does
  (``utils.FindHeadPodReadyCondition``, ``RayClusterReplicaFailure``), chosen by its name:
  "broken" -> HeadPodReady False, reason ErrImagePull then ImagePullBackOff; "oom" -> reason
  CrashLoopBackOff (the pods' lastState says OOMKilled); "quota" -> ReplicaFailure
  FailedCreateHeadPod (and, V1, a Warning event FailedToCreateHeadPod on the RayCluster);
  "unsched" -> HeadPodReady False, reason Unknown, no message (an unscheduled pod has no Ready
  condition): only the pods tell (PodScheduled False, Unschedulable).
* ``nodes`` (a list of ``fake_scheduler.Node``): a V2 cluster's pods (the head, each worker group's
  replicas) are placed by ``fake_scheduler.schedule`` when it is created; while a pod fits nowhere
  the cluster stays pending (``calculateStatus`` wants every pod running) and that pod says why
  (PodScheduled False, Unschedulable, the scheduler's message); an unplaced head also keeps
  HeadPodReady False (reason Unknown). In lab mode the realiser starts the placed pods on those nodes.
  Without ``nodes`` every pod fits.
* The pods are served by a separate fake Kubernetes API (``kube_url``: ``GET
  /api/v1/namespaces/{ns}/pods?labelSelector=ray.io/cluster=<name>``), never by the API server (its
  V2 proxy serves only ray.io resources: ``apiserversdk/proxy.go``); ``pods_forbidden`` -> 403.
* The heads' dashboards (``fake_ray_dashboard``, as Ray's ``job_head.py``): directly at
  ``head_url`` (a template with {namespace} and {name}), or through the service proxy
  ``/api/v1/namespaces/{ns}/services/{name}-head-svc:8265/proxy/...``. They answer 503 until the
  cluster is ready and for ``dashboard_lag`` more requests. **A POST through the service proxy is
  403** unless ``proxy_create=True``: kube-apiserver maps POST to the verb ``create``
  (``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``) and the API server's
  ClusterRole grants only get/list/watch on services/proxy
  (``helm-chart/kuberay-apiserver/templates/rbac/cluster_role.yaml``); ``proxy_create`` stands for
  the Role of deploy/ bound to the caller's token.
* **Non-2xx answers of V2 paths break off** after ``cut_short`` bytes (None: whole): the V2 proxy's
  per-request context is cancelled when its round trip returns (``apiserversdk/proxy.go``
  retryRoundTripper, ray-project/kuberay issue #4060), so ``httputil.ReverseProxy`` aborts the copy:
  the status line and the upstream ``Content-Length`` arrive, then the connection closes short of it.
* **V1 create of an existing cluster answers 500** (``resource_manager.go`` CreateCluster wraps the
  AlreadyExists in ``util.NewInternalServerError``: gRPC Internal), not 409; a duplicate compute
  template answers 409 (``NewAlreadyExistError``).
* ``fail_first=N`` / ``fail_next(...)`` inject error answers (e.g. transient 503s, optionally *after* the request
  took effect, to mimic a lost answer); ``token=`` demands ``Authorization: Bearer <token>``;
  ``forbid`` namespaces answer 403. Every request is recorded in ``.requests``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from fake_kube_pods import FakePods
from fake_scheduler import pods_of, release, schedule
from fake_ray_dashboard import Answer, FakeDashboards, FakeRayJobs
from kuberay_schemas import _strict, validate_raycluster, validate_swagger  # noqa: F401 (re-exported)

# -- the server ------------------------------------------------------------------------------------
@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    headers: dict
    body: object
    status: int = 0  # the answer's status, once sent


@dataclass
class Fault:
    status: int
    count: int
    method: str | None
    path: str | None
    after: bool
    retry_after: str | None
    message: str


@dataclass
class _Cluster:
    version: str  # "v2" | "v1"
    obj: dict  # V2: the RayCluster; V1: the Cluster message
    polls: int = 0
    probes_after_ready: int = 0
    pods: list = field(default_factory=list)  # fake_scheduler.Pod of a V2 cluster placed by ``nodes``
    placement: dict = field(default_factory=dict)  # pod name -> node name, or "!" + the scheduler's message
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


_GRPC_HTTP = {3: 400, 5: 404, 6: 409, 2: 500, 13: 500, 16: 401, 7: 403}


class _Reply(Exception):
    def __init__(self, status: int, body, content_type: str = "application/json", headers: dict | None = None):
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers or {}


def ns_of(c) -> str:
    return c.obj.get("namespace") or (c.obj.get("metadata") or {}).get("namespace", "")


def _k8s_status(code: int, reason: str, message: str, details: dict | None = None) -> _Reply:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return _Reply(code, body)


def _grpc(code: int, message: str) -> _Reply:
    return _Reply(_GRPC_HTTP.get(code, 500), {"code": code, "message": message, "details": []})


class FakeKubeRay(FakePods):
    def __init__(self, *, ready_after: int = 2, dashboard_lag: int = 2, job_steps: int = 2, token: str | None = None,
                 forbid: tuple = (), ray_version: str = "2.60.0", fail_first: int = 0, proxy_create: bool = False,
                 cut_short: int | None = 160, pods_forbidden: bool = False, agent_lag: int = 0, secrets: dict | None = None,
                 kuberay_version: str = "1.7.0", bind: str = "127.0.0.1", realise=None, nodes=None):
        #: where the fake's HTTP servers listen (the lab binds them to its bridge so that its hosts reach them)
        self.bind = bind
        #: lab mode (tests/lab/lab_kuberay.py): an accepted V2 RayCluster is started as real Ray nodes on lab
        #: hosts by ``realise.create(ns, name, obj, env_of)``; its state is ``ready`` only when
        #: ``realise.not_ready(ns, name)`` says '' (every node up, the head's dashboard answering) and
        #: DELETE stops its processes (``realise.delete``); ``realise.failure(ns, name)`` may say "unsched"
        #: (no free host), "broken" (an image the lab does not have) or "crash" (a node's process exited:
        #: CrashLoopBackOff, its last state Error). Injected failures (names) are never realised.
        self.realise = realise
        #: the Kubernetes nodes pods are scheduled on (fake_scheduler.Node); None: every pod fits
        self.nodes = nodes
        self.ready_after, self.dashboard_lag, self.job_steps = ready_after, dashboard_lag, job_steps
        self.secrets: dict[tuple[str, str], dict] = dict(secrets or {})
        self.kuberay_version = kuberay_version
        #: HeadPodReady carries the container's waiting reason from KubeRay 1.5.1 (#4196, utils/util.go)
        version = tuple(int(x) for x in kuberay_version.split(".")[:3])
        self.container_reasons = version >= (1, 5, 1)
        #: the V2 proxy's retrying round trip cancels its context on return from 1.5.0 (apiserversdk/proxy.go)
        self.breaks_errors = version >= (1, 5, 0)
        self.token, self.forbid, self.ray_version = token, set(forbid), ray_version
        self.proxy_create, self.cut_short, self.pods_forbidden = proxy_create, cut_short, pods_forbidden
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.clusters: dict[tuple[str, str], _Cluster] = {}
        self.templates: dict[tuple[str, str], dict] = {}
        self.lock = threading.RLock()
        self.ray = FakeRayJobs(self.lock, job_steps, ray_version, agent_lag, env_of=self.pod_env)
        self.jobs = self.ray.jobs
        self.dashboards = FakeDashboards(self.ray, self._head_error, self._ray_version_or_none)
        self._httpd: ThreadingHTTPServer | None = None
        self._kube: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        if fail_first:  # the first requests meet a transient 503 (an API server restarting)
            self.fail_next(503, count=fail_first, message="the server is restarting")

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeKubeRay:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stalls

            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                fake._serve(self)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

        class KubeHandler(Handler):
            def _handle(self):
                fake._serve_kube(self)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

        self._httpd = ThreadingHTTPServer((self.bind, 0), Handler)
        self._kube = ThreadingHTTPServer((self.bind, 0), KubeHandler)
        for srv in (self._httpd, self._kube):
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.dashboards.start()
        return self

    def stop(self) -> None:
        for srv in (self._httpd, self._kube):
            if srv:
                srv.shutdown()
                srv.server_close()
        if self._httpd:
            self.dashboards.stop()
        self._httpd = self._kube = None

    def __enter__(self) -> FakeKubeRay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd, "not started"
        return f"http://{self.bind}:{self._httpd.server_address[1]}"

    @property
    def kube_url(self) -> str:
        assert self._kube, "not started"
        return f"http://{self.bind}:{self._kube.server_address[1]}"

    @property
    def head_url(self) -> str:
        """Where the heads' dashboards answer directly (stands for <name>-head-svc.<namespace>.svc:8265)."""
        return self.dashboards.url_template

    def fail_next(self, status: int = 503, count: int = 1, method: str | None = None, path: str | None = None,
                  after: bool = False, retry_after: str | None = None, message: str = "injected failure") -> None:
        """The next ``count`` matching requests answer ``status`` (``after``: once they took effect)."""
        with self.lock:
            self.faults.append(Fault(status, count, method, path, after, retry_after, message))

    def calls(self, method: str | None = None, contains: str = "") -> list[Recorded]:
        return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    # -- plumbing ---------------------------------------------------------------------------------
    def _fault(self, method: str, path: str, after: bool) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.count > 0 and f.after == after and (f.method in (None, method)) and (f.path is None or f.path in path):
                    f.count -= 1
                    return f
        return None

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        path, query = unquote(parts.path), {k: v[-1] for k, v in parse_qs(parts.query).items()}
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        rec = Recorded(h.command, path, query, {k.lower(): v for k, v in h.headers.items()}, body)
        with self.lock:
            self.requests.append(rec)
        try:
            f = self._fault(h.command, path, after=False)
            if f:
                raise self._fault_reply(f)
            if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
                raise _k8s_status(401, "Unauthorized", "Unauthorized")
            m = re.match(r"^/apis?/(?:ray\.io/)?v1/namespaces/([^/]+)/", path)
            if m and m.group(1) in self.forbid:
                raise _k8s_status(403, "Forbidden", f'User "system:serviceaccount:test:prepline" cannot access namespace "{m.group(1)}"')
            if isinstance(body, str):
                raise _k8s_status(400, "BadRequest", "the request body is not JSON")
            reply = self._route(h.command, path, query, body)
            f = self._fault(h.command, path, after=True)
            if f:
                raise self._fault_reply(f)
        except _Reply as r:
            reply = r
        rec.status = reply.status
        data = reply.body if isinstance(reply.body, (bytes, str)) else json.dumps(reply.body)
        data = data.encode() if isinstance(data, str) else data
        cut = reply.status >= 300 and self.cut_short is not None and self.breaks_errors and (path.startswith("/apis/ray.io/") or "/proxy" in path)
        h.send_response(reply.status)
        h.send_header("Content-Type", reply.content_type)
        h.send_header("Content-Length", str(len(data)))  # the upstream answer's length, whatever arrives of it
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.end_headers()
        if cut and self.cut_short < len(data):
            # kuberay #4060, apiserversdk/proxy.go: retryRoundTripper returns a non-2xx answer and cancels its context
            # (defer cancel()), so httputil.ReverseProxy's copy of the body fails part way and it panics with
            # http.ErrAbortHandler: the connection is closed short of the Content-Length it already sent
            h.wfile.write(data[: self.cut_short])
            h.wfile.flush()
            h.close_connection = True
            import socket

            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        h.wfile.write(data)

    @staticmethod
    def _fault_reply(f: Fault) -> _Reply:
        r = _k8s_status(f.status, "ServiceUnavailable" if f.status == 503 else "InternalError", f.message)
        if f.retry_after:
            r.headers["Retry-After"] = f.retry_after
        return r

    def _route(self, method: str, path: str, q: dict, body) -> _Reply:
        routes = [
            (r"^/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters$", {"POST": self._v2_create, "GET": self._v2_list}),
            (r"^/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters/([^/]+)$", {"GET": self._v2_get, "DELETE": self._v2_delete}),
            (r"^/api/v1/namespaces/([^/]+)/services/([^/:]+)(?::([^/]+))?/proxy(/.*)?$", {m: functools.partial(self._proxy, m) for m in ("GET", "POST", "DELETE")}),
            (r"^/apis/v1/namespaces/([^/]+)/compute_templates$", {"POST": self._v1_tpl_create, "GET": self._v1_tpl_list}),
            (r"^/apis/v1/namespaces/([^/]+)/compute_templates/([^/]+)$", {"GET": self._v1_tpl_get, "DELETE": self._v1_tpl_delete}),
            (r"^/apis/v1/namespaces/([^/]+)/clusters$", {"POST": self._v1_create, "GET": self._v1_list}),
            (r"^/apis/v1/namespaces/([^/]+)/clusters/([^/]+)$", {"GET": self._v1_get, "DELETE": self._v1_delete}),
            (r"^/apis/v1/namespaces/([^/]+)/jobsubmissions/([^/]+)$", {"POST": self._v1_job_submit, "GET": self._v1_job_list}),
            (r"^/apis/v1/namespaces/([^/]+)/jobsubmissions/([^/]+)/log/([^/]+)$", {"GET": self._v1_job_log}),
            (r"^/apis/v1/namespaces/([^/]+)/jobsubmissions/([^/]+)/([^/]+)$", {"GET": self._v1_job_get, "POST": self._v1_job_stop}),
        ]
        for pattern, handlers in routes:
            m = re.match(pattern, path)
            if m:
                if method not in handlers:
                    raise _k8s_status(405, "MethodNotAllowed", f"{method} is not supported on {path}")
                with self.lock:
                    return handlers[method](*m.groups(), q=q, body=body)
        raise _k8s_status(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    # -- cluster state ----------------------------------------------------------------------------
    def unplaced(self, c: _Cluster) -> dict[str, str]:
        """Pods of the cluster that no node can hold: name -> the scheduler's message."""
        return {n: v[1:] for n, v in c.placement.items() if v.startswith("!")}

    def _failure(self, name: str, ns: str = "") -> str:
        for k in ("broken", "oom", "quota", "unsched"):
            if k in name:
                return k
        c = self.clusters.get((ns, name)) if ns else None
        if c is not None and c.pods and c.placement.get(c.pods[0].name, "").startswith("!"):
            return "unsched"  # the head fits no node
        if ns and self._config_error(ns, name):  # a secret the head container needs is missing in its namespace
            return "config"
        if ns and self.realise is not None:  # lab mode: no free host for a node ("unsched"), an image it lacks ("broken")
            return self.realise.failure(ns, name)
        return ""

    def _state(self, c: _Cluster, name: str) -> str:
        """'' (no status yet), 'pending' or 'ready' after this many polls; never 'failed'. A name longer than
        MaxRayClusterNameLength (53, utils/constant.go) is never reconciled: no status ever
        (raycluster_controller.go returns after ValidateRayClusterMetadata fails, with a Warning event only)."""
        if c.polls <= 1 or len(name) > 53:
            return ""
        if self._failure(name, ns_of(c)) or self.unplaced(c):
            return "pending"
        if self._realised(c):
            return "pending" if self.realise.not_ready(ns_of(c), name) else "ready"
        if c.polls <= self.ready_after:
            return "pending"
        return "ready"

    def _realised(self, c: _Cluster) -> bool:
        return self.realise is not None and c.version == "v2"

    def _poll(self, c: _Cluster, name: str) -> str:
        c.polls += 1
        return self._state(c, name)

    def _conditions(self, c: _Cluster, name: str, state: str) -> list[dict]:
        """The conditions the operator would set (utils.FindHeadPodReadyCondition, ReplicaFailure), in
        the shape of ``kuberay_version``: before 1.5.1 the head pod's PodReady reason is copied as it is
        (``ContainersNotReady``, the kubelet's message); from 1.5.1 (kuberay #4196) a not-ready
        container's waiting/terminated reason replaces it and its message is appended."""
        if state == "ready" or (self.unplaced(c) and not self._failure(name, ns_of(c)) and c.polls > self.ready_after):
            # the head runs; a worker pod that fits nowhere keeps the cluster pending without a condition of its own
            return [{"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady", "message": ""}]
        conds = self._conditions_new(c, name)
        if not self.container_reasons:
            for cond in conds:
                if cond["type"] == "HeadPodReady" and cond["reason"] not in ("Unknown", "HeadPodNotFound"):
                    cond.update(reason="ContainersNotReady", message=cond["message"].split("; ", 1)[0])
        return conds

    def _conditions_new(self, c: _Cluster, name: str) -> list[dict]:
        f = self._failure(name, ns_of(c))
        if f == "broken":  # containerStatuses[ray-head].state.waiting, ErrImagePull first, then the back-off
            reason = "ErrImagePull" if c.polls <= 2 else "ImagePullBackOff"
            msg = f'containers with unready status: [ray-head]; ray-head: Back-off pulling image "does-not-exist:1.0": {reason}'
            return [{"type": "HeadPodReady", "status": "False", "reason": reason, "message": msg}]
        if f == "config":
            return [{"type": "HeadPodReady", "status": "False", "reason": "CreateContainerConfigError",
                     "message": f"containers with unready status: [ray-head]; ray-head: {self._config_error(ns_of(c), name)}"}]
        if f in ("oom", "crash"):
            return [{"type": "HeadPodReady", "status": "False", "reason": "CrashLoopBackOff",
                     "message": "containers with unready status: [ray-head]; ray-head: back-off 40s restarting failed container=ray-head"}]
        if f == "quota":
            return [{"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotFound", "message": "Head Pod not found"},
                    {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod",
                     "message": f'pods "{name}-head-x7k2p" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=8, limited: cpu=8'}]
        if f == "unsched":  # no PodReady condition on an unscheduled pod: reason Unknown, no message
            return [{"type": "HeadPodReady", "status": "False", "reason": "Unknown", "message": ""}]
        return [{"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [ray-head]"}]

    def _head_error(self, ns: str, name: str) -> str:
        """Why a head's dashboard does not answer yet ('' when it does)."""
        with self.lock:
            c = self.clusters.get((ns, name))
            if c is None or self._state(c, name) != "ready":
                return f'no endpoints available for service "{name}-head-svc"'
            if self._realised(c):
                return self.realise.not_ready(ns, name)
            c.probes_after_ready += 1
            if c.probes_after_ready <= self.dashboard_lag:
                return "dial tcp 10.0.0.7:8265: connect: connection refused"
        return ""

    def _dashboard_up(self, ns: str, name: str) -> None:
        """Raise the answer the service proxy gives while the dashboard cannot serve."""
        if (ns, name) not in self.clusters:
            raise _k8s_status(404, "NotFound", f'services "{name}-head-svc" not found', {"name": f"{name}-head-svc", "kind": "services"})
        err = self._head_error(ns, name)
        if err:
            raise _k8s_status(503, "ServiceUnavailable", f"error trying to reach service: {err}")

    def _ray_version_or_none(self, ns: str, name: str) -> str | None:
        c = self.clusters.get((ns, name))
        return (c.obj.get("spec", {}).get("rayVersion") or c.obj.get("version")) if c else None

    # -- V2 -----------------------------------------------------------------------------------------
    def _v2_view(self, c: _Cluster, name: str, advance: bool) -> dict:
        state = self._poll(c, name) if advance else self._state(c, name)
        obj = copy.deepcopy(c.obj)
        if state:
            obj["status"] = {"conditions": self._conditions(c, name, state)}
            if state == "ready":
                obj["status"]["state"] = "ready"
        return obj

    def _v2_create(self, ns: str, q: dict, body) -> _Reply:
        errors = validate_raycluster(body)
        name = (body.get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
        if errors:
            raise _k8s_status(422, "Invalid", f'RayCluster.ray.io "{name}" is invalid: ' + ", ".join(errors),
                              {"name": name, "group": "ray.io", "kind": "RayCluster", "causes": [{"message": e} for e in errors]})
        if body["metadata"].get("namespace", ns) != ns:
            raise _k8s_status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
        if (ns, name) in self.clusters:
            raise _k8s_status(409, "AlreadyExists", f'rayclusters.ray.io "{name}" already exists', {"name": name, "group": "ray.io", "kind": "rayclusters"})
        obj = copy.deepcopy(body)
        c = _Cluster("v2", obj)
        obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion="1", generation=1, creationTimestamp=c.created)
        if self.nodes is not None and not any(k in name for k in ("broken", "oom", "quota", "unsched")):
            c.pods = pods_of(obj)
            c.placement = schedule(c.pods, self.nodes)
        self.clusters[(ns, name)] = c
        if self._realised(c) and not self._failure(name, ns):
            extra = {"placement": {p.name: (p.group, c.placement[p.name]) for p in c.pods}} if c.pods else {}
            self.realise.create(ns, name, copy.deepcopy(obj), functools.partial(self.container_env, ns), **extra)
        return _Reply(201, obj)

    def _v2_find(self, ns: str, name: str) -> _Cluster:
        c = self.clusters.get((ns, name))
        if c is None or c.version != "v2":
            raise _k8s_status(404, "NotFound", f'rayclusters.ray.io "{name}" not found', {"name": name, "group": "ray.io", "kind": "rayclusters"})
        return c

    def _v2_get(self, ns: str, name: str, q: dict, body) -> _Reply:
        return _Reply(200, self._v2_view(self._v2_find(ns, name), name, advance=True))

    def _v2_delete(self, ns: str, name: str, q: dict, body) -> _Reply:
        c = self._v2_find(ns, name)
        del self.clusters[(ns, name)]
        if c.pods:
            release(c.placement, c.pods, self.nodes)
        self.ray.drop(ns, name)
        if self._realised(c):
            self.realise.delete(ns, name)
        return _Reply(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": "ray.io", "kind": "rayclusters", "uid": c.obj["metadata"]["uid"]}})

    @staticmethod
    def _selector(sel: str):
        terms = []
        for t in filter(None, (s.strip() for s in sel.split(","))):
            m = re.match(r"^([^!=]+?)\s*(==|=|!=)\s*(.*)$", t)
            if m:
                terms.append((m.group(1), m.group(2), m.group(3)))
            elif t.startswith("!"):
                terms.append((t[1:], "!exists", ""))
            else:
                terms.append((t, "exists", ""))

        def match(labels: dict) -> bool:
            for k, op, v in terms:
                if (op in ("=", "==") and labels.get(k) != v) or (op == "!=" and labels.get(k) == v) \
                        or (op == "exists" and k not in labels) or (op == "!exists" and k in labels):
                    return False
            return True
        return match

    def _v2_list(self, ns: str, q: dict, body) -> _Reply:
        match = self._selector(q.get("labelSelector", ""))
        items = [self._v2_view(c, n, advance=False) for (cns, n), c in sorted(self.clusters.items())
                 if cns == ns and c.version == "v2" and match(c.obj["metadata"].get("labels") or {})]
        start, limit = int(q.get("continue") or 0), int(q.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        md = {"resourceVersion": "1"}
        if start + limit < len(items):
            md["continue"] = str(start + limit)
        return _Reply(200, {"apiVersion": "ray.io/v1", "kind": "RayClusterList", "metadata": md, "items": page})

    # -- the dashboard behind the service proxy ------------------------------------------------------
    def _proxy(self, method: str, ns: str, service: str, port: str | None, rest: str | None, q: dict, body) -> _Reply:
        name = service[: -len("-head-svc")] if service.endswith("-head-svc") else None
        if method != "GET" and not self.proxy_create:
            # kube-apiserver: POST/DELETE = create/delete on services/proxy; the API server's ClusterRole has get/list/watch only
            verb = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}[method]
            raise _k8s_status(403, "Forbidden", f'services "{service}:{port}" is forbidden: User "system:serviceaccount:ray-system:'
                                                f'kuberay-apiserver" cannot {verb} resource "services/proxy" in API group "" in the '
                                                f'namespace "{ns}"', {"name": f"{service}:{port}", "kind": "services"})
        if name is None or (ns, name) not in self.clusters:
            raise _k8s_status(404, "NotFound", f'services "{service}" not found', {"name": service, "kind": "services"})
        if port not in ("8265", "dashboard"):
            raise _k8s_status(503, "ServiceUnavailable", f'no endpoints available for service "{service}:{port}"')
        self._dashboard_up(ns, name)
        status, out, ctype = self.ray.handle(method, ns, name, rest or "/", body, self._ray_version_or_none(ns, name))
        return _Reply(status, out, ctype)

    # -- V1 -----------------------------------------------------------------------------------------
    def _v1_invalid(self, filename: str, definition: str, body) -> None:
        errors = validate_swagger(filename, definition, body)
        if errors:
            raise _grpc(3, f"proto: invalid {definition}: " + "; ".join(errors))

    def _v1_tpl_create(self, ns: str, q: dict, body) -> _Reply:
        self._v1_invalid("config.swagger.json", "protoComputeTemplate", body)
        if body.get("namespace") != ns:
            raise _grpc(3, "The namespace in the request is different from the namespace defined in the compute template.")
        if not body.get("cpu"):
            raise _grpc(3, "Cpu amount is zero. Please specify a valid value.")
        if not body.get("memory"):
            raise _grpc(3, "Memory amount is zero. Please specify a valid value.")
        if (ns, body["name"]) in self.templates:
            raise _grpc(6, f"Compute template {body['name']} already exists in namespace {ns}")
        # the server answers int64 fields as strings (protojson)
        stored = {**body, **{k: str(body[k]) for k in ("cpu", "memory", "gpu") if k in body}}
        self.templates[(ns, body["name"])] = stored
        return _Reply(200, stored)

    def _v1_tpl_list(self, ns: str, q: dict, body) -> _Reply:
        return _Reply(200, {"computeTemplates": [t for (tns, _), t in sorted(self.templates.items()) if tns == ns]})

    def _v1_tpl_get(self, ns: str, name: str, q: dict, body) -> _Reply:
        if (ns, name) not in self.templates:
            raise _grpc(5, f"Compute template {name} not found in namespace {ns}")
        return _Reply(200, self.templates[(ns, name)])

    def _v1_tpl_delete(self, ns: str, name: str, q: dict, body) -> _Reply:
        if self.templates.pop((ns, name), None) is None:
            raise _grpc(5, f"Compute template {name} not found in namespace {ns}")
        return _Reply(200, {})

    def _v1_create(self, ns: str, q: dict, body) -> _Reply:
        self._v1_invalid("cluster.swagger.json", "protoCluster", body)
        cs = body["clusterSpec"]
        head = cs["headGroupSpec"]
        if not head.get("computeTemplate"):
            raise _grpc(3, "HeadGroupSpec compute template is empty. Please specify a valid value.")
        if not head.get("rayStartParams"):
            raise _grpc(3, "HeadGroupSpec RayStartParams is empty. Please specify values.")
        for i, w in enumerate(cs.get("workerGroupSpec") or []):
            if not w.get("maxReplicas"):
                raise _grpc(3, f"WorkerNodeSpec {i} MaxReplicas can not be 0. Please specify a valid value.")
            if w.get("minReplicas", 0) > w["maxReplicas"]:
                raise _grpc(3, f"WorkerNodeSpec {i} MinReplica > MaxReplicas. Please specify a valid value.")
        if body.get("namespace") != ns:
            raise _grpc(3, "The namespace in the request is different from the namespace defined in the cluster.")
        for t in [head["computeTemplate"]] + [w["computeTemplate"] for w in cs.get("workerGroupSpec") or []]:
            if (ns, t) not in self.templates:
                raise _grpc(5, f"Compute template {t} not found in namespace {ns}")
        if (ns, body["name"]) in self.clusters:  # resource_manager.go CreateCluster: NewInternalServerError around AlreadyExists
            raise _grpc(13, f"Internal Server Error: Create Cluster failed.: InternalServerError: Failed to create a cluster for "
                            f"({ns}/{body['name']}): rayclusters.ray.io \"{body['name']}\" already exists")
        c = _Cluster("v1", copy.deepcopy(body))
        self.clusters[(ns, body["name"])] = c
        return _Reply(200, self._v1_view(c, body["name"], advance=False))

    def _v1_view(self, c: _Cluster, name: str, advance: bool) -> dict:
        state = self._poll(c, name) if advance else self._state(c, name)
        obj = {**copy.deepcopy(c.obj), "createdAt": c.created, "serviceEndpoint": {"dashboard": "8265", "head": "10001"}}
        if state == "ready":  # model.FromCrdToAPICluster: clusterState = status.state ('' until ready)
            obj["clusterState"] = state
        if self._failure(name) == "quota" and state:  # the operator's event regarding the RayCluster (GetClusterEvents)
            obj["events"] = [{"id": f"{name}.1", "name": f"{name}-{name}.1", "reason": "FailedToCreateHeadPod", "type": "Warning", "count": 3,
                              "message": f'Failed to create head Pod {ns_of(c)}/{name}-head-x7k2p, pods "{name}-head-x7k2p" is forbidden: '
                                         "exceeded quota: compute"}]
        return obj

    def _v1_find(self, ns: str, name: str) -> _Cluster:
        c = self.clusters.get((ns, name))
        if c is None or c.version != "v1":
            raise _grpc(5, f"Cluster {name} not found in namespace {ns}")
        return c

    def _v1_get(self, ns: str, name: str, q: dict, body) -> _Reply:
        return _Reply(200, self._v1_view(self._v1_find(ns, name), name, advance=True))

    def _v1_delete(self, ns: str, name: str, q: dict, body) -> _Reply:
        self._v1_find(ns, name)
        del self.clusters[(ns, name)]
        self.ray.drop(ns, name)
        return _Reply(200, {})

    def _v1_list(self, ns: str, q: dict, body) -> _Reply:
        items = [self._v1_view(c, n, advance=False) for (cns, n), c in sorted(self.clusters.items()) if cns == ns and c.version == "v1"]
        start, limit = int(q.get("continue") or 0), int(q.get("limit") or 0) or len(items) or 1
        reply = {"clusters": items[start:start + limit]}
        if start + limit < len(items):
            reply["continue"] = str(start + limit)
        return _Reply(200, reply)

    def _v1_dashboard(self, ns: str, name: str) -> None:
        c = self._v1_find(ns, name)
        if self._state(c, name) != "ready":
            raise _grpc(2, "cluster is not ready")
        err = self._head_error(ns, name)
        if err:
            raise _grpc(2, f"Post \"http://{name}-head-svc.{ns}.svc.cluster.local:8265/api/jobs/\": {err}")

    def _v1_job_submit(self, ns: str, name: str, q: dict, body) -> _Reply:
        self._v1_invalid("job_submission.swagger.json", "protoRayJobSubmission", body)
        self._v1_dashboard(ns, name)
        ray_body = {"entrypoint": body["entrypoint"]}
        if body.get("submissionId"):
            ray_body["submission_id"] = body["submissionId"]
        if body.get("runtimeEnv"):
            try:
                env = yaml.safe_load(body["runtimeEnv"])
            except yaml.YAMLError as e:
                raise _grpc(2, f"error converting YAML to JSON: {e}") from None
            if not isinstance(env, dict):
                raise _grpc(2, "json: cannot unmarshal runtimeEnv into Go value of type map[string]interface {}")
            ray_body["runtime_env"] = env
        if body.get("entrypointNumCpus"):
            ray_body["entrypoint_num_cpus"] = body["entrypointNumCpus"]
        status, out, _ = self.ray.handle("POST", ns, name, "/api/jobs/", ray_body)
        if status != 200:  # the dashboard's answer comes back as a gRPC Unknown error
            raise _grpc(2, f"SubmitJob fail: {status} {out}")
        return _Reply(200, {"submissionId": out["submission_id"]})

    def _v1_job_view(self, job: dict) -> dict:
        out = {"entrypoint": job["entrypoint"], "jobId": job["job_id"] or "", "submissionId": job["submission_id"],
               "status": job["status"], "message": job["message"], "startTime": str(job["start_time"])}
        if job["error_type"]:
            out["errorType"] = job["error_type"]
        if job["end_time"]:
            out["endTime"] = str(job["end_time"])
        if job["runtime_env"]:
            out["runtimeEnv"] = {k: str(v) for k, v in job["runtime_env"].items()}
        return out

    def _v1_job(self, ns: str, name: str, sid: str) -> dict:
        self._v1_dashboard(ns, name)
        try:
            return self.ray.find(ns, name, sid)
        except Answer:
            raise _grpc(5, f"JobSubmission.RayJob \"{sid}\" not found") from None

    def _v1_job_list(self, ns: str, name: str, q: dict, body) -> _Reply:
        self._v1_dashboard(ns, name)
        return _Reply(200, {"submissions": [self._v1_job_view(j) for (jns, jc, _), j in self.jobs.items() if (jns, jc) == (ns, name)]})

    def _v1_job_get(self, ns: str, name: str, sid: str, q: dict, body) -> _Reply:
        job = self._v1_job(ns, name, sid)
        self.ray.advance(job)
        return _Reply(200, self._v1_job_view(job))

    def _v1_job_log(self, ns: str, name: str, sid: str, q: dict, body) -> _Reply:
        return _Reply(200, {"log": self._v1_job(ns, name, sid)["logs"]})

    def _v1_job_stop(self, ns: str, name: str, sid: str, q: dict, body) -> _Reply:
        self.ray.stop(self._v1_job(ns, name, sid))
        return _Reply(200, {})
