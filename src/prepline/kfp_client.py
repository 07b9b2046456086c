"""Operating a Kubeflow Pipelines server (REST API v2beta1) from the command line, CI and components.

``prepline kfp upload | run | clone | wait | terminate | list | logs`` (see :func:`main`) and the
``run_pipeline`` component (the "N+1 runs" chaining of :mod:`prepline.pipelines.chained`) use
:class:`KfpClient`, a thin layer over ``kfp.Client`` that

* finds the host, namespace and bearer token the usual KFP ways (flags, ``KF_PIPELINES_ENDPOINT``,
  ``KF_PIPELINES_TOKEN``, a token file, the in-cluster service-account token);
* checks the server once (``GET /apis/v2beta1/healthz``, short timeout, no retry loop) before the
  SDK is built, and puts a timeout on every request;
* checks run parameters against the pipeline spec's root ``inputDefinitions`` before posting
  (names, types, required ones), converting ``--param k=v`` strings to the declared types;
* turns every SDK/HTTP error into a :mod:`prepline.errors` error with a message and a fix;
* waits on runs itself: ``kfp.Client.wait_for_run_completion`` never returns on CANCELED.

Exit codes of ``prepline kfp``: 0 success (``wait``: SUCCEEDED), 1 the run FAILED (or SKIPPED),
2 a usage/parameter error, 3 the run was CANCELED (or is CANCELING), 4 ``wait`` timed out,
5 the server could not be used (unreachable, 401/403, unknown id, refused request).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from prepline.errors import EXIT_CANCELED, EXIT_FAILED, EXIT_OK, EXIT_SERVICE, EXIT_TIMEOUT, EXIT_USAGE, ConfigError, PreplineError, RunFailed
from prepline.errors import ServiceError, TimedOut, exit_code

log = logging.getLogger("prepline")

ENV_ENDPOINT = "KF_PIPELINES_ENDPOINT"
ENV_UI_ENDPOINT = "KF_PIPELINES_UI_ENDPOINT"
ENV_TOKEN = "KF_PIPELINES_TOKEN"
#: kfp's own variable naming the (projected) service-account token file
ENV_TOKEN_FILE = "KF_PIPELINES_SA_TOKEN_PATH"
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
IN_CLUSTER_HOST = "http://ml-pipeline.kubeflow.svc.cluster.local:8888"

#: exit codes: the one mapping of prepline.errors (EXIT_API is its EXIT_SERVICE)
EXIT_API = EXIT_SERVICE

#: terminal run states and the exit code each maps to; CANCELING counts as canceled (it can stay
#: there for a long time on a real cluster, and the outcome is decided)
TERMINAL_STATES = {"SUCCEEDED": EXIT_OK, "FAILED": EXIT_FAILED, "SKIPPED": EXIT_FAILED, "CANCELED": EXIT_CANCELED,
                   "CANCELING": EXIT_CANCELED}
_TRANSIENT_STATUS = {0, 502, 503, 504}


# ----------------------------------------------------------------------------------------------
# errors


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


# ----------------------------------------------------------------------------------------------
# connection settings


@dataclass(frozen=True)
class Connection:
    host: str
    namespace: str = ""
    token: str | None = None
    token_file: str | None = None
    token_source: str = "none"
    request_timeout: float = 60.0
    connect_timeout: float = 10.0

    @property
    def ui(self) -> str:
        return (os.environ.get(ENV_UI_ENDPOINT) or self.host).rstrip("/")


def _normalize_host(host: str) -> str:
    host = host.strip().rstrip("/")
    if "://" not in host:
        local = any(h in host for h in ("localhost", "127.0.0.1", "[::1]", ".svc", ":8888"))
        host = ("http://" if local else "https://") + host
    if not host.startswith(("http://", "https://")):
        raise ConfigError(f"KFP host {host!r} is not an http(s) URL", "e.g. --host http://localhost:8888 or https://kubeflow.example.com/pipeline")
    return host


def resolve_connection(host: str | None = None, namespace: str | None = None, token: str | None = None,
                       token_file: str | None = None, env: dict | None = None, request_timeout: float = 60.0) -> Connection:
    """Host: ``host`` > ``$KF_PIPELINES_ENDPOINT`` > the in-cluster service when running in a pod.
    Token: ``token`` > ``$KF_PIPELINES_TOKEN`` > ``token_file`` > ``$KF_PIPELINES_SA_TOKEN_PATH`` >
    the in-cluster service-account token file when present > none. Token files are read on every
    request (projected tokens rotate)."""
    env = os.environ if env is None else env
    h = host or env.get(ENV_ENDPOINT)
    if not h:
        if env.get("KUBERNETES_SERVICE_HOST"):
            h = IN_CLUSTER_HOST
        else:
            raise ConfigError(
                "no Kubeflow Pipelines host given",
                f"pass --host (e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888` then --host http://localhost:8888) or set {ENV_ENDPOINT}",
            )
    conn: dict[str, Any] = {"host": _normalize_host(h), "namespace": namespace or "", "request_timeout": request_timeout}
    if token:
        conn.update(token=token.strip(), token_source="--token")
    elif env.get(ENV_TOKEN):
        conn.update(token=env[ENV_TOKEN].strip(), token_source=f"${ENV_TOKEN}")
    else:
        path, source, required = None, "none", False
        if token_file:
            path, source, required = token_file, f"--token-file {token_file}", True
        elif env.get(ENV_TOKEN_FILE):
            path, source, required = env[ENV_TOKEN_FILE], f"${ENV_TOKEN_FILE}={env[ENV_TOKEN_FILE]}", True
        elif Path(SA_TOKEN_PATH).is_file():
            path, source = SA_TOKEN_PATH, f"service-account token {SA_TOKEN_PATH}"
        if path:
            try:
                if not Path(path).read_text().strip():
                    raise ConfigError(f"token file {path} is empty", "point --token-file at a file holding the bearer token")
            except OSError as e:
                if required:
                    raise ConfigError(f"cannot read token file {path}: {e.strerror or e}", "check the path, or pass --token / $KF_PIPELINES_TOKEN") from None
                path, source = None, "none"
            conn.update(token_file=path, token_source=source)
    return Connection(**conn)


# ----------------------------------------------------------------------------------------------
# pipeline specs and parameters


def read_package(path: str | os.PathLike) -> list[dict]:
    """The YAML documents of a compiled pipeline file (pipeline spec [, platform spec]), checked
    strictly with the pipeline_spec protos."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"pipeline file {p} does not exist", "compile it first: prepline compile (files land in compiled/pipelines/)")
    if p.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"{p} is not a compiled pipeline YAML", "pass a .yaml file from compiled/pipelines/")
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}", "pass a file written by `prepline compile` or kfp's compiler") from None
    if not docs or not isinstance(docs[0], dict) or "root" not in docs[0] or "pipelineInfo" not in docs[0]:
        raise ConfigError(f"{p} is not a compiled pipeline (no pipelineInfo/root)", "pass a file from compiled/pipelines/, not a component")
    try:
        json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        for d in docs[1:]:
            json_format.ParseDict(d, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as e:
        raise ConfigError(f"{p} is not a valid pipeline spec: {e}", "recompile it with kfp 2.x") from None
    return docs


def _canonical(x):
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_canonical(v) for v in x]
    return x


