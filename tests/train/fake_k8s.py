"""A local stand-in for the Kubernetes API server with Kubeflow Trainer installed, for tests: real
HTTP on 127.0.0.1, TrainJob bodies checked against the published CRD.

What it serves (the calls the ``kubernetes`` client and the Kubeflow SDK make):

* ``/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs[/{name}]``: POST, GET, list
  (``labelSelector``), DELETE. A POST is validated against the TrainJob CRD's ``v1alpha1``
  openAPIV3Schema with unknown fields rejected (``fieldValidation=Strict``), plus the CRD's CEL rules
  that matter here (metadata.name an RFC 1035 label <= 63 chars, numProcPerNode >= 1, managedBy
  values) and list-map key uniqueness (env names) -> 422 ``Invalid`` Status. 409 when it exists.
  Defaults of the schema are applied (runtimeRef.apiGroup/kind, managedBy, suspend). Then Trainer's
  validating webhook (``pkg/webhooks/trainjob_webhook.go`` -> ``pkg/runtime/core/
  clustertrainingruntime.go`` / ``trainingruntime.go`` ``ValidateObjects``): a runtimeRef to a runtime
  the cluster does not have is **rejected** (422, "specified clusterTrainingRuntime must be created
  before the TrainJob is created"), and so is a trainer env that sets the torch plugin's reserved
  ``PET_*`` variables (``pkg/runtime/framework/plugins/torch/torch.go``).
* ``/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes[/{name}]`` (``torch-distributed``
  from the Trainer manifests) and ``namespaces/{ns}/trainingruntimes[/{name}]``: GET and list.
* ``/api/v1/namespaces/{ns}/pods`` (list by ``labelSelector``: ``=``, ``==``, ``!=``, ``in (...)``) and
  ``/api/v1/namespaces/{ns}/pods/{pod}/log`` (``container=node``; 400 while the pod is Pending).
* ``/api/v1/namespaces/{ns}/configmaps/{name}``: 404 (the SDK's version probe).

How a TrainJob runs (``FakeK8s.mode``):

* ``"script"``: the job's ``behaviour`` (``fake.behaviour = {"result": "complete"|"fail"|"hang",
  "polls": n, "log": "..."}``) decides; after ``polls`` GETs of the TrainJob it is terminal. Pods
  (one per node) are Pending on the first GET, then Running, then Succeeded/Failed.
* ``"run"``: the trainer container really runs, as a local subprocess of this Python: the
  manifest's command and args, with ``env`` resolved like the kubelet does (``valueFrom.secretKeyRef``
  from ``fake.secrets``; a missing optional key is left out). Its output is the pod log; exit 0 ->
  ``Complete``, else ``Failed``.

* ``"nodes"``: the TrainJob is realised as Trainer's torch runtime would
  (:func:`prepline.train.realise.realise_trainjob`): one process per node, each with its PET_* env,
  started by ``fake.spawn_for(trainjob) -> spawn`` (on this machine, or on the lab's trainer hosts) and
  run by :func:`prepline.train.nodes.run_nodes`. Node 0's output is the pod log. All nodes exit 0 ->
  ``Complete``; the first node that fails -> ``Failed`` with JobSet's reason ``FailedJobs`` and message
  ``jobset failed due to one or more job failures, first failed job: <trainjob>-node-0`` (jobset
  ``pkg/controllers/jobset_controller.go``; Trainer copies the JobSet's Failed condition to the
  TrainJob: kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go``), followed by
  what happened to the node.

``spec.activeDeadlineSeconds`` is enforced on the wall clock from creation: the process is killed
and the job becomes ``Failed`` with reason ``DeadlineExceeded``. A DELETE removes the job and its
pods at once and kills its process. Every request is recorded in ``.requests``; ``.deleted``
lists deleted TrainJobs. ``token=`` demands ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import jsonschema
import yaml

SPECS = Path(__file__).resolve().parents[3] / "shared" / "specs" / "trainer"
if not SPECS.is_dir():  # pragma: no cover - alternative checkout layout
    SPECS = Path("/work/shared/specs/trainer")

GROUP_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- schema -----------------------------------------------------------------------------------------
def _strict(node):
    """Unknown fields are errors: object schemas with ``properties`` get ``additionalProperties:
    false`` (unless they preserve unknown fields); integer formats get their ranges."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) if k not in ("enum", "required", "default", "example") else v for k, v in node.items()}
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("type") == "integer" and out.get("format") in _INT_RANGE:
        out["minimum"] = max(out.get("minimum", _INT_RANGE[out["format"]][0]), _INT_RANGE[out["format"]][0])
        out["maximum"] = min(out.get("maximum", _INT_RANGE[out["format"]][1]), _INT_RANGE[out["format"]][1])
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def _load_yaml(name: str):
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((SPECS / name).read_text(), Loader=loader)


