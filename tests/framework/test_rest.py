"""The one HTTP retry policy and error-message reading, against a real local HTTP server."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from prepline.rest import retry_policy, server_message


class Flaky:
    """Answers ``fail`` times 503 (with Retry-After: 0), then 200; counts requests per method."""

    def __init__(self, fail: int):
        self.fail, self.seen = fail, {"GET": 0, "POST": 0}
        flaky = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self):
                flaky.seen[self.command] += 1
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                code = 503 if flaky.seen[self.command] <= flaky.fail else 200
                body = b'{"message": "not ready"}' if code == 503 else b"{}"
                self.send_response(code)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/x"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky():
    f = Flaky(fail=2)
    yield f
    f.close()


def test_gets_are_retried_through_transient_answers_posts_are_not(flaky):
    pool = urllib3.PoolManager(retries=retry_policy(3, backoff=0.01))
    assert pool.request("GET", flaky.url).status == 200 and flaky.seen["GET"] == 3
    r = pool.request("POST", flaky.url, body=b"{}")  # may have taken effect: never sent twice
    assert r.status == 503 and flaky.seen["POST"] == 1
    assert server_message(r.data, r.status) == "not ready"


def test_the_last_answer_is_returned_after_the_last_try(flaky):
    r = urllib3.PoolManager(retries=retry_policy(1, backoff=0.01)).request("GET", flaky.url)
    assert r.status == 503 and flaky.seen["GET"] == 2  # one try, one retry


def test_a_refused_connection_is_retried_for_every_method(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    tries = []
    orig = urllib3.Retry.increment
    monkeypatch.setattr(urllib3.Retry, "increment", lambda self, *a, **k: tries.append(k.get("error")) or orig(self, *a, **k))
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        urllib3.PoolManager(retries=retry_policy(2, backoff=0.01, idempotent=False)).request("POST", f"http://127.0.0.1:{port}/", body=b"{}")
    assert len(tries) == 3 and all(isinstance(e, urllib3.exceptions.NewConnectionError) for e in tries)  # 2 retries, then given up


def test_server_message_reads_every_kind_of_answer():
    assert server_message(b'{"kind": "Status", "message": "rayclusters \\"x\\" already exists", "code": 409}') == 'rayclusters "x" already exists'
    assert server_message('{"error_message": "bad filter", "code": 3}') == "bad filter"
    assert server_message(b"Traceback (most recent call last):\n  File x\nValueError: Job exists\n") == "ValueError: Job exists"
    assert server_message(b"<html><body>Sign in</body></html>") == "an HTML page (a login page or a proxy?)"
    assert server_message(b"", 502) == "HTTP 502" and server_message(None) == ""
    assert server_message("x" * 5000, limit=100) == "x" * 100
    assert server_message(b"[1, 2]") == "[1, 2]"
