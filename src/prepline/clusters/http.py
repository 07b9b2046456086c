"""The one small JSON-over-HTTP client the cluster code uses (the KubeRay API server, the
Kubernetes API and Ray's job REST API on a head): ``urllib3`` (always installed), bounded
retries with backoff, an optional bearer token (re-read from a file on every call, so rotated
service-account tokens keep working), and errors that carry the server's own message.

Error bodies are parsed defensively: the KubeRay V2 API server's proxy may cut a non-2xx body
short (its per-request context is cancelled when the handler returns: ray-project/kuberay issue
#4060), so a truncated Kubernetes ``Status`` still yields its ``message``, and an empty body says so.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from pathlib import Path
from urllib.parse import urlencode

import urllib3

from prepline.clusters.base import ClusterError
from prepline.errors import ConfigError

log = logging.getLogger("prepline.clusters")

RETRY_STATUS = (429, 500, 502, 503, 504)


class ApiError(ClusterError):
    """An HTTP call failed. ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, fix: str | None = None, status: int | None = None, body: str = ""):
        super().__init__(message, fix)
        self.status = status
        self.body = body


class Unavailable(ApiError):
    """No usable answer after the bounded retries (connection errors, timeouts, 429, 5xx)."""


class AuthError(ApiError):
    """401 / 403."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: it already exists."""


class RequestError(ApiError):
    """Another 4xx (or a non-retried 5xx): the server rejected the request (its message says why)."""


