"""The cluster mode of the fine-tuning step: a Kubeflow Trainer ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``).

:func:`trainjob_manifest` builds the TrainJob as a plain dict: ``spec.runtimeRef`` to a
``ClusterTrainingRuntime`` / ``TrainingRuntime`` (default ``torch-distributed``), and
``spec.trainer`` with the image, the command (``python -m prepline.train`` — ``torchrun -m
prepline.train`` for several processes), the arguments (the token-shard inputs, the output and the
training parameters), ``numNodes``, ``numProcPerNode``, ``resourcesPerNode`` and ``env``. S3
credentials reach the trainer only as ``valueFrom.secretKeyRef`` references to a Kubernetes secret,
never as values. ``spec.activeDeadlineSeconds`` bounds the run on the cluster side.

:func:`run_trainjob` checks that the runtime exists, creates the TrainJob through the Kubernetes API
(the pod's service account in a cluster, else a kubeconfig), waits for ``status.conditions``
``Complete`` or ``Failed`` (with a client-side timeout too), streams the log of the trainer node
(the pod of replicated job ``node``, index 0, container ``node``), and deletes the TrainJob in
``finally`` (kept after a failure with ``keep_on_failure``).

Two clients: ``client="kubernetes"`` (default) sends the plain manifest with the ``kubernetes``
package; ``client="sdk"`` submits through the Kubeflow SDK (``kubeflow`` package,
``TrainerClient`` with its Kubernetes backend, ``CustomTrainerContainer`` + options) where it can
express the job: the SDK has no field for ``numProcPerNode`` and no ``valueFrom`` in the trainer
env, so the secret references go in a ``RuntimePatch`` of the ``node`` container there, and
``numProcPerNode`` > 1 needs the plain client. Both wait, stream and delete the same way.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field, fields
from typing import Any, TextIO

from prepline import logs
from prepline.errors import ConfigError, PreplineError, RunFailed
from prepline.train.k8s import (CLUSTER_RUNTIMES, GROUP, NODE, RUNTIMES, SA_DIR, VERSION, K8s, KubernetesError, LogFollower, api_error,
                                 condition, in_cluster, kubeconfig_path)

API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
RUNTIME_KINDS = {"ClusterTrainingRuntime": CLUSTER_RUNTIMES, "TrainingRuntime": RUNTIMES}
DEFAULT_RUNTIME = "torch-distributed"
#: environment variables filled from the S3 secret (the same keys as the pipeline steps get)
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PREPLINE_S3_ENDPOINT")
_CREDENTIAL_NAME = re.compile(r"(?i)(secret|password|token|credential|access_key)")
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class TrainJobFailed(RunFailed):
    """The TrainJob ended Failed (``reason`` from its condition: e.g. ``DeadlineExceeded``)."""

    def __init__(self, message: str, fix: str | None = None, reason: str = ""):
        super().__init__(message, fix)
        self.reason = reason


class TrainJobTimeout(RunFailed):
    """The TrainJob did not finish within the client-side timeout."""


@dataclass(frozen=True)
class TrainJobOptions:
    """Where and how the TrainJob runs. Every field is a key of the pipeline's ``trainjob_json``."""

    namespace: str = ""  # '' = the service account's namespace in a pod, else the kubeconfig context's, else 'default'
    runtime: str = DEFAULT_RUNTIME
    runtime_kind: str = "ClusterTrainingRuntime"
    image: str = ""  # '' = prepline.images.TRAINER_IMAGE (the Ray image + torch: the train extra)
    num_nodes: int = 1
    num_proc_per_node: int = 1
    resources_per_node: dict = field(default_factory=lambda: {"cpu": "2", "memory": "8Gi"})
    env: dict = field(default_factory=dict)  # plain values only; credentials come from s3_secret
    s3_secret: str = ""  # secret holding S3_SECRET_KEYS ('' = none)
    active_deadline_seconds: int = 0  # 0 = none
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    kubeconfig: str = ""  # '' = in-cluster config in a pod, else $KUBECONFIG / ~/.kube/config
    context: str = ""
    keep_on_failure: bool = False
    poll_seconds: float = 5.0
    client: str = "kubernetes"  # kubernetes | sdk

    def __post_init__(self) -> None:
        if self.runtime_kind not in RUNTIME_KINDS:
            raise ConfigError(f"runtime_kind={self.runtime_kind!r} is not one of {', '.join(RUNTIME_KINDS)}",
                              "use ClusterTrainingRuntime (cluster-wide, e.g. torch-distributed) or TrainingRuntime (namespaced)")
        if not self.runtime:
            raise ConfigError("runtime is empty", f"name a training runtime, e.g. {DEFAULT_RUNTIME}")
        if self.num_nodes < 1 or self.num_proc_per_node < 1:
            raise ConfigError(f"num_nodes={self.num_nodes} and num_proc_per_node={self.num_proc_per_node} must be >= 1", "pass 1 or more")
        if self.active_deadline_seconds < 0 or self.poll_seconds <= 0:
            raise ConfigError("active_deadline_seconds must be >= 0 (0: none) and poll_seconds > 0", "e.g. 86400 and 5")
        if self.client not in ("kubernetes", "sdk"):
            raise ConfigError(f"client={self.client!r} is not 'kubernetes' or 'sdk'", "use 'kubernetes' (plain manifest) or 'sdk' (Kubeflow SDK)")
        for k, v in self.env.items():
            if not isinstance(v, str):
                raise ConfigError(f"env[{k!r}] must be a string, got {type(v).__name__}", "quote the value")
            if k in S3_SECRET_KEYS or _CREDENTIAL_NAME.search(k):
                raise ConfigError(f"env[{k!r}] looks like a credential: credentials are never put into the TrainJob as values",
                                  "store it in a Kubernetes secret and pass its name as s3_secret (keys: " + ", ".join(S3_SECRET_KEYS) + ")")
        if self.namespace and not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", self.namespace):
            raise ConfigError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name", "use lower-case letters, digits and '-'")

    @classmethod
    def from_json(cls, text: str | dict | None) -> "TrainJobOptions":
        if isinstance(text, dict):
            d = text
        else:
            try:
                d = json.loads(text) if text else {}
            except ValueError as e:
                raise ConfigError(f"trainjob_json is not valid JSON ({e})", '{"namespace": "kubeflow", "num_nodes": 1}') from None
        if not isinstance(d, dict):
            raise ConfigError("trainjob_json must be a JSON object", '{"namespace": "kubeflow", "runtime": "torch-distributed"}')
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"trainjob_json has unknown key(s) {', '.join(unknown)}", f"known keys: {', '.join(sorted(known))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"trainjob_json: {e}", f"known keys: {', '.join(sorted(known))}") from None


