"""The KFP client: ``kfp.Client`` with a checked connection, a timeout and one retry policy on
every request (:func:`prepline.rest.retry_policy`), typed errors, and waits that end on every
terminal state (``kfp.Client.wait_for_run_completion`` never returns on CANCELED).

* the server is checked once (``GET /apis/v2beta1/healthz``, short timeout, no retries) before the
  SDK is built;
* run parameters are checked against the pipeline spec's root ``inputDefinitions`` before posting
  (:mod:`prepline.kfp.params`);
* every SDK/HTTP error becomes a :mod:`prepline.errors` error with a message and a fix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from prepline import rest
from prepline.errors import EXIT_CANCELED, EXIT_FAILED, EXIT_OK, EXIT_SERVICE, EXIT_TIMEOUT, EXIT_USAGE, ConfigError, PreplineError, RunFailed  # noqa: F401 (EXIT_* re-exported)
from prepline.errors import ServiceError, TimedOut
from prepline.kfp.connection import ENV_TOKEN, SA_TOKEN_PATH, Connection
from prepline.kfp.params import check_parameters, check_secret_names, content_digest, read_package, root_inputs, spec_defaults, spec_docs
from prepline.preflight import check_kfp_run

log = logging.getLogger("prepline")

#: exit codes: the one mapping of prepline.errors (EXIT_API is its EXIT_SERVICE)
EXIT_API = EXIT_SERVICE

#: terminal run states and the exit code each maps to; CANCELING counts as canceled (it can stay
#: there for a long time on a real cluster, and the outcome is decided)
TERMINAL_STATES = {"SUCCEEDED": EXIT_OK, "FAILED": EXIT_FAILED, "SKIPPED": EXIT_FAILED, "CANCELED": EXIT_CANCELED,
                   "CANCELING": EXIT_CANCELED}


class KfpError(ServiceError):
    """The KFP server could not be used for a request (refused, unknown id, server error)."""

    def __init__(self, message: str, fix: str | None = None, status: int = 0):
        super().__init__(message, fix)
        self.status = status


class KfpUnreachable(KfpError):
    """No answer from the host (connection refused, DNS, TLS, timeout) or not a KFP API."""


class KfpAuthError(KfpError):
    """401 / 403."""


class KfpNotFound(KfpError):
    """An unknown pipeline, version, experiment or run."""


class KfpTimeout(TimedOut):
    """A wait ran out of time; the run goes on."""


class ChildRunFailed(RunFailed):
    """A child run started by ``run_pipeline`` ended FAILED / CANCELED / SKIPPED."""



def _run_state(run) -> str:
    return (getattr(run, "state", None) or "RUNTIME_STATE_UNSPECIFIED").upper()


def _iso(t) -> str | None:
    if t is None:
        return None
    return t.isoformat() if hasattr(t, "isoformat") else str(t)


class KfpClient:
    """``kfp.Client`` with checked connections, typed errors and waits that end on every terminal state."""

    def __init__(self, conn: Connection, out=None, retries: int = 5):
        self.conn = conn
        self.retries = retries  # more tries of a request that met a transient error (rest.retry_policy)
        self.out = out if out is not None else sys.stderr  # where the SDK's "details: <link>" lines go
        self._client = None

    # -- connection ------------------------------------------------------------------------------
    def _token(self) -> str | None:
        if self.conn.token:
            return self.conn.token
        if self.conn.token_file:
            try:
                return Path(self.conn.token_file).read_text().strip() or None
            except OSError as e:
                raise ConfigError(f"cannot read token file {self.conn.token_file}: {e.strerror or e}", "check the token file") from None
        return None

    def _hint_auth(self) -> str:
        return (f"the token came from {self.conn.token_source}; pass a valid bearer token with --token, ${ENV_TOKEN}, "
                f"--token-file or the service-account token at {SA_TOKEN_PATH}")

    def error(self, e: BaseException, what: str, not_found: tuple[str, str] | None = None) -> PreplineError:
        """Turn an SDK/HTTP exception into a prepline error naming what failed and the fix."""
        import kfp_server_api
        import urllib3

        host = self.conn.host
        if isinstance(e, PreplineError):
            return e
        if isinstance(e, kfp_server_api.ApiException):
            status = int(e.status or 0)
            msg = rest.server_message(e.body, limit=500) or (e.reason or "").strip()
            if status == 0:
                return KfpUnreachable(f"{what}: cannot reach Kubeflow Pipelines at {host}: {msg.splitlines()[0] if msg else 'no answer'}",
                                      "check --host / $KF_PIPELINES_ENDPOINT and TLS settings", status)
            if status == 401:
                return KfpAuthError(f"{what}: {host} answered 401 Unauthorized ({msg})", self._hint_auth(), status)
            if status == 403:
                ns = self.conn.namespace or "(none given)"
                return KfpAuthError(f"{what}: {host} answered 403 Forbidden ({msg})",
                                    f"the token's identity may not do this in namespace {ns}: check --namespace and the profile's contributors / RBAC", status)
            if status == 404:
                if not_found:
                    return KfpNotFound(not_found[0] + (f" ({msg})" if msg else ""), not_found[1], status)
                return KfpNotFound(f"{what}: not found on {host} ({msg})", "check the id or name", status)
            if status in (400, 409, 412, 422):
                return KfpError(f"{what}: {host} refused the request ({status}: {msg})", "fix the request as the message says", status)
            return KfpError(f"{what}: {host} answered {status} {e.reason or ''} ({msg})".strip(),
                            "retry later; if it persists, see the ml-pipeline (API server) logs", status)
        if isinstance(e, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
            reason = getattr(e, "reason", None) or e
            return KfpUnreachable(f"{what}: cannot reach Kubeflow Pipelines at {host}: {type(reason).__name__}: {reason}",
                                  "check --host / $KF_PIPELINES_ENDPOINT (e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888`, "
                                  "--host http://localhost:8888)")
        if isinstance(e, ValueError):
            return ConfigError(f"{what}: {e}", "check the names and options given")
        return KfpError(f"{what}: unexpected answer from {host}: {type(e).__name__}: {e}",
                        "is the host the KFP API (ml-pipeline, port 8888) or the UI behind its /pipeline prefix?")

    @contextlib.contextmanager
    def call(self, what: str, not_found: tuple[str, str] | None = None) -> Iterator[None]:
        """Run SDK calls: their "details: <link>" prints go to ``out``, and every API/HTTP/SDK-argument
        failure becomes a prepline error (anything else is a bug and keeps its traceback)."""
        import kfp_server_api
        import urllib3

        try:
            with contextlib.redirect_stdout(self.out), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        except PreplineError:
            raise
        except (kfp_server_api.exceptions.OpenApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise self.error(e, what, not_found) from None

    def healthz(self) -> dict:
        """``GET /apis/v2beta1/healthz`` once, with a short timeout, before kfp.Client is built."""
        import kfp_server_api

        cfg = kfp_server_api.Configuration(host=self.conn.host)
        cfg.retries = rest.retry_policy(attempts=1, idempotent=False)  # one more try to connect, nothing else
        tok = self._token()
        if tok:
            cfg.api_key["authorization"], cfg.api_key_prefix["authorization"] = tok, "Bearer"
        api = kfp_server_api.HealthzServiceApi(kfp_server_api.ApiClient(cfg))
        fix = "point --host at the ml-pipeline service (port 8888) or the UI's /pipeline prefix"
        with self.call("health check", not_found=(f"{self.conn.host} has no /apis/v2beta1/healthz: it is not a Kubeflow Pipelines v2 API", fix)):
            # raw answer: the SDK would turn an HTML login page into an empty model without a word
            r = api.healthz_service_get_healthz(_preload_content=False, _request_timeout=(self.conn.connect_timeout, self.conn.request_timeout))
            raw = r.data
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise ValueError
        except ValueError:
            what = "an HTML page (a login page or a proxy?)" if raw.lstrip()[:1] == b"<" else f"{raw[:80]!r}"
            raise KfpUnreachable(f"{self.conn.host} did not answer like the KFP API: /apis/v2beta1/healthz returned {what}",
                                 fix + "; behind Kubeflow's auth gateway pass a token (--token) or use the in-cluster service") from None
        # tag_name: the backend's release (backend/src/apiserver/main.go healthz handler); prepline.compat judges it
        self.server_info = {"multi_user": bool(d.get("multi_user")), "pipeline_store": d.get("pipeline_store"),
                            "tag_name": d.get("tag_name"), "commit_sha": d.get("commit_sha")}
        return self.server_info

    @property
    def client(self):
        if self._client is None:
            self.healthz()
            if os.environ.get("_KFP_RUNTIME") == "true":
                # inside a component kfp runs in runtime mode: kfp.dsl skips its compile-time modules and
                # importing kfp.client then hits an import cycle. Load them in kfp.dsl's own order first.
                import kfp.dsl.component_decorator  # noqa: F401
            from kfp.client import Client
            from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

            kw: dict[str, Any] = {"host": self.conn.host}
            if self.conn.namespace:
                kw["namespace"] = self.conn.namespace
            if self.conn.token:
                kw["existing_token"] = self.conn.token
            elif self.conn.token_file:
                kw["credentials"] = ServiceAccountTokenVolumeCredentials(self.conn.token_file)
            with self.call("connect"):
                c = Client(**kw)
            self._set_transport(c)
            self._client = c
        return self._client

    def _set_transport(self, c) -> None:
        """kfp.Client sends no timeout (a silent server would hang us) and retries only by urllib3's
        defaults: give every request a timeout and the one retry policy (GETs through 502-504 too)."""
        rc = getattr(getattr(getattr(c, "_run_api", None), "api_client", None), "rest_client", None)
        if rc is None:
            return
        rc.pool_manager.connection_pool_kw["retries"] = rest.retry_policy(self.retries)
        rc.pool_manager.clear()  # pools made before take the policy when made again
        orig, limit = rc.request, (self.conn.connect_timeout, self.conn.request_timeout)

        def request(*a, _request_timeout=None, **kw):
            return orig(*a, _request_timeout=_request_timeout or limit, **kw)

        rc.request = request

    # -- pipelines -------------------------------------------------------------------------------
    def _ns(self) -> str | None:
        return self.conn.namespace or None

    @staticmethod
    def _name_filter(name: str, key: str = "display_name") -> str:
        # the shape kfp.Client itself sends (operation 1 = EQUALS, camelCase value)
        return json.dumps({"predicates": [{"operation": 1, "key": key, "stringValue": name}]})

    def find_pipeline(self, name: str):
        with self.call(f"look up pipeline {name}"):
            r = self.client.list_pipelines(filter=self._name_filter(name), namespace=self._ns(), page_size=10)
        found = [p for p in (r.pipelines or []) if name in (p.display_name, getattr(p, "name", None))]
        if len(found) > 1:
            raise KfpError(f"{len(found)} pipelines are named {name}", "delete the duplicates in the KFP UI or use another name")
        return found[0] if found else None

    def pipeline(self, name: str):
        p = self.find_pipeline(name)
        # the KFP UI's upload dialog names a pipeline after its file (doc_id); `prepline kfp upload`
        # after the compiled name (doc-id: KFP pipeline names take no '_'): find either spelling
        alt = name.replace("_", "-") if "_" in name else name.replace("-", "_")
        if p is None and alt != name:
            p = self.find_pipeline(alt)
        if p is None:
            known = [q.display_name for q in self.iter_pipelines(limit=50)]
            raise KfpNotFound(f"no pipeline named {name} on {self.conn.host}" + (f" (namespace {self.conn.namespace})" if self.conn.namespace else ""),
                              f"upload it first: prepline kfp upload compiled/pipelines/<name>.yaml; pipelines there: {', '.join(known) or '(none)'}")
        return p

    def iter_pipelines(self, page_size: int = 50, limit: int | None = None):
        token, n = "", 0
        while True:
            with self.call("list pipelines"):
                r = self.client.list_pipelines(page_token=token, page_size=page_size, namespace=self._ns())
            for p in r.pipelines or []:
                yield p
                n += 1
                if limit and n >= limit:
                    return
            token = r.next_page_token or ""
            if not token:
                return

    def versions(self, pipeline_id: str, page_size: int = 50) -> list:
        out, token = [], ""
        while True:
            with self.call(f"list versions of pipeline {pipeline_id}",
                           not_found=(f"no pipeline with id {pipeline_id}", "list them: prepline kfp list pipelines")):
                r = self.client.list_pipeline_versions(pipeline_id, page_token=token, page_size=page_size, sort_by="created_at desc")
            out += r.pipeline_versions or []
            token = r.next_page_token or ""
            if not token:
                return out

    def version(self, pipeline, version: str = ""):
        """A version of ``pipeline`` by name (or id), or the newest one."""
        vs = self.versions(pipeline.pipeline_id)
        if not vs:
            raise KfpNotFound(f"pipeline {pipeline.display_name} has no versions", "upload one: prepline kfp upload <file>")
        if not version:
            return max(vs, key=lambda v: (v.created_at or dt.datetime.min.replace(tzinfo=dt.timezone.utc)))
        for v in vs:
            if version in (v.display_name, getattr(v, "name", None), v.pipeline_version_id):
                return v
        raise KfpNotFound(f"pipeline {pipeline.display_name} has no version {version}",
                          f"its versions: {', '.join(v.display_name for v in vs[:20])}")

    def version_spec(self, v) -> dict | None:
        if v.pipeline_spec:
            return v.pipeline_spec
        with self.call(f"get pipeline version {v.pipeline_version_id}"):
            full = self.client.get_pipeline_version(v.pipeline_id, v.pipeline_version_id)
        return full.pipeline_spec or None

    def upload(self, path: str, name: str | None = None, version: str | None = None, description: str | None = None) -> dict:
        """Upload a compiled pipeline as a new pipeline, or as a new version of the pipeline of that
        name. Idempotent: a version with the same content (or the same version name and content)
        is reported, not duplicated; the same version name with other content is refused."""
        docs = read_package(path)
        name = name or docs[0]["pipelineInfo"]["name"]
        digest = content_digest(docs)
        derived = f"{name}-{digest[:12]}"  # a content-derived name: finding it is finding this content
        version = version or derived
        description = description if description is not None else (docs[0]["pipelineInfo"].get("description") or "")[:1000]
        p = self.find_pipeline(name)
        if p is None:
            with self.call(f"upload pipeline {name}"):
                created = self.client.upload_pipeline(str(path), pipeline_name=name, description=description or None, namespace=self._ns())
            vs = self.versions(created.pipeline_id)
            v = vs[0] if vs else None
            return self._upload_result(created, v, digest, created_pipeline=True, created_version=v is not None)
        vs = self.versions(p.pipeline_id)
        for v in vs:
            if version in (v.display_name, getattr(v, "name", None)):
                spec = None if version == derived else self.version_spec(v)
                if spec is not None and content_digest(spec) != digest:
                    raise ConfigError(f"pipeline {name} already has a version {version} with other content",
                                      "give the new content another --version name (or omit --version for a content-derived name)")
                return self._upload_result(p, v, digest, reason="a version of that name and content exists")
        for v in vs:
            spec = self.version_spec(v)
            if spec is not None and content_digest(spec) == digest:
                return self._upload_result(p, v, digest, reason=f"version {v.display_name} has the same content")
        with self.call(f"upload version {version} of pipeline {name}"):
            v = self.client.upload_pipeline_version(str(path), version, pipeline_id=p.pipeline_id, description=description or None)
        return self._upload_result(p, v, digest, created_version=True)

    def _upload_result(self, p, v, digest: str, created_pipeline: bool = False, created_version: bool = False, reason: str = "") -> dict:
        return {
            "pipeline_id": p.pipeline_id, "pipeline_name": p.display_name,
            "version_id": v.pipeline_version_id if v else None, "version_name": v.display_name if v else None,
            "created_pipeline": created_pipeline, "created_version": created_version, "sha256": digest,
            **({"reason": reason} if reason else {}),
            "url": f"{self.conn.ui}/#/pipelines/details/{p.pipeline_id}" + (f"/version/{v.pipeline_version_id}" if v else ""),
        }

    # -- experiments -----------------------------------------------------------------------------
    def experiment(self, name: str, create: bool = True):
        with self.call(f"look up experiment {name}"):
            r = self.client.list_experiments(filter=self._name_filter(name), namespace=self._ns(), page_size=10)
        found = [e for e in (r.experiments or []) if e.display_name == name]
        if found:
            return found[0]
        if not create:
            raise KfpNotFound(f"no experiment named {name}", "list them: prepline kfp list experiments")
        with self.call(f"create experiment {name}"):
            return self.client.create_experiment(name, namespace=self._ns())

    # -- runs ------------------------------------------------------------------------------------
    def get_run(self, run_id: str):
        with self.call(f"get run {run_id}", not_found=(f"no run with id {run_id} on {self.conn.host}", "list runs: prepline kfp list runs")):
            return self.client.get_run(run_id)

    def run_spec(self, run) -> dict | None:
        """The pipeline spec a run was started with (inline, or its pipeline version's)."""
        if run.pipeline_spec:
            return run.pipeline_spec
        ref = run.pipeline_version_reference
        if ref and ref.pipeline_id and ref.pipeline_version_id:
            with self.call(f"get the pipeline version of run {run.run_id}",
                           not_found=(f"the pipeline version of run {run.run_id} no longer exists", "re-upload the pipeline and start a new run")):
                return self.client.get_pipeline_version(ref.pipeline_id, ref.pipeline_version_id).pipeline_spec or None
        return None

    def effective_parameters(self, run) -> dict:
        """The parameter values a run ran with: its spec's defaults overlaid with its runtime config."""
        spec = self.run_spec(run)
        given = dict((run.runtime_config.parameters if run.runtime_config else None) or {})
        return {**spec_defaults(spec), **given}

    def create_run(self, *, experiment_id: str, display_name: str, parameters: dict, pipeline_spec: dict | None = None,
                   pipeline_id: str | None = None, version_id: str | None = None, pipeline_root: str | None = None,
                   service_account: str | None = None, description: str | None = None):
        import kfp_server_api as m

        body = m.V2beta1Run(
            experiment_id=experiment_id, display_name=display_name, description=description,
            pipeline_spec=pipeline_spec,
            pipeline_version_reference=m.V2beta1PipelineVersionReference(pipeline_id=pipeline_id, pipeline_version_id=version_id)
            if version_id else None,
            runtime_config=m.V2beta1RuntimeConfig(parameters=parameters, pipeline_root=pipeline_root or None),
            service_account=service_account or None,
        )
        with self.call(f"start run {display_name}"):
            return self.client.runs.run_service_create_run(run=body)

    def start(self, *, package: str | None = None, pipeline: str | None = None, version: str = "", values: dict | None = None,
              experiment: str = "Default", run_name: str | None = None,
              pipeline_root: str | None = None, service_account: str | None = None, check_input: bool = False):
        """Start a run from a compiled file (spec sent inline) or an uploaded pipeline (+version), with
        parameters checked against the pipeline's root inputs first."""
        values = values or {}
        if bool(package) == bool(pipeline):
            raise ConfigError("give either a compiled pipeline file or --pipeline NAME", "prepline kfp run compiled/pipelines/doc_id.yaml, or --pipeline doc-id")
        if package:
            docs = read_package(package)
            label = docs[0]["pipelineInfo"]["name"]
            params = check_parameters(label, root_inputs(docs), values)
            check_secret_names(label, docs, params)
            check_kfp_run(docs, params, check_input)  # a prepline pipeline's stage settings (and input): before posting
            exp = self.experiment(experiment)
            name = run_name or f"{label} {dt.datetime.now().strftime('%Y-%m-%d %H-%M-%S')}"
            with self.call(f"start run {name}"):
                return self.client.run_pipeline(exp.experiment_id, name, pipeline_package_path=str(package), params=params,
                                                pipeline_root=pipeline_root, service_account=service_account)
        p = self.pipeline(pipeline)
        v = self.version(p, version)
        spec = self.version_spec(v)
        if spec is None:
            log.warning("the server returned no spec for %s/%s: parameters are not checked", pipeline, v.display_name)
            params = dict(values)
        else:
            params = check_parameters(pipeline, root_inputs(spec), values)
            check_secret_names(pipeline, spec, params)
            check_kfp_run(spec_docs(spec), params, check_input)
        exp = self.experiment(experiment)
        name = run_name or f"{pipeline} {v.display_name} {dt.datetime.now().strftime('%Y-%m-%d %H-%M-%S')}"
        with self.call(f"start run {name}"):
            return self.client.run_pipeline(exp.experiment_id, name, params=params, pipeline_id=p.pipeline_id, version_id=v.pipeline_version_id,
                                            pipeline_root=pipeline_root, service_account=service_account)

    def clone(self, run_id: str, overrides: dict | None = None, run_name: str | None = None, experiment: str | None = None):
        """What the UI's "Clone run" does (there is no clone API): read the run, post a new one with
        the same pipeline version reference (or inline spec) and runtime config, plus overrides."""
        old = self.get_run(run_id)
        ref = old.pipeline_version_reference
        has_ref = bool(ref and ref.pipeline_id and ref.pipeline_version_id)
        if not has_ref and not old.pipeline_spec:
            raise KfpError(f"run {run_id} has neither a pipeline version reference nor an inline pipeline spec", "start a new run with prepline kfp run")
        rc = old.runtime_config
        params = dict((rc.parameters if rc else None) or {})
        if overrides:
            spec = self.run_spec(old)
            if spec is None:
                raise ConfigError(f"cannot check --param against run {run_id}: its pipeline spec is not available",
                                  "clone without --param, or start a new run with prepline kfp run")
            params.update(check_parameters(f"of run {run_id}", root_inputs(spec), overrides, require=False))
            check_secret_names(f"of run {run_id}", spec, params)
        exp_id = self.experiment(experiment).experiment_id if experiment else old.experiment_id
        return self.create_run(
            experiment_id=exp_id, display_name=run_name or f"Clone of {old.display_name}", parameters=params,
            pipeline_spec=None if has_ref else old.pipeline_spec, pipeline_id=ref.pipeline_id if has_ref else None,
            version_id=ref.pipeline_version_id if has_ref else None, pipeline_root=rc.pipeline_root if rc else None,
            service_account=old.service_account, description=old.description,
        )

    def terminate(self, run_id: str) -> None:
        with self.call(f"terminate run {run_id}", not_found=(f"no run with id {run_id} on {self.conn.host}", "list runs: prepline kfp list runs")):
            self.client.terminate_run(run_id)

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 5.0, on_change: Callable | None = None):
        """Poll the run until a terminal state (SUCCEEDED, FAILED, SKIPPED, CANCELING, CANCELED);
        raise KfpTimeout after ``timeout`` seconds. A transient error (no answer, 502-504) is
        retried by the transport (:func:`prepline.rest.retry_policy`)."""
        t0 = time.monotonic()
        last = None
        while True:
            run = self.get_run(run_id)
            state = _run_state(run)
            if state != last and on_change:
                on_change(run)
            last = state
            if state in TERMINAL_STATES:
                return run
            elapsed = time.monotonic() - t0
            if timeout is not None and elapsed >= timeout:
                raise KfpTimeout(f"run {run_id} is still {state} after {timeout:g}s", f"wait longer (--timeout), or stop it: prepline kfp terminate {run_id}")
            time.sleep(poll if timeout is None else max(0.0, min(poll, timeout - elapsed)))

    def list_runs(self, experiment: str | None = None, page_size: int = 20, page_token: str = "", sort_by: str = "created_at desc",
                  name: str | None = None):
        exp_id = self.experiment(experiment, create=False).experiment_id if experiment else None
        with self.call("list runs"):
            r = self.client.list_runs(page_token=page_token, page_size=page_size, sort_by=sort_by, experiment_id=exp_id,
                                      namespace=self._ns(), filter=self._name_filter(name) if name else None)
        return r.runs or [], r.next_page_token or "", r.total_size

    def run_dict(self, run) -> dict:
        ref = run.pipeline_version_reference
        err = run.error.message if run.error else None
        return {
            "run_id": run.run_id, "display_name": run.display_name, "state": _run_state(run), "experiment_id": run.experiment_id,
            "pipeline_id": ref.pipeline_id if ref else None, "pipeline_version_id": ref.pipeline_version_id if ref else None,
            "created_at": _iso(run.created_at), "finished_at": _iso(run.finished_at),
            "parameters": dict((run.runtime_config.parameters if run.runtime_config else None) or {}),
            "error": err, "url": f"{self.conn.ui}/#/runs/details/{run.run_id}",
        }

    def tasks(self, run) -> list[dict]:
        """What the API says about a run's tasks: state, pods, errors (the API serves no log text)."""
        out = []
        for t in ((run.run_details.task_details if run.run_details else None) or []):
            pods = [c.pod_name for c in (t.child_tasks or []) if c.pod_name] or ([t.pod_name] if getattr(t, "pod_name", None) else [])
            out.append({"task_id": t.task_id, "display_name": t.display_name, "state": (t.state or "").upper() or None, "pods": pods,
                        "error": t.error.message if t.error else None, "start_time": _iso(t.start_time), "end_time": _iso(t.end_time)})
        return out

