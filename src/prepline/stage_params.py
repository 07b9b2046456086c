"""The parameters of the pipelines and stage components, declared once: name, type, default and help.

The simple pipelines, the super pipeline, the SDK-chained super pipeline (``pipelines/``) and the
Elyra catalog entries (:mod:`prepline.elyra`) take their signatures, defaults and descriptions from
this table, so a parameter reads the same in the KFP UI, in Elyra and in the docs. No kfp import here.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet

REQUIRED = inspect.Parameter.empty
DEFAULT_LANGUAGES = ["en", "ja", "fr"]
#: the compiled pipelines run on a cluster: Ray clusters from KubeRay, through its API server's
#: in-cluster address (the Helm chart's Service ``kuberay-apiserver-service``, port 8888; install it
#: in namespace ray-system as deploy/README.md shows, or pass provider_json). Local runs
#: (``prepline pipeline run --local``, scripts/main.sh, tests) pass provider=local explicitly.
DEFAULT_PROVIDER = "kuberay"
DEFAULT_KUBERAY_SERVER = "http://kuberay-apiserver-service.ray-system.svc.cluster.local:8888"
DEFAULT_PROVIDER_JSON = json.dumps({"server": DEFAULT_KUBERAY_SERVER})
#: fine-tuning in the fine_tune step's own pod (the trainer image has torch); 'cluster' = a TrainJob
DEFAULT_TRAIN_MODE = "local"
from prepline.s3_credentials import DEFAULT_S3_SECRET  # noqa: E402 (the secret of s3_secret_name; its home: the S3 credentials)
#: the bearer token for the KFP API reaches the chained pipeline's run_pipeline steps from this secret
DEFAULT_KFP_SECRET = "prepline-kfp"


@dataclass(frozen=True)
class PipelineParam:
    name: str
    type: type  # str, int, bool or list
    default: Any
    help: str

    def parameter(self, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
        d = self.default if default is inspect.Parameter.empty else default
        return inspect.Parameter(self.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=self.type)


_ALL = [
    PipelineParam("input_path", str, REQUIRED,
                  "Input folder, file or s3:// URI: Parquet; ingest reads JSONL(.gz/.zst), CSV/TSV, WARC/WET and Hugging Face "
                  "dataset shards (read by a first stage; ignored when input_stage is set). Required."),
    PipelineParam("work_root", str, REQUIRED,
                  "s3:// URI (or a folder every step and Ray pod mounts) under which every stage writes "
                  "<work_root>/<run id>/[lang=<branch>/]<stage>. Required."),
    PipelineParam("languages", list, DEFAULT_LANGUAGES,
                  "Language branches to run after lang_id (ISO codes as fastText gives them); 'other' adds a branch over every "
                  "language without its own (else those documents are kept aside in lang_id's lang=other and counted)."),
    PipelineParam("input_format", str, "auto",
                  "Format of input_path: auto (by the files' extensions), parquet, jsonl, csv, warc, wet or hf; anything but "
                  "Parquet goes through ingest first."),
    PipelineParam("text_column", str, "contents",
                  "The text column of every stage (their content_column, ingest's text_column, ${text_column} in the filter criteria); "
                  "for a Parquet input, its column holding the text."),
    PipelineParam("text_field", str, "text",
                  "For JSONL, CSV and Hugging Face input: the field holding the text (ingest's text_field; default: the "
                  "pipeline spec's input.params.text_field, else 'text'). Ingest writes it to text_column."),
    PipelineParam("from_plan", bool, False,
                  "Internal (set by the super pipeline). Take the stage's input, parameters and cluster from the run's plan.json, which the first step of a super "
                  "pipeline writes (params_json, overrides_json, input_stage and input_from_split are then not used)."),
    PipelineParam("params_json", str, "{}", "The transform's parameters as a JSON object (see the table above); {} for the defaults."),
    PipelineParam("overrides_json", str, "{}",
                  'Settings merged over the defaults (docs/pipelines.md): {"<stage>": {"params": {...}, "cluster": {...}, '
                  '"branches": {"<language>": {"params": {...}}}, "allow_empty_output": true}}; "tokenizer": the shared '
                  'tokenizer\'s params. A stage that removes every document fails unless allow_empty_output is set for it.'),
    PipelineParam("branch", str, "", "Internal (set by the super pipeline). Language branch this stage runs for ('' outside a per-language branch)."),
    PipelineParam("input_stage", str, "", "Internal (set by the super pipeline). Read the output of this earlier stage of the same run instead of input_path."),
    PipelineParam("input_from_split", bool, False,
                  "Internal (set by the super pipeline). With input_stage: read its lang=<branch> sub-folder (the stage after lang_id's split)."),
    PipelineParam("provider", str, DEFAULT_PROVIDER,
                  "Where the Ray cluster comes from: 'kuberay' (a RayCluster through the KubeRay API server) or 'local' "
                  "(a Ray head on the machine running the step: kfp.local only, the launcher image has no Ray)."),
    PipelineParam("provider_json", str, DEFAULT_PROVIDER_JSON,
                  'KubeRay options as JSON: server (the KubeRay API server), namespace (default: the step\'s own), '
                  'api_version (v2 | v1), job_access (direct: the head service from inside the cluster | apiserver: '
                  'through the API server, needs RBAC create on services/proxy), pending_grace_seconds (docs/cluster.md).'),
    PipelineParam("cluster_json", str, "{}",
                  "Cluster resources as JSON: head/workers {cpu, memory, gpu, replicas}, gpu_workers (a GPU group next to the "
                  "workers: {gpu, cpu, memory, replicas, tolerations, node_selector}), image (default: ray_image), env, "
                  "env_from_secrets (default: every key of s3_secret_name), tolerations, node_selector, labels, "
                  "pod_annotations (default: sidecar.istio.io/inject false), namespace (default: provider_json's), "
                  "service_account, cpus_per_worker, gpus_per_worker (default 1 with a GPU group)."),
    PipelineParam("max_failed_files", int, 0, "Input files allowed to fail (listed in metadata.json); the step fails beyond that."),
    PipelineParam("timeout_seconds", int, 86400, "Maximum run time of the Ray job."),
    PipelineParam("start_timeout_seconds", int, 900, "Maximum time to wait for the cluster to accept jobs."),
    PipelineParam("s3_secret_name", str, DEFAULT_S3_SECRET,
                  "Kubernetes secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally PREPLINE_S3_ENDPOINT) for the "
                  "steps and, unless cluster_json sets env_from_secrets, for the Ray head and workers. Optional: a name with no such "
                  "secret means no credentials; never '' (Kubernetes rejects an empty secret name: every pod would fail)."),
    PipelineParam("launcher_image", str, DEFAULT_IMAGES.launcher,
                  "Image of the pipeline's steps (prepline[kfp]); set at compile time by prepline compile --registry/--tag."),
    PipelineParam("ray_image", str, DEFAULT_IMAGES.ray,
                  "Image of the Ray head and workers (cluster_json's image wins); from prepline compile --registry/--tag."),
    PipelineParam("run_id", str, "",
                  "Internal (set by the SDK-chained super pipeline). Run id under which the stage's paths are derived ('' = this run's own id); the SDK-chained super pipeline "
                  "passes its run id so every child run writes under the parent's work folder."),
    # the closing fine-tune step of the super pipelines
    PipelineParam("train_mode", str, DEFAULT_TRAIN_MODE,
                  "Fine-tuning at the end: 'local' (in the fine_tune step's pod, trainer image) or 'cluster' (a Kubeflow Trainer TrainJob)."),
    PipelineParam("trainer_image", str, DEFAULT_IMAGES.trainer,
                  "Image of the fine_tune step and of the TrainJob's nodes (Ray image + torch; trainjob_json's image wins)."),
    PipelineParam("train_languages", list, [],
                  "Languages whose token shards train the model (a JSON list); [] = every branch of languages."),
    PipelineParam("train_params_json", str, "{}",
                  "Training parameters as JSON (steps, batch_size, lr, seq_len, seed, base_model, ...: docs/fine_tune.md)."),
    PipelineParam("trainjob_json", str, "{}",
                  "TrainJob options as JSON (namespace, runtime, image, num_nodes, resources_per_node, active_deadline_seconds, ...)."),
    PipelineParam("train_timeout_seconds", int, 86400, "Maximum time the fine-tuning step waits for training."),
    # the SDK-chained super pipeline's calls to the KFP API
    PipelineParam("kfp_host", str, "", "KFP API endpoint the steps call ('' = the in-cluster ml-pipeline service)."),
    PipelineParam("kfp_namespace", str, "", "User namespace of the child runs (multi-user KFP)."),
    PipelineParam("kfp_experiment", str, "", "Experiment of the child runs ('' = this run's experiment)."),
    PipelineParam("kfp_token_secret", str, DEFAULT_KFP_SECRET,
                  "Kubernetes secret with KF_PIPELINES_TOKEN for the API calls (optional)."),
    PipelineParam("stage_pipeline_version", str, "",
                  "Version name of the uploaded stage pipelines to start ('' = the newest of each)."),
]
PARAMS: dict[str, PipelineParam] = {p.name: p for p in _ALL}

#: what every stage takes besides its transform's parameters, in the order of the simple pipelines
STAGE = ["input_path", "work_root", "params_json", "overrides_json", "branch", "input_stage", "input_from_split", "provider",
         "provider_json", "cluster_json", "max_failed_files", "timeout_seconds", "start_timeout_seconds", "s3_secret_name", "run_id",
         "launcher_image", "ray_image", "from_plan"]
#: what a super pipeline passes down to every stage unchanged
SHARED = ["work_root", "overrides_json", "provider", "provider_json", "cluster_json", "max_failed_files", "timeout_seconds",
          "start_timeout_seconds", "s3_secret_name", "launcher_image", "ray_image"]
TRAIN = ["train_mode", "train_languages", "train_params_json", "trainjob_json", "train_timeout_seconds", "trainer_image"]
SUPER = ["input_path", "work_root", "languages", "input_format", "text_column", "text_field", *SHARED[1:], *TRAIN]
CHAINED = [*SUPER, "kfp_host", "kfp_namespace", "kfp_experiment", "kfp_token_secret", "stage_pipeline_version"]


#: the per-stage (and per-branch) setting of overrides_json that lets a stage remove every document
ALLOW_EMPTY = "allow_empty_output"


def allow_empty(overrides: dict, stage: str, branch: str = "") -> bool:
    """overrides_json's ``allow_empty_output`` for one stage (its branch's setting wins)."""
    s = overrides.get(stage, {}) if isinstance(overrides, dict) else {}
    b = s.get("branches", {}).get(branch, {}) if branch else {}
    return bool(b.get(ALLOW_EMPTY, s.get(ALLOW_EMPTY, False)))


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base``: mappings key by key, anything else (lists too) replaced."""
    import copy

    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def image_defaults(images: ImageSet) -> dict[str, str]:
    """The image parameters' defaults for one registry/tag setting."""
    return {"launcher_image": images.launcher, "ray_image": images.ray, "trainer_image": images.trainer}


