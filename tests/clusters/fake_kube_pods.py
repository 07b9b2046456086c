"""The fake Kubernetes API's pods for tests/clusters/fake_kuberay.py: the head pod of each fake
RayCluster as the kubelet and the scheduler leave it (waiting reasons, lastState, PodScheduled), read
with ``GET /api/v1/namespaces/{ns}/pods?labelSelector=ray.io/cluster=<name>`` on a port of its own:
the KubeRay API server does not serve pods (``apiserversdk/proxy.go`` proxies ray.io resources and
their events only).

**Secrets are namespaced** (``secrets``: ``{(namespace, name): {key: value}}``): the head container's
environment is resolved the way the kubelet does (``pkg/kubelet/kubelet_pods.go``
``makeEnvironmentVariables``), from the pod's *own* namespace only: ``envFrom.secretRef`` and
``env.valueFrom.secretKeyRef`` of a missing secret (or key) are skipped when ``optional``, else the
container never starts (waiting reason ``CreateContainerConfigError``, message ``secret "<name>" not
found`` / ``couldn't find key <key> in Secret <ns>/<name>``); envFrom keys that are not valid variable
names are skipped. ``pod_env(ns, name)`` is what the Ray processes (and so the Ray jobs) see."""

from __future__ import annotations

import json
import re

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")  # validation.IsEnvVarName
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class KubeRequest:
    method: str
    path: str
    query: dict
    headers: dict
    body: object = None
    status: int = 0