def trainjob_name(run_id: str, stage: str = "fine-tune") -> str:
    """An RFC 1035 label (<= 63 chars, starting with a letter), unique per run and stage."""
    import hashlib

    digest = hashlib.sha256(json.dumps([run_id, stage]).encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]+", "-", f"{stage}-{run_id}".lower()).strip("-")
    name = re.sub("-+", "-", f"pl-{readable}")[: 62 - len(digest)].rstrip("-")
    return f"{name}-{digest}"


def _quantity(v) -> str:
    return str(v) if not isinstance(v, float) or not v.is_integer() else str(int(v))


def resources(spec: dict) -> dict:
    """``{"cpu": "2", "memory": "8Gi", "gpu": 1}`` -> ResourceRequirements (requests = limits);
    ``{"requests": {...}, "limits": {...}}`` is taken as it is."""
    if not isinstance(spec, dict):
        raise ConfigError("resources_per_node must be an object", '{"cpu": "2", "memory": "8Gi", "gpu": 0}')
    if set(spec) & {"requests", "limits"}:
        return {k: {n: _quantity(q) for n, q in spec[k].items()} for k in ("requests", "limits") if k in spec}
    out = {}
    for k, v in spec.items():
        if k == "gpu":
            if int(v):
                out["nvidia.com/gpu"] = str(int(v))
            continue
        out[k] = _quantity(v)
    return {"requests": dict(out), "limits": dict(out)}


def trainer_command(opts: TrainJobOptions) -> list[str]:
    if opts.num_nodes * opts.num_proc_per_node > 1:
        return ["torchrun", "-m", "prepline.train"]  # the runtime's PET_* variables configure torchrun
    return ["python", "-m", "prepline.train"]


def trainer_env(opts: TrainJobOptions) -> list[dict]:
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in sorted(opts.env.items()) if k != "PYTHONUNBUFFERED"]
    if opts.s3_secret:
        env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": opts.s3_secret, "key": k, "optional": True}}} for k in S3_SECRET_KEYS]
    return env


