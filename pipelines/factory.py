"""One factory for every pipeline: a simple pipeline per registered transform, and the pipelines
compiled from a pipeline spec (:mod:`prepline.pipelines.spec`), nested or SDK-chained. The
shipped super pipeline is the spec ``specs/super.yaml``::

    plan → [ingest] → global stages → ParallelFor(languages){branch stages up to filter}
         → train_tokenizer → ParallelFor(languages){tokenization} → check_documents → fine_tune → run_report

``plan`` resolves the spec for the run and writes ``plan.json`` to the run folder; every stage
reads its input, parameters and cluster from there (``from_plan``), and a stage the plan does
not run for a branch (ingest for a Parquet input, hap outside English) ends after its prepare
step. Stages not in the registry are refused by the spec, never stubbed.

No hand-written pipeline per transform, no environment read at compile time: the compiled YAML
depends only on the registry, the spec, these functions and the one image setting (``ImageSet``:
registry and tag). Every task's image is a pipeline parameter (``launcher_image``, ``trainer_image``;
``task.set_container_image``, resolved by the KFP driver, backend >= 2.4) whose default is that
setting; ``ray_image`` goes to the clusters the same way.
"""

import json
from functools import lru_cache

from kfp import dsl, kubernetes

from prepline import registry, stage_params
from prepline.components.fine_tune import fine_tune
from prepline.components.pipeline_steps import check_documents, plan_run, run_report, train_tokenizer
from prepline.components.ray_stage import SKIP, execute_ray_job, prepare_args, start_ray_cluster, stop_ray_cluster
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet
from prepline.pipelines import spec as specs
from prepline.pipelines.spec import INGEST, PipelineSpec

S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                  "PREPLINE_S3_ENDPOINT": "PREPLINE_S3_ENDPOINT"}


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


def _step(task, name: str, image):
    """A pipeline step around the stages: its name, no caching (its effect is in the run folder), its image."""
    task.set_display_name(name).set_caching_options(False)
    return in_image(task, image)


@lru_cache(maxsize=None)
def simple_pipeline(transform: str, images: ImageSet = DEFAULT_IMAGES):
    """The simple pipeline of one transform: prepare_args → start → run, with stop as the exit task;
    start and run only when prepare says the stage runs (a spec pipeline's plan may say it does not)."""
    cls = registry.get(transform)

    def build(input_path, work_root, params_json, overrides_json, branch, input_stage, input_from_split, provider,
              provider_json, cluster_json, max_failed_files, timeout_seconds, start_timeout_seconds, s3_secret_name, run_id,
              launcher_image, ray_image, from_plan):
        job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        stop = stop_ray_cluster(provider=provider, provider_json=provider_json, cluster_json=cluster_json,
                                overrides_json=overrides_json, run_id=job_id, stage=transform, branch=branch, work_root=work_root,
                                from_plan=from_plan, run_id_override=run_id).set_display_name(f"stop cluster ({transform})")
        with dsl.ExitHandler(stop, name=f"{stage_component_name(transform)}-stage"):
            prep = prepare_args(
                transform=transform, params_json=params_json, overrides_json=overrides_json, work_root=work_root, run_id=job_id,
                stage=transform, branch=branch, input_path=input_path, input_stage=input_stage,
                input_from_split=input_from_split, cluster_json=cluster_json, run_id_override=run_id, from_plan=from_plan,
            ).set_display_name(f"prepare {transform}")
            with dsl.If(prep.output != SKIP, name=f"{stage_component_name(transform)}-runs"):
                start = start_ray_cluster(prepared=prep.output, provider=provider, provider_json=provider_json,
                                          timeout_seconds=start_timeout_seconds, ray_image=ray_image, s3_secret_name=s3_secret_name)
                start.set_display_name(f"start cluster ({transform})")
                run = execute_ray_job(prepared=prep.output, provider=provider, provider_json=provider_json,
                                      max_failed_files=max_failed_files, timeout_seconds=timeout_seconds).after(start)
                run.set_display_name(f"run {transform}")
        for t in (prep, start, run, stop):  # prepare and stop read the run's plan.json with from_plan
            _with_s3_secret(t, s3_secret_name)
            t.set_caching_options(False)  # a stage's effect is its output folder, not a KFP artifact
            in_image(t, launcher_image)

    summary = f"{transform}: {cls.summary}.\n\nTransform parameters (params_json):\n{_params_table(transform)}"
    return make_pipeline(stage_component_name(transform), transform, f"prepline {transform}: {cls.summary}", summary,
                         stage_params.STAGE, build, stage_params.image_defaults(images))


# ----------------------------------------------------------------------------------------------
# pipelines from a spec


def spec_params(spec: PipelineSpec) -> list[str]:
    """The parameters of a spec pipeline (the training ones only when it trains)."""
    return [p for p in stage_params.SUPER if spec.train or p not in stage_params.TRAIN]


def spec_defaults(spec: PipelineSpec, images: ImageSet = DEFAULT_IMAGES) -> dict:
    """A spec pipeline's parameter defaults that differ from :mod:`prepline.stage_params`: its
    languages, input format, text column and field; overrides_json and train_params_json are {} (what a
    user passes merges into the spec's settings, it does not replace them)."""
    d = {"input_format": spec.input_format, "text_column": spec.text_column,
         "text_field": str(spec.input_params.get("text_field", "text")), **stage_params.image_defaults(images)}
    if spec.branches:
        d["languages"] = list(spec.branches.languages)
    if not spec.train:
        d.pop("trainer_image")
    return d