class FakePods:
    """Mixed into FakeKubeRay (which has ``clusters``, ``secrets``, ``lock``, ``requests``, ``pods_forbidden``,
    ``_failure`` and ``_state``)."""

    @staticmethod
    def _head_container(c) -> tuple[list, list]:
        """(env, envFrom) of the head container, V2 (the pod template) or V1 (``environment``)."""
        if c.version == "v2":
            ct = ((c.obj.get("spec") or {}).get("headGroupSpec") or {}).get("template", {}).get("spec", {}).get("containers") or [{}]
            return ct[0].get("env") or [], ct[0].get("envFrom") or []
        environment = ((c.obj.get("clusterSpec") or {}).get("headGroupSpec") or {}).get("environment") or {}
        env = [{"name": k, "value": v} for k, v in (environment.get("values") or {}).items()]
        env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": v["name"], "key": v["key"]}}}
                for k, v in (environment.get("valuesFrom") or {}).items() if v.get("source") == "SECRET"]
        return env, []

    def _resolve_env(self, ns: str, c) -> tuple[dict, str]:
        """(the environment, '') or ({}, the kubelet's error) for the head container in namespace ``ns``."""
        return self.container_env(ns, *self._head_container(c))

    def container_env(self, ns: str, env_list: list, env_from: list) -> tuple[dict, str]:
        """(the environment, '') or ({}, the kubelet's error) of a container with ``env`` and ``envFrom``
        in a pod of namespace ``ns``: secrets of that namespace only."""
        out: dict[str, str] = {}
        for src in env_from or []:
            ref = src.get("secretRef")
            if not ref:
                continue
            secret = self.secrets.get((ns, ref["name"]))
            if secret is None:
                if ref.get("optional"):
                    continue
                return {}, f'secret "{ref["name"]}" not found'
            for k, v in secret.items():
                if _ENV_NAME.match(src.get("prefix", "") + k):
                    out[src.get("prefix", "") + k] = v
        for e in env_list or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                out[e["name"]] = e.get("value", "")
                continue
            secret = self.secrets.get((ns, ref["name"]))
            if secret is None or ref["key"] not in secret:
                if ref.get("optional"):
                    continue
                return {}, (f'secret "{ref["name"]}" not found' if secret is None
                            else f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}")
            out[e["name"]] = secret[ref["key"]]
        return out, ""

    def pod_env(self, ns: str, name: str) -> dict:
        """The environment the cluster's Ray processes run with ({} when the container cannot start)."""
        with self.lock:
            c = self.clusters.get((ns, name))
            return self._resolve_env(ns, c)[0] if c else {}

    def _config_error(self, ns: str, name: str) -> str:
        c = self.clusters.get((ns, name))
        return self._resolve_env(ns, c)[1] if c else ""

    def _pods(self, ns: str, name: str) -> list[dict]:
        """The head pod as the kubelet / scheduler leave it (only while the cluster exists)."""
        c = self.clusters.get((ns, name))
        if c is None or c.polls < 1:
            return []
        f, state = self._failure(name, ns), self._state(c, name)
        status: dict = {"phase": "Running" if state == "ready" else "Pending", "conditions": []}
        cs = {"name": "ray-head", "ready": state == "ready", "restartCount": 0, "image": "rayproject/ray", "imageID": "",
              "state": {"running": {"startedAt": c.created}} if state == "ready" else {"waiting": {"reason": "ContainerCreating"}}}
        if f == "broken":
            cs["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "does-not-exist:1.0"'}}
        elif f == "config":
            cs["state"] = {"waiting": {"reason": "CreateContainerConfigError", "message": self._config_error(ns, name)}}
        elif f == "crash":
            cs.update(restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
                      lastState={"terminated": {"reason": "Error", "exitCode": 1}})
        elif f == "oom":
            cs.update(restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
                      lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}})
        unplaced = self.unplaced(c)
        head_name = f"{name}-head-x7k2p"
        if f == "unsched":
            msg = unplaced.get(head_name) or ("0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
                                              "3 No preemption victims found for incoming pod.")
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]
        else:
            status["containerStatuses"] = [cs]
        if f == "quota":
            return []  # the pod was never created
        if unplaced and not f and c.polls > self.ready_after:  # the head runs; some worker pod waits for a node
            status["phase"] = "Running"
            cs.update(ready=True, state={"running": {"startedAt": c.created}})
        out = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": head_name, "namespace": ns,
                "labels": {"ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": "headgroup"}}, "status": status}]
        for p in c.pods[1:]:  # the worker pods, where the scheduler placed them (fake_scheduler)
            labels = {"ray.io/cluster": name, "ray.io/node-type": "worker", "ray.io/group": p.group}
            if p.name in unplaced:
                st = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                          "message": unplaced[p.name]}]}
            else:
                up = state == "ready"
                st = {"phase": "Running" if up else "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                      "containerStatuses": [{"name": "ray-worker", "ready": up, "restartCount": 0, "image": "rayproject/ray", "imageID": "",
                                             "state": {"running": {"startedAt": c.created}} if up else {"waiting": {"reason": "ContainerCreating"}}}]}
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p.name, "namespace": ns, "labels": labels}, "status": st})
        return out

    def _serve_kube(self, h: BaseHTTPRequestHandler) -> None:
        """The fake Kubernetes API: pods of the clusters, read-only."""
        parts = urlsplit(h.path)
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.requests.append(KubeRequest(h.command, "kube:" + parts.path, q, {k.lower(): v for k, v in h.headers.items()}, None))
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods$", unquote(parts.path))
        if h.command != "GET" or not m:
            code, body = 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                               "message": "the server could not find the requested resource"}
        elif self.pods_forbidden:
            code, body = 403, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                               "message": f'pods is forbidden: User "system:serviceaccount:{m.group(1)}:default-editor" cannot list '
                                          f'resource "pods" in API group "" in the namespace "{m.group(1)}"'}
        else:
            sel = dict(t.split("=", 1) for t in q.get("labelSelector", "").split(",") if "=" in t)
            with self.lock:
                pods = [p for (ns, n) in list(self.clusters) if ns == m.group(1) for p in self._pods(ns, n)]
            pods = [p for p in pods if all(p["metadata"]["labels"].get(k) == v for k, v in sel.items())]
            code, body = 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods}
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