@functools.lru_cache(maxsize=None)
def trainjob_schema() -> dict:
    crd = _load_yaml("trainer.kubeflow.org_trainjobs.yaml")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return version["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def _validator() -> jsonschema.Draft7Validator:
    schema = _strict(trainjob_schema())
    # ObjectMeta is opaque in a CRD schema; the API server checks it itself (below)
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


@functools.lru_cache(maxsize=None)
def torch_distributed_runtime() -> dict:
    return _load_yaml("torch_distributed.yaml")


def _list_maps(schema: dict, value, path: str, errors: list[str]) -> None:
    if isinstance(value, list) and isinstance(schema, dict):
        if schema.get("x-kubernetes-list-type") == "map" and schema.get("x-kubernetes-list-map-keys"):
            keys, seen = schema["x-kubernetes-list-map-keys"], set()
            for i, item in enumerate(value):
                k = tuple(item.get(key) for key in keys) if isinstance(item, dict) else None
                if k in seen:
                    errors.append(f"{path}[{i}]: Duplicate value: {dict(zip(keys, k))}")
                seen.add(k)
        for i, item in enumerate(value):
            _list_maps(schema.get("items") or {}, item, f"{path}[{i}]", errors)
    elif isinstance(value, dict) and isinstance(schema, dict):
        props = schema.get("properties") or {}
        for k, v in value.items():
            if isinstance(props.get(k), dict):
                _list_maps(props[k], v, f"{path}.{k}" if path else k, errors)


def _labels_errors(labels, path: str) -> list[str]:
    errs = []
    if labels is None:
        return errs
    if not isinstance(labels, dict):
        return [f"{path}: must be a map of strings"]
    for k, v in labels.items():
        prefix, _, name = str(k).rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name) or len(name) > 63:
            errs.append(f"{path}: Invalid value: {k!r}: not a valid label key")
        if not isinstance(v, str) or len(v) > 63 or (v and not _LABEL_NAME.match(v)):
            errs.append(f"{path}: Invalid value: {v!r}: a valid label must be an empty string or consist of alphanumeric "
                        "characters, '-', '_' or '.' (at most 63)")
    return errs


def validate_trainjob(obj) -> list[str]:
    """What the API server would answer for this TrainJob under strict field validation; [] if valid."""
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    if not isinstance(obj, dict):
        return errors or ["body is not an object"]
    if obj.get("apiVersion") != "trainer.kubeflow.org/v1alpha1" or obj.get("kind") != "TrainJob":
        errors.append(f"apiVersion/kind: expected trainer.kubeflow.org/v1alpha1 TrainJob, got {obj.get('apiVersion')}/{obj.get('kind')}")
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return errors + ["metadata: Required value"]
    unknown = set(md) - {"name", "namespace", "labels", "annotations", "generateName", "finalizers", "ownerReferences"}
    if unknown:
        errors.append(f"metadata: unknown field(s) {sorted(unknown)}")
    name = md.get("name")
    # the CRD's CEL rules on metadata.name
    if not isinstance(name, str) or not _RFC1035.match(name):
        errors.append("<root>: Invalid value: metadata.name must match RFC 1035 DNS label format")
    elif len(name) > 63:
        errors.append("<root>: Invalid value: metadata.name must be no more than 63 characters")
    errors += _labels_errors(md.get("labels"), "metadata.labels")
    if md.get("annotations") is not None and not all(isinstance(v, str) for v in (md.get("annotations") or {}).values()):
        errors.append("metadata.annotations: values must be strings")
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    trainer = spec.get("trainer") if isinstance(spec.get("trainer"), dict) else {}
    if "numProcPerNode" in trainer and isinstance(trainer["numProcPerNode"], int) and trainer["numProcPerNode"] < 1:
        errors.append("spec.trainer.numProcPerNode: Invalid value: numProcPerNode must be greater than or equal to 1")
    if "managedBy" in spec and spec["managedBy"] not in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"):
        errors.append("spec.managedBy: Invalid value: ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set")
    _list_maps(trainjob_schema(), obj, "", errors)
    return errors