_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)("?)')


def server_message(status: int, raw: bytes) -> str:
    """The useful part of an error answer: a Kubernetes ``Status`` / gRPC-gateway ``message``, even
    from a body cut short; Ray's dashboard answers with a plain traceback: its last line."""
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return f"HTTP {status} with an empty body (a proxy may have cut the answer short)"
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("message"):
            return str(data["message"])
    except ValueError:
        m = _MESSAGE.search(text)
        if m and text.startswith("{"):  # a JSON body cut short: keep what arrived of its message
            raw_msg = m.group(1) if m.group(2) else re.sub(r"\\(u[0-9a-fA-F]{0,3})?$", "", m.group(1))
            try:
                msg = json.loads(f'"{raw_msg}"')
            except ValueError:
                msg = raw_msg
            return msg + ("" if m.group(2) else " […answer cut short]")
        if text.startswith("{"):
            return f"{text[:300]} […answer cut short, no message]"
    if "Traceback (most recent call last)" in text:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else text
    return text[:2000]


#: The KubeRay API server chart's security proxy (``helm-chart/kuberay-apiserver/values.yaml``
#: ``security:``, on by default from v1.3.0 to HEAD) sits in front of every path and answers 401 with
#: the plain text ``Unauthorized`` (``experimental/pkg/httpproxy/support.go``) unless the
#: Authorization header equals its SECURITY_TOKEN byte for byte (``token_auth.go``): a ``Bearer``
#: token never does. kube-apiserver's own 401 (through the V2 proxy) is a JSON Status.
SECURITY_PROXY_FIX = ("the KubeRay API server's security proxy refused the request (the chart's default; it compares the whole "
                      "Authorization header with its SECURITY_TOKEN, so a Bearer token never matches): install the API server "
                      "with `helm install kuberay-apiserver kuberay/kuberay-apiserver --set security=null` (deploy/README.md)")


def from_security_proxy(status: int, body: str) -> bool:
    """A 401 from the API server chart's security proxy, not from Kubernetes."""
    return status == 401 and body.strip() == "Unauthorized"


def _read_body(resp) -> bytes:
    """The body of an answer. A non-2xx answer whose stream breaks off (the KubeRay V2 proxy closes the
    connection short of the ``Content-Length`` it sent: ``apiserversdk/proxy.go`` cancels the round
    trip's context on return, kuberay #4060) keeps its status and what arrived of its body; a broken 2xx
    answer raises (a connection error: retried)."""
    chunks: list[bytes] = []
    try:
        while True:
            chunk = resp.read1(65536)  # one read at a time: what arrived is kept when the next one fails
            if not chunk:
                break
            chunks.append(chunk)
    except urllib3.exceptions.HTTPError:
        resp.close()
        if resp.status < 400:
            raise
        log.debug("HTTP %s answer broke off after %d bytes", resp.status, sum(map(len, chunks)))
    else:
        resp.release_conn()
    return b"".join(chunks)


class JsonHttp:
    """Calls to one base URL. ``describe`` names the server in messages (e.g. "KubeRay API server")."""

    describe = "server"
    user_agent = "prepline"

    def __init__(self, base: str, token: str | None = None, token_file: str | None = None, timeout: float = 30.0,
                 connect_timeout: float = 5.0, retries: int = 4, backoff: float = 0.5, backoff_max: float = 8.0,
                 ca_cert: str | None = None, headers: dict | None = None):
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"{self.describe} URL '{base}' is missing or not http(s)", "give an http:// or https:// URL")
        if retries < 0 or backoff < 0 or timeout <= 0 or connect_timeout <= 0:
            raise ConfigError("retries/backoff must be >= 0 and timeouts > 0", "e.g. retries=4, backoff=0.5, timeout=30")
        self.server = base.rstrip("/")
        self._token = token or None
        self._token_file = None if self._token else (token_file or None)
        if self._token_file and not Path(self._token_file).is_file():
            raise ConfigError(f"token file '{self._token_file}' does not exist", "mount the service-account token there, or pass a token")
        self.retries, self.backoff, self.backoff_max = retries, backoff, backoff_max
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=timeout)
        self._headers = dict(headers or {})
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=8, **({"ca_certs": ca_cert} if ca_cert else {}))

    def __repr__(self) -> str:  # never show the token
        return f"{type(self).__name__}({self.server!r}, auth={'yes' if self.auth_headers() else 'no'})"

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header (or nothing), e.g. for another client of the same server."""
        token = self._token
        if not token and self._token_file:
            try:
                token = Path(self._token_file).read_text().strip()
            except OSError as e:
                raise AuthError(f"cannot read token file '{self._token_file}': {e}", "check the mounted token") from e
        if token:
            return {"Authorization": f"Bearer {token}"}
        return {k: v for k, v in self._headers.items() if k.lower() == "authorization"}

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        base = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
        if retry_after:
            try:
                base = min(self.backoff_max, max(base, float(retry_after)))
            except ValueError:
                pass
        return base * random.uniform(0.8, 1.2)

    def _retryable(self, status: int, raw: bytes) -> bool:
        return status in RETRY_STATUS

    def request(self, method: str, path: str, body: dict | None = None, params: dict | None = None, retries: int | None = None):
        """One call with the retry policy; ``retries`` overrides the client's (0: a single try).
        Returns the decoded JSON answer (or its text)."""
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        attempts = (self.retries if retries is None else retries) + 1
        started, last, retry_after, last_status, last_body = time.monotonic(), "", None, None, ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self._delay(attempt, retry_after))
            headers = {"Accept": "application/json", "User-Agent": self.user_agent, **self._headers, **self.auth_headers()}
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                resp = self._pool.request(method, url, body=data, headers=headers, timeout=self._timeout, retries=False, redirect=False,
                                          preload_content=False)
                raw = _read_body(resp)
            except urllib3.exceptions.HTTPError as e:
                last = str(getattr(e, "reason", None) or e).split(">: ", 1)[-1]
                last, retry_after, last_status = f"{type(e).__name__}: {last}", None, None
                self._log_retry(method, path, last, attempt, attempts)
                continue
            if resp.status >= 400 and self._retryable(resp.status, raw):
                last_status, last_body = resp.status, raw.decode("utf-8", "replace")
                last = f"HTTP {resp.status}: {server_message(resp.status, raw)}"
                retry_after = resp.headers.get("Retry-After")
                self._log_retry(method, path, last, attempt, attempts)
                continue
            if resp.status >= 400:
                raise self.error(method, path, resp.status, raw)
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError:
                return raw.decode("utf-8", "replace")
        waited = time.monotonic() - started
        raise Unavailable(f"{self.describe} {self.server}: {method} {path} failed after {attempts} attempt(s) in {waited:.1f}s: {last}",
                          self.unavailable_fix(path), status=last_status, body=last_body)

    def _log_retry(self, method: str, path: str, last: str, attempt: int, attempts: int) -> None:
        level = logging.WARNING if attempt + 1 < attempts else logging.DEBUG  # the last one raises instead
        log.log(level, "%s %s %s: %s (attempt %d/%d)", self.describe, method, path, last, attempt + 1, attempts)

    def unavailable_fix(self, path: str) -> str:
        return f"check that the {self.describe} at {self.server} runs and is reachable"

    def error(self, method: str, path: str, status: int, raw: bytes) -> ApiError:
        """The exception for a non-retried error answer (subclasses add their fixes)."""
        text = f"{self.describe} {self.server}: {method} {path} -> HTTP {status}: {server_message(status, raw)}"
        body = raw.decode("utf-8", "replace")
        fix = self.fix_for(method, path, status, body)
        kind = {401: AuthError, 403: AuthError, 404: NotFound, 409: Conflict}.get(status, RequestError)
        return kind(text, fix, status, body)

    def fix_for(self, method: str, path: str, status: int, body: str) -> str:
        if status == 401:
            return ("the token was rejected" if self.auth_headers() else "no token was sent") + ": pass a valid token"
        if status == 403:
            return "the identity lacks permission: grant it the RBAC in deploy/ (or use another token)"
        if status == 404:
            return "check the name and the namespace"
        if status == 409:
            return "the object exists already: reuse it or delete it first"
        return "the server rejected the request: fix the field or argument named in the message"
