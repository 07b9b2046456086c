"""A local fake of the Kubeflow Pipelines REST API (v2beta1) for tests: real HTTP on 127.0.0.1.

Endpoints (the ones kfp.Client and prepline use): healthz; pipelines upload / upload_version /
list / get / versions list / version get; experiments list / create / get; runs create / get /
list / terminate. Shapes come from the kfp-server-api models: every JSON body received is checked
against the model's ``attribute_map``/``openapi_types`` (unknown fields, wrong types and enum
values are refused with 400, as protojson would), and every answer is checked the same way before
it is sent. Inline pipeline specs and uploaded files are parsed strictly with the pipeline_spec
protos. Errors answer as ``google.rpc.Status`` JSON (``{"code", "message", "details"}``).

Behaviour (and what it does not do):
* Runs advance one state per ``GET /runs/{id}``: PENDING → RUNNING → SUCCEEDED by default.
  ``fake.outcomes[<pipeline name or run display name substring>] = "FAILED" | "CANCELED" | "HANG"``
  changes the end (HANG stays RUNNING); ``fake.steps`` sets how many polls each state lasts.
  Terminate sets CANCELING, the next poll CANCELED. Nothing is executed.
* Uploading a pipeline creates its first version named after the pipeline (as the KFP API server
  does); duplicate pipeline names and duplicate version names in a pipeline answer 409.
* Lists page with ``page_size`` / ``page_token`` (opaque) / ``next_page_token`` and ``total_size``,
  sort by ``created_at``/``display_name``/``name`` (``desc`` allowed), and filter with
  EQUALS / NOT_EQUALS / IS_SUBSTRING predicates on string fields (operation as name or number,
  ``stringValue`` or ``string_value``).
* ``token=`` demands ``authorization: Bearer <token>`` (401 otherwise, healthz included);
  ``forbid`` namespaces answer 403; ``fail_next(regex, status)`` injects errors. List versions
  answers without ``pipeline_spec`` (GET of one version has it) so clients must fetch it.
* It does not check parameter values against the pipeline (the real server defers that to the
  driver), has no recurring runs, archive, delete, artifacts or logs.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import kfp_server_api.models as M
import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

API = "/apis/v2beta1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"}
# google.rpc.Code
CODE = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 502: 14, 503: 14, 504: 4}


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# -- model validation (kfp_server_api.models) -------------------------------------------------------


def _camel(s: str) -> str:
    head, *rest = s.split("_")
    return head + "".join(w.title() for w in rest)


def _model(name: str):
    cls = getattr(M, name, None)
    if cls is None:
        raise KeyError(f"no kfp_server_api model {name}")
    return cls


def validate(obj, type_name: str, path: str = "$", camel_ok: bool = False) -> None:
    """Check a JSON value against a kfp_server_api type ('str', 'list[V2beta1Run]', 'V2beta1Run', ...).
    Raises ValueError naming the path. ``camel_ok``: also accept lowerCamel field names (protojson)."""
    if obj is None:
        return
    m = re.fullmatch(r"list\[(.*)\]", type_name)
    if m:
        if not isinstance(obj, list):
            raise ValueError(f"{path}: expected a list, got {type(obj).__name__}")
        for i, v in enumerate(obj):
            validate(v, m.group(1), f"{path}[{i}]", camel_ok)
        return
    m = re.fullmatch(r"dict\(str, (.*)\)", type_name)
    if m:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: expected an object, got {type(obj).__name__}")
        for k, v in obj.items():
            validate(v, m.group(1), f"{path}.{k}", camel_ok)
        return
    if type_name == "object":
        return
    if type_name == "str":
        if not isinstance(obj, str):
            raise ValueError(f"{path}: expected a string, got {type(obj).__name__}")
        return
    if type_name == "int":
        if isinstance(obj, bool) or not (isinstance(obj, int) or (isinstance(obj, str) and re.fullmatch(r"-?\d+", obj))):
            raise ValueError(f"{path}: expected an integer, got {obj!r}")
        return
    if type_name == "bool":
        if not isinstance(obj, bool):
            raise ValueError(f"{path}: expected a boolean, got {obj!r}")
        return
    if type_name == "datetime":
        try:
            datetime.fromisoformat(str(obj).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{path}: expected an RFC 3339 time, got {obj!r}") from None
        return
    cls = _model(type_name)
    if not cls.openapi_types:  # an enum
        allowed = list(getattr(cls, "allowable_values", []))
        if isinstance(obj, int) and not isinstance(obj, bool) and camel_ok and 0 <= obj < len(allowed):
            return
        if obj not in allowed:
            raise ValueError(f"{path}: {obj!r} is not one of {allowed}")
        return
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected an object ({type_name}), got {type(obj).__name__}")
    fields = {cls.attribute_map[a]: t for a, t in cls.openapi_types.items()}
    if camel_ok:
        fields.update({_camel(k): t for k, t in list(fields.items())})
    for k, v in obj.items():
        if k not in fields:
            raise ValueError(f"{path}: unknown field {k!r} for {type_name} (fields: {', '.join(sorted(cls.attribute_map.values()))})")
        validate(v, fields[k], f"{path}.{k}", camel_ok)


def parse_spec(obj, where: str) -> dict:
    """A pipeline spec as KFP stores it: a bare PipelineSpec, or {pipeline_spec, platform_spec}."""
    try:
        if isinstance(obj, dict) and "pipeline_spec" in obj and "root" not in obj:
            json_format.ParseDict(obj["pipeline_spec"], pipeline_spec_pb2.PipelineSpec())
            if obj.get("platform_spec"):
                json_format.ParseDict(obj["platform_spec"], pipeline_spec_pb2.PlatformSpec())
            return obj
        json_format.ParseDict(obj, pipeline_spec_pb2.PipelineSpec())
        return obj
    except (json_format.ParseError, TypeError, AttributeError) as e:
        raise ApiError(400, f"{where}: invalid pipeline spec: {e}") from None


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- state -------------------------------------------------------------------------------------------


@dataclass
class Run:
    body: dict
    script: list[str]
    pos: int = 0
    history: list[dict] = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.script[min(self.pos, len(self.script) - 1)]


class FakeKfp:
    def __init__(self, token: str | None = None, forbid: tuple[str, ...] = (), multi_user: bool = False, steps: int = 1,
                 default_page_size: int = 20, server_version: str = "2.17.0"):
        self.token, self.forbid, self.multi_user, self.steps = token, set(forbid), multi_user, steps
        self.server_version = server_version
        self.default_page_size = default_page_size
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}  # version id -> version (with pipeline_spec)
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, Run] = {}
        self.outcomes: dict[str, str] = {}
        self.requests: list[dict] = []
        self._fail: list[tuple[re.Pattern, int, int]] = []
        self._lock = threading.RLock()
        self._clock = datetime(2026, 1, 1, tzinfo=timezone.utc)
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "FakeKfp":
        fake = self

        class Handler(_Handler):
            pass

        Handler.fake = fake
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- test hooks ---------------------------------------------------------------------------
    def fail_next(self, path_regex: str, status: int, times: int = 1) -> None:
        self._fail.append((re.compile(path_regex), status, times))

    def calls(self, method: str, path_regex: str = "") -> list[dict]:
        return [r for r in self.requests if r["method"] == method and re.search(path_regex, r["path"])]

    def run(self, run_id: str) -> dict:
        return self.runs[run_id].body

    def _tick(self) -> str:
        # monotonic, distinct creation times (sort order is then well defined)
        self._clock += timedelta(seconds=1)
        return self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _script(self, body: dict, pipeline_name: str) -> list[str]:
        end = "SUCCEEDED"
        for key, outcome in self.outcomes.items():
            if key == pipeline_name or key in (body.get("display_name") or ""):
                end = outcome
        pending, running = ["PENDING"] * self.steps, ["RUNNING"] * self.steps
        if end == "HANG":
            return pending + running
        return pending + running + [end]

    # -- dispatch -----------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, headers, raw: bytes) -> tuple[int, dict, str | None]:
        """Returns (status, body, response model name)."""
        with self._lock:
            for i, (rx, status, times) in enumerate(self._fail):
                if rx.search(path) and times > 0:
                    self._fail[i] = (rx, status, times - 1)
                    raise ApiError(status, f"injected {status}")
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthenticated: missing or invalid bearer token" if headers.get("authorization") else
                           "Unauthenticated: request has no authorization header")
        ns = query.get("namespace")
        if ns and ns in self.forbid:
            raise ApiError(403, f"PermissionDenied: user may not access namespace {ns}")
        if not path.startswith(API + "/"):
            raise ApiError(404, f"Not Found: {path}")
        p = path[len(API):]
        body = None
        ctype = headers.get("content-type", "")
        if raw and ctype.startswith("application/json"):
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ApiError(400, f"invalid JSON body: {e}") from None
        with self._lock:
            return self._route(method, p, query, body, raw, ctype)

    def _route(self, method, p, q, body, raw, ctype):
        if method == "GET" and p == "/healthz":
            # the HTTP handler of backend/src/apiserver/main.go answers healthz with the release (TAG_NAME) too
            return 200, {"commit_sha": "fake", "tag_name": self.server_version, "multi_user": self.multi_user,
                         "pipeline_store": "database"}, "object"  # a plain JSON handler, not the gRPC model
        if method == "POST" and p == "/pipelines/upload":
            return self._upload(q, raw, ctype, None)
        if method == "POST" and p == "/pipelines/upload_version":
            return self._upload(q, raw, ctype, q.get("pipelineid") or "")
        if method == "GET" and p == "/pipelines":
            items = [x for x in self.pipelines.values() if not q.get("namespace") or x.get("namespace") == q["namespace"]]
            return self._page(items, q, "pipelines", "V2beta1ListPipelinesResponse", "V2beta1Pipeline")
        m = re.fullmatch(r"/pipelines/([^/]+)", p)
        if method == "GET" and m:
            return 200, self._pipeline(m.group(1)), "V2beta1Pipeline"
        m = re.fullmatch(r"/pipelines/([^/]+)/versions", p)
        if method == "GET" and m:
            self._pipeline(m.group(1))
            items = [{k: v for k, v in x.items() if k != "pipeline_spec"} for x in self.versions.values() if x["pipeline_id"] == m.group(1)]
            return self._page(items, q, "pipeline_versions", "V2beta1ListPipelineVersionsResponse", "V2beta1PipelineVersion")
        m = re.fullmatch(r"/pipelines/([^/]+)/versions/([^/]+)", p)
        if method == "GET" and m:
            self._pipeline(m.group(1))
            v = self.versions.get(m.group(2))
            if not v or v["pipeline_id"] != m.group(1):
                raise ApiError(404, f"NotFound: pipeline version {m.group(2)} not found")
            return 200, v, "V2beta1PipelineVersion"
        if p == "/experiments" and method == "GET":
            items = [x for x in self.experiments.values() if not q.get("namespace") or x.get("namespace") == q["namespace"]]
            return self._page(items, q, "experiments", "V2beta1ListExperimentsResponse", "V2beta1Experiment")
        if p == "/experiments" and method == "POST":
            return self._create_experiment(body)
        m = re.fullmatch(r"/experiments/([^/:]+)", p)
        if method == "GET" and m:
            e = self.experiments.get(m.group(1))
            if not e:
                raise ApiError(404, f"NotFound: experiment {m.group(1)} not found")
            return 200, e, "V2beta1Experiment"
        if p == "/runs" and method == "POST":
            return self._create_run(body, q)
        if p == "/runs" and method == "GET":
            items = [r.body for r in self.runs.values()
                     if (not q.get("experiment_id") or r.body.get("experiment_id") == q["experiment_id"])
                     and (not q.get("namespace") or self.experiments.get(r.body["experiment_id"], {}).get("namespace") == q["namespace"])]
            return self._page(items, q, "runs", "V2beta1ListRunsResponse", "V2beta1Run")
        m = re.fullmatch(r"/runs/([^/:]+)", p)
        if method == "GET" and m:
            return 200, self._poll(m.group(1)), "V2beta1Run"
        m = re.fullmatch(r"/runs/([^/:]+):terminate", p)
        if method == "POST" and m:
            r = self._get_run(m.group(1))
            if r.state not in TERMINAL:
                r.script, r.pos = ["CANCELING", "CANCELED"], 0
                self._sync(r)
            return 200, {}, None
        raise ApiError(404, f"Not Found: {method} {API}{p}")

    # -- pipelines ----------------------------------------------------------------------------
    def _pipeline(self, pid: str) -> dict:
        x = self.pipelines.get(pid)
        if not x:
            raise ApiError(404, f"NotFound: pipeline {pid} not found")
        return x

    def _upload(self, q, raw, ctype, pipeline_id):
        if not ctype.startswith("multipart/form-data"):
            raise ApiError(400, "expected a multipart/form-data upload")
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
        files = [part for part in msg.iter_parts() if part.get_param("name", header="content-disposition") == "uploadfile"]
        if not files:
            raise ApiError(400, "InvalidArgument: no uploadfile in the form")
        filename = files[0].get_filename() or ""
        if not filename.endswith((".yaml", ".yml", ".zip", ".tar.gz", ".tgz")):
            raise ApiError(400, f"InvalidArgument: unexpected file type {filename}")
        try:
            docs = [d for d in yaml.safe_load_all(files[0].get_payload(decode=True)) if d]
        except yaml.YAMLError as e:
            raise ApiError(400, f"InvalidArgument: file is not YAML: {e}") from None
        if not docs:
            raise ApiError(400, "InvalidArgument: empty pipeline file")
        spec = docs[0] if len(docs) == 1 else {"pipeline_spec": docs[0], "platform_spec": {k: v for d in docs[1:] for k, v in d.items()}}
        parse_spec(spec, filename)
        now = self._tick()
        if pipeline_id is None:
            name = q.get("name") or q.get("display_name") or docs[0].get("pipelineInfo", {}).get("name")
            ns = q.get("namespace") or ""
            if any(x["name"] == name and x.get("namespace", "") == ns for x in self.pipelines.values()):
                raise ApiError(409, f"AlreadyExists: a pipeline named {name} already exists")
            pid = str(uuid.uuid4())
            pipe = {"pipeline_id": pid, "name": name, "display_name": q.get("display_name") or name, "created_at": now}
            if q.get("description"):
                pipe["description"] = q["description"]
            if ns:
                pipe["namespace"] = ns
            self.pipelines[pid] = pipe
            self._add_version(pid, name, q.get("display_name") or name, q.get("description"), spec, now)
            return 200, pipe, "V2beta1Pipeline"
        if not pipeline_id:
            raise ApiError(400, "InvalidArgument: pipelineid is required")
        self._pipeline(pipeline_id)
        name = q.get("name") or q.get("display_name")
        if not name:
            raise ApiError(400, "InvalidArgument: a version name is required")
        if any(v["pipeline_id"] == pipeline_id and v["name"] == name for v in self.versions.values()):
            raise ApiError(409, f"AlreadyExists: pipeline {pipeline_id} already has a version named {name}")
        return 200, self._add_version(pipeline_id, name, q.get("display_name") or name, q.get("description"), spec, now), "V2beta1PipelineVersion"

    def _add_version(self, pid, name, display_name, description, spec, now) -> dict:
        vid = str(uuid.uuid4())
        v = {"pipeline_id": pid, "pipeline_version_id": vid, "name": name, "display_name": display_name, "created_at": now,
             "pipeline_spec": spec}
        if description:
            v["description"] = description
        self.versions[vid] = v
        return v

    # -- experiments --------------------------------------------------------------------------
    def _create_experiment(self, body):
        if not body or not body.get("display_name"):
            raise ApiError(400, "InvalidArgument: experiment display_name is required")
        ns = body.get("namespace") or ""
        if any(e["display_name"] == body["display_name"] and e.get("namespace", "") == ns for e in self.experiments.values()):
            raise ApiError(409, f"AlreadyExists: experiment {body['display_name']} exists")
        e = {"experiment_id": str(uuid.uuid4()), "display_name": body["display_name"], "created_at": self._tick(), "storage_state": "AVAILABLE"}
        if body.get("description"):
            e["description"] = body["description"]
        if ns:
            e["namespace"] = ns
        self.experiments[e["experiment_id"]] = e
        return 200, e, "V2beta1Experiment"

    # -- runs ---------------------------------------------------------------------------------
    def _create_run(self, body, q):
        if not body:
            raise ApiError(400, "InvalidArgument: empty run")
        if body.get("run_id") or body.get("state") or body.get("created_at"):
            raise ApiError(400, "InvalidArgument: run_id/state/created_at are output only")
        exp = body.get("experiment_id")
        if exp and exp not in self.experiments:
            raise ApiError(404, f"NotFound: experiment {exp} not found")
        if not exp:
            exp = next((e["experiment_id"] for e in self.experiments.values() if e["display_name"] == "Default"), None)
            if exp is None:
                exp = self._create_experiment({"display_name": "Default"})[1]["experiment_id"]
        ref, spec = body.get("pipeline_version_reference"), body.get("pipeline_spec")
        if bool(ref) == bool(spec):
            raise ApiError(400, "InvalidArgument: a run needs exactly one of pipeline_spec and pipeline_version_reference")
        if ref:
            v = self.versions.get(ref.get("pipeline_version_id") or "")
            if not v or v["pipeline_id"] != ref.get("pipeline_id"):
                raise ApiError(404, f"NotFound: pipeline version {ref.get('pipeline_version_id')} of pipeline {ref.get('pipeline_id')} not found")
            pname = self.pipelines[v["pipeline_id"]]["name"]
        else:
            parse_spec(spec, "pipeline_spec")
            inner = spec.get("pipeline_spec", spec)
            pname = inner.get("pipelineInfo", {}).get("name", "")
        if not body.get("display_name"):
            raise ApiError(400, "InvalidArgument: run display_name is required")
        rid = str(uuid.uuid4())
        out = {k: v for k, v in body.items() if v is not None}
        out.update(run_id=rid, experiment_id=exp, created_at=self._tick(), storage_state="AVAILABLE")
        if ref:
            out["pipeline_version_id"] = ref["pipeline_version_id"]
        run = Run(out, self._script(out, pname))
        self.runs[rid] = run
        self._sync(run)
        return 200, out, "V2beta1Run"

    def _get_run(self, rid: str) -> Run:
        r = self.runs.get(rid)
        if not r:
            raise ApiError(404, f"NotFound: run {rid} not found")
        return r

    def _poll(self, rid: str) -> dict:
        r = self._get_run(rid)
        if r.state not in TERMINAL and r.pos < len(r.script) - 1:
            r.pos += 1
            self._sync(r)
        return r.body

    def _sync(self, r: Run) -> None:
        state, now = r.state, self._tick()
        if not r.history or r.history[-1]["state"] != state:
            r.history.append({"update_time": now, "state": state})
        b = r.body
        b["state"] = state
        b["state_history"] = list(r.history)
        if state in TERMINAL:
            b["finished_at"] = now
        if state == "FAILED":
            b["error"] = {"code": 2, "message": "fake: a task of this run failed", "details": []}
        if state != "PENDING":
            b["run_details"] = {"pipeline_context_id": "1", "pipeline_run_context_id": "2", "task_details": self._tasks(r, state, now)}

    def _tasks(self, r: Run, state: str, now: str) -> list[dict]:
        spec = r.body.get("pipeline_spec")
        if spec is None:
            spec = self.versions[r.body["pipeline_version_id"]]["pipeline_spec"]
        spec = spec.get("pipeline_spec", spec)
        names = sorted(spec.get("root", {}).get("dag", {}).get("tasks", {}))
        out = []
        for i, n in enumerate(names):
            t = {"run_id": r.body["run_id"], "task_id": f"{r.body['run_id'][:8]}-{i}", "display_name": n, "create_time": now,
                 "state": state, "child_tasks": [{"pod_name": f"{r.body['run_id'][:8]}-{n}-{i}"}]}
            if state == "FAILED" and i == 0:
                t["error"] = {"code": 2, "message": f"fake: task {n} failed", "details": []}
            out.append(t)
        return out

    # -- lists --------------------------------------------------------------------------------
    def _page(self, items: list[dict], q: dict, key: str, model: str, item_model: str):
        if q.get("filter"):
            try:
                flt = json.loads(q["filter"])
            except json.JSONDecodeError:
                raise ApiError(400, "InvalidArgument: filter is not JSON") from None
            try:
                validate(flt, "V2beta1Filter", "filter", camel_ok=True)
            except ValueError as e:
                raise ApiError(400, f"InvalidArgument: {e}") from None
            for pred in flt.get("predicates") or []:
                items = [x for x in items if _match(x, pred)]
        sort = (q.get("sort_by") or "").strip()
        if sort:
            fld, _, order = sort.partition(" ")
            if fld not in ("created_at", "display_name", "name"):
                raise ApiError(400, f"InvalidArgument: cannot sort by {fld}")
            items = sorted(items, key=lambda x: str(x.get(fld, "")), reverse=order.strip().lower() == "desc")
        try:
            size = int(q.get("page_size") or self.default_page_size)
        except ValueError:
            raise ApiError(400, "InvalidArgument: page_size is not an integer") from None
        if size < 0:
            raise ApiError(400, "InvalidArgument: page_size must not be negative")
        size = size or self.default_page_size
        offset = 0
        if q.get("page_token"):
            try:
                tok = json.loads(base64.urlsafe_b64decode(q["page_token"].encode()))
                offset = int(tok["offset"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "InvalidArgument: invalid page token") from None
        page = items[offset:offset + size]
        nxt = offset + size
        body = {key: page, "total_size": len(items)}
        if nxt < len(items):
            body["next_page_token"] = base64.urlsafe_b64encode(json.dumps({"offset": nxt}).encode()).decode()
        return 200, body, model


_OPS = {1: "EQUALS", 2: "NOT_EQUALS", 9: "IS_SUBSTRING"}


def _match(x: dict, pred: dict) -> bool:
    op = pred.get("operation")
    op = _OPS.get(op, op) if isinstance(op, int) else op
    key = pred.get("key")
    val = pred.get("stringValue", pred.get("string_value"))
    if op not in ("EQUALS", "NOT_EQUALS", "IS_SUBSTRING") or val is None:
        raise ApiError(400, f"InvalidArgument: unsupported predicate {pred}")
    have = str(x.get(key, "") if key != "name" else x.get("name", x.get("display_name", "")))
    return {"EQUALS": have == val, "NOT_EQUALS": have != val, "IS_SUBSTRING": val in have}[op]


# -- HTTP ------------------------------------------------------------------------------------------

_REQUEST_MODELS = {("POST", "/runs"): "V2beta1Run", ("POST", "/experiments"): "V2beta1Experiment"}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKfp
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls

    def log_message(self, *a):  # quiet
        pass

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        rec = {"method": method, "path": path, "query": query, "headers": headers, "body": None}
        fake = self.fake
        try:
            if raw and headers.get("content-type", "").startswith("application/json"):
                rec["body"] = json.loads(raw)
                model = _REQUEST_MODELS.get((method, path[len(API):]))
                if model:
                    try:
                        validate(rec["body"], model, "body")
                    except ValueError as e:
                        raise ApiError(400, f"InvalidArgument: {e}") from None
            with fake._lock:
                fake.requests.append(rec)
            status, body, model = fake.handle(method, path, query, headers, raw)
            if model:
                validate(body, model, "response")  # what we send is what the SDK's models read
        except ApiError as e:
            with fake._lock:
                if rec not in fake.requests:
                    fake.requests.append(rec)
            status, body = e.status, {"code": CODE.get(e.status, 2), "message": e.message, "details": []}
            validate(body, "GoogleRpcStatus", "error")
        except json.JSONDecodeError as e:
            status, body = 400, {"code": 3, "message": f"invalid JSON: {e}", "details": []}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_DELETE(self):
        self._serve("DELETE")


# -- fixtures of the tests that use this server (imported by them: a second conftest.py would
# shadow tests/conftest.py, which other test modules import as `conftest`) -----------------------


@pytest.fixture
def kfp_isolated(monkeypatch, tmp_path):
    """No KFP settings from the machine: env, ~/.config/kfp/context.json, the SA token path."""
    import kfp

    from prepline.kfp import connection as C

    for k in (C.ENV_ENDPOINT, C.ENV_TOKEN, C.ENV_TOKEN_FILE, C.ENV_UI_ENDPOINT, "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setattr(C, "SA_TOKEN_PATH", str(tmp_path / "no-sa-token"))


@pytest.fixture
def fake():
    with FakeKfp() as f:
        yield f
