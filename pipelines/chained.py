"""The SDK-chained super pipeline, for KFP backends that cannot nest pipelines ("N+1 runs").

Same stages, order and per-language ``ParallelFor`` as :func:`prepline.pipelines.factory.super_pipeline`
(its ``super_stages()``, ``default_overrides()`` and ``DEFAULT_*`` constants; its closing fine_tune
fan-in is a plain step of the parent run here), but each data stage is one
``run_pipeline`` step that starts the stage's *uploaded* simple pipeline as a child run and waits
for it. The stage pipelines are looked up under the name the KFP UI's upload dialog gives them,
the file stem (``doc_id``); a pipeline uploaded under its compiled name (``doc-id``, what
``prepline kfp upload`` uses: KFP pipeline names take no ``_``) is found too. Upload them first::

    for f in compiled/pipelines/*.yaml; do prepline kfp upload "$f"; done   # or the UI's upload dialog

Children get the parent's values of the parameters they share (input_path, work_root,
overrides_json, provider, cluster_json, ...), read by ``run_pipeline`` from the parent run
through the API — so no pipeline-parameter placeholder has to be resolved inside a struct — plus
their stage wiring (``input_stage``, ``input_from_split``), the language as ``branch``, and the
parent's run id as ``run_id``: every child reads and writes under
``<work_root>/<parent run id>/[lang=<branch>/]<stage>``, exactly the folders the nested super
pipeline uses. Each child still starts and stops its own Ray cluster (named after the child's run).
"""

from functools import lru_cache

from kfp import dsl, kubernetes

from prepline import stage_params
from prepline.components.run_pipeline import run_pipeline
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet
from prepline.pipelines.factory import SUPER_HELP, in_image, make_pipeline, super_defaults, super_summary, wire_super

KFP_SECRET_KEYS = {"KF_PIPELINES_TOKEN": "KF_PIPELINES_TOKEN"}
PIPELINE_NAME = "prepline-super-chained"


@lru_cache(maxsize=None)
def chained_super_pipeline(images: ImageSet = DEFAULT_IMAGES):
    def build(**a):
        parent = dsl.PIPELINE_JOB_ID_PLACEHOLDER

        def stage(name: str, input_stage: str, lang, from_split: bool):
            t = run_pipeline(
                pipeline_name=name,  # the file stem: what the KFP UI's upload dialog names it
                parameters={"input_stage": input_stage, "input_from_split": from_split},
                pipeline_version=a["stage_pipeline_version"],
                parent_run_id=parent,
                inherit_parameters=True,
                run_id_parameter="run_id",
                item=lang if lang is not None else "",
                item_parameter="branch" if lang is not None else "",
                experiment=a["kfp_experiment"],
                host=a["kfp_host"],
                namespace=a["kfp_namespace"],
            )
            t.set_caching_options(False)  # a stage's effect is its child run and output folder
            in_image(t, a["launcher_image"])
            kubernetes.use_secret_as_env(t, secret_name=a["kfp_token_secret"], secret_key_to_env=KFP_SECRET_KEYS, optional=True)
            return t

        # the fine_tune fan-in is a step of this (parent) run: a primitive component needs no
        # nesting, and the parent's run id is the one every child wrote under
        wire_super(stage, a, parent)

    descriptions = {**SUPER_HELP, "work_root": "Folder or s3:// URI under which every child writes <work_root>/<this run's id>/[lang=<branch>/]<stage>.",
            "provider": "Where each child's Ray cluster comes from: 'kuberay' or 'local'."}
    return make_pipeline(PIPELINE_NAME, "super_chained",
                         "prepline super pipeline chained through the KFP API: one child run per stage, per-language branches",
                         super_summary("The SDK-chained super pipeline",
                                       "; each stage starts its uploaded simple pipeline as a child run and waits for it"),
                         stage_params.CHAINED, build, super_defaults(images), descriptions)
