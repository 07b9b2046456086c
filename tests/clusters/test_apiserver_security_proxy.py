"""The KubeRay API server chart's security proxy (issue 24 item 7).

``helm-chart/kuberay-apiserver/values.yaml`` turns ``security:`` on by default (v1.3.0 to HEAD): a
proxy container in front of the API server on every path (``SECURITY_PREFIX: "/"``) that lets a
request through only when its Authorization header equals ``SECURITY_TOKEN`` byte for byte
(``experimental/pkg/httpproxy/token_auth.go``), and otherwise answers 401 with the plain text
``Unauthorized`` (``support.go``). prepline sends ``Authorization: Bearer <token>``, which never
matches: the documented install turns the proxy off (``--set security=null``, the chart README's
"Without security proxy"), and a 401 of that proxy says so.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prepline.clusters.http import AuthError
from prepline.clusters.kuberay import KubeRayClient
from prepline.clusters.ray_jobs import RayJobClient

ROOT = Path(__file__).resolve().parents[2]


class _SecurityProxy(BaseHTTPRequestHandler):
    """token_auth.go's AuthFunc: the whole Authorization header against the token ('' when the
    chart's SECURITY_TOKEN is left unset), then the upstream (here: an empty RayCluster list)."""

    token = "12345"

    def _answer(self):
        if self.headers.get("Authorization", "") != self.token:
            body, status, ctype = b"Unauthorized\n", 401, "text/plain; charset=utf-8"
        else:
            body, status, ctype = json.dumps({"items": []}).encode(), 200, "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *a):
        pass


class _KubeApiserver401(_SecurityProxy):
    """kube-apiserver's own 401, through the V2 proxy: a JSON Status."""

    def _answer(self):
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized",
                           "code": 401}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture
def serve():
    servers = []

    def start(handler):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_a_bearer_token_never_passes_the_security_proxy_and_the_error_says_to_turn_it_off(serve):
    url = serve(_SecurityProxy)
    client = KubeRayClient(url, token="12345", retries=0)  # even the proxy's own token: prepline sends "Bearer 12345"
    with pytest.raises(AuthError) as e:
        client.request("GET", "/apis/ray.io/v1/namespaces/team-a/rayclusters")
    assert e.value.status == 401 and "--set security=null" in e.value.fix
    jobs = RayJobClient(f"{url}/api/v1/namespaces/team-a/services/c-head-svc:8265/proxy", headers={"Authorization": "Bearer 12345"},
                        retries=0)
    with pytest.raises(AuthError) as e:
        jobs.version(retries=0)
    assert "--set security=null" in e.value.fix


def test_a_kubernetes_401_keeps_the_token_fix(serve):
    client = KubeRayClient(serve(_KubeApiserver401), token="t", retries=0)
    with pytest.raises(AuthError) as e:
        client.request("GET", "/apis/ray.io/v1/namespaces/team-a/rayclusters")
    assert "security=null" not in e.value.fix and "token" in e.value.fix


def test_every_documented_apiserver_install_turns_the_security_proxy_off():
    lines = []
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]:
        lines += [(p.name, line) for line in p.read_text().splitlines() if re.search(r"helm (install|upgrade).*kuberay-apiserver", line)]
    assert lines, "no documented install of the KubeRay API server"
    for name, line in lines:
        assert "--set security=null" in line, f"{name}: {line}"