def spec_docs(obj) -> list[dict]:
    """Normalize the shapes a pipeline spec travels in (list of YAML docs, a bare spec, or the
    ``{"pipeline_spec": ..., "platform_spec": ...}`` wrapper kfp sends) to ``[spec, platform?]``."""
    if not obj:
        return []
    if isinstance(obj, list):
        return [d for d in obj if d]
    if isinstance(obj, dict) and "pipeline_spec" in obj and "root" not in obj:
        return [obj["pipeline_spec"]] + ([obj["platform_spec"]] if obj.get("platform_spec") else [])
    return [obj]


def content_digest(obj) -> str:
    """sha256 of the canonical JSON of a pipeline spec (integral floats as ints): equal for the same
    pipeline however it was serialized."""
    docs = _canonical(spec_docs(obj))
    return hashlib.sha256(json.dumps(docs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def root_inputs(spec) -> dict[str, dict]:
    """``{name: {"type", "default", "optional"}}`` of a pipeline spec's root inputDefinitions parameters."""
    docs = spec_docs(spec)
    if not docs:
        return {}
    params = ((docs[0].get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    return {n: {"type": d.get("parameterType", "STRING"), "default": d.get("defaultValue"),
                "optional": bool(d.get("isOptional")) or "defaultValue" in d} for n, d in params.items()}


def spec_defaults(spec) -> dict:
    return {n: d["default"] for n, d in root_inputs(spec).items() if d["default"] is not None}


def parse_param_flags(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in items or []:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--param {kv!r} is not NAME=VALUE", "e.g. --param work_root=s3://bucket/work --param languages='[\"en\",\"ja\"]'")
        out[k.strip()] = v
    return out


def load_params_file(path: str) -> dict:
    """A YAML or JSON mapping of parameter values (JSON is YAML)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read parameters file {path}: {e.strerror or e}", "check the path given to --params-file") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"parameters file {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                          'write a JSON object, e.g. {"work_root": "s3://bucket/work"}') from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"parameters file {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}",
                          "write a mapping of parameter names to values, e.g. `work_root: s3://bucket/work`") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"parameters file {path} must hold a mapping of parameter names to values, got {type(data).__name__}",
                          "e.g. `work_root: s3://bucket/work` / {\"work_root\": \"s3://bucket/work\"}")
    return data


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _coerce(name: str, value, ptype: str):
    def bad(expect: str):
        return ConfigError(f"parameter {name} must be {expect}, got {value!r}", f"pass {name} as {expect}")

    if ptype == "STRING":
        if isinstance(value, str):
            return value
        return json.dumps(value)  # a list/mapping/number for a string parameter (the *_json ones): its JSON
    if ptype == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise bad("true or false")
    if ptype == "NUMBER_INTEGER":
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise bad("an integer")
    if ptype == "NUMBER_DOUBLE":
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(str(value).strip())
        except ValueError:
            raise bad("a number") from None
    if ptype in ("LIST", "STRUCT"):
        want, label = (list, "a JSON list") if ptype == "LIST" else (dict, "a JSON object")
        if isinstance(value, str):
            import yaml

            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                try:
                    value = yaml.safe_load(value)
                except yaml.YAMLError:
                    raise bad(label) from None
        if isinstance(value, want):
            return value
        raise bad(label)
    raise ConfigError(f"parameter {name} has type {ptype}, which cannot be set from a run's parameters", "leave it out")


def check_parameters(pipeline: str, inputs: dict[str, dict], values: dict, require: bool = True) -> dict:
    """Check ``values`` against the root inputs of ``pipeline`` and convert them to the declared
    types (text from ``--param`` is parsed; a list/mapping for a STRING parameter becomes its JSON).
    Unknown names and missing required ones fail here, before anything is posted."""
    unknown = sorted(set(values) - set(inputs))
    if unknown:
        raise ConfigError(
            f"pipeline {pipeline} has no parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
            f"its parameters: {', '.join(sorted(inputs)) or '(none)'}",
        )
    out = {k: _coerce(k, v, inputs[k]["type"]) for k, v in values.items()}
    if require:
        missing = sorted(n for n, d in inputs.items() if not d["optional"] and n not in out)
        if missing:
            raise ConfigError(f"pipeline {pipeline} needs parameter{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                              "pass " + " ".join(f"--param {m}=..." for m in missing))
    return out


def gather_parameters(flags: list[str] | None, params_file: str | None) -> dict:
    """Values from a parameters file, then ``--param`` flags (flags win)."""
    values = load_params_file(params_file) if params_file else {}
    values.update(parse_param_flags(flags))
    return values


# ----------------------------------------------------------------------------------------------
# the client


def _server_message(body) -> str:
    if not body:
        return ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        d = json.loads(body)
    except (ValueError, TypeError):
        text = str(body).strip()
        return text[:300] if not text.lstrip().startswith("<") else "an HTML page (a login page or proxy?)"
    if isinstance(d, dict):
        return str(d.get("message") or d.get("error") or d.get("error_message") or d)[:500]
    return str(d)[:300]


def _run_state(run) -> str:
    return (getattr(run, "state", None) or "RUNTIME_STATE_UNSPECIFIED").upper()


def _iso(t) -> str | None:
    if t is None:
        return None
    return t.isoformat() if hasattr(t, "isoformat") else str(t)


class KfpClient:
    """``kfp.Client`` with checked connections, typed errors and waits that end on every terminal state."""

    def __init__(self, conn: Connection, out=None):
        self.conn = conn
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
            msg = _server_message(e.body) or (e.reason or "").strip()
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
        import urllib3

        cfg = kfp_server_api.Configuration(host=self.conn.host)
        cfg.retries = urllib3.Retry(total=1, connect=1, read=0, redirect=0, status=0)
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
            self._limit_request_time(c)
            self._client = c
        return self._client

    def _limit_request_time(self, c) -> None:
        """kfp.Client sends no timeout (a silent server would hang us): give each request one."""
        rest = getattr(getattr(getattr(c, "_run_api", None), "api_client", None), "rest_client", None)
        if rest is None:
            return
        orig, limit = rest.request, (self.conn.connect_timeout, self.conn.request_timeout)

        def request(*a, _request_timeout=None, **kw):
            return orig(*a, _request_timeout=_request_timeout or limit, **kw)

        rest.request = request

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
              pipeline_root: str | None = None, service_account: str | None = None):
        """Start a run from a compiled file (spec sent inline) or an uploaded pipeline (+version), with
        parameters checked against the pipeline's root inputs first."""
        values = values or {}
        if bool(package) == bool(pipeline):
            raise ConfigError("give either a compiled pipeline file or --pipeline NAME", "prepline kfp run compiled/pipelines/doc_id.yaml, or --pipeline doc-id")
        if package:
            docs = read_package(package)
            label = docs[0]["pipelineInfo"]["name"]
            params = check_parameters(label, root_inputs(docs), values)
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

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 5.0, on_change: Callable | None = None,
             transient_retries: int = 5):
        """Poll the run until a terminal state (SUCCEEDED, FAILED, SKIPPED, CANCELING, CANCELED);
        raise KfpTimeout after ``timeout`` seconds. Transient errors (no answer, 502-504) are retried."""
        t0 = time.monotonic()
        last, errors = None, 0
        while True:
            try:
                run = self.get_run(run_id)
                errors = 0
            except KfpError as e:
                errors += 1
                if e.status not in _TRANSIENT_STATUS or isinstance(e, KfpNotFound) or errors > transient_retries:
                    raise
                log.warning("run %s: %s (retrying)", run_id, e.message)
                time.sleep(min(poll, 2.0 ** errors))
                continue
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


# ----------------------------------------------------------------------------------------------
# chaining: start a pre-uploaded pipeline as a child run and wait for it (the run_pipeline component)


def child_run_name(pipeline_name: str, parent_run_id: str, item: str = "") -> str:
    return f"{pipeline_name}{'-' + item if item else ''} (child of {parent_run_id})"


def run_child(
    client: KfpClient,
    pipeline_name: str,
    parameters: dict | None = None,
    *,
    pipeline_version: str = "",
    parent_run_id: str = "",
    inherit_parameters: bool = True,
    run_id_parameter: str = "run_id",
    item: str = "",
    item_parameter: str = "",
    run_name: str = "",
    experiment: str = "",
    timeout: float | None = None,
    poll: float = 10.0,
    out=None,
) -> dict:
    """Start ``pipeline_name`` (uploaded; ``pipeline_version`` or the newest) and wait for it.

    Parameters of the child, later ones winning: the parent run's parameter values that the child
    also declares (``inherit_parameters``, read from the parent run through the API, so nothing
    depends on placeholder resolution inside struct inputs); ``parameters``; ``parent_run_id`` as
    ``run_id_parameter``; ``item`` as ``item_parameter`` (a ParallelFor item). All are checked
    against the child's root inputs before the run is posted. With a parent, a child run of the same
    name that SUCCEEDED is reused and one still going is waited for (so a retried step or a retried
    parent run does not start a stage twice). Raises ChildRunFailed unless the child SUCCEEDED."""
    out = out if out is not None else sys.stdout
    p = client.pipeline(pipeline_name)
    v = client.version(p, pipeline_version)
    spec = client.version_spec(v)
    if spec is None:
        raise KfpError(f"the server returned no pipeline spec for {pipeline_name}/{v.display_name}", "re-upload the pipeline")
    inputs = root_inputs(spec)
    params: dict = {}
    parent = client.get_run(parent_run_id) if parent_run_id else None
    if parent is not None and inherit_parameters:
        params.update({k: val for k, val in client.effective_parameters(parent).items() if k in inputs})
    params.update(parameters or {})
    if parent_run_id and run_id_parameter:
        if run_id_parameter not in inputs:
            raise ConfigError(f"pipeline {pipeline_name} ({v.display_name}) has no parameter {run_id_parameter} to receive the parent's run id",
                              "upload the pipeline compiled by this prepline version (prepline kfp upload compiled/pipelines/...), or pass run_id_parameter=''")
        params[run_id_parameter] = parent_run_id
    if item_parameter:
        params[item_parameter] = item
    params = check_parameters(pipeline_name, inputs, params)
    exp_id = client.experiment(experiment).experiment_id if experiment else (parent.experiment_id if parent else client.experiment("Default").experiment_id)
    name = run_name or (child_run_name(pipeline_name, parent_run_id, item) if parent_run_id else
                        f"{pipeline_name}{'-' + item if item else ''} {dt.datetime.now().strftime('%Y-%m-%d %H-%M-%S')}")

    run = None
    if parent_run_id:
        existing, _, _ = client.list_runs(name=name, page_size=20)
        existing = [r for r in existing if r.display_name == name and r.experiment_id == exp_id]
        for r in existing:
            if _run_state(r) == "SUCCEEDED":
                print(f"[prepline] {name}: run {r.run_id} already SUCCEEDED; not started again", file=out, flush=True)
                return {"run_id": r.run_id, "state": "SUCCEEDED", "reused": True, "url": f"{client.conn.ui}/#/runs/details/{r.run_id}"}
        going = [r for r in existing if _run_state(r) not in TERMINAL_STATES]
        if going:
            run = going[0]
            print(f"[prepline] {name}: waiting for run {run.run_id} ({_run_state(run)}) started earlier", file=out, flush=True)
    if run is None:
        run = client.create_run(experiment_id=exp_id, display_name=name, parameters=params, pipeline_id=p.pipeline_id,
                                version_id=v.pipeline_version_id)
        print(f"[prepline] started {pipeline_name} ({v.display_name}) as run {run.run_id}: {client.conn.ui}/#/runs/details/{run.run_id}",
              file=out, flush=True)
    url = f"{client.conn.ui}/#/runs/details/{run.run_id}"

    def report(r):
        print(f"[prepline] {name}: {_run_state(r)}", file=out, flush=True)

    def on_term(signum, frame):  # the parent step is being stopped: stop the child too
        try:
            client.terminate(run.run_id)
            print(f"[prepline] terminated child run {run.run_id}", file=out, flush=True)
        finally:
            raise KeyboardInterrupt

    old_handler = None
    with contextlib.suppress(ValueError):  # only the main thread may set signal handlers
        old_handler = signal.signal(signal.SIGTERM, on_term)
    try:
        final = client.wait(run.run_id, timeout=timeout, poll=poll, on_change=report)
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
    state = _run_state(final)
    if state != "SUCCEEDED":
        why = final.error.message if final.error and final.error.message else "see the child run"
        raise ChildRunFailed(f"child run {name} ({run.run_id}) of pipeline {pipeline_name} ended {state}: {why}", f"open {url}")
    return {"run_id": run.run_id, "state": state, "reused": False, "url": url}


# ----------------------------------------------------------------------------------------------
# the `prepline kfp` command


def _conn_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("connection")
    g.add_argument("--host", default=None, help=f"KFP API endpoint (default: ${ENV_ENDPOINT}, or the in-cluster service in a pod)")
    g.add_argument("--namespace", default=None, help="user namespace (multi-user KFP)")
    g.add_argument("--token", default=None, help=f"bearer token (default: ${ENV_TOKEN}, then --token-file, then {SA_TOKEN_PATH} when present)")
    g.add_argument("--token-file", default=None, help=f"file holding the bearer token, re-read on each request (default: ${ENV_TOKEN_FILE})")
    g.add_argument("--request-timeout", type=float, default=60.0, help="seconds per API request (default 60)")
    ap.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="prepline kfp", description="Operate a Kubeflow Pipelines server: upload, run, clone, wait, list, logs.",
                                 epilog="exit codes: 0 ok/SUCCEEDED, 1 FAILED, 2 usage or parameter error, 3 CANCELED, 4 wait timed out, 5 server error")
    sub = ap.add_subparsers(dest="action", required=True, metavar="ACTION")

    _conn_args(sub.add_parser("version", help="the server's KFP release and what of prepline's pipelines it cannot run (docs/compatibility.md)"))
    u = sub.add_parser("upload", help="upload a compiled pipeline (new pipeline, or new version of the pipeline of that name); idempotent")
    u.add_argument("file", help="compiled pipeline YAML, e.g. compiled/pipelines/doc_id.yaml")
    u.add_argument("--name", default=None, help="pipeline name (default: the name compiled into the file, e.g. doc-id)")
    u.add_argument("--version", default=None, help="version name (default: <name>-<first 12 hex of the content sha256>)")
    u.add_argument("--description", default=None)
    _conn_args(u)

    r = sub.add_parser("run", help="start a run from a compiled file or an uploaded pipeline")
    r.add_argument("file", nargs="?", default=None, help="compiled pipeline YAML (spec sent inline); or use --pipeline")
    r.add_argument("--pipeline", default=None, help="name of an uploaded pipeline")
    r.add_argument("--version", default="", help="its version name or id (default: the newest)")
    _run_opts(r)
    _conn_args(r)

    c = sub.add_parser("clone", help="what the UI's Clone run does: same pipeline (version) and runtime config, optional --param overrides")
    c.add_argument("run_id")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter; repeat")
    c.add_argument("--params-file", default=None, help="YAML/JSON mapping of overrides (flags win)")
    c.add_argument("--run-name", default=None, help="default: 'Clone of <old name>'")
    c.add_argument("--experiment", default=None, help="default: the old run's experiment")
    c.add_argument("--wait", action="store_true")
    c.add_argument("--timeout", type=float, default=None)
    c.add_argument("--poll", type=float, default=5.0)
    _conn_args(c)

    w = sub.add_parser("wait", help="wait for a run: exit 0 SUCCEEDED, 1 FAILED, 3 CANCELED, 4 timeout")
    w.add_argument("run_id")
    w.add_argument("--timeout", type=float, default=None, help="seconds (default: no limit)")
    w.add_argument("--poll", type=float, default=5.0, help="seconds between polls (default 5)")
    _conn_args(w)

    t = sub.add_parser("terminate", help="stop a run (it ends CANCELED)")
    t.add_argument("run_id")
    _conn_args(t)

    li = sub.add_parser("list", help="list runs, pipelines, versions or experiments (paged)")
    li.add_argument("what", choices=("runs", "pipelines", "versions", "experiments"))
    li.add_argument("--pipeline", default=None, help="versions: of this pipeline (name)")
    li.add_argument("--experiment", default=None, help="runs: of this experiment (name)")
    li.add_argument("--name", default=None, help="runs: only this display name")
    li.add_argument("--page-size", type=int, default=20)
    li.add_argument("--page-token", default="", help="from a previous answer's next_page_token")
    li.add_argument("--all", action="store_true", help="follow next_page_token to the end")
    li.add_argument("--sort-by", default="created_at desc")
    _conn_args(li)

    lg = sub.add_parser("logs", help="a run's tasks, states, pods and errors (the KFP API serves no log text; see docs/kfp.md)")
    lg.add_argument("run_id")
    _conn_args(lg)
    return ap


def _run_opts(r: argparse.ArgumentParser) -> None:
    r.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter; repeat (JSON for lists/objects)")
    r.add_argument("--params-file", default=None, help="YAML/JSON mapping of parameters (flags win)")
    r.add_argument("--experiment", default="Default", help="experiment name, created if missing (default: Default)")
    r.add_argument("--run-name", default=None)
    r.add_argument("--pipeline-root", default=None, help="where KFP stores task outputs (default: the server's)")
    r.add_argument("--service-account", default=None)
    r.add_argument("--wait", action="store_true", help="then wait like `prepline kfp wait` (same exit codes)")
    r.add_argument("--timeout", type=float, default=None, help="with --wait: seconds")
    r.add_argument("--poll", type=float, default=5.0, help="with --wait: seconds between polls")


class _Out:
    def __init__(self, as_json: bool):
        self.json = as_json

    def emit(self, obj: dict, human: str) -> None:
        if self.json:
            print(json.dumps(obj, indent=2, default=str))
        else:
            print(human)

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)


def _version(kc: KfpClient, out: _Out) -> int:
    """``prepline kfp version``: the server's release and what of prepline's pipelines it cannot run."""
    from prepline.compat import kfp_backend_notes

    info = kc.healthz()
    notes = kfp_backend_notes(info.get("tag_name"))
    out.emit({**info, "notes": notes}, "\n".join([f"KFP backend {info.get('tag_name') or 'unknown'} at {kc.conn.host}"] + notes
                                                 or ["every feature prepline's pipelines use is supported"]))
    return EXIT_OK


def _wait_and_report(kc: KfpClient, out: _Out, run_id: str, timeout, poll, extra: dict | None = None) -> int:
    def change(r):
        out.note(f"run {run_id}: {_run_state(r)}")

    try:
        run = kc.wait(run_id, timeout=timeout, poll=poll, on_change=change)
    except KfpTimeout as e:
        cur = kc.get_run(run_id)
        out.emit({**(extra or {}), **kc.run_dict(cur), "timed_out": True, "exit_code": EXIT_TIMEOUT},
                 f"{run_id}\t{_run_state(cur)}\ttimed out")
        out.note(f"error: {e.message}\n  fix: {e.fix}")
        return EXIT_TIMEOUT
    code = TERMINAL_STATES[_run_state(run)]
    d = {**(extra or {}), **kc.run_dict(run), "exit_code": code}
    out.emit(d, f"{run.run_id}\t{_run_state(run)}\t{d['url']}")
    if code and run.error and run.error.message:
        out.note(f"run error: {run.error.message}")
    return code


def main(argv: list[str]) -> int:
    """``prepline kfp ...``; returns the exit code (errors are printed, never raised)."""
    ap = _parser()
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    out = _Out(a.json)
    try:
        return _dispatch(a, out)
    except PreplineError as e:
        code = exit_code(e)
        kind = type(e).__name__
        if out.json:
            print(json.dumps({"error": e.message, "fix": e.fix, "kind": kind, "exit_code": code}, indent=2))
        print(f"error: {e.message}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr)
        return code


def _dispatch(a, out: _Out) -> int:
    kc = KfpClient(resolve_connection(a.host, a.namespace, a.token, a.token_file, request_timeout=a.request_timeout))
    if a.action == "version":
        return _version(kc, out)
    if a.action in ("upload", "run", "clone"):  # say when the backend is too old for what the pipelines use
        from prepline.compat import kfp_backend_notes

        for note in kfp_backend_notes(kc.healthz().get("tag_name")):
            out.note(f"warning: {note}")
    if a.action == "upload":
        r = kc.upload(a.file, a.name, a.version, a.description)
        what = "created pipeline" if r["created_pipeline"] else "created version" if r["created_version"] else f"unchanged ({r.get('reason')})"
        out.emit(r, f"{r['pipeline_name']}\t{r['version_name']}\t{what}\t{r['url']}")
        return EXIT_OK
    if a.action in ("run", "clone"):
        values = gather_parameters(a.param, a.params_file)
        if a.action == "run":
            run = kc.start(package=a.file, pipeline=a.pipeline, version=a.version, values=values, experiment=a.experiment,
                           run_name=a.run_name, pipeline_root=a.pipeline_root, service_account=a.service_account)
        else:
            run = kc.clone(a.run_id, values, run_name=a.run_name, experiment=a.experiment)
        if a.wait:
            out.note(f"started run {run.run_id}: {kc.conn.ui}/#/runs/details/{run.run_id}")
            return _wait_and_report(kc, out, run.run_id, a.timeout, a.poll)
        d = kc.run_dict(run)
        out.emit(d, f"{run.run_id}\t{d['display_name']}\t{d['url']}")
        return EXIT_OK
    if a.action == "wait":
        return _wait_and_report(kc, out, a.run_id, a.timeout, a.poll)
    if a.action == "terminate":
        kc.terminate(a.run_id)
        d = kc.run_dict(kc.get_run(a.run_id))
        out.emit(d, f"{a.run_id}\t{d['state']}")
        return EXIT_OK
    if a.action == "list":
        return _list(kc, a, out)
    if a.action == "logs":
        run = kc.get_run(a.run_id)
        tasks = kc.tasks(run)
        ns = kc.conn.namespace or "<namespace>"
        d = {**kc.run_dict(run), "tasks": tasks,
             "state_history": [{"state": s.state, "time": _iso(s.update_time)} for s in (run.state_history or [])],
             "log_commands": [f"kubectl logs -n {ns} {pod} -c main" for t in tasks for pod in t["pods"]]}
        lines = [f"run {run.run_id} ({run.display_name}): {_run_state(run)}" + (f" - {d['error']}" if d["error"] else "")]
        for t in tasks:
            lines.append(f"  {t['display_name']}\t{t['state']}\t{' '.join(t['pods']) or '-'}" + (f"\t{t['error']}" if t["error"] else ""))
        lines.append("the KFP API serves no log text: read a pod's log with `kubectl logs -n <namespace> <pod> -c main` "
                     "while it exists, or in the UI (archived logs)")
        out.emit(d, "\n".join(lines))
        return EXIT_OK
    raise ConfigError(f"unknown action {a.action}", "see prepline kfp --help")  # pragma: no cover - argparse guards it


def _list(kc: KfpClient, a, out: _Out) -> int:
    items: list[dict] = []
    token, total = a.page_token, None
    while True:
        if a.what == "runs":
            runs, token, total = kc.list_runs(a.experiment, a.page_size, token, a.sort_by, a.name)
            items += [kc.run_dict(r) for r in runs]
        elif a.what == "pipelines":
            with kc.call("list pipelines"):
                r = kc.client.list_pipelines(page_token=token, page_size=a.page_size, sort_by=a.sort_by, namespace=kc._ns())
            items += [{"pipeline_id": p.pipeline_id, "display_name": p.display_name, "created_at": _iso(p.created_at),
                       "description": p.description} for p in r.pipelines or []]
            token, total = r.next_page_token or "", r.total_size
        elif a.what == "experiments":
            with kc.call("list experiments"):
                r = kc.client.list_experiments(page_token=token, page_size=a.page_size, sort_by=a.sort_by, namespace=kc._ns())
            items += [{"experiment_id": e.experiment_id, "display_name": e.display_name, "created_at": _iso(e.created_at)}
                      for e in r.experiments or []]
            token, total = r.next_page_token or "", r.total_size
        else:
            if not a.pipeline:
                raise ConfigError("list versions needs --pipeline NAME", "prepline kfp list versions --pipeline doc-id")
            p = kc.pipeline(a.pipeline)
            with kc.call(f"list versions of {a.pipeline}"):
                r = kc.client.list_pipeline_versions(p.pipeline_id, page_token=token, page_size=a.page_size, sort_by=a.sort_by)
            items += [{"pipeline_version_id": v.pipeline_version_id, "display_name": v.display_name, "created_at": _iso(v.created_at)}
                      for v in r.pipeline_versions or []]
            token, total = r.next_page_token or "", r.total_size
        if not (a.all and token):
            break
    key = {"runs": "run_id", "pipelines": "pipeline_id", "experiments": "experiment_id", "versions": "pipeline_version_id"}[a.what]
    human = "\n".join(f"{i[key]}\t{i['display_name']}" + (f"\t{i['state']}" if "state" in i else "") for i in items)
    if token:
        human += f"\n(more: --page-token {token})"
    out.emit({"items": items, "next_page_token": token, "total_size": total}, human)
    return EXIT_OK
