"""Ray jobs on a head: submit, status, logs, stop, and following a job's log as it grows.

:class:`RayJobClient` speaks Ray's job REST API (``dashboard/modules/job/job_head.py`` of Ray
2.60: ``POST /api/jobs/``, ``GET /api/jobs/{id}``, ``GET /api/jobs/{id}/logs``,
``POST /api/jobs/{id}/stop``, ``GET /api/version``) with our own small HTTP client, so the
launcher image needs no Ray. The address is the head's dashboard: in a cluster
``http://<cluster>-head-svc.<namespace>.svc.cluster.local:8265`` (what the KubeRay V1 API server
itself uses), a local head's ``http://127.0.0.1:<port>``, or the KubeRay API server's service proxy
from outside the cluster.

Following a job (:meth:`JobClient.follow`): Ray's only incremental log API is the websocket
``GET /api/jobs/{id}/logs/tail`` (the dashboard streams new lines and closes when the job ends);
``/logs`` has no offset and always answers the whole log. So ``follow`` reads the websocket
(``websocket-client``, which the ``kubernetes`` package brings along with kfp) and checks the job's
status every few seconds; if the websocket cannot be opened it polls the status and re-reads
``/logs`` at growing intervals (up to 30 s), printing only what is new.

:class:`V1JobClient` is the same interface over the deprecated KubeRay V1 job-submission API.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TextIO
from urllib.parse import quote

from prepline.clusters.base import TERMINAL, JobInfo
from prepline.clusters.http import SECURITY_PROXY_FIX, ApiError, AuthError, Conflict, JsonHttp, RequestError, from_security_proxy
from prepline.errors import ConfigError

log = logging.getLogger("prepline.clusters")

#: a busy or just-started dashboard answers 500 with this text: retried (job_head.py submit_job)
NO_AGENT = "No available agent"
MAX_LOG_INTERVAL = 30.0


def _job_fields(entrypoint: str, runtime_env, entrypoint_num_cpus) -> None:
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise ConfigError("the job entrypoint is empty", "give the command to run, e.g. 'python -m prepline.cli run ...'")
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise ConfigError("runtime_env must be a mapping", 'e.g. {"env_vars": {"HF_HUB_OFFLINE": "1"}}')
    if entrypoint_num_cpus is not None and (not isinstance(entrypoint_num_cpus, (int, float)) or entrypoint_num_cpus < 0):
        raise ConfigError(f"entrypoint_num_cpus = {entrypoint_num_cpus!r} must be a non-negative number", "e.g. 1 or 0.5")


def ray_job_body(entrypoint: str, submission_id: str, runtime_env: dict | None = None,
                 entrypoint_num_cpus: float | None = None, metadata: dict | None = None) -> dict:
    """Body of ``POST /api/jobs/`` (``JobSubmitRequest`` of Ray's ``pydantic_models``/``common.py``)."""
    _job_fields(entrypoint, runtime_env, entrypoint_num_cpus)
    body: dict = {"entrypoint": entrypoint, "submission_id": submission_id}
    if runtime_env:
        body["runtime_env"] = runtime_env
    if entrypoint_num_cpus is not None:
        body["entrypoint_num_cpus"] = entrypoint_num_cpus
    if metadata:
        body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    return body


def job_submission_v1_body(entrypoint: str, submission_id: str, runtime_env: dict | None = None,
                           entrypoint_num_cpus: float | None = None, metadata: dict | None = None) -> dict:
    """Body of V1 ``POST /apis/v1/namespaces/{ns}/jobsubmissions/{cluster}``: the runtime env is a YAML string there."""
    import yaml

    _job_fields(entrypoint, runtime_env, entrypoint_num_cpus)
    body: dict = {"entrypoint": entrypoint, "submissionId": submission_id}
    if runtime_env:
        body["runtimeEnv"] = yaml.safe_dump(runtime_env, sort_keys=True)
    if entrypoint_num_cpus is not None:
        body["entrypointNumCpus"] = float(entrypoint_num_cpus)
    if metadata:
        body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    return body


class JobClient:
    """Submit, read and stop Ray jobs of one cluster; :meth:`follow` streams a job's log."""

    where = "the Ray head"

    def submit(self, entrypoint: str, submission_id: str | None = None, runtime_env: dict | None = None,
               entrypoint_num_cpus: float | None = None) -> str:
        """Submit; returns the submission id. Safe to retry: a client-side id is always sent, and
        after an error the job is read back by that id: our own job (same entrypoint) already there
        is a success. (Not the error text: Ray answers a duplicate with a 500 traceback, and the
        KubeRay V2 proxy may cut error bodies short.)"""
        sid = submission_id or f"prepline-{uuid.uuid4().hex[:16]}"
        try:
            return self._submit(entrypoint, sid, runtime_env, entrypoint_num_cpus) or sid
        except AuthError:
            raise
        except ApiError as e:
            try:
                existing = self._raw_info(sid)
            except ApiError:
                raise e from None
            if existing.get("entrypoint") != entrypoint:
                raise Conflict(f"job '{sid}' exists on {self.where} with another entrypoint", "use a new submission id",
                               status=e.status) from e
            return sid

    def info(self, job_id: str) -> JobInfo:
        d = self._raw_info(job_id)
        return JobInfo(job_id=job_id, status=str(d.get("status") or "PENDING").upper(), message=d.get("message") or "",
                       error_type=str(d.get("error_type") or d.get("errorType") or ""))

    def follow(self, job_id: str, out: TextIO, timeout: float, poll: float = 1.0, on_timeout=None) -> JobInfo:
        """Write the job's log to ``out`` as it grows, until the job ends; returns its final info.
        After ``timeout`` seconds the job is stopped and ``on_timeout()`` is raised (if given)."""
        return self._poll_follow(job_id, out, time.monotonic() + timeout, poll, on_timeout, seen=0)

    def _poll_follow(self, job_id: str, out: TextIO, deadline: float, poll: float, on_timeout, seen: int) -> JobInfo:
        interval, next_logs = poll, 0.0
        while True:
            info = self.info(job_id)
            now = time.monotonic()
            if info.status in TERMINAL or now >= next_logs:
                text = self.logs(job_id)
                if len(text) > seen:
                    out.write(text[seen:])
                    out.flush()
                    interval = poll  # output moves: look again soon
                else:
                    interval = min(MAX_LOG_INTERVAL, interval * 2)  # quiet: re-read the whole log less and less often
                seen = max(seen, len(text))
                next_logs = now + interval
            if info.status in TERMINAL:
                return info
            if now >= deadline:
                self._timed_out(job_id, on_timeout)
                return info
            time.sleep(poll)

    def _timed_out(self, job_id: str, on_timeout) -> None:
        self.stop(job_id)
        if on_timeout is not None:
            raise on_timeout()

    # implemented by each client
    def _submit(self, entrypoint, sid, runtime_env, entrypoint_num_cpus) -> str: ...
    def _raw_info(self, job_id: str) -> dict: ...
    def logs(self, job_id: str) -> str: ...
    def stop(self, job_id: str) -> None: ...


class RayJobClient(JobClient, JsonHttp):
    """Ray's job REST API at ``address`` (a head's dashboard, or a proxy path to it)."""

    describe = "Ray dashboard"
    user_agent = "prepline-ray-jobs"

    def __init__(self, address: str, headers: dict | None = None, agent_wait: float = 60.0, **kw):
        JsonHttp.__init__(self, address, headers=headers, **kw)
        self.where = f"the Ray head at {self.server}"
        self.agent_wait = agent_wait

    def _retryable(self, status: int, raw: bytes) -> bool:
        # job_head.py answers 500 for a traceback too (a bad request deep in the agent): only the
        # gateway errors and its explicit "no agent yet" are worth retrying
        return status in (429, 502, 503, 504)

    def fix_for(self, method: str, path: str, status: int, body: str) -> str:
        if "/proxy" in self.server and from_security_proxy(status, body):
            return SECURITY_PROXY_FIX
        if status == 403 and "/proxy" in self.server:
            return ("POST through the API server's service proxy needs RBAC verb 'create' on services/proxy for the identity "
                    "of the token (kube-apiserver maps POST to create; the KubeRay API server's own ClusterRole grants only "
                    "get/list/watch): apply deploy/ (Role prepline) and pass its token, or use job_access='direct' inside the cluster")
        if status == 404 and "/api/jobs/" in path:
            return "no such job on this cluster: check the submission id"
        return super().fix_for(method, path, status, body)

    def unavailable_fix(self, path: str) -> str:
        return (f"check that the head's dashboard answers at {self.server} (port 8265, dashboard-host 0.0.0.0); "
                "inside the cluster the head Service is <cluster>-head-svc.<namespace>.svc.cluster.local")

    def version(self, retries: int | None = None) -> dict:
        return self.request("GET", "/api/version", retries=retries)

    def _submit(self, entrypoint, sid, runtime_env, entrypoint_num_cpus) -> str:
        body = ray_job_body(entrypoint, sid, runtime_env, entrypoint_num_cpus)
        deadline = time.monotonic() + self.agent_wait
        while True:  # the dashboard answers before its job agent is up (job_head.py: "No available agent")
            try:
                reply = self.request("POST", "/api/jobs/", body)
                return (reply.get("submission_id") if isinstance(reply, dict) else "") or sid
            except RequestError as e:
                if NO_AGENT not in str(e) or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def _raw_info(self, job_id: str) -> dict:
        d = self.request("GET", f"/api/jobs/{quote(job_id, safe='')}")
        if not isinstance(d, dict):
            raise RequestError(f"unexpected answer for job {job_id} from {self.server}: {str(d)[:200]!r}",
                               "check that the address is a Ray dashboard")
        return d

    def logs(self, job_id: str) -> str:
        d = self.request("GET", f"/api/jobs/{quote(job_id, safe='')}/logs")
        return (d.get("logs") if isinstance(d, dict) else "") or ""

    def stop(self, job_id: str) -> None:
        self.request("POST", f"/api/jobs/{quote(job_id, safe='')}/stop")

    def follow(self, job_id: str, out: TextIO, timeout: float, poll: float = 1.0, on_timeout=None) -> JobInfo:
        deadline = time.monotonic() + timeout
        try:
            ws = self._tail_socket(job_id, poll)
        except Exception as e:  # noqa: BLE001 - no websocket: poll instead
            log.info("cannot follow job %s through %s/api/jobs/.../logs/tail (%s): polling its log instead", job_id, self.server, e)
            return self._poll_follow(job_id, out, deadline, poll, on_timeout, seen=0)
        return self._ws_follow(ws, job_id, out, deadline, poll, on_timeout)

    def _tail_socket(self, job_id: str, poll: float):
        import websocket  # websocket-client (a dependency of the kubernetes package)

        url = "ws" + self.server[len("http"):] + f"/api/jobs/{quote(job_id, safe='')}/logs/tail"
        headers = [f"{k}: {v}" for k, v in self.auth_headers().items()]
        return websocket.create_connection(url, header=headers, timeout=max(0.2, min(poll, 5.0)))

    def _ws_follow(self, ws, job_id: str, out: TextIO, deadline: float, poll: float, on_timeout) -> JobInfo:
        import websocket

        written, check_every, next_check, ended_at = 0, max(poll, 5.0), time.monotonic(), None
        try:
            while True:
                try:
                    chunk = ws.recv()
                except websocket.WebSocketTimeoutException:
                    chunk = None
                except (websocket.WebSocketConnectionClosedException, OSError):
                    break  # the dashboard closes the socket when the job is done
                if chunk:
                    text = chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
                    out.write(text)
                    out.flush()
                    written += len(text)
                elif chunk == "" and not ws.connected:
                    break
                now = time.monotonic()
                if ended_at is None and now >= next_check:  # the status decides (a socket may outlive a lost driver)
                    next_check = now + check_every
                    if self.info(job_id).status in TERMINAL:
                        ended_at = now  # let the last lines arrive, then stop
                if ended_at is not None and now - ended_at > max(2.0, poll):
                    break
                if ended_at is None and now >= deadline:
                    self._timed_out(job_id, on_timeout)
                    return self.info(job_id)
        finally:
            ws.close()
        return self._settle(job_id, out, deadline, poll, on_timeout, written)

    def _settle(self, job_id: str, out: TextIO, deadline: float, poll: float, on_timeout, written: int) -> JobInfo:
        """After the socket closed: the status turns terminal a moment later; then the log is read
        once to add what the socket did not deliver (it streams the log from its start)."""
        info = self.info(job_id)
        while info.status not in TERMINAL and time.monotonic() < deadline:
            time.sleep(min(poll, 1.0))
            info = self.info(job_id)
        if info.status not in TERMINAL:  # the socket closed early: go on by polling
            return self._poll_follow(job_id, out, deadline, poll, on_timeout, seen=written)
        text = self.logs(job_id)
        if len(text) > written:
            out.write(text[written:])
            out.flush()
        return info


class V1JobClient(JobClient):
    """The same over the KubeRay V1 job-submission API (``/apis/v1/namespaces/{ns}/jobsubmissions/{cluster}``)."""

    def __init__(self, api, namespace: str, cluster: str):
        self.api, self.ns, self.cluster = api, namespace, cluster
        self.where = f"{namespace}/{cluster} (KubeRay V1 job submissions)"

    def _path(self, tail: str = "") -> str:
        return f"/apis/v1/namespaces/{self.ns}/jobsubmissions/{self.cluster}{tail}"

    def _submit(self, entrypoint, sid, runtime_env, entrypoint_num_cpus) -> str:
        reply = self.api.request("POST", self._path(), job_submission_v1_body(entrypoint, sid, runtime_env, entrypoint_num_cpus))
        return (reply.get("submissionId") if isinstance(reply, dict) else "") or sid

    def _raw_info(self, job_id: str) -> dict:
        d = self.api.request("GET", self._path(f"/{quote(job_id, safe='')}"))
        return d if isinstance(d, dict) else {}

    def logs(self, job_id: str) -> str:
        d = self.api.request("GET", self._path(f"/log/{quote(job_id, safe='')}"))
        return (d.get("log") if isinstance(d, dict) else "") or ""

    def stop(self, job_id: str) -> None:
        self.api.request("POST", self._path(f"/{quote(job_id, safe='')}"))

    def ping(self) -> None:
        self.api.request("GET", self._path(), retries=0)
