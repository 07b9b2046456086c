"""The SDK-chained super pipeline, for KFP backends that cannot nest pipelines ("N+1 runs").

Same stages, order and per-language ``ParallelFor`` as :func:`prepline.pipelines.factory.super_pipeline`
(its ``super_stages()``, ``default_overrides()`` and ``DEFAULT_*`` constants; its closing fine_tune
fan-in is a plain step of the parent run here), but each data stage is one
``run_pipeline`` step that starts the stage's *uploaded* simple pipeline (its compiled name, e.g.
``doc-id``) as a child run and waits for it. Upload the simple pipelines first::

    for f in compiled/pipelines/*.yaml; do prepline kfp upload "$f"; done

Children get the parent's values of the parameters they share (input_path, work_root,
overrides_json, provider, cluster_json, ...), read by ``run_pipeline`` from the parent run
through the API — so no pipeline-parameter placeholder has to be resolved inside a struct — plus
their stage wiring (``input_stage``, ``input_from_split``), the language as ``branch``, and the
parent's run id as ``run_id``: every child reads and writes under
``<work_root>/<parent run id>/[lang=<branch>/]<stage>``, exactly the folders the nested super
pipeline uses. Each child still starts and stops its own Ray cluster (named after the child's run).
"""

import json
from functools import lru_cache

from kfp import dsl, kubernetes

from prepline.components.fine_tune import fine_tune
from prepline.components.run_pipeline import run_pipeline
from prepline.pipelines.factory import (
    DEFAULT_INPUT,
    DEFAULT_LANGUAGES,
    DEFAULT_S3_SECRET,
    DEFAULT_TRAIN_PARAMS,
    DEFAULT_WORK_ROOT,
    TRAIN_PARAMS_DOC,
    _with_s3_secret,
    default_overrides,
    stage_component_name,
    super_stages,
)

#: the bearer token for the KFP API reaches the run_pipeline steps from this secret (optional)
DEFAULT_KFP_SECRET = "prepline-kfp"
KFP_SECRET_KEYS = {"KF_PIPELINES_TOKEN": "KF_PIPELINES_TOKEN"}
PIPELINE_NAME = "prepline-super-chained"


@lru_cache(maxsize=None)
def chained_super_pipeline():
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
        kfp_host: str = "",
        kfp_namespace: str = "",
        kfp_experiment: str = "",
        kfp_token_secret: str = DEFAULT_KFP_SECRET,
        stage_pipeline_version: str = "",
    ):
        parent = dsl.PIPELINE_JOB_ID_PLACEHOLDER

        def stage(name: str, input_stage: str, input_from_split: bool = False, lang=None):
            t = run_pipeline(
                pipeline_name=stage_component_name(name),
                parameters={"input_stage": input_stage, "input_from_split": input_from_split},
                pipeline_version=stage_pipeline_version,
                parent_run_id=parent,
                inherit_parameters=True,
                run_id_parameter="run_id",
                item=lang if lang is not None else "",
                item_parameter="branch" if lang is not None else "",
                experiment=kfp_experiment,
                host=kfp_host,
                namespace=kfp_namespace,
            ).set_display_name(name)
            t.set_caching_options(False)  # a stage's effect is its child run and output folder
            kubernetes.use_secret_as_env(t, secret_name=kfp_token_secret, secret_key_to_env=KFP_SECRET_KEYS, optional=True)
            return t

        prev, prev_name = None, ""
        for s in glob:
            t = stage(s, prev_name)
            if prev is not None:
                t.after(prev)
            prev, prev_name = t, s
        if not branch:
            return
        if prev_name != "lang_id":  # no language split: the branch stages run once, un-branched
            for s in branch:
                t = stage(s, prev_name)
                if prev is not None:
                    t.after(prev)
                prev, prev_name = t, s
            return
        with dsl.ParallelFor(languages, parallelism=len(DEFAULT_LANGUAGES), name="per-language") as lang:
            bprev, bprev_name = None, ""
            for s in branch:
                t = stage(s, bprev_name or prev_name, input_from_split=bprev is None, lang=lang)
                t.after(bprev if bprev is not None else prev)
                bprev, bprev_name = t, s
        if bprev_name == "tokenization":
            # the fan-in of factory.super_pipeline, as a step of this (parent) run: a primitive component
            # needs no nesting, and the parent's run id is the one every child wrote under
            ft = fine_tune(
                mode=train_mode, work_root=work_root, run_id=parent, languages=languages,
                train_languages=train_languages, train_params_json=train_params_json, trainjob_json=trainjob_json,
                s3_secret_name=s3_secret_name, timeout_seconds=train_timeout_seconds,
            ).after(bprev)
            ft.set_display_name("fine_tune").set_caching_options(False)
            _with_s3_secret(ft, s3_secret_name)

    body.__doc__ = (
        "The SDK-chained super pipeline: " + " → ".join(glob) + (" → per language: " + " → ".join(branch) if branch else "")
        + "; each stage starts its uploaded simple pipeline as a child run and waits for it.\n\n"
        "Args:\n"
        "    input_path: Input folder or s3:// URI of Parquet files.\n"
        "    work_root: Folder or s3:// URI under which every child writes <work_root>/<this run's id>/[lang=<branch>/]<stage>.\n"
        "    languages: Language branches to run after lang_id (ISO codes as fastText gives them).\n"
        "    overrides_json: Per-stage overrides {\"<stage>\": {\"params\": {...}, \"cluster\": {...}}}.\n"
        "    provider: Where each child's Ray cluster comes from: 'kuberay' or 'local'.\n"
        "    provider_json: Provider options as JSON.\n"
        "    cluster_json: Cluster resources as JSON (see the simple pipelines).\n"
        "    max_failed_files: Input files allowed to fail per stage.\n"
        "    timeout_seconds: Maximum run time of each stage's Ray job.\n"
        "    start_timeout_seconds: Maximum time to wait for each cluster.\n"
        "    s3_secret_name: Kubernetes secret with the S3 credentials for the children's steps.\n"
        + (TRAIN_PARAMS_DOC.lstrip("\n") if "tokenization" in branch else "") +
        "    kfp_host: KFP API endpoint the steps call ('' = the in-cluster ml-pipeline service).\n"
        "    kfp_namespace: User namespace of the child runs (multi-user KFP).\n"
        "    kfp_experiment: Experiment of the child runs ('' = this run's experiment).\n"
        "    kfp_token_secret: Kubernetes secret with KF_PIPELINES_TOKEN for the API calls (optional).\n"
        "    stage_pipeline_version: Version name of the uploaded stage pipelines to start ('' = the newest of each).\n"
    )
    body.__name__ = "super_chained"
    return dsl.pipeline(name=PIPELINE_NAME,
                        description="prepline super pipeline chained through the KFP API: one child run per stage, per-language branches")(body)
