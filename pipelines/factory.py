"""One factory for every pipeline: a simple pipeline per registered transform, and the super pipeline
that nests them (doc_id → exact_dedup → fuzzy_dedup → lang_id → ParallelFor(language){quality → PII →
HAP → filter → tokenization}). Stages not in the registry are left out, never stubbed.

No hand-written pipeline per transform, no environment read at compile time: the compiled YAML
depends only on the registry, these functions and the one image setting (``ImageSet``: registry
and tag). Every task's image is a pipeline parameter (``launcher_image``, ``trainer_image``;
``task.set_container_image``, resolved by the KFP driver, backend >= 2.4) whose default is that
setting; ``ray_image`` goes to the clusters the same way.
"""

import json
from functools import lru_cache

from kfp import dsl, kubernetes

from prepline import registry, stage_params
from prepline.components.fine_tune import fine_tune
from prepline.components.run_report import run_report
from prepline.components.ray_stage import execute_ray_job, prepare_args, start_ray_cluster, stop_ray_cluster
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet
from prepline.stage_params import DEFAULT_LANGUAGES, DEFAULT_S3_SECRET  # noqa: F401 (re-exported)

S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                  "PREPLINE_S3_ENDPOINT": "PREPLINE_S3_ENDPOINT"}

GLOBAL_STAGES = ["doc_id", "exact_dedup", "fuzzy_dedup", "lang_id"]
BRANCH_STAGES = ["doc_quality", "pii_redactor", "hap", "filter", "tokenization"]
#: the super pipeline's default training parameters: the branches' tokenizers differ when each
#: branch trains its own (tokenization's default), so one vocabulary per tokenizer (docs/fine_tune.md)
#: and a short run (about a minute on 2 CPU cores) so the local super pipeline stays quick; raise steps for real use
DEFAULT_TRAIN_PARAMS = {"mixed_tokenizers": "separate", "steps": 60, "seq_len": 128, "batch_size": 8, "checkpoint_every": 20}


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


def make_pipeline(name: str, func_name: str, description: str, summary: str, params: list[str], build,
                  defaults: dict | None = None, descriptions: dict | None = None):
    """A KFP pipeline whose parameters are ``params`` from :mod:`prepline.stage_params` (signature,
    defaults, descriptions) and whose graph ``build(**arguments)`` creates."""
    sig = stage_params.signature(params, defaults)

    def body(*args, **kwargs):  # KFP calls it with one pipeline channel per parameter, in order
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return build(**bound.arguments)

    body.__signature__ = sig
    body.__doc__ = f"{summary}\n\n{stage_params.args_doc(params, descriptions)}"
    body.__name__ = body.__qualname__ = func_name
    return dsl.pipeline(name=name, description=description)(body)


def in_image(task, image):
    """Run ``task`` in ``image`` (a pipeline parameter: the KFP driver resolves it)."""
    return task.set_container_image(image)


@lru_cache(maxsize=None)
def simple_pipeline(transform: str, images: ImageSet = DEFAULT_IMAGES):
    """The simple pipeline of one transform: prepare_args → start → run, with stop as the exit task."""
    cls = registry.get(transform)

    def build(input_path, work_root, params_json, overrides_json, branch, input_stage, input_from_split, provider,
              provider_json, cluster_json, max_failed_files, timeout_seconds, start_timeout_seconds, s3_secret_name, run_id,
              launcher_image, ray_image):
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
            start = start_ray_cluster(**common, timeout_seconds=start_timeout_seconds, ray_image=ray_image,
                                      s3_secret_name=s3_secret_name).after(prep)
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
                in_image(t, launcher_image)

    summary = f"{transform}: {cls.summary}.\n\nTransform parameters (params_json):\n{_params_table(transform)}"
    return make_pipeline(stage_component_name(transform), transform, f"prepline {transform}: {cls.summary}", summary,
                         stage_params.STAGE, build, stage_params.image_defaults(images))


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


