"""One factory for every pipeline: a simple pipeline per registered transform, and the super pipeline
that nests them (doc_id → exact_dedup → fuzzy_dedup → lang_id → ParallelFor(language){quality → PII →
HAP → filter → tokenization}). Stages not in the registry are left out, never stubbed.

No hand-written pipeline per transform, no environment read at compile time: the compiled YAML
depends only on the registry and these functions.
"""

import json
from functools import lru_cache

from kfp import dsl, kubernetes

from prepline import registry
from prepline.components.fine_tune import fine_tune
from prepline.components.ray_stage import execute_ray_job, prepare_args, start_ray_cluster, stop_ray_cluster

#: defaults that work on one machine (kfp.local + a local Ray head per stage)
DEFAULT_INPUT = "/tmp/prepline/sample"
DEFAULT_WORK_ROOT = "/tmp/prepline/work"
#: S3 credentials reach the component pods from this Kubernetes secret (a pipeline parameter)
DEFAULT_S3_SECRET = "prepline-s3"
S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                  "PREPLINE_S3_ENDPOINT": "PREPLINE_S3_ENDPOINT"}

GLOBAL_STAGES = ["doc_id", "exact_dedup", "fuzzy_dedup", "lang_id"]
BRANCH_STAGES = ["doc_quality", "pii_redactor", "hap", "filter", "tokenization"]
DEFAULT_LANGUAGES = ["en", "ja", "fr"]
#: the super pipeline's default training parameters: the branches' tokenizers differ when each
#: branch trains its own (tokenization's default), so one vocabulary per tokenizer (docs/fine_tune.md)
#: and a short run (about a minute on 2 CPU cores) so the local super pipeline stays quick; raise steps for real use
DEFAULT_TRAIN_PARAMS = {"mixed_tokenizers": "separate", "steps": 60, "seq_len": 128, "batch_size": 8, "checkpoint_every": 20}
TRAIN_PARAMS_DOC = """
    train_mode: Fine-tuning at the end: 'local' (a subprocess of the step) or 'cluster' (a Kubeflow Trainer TrainJob).
    train_languages: Languages whose token shards train the model (a JSON list); [] = every branch of languages.
    train_params_json: Training parameters as JSON (steps, batch_size, lr, seq_len, seed, base_model, ...: docs/fine_tune.md).
    trainjob_json: TrainJob options as JSON (namespace, runtime, image, num_nodes, resources_per_node, active_deadline_seconds, ...).
    train_timeout_seconds: Maximum time the fine-tuning step waits for training.
"""

COMMON_PARAMS = """
    work_root: Folder or s3:// URI under which every stage writes <work_root>/<run id>/[lang=<branch>/]<stage>.
    params_json: The transform's parameters as a JSON object (see the table above); {} for the defaults.
    overrides_json: Per-stage overrides {"<stage>": {"params": {...}, "cluster": {...}}} (used by super pipelines).
    branch: Language branch this stage runs for ('' outside a per-language branch).
    input_stage: Read the output of this earlier stage of the same run instead of input_path.
    input_from_split: With input_stage: read its lang=<branch> sub-folder (the stage after lang_id's split).
    provider: Where the Ray cluster comes from: 'kuberay' (KubeRay API server) or 'local' (a Ray head in the step's machine).
    provider_json: Provider options as JSON, e.g. {"server": "http://kuberay-apiserver:8888", "namespace": "kubeflow", "api_version": "v2"}.
    cluster_json: Cluster resources as JSON: head/workers {cpu, memory, gpu, replicas}, image, env, env_from_secrets, tolerations, node_selector, labels, service_account, cpus_per_worker.
    max_failed_files: Input files allowed to fail (listed in metadata.json); the step fails beyond that.
    timeout_seconds: Maximum run time of the Ray job.
    start_timeout_seconds: Maximum time to wait for the cluster to accept jobs.
    s3_secret_name: Kubernetes secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally PREPLINE_S3_ENDPOINT) for the steps.
    run_id: Run id under which the stage's paths are derived ('' = this run's own id); the SDK-chained super pipeline passes its run id so every child run writes under the parent's work folder.
"""