def trainjob_manifest(name: str, namespace: str, inputs: list[str], output: str, params: dict | None,
                      opts: TrainJobOptions, labels: dict | None = None, overwrite: bool = False) -> dict:
    """The TrainJob as a plain dict (what ``kubectl apply`` would send)."""
    from prepline.images import TRAINER_IMAGE
    from prepline.train.train import TrainConfig, build_args

    TrainConfig.from_params(params or {})  # a bad training parameter fails before anything is created
    if not _RFC1035.match(name) or len(name) > 63:
        raise ConfigError(f"TrainJob name {name!r} is not an RFC 1035 label of at most 63 characters", "use trainjob_name(run_id)")
    trainer: dict[str, Any] = {
        "image": opts.image or TRAINER_IMAGE,
        "command": trainer_command(opts),
        "args": build_args(inputs, output, params, overwrite),
        "numNodes": opts.num_nodes,
        "numProcPerNode": opts.num_proc_per_node,
        "resourcesPerNode": resources(opts.resources_per_node),
        "env": trainer_env(opts),
    }
    spec: dict[str, Any] = {"runtimeRef": {"apiGroup": GROUP, "kind": opts.runtime_kind, "name": opts.runtime}, "trainer": trainer}
    if opts.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = int(opts.active_deadline_seconds)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {**(labels or {}), **opts.labels}}
    if opts.annotations:
        metadata["annotations"] = dict(opts.annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


# ----------------------------------------------------------------------------------------------
# the Kubernetes API


def default_namespace(opts: TrainJobOptions) -> str:
    if opts.namespace:
        return opts.namespace
    if not opts.kubeconfig and in_cluster() and os.path.isfile(f"{SA_DIR}/namespace"):
        return open(f"{SA_DIR}/namespace").read().strip() or "default"
    try:
        from kubernetes import config

        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig_path(opts.kubeconfig))
        ctx = next((c for c in contexts if c["name"] == opts.context), current) if opts.context else current
        return (ctx or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # noqa: BLE001 - no readable kubeconfig: the default namespace
        return "default"


def check_runtime(k8s: K8s, opts: TrainJobOptions, namespace: str) -> dict:
    rt = k8s.get_runtime(opts.runtime, opts.runtime_kind, namespace)
    if rt is None:
        names = k8s.runtime_names(opts.runtime_kind, namespace)
        where = "the cluster" if opts.runtime_kind == "ClusterTrainingRuntime" else f"namespace {namespace}"
        raise ConfigError(
            f"training runtime {opts.runtime!r} ({opts.runtime_kind}) does not exist in {where}"
            + (f" (it has: {', '.join(names)})" if names else " (it has none: is Kubeflow Trainer installed?)"),
            "pass trainjob_json {\"runtime\": \"<one of them>\"} (and runtime_kind), or install the runtime "
            f"(Kubeflow Trainer's manifests ship {DEFAULT_RUNTIME})",
        )
    return rt


def run_trainjob(
    inputs: list[str],
    output: str,
    params: dict | None,
    opts: TrainJobOptions,
    name: str,
    *,
    labels: dict | None = None,
    timeout: float = 86400,
    out: TextIO | None = None,
    overwrite: bool = False,
    k8s: K8s | None = None,
) -> dict:
    """Create the TrainJob, wait for it, stream the trainer's log, delete it; return the run's summary."""
    from prepline.train.train import read_summary

    out = out or sys.stdout
    if opts.client == "sdk":
        return _run_with_sdk(inputs, output, params, opts, name, labels=labels, timeout=timeout, out=out, overwrite=overwrite)
    k8s = k8s or K8s(opts.kubeconfig, opts.context)
    ns = default_namespace(opts)
    manifest = trainjob_manifest(name, ns, inputs, output, params, opts, labels, overwrite)
    check_runtime(k8s, opts, ns)
    created, failed = False, True
    try:
        _create(k8s, manifest, out)
        created = True
        logs.say(out, "prepline.train", f"TrainJob {ns}/{name} created (runtime {opts.runtime}, {opts.num_nodes} node(s), image "
                 f"{manifest['spec']['trainer']['image']}): {' '.join(manifest['spec']['trainer']['command'])} ...")
        obj = _wait(k8s, ns, name, opts, timeout, out)
        kind, reason, message = condition(obj) or ("", "", "")
        if kind == "Failed":
            if reason == "DeadlineExceeded":
                raise TrainJobFailed(
                    f"TrainJob {ns}/{name} ran longer than activeDeadlineSeconds={obj['spec'].get('activeDeadlineSeconds')} and "
                    f"was stopped: {message}",
                    "raise active_deadline_seconds (the next run resumes from the last checkpoint), or lower steps", reason)
            raise TrainJobFailed(f"TrainJob {ns}/{name} failed ({reason or 'no reason'}): {message or 'see the trainer log above'}",
                                 "see the trainer log above", reason)
        summary = read_summary(output)
        if summary is None:
            raise RunFailed(f"TrainJob {ns}/{name} completed but wrote no metrics.json in {output}",
                            "see the trainer log above; check that the trainer and this step see the same storage")
        failed = False
        return summary
    finally:
        if created:
            if failed and opts.keep_on_failure:
                logs.say(out, "prepline.train", f"keeping the failed TrainJob {ns}/{name} (keep_on_failure): delete it with "
                         f"kubectl delete trainjob -n {ns} {name}")
            else:
                _delete(k8s, ns, name, out, raise_errors=not failed)


def _create(k8s: K8s, manifest: dict, out: TextIO) -> None:
    from kubernetes.client.exceptions import ApiException

    md = manifest["metadata"]
    try:
        k8s.create(manifest)
    except ApiException as e:  # 409: a TrainJob of this name exists (a retried step): replace it
        if e.status != 409:
            raise api_error(e, "create TrainJob") from None
        logs.say(out, "prepline.train", f"TrainJob {md['namespace']}/{md['name']} exists (a retried step?): deleting it and creating it again")
        k8s.delete(md["namespace"], md["name"])
        deadline = time.monotonic() + 120
        while k8s.get(md["namespace"], md["name"]) is not None:
            if time.monotonic() > deadline:
                raise KubernetesError(f"the old TrainJob {md['namespace']}/{md['name']} was not deleted within 120 s",
                                      "delete it by hand (kubectl delete trainjob ...) and retry") from None
            time.sleep(1.0)
        try:
            k8s.create(manifest)
        except ApiException as e2:
            raise api_error(e2, "create TrainJob") from None


def _wait(k8s: K8s, ns: str, name: str, opts: TrainJobOptions, timeout: float, out: TextIO) -> dict:
    follower = LogFollower(k8s, ns, name, out)
    deadline = time.monotonic() + timeout
    while True:
        obj = k8s.get(ns, name)
        if obj is None:
            raise RunFailed(f"TrainJob {ns}/{name} disappeared while running", "someone deleted it: run the step again (it resumes)")
        follower.poll()
        if condition(obj):
            follower.poll()
            return obj
        if time.monotonic() > deadline:
            raise TrainJobTimeout(f"TrainJob {ns}/{name} did not finish within {timeout:.0f} s", "raise timeout_seconds (the next "
                                  "run resumes from the last checkpoint), or set active_deadline_seconds to bound it on the cluster")
        time.sleep(opts.poll_seconds)


def _delete(k8s: K8s, ns: str, name: str, out: TextIO, raise_errors: bool) -> None:
    try:
        existed = k8s.delete(ns, name)
        logs.say(out, "prepline.train", f"TrainJob {ns}/{name} {'deleted' if existed else 'was already gone'}")
    except PreplineError as e:
        if raise_errors:
            raise
        logs.say(out, "prepline.train", f"could not delete TrainJob {ns}/{name}: {e.message}")


# ----------------------------------------------------------------------------------------------
# the same through the Kubeflow SDK (kubeflow package)


def sdk_train_kwargs(inputs: list[str], output: str, params: dict | None, opts: TrainJobOptions, name: str,
                     labels: dict | None = None, overwrite: bool = False) -> dict:
    """``TrainerClient.train(**kwargs)`` for the same job: CustomTrainerContainer + options. The secret
    references go in a RuntimePatch of the ``node`` container (the SDK's trainer env takes plain
    values only); numProcPerNode > 1 cannot be expressed."""
    try:
        from kubeflow.trainer import CustomTrainerContainer
        from kubeflow.trainer.options import (ActiveDeadlineSeconds, Annotations, ContainerPatch, JobSetSpecPatch,
                                              JobSetTemplatePatch, JobSpecPatch, JobTemplatePatch, Labels, Name,
                                              PodSpecPatch, PodTemplatePatch, ReplicatedJobPatch, RuntimePatch,
                                              TrainerArgs, TrainerCommand, TrainingRuntimeSpecPatch)
    except ImportError:
        raise ConfigError("client='sdk' needs the Kubeflow SDK, which is not installed",
                          "pip install kubeflow==0.5.0 (it brings kubeflow-trainer-api==2.3.0), or use client='kubernetes'") from None
    if opts.num_proc_per_node > 1:
        raise ConfigError("the Kubeflow SDK cannot set numProcPerNode", "use client='kubernetes' for num_proc_per_node > 1")
    m = trainjob_manifest(name, "sdk", inputs, output, params, opts, labels, overwrite)
    t = m["spec"]["trainer"]
    plain = {e["name"]: e["value"] for e in t["env"] if "value" in e}
    secret_env = [e for e in t["env"] if "valueFrom" in e]
    res = {k: v for k, v in opts.resources_per_node.items()} if not set(opts.resources_per_node) & {"requests", "limits"} else None
    if res is not None and not int(res.get("gpu", 0) or 0):
        res.pop("gpu", None)
    options = [Name(name), Labels(m["metadata"]["labels"]), TrainerCommand(t["command"]), TrainerArgs(t["args"])]
    if opts.annotations:
        options.append(Annotations(dict(opts.annotations)))
    if opts.active_deadline_seconds:
        options.append(ActiveDeadlineSeconds(int(opts.active_deadline_seconds)))
    if secret_env:
        pod = PodTemplatePatch(spec=PodSpecPatch(containers=[ContainerPatch(name=NODE, env=secret_env)]))
        options.append(RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(template=JobSetTemplatePatch(
            spec=JobSetSpecPatch(replicated_jobs=[ReplicatedJobPatch(name=NODE, template=JobTemplatePatch(
                spec=JobSpecPatch(template=pod)))])))))
    trainer = CustomTrainerContainer(image=t["image"], num_nodes=opts.num_nodes, resources_per_node=res, env=plain)
    return {"runtime": opts.runtime, "trainer": trainer, "options": options}


