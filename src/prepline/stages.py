"""What each KFP component does, as plain functions (unit-tested without KFP).

A stage = prepare (validate parameters, compute paths and the cluster name) → start a Ray cluster
→ execute the transform as a Ray job → stop the cluster (always, as the exit task). Paths and
cluster names are derived from the run id, the stage and the branch, so parallel runs and
parallel language branches never collide and no user-typed run id is needed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import sys
import time
from dataclasses import replace

from prepline import logs, metadata, progress
from prepline.stage_params import check_overrides, deep_merge
from prepline.clusters import ClusterSpec, NodeGroup, cluster_name, get_provider
from prepline.clusters.base import DEFAULT_GPU_WORKERS, DEFAULT_POD_ANNOTATIONS, LABEL_BRANCH, LABEL_MANAGED, LABEL_RUN, LABEL_STAGE
from prepline.clusters.http import Unavailable
from prepline.errors import ConfigError, PreplineError, RunFailed

log = logging.getLogger("prepline")


def _json(name: str, text: str, default):
    if text in ("", None):
        return default
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"parameter {name} is not valid JSON ({e.msg} at char {e.pos}): {text[:200]!r}", f"pass {name} as JSON, e.g. {json.dumps(default)}") from None
    if not isinstance(v, type(default)):
        raise ConfigError(f"parameter {name} must be a JSON {type(default).__name__}, got {type(v).__name__}", f"e.g. {json.dumps(default)}")
    return v


def run_key(run_id: str) -> str:
    """A short, path- and label-safe form of the KFP run id."""
    import re

    k = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id).strip("-.")
    return k[:63] or "run"


def stage_output(work_root: str, run_id: str, stage: str, branch: str = "") -> str:
    parts = [work_root.rstrip("/"), run_key(run_id)] + ([f"lang={branch}"] if branch else []) + [stage]
    return "/".join(parts)


def stage_overrides(overrides_json: str, stage: str, branch: str = "") -> tuple[dict, dict]:
    """(params, cluster) overrides of one stage, its branch's merged over its own, from
    ``{"<stage>": {"params": {...}, "cluster": {...}, "branches": {"<branch>": {...}}}}``."""
    o = _json("overrides_json", overrides_json, {})
    s = o.get(stage, {})
    if not isinstance(s, dict) or set(s) - {"params", "cluster", "branches", "allow_empty_output"}:
        raise ConfigError(f"overrides_json[{stage!r}] must be an object with 'params', 'cluster' and/or 'branches'",
                          '{"filter": {"params": {"criteria": ["..."]}, "cluster": {"workers": {"replicas": 4}}}}')
    b = s.get("branches", {}).get(branch, {}) if branch else {}
    return deep_merge(s.get("params", {}), b.get("params", {})), deep_merge(s.get("cluster", {}), b.get("cluster", {}))


def _merged_cluster(cluster_json: str, overrides_json: str, stage: str, branch: str = "") -> str:
    base = _json("cluster_json", cluster_json, {})
    extra = stage_overrides(overrides_json, stage, branch)[1]
    return json.dumps(deep_merge(base, extra))  # workers: {replicas: 4} keeps the workers' cpu and memory


def prepare(
    transform: str,
    params_json: str,
    work_root: str,
    run_id: str,
    stage: str,
    branch: str = "",
    input_path: str = "",
    input_stage: str = "",
    input_from_split: bool = False,
    cluster_json: str = "",
    overrides_json: str = "",
    run_id_override: str = "",
    from_plan: bool = False,
) -> dict:
    """Validate everything a stage needs before any cluster starts; return its plan.

    Input: ``input_path`` for a first stage; else the output of ``input_stage`` in this run (in
    the same branch), or with ``input_from_split`` its ``lang=<branch>`` sub-folder (the stage
    after lang_id's split). With ``from_plan``, input, parameters and cluster come from the run's
    plan.json instead (:mod:`prepline.pipelines.plan`), which may also say that the stage does
    not run for this branch: then ``{"run": False, "reason": ...}``.

    A parameter value ``run:<stage>`` becomes that stage's output folder in this run (e.g.
    ``"tokenizer": "run:tokenizer"``: the run's shared tokenizer).

    ``run_id_override`` (when not empty) replaces ``run_id`` in the input and output paths only: a
    stage started as a child run of an SDK-chained super pipeline reads and writes under its
    parent's work folder, while its cluster keeps a name derived from its own run id.
    """
    if not work_root:
        raise ConfigError("work_root is empty", "pass the folder or s3:// URI where stage outputs go")
    data_run = run_id_override or run_id
    if from_plan:
        from prepline.pipelines.plan import entry, read_plan

        e = entry(read_plan(work_root, data_run), stage, branch)
        if not e["runs"]:
            log.info("%s%s does not run: %s", stage, f" ({branch})" if branch else "", e.get("reason", ""))
            return {"run": False, "reason": e.get("reason", ""), "stage": stage, "branch": branch}
        params, cluster_json, src = e["params"], json.dumps(e["cluster"]), e["input"]
        allow = bool(e.get("allow_empty_output", False))
        _check_branch_input(src, stage, branch)
    else:
        check_overrides(overrides_json)  # every stage's, so that a bad one fails in the first step
        params = {**_json("params_json", params_json, {}), **stage_overrides(overrides_json, stage, branch)[0]}
        cluster_json = _merged_cluster(cluster_json, overrides_json, stage, branch)
        src = _input(work_root, data_run, stage, branch, input_path, input_stage, input_from_split)
        from prepline.stage_params import allow_empty

        allow = allow_empty(_json("overrides_json", overrides_json, {}), stage, branch)
    params = run_refs(params, work_root, data_run)
    from prepline import registry  # here, not at the top: start and stop (every stage's overhead) never import the transforms

    cls = registry.get(transform)
    cfg = cls.Config.from_params(params)  # a bad parameter fails here
    spec = cluster_spec(cluster_json, cluster_name(run_key(run_id), stage, branch), run_id, stage, branch)
    cpus, gpus = placement(cluster_json, spec)
    if gpus and not cls.uses_gpu:
        raise ConfigError(f"stage {stage}: cluster_json asks for GPU workers, but {transform} does not use GPUs (they would sit idle)",
                          f"drop gpu_workers (and gpus_per_worker) from {stage}'s cluster_json; GPU stages: "
                          + ", ".join(sorted(n for n in registry.names() if registry.get(n).uses_gpu)))
    return {
        "run": True,
        "transform": transform,
        "stage": stage,
        "branch": branch,
        "run_id": run_id,
        "config_json": json.dumps(cfg.to_dict(), sort_keys=True, default=list),
        "input_path": src,
        "output_path": stage_output(work_root, data_run, stage, branch),
        "cluster_json": cluster_json,
        "cluster_name": spec.name,
        "workers": workers_for(spec, cpus, gpus),
        "allow_empty_output": allow,
    }


def _check_branch_input(src: str, stage: str, branch: str) -> None:
    """A branch whose language the split found no document of has no input folder: say so before a
    cluster starts (not "input folder .../lang=fr does not exist" from the job)."""
    if not branch or not src.rstrip("/").endswith(f"/lang={branch}"):
        return
    from prepline.data_access import open_location
    from prepline.errors import InputError

    if not open_location(src).exists():
        split = src.rstrip("/").rsplit("/", 2)[-2]
        raise InputError(f"{stage} ({branch}): {split} found no document in language '{branch}' ({src} was not written)",
                         f"leave {branch} out of the pipeline's languages parameter (e.g. --param languages=...), "
                         f"or give input with {branch} documents; the languages found: {split}'s metadata.json")


def _input(work_root: str, data_run: str, stage: str, branch: str, input_path: str, input_stage: str, from_split: bool) -> str:
    if input_stage:
        if from_split:
            return f"{stage_output(work_root, data_run, input_stage)}/lang={branch}"
        return stage_output(work_root, data_run, input_stage, branch)
    if input_path:
        return input_path
    raise ConfigError(f"stage {stage}: no input", "pass input_path (first stage) or input_stage")


#: a parameter value naming a folder of this run: ``run:<stage>`` (e.g. run:tokenizer)
RUN_REF = "run:"


def run_refs(params: dict, work_root: str, run_id: str) -> dict:
    """``run:<stage>`` string values replaced by that stage's output folder in the run."""
    import re

    out = {}
    for k, v in params.items():
        if isinstance(v, str) and v.startswith(RUN_REF):
            name = v[len(RUN_REF):]
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ConfigError(f"parameter {k}={v!r}: {name!r} is not a stage of the run", f"e.g. {k}=run:tokenizer")
            v = stage_output(work_root, run_id, name)
        out[k] = v
    return out


def cluster_spec(cluster_json: str, name: str, run_id: str = "", stage: str = "", branch: str = "") -> ClusterSpec:
    """The ClusterSpec from the pipeline's cluster JSON (head/workers/image/env/secrets/tolerations ...)."""
    c = _json("cluster_json", cluster_json, {})
    known = {"namespace", "image", "head", "workers", "gpu_workers", "env", "env_from_secrets", "tolerations", "node_selector",
             "labels", "annotations", "pod_annotations", "service_account", "image_pull_secrets", "ray_start_params",
             "cpus_per_worker", "gpus_per_worker", "ray_version"}
    unknown = sorted(set(c) - known)
    if unknown:
        raise ConfigError(f"cluster_json has unknown key(s) {', '.join(unknown)}", f"known keys: {', '.join(sorted(known))}")
    kw = {k: v for k, v in c.items() if k not in ("head", "workers", "gpu_workers", "cpus_per_worker", "gpus_per_worker")}
    groups = {}
    for key, base in (("head", {}), ("workers", {}), ("gpu_workers", DEFAULT_GPU_WORKERS)):
        if key not in c:
            continue
        if not isinstance(c[key], dict):
            raise ConfigError(f"cluster_json {key} must be an object", f'e.g. {{"{key}": {{"cpu": "2", "memory": "4Gi", "replicas": 1}}}}')
        if key == "gpu_workers" and "replicas" not in c[key] and "max_replicas" not in c[key]:
            base = {**base, "replicas": 1}  # asking for the group at all means at least one pod
        gpu = c[key].get("gpu", base.get("gpu", 0))
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise ConfigError(f"cluster_json {key}.gpu = {gpu!r} must be a whole number of GPUs per pod", f'e.g. {{"{key}": {{"gpu": 1}}}}')
        try:
            groups[key] = NodeGroup(**{**base, **c[key]})
        except TypeError as e:
            raise ConfigError(f"cluster_json {key}: {e}", "use keys cpu, memory, gpu, replicas, min_replicas, max_replicas, "
                              "gpu_resource, tolerations, node_selector") from None
    if "gpu_workers" in groups and "workers" not in groups:  # the stage's actors go to the GPU pods: no idle CPU pod
        groups["workers"] = NodeGroup(cpu="2", memory="4Gi", replicas=0)
    head, workers, gpu_workers = groups.get("head"), groups.get("workers"), groups.get("gpu_workers")
    labels = {LABEL_MANAGED: "true", LABEL_RUN: run_key(run_id)[:63], LABEL_STAGE: stage.replace("_", "-")[:63]}
    if branch:
        labels[LABEL_BRANCH] = branch[:63]
    kw["labels"] = {**labels, **kw.get("labels", {})}
    if "pod_annotations" in kw:  # over the defaults (Istio's sidecar off); a JSON null removes one
        if not isinstance(kw["pod_annotations"], dict):
            raise ConfigError("cluster_json pod_annotations must be an object", '{"pod_annotations": {"sidecar.istio.io/inject": "true"}}')
        kw["pod_annotations"] = {k: v for k, v in {**DEFAULT_POD_ANNOTATIONS, **kw["pod_annotations"]}.items() if v is not None}
    spec = ClusterSpec(name=name, **kw)
    if head:
        spec = replace(spec, head=head)
    if workers:
        spec = replace(spec, workers=workers)
    if gpu_workers:
        spec = replace(spec, gpu_workers=gpu_workers)
    return spec


def placement(cluster_json: str, spec: ClusterSpec) -> tuple[float, float]:
    """(CPUs, GPUs) each Ray actor of the stage reserves: ``cpus_per_worker`` (default 1) and
    ``gpus_per_worker`` (default 1 when the cluster has GPUs, else 0). Actors that reserve a GPU are
    placed on the pods that have one (Ray's scheduler, from the ``--num-gpus`` KubeRay gives them)."""
    c = _json("cluster_json", cluster_json, {})
    cpus, gpus = c.get("cpus_per_worker", 1.0), c.get("gpus_per_worker", 1 if spec.gpus() else 0)
    for key, v, low in (("cpus_per_worker", cpus, 0.0), ("gpus_per_worker", gpus, 0.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low or (key == "cpus_per_worker" and v <= 0):
            raise ConfigError(f"cluster_json {key} = {v!r} must be a positive number" + (" or 0" if key == "gpus_per_worker" else ""),
                              f'e.g. "{key}": 1 (fractions share a device: 0.5 puts two actors on one)')
    if gpus and not spec.gpus():
        raise ConfigError(f"cluster_json gpus_per_worker = {gpus} but the cluster has no GPU",
                          'add a GPU group: {"gpu_workers": {"replicas": 1, "gpu": 1}}, or drop gpus_per_worker')
    if gpus > max(spec.gpu_workers.gpu, spec.head.gpu):
        raise ConfigError(f"cluster_json gpus_per_worker = {gpus} is more than any pod has ({max(spec.gpu_workers.gpu, spec.head.gpu)})",
                          "an actor runs in one pod: give gpu_workers.gpu >= gpus_per_worker")
    return float(cpus), float(gpus)


def workers_for(spec: ClusterSpec, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0) -> int:
    """Actors per cluster from its resources: GPUs per actor when actors take GPUs, else worker CPUs
    (or the head's, without workers) per actor."""
    if gpus_per_worker:
        return max(1, math.floor(spec.gpus() / gpus_per_worker + 1e-9))
    cpus = spec.workers.replicas * spec.workers.cpus() if spec.workers.replicas else spec.head.cpus()
    return max(1, math.floor(cpus / cpus_per_worker))


def _provider(kind: str, provider_json: str):
    return get_provider(kind, **_json("provider_json", provider_json, {}))


def with_defaults(spec: ClusterSpec, cluster_json: str, image: str = "", s3_secret_name: str = "") -> ClusterSpec:
    """The pipeline-level defaults of a cluster: the Ray image (``ray_image``) unless cluster_json
    names one, and every key of the S3 secret (optional, as the steps get it) as the Ray pods'
    environment unless cluster_json sets ``env_from_secrets`` (``[]`` = none)."""
    if image and not spec.image:
        spec = replace(spec, image=image)
    if s3_secret_name and "env_from_secrets" not in _json("cluster_json", cluster_json, {}):
        spec = replace(spec, env_from_secrets=[{"secret": s3_secret_name, "optional": True}])
    return spec


def start(provider: str, provider_json: str, cluster_json: str, run_id: str, stage: str, branch: str = "", timeout: float = 900,
          overrides_json: str = "", image: str = "", s3_secret_name: str = "") -> str:
    logs.ensure()
    cluster_json = _merged_cluster(cluster_json, overrides_json, stage, branch)
    spec = cluster_spec(cluster_json, cluster_name(run_key(run_id), stage, branch), run_id, stage, branch)
    spec = with_defaults(spec, cluster_json, image, s3_secret_name)
    p = _provider(provider, provider_json)
    t0 = time.time()
    for attempt in range(3):
        p.create(spec)
        try:
            info = p.wait_ready(spec.name, spec.namespace, timeout)
            break
        except PreplineError as e:  # a local head that lost a port race exits at once: try fresh ports
            if "exited while starting" not in e.message or attempt == 2:
                raise
            log.warning("cluster %s exited while starting; retrying (%s)", spec.name, e.message.splitlines()[-1][:200])
            p.delete(spec.name, spec.namespace)
    log.info("cluster %s ready in %.1fs at %s", spec.name, time.time() - t0, info.job_address)
    return spec.name


def entrypoint(transform: str, config_json: str, input_path: str, output_path: str, workers: int, max_failed_files: int,
               allow_empty_output: bool = False, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0) -> str:
    """The Ray job's command. It logs progress lines (no terminal there) every PREPLINE_PROGRESS_INTERVAL
    seconds (default 10), in the step's PREPLINE_LOG_FORMAT: both are passed on when the step has them."""
    fmt = os.environ.get(logs.ENV_FORMAT, "")
    every = os.environ.get(progress.ENV_INTERVAL, "")
    return " ".join(
        shlex.quote(a)
        for a in ["python", "-m", "prepline.cli", *(["--log-format", logs.log_format(fmt)] if fmt else []), "run", transform,
                  "--input", input_path, "--output", output_path, "--runtime", "ray", "--workers", str(workers),
                  "--max-failed-files", str(max_failed_files), "--params", config_json,
                  *(["--cpus-per-worker", f"{cpus_per_worker:g}"] if cpus_per_worker != 1.0 else []),
                  *(["--gpus-per-worker", f"{gpus_per_worker:g}"] if gpus_per_worker else []),
                  *(["--allow-empty-output"] if allow_empty_output else []),
                  *(["--progress-interval", str(progress.interval(float(every) if every else None))] if every else [])]
    )


def execute(
    provider: str,
    provider_json: str,
    cluster_json: str,
    run_id: str,
    stage: str,
    branch: str,
    transform: str,
    config_json: str,
    input_path: str,
    output_path: str,
    workers: int,
    max_failed_files: int = 0,
    timeout: float = 86400,
    poll: float = 1.0,
    out=sys.stdout,
    overrides_json: str = "",
    allow_empty_output: bool = False,
) -> dict:
    """Run the transform as a Ray job, stream its logs, and check what it wrote. The metadata returned
    also has ``job``: its id and the seconds from submission to its end (as this step saw them)."""
    logs.ensure()
    cluster_json = _merged_cluster(cluster_json, overrides_json, stage, branch)
    spec = cluster_spec(cluster_json, cluster_name(run_key(run_id), stage, branch), run_id, stage, branch)
    p = _provider(provider, provider_json)
    cpus, gpus = placement(cluster_json, spec)
    cmd = entrypoint(transform, config_json, input_path, output_path, workers, max_failed_files, allow_empty_output, cpus, gpus)
    t0 = time.monotonic()
    where = f"{stage}{'/' + branch if branch else ''}"
    for attempt in range(SETUP_RETRIES + 1):
        jobs, job_id = _submit(p, spec, cmd)
        log.info("%s: job %s on %s: %s", where, job_id, spec.name, cmd)

        def too_long(job_id=job_id) -> RunFailed:
            return RunFailed(f"{stage}: job {job_id} ran longer than {timeout:.0f}s and was stopped",
                             "raise the timeout or give the cluster more workers")

        try:
            info = jobs.follow(job_id, out, max(1.0, timeout - (time.monotonic() - t0)), poll, on_timeout=too_long)
        except Unavailable as e:  # the head stopped answering mid-job (its pod or node died, or the network to it)
            raise head_lost(p, spec, stage, job_id, e) from None
        if not info.setup_failed() or attempt == SETUP_RETRIES:
            break
        # nothing of the job ran (its supervisor actor never started): submitting it again is safe
        log.warning("%s: Ray could not start job %s (%s); submitting it again (%d of %d)", where, job_id,
                    info.message.splitlines()[0][:200] if info.message else info.error_type, attempt + 1, SETUP_RETRIES)
        time.sleep(SETUP_RETRY_WAIT_S)
    if info.status != "SUCCEEDED":
        if info.setup_failed():
            raise RunFailed(f"{stage}: Ray job {job_id} FAILED {SETUP_RETRIES + 1} times before it started: {info.message}",
                            "the head's runtime env agent could not start the job; see dashboard_agent.log and "
                            "runtime_env_agent.log in the head's /tmp/ray/session_latest/logs (e.g. the head is out of "
                            "memory or CPU); rerun with the same run_id: the stage resumes")
        raise job_error(output_path, stage, f"Ray job {job_id} {info.status}: {info.message or 'see the log above'}")
    meta = check_output(output_path, max_failed_files, stage)
    meta["job"] = {"id": job_id, "seconds": round(time.monotonic() - t0, 3)}
    log.info("%s: %s", where, one_line(meta))
    return meta


def head_lost(p, spec: ClusterSpec, stage: str, job_id: str, e: PreplineError) -> PreplineError:
    """The error of a job whose head stopped answering: what the step last got, and what the provider
    says of the cluster now (its state, and for KubeRay the head pod's conditions)."""
    from prepline.clusters.base import ClusterError

    try:
        now = "; " + p.condition(spec.name, spec.namespace)
    except PreplineError as e2:
        now = f"; the cluster could not be read either ({e2.message.splitlines()[0][:200]})"
    ns = f"-n {spec.namespace} " if spec.namespace else ""
    why = (f"the head's pod or its node is gone (kubectl {ns}describe pod -l ray.io/cluster={spec.name},ray.io/node-type=head "
           "shows why, e.g. OOMKilled or a node lost)" if hasattr(p, "findings") else "the Ray head process died (e.g. out of memory)")
    return ClusterError(
        f"{stage}: the Ray head of cluster {spec.name} stopped answering while job {job_id} ran "
        f"({e.message.splitlines()[0][:400]}){now}",
        f"{why}; the exit handler deletes the cluster; rerun the pipeline with the same run_id: the stage resumes from "
        "the files it completed")


def job_error(output_path: str, stage: str, what: str) -> PreplineError:
    """The error of a failed job: the one its metadata.json records (its kind, message and fix, as
    ``prepline run`` said it), else RunFailed with ``what``."""
    from prepline import errors
    from prepline.data_access import open_location

    try:
        err = json.loads(open_location(output_path).read_text("metadata.json") or "{}").get("error") or {}
    except Exception:  # noqa: BLE001 - no readable metadata: the job's own words
        err = {}
    kind = getattr(errors, str(err.get("type", "")), None)
    if not err.get("message") or not (isinstance(kind, type) and issubclass(kind, PreplineError)):
        said = _said(what)  # refused before it wrote metadata.json (a missing column, a bad path): its last words
        if said is None:
            return RunFailed(f"{stage}: {what}", "see the job log above")
        message, fix, code = said
        kind = next((k for k in (errors.ConfigError, errors.InputError, errors.OutputError, errors.ServiceError, errors.TimedOut)
                     if k.exit_code == code), RunFailed)
        return kind(message if message.startswith(f"{stage}") else f"{stage}: {message}", fix)
    fix = (err.get("fix") or "see the job log above").replace(
        "pass --allow-empty-output", f'allow it for this stage in overrides_json: {{"{stage}": {{"allow_empty_output": true}}}}')
    message = err["message"] if err["message"].startswith(f"{stage} ") else f"{stage}: {err['message']}"
    return kind(message, fix)


_SAID = re.compile(r"^error: (?P<message>.+)\n\s*fix: (?P<fix>.+)$", re.M)
_EXIT = re.compile(r"exit code (\d+)")


def _said(what: str) -> tuple[str, str, int | None] | None:
    """The last ``error:`` / ``fix:`` pair that ``prepline run`` printed in a failed job's log (Ray puts
    the log's tail in the job's message), and the job's exit code; None when there is none."""
    found = list(_SAID.finditer(what or ""))
    if not found:
        return None
    code = _EXIT.search(what)
    return found[-1]["message"].strip(), found[-1]["fix"].strip(), int(code.group(1)) if code else None


def one_line(meta: dict) -> str:
    """A stage's result in one log line: documents, removals, headline numbers, time."""
    from prepline.tables import headline_text, reason_label, time_text

    t = meta["totals"]
    parts = [f"{t['docs_in']:,} docs in, {t['docs_out']:,} out"]
    parts += [f"removed {reason_label(meta, k)}: {v:,}" for k, v in t["removed"].items()]
    if headline_text(meta):
        parts.append(headline_text(meta))
    return "; ".join(parts + [time_text(t)])


#: times a stage's head that stopped answering before its job started is brought back (recover)
HEAD_RECOVERIES = 2
#: times a job that Ray failed before its entrypoint ran (runtime env setup) is submitted again, and the wait before
SETUP_RETRIES = 2
SETUP_RETRY_WAIT_S = 2.0


def _submit(p, spec: ClusterSpec, cmd: str, timeout: float = 900):
    """Submit the stage's job. A head that no longer answers at submission (it died, e.g. its
    dashboard crashed on a loaded machine) is brought back by the provider and the job submitted
    again: nothing of it ran yet, so that is safe. A head lost while the job runs fails the step
    (the rerun resumes)."""
    recoveries = 0
    while True:
        jobs = p.job_client(spec.name, spec.namespace)
        try:
            return jobs, jobs.submit(cmd)
        except Unavailable as e:
            recoveries += 1
            if recoveries > HEAD_RECOVERIES:
                raise
            log.warning("cluster %s: the Ray head did not answer (%s); bringing it back", spec.name, e.message.splitlines()[0][:200])
            p.recover(spec.name, spec.namespace, timeout)


def check_output(output_path: str, max_failed_files: int, stage: str = "") -> dict:
    """Never trust a job's word: read its metadata.json and fail on failed files or broken counts."""
    from prepline.data_access import open_location

    loc = open_location(output_path)
    txt = loc.read_text("metadata.json")
    if not txt:
        raise RunFailed(f"{stage}: the job succeeded but wrote no metadata.json in {output_path}", "see the job log")
    meta = json.loads(txt)
    t = meta["totals"]
    if meta.get("status") != "success":
        raise RunFailed(f"{stage}: metadata.json says status={meta.get('status')}", "see 'failures' in metadata.json")
    if t.get("files_failed", 0) > max_failed_files:
        raise RunFailed(f"{stage}: {t['files_failed']} files failed (allowed {max_failed_files})", "see 'failures' in metadata.json")
    if not metadata.conserved(t):
        raise RunFailed(f"{stage}: counts do not add up in metadata.json", "report this bug with the metadata")
    return meta


def stop(provider: str, provider_json: str, cluster_json: str, run_id: str, stage: str, branch: str = "", overrides_json: str = "",
         work_root: str = "", from_plan: bool = False, run_id_override: str = "") -> bool:
    """The exit task: delete the stage's cluster; fail loudly if that fails. Its settings (namespace)
    come from the run's plan with ``from_plan`` (from cluster_json when the plan cannot be read:
    the cluster must go whatever happened before)."""
    logs.ensure()
    cluster_json = _stop_cluster_json(cluster_json, overrides_json, stage, branch, work_root, from_plan, run_id_override or run_id)
    spec = cluster_spec(cluster_json, cluster_name(run_key(run_id), stage, branch), run_id, stage, branch)
    existed = _provider(provider, provider_json).delete(spec.name, spec.namespace)
    # a stage that did not start one (resumed, or its plan skips it) has no cluster: not news to lead a run with
    log.info("cluster %s %s", spec.name, "deleted" if existed else "not running (nothing to stop)")
    return existed


def _stop_cluster_json(cluster_json: str, overrides_json: str, stage: str, branch: str, work_root: str, from_plan: bool,
                       data_run: str) -> str:
    if not from_plan:
        return _merged_cluster(cluster_json, overrides_json, stage, branch)
    from prepline.pipelines.plan import entry, read_plan

    try:
        return json.dumps(entry(read_plan(work_root, data_run), stage, branch).get("cluster", {}))
    except (PreplineError, ValueError, KeyError) as e:
        log.warning("%s: the run's plan cannot be read (%s); stopping the cluster with cluster_json's settings", stage, e)
        return cluster_json


def _md(text: str) -> str:
    """Text in a Markdown table cell (a filter's SQL may hold | or backticks)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")


def summary_markdown(meta: dict, stage: str) -> str:
    """The step's Markdown: documents, removals by reason (as people read them), the transform's
    headline numbers, and time: the work apart from the start-up (and from the job as the step saw it)."""
    from prepline.tables import headline_items, reason_label

    t = meta["totals"]
    lines = [f"## {stage}: {meta['status']}", "", "| measure | value |", "|---|---:|",
             f"| docs in | {t['docs_in']:,} |", f"| docs out | {t['docs_out']:,} |"]
    lines += [f"| removed: {_md(reason_label(meta, k))} | {v:,} |" for k, v in t["removed"].items()]
    lines += [f"| out: {k} | {v:,} |" for k, v in (t.get("parts") or {}).items()]
    lines += [f"| {_md(h['label'])} | {h['value']:,} |" for h in headline_items(meta)]
    lines += [f"| MB in / out | {t['bytes_in'] / 1e6:,.1f} / {t['bytes_out'] / 1e6:,.1f} |"]
    if "work_seconds" in t:
        lines += [f"| work seconds | {t['work_seconds']:,.1f} |", f"| start-up seconds (Ray, workers) | {t['startup_seconds']:,.1f} |"]
    lines += [f"| seconds in all | {t['seconds']:,.1f} |"]
    if meta.get("job"):
        lines.append(f"| Ray job seconds (submit to end) | {meta['job']['seconds']:,.1f} |")
    if t.get("docs_per_second"):
        lines.append(f"| docs/s (of the work) | {t['docs_per_second']:,.0f} |")
    lines.append(f"| files failed | {t.get('files_failed', 0)} |")
    if t.get("removed_sampled"):
        lines.append(f"| removed documents sampled (in _removed/) | {sum(t['removed_sampled'].values()):,} |")
    return "\n".join(lines) + "\n"


def metrics_of(meta: dict) -> dict[str, float]:
    """The step's KFP Metrics: documents, removals by reason, the headline numbers, time and rate, and
    what the run measured of itself (peak memory of the driver and workers, temporary space)."""
    from prepline.metadata import MEASURED_TOTALS
    from prepline.tables import headline_items, reason_label

    t = meta["totals"]
    m: dict[str, float] = {k: t.get(k, 0) for k in ("docs_in", "docs_out", "files_failed")}
    m.update({f"removed: {reason_label(meta, k)}": v for k, v in t["removed"].items()})
    m.update({h["label"]: h["value"] for h in headline_items(meta)})
    m["seconds"] = t["seconds"]
    for k in MEASURED_TOTALS:
        if t.get(k) is not None and k not in m:
            m[k] = t[k]
    if meta.get("job"):
        m["job_seconds"] = meta["job"]["seconds"]
    return {k: float(v) for k, v in m.items()}




def skipped_markdown(prepared: dict) -> str:
    return f"## {prepared['stage']}{' (' + prepared['branch'] + ')' if prepared.get('branch') else ''}: not run\n\n{prepared.get('reason', '')}\n"


__all__ = ["prepare", "start", "execute", "stop", "check_output", "stage_output", "summary_markdown", "metrics_of", "PreplineError"]
