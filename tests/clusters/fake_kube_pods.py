"""The fake Kubernetes API's pods for tests/clusters/fake_kuberay.py: the head pod of each fake
RayCluster as the kubelet and the scheduler leave it (waiting reasons, lastState, PodScheduled), read
with ``GET /api/v1/namespaces/{ns}/pods?labelSelector=ray.io/cluster=<name>`` on a port of its own:
the KubeRay API server does not serve pods (``apiserversdk/proxy.go`` proxies ray.io resources and
their events only)."""

from __future__ import annotations

import json
import re
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
    """Mixed into FakeKubeRay (which has ``clusters``, ``lock``, ``requests``, ``pods_forbidden``,
    ``_failure`` and ``_state``)."""

    def _pods(self, ns: str, name: str) -> list[dict]:
        """The head pod as the kubelet / scheduler leave it (only while the cluster exists)."""
        c = self.clusters.get((ns, name))
        if c is None or c.polls < 1:
            return []
        f, state = self._failure(name), self._state(c, name)
        status: dict = {"phase": "Running" if state == "ready" else "Pending", "conditions": []}
        cs = {"name": "ray-head", "ready": state == "ready", "restartCount": 0, "image": "rayproject/ray", "imageID": "",
              "state": {"running": {"startedAt": c.created}} if state == "ready" else {"waiting": {"reason": "ContainerCreating"}}}
        if f == "broken":
            cs["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "does-not-exist:1.0"'}}
        elif f == "oom":
            cs.update(restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
                      lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}})
        if f == "unsched":
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available"}]
        else:
            status["containerStatuses"] = [cs]
        if f == "quota":
            return []  # the pod was never created
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-head-x7k2p", "namespace": ns,
                 "labels": {"ray.io/cluster": name, "ray.io/node-type": "head"}}, "status": status}]

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
