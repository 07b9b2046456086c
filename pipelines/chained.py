"""The SDK-chained super pipeline, for KFP backends that cannot nest pipelines ("N+1 runs").

Same spec, stages, order and per-language ``ParallelFor`` as the nested pipeline of
:func:`prepline.pipelines.factory.spec_pipeline` (its ``wire``; plan, train_tokenizer,
check_documents and fine_tune are plain steps of the parent run here), but each data stage is one
``run_pipeline`` step that starts the stage's *uploaded* simple pipeline as a child run and waits
for it. The stage pipelines are looked up under the name the KFP UI's upload dialog gives them,
the file stem (``doc_id``); a pipeline uploaded under its compiled name (``doc-id``, what
``prepline kfp upload`` uses: KFP pipeline names take no ``_``) is found too. Upload them first::

    for f in compiled/pipelines/*.yaml; do prepline kfp upload "$f"; done   # or the UI's upload dialog

Children get the parent's values of the parameters they share (input_path, work_root,
overrides_json, provider, cluster_json, ...), read by ``run_pipeline`` from the parent run
through the API — so no pipeline-parameter placeholder has to be resolved inside a struct — plus
``from_plan`` (their input, parameters and cluster come from the parent's ``plan.json``), the
language as ``branch``, and the parent's run id as ``run_id``: every child reads and writes under
``<work_root>/<parent run id>/[lang=<branch>/]<stage>``, exactly the folders the nested super
pipeline uses. Each child still starts and stops its own Ray cluster (named after the child's run).
"""

import json
from functools import lru_cache

from kfp import dsl, kubernetes

from prepline.components.run_pipeline import run_pipeline
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet
from prepline.pipelines import spec as specs
from prepline.pipelines.factory import SUPER_HELP, in_image, make_pipeline, spec_defaults, spec_params, wire
from prepline.pipelines.spec import PipelineSpec

KFP_SECRET_KEYS = {"KF_PIPELINES_TOKEN": "KF_PIPELINES_TOKEN"}
KFP_PARAMS = ["kfp_host", "kfp_namespace", "kfp_experiment", "kfp_token_secret", "stage_pipeline_version"]


def chained_pipeline(spec: PipelineSpec, images: ImageSet = DEFAULT_IMAGES):
    """The SDK-chained pipeline of a spec (module doc)."""
    return _chained(spec.to_json(), images)


@lru_cache(maxsize=None)
def _chained(spec_json: str, images: ImageSet):
    spec = specs.load(json.loads(spec_json))

    def build(**a):
        parent = dsl.PIPELINE_JOB_ID_PLACEHOLDER

        def stage(name: str, lang):
            t = run_pipeline(
                pipeline_name=name,  # the file stem: what the KFP UI's upload dialog names it
                parameters={"from_plan": True},  # input, parameters and cluster from the parent's plan.json
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

        # plan, train_tokenizer, check_documents and fine_tune are steps of this (parent) run: primitive
        # components need no nesting, and the parent's run id is the one every child wrote under
        wire(spec, a, stage, parent)

    descriptions = {**SUPER_HELP, "work_root": "Folder or s3:// URI under which every child writes <work_root>/<this run's id>/[lang=<branch>/]<stage>.",
                    "provider": "Where each child's Ray cluster comes from: 'kuberay' or 'local'."}
    return make_pipeline(f"{spec.kfp_name()}-chained", f"{spec.name}_chained",
                         f"prepline {spec.name} chained through the KFP API: one child run per stage, per-language branches",
                         spec.summary(f"The SDK-chained {spec.name} pipeline",
                                      "; each stage starts its uploaded simple pipeline as a child run and waits for it"),
                         spec_params(spec) + KFP_PARAMS, build, spec_defaults(spec, images), descriptions)
