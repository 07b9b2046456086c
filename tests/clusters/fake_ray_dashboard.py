"""A fake of the Ray dashboard's job API, as ``ray/dashboard/modules/job/job_head.py`` (Ray 2.60)
serves it, for the KubeRay fake's clusters: reached directly (``head_url``) or through the KubeRay
API server's service proxy.

Mirrored behaviours (each from job_head.py unless said otherwise):

* ``POST /api/jobs/``: the body must be a ``JobSubmitRequest`` (``common.py``); unknown fields or a
  non-dict ``runtime_env`` -> 400 with a traceback as plain text. A duplicate ``submission_id`` is
  refused by the job agent (``job_manager.py``: ValueError "... already exists") and the head wraps the
  agent's error (``JobAgentSubmissionClient._raise_error``: RuntimeError) -> **500** with a
  traceback. The first ``agent_lag`` submits answer 500 "No available agent to submit job, please try
  again later." (the head's ``get_target_agent`` timing out). Success -> ``{"job_id", "submission_id"}``.
* ``GET /api/jobs/{id}``: ``JobDetails`` as JSON; unknown id -> 404 "Job {id} does not exist" (text).
* ``GET /api/jobs/{id}/logs``: ``{"logs": <the whole log>}`` (no offset exists).
* ``GET /api/jobs/{id}/logs/tail``: a websocket streaming text frames of new log lines; closed by the
  server when the job has ended (``tail_job_logs``).
* ``POST /api/jobs/{id}/stop``: ``{"stopped": bool}``.
* ``GET /api/version``.

Job life (not Ray's, the fake's script): PENDING on the first read, then RUNNING, then after
``job_steps`` more reads (or websocket ticks) SUCCEEDED; an entrypoint containing "fail_on_purpose" ends FAILED
with a traceback, one containing "hang_forever" runs until stopped, one containing "chatty" writes a line per step.
The first ``setup_failures`` jobs go from PENDING straight to FAILED as ``job_manager.py`` (``_monitor_job_internal``)
ends a job whose supervisor actor's runtime env could not be set up: error_type RUNTIME_ENV_SETUP_FAILURE, message
"runtime_env setup failed: Failed to set up runtime environment.", that message appended to the job's log, no driver.
A job runs with its head's environment (``env_of(namespace, cluster)``: the pod's env, resolved from
the secrets of the cluster's own namespace): one whose entrypoint reads ``s3://`` without
``AWS_ACCESS_KEY_ID`` in it fails the way botocore does (``NoCredentialsError: Unable to locate
credentials``), which is what an optional S3 secret missing from the cluster's namespace leads to.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid

_RAY_JOB_FIELDS = {"entrypoint", "submission_id", "job_id", "runtime_env", "metadata", "entrypoint_num_cpus",
                   "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources", "entrypoint_label_selector"}
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class Answer(Exception):
    def __init__(self, status: int, body, content_type: str = "application/json"):
        self.status, self.body, self.content_type = status, body, content_type


def _traceback(line: str) -> str:
    return f"Traceback (most recent call last):\n  File \"job_head.py\", line 420, in submit_job\n{line}\n"


class FakeRayJobs:
    """The jobs of every fake head, keyed by (namespace, cluster, submission id)."""

    def __init__(self, lock: threading.RLock, job_steps: int = 2, ray_version: str = "2.60.0", agent_lag: int = 0, env_of=None):
        self.lock, self.job_steps, self.ray_version, self.agent_lag = lock, job_steps, ray_version, agent_lag
        self.env_of = env_of or (lambda ns, name: {})
        self.jobs: dict[tuple[str, str, str], dict] = {}
        self.submits = 0
        self.setup_failures = 0  # the first this many jobs fail in runtime env setup (settable by a test)
        self.setup_failed = 0

    # -- the routes (``rest`` is the path after the dashboard's root) -------------------------------
    def handle(self, method: str, ns: str, name: str, rest: str, body, version: str | None = None) -> tuple[int, object, str]:
        try:
            with self.lock:
                return self._route(method, ns, name, rest or "/", body, version)
        except Answer as a:
            return a.status, a.body, a.content_type

    def _route(self, method, ns, name, rest, body, version):
        if rest == "/api/version" and method == "GET":
            return 200, {"version": "4", "ray_version": version or self.ray_version, "ray_commit": "fake", "session_name": "fake"}, "application/json"
        if rest == "/api/jobs/" and method == "POST":
            return 200, self._submit(ns, name, body), "application/json"
        if rest == "/api/jobs/" and method == "GET":
            return 200, [self.view(j) for (jns, jc, _), j in self.jobs.items() if (jns, jc) == (ns, name)], "application/json"
        m = re.match(r"^/api/jobs/([^/]+)(/logs|/stop)?$", rest)
        if m:
            job = self.find(ns, name, m.group(1))
            if m.group(2) is None and method == "GET":
                self.advance(job)
                return 200, self.view(job), "application/json"
            if m.group(2) == "/logs" and method == "GET":
                return 200, {"logs": job["logs"]}, "application/json"
            if m.group(2) == "/stop" and method == "POST":
                return 200, {"stopped": self.stop(job)}, "application/json"
            if m.group(2) is None and method == "DELETE":
                if job["status"] not in TERMINAL:
                    raise Answer(500, _traceback("RuntimeError: Attempted to delete a job that is not in a terminal state."), "text/plain")
                del self.jobs[(ns, name, m.group(1))]
                return 200, {"deleted": True}, "application/json"
        raise Answer(404, "404: Not Found", "text/plain")

    def find(self, ns: str, name: str, sid: str) -> dict:
        job = self.jobs.get((ns, name, sid))
        if job is None:
            raise Answer(404, f"Job {sid} does not exist", "text/plain")
        return job

    def _submit(self, ns: str, name: str, body) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("entrypoint"), str) or set(body) - _RAY_JOB_FIELDS:
            bad = sorted(set(body) - _RAY_JOB_FIELDS) if isinstance(body, dict) else body
            raise Answer(400, _traceback(f"TypeError: JobSubmitRequest.__init__() got an unexpected keyword argument {bad!r}"), "text/plain")
        if body.get("runtime_env") is not None and not isinstance(body["runtime_env"], dict):
            raise Answer(400, _traceback("TypeError: runtime_env must be a dict"), "text/plain")
        self.submits += 1
        if self.submits <= self.agent_lag:
            raise Answer(500, "No available agent to submit job, please try again later.", "text/plain")
        sid = body.get("submission_id") or f"raysubmit_{uuid.uuid4().hex[:16]}"
        if (ns, name, sid) in self.jobs:  # the agent's 400 wrapped by the head into a 500 (JobAgentSubmissionClient._raise_error)
            raise Answer(500, _traceback(f"RuntimeError: Request failed with status code 400: Traceback (most recent call last):\n"
                                         f"ValueError: Job with submission_id {sid} already exists. Please use a different submission_id.."),
                         "text/plain")
        self.jobs[(ns, name, sid)] = {
            "type": "SUBMISSION", "job_id": None, "submission_id": sid, "status": "PENDING", "entrypoint": body["entrypoint"],
            "message": "Job has not started yet.", "error_type": None, "start_time": int(time.time() * 1000), "end_time": None,
            "metadata": body.get("metadata") or {}, "runtime_env": body.get("runtime_env") or {}, "driver_info": None,
            "entrypoint_num_cpus": body.get("entrypoint_num_cpus"), "logs": "", "reads": 0,
            "env": {**self.env_of(ns, name), **((body.get("runtime_env") or {}).get("env_vars") or {})}}
        return {"job_id": sid, "submission_id": sid}

    def advance(self, job: dict) -> None:
        if job["status"] in TERMINAL:
            return
        job["reads"] += 1
        ep = job["entrypoint"]
        if job["reads"] <= 1:  # the first read still sees PENDING
            return
        if job["status"] == "PENDING" and self.setup_failed < self.setup_failures:
            self.setup_failed += 1
            said = "runtime_env setup failed: Failed to set up runtime environment."
            job.update(status="FAILED", error_type="RUNTIME_ENV_SETUP_FAILURE", message=said, logs=job["logs"] + said,
                       end_time=int(time.time() * 1000))
            return
        if job["status"] == "PENDING":
            job.update(status="RUNNING", message="Job is currently running.", job_id="02000000", logs=f"running: {ep}\n")
        elif "chatty" in ep:
            job["logs"] += f"step {job['reads']}\n"
        if "hang_forever" in ep or job["reads"] <= 1 + self.job_steps:
            return
        no_credentials = "s3://" in ep and not job["env"].get("AWS_ACCESS_KEY_ID")
        if "fail_on_purpose" in ep or no_credentials:
            last = ("botocore.exceptions.NoCredentialsError: Unable to locate credentials" if no_credentials
                    else "RuntimeError: boom: the job failed on purpose")
            tb = f"Traceback (most recent call last):\n  File \"job.py\", line 3, in <module>\n    raise ...\n{last}\n"
            job.update(status="FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR", logs=job["logs"] + tb,
                       message="Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + tb)
        else:
            job.update(status="SUCCEEDED", message="Job finished successfully.", logs=job["logs"] + f"done: {ep}\n")
        job["end_time"] = int(time.time() * 1000)

    def stop(self, job: dict) -> bool:
        stopped = job["status"] in ("PENDING", "RUNNING")
        if stopped:
            job.update(status="STOPPED", message="Job was intentionally stopped.", end_time=int(time.time() * 1000))
        return stopped

    @staticmethod
    def view(job: dict) -> dict:
        return {k: v for k, v in job.items() if k not in ("logs", "reads", "env")}

    def drop(self, ns: str, name: str) -> None:
        for key in [k for k in self.jobs if k[:2] == (ns, name)]:
            del self.jobs[key]


class FakeDashboards:
    """The heads' dashboards, reached directly: one aiohttp server (what Ray's dashboard is) serving
    ``/heads/{namespace}/{name}/...`` for every cluster; ``serving(ns, name)`` says whether that head
    answers yet (else 503, as when its Service has no ready endpoint). ``tick`` paces the websocket."""

    def __init__(self, jobs: FakeRayJobs, serving, version_of, tick: float = 0.02):
        self.jobs, self.serving, self.version_of, self.tick = jobs, serving, version_of, tick
        self.requests: list[tuple[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    def start(self) -> "FakeDashboards":
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/heads/{ns}/{name}/{rest:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._thread.start()

        async def boot():
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return runner, site._server.sockets[0].getsockname()[1]

        self._runner, self.port = asyncio.run_coroutine_threadsafe(boot(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def url_template(self) -> str:
        return f"http://127.0.0.1:{self.port}/heads/{{namespace}}/{{name}}"

    async def _handle(self, request):
        from aiohttp import web

        ns, name, rest = request.match_info["ns"], request.match_info["name"], "/" + request.match_info["rest"]
        self.requests.append((request.method, f"/heads/{ns}/{name}{rest}"))
        error = self.serving(ns, name)
        if error:
            return web.Response(status=503, text=error)
        if rest.endswith("/logs/tail") and request.method == "GET":
            return await self._tail(request, ns, name, rest[len("/api/jobs/"):-len("/logs/tail")])
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return web.Response(status=400, text=_traceback("json.decoder.JSONDecodeError: Expecting value"))
        status, out, ctype = self.jobs.handle(request.method, ns, name, rest, body, self.version_of(ns, name))
        return web.Response(status=status, text=out if isinstance(out, str) else json.dumps(out), content_type=ctype)

    async def _tail(self, request, ns: str, name: str, sid: str):
        from aiohttp import web

        with self.jobs.lock:
            if (ns, name, sid) not in self.jobs.jobs:
                return web.Response(status=404, text=f"Job {sid} does not exist")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sent = 0
        while True:
            with self.jobs.lock:
                job = self.jobs.jobs.get((ns, name, sid))
                if job is None:
                    break
                self.jobs.advance(job)
                text, done = job["logs"], job["status"] in TERMINAL
            if len(text) > sent:
                await ws.send_str(text[sent:])
                sent = len(text)
            if done:
                break
            await asyncio.sleep(self.tick)
        await ws.close()
        return ws