def _run_with_sdk(inputs, output, params, opts: TrainJobOptions, name: str, *, labels, timeout, out, overwrite) -> dict:
    from prepline.train.train import read_summary

    kwargs = sdk_train_kwargs(inputs, output, params, opts, name, labels, overwrite)
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    ns = default_namespace(opts)
    client = TrainerClient(KubernetesBackendConfig(namespace=ns, config_file=opts.kubeconfig or None, context=opts.context or None))
    k8s = _SdkK8s(client)
    check_runtime(k8s, opts, ns)
    created, failed = False, True
    try:
        try:
            client.train(**kwargs)
        except RuntimeError as e:  # the SDK wraps the API error: the server's message is in the cause
            raise api_error(e.__cause__ or e, f"create TrainJob {ns}/{name}") from None
        created = True
        logs.say(out, "prepline.train", f"TrainJob {ns}/{name} created through the Kubeflow SDK (runtime {opts.runtime})")
        seen = [0]

        def stream(_job=None) -> None:
            try:
                text = "\n".join(client.get_job_logs(name))
            except RuntimeError:
                return
            if len(text) > seen[0]:
                out.write(text[seen[0]:] + "\n")
                out.flush()
                seen[0] = len(text) + 1

        poll = max(1, int(round(opts.poll_seconds)))
        try:
            client.wait_for_job_status(name, {"Complete", "Failed"}, timeout=max(int(timeout), poll + 1), polling_interval=poll,
                                       callbacks=[stream])
        except TimeoutError:
            raise TrainJobTimeout(f"TrainJob {ns}/{name} did not finish within {timeout:.0f} s", "raise timeout_seconds") from None
        stream()
        obj = k8s.get(ns, name) or {}
        kind, reason, message = condition(obj) or ("", "", "")
        if kind == "Failed":
            raise TrainJobFailed(f"TrainJob {ns}/{name} failed ({reason or 'no reason'}): {message or 'see the trainer log above'}",
                                 "see the trainer log above" if reason != "DeadlineExceeded" else "raise active_deadline_seconds", reason)
        summary = read_summary(output)
        if summary is None:
            raise RunFailed(f"TrainJob {ns}/{name} completed but wrote no metrics.json in {output}", "see the trainer log above")
        failed = False
        return summary
    finally:
        if created and not (failed and opts.keep_on_failure):
            try:
                client.delete_job(name)
                logs.say(out, "prepline.train", f"TrainJob {ns}/{name} deleted")
            except RuntimeError as e:
                if not failed:
                    raise KubernetesError(f"could not delete TrainJob {ns}/{name}: {e.__cause__ or e}", "delete it by hand") from None


class _SdkK8s(K8s):
    """K8s over the SDK backend's own API clients (same credentials as the SDK)."""

    def __init__(self, client):  # noqa: D401 - no super().__init__: reuse the SDK's clients
        self.custom, self.core = client.backend.custom_api, client.backend.core_api
        self.api = self.custom.api_client
        self.timeout, self.retries = 30.0, 4


__all__ = ["TrainJobFailed", "TrainJobOptions", "TrainJobTimeout", "run_trainjob", "sdk_train_kwargs", "trainjob_manifest",
           "trainjob_name"]