def validate_status(obj: dict) -> list[str]:
    """The fake's own answers are checked too: status must fit the CRD's status schema."""
    sub = _strict(trainjob_schema()["properties"]["status"])
    return [f"status.{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in jsonschema.Draft7Validator(sub).iter_errors(obj.get("status", {}))]


def _apply_defaults(obj: dict) -> None:
    spec = obj.setdefault("spec", {})
    ref = spec.setdefault("runtimeRef", {})
    ref.setdefault("apiGroup", "trainer.kubeflow.org")
    ref.setdefault("kind", "ClusterTrainingRuntime")
    spec.setdefault("managedBy", "trainer.kubeflow.org/trainjob-controller")
    spec.setdefault("suspend", False)


# -- label selectors --------------------------------------------------------------------------------
def _selector(text: str):
    """A predicate over label maps for ``a=b,c!=d,e in (x, y),f``."""
    reqs = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", text or ""):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)$", part)
        if m:
            vals = {v.strip() for v in m.group(3).split(",")}
            reqs.append(lambda L, k=m.group(1), vs=vals, neg=m.group(2) == "notin": (L.get(k) in vs) != neg)
        elif "!=" in part:
            k, v = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda L, k=k, v=v: L.get(k) != v)
        elif "=" in part:
            k, v = (s.strip() for s in part.replace("==", "=").split("=", 1))
            reqs.append(lambda L, k=k, v=v: L.get(k) == v)
        else:
            reqs.append(lambda L, k=part: k in L)
    return lambda labels: all(r(labels or {}) for r in reqs)


# -- state ------------------------------------------------------------------------------------------
@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: object
    status: int = 0