def signature(names: list[str], defaults: dict[str, Any] | None = None) -> inspect.Signature:
    """A function signature of these parameters (KFP reads a pipeline's interface from it)."""
    defaults = defaults or {}
    return inspect.Signature([PARAMS[n].parameter(defaults.get(n, inspect.Parameter.empty)) for n in names])


def args_doc(names: list[str], descriptions: dict[str, str] | None = None) -> str:
    """The ``Args:`` section of a docstring (KFP turns it into the parameters' descriptions)."""
    descriptions = descriptions or {}
    return "Args:\n" + "".join(f"    {n}: {descriptions.get(n, PARAMS[n].help)}\n" for n in names)


def check_overrides(overrides_json: str) -> dict:
    """Check ``overrides_json`` whole: every stage it names exists and every stage's parameters are
    valid (types, ranges, names), at stage level and per branch
    (``{"<stage>": {"params": {...}, "cluster": {...}, "branches": {"<branch>": {"params": ..., "cluster": ...}}}}``;
    ``tokenizer`` holds the shared tokenizer's parameters). The first step of a pipeline calls it,
    so a typo in the last stage's parameters fails in seconds, not after the stages before it ran.
    Returns the overrides."""
    import json

    from prepline import registry
    from prepline.errors import ConfigError

    example = '{"filter": {"params": {"criteria": ["..."]}, "cluster": {"workers": {"replicas": 4}}, "branches": {"ja": {"params": {...}}}}}'
    if overrides_json in ("", None):
        return {}
    try:
        o = json.loads(overrides_json, parse_constant=lambda c: float("nan"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"overrides_json is not valid JSON ({e.msg} at char {e.pos}): {overrides_json[:200]!r}", f"e.g. {example}") from None
    if not isinstance(o, dict):
        raise ConfigError(f"overrides_json must be a JSON object of stages, got {type(o).__name__}", f"e.g. {example}")
    for stage, s in o.items():
        config = _config_of(stage)
        if config is None:
            raise ConfigError(f"overrides_json names stage '{stage}', which does not exist",
                              f"stages: {', '.join(registry.names())} (and tokenizer: the shared tokenizer)")
        _check_settings(f"overrides_json[{stage!r}]", s, config, example, branches=True)
        for b, bs in s.get("branches", {}).items():
            _check_settings(f"overrides_json[{stage!r}]['branches'][{b!r}]", bs, config, example, branches=False)
    return o


def _config_of(stage: str):
    from prepline import registry

    if stage == "tokenizer":
        from prepline.tokens.shared import SharedTokenizerConfig

        return SharedTokenizerConfig
    return registry.get(stage).Config if stage in registry.names() else None


def _check_settings(where: str, s, config, example: str, branches: bool) -> None:
    from prepline.errors import ConfigError

    keys = ["params", "cluster"] + (["branches"] if branches else [])
    if not isinstance(s, dict) or set(s) - set(keys) - {ALLOW_EMPTY}:
        raise ConfigError(f"{where} must be an object with {', '.join(repr(k) for k in keys)} (and {ALLOW_EMPTY!r})", f"e.g. {example}")
    if any(not isinstance(s.get(k, {}), dict) for k in keys):
        raise ConfigError(f"{where}: {', '.join(repr(k) for k in keys)} must be JSON objects", f"e.g. {example}")
    if not isinstance(s.get(ALLOW_EMPTY, False), bool):
        raise ConfigError(f"{where}: {ALLOW_EMPTY!r} must be true or false, got {s[ALLOW_EMPTY]!r}",
                          f'e.g. {{"filter": {{"{ALLOW_EMPTY}": true}}}}: the stage succeeds even when it removes every document')
    try:
        config.check_params(s.get("params", {}))  # the merged whole is checked by the plan / prepare
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}", e.fix) from None