#: spec pipelines' descriptions that differ from the stage ones
SUPER_HELP = {"input_path": "Input folder, file or s3:// URI: Parquet, or JSONL, CSV, WARC/WET, HF dataset shards (see input_format).",
              "train_params_json": "Training parameters as JSON, merged over the pipeline spec's (steps, batch_size, lr, seq_len, ...: "
                                   "docs/fine_tune.md)."}


def wire(spec: PipelineSpec, a: dict, stage, run_id) -> None:
    """The graph of a spec pipeline (module doc). ``stage(name, lang)`` creates one stage's task
    (``lang`` is None outside the branches), ``a`` holds the pipeline's arguments and ``run_id``
    is the run the stages write under."""
    launcher = a["launcher_image"]
    plan = _step(plan_run(spec_json=spec.to_json(), input_path=a["input_path"], work_root=a["work_root"], run_id=run_id,
                          languages=a["languages"], input_format=a["input_format"], text_column=a["text_column"], text_field=a["text_field"],
                          overrides_json=a["overrides_json"], cluster_json=a["cluster_json"]), "plan", launcher)
    _with_s3_secret(plan, a["s3_secret_name"])
    last = plan
    for s in ([INGEST] if INGEST in registry.names() else []) + [s.name for s in spec.stages]:
        last = stage(s, None).set_display_name(s).after(last)
    if spec.branches:
        names = [s.name for s in spec.branch_stages]
        cut = spec.tokenizer_split()
        loops = [names[:cut], names[cut:]] if cut is not None else [names]
        for i, group in enumerate(loops):
            if i == 1:  # one tokenizer for every branch, trained on what the first loop wrote
                last = _step(train_tokenizer(work_root=a["work_root"], run_id=run_id), "train_tokenizer", launcher).after(last)
                _with_s3_secret(last, a["s3_secret_name"])
            if not group:
                continue
            with dsl.ParallelFor(a["languages"], parallelism=len(spec.branches.languages) + 1,
                                 name="per-language" + ("-tokens" if i else "")) as lang:
                prev = last
                for s in group:
                    prev = stage(s, lang).set_display_name(s).after(prev)
            last = prev  # after() on a task of a loop waits for every iteration
    check = _step(check_documents(work_root=a["work_root"], run_id=run_id), "check_documents", launcher).after(last)
    last = _with_s3_secret(check, a["s3_secret_name"])
    if spec.train:
        ft = fine_tune(
            mode=a["train_mode"], work_root=a["work_root"], run_id=run_id, languages=a["languages"],
            train_languages=a["train_languages"], train_params_json=a["train_params_json"], trainjob_json=a["trainjob_json"],
            s3_secret_name=a["s3_secret_name"], timeout_seconds=a["train_timeout_seconds"], trainer_image=a["trainer_image"],
            defaults_json=json.dumps(spec.train_params, sort_keys=True),
        ).after(check)
        last = _with_s3_secret(_step(ft, "fine_tune", a["trainer_image"]), a["s3_secret_name"])
    # the run's HTML report, last (an HTML artifact in the KFP UI, and report.html in the run folder)
    report = _step(run_report(work_root=a["work_root"], run_id=run_id), "run_report", launcher).after(last)
    _with_s3_secret(report, a["s3_secret_name"])


def spec_pipeline(spec: PipelineSpec, images: ImageSet = DEFAULT_IMAGES):
    """The nested KFP pipeline of a spec: each stage is its simple pipeline, one cluster per stage."""
    return _spec_pipeline(spec.to_json(), images)


@lru_cache(maxsize=None)
def _spec_pipeline(spec_json: str, images: ImageSet):
    spec = specs.load(json.loads(spec_json))
    # made before the graph: a pipeline cannot be defined while another one is
    stages = {s: simple_pipeline(s, images) for s in [*spec.order()] if s in registry.names()}

    def build(**a):
        shared = {k: a[k] for k in stage_params.SHARED}

        def stage(s, lang):
            return stages[s](input_path=a["input_path"], branch="" if lang is None else lang, from_plan=True, **shared)

        wire(spec, a, stage, dsl.PIPELINE_JOB_ID_PLACEHOLDER)

    return make_pipeline(spec.kfp_name(), spec.name, f"prepline {spec.name}: {spec.description or 'a pipeline spec'}",
                         spec.summary(f"The {spec.name} pipeline"), spec_params(spec), build, spec_defaults(spec, images),
                         SUPER_HELP)


def super_pipeline(images: ImageSet = DEFAULT_IMAGES):
    """The shipped super pipeline (specs/super.yaml)."""
    return spec_pipeline(specs.shipped(), images)


def pipelines(images: ImageSet = DEFAULT_IMAGES) -> dict:
    """Every pipeline by its name (the compiled file stem), its images from ``images``."""
    from prepline.pipelines.chained import chained_pipeline

    out = {t: simple_pipeline(t, images) for t in registry.names()}
    for shipped in map(specs.shipped, specs.shipped_names()):
        out[shipped.name] = spec_pipeline(shipped, images)
        out[f"{shipped.name}_chained"] = chained_pipeline(shipped, images)
    return out


def spec_pipelines(spec: PipelineSpec, images: ImageSet = DEFAULT_IMAGES) -> dict:
    """The nested and the SDK-chained pipeline of a spec, by their file stems."""
    from prepline.pipelines.chained import chained_pipeline

    return {spec.name: spec_pipeline(spec, images), f"{spec.name}_chained": chained_pipeline(spec, images)}
