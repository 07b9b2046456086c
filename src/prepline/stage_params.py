"""The parameters of the pipelines and stage components, declared once: name, type, default and help.

The simple pipelines, the super pipeline, the SDK-chained super pipeline (``pipelines/``) and the
Elyra catalog entries (:mod:`prepline.elyra`) take their signatures, defaults and descriptions from
this table, so a parameter reads the same in the KFP UI, in Elyra and in the docs. No kfp import here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

#: defaults that work on one machine (kfp.local + a local Ray head per stage)
DEFAULT_INPUT = "/tmp/prepline/sample"
DEFAULT_WORK_ROOT = "/tmp/prepline/work"
DEFAULT_LANGUAGES = ["en", "ja", "fr"]
#: S3 credentials reach the component pods from this Kubernetes secret (a pipeline parameter)
DEFAULT_S3_SECRET = "prepline-s3"
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
    PipelineParam("input_path", str, DEFAULT_INPUT,
                  "Input folder or s3:// URI of Parquet files (read by a first stage; ignored when input_stage is set)."),
    PipelineParam("work_root", str, DEFAULT_WORK_ROOT,
                  "Folder or s3:// URI under which every stage writes <work_root>/<run id>/[lang=<branch>/]<stage>."),
    PipelineParam("languages", list, DEFAULT_LANGUAGES,
                  "Language branches to run after lang_id (ISO codes as fastText gives them)."),
    PipelineParam("params_json", str, "{}", "The transform's parameters as a JSON object (see the table above); {} for the defaults."),
    PipelineParam("overrides_json", str, "{}",
                  'Per-stage overrides {"<stage>": {"params": {...}, "cluster": {...}}} (used by super pipelines).'),
    PipelineParam("branch", str, "", "Language branch this stage runs for ('' outside a per-language branch)."),
    PipelineParam("input_stage", str, "", "Read the output of this earlier stage of the same run instead of input_path."),
    PipelineParam("input_from_split", bool, False,
                  "With input_stage: read its lang=<branch> sub-folder (the stage after lang_id's split)."),
    PipelineParam("provider", str, "local",
                  "Where the Ray cluster comes from: 'kuberay' (KubeRay API server) or 'local' (a Ray head in the step's machine)."),
    PipelineParam("provider_json", str, "{}",
                  'Provider options as JSON, e.g. {"server": "http://kuberay-apiserver:8888", "namespace": "kubeflow", "api_version": "v2"}.'),
    PipelineParam("cluster_json", str, "{}",
                  "Cluster resources as JSON: head/workers {cpu, memory, gpu, replicas}, image, env, env_from_secrets, "
                  "tolerations, node_selector, labels, service_account, cpus_per_worker."),
    PipelineParam("max_failed_files", int, 0, "Input files allowed to fail (listed in metadata.json); the step fails beyond that."),
    PipelineParam("timeout_seconds", int, 86400, "Maximum run time of the Ray job."),
    PipelineParam("start_timeout_seconds", int, 900, "Maximum time to wait for the cluster to accept jobs."),
    PipelineParam("s3_secret_name", str, DEFAULT_S3_SECRET,
                  "Kubernetes secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally PREPLINE_S3_ENDPOINT) for the steps."),
    PipelineParam("run_id", str, "",
                  "Run id under which the stage's paths are derived ('' = this run's own id); the SDK-chained super pipeline "
                  "passes its run id so every child run writes under the parent's work folder."),
    # the closing fine-tune step of the super pipelines
    PipelineParam("train_mode", str, "local",
                  "Fine-tuning at the end: 'local' (a subprocess of the step) or 'cluster' (a Kubeflow Trainer TrainJob)."),
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
         "provider_json", "cluster_json", "max_failed_files", "timeout_seconds", "start_timeout_seconds", "s3_secret_name", "run_id"]
#: what a super pipeline passes down to every stage unchanged
SHARED = ["work_root", "overrides_json", "provider", "provider_json", "cluster_json", "max_failed_files", "timeout_seconds",
          "start_timeout_seconds", "s3_secret_name"]
TRAIN = ["train_mode", "train_languages", "train_params_json", "trainjob_json", "train_timeout_seconds"]
SUPER = ["input_path", "work_root", "languages", *SHARED[1:], *TRAIN]
CHAINED = [*SUPER, "kfp_host", "kfp_namespace", "kfp_experiment", "kfp_token_secret", "stage_pipeline_version"]


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
    valid (types, ranges, names). The first step of a pipeline calls it, so a typo in the last
    stage's parameters fails in seconds, not after the stages before it ran. Returns the overrides."""
    import json

    from prepline import registry
    from prepline.errors import ConfigError

    example = '{"filter": {"params": {"criteria": ["..."]}, "cluster": {"workers": {"replicas": 4}}}}'
    if overrides_json in ("", None):
        return {}
    try:
        o = json.loads(overrides_json, parse_constant=lambda c: float("nan"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"overrides_json is not valid JSON ({e.msg} at char {e.pos}): {overrides_json[:200]!r}", f"e.g. {example}") from None
    if not isinstance(o, dict):
        raise ConfigError(f"overrides_json must be a JSON object of stages, got {type(o).__name__}", f"e.g. {example}")
    for stage, s in o.items():
        if stage not in registry.names():
            raise ConfigError(f"overrides_json names stage '{stage}', which does not exist",
                              f"stages: {', '.join(registry.names())}")
        if not isinstance(s, dict) or set(s) - {"params", "cluster"}:
            raise ConfigError(f"overrides_json[{stage!r}] must be an object with 'params' and/or 'cluster'", f"e.g. {example}")
        if not isinstance(s.get("params", {}), dict) or not isinstance(s.get("cluster", {}), dict):
            raise ConfigError(f"overrides_json[{stage!r}]: 'params' and 'cluster' must be JSON objects", f"e.g. {example}")
        try:
            registry.get(stage).Config.from_params(s.get("params", {}))
        except ConfigError as e:
            raise ConfigError(f"overrides_json[{stage!r}]: {e.message}", e.fix) from None
    return o