def _params_table(transform: str) -> str:
    cls = registry.get(transform)
    rows = [f"  {p.name} ({p.type_name}, default {json.dumps(list(p.default) if p.type is list else p.default)}): {p.help}"
            for p in cls.Config.params()]
    return "\n".join(rows)


def _with_s3_secret(task, s3_secret_name):
    kubernetes.use_secret_as_env(task, secret_name=s3_secret_name, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    return task


def stage_component_name(transform: str) -> str:
    return transform.replace("_", "-")


@lru_cache(maxsize=None)
def simple_pipeline(transform: str):
    """The simple pipeline of one transform: prepare_args → start → run, with stop as the exit task."""
    cls = registry.get(transform)

    def body(
        input_path: str = DEFAULT_INPUT,
        work_root: str = DEFAULT_WORK_ROOT,
        params_json: str = "{}",
        overrides_json: str = "{}",
        branch: str = "",
        input_stage: str = "",
        input_from_split: bool = False,
        provider: str = "local",
        provider_json: str = "{}",
        cluster_json: str = "{}",
        max_failed_files: int = 0,
        timeout_seconds: int = 86400,
        start_timeout_seconds: int = 900,
        s3_secret_name: str = DEFAULT_S3_SECRET,
        run_id: str = "",
    ):
        job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        common = dict(provider=provider, provider_json=provider_json, cluster_json=cluster_json, overrides_json=overrides_json,
                      run_id=job_id, stage=transform, branch=branch)
        stop = stop_ray_cluster(**common).set_display_name(f"stop cluster ({transform})")
        _with_s3_secret(stop, s3_secret_name)
        with dsl.ExitHandler(stop, name=f"{stage_component_name(transform)}-stage"):
            prep = prepare_args(
                transform=transform, params_json=params_json, overrides_json=overrides_json, work_root=work_root, run_id=job_id,
                stage=transform, branch=branch, input_path=input_path, input_stage=input_stage,
                input_from_split=input_from_split, cluster_json=cluster_json, run_id_override=run_id,
            ).set_display_name(f"prepare {transform}")
            start = start_ray_cluster(**common, timeout_seconds=start_timeout_seconds).after(prep)
            start.set_display_name(f"start cluster ({transform})")
            _with_s3_secret(start, s3_secret_name)
            run = execute_ray_job(
                **common, transform=transform, config_json=prep.outputs["config_json"], input_path=prep.outputs["input_path"],
                output_path=prep.outputs["output_path"], workers=prep.outputs["workers"], max_failed_files=max_failed_files,
                timeout_seconds=timeout_seconds,
            ).after(start)
            run.set_display_name(f"run {transform}")
            _with_s3_secret(run, s3_secret_name)
            for t in (prep, start, run, stop):
                t.set_caching_options(False)  # a stage's effect is its output folder, not a KFP artifact

    body.__doc__ = (
        f"{transform}: {cls.summary}.\n\nTransform parameters (params_json):\n{_params_table(transform)}\n\n"
        f"Args:\n    input_path: Input folder or s3:// URI of Parquet files (first stage).{COMMON_PARAMS}"
    )
    body.__name__ = transform
    return dsl.pipeline(name=stage_component_name(transform), description=f"prepline {transform}: {cls.summary}")(body)


def super_stages() -> tuple[list[str], list[str]]:
    names = set(registry.names())
    return [s for s in GLOBAL_STAGES if s in names], [s for s in BRANCH_STAGES if s in names]


def default_overrides() -> dict:
    """What the super pipeline sets by default: lang_id splits by language; filter keeps sound docs."""
    g, b = super_stages()
    o: dict = {}
    if "lang_id" in g:
        o["lang_id"] = {"params": {"split": True}}
    if "filter" in b:
        o["filter"] = {"params": {"criteria": default_filter_criteria()}}
    return o


def default_filter_criteria() -> list[str]:
    crit = ["length(trim(contents)) >= 20"]
    names = set(registry.names())
    if "doc_quality" in names:
        crit.append("dq_gopher_pass")
    if "hap" in names:  # the packaged profanity model is English-only: do not judge other languages by it
        crit.append("(lang <> 'en' OR hap_score < 0.9)")
    return crit


@lru_cache(maxsize=None)
def super_pipeline():
    glob, branch = super_stages()
    overrides_default = json.dumps(default_overrides(), sort_keys=True)

    def body(
        input_path: str = DEFAULT_INPUT,
        work_root: str = DEFAULT_WORK_ROOT,
        languages: list = DEFAULT_LANGUAGES,
        overrides_json: str = overrides_default,
        provider: str = "local",
        provider_json: str = "{}",
        cluster_json: str = "{}",
        max_failed_files: int = 0,
        timeout_seconds: int = 86400,
        start_timeout_seconds: int = 900,
        s3_secret_name: str = DEFAULT_S3_SECRET,
        train_mode: str = "local",
        train_languages: list = [],
        train_params_json: str = json.dumps(DEFAULT_TRAIN_PARAMS),
        trainjob_json: str = "{}",
        train_timeout_seconds: int = 86400,
    ):
        common = dict(work_root=work_root, overrides_json=overrides_json, provider=provider, provider_json=provider_json,
                      cluster_json=cluster_json, max_failed_files=max_failed_files, timeout_seconds=timeout_seconds,
                      start_timeout_seconds=start_timeout_seconds, s3_secret_name=s3_secret_name)
        prev, prev_name = None, ""
        for s in glob:
            t = simple_pipeline(s)(input_path=input_path, input_stage=prev_name, **common).set_display_name(s)
            if prev is not None:
                t.after(prev)
            prev, prev_name = t, s
        if not branch:
            return
        if prev_name != "lang_id":  # no language split available: the branch stages run once, un-branched
            for s in branch:
                t = simple_pipeline(s)(input_path=input_path, input_stage=prev_name, **common).set_display_name(s)
                if prev is not None:
                    t.after(prev)
                prev, prev_name = t, s
            return
        with dsl.ParallelFor(languages, parallelism=len(DEFAULT_LANGUAGES), name="per-language") as lang:
            bprev, bprev_name = None, ""
            for s in branch:
                t = simple_pipeline(s)(
                    input_path=input_path, input_stage=bprev_name or prev_name, input_from_split=bprev is None, branch=lang, **common
                ).set_display_name(s)
                t.after(bprev if bprev is not None else prev)
                bprev, bprev_name = t, s
        if bprev_name == "tokenization":  # fan-in: train on the branches' token shards (found by their paths)
            ft = fine_tune(
                mode=train_mode, work_root=work_root, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, languages=languages,
                train_languages=train_languages, train_params_json=train_params_json, trainjob_json=trainjob_json,
                s3_secret_name=s3_secret_name, timeout_seconds=train_timeout_seconds,
            ).after(bprev)
            ft.set_display_name("fine_tune").set_caching_options(False)
            _with_s3_secret(ft, s3_secret_name)

    body.__doc__ = (
        "The super pipeline: " + " → ".join(glob) + (" → per language: " + " → ".join(branch) if branch else "") + ".\n\n"
        "Args:\n    input_path: Input folder or s3:// URI of Parquet files.\n"
        "    languages: Language branches to run after lang_id (ISO codes as fastText gives them).\n"
        + "\n".join(l for l in COMMON_PARAMS.splitlines() if l.strip().split(":")[0] in
                    ("work_root", "overrides_json", "provider", "provider_json", "cluster_json", "max_failed_files", "timeout_seconds",
                     "start_timeout_seconds", "s3_secret_name"))
        + (TRAIN_PARAMS_DOC if "tokenization" in branch else "")
    )
    body.__name__ = "super_pipeline"
    return dsl.pipeline(name="prepline-super", description="prepline super pipeline: every stage, one cluster per stage, per-language branches")(body)


def pipelines() -> dict:
    """Every pipeline by its name (the compiled file stem)."""
    from prepline.pipelines.chained import chained_super_pipeline

    out = {t: simple_pipeline(t) for t in registry.names()}
    out["super"] = super_pipeline()
    out["super_chained"] = chained_super_pipeline()
    return out
