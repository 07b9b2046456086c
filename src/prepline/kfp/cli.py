"""``prepline kfp upload | run | clone | wait | terminate | list | logs``: operating a KFP server from
the command line and CI.

Exit codes: 0 success (``wait``: SUCCEEDED), 1 the run FAILED (or SKIPPED), 2 a usage/parameter
error, 3 the run was CANCELED (or is CANCELING), 4 ``wait`` timed out, 5 the server could not be
used (unreachable, 401/403, unknown id, refused request).
"""

from __future__ import annotations

import argparse
import json
import sys

from prepline.errors import ConfigError, PreplineError, exit_code
from prepline.kfp.client import (
    EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, TERMINAL_STATES, KfpClient, KfpTimeout, _iso, _run_state,
)
from prepline.kfp.connection import ENV_ENDPOINT, ENV_TOKEN, ENV_TOKEN_FILE, SA_TOKEN_PATH, resolve_connection
from prepline.kfp.params import gather_parameters

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
    r.add_argument("--check-input", action="store_true",
                   help="also read input_path from this machine before posting (exists, format, text column or field); "
                        "every other setting of a prepline pipeline is always checked first")
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
                           run_name=a.run_name, pipeline_root=a.pipeline_root, service_account=a.service_account,
                           check_input=a.check_input)
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