@dataclass
class _Job:
    obj: dict
    created: float
    behaviour: dict
    polls: int = 0
    pods: list = field(default_factory=list)  # pod dicts
    log: str = ""
    proc: subprocess.Popen | None = None
    procs: dict = field(default_factory=dict)  # mode 'nodes': pod -> process
    result: str | None = None  # Complete | Failed
    reason: str = ""
    message: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class FakeK8s:
    """``with FakeK8s() as k8s: ...``; ``k8s.kubeconfig(tmp_path)`` writes a kubeconfig for it."""

    def __init__(self, mode: str = "script", token: str | None = None, pod_env: dict | None = None, bind: str = "127.0.0.1"):
        self.mode = mode
        self.bind = bind  # where it listens (the lab: its bridge address, so that the launcher host reaches it)
        self.token = token
        self.behaviour: dict = {"result": "complete", "polls": 2, "log": "training...\ndone\n"}
        self.cluster_runtimes = {"torch-distributed": copy.deepcopy(torch_distributed_runtime())}
        self.runtimes: dict[tuple[str, str], dict] = {}
        self.secrets: dict[tuple[str, str], dict] = {}
        self.pod_env = dict(pod_env or {})  # what every "container" starts with (PATH, HOME ...)
        self.jobs: dict[tuple[str, str], _Job] = {}
        self.requests: list[Recorded] = []
        self.deleted: list[str] = []
        self.created: list[dict] = []
        self.processes: list[subprocess.Popen] = []  # every trainer process started (mode 'run')
        self.spawn_for = None  # mode 'nodes': trainjob dict -> prepline.train.nodes spawn function
        self.node_base_env: dict | None = {}  # mode 'nodes': what a node's env starts from (None: this process's)
        self.log_dir: Path | None = None  # mode 'nodes': where the node logs go
        self.results: dict = {}  # mode 'nodes': trainjob name -> prepline.train.nodes.JobResult
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer((bind, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True)

    # lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeK8s":
        self._thread.start()
        self._watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for job in list(self.jobs.values()):
            self._kill(job)
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, folder: Path, namespace: str = "default") -> str:
        user = {"token": self.token} if self.token else {}
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }
        path = Path(folder) / "kubeconfig.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    def trainjob_names(self, namespace: str = "default") -> list[str]:
        with self._lock:
            return sorted(n for (ns, n) in self.jobs if ns == namespace)

    # the job machinery
    def _webhook(self, ns: str, body: dict) -> str:
        """What Trainer's validating webhook refuses ('' if nothing)."""
        spec = body.get("spec") or {}
        ref = spec.get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        have = self.cluster_runtimes if kind == "ClusterTrainingRuntime" else {n: r for (n_, n), r in self.runtimes.items() if n_ == ns}
        if ref.get("name") not in have:
            plural = "clustertrainingruntimes" if kind == "ClusterTrainingRuntime" else "trainingruntimes"
            return (f'spec.RuntimeRef: Invalid value: {json.dumps(ref)}: {plural}.trainer.kubeflow.org "{ref.get("name")}" not found: '
                    f"specified {kind[0].lower() + kind[1:]} must be created before the TrainJob is created")
        pet = sorted(e.get("name") for e in (spec.get("trainer") or {}).get("env") or [] if str(e.get("name", "")).startswith("PET_"))
        if pet:
            return f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: {pet}"
        return ""

    def _pod(self, job: _Job, index: int) -> dict:
        md, t = job.obj["metadata"], job.obj["spec"].get("trainer", {})
        name = md["name"]
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{name}-node-0-{index}-{uuid.uuid4().hex[:5]}", "namespace": md["namespace"], "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "labels": {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
                           "batch.kubernetes.io/job-completion-index": str(index),
                           "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
            },
            "spec": {"containers": [{"name": "node", "image": t.get("image") or "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
                                     "command": t.get("command"), "args": t.get("args"),
                                     "env": [e for e in t.get("env", []) if "value" in e] or None}]},
            "status": {"phase": "Pending"},
        }

    def _set_phase(self, job: _Job, phase: str) -> None:
        for p in job.pods:
            p["status"]["phase"] = phase

    def _finish(self, job: _Job, result: str, reason: str, message: str) -> None:
        if job.result:
            return
        job.result, job.reason, job.message = result, reason, message
        self._set_phase(job, "Succeeded" if result == "Complete" else "Failed")
        status = {"conditions": [{"type": result, "status": "True", "reason": reason, "message": message,
                                  "lastTransitionTime": _now()}]}
        job.obj["status"] = status
        errs = validate_status(job.obj)
        assert not errs, errs  # the fake's own status must fit the CRD

    def _env(self, job: _Job) -> dict | str:
        ns = job.obj["metadata"]["namespace"]
        env = dict(self.pod_env)
        for e in job.obj["spec"].get("trainer", {}).get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                secret = self.secrets.get((ns, ref["name"]))
                if secret is None or ref["key"] not in secret:
                    if ref.get("optional"):
                        continue
                    return f"CreateContainerConfigError: secret {ref['name']!r} (key {ref['key']!r}) not found"
                env[e["name"]] = secret[ref["key"]]
        return env

    def _start_nodes(self, job: _Job) -> None:
        import tempfile

        from prepline.train.nodes import run_nodes
        from prepline.train.realise import realise_trainjob

        env = self._env(job)
        if isinstance(env, str):
            self._finish(job, "Failed", "FailedJobs", env)
            return
        name = job.obj["metadata"]["name"]
        rt = self.cluster_runtimes.get(job.obj["spec"]["runtimeRef"]["name"])
        nodes = realise_trainjob(job.obj, rt)
        spawn = self.spawn_for(job.obj)
        log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="fake-k8s-nodes-")) / name
        self._set_phase(job, "Running")

        def started(procs: dict) -> None:
            job.procs = procs
            self.processes.extend(procs.values())

        def run() -> None:
            stop = threading.Event()

            def tail() -> None:  # node 0's log is the pod log
                path = log_dir / f"{nodes[0].pod}.log"
                while True:
                    ended = stop.wait(0.3)
                    if path.exists():
                        text = path.read_text(errors="replace")
                        with job.lock:
                            job.log = text
                    if ended:
                        return

            threading.Thread(target=tail, daemon=True).start()
            res = run_nodes(nodes, spawn, log_dir, base_env=self.node_base_env, extra_env=env, timeout=86400, on_start=started)
            stop.set()
            time.sleep(0.4)
            self.results[name] = res
            with self._lock:
                if res.condition == "Complete":
                    self._finish(job, "Complete", "JobSetCompleted", "jobset completed successfully")
                else:
                    self._finish(job, "Failed", "FailedJobs", "jobset failed due to one or more job failures, first failed job: "
                                 f"{name}-node-0 ({res.message})")

        threading.Thread(target=run, daemon=True).start()

    def _start(self, job: _Job) -> None:
        if self.mode == "nodes":
            return self._start_nodes(job)
        t = job.obj["spec"].get("trainer", {})
        cmd = list(t.get("command") or []) + list(t.get("args") or [])
        if cmd and cmd[0] == "python":
            cmd[0] = sys.executable
        env = self._env(job)
        if isinstance(env, str):
            self._finish(job, "Failed", "JobSetFailed", env)
            return
        job.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                    start_new_session=True)
        self.processes.append(job.proc)
        self._set_phase(job, "Running")

        def pump() -> None:
            assert job.proc is not None and job.proc.stdout is not None
            for line in job.proc.stdout:
                with job.lock:
                    job.log += line
            rc = job.proc.wait()
            with self._lock:
                if job.result is None:
                    if rc == 0:
                        self._finish(job, "Complete", "JobSetCompleted", "jobset completed successfully")
                    else:
                        self._finish(job, "Failed", "JobSetFailed", f"jobset failed: container node exited with code {rc}")

        threading.Thread(target=pump, daemon=True).start()

    def _kill(self, job: _Job) -> None:
        if job.procs:
            from prepline.train.nodes import kill_tree

            for p in job.procs.values():
                if p.poll() is None:
                    kill_tree(p.pid)
        if job.proc is not None and job.proc.poll() is None:
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.proc.wait()

    def _deadline(self, job: _Job) -> None:
        d = job.obj["spec"].get("activeDeadlineSeconds")
        if d and job.result is None and time.monotonic() - job.created > d:
            self._kill(job)
            self._finish(job, "Failed", "DeadlineExceeded", f"TrainJob exceeded its activeDeadlineSeconds ({d}s)")

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for job in list(self.jobs.values()):
                    self._deadline(job)

    def _advance(self, job: _Job) -> None:
        """A GET of the TrainJob: the script moves on (mode 'script')."""
        self._deadline(job)
        if self.mode != "script" or job.result:
            return
        job.polls += 1
        b = job.behaviour
        if job.polls >= 2:
            self._set_phase(job, "Running")
            job.log = b.get("log", "")
        if b.get("result") == "hang" or job.polls < b.get("polls", 2):
            return
        if b["result"] == "complete":
            self._finish(job, "Complete", "JobSetCompleted", "jobset completed successfully")
        else:
            self._finish(job, "Failed", "JobSetFailed", b.get("message", "jobset failed: container node exited with code 1"))

    # HTTP
    def _handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, body, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                fake.requests[-1].status = status

            def _status(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                                  "reason": reason, "code": code, **({"details": details} if details else {})})

            def _handle(self, method: str) -> None:
                u = urlsplit(self.path)
                q = {k: v[-1] for k, v in parse_qs(u.query).items()}
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                fake.requests.append(Recorded(method, u.path, q, body))
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                parts = [unquote(p) for p in u.path.strip("/").split("/")]
                with fake._lock:
                    return self._route(method, parts, q, body)

            def _route(self, method, parts, q, body):
                g = GROUP_PATH.strip("/").split("/")
                if parts[:3] == g and len(parts) >= 4 and parts[3] == "clustertrainingruntimes" and method == "GET":
                    if len(parts) == 4:
                        return self._send(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntimeList",
                                                "metadata": {}, "items": list(fake.cluster_runtimes.values())})
                    rt = fake.cluster_runtimes.get(parts[4])
                    if rt is None:
                        return self._status(404, "NotFound", f'clustertrainingruntimes.trainer.kubeflow.org "{parts[4]}" not found')
                    return self._send(200, rt)
                if parts[:3] == g and len(parts) >= 6 and parts[3] == "namespaces":
                    ns, plural = parts[4], parts[5]
                    name = parts[6] if len(parts) > 6 else None
                    if plural == "trainingruntimes" and method == "GET":
                        if name is None:
                            return self._send(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntimeList",
                                                    "metadata": {}, "items": [v for (n_, _), v in fake.runtimes.items() if n_ == ns]})
                        rt = fake.runtimes.get((ns, name))
                        if rt is None:
                            return self._status(404, "NotFound", f'trainingruntimes.trainer.kubeflow.org "{name}" not found')
                        return self._send(200, rt)
                    if plural == "trainjobs":
                        return self._trainjobs(method, ns, name, q, body)
                if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[2] == "namespaces":
                    ns, kind = parts[3], parts[4]
                    if kind == "pods" and method == "GET":
                        if len(parts) == 5:
                            sel = _selector(q.get("labelSelector", ""))
                            items = [p for (n_, _), j in fake.jobs.items() if n_ == ns for p in j.pods if sel(p["metadata"]["labels"])]
                            return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                        if len(parts) == 7 and parts[6] == "log":
                            return self._log(ns, parts[5], q)
                    if kind in ("configmaps", "secrets"):
                        return self._status(404, "NotFound", f'{kind} "{parts[5] if len(parts) > 5 else ""}" not found')
                return self._status(404, "NotFound", "the server could not find the requested resource")

            def _trainjobs(self, method, ns, name, q, body):
                key = (ns, name)
                if method == "POST" and name is None:
                    errors = validate_trainjob(body)
                    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) and body["metadata"].get("namespace") not in (None, ns):
                        errors.append("metadata.namespace: the namespace of the object does not match the namespace of the request")
                    if errors:
                        return self._status(422, "Invalid", f'TrainJob.trainer.kubeflow.org "{(body or {}).get("metadata", {}).get("name")}" '
                                            f"is invalid: {'; '.join(errors)}", {"causes": [{"message": e} for e in errors]})
                    jname = body["metadata"]["name"]
                    denied = fake._webhook(ns, body)
                    if denied:
                        return self._status(422, "Invalid", f'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the '
                                            f'request: {denied}', {"causes": [{"message": denied}]})
                    if (ns, jname) in fake.jobs:
                        return self._status(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{jname}" already exists')
                    obj = copy.deepcopy(body)
                    _apply_defaults(obj)
                    obj["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": _now(),
                                            "resourceVersion": str(len(fake.requests)), "generation": 1})
                    job = _Job(obj, time.monotonic(), dict(fake.behaviour))
                    nodes = obj["spec"].get("trainer", {}).get("numNodes") or 1
                    job.pods = [fake._pod(job, i) for i in range(nodes)]
                    fake.jobs[(ns, jname)] = job
                    fake.created.append(copy.deepcopy(obj))
                    if fake.mode in ("run", "nodes"):
                        fake._start(job)
                    return self._send(201, obj)
                if method == "GET" and name is None:
                    sel = _selector(q.get("labelSelector", ""))
                    items = [j.obj for (n_, _), j in fake.jobs.items() if n_ == ns and sel(j.obj["metadata"].get("labels"))]
                    return self._send(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJobList", "metadata": {}, "items": items})
                job = fake.jobs.get(key)
                if job is None:
                    return self._status(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
                if method == "GET":
                    fake._advance(job)
                    return self._send(200, job.obj)
                if method == "DELETE":
                    fake._kill(job)
                    del fake.jobs[key]
                    fake.deleted.append(name)
                    return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                            "details": {"name": name, "group": "trainer.kubeflow.org", "kind": "trainjobs", "uid": job.obj["metadata"]["uid"]}})
                return self._status(405, "MethodNotAllowed", f"{method} is not supported here")

            def _log(self, ns, pod, q):
                for (n_, _), job in fake.jobs.items():
                    for p in job.pods:
                        if n_ == ns and p["metadata"]["name"] == pod:
                            if q.get("container", "node") != "node":
                                return self._status(400, "BadRequest", f"container {q.get('container')} is not valid for pod {pod}")
                            if p["status"]["phase"] == "Pending":
                                return self._status(400, "BadRequest", f'container "node" in pod "{pod}" is waiting to start: ContainerCreating')
                            with job.lock:
                                text = job.log if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0" else ""
                            return self._send(200, text, "text/plain")
                return self._status(404, "NotFound", f'pods "{pod}" not found')

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_DELETE(self):
                self._handle("DELETE")

            def do_PUT(self):
                self._handle("PUT")

            def do_PATCH(self):
                self._handle("PATCH")

        return H