def super_defaults(images: ImageSet = DEFAULT_IMAGES) -> dict:
    """The super pipelines' parameter defaults that differ from :mod:`prepline.stage_params`."""
    return {"overrides_json": json.dumps(default_overrides(), sort_keys=True), "train_params_json": json.dumps(DEFAULT_TRAIN_PARAMS),
            **stage_params.image_defaults(images)}


#: super pipelines' descriptions that differ from the stage ones
SUPER_HELP = {"input_path": "Input folder or s3:// URI of Parquet files (the first stage reads it)."}


def wire_super(stage, a: dict, run_id) -> None:
    """The super pipelines' graph: the global stages in order, then (after lang_id's split) one
    ParallelFor branch per language, then the fine-tune fan-in. ``stage(name, input_stage, lang,
    from_split)`` creates one stage's task (``lang`` is None outside the branches; ``from_split``
    is true for the first stage of a branch, which reads lang_id's split); ``a`` holds the pipeline's arguments and ``run_id`` is the run the
    stages wrote under (for fine_tune to find the token shards)."""
    glob, branch = super_stages()
    split = "lang_id" in glob
    prev, prev_name = None, ""
    for s in glob + ([] if split else branch):  # no language split available: the branch stages run once, un-branched
        t = stage(s, prev_name, None, False).set_display_name(s)
        if prev is not None:
            t.after(prev)
        prev, prev_name = t, s
    if not (split and branch):
        return
    with dsl.ParallelFor(a["languages"], parallelism=len(DEFAULT_LANGUAGES), name="per-language") as lang:
        bprev, bprev_name = None, ""
        for s in branch:
            t = stage(s, bprev_name or prev_name, lang, bprev is None).set_display_name(s)
            t.after(bprev if bprev is not None else prev)
            bprev, bprev_name = t, s
    if bprev_name == "tokenization":  # fan-in: train on the branches' token shards (found by their paths)
        ft = fine_tune(
            mode=a["train_mode"], work_root=a["work_root"], run_id=run_id, languages=a["languages"],
            train_languages=a["train_languages"], train_params_json=a["train_params_json"], trainjob_json=a["trainjob_json"],
            s3_secret_name=a["s3_secret_name"], timeout_seconds=a["train_timeout_seconds"], trainer_image=a["trainer_image"],
        ).after(bprev)
        ft.set_display_name("fine_tune").set_caching_options(False)
        in_image(ft, a["trainer_image"])
        _with_s3_secret(ft, a["s3_secret_name"])
        rep = run_report(work_root=a["work_root"], run_id=run_id).after(ft)  # the run's HTML report (issue 13)
        rep.set_display_name("run report").set_caching_options(False)
        in_image(rep, a["launcher_image"])
        _with_s3_secret(rep, a["s3_secret_name"])


def super_summary(head: str, tail: str = "") -> str:
    glob, branch = super_stages()
    return f"{head}: " + " → ".join(glob) + (" → per language: " + " → ".join(branch) if branch else "") + tail + "."


@lru_cache(maxsize=None)
def super_pipeline(images: ImageSet = DEFAULT_IMAGES):
    def build(**a):
        shared = {k: a[k] for k in stage_params.SHARED}

        def stage(s, input_stage, lang, from_split):
            branched = {} if lang is None else {"branch": lang, "input_from_split": from_split}
            return simple_pipeline(s, images)(input_path=a["input_path"], input_stage=input_stage, **branched, **shared)

        wire_super(stage, a, dsl.PIPELINE_JOB_ID_PLACEHOLDER)

    return make_pipeline("prepline-super", "super_pipeline",
                         "prepline super pipeline: every stage, one cluster per stage, per-language branches",
                         super_summary("The super pipeline"), stage_params.SUPER, build, super_defaults(images), SUPER_HELP)


def pipelines(images: ImageSet = DEFAULT_IMAGES) -> dict:
    """Every pipeline by its name (the compiled file stem), its images from ``images``."""
    from prepline.pipelines.chained import chained_super_pipeline

    out = {t: simple_pipeline(t, images) for t in registry.names()}
    out["super"] = super_pipeline(images)
    out["super_chained"] = chained_super_pipeline(images)
    return out
