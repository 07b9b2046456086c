"""What each node of a TrainJob gets: the process Kubeflow Trainer's torch runtime would start.

:func:`realise_trainjob` turns a TrainJob body (as :func:`prepline.train.trainjob.trainjob_manifest`
builds it) and its training runtime (default: the ``torch-distributed`` ClusterTrainingRuntime) into
one :class:`NodeProcess` per trainer node: the argv (the container's ``command`` + ``args``), the
ordered env of the ``node`` container, the pod's name and DNS name, the image and the resources.
It is pure (no process, no network); the lab (:mod:`prepline.train.lab`) runs the result.

Derived from kubeflow/trainer at tag ``v2.3.0`` (the Trainer that ``kubeflow-trainer-api==2.3.0``
matches), file by file:

- ``pkg/runtime/framework/plugins/jobset/builder.go`` (``Builder.Trainer``): in the replicated job
  labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``, the container named ``node``
  takes ``spec.trainer.image``, ``command`` and ``args`` when they are set, and the TrainJob's
  ``spec.trainer.env`` is upserted into the runtime container's env.
- ``pkg/runtime/core/trainingruntime.go``: the trainer pod count is the runtime's
  ``mlPolicy.numNodes`` (default 1), which ``spec.trainer.numNodes`` overrides.
- ``pkg/runtime/framework/plugins/torch/torch.go`` (``EnforceMLPolicy``): the trainer PodSet count
  becomes ``numNodes``; ``numProcPerNode`` defaults to ``auto`` and, with no GPU in
  ``resourcesPerNode`` (the TrainJob's, else the runtime's), to the CPU request (else limit),
  at least 1; then it upserts ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (a
  ``fieldRef`` to the pod's ``batch.kubernetes.io/job-completion-index`` annotation) and, unless the
  command is torchtune's ``tune run``, ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>`` (the
  rank-0 pod under the JobSet's headless service, named after the JobSet = the TrainJob) and
  ``PET_MASTER_PORT`` = 29500 (``constants.ContainerTrainerPort``), which is also the container port.
  ``Validate`` refuses a TrainJob whose ``spec.trainer.env`` sets any of those five names
  (``constants.TorchRunReservedEnvNames`` in ``pkg/constants/constants.go``).
- ``pkg/runtime/runtime.go`` (``GetNumGPUPerNode``): a GPU is any resource whose name contains
  ``gpu``, requests first, then limits.
- The CRD: kubeflow/trainer commit ``8f6c5f067`` ("reject zero and negative numNodes and
  numProcPerNode", #3809, after v2.3.0) makes the API server refuse ``numNodes`` < 0
  (``minimum: 0``: 0 stays allowed, like JobSet's replicas) and ``numProcPerNode`` < 1
  (``x-kubernetes-validations: self >= 1``). v2.3.0 itself had no bound, and a negative count
  only failed later at pod creation; the realiser refuses both as the newer CRD does. ``numNodes``
  = 0 is admitted and makes no trainer pod: the realiser returns no node.

Kubernetes itself adds, for an Indexed Job's pod, ``JOB_COMPLETION_INDEX`` (kubernetes
``pkg/controller/job/indexed_job_utils.go``, ``addCompletionIndexEnvVariable``), which the realiser
appends too; ``PET_NODE_RANK``'s ``fieldRef`` is resolved to the same index. Other ``valueFrom``
entries (prepline's S3 ``secretKeyRef`` s) stay references: :func:`resolve_env` resolves them
against the secrets of the TrainJob's namespace, as the kubelet would.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field

from prepline.errors import ConfigError

GROUP = "trainer.kubeflow.org"
API_VERSION = f"{GROUP}/v1alpha1"
NODE = "node"  # constants.Node: the trainer replicated job and its container
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"  # constants.LabelTrainJobAncestor
ANCESTOR_TRAINER = "trainer"  # constants.AncestorTrainer
MASTER_PORT = 29500  # constants.ContainerTrainerPort
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK = "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"
PET_MASTER_ADDR, PET_MASTER_PORT = "PET_MASTER_ADDR", "PET_MASTER_PORT"
RESERVED_ENV = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)  # TorchRunReservedEnvNames
TORCHTUNE_ENTRYPOINT = ["tune", "run"]  # constants.TorchTuneEntrypoint
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"  # JobCompletionIndexFieldPath

#: the ``torch-distributed`` ClusterTrainingRuntime of kubeflow/trainer v2.3.0
#: (``manifests/base/runtimes/torch_distributed.yaml``), the parts the realiser reads
TORCH_DISTRIBUTED: dict = {
    "apiVersion": API_VERSION,
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {f"{GROUP}/framework": "torch"}},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": [{
            "name": NODE,
            "template": {
                "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": NODE, "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]}}},
            },
        }]}},
    },
}


@dataclass(frozen=True)
class NodeProcess:
    """One trainer node (pod) of a TrainJob: what its ``node`` container runs."""

    index: int  # the Job completion index = PET_NODE_RANK
    pod: str  # <trainjob>-node-0-<index> (JobSet pod hostname: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>)
    dns_name: str  # <pod>.<trainjob>: the name under the JobSet's headless service
    image: str
    argv: list[str]  # command + args
    env: list[dict] = field(default_factory=list)  # ordered; {"name", "value"} or {"name", "valueFrom"}
    port: int = MASTER_PORT
    resources: dict = field(default_factory=dict)

    def plain_env(self) -> dict[str, str]:
        """The entries with a value (the ``valueFrom`` ones need :func:`resolve_env`)."""
        return {e["name"]: e["value"] for e in self.env if "value" in e}


def _refuse(msg: str, fix: str) -> ConfigError:
    return ConfigError(f"Trainer would refuse this TrainJob: {msg}", fix)


def _upsert(env: list[dict], entries: list[dict]) -> None:
    """``apply.UpsertEnvVars``: replace an entry of the same name in place, else append."""
    for e in entries:
        for i, old in enumerate(env):
            if old["name"] == e["name"]:
                env[i] = copy.deepcopy(e)
                break
        else:
            env.append(copy.deepcopy(e))


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _quantity_value(q) -> int:
    """``resource.Quantity.Value()``: the value rounded up to an integer ("500m" -> 1, "1.5" -> 2)."""
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise _refuse(f"resource quantity {q!r} is not a Kubernetes quantity", 'use e.g. "2", "500m", "8Gi"')
    return math.ceil(float(m.group(1)) * _SUFFIX[m.group(2)])


def _num_gpu(res: dict) -> int:
    def first(lst: dict) -> int:
        for name, q in (lst or {}).items():
            if "gpu" in name.lower():
                return _quantity_value(q)
        return 0

    return first(res.get("requests")) or first(res.get("limits"))


def _num_cpu(res: dict) -> int:
    req, lim = (res.get("requests") or {}).get("cpu"), (res.get("limits") or {}).get("cpu")
    if req is None or _quantity_value(req) == 0:
        return _quantity_value(lim) if lim is not None else 0
    return _quantity_value(req)


def _trainer_container(runtime: dict) -> tuple[dict, dict]:
    """(the trainer replicated job, its ``node`` container) of the runtime template."""
    for rjob in runtime.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
        if rjob.get("template", {}).get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER:
            for c in rjob["template"].get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c.get("name") == NODE:
                    return rjob, c
    raise ConfigError(f"runtime {runtime.get('metadata', {}).get('name')!r} has no trainer job with a {NODE!r} container",
                      f"label a replicated job {ANCESTOR_LABEL}: {ANCESTOR_TRAINER} with a container named {NODE}")


def realise_trainjob(body: dict, runtime: dict | None = None) -> list[NodeProcess]:
    """The trainer nodes of TrainJob ``body`` on ``runtime`` (default :data:`TORCH_DISTRIBUTED`), in rank order."""
    runtime = runtime or TORCH_DISTRIBUTED
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "TrainJob":
        raise ConfigError(f"not a TrainJob of {API_VERSION}: {body.get('apiVersion')}/{body.get('kind')}",
                          "pass the body trainjob_manifest() builds")
    name = body.get("metadata", {}).get("name", "")
    spec = body.get("spec", {})
    ref = spec.get("runtimeRef") or {}
    rt_name = runtime.get("metadata", {}).get("name")
    if ref.get("name") != rt_name or ref.get("kind", "ClusterTrainingRuntime") != runtime.get("kind"):
        raise ConfigError(f"TrainJob {name} refers to runtime {ref.get('kind')}/{ref.get('name')}, not {runtime.get('kind')}/{rt_name}",
                          "pass the runtime it names")
    policy = runtime.get("spec", {}).get("mlPolicy") or {}
    if "torch" not in policy:
        raise ConfigError(f"runtime {rt_name!r} has no torch mlPolicy: only the torch runtime is realised here",
                          "use a torch runtime such as torch-distributed")
    trainer = spec.get("trainer") or {}
    reserved = sorted({e.get("name") for e in trainer.get("env", [])} & set(RESERVED_ENV))
    if reserved:  # torch.go Validate
        raise _refuse(f"spec.trainer.env must not have reserved envs, invalid envs configured: {reserved}",
                      "drop them: the torch runtime sets them for every node")
    num_nodes = trainer.get("numNodes", policy.get("numNodes", 1))
    if not isinstance(num_nodes, int) or num_nodes < 0:  # CRD minimum: 0 (kubeflow/trainer 8f6c5f067)
        raise _refuse(f"spec.trainer.numNodes={num_nodes!r} must be an integer >= 0", "pass numNodes >= 1")
    nppn = trainer.get("numProcPerNode")
    if nppn is not None and (not isinstance(nppn, int) or nppn < 1):  # CRD x-kubernetes-validations: self >= 1
        raise _refuse(f"spec.trainer.numProcPerNode={nppn!r}: numProcPerNode must be greater than or equal to 1", "pass 1 or more")
    command = trainer.get("command")
    if command is not None and list(command) == TORCHTUNE_ENTRYPOINT:
        raise ConfigError("a torchtune TrainJob (command 'tune run') is not realised here", "use a torchrun or python command")

    _, container = _trainer_container(runtime)
    resources = trainer.get("resourcesPerNode") or container.get("resources") or {}
    if nppn is None:
        gpus = _num_gpu(resources)
        nppn_value = "auto" if gpus else str(max(1, _num_cpu(resources)))
    else:
        nppn_value = str(nppn)
    argv = list(command if command is not None else container.get("command") or [])
    argv += list(trainer["args"] if trainer.get("args") is not None else container.get("args") or [])
    if not argv:
        raise ConfigError(f"TrainJob {name} has no command: the node would run its image's entrypoint, which is not known here",
                          "set spec.trainer.command")
    base_env = copy.deepcopy(container.get("env") or [])
    _upsert(base_env, trainer.get("env") or [])
    master = f"{name}-{NODE}-0-0.{name}"
    nodes = []
    for i in range(num_nodes):
        env = copy.deepcopy(base_env)
        _upsert(env, [{"name": PET_NNODES, "value": str(num_nodes)}, {"name": PET_NPROC_PER_NODE, "value": nppn_value},
                      {"name": PET_NODE_RANK, "value": str(i)}])  # valueFrom fieldRef COMPLETION_INDEX_FIELD, resolved
        _upsert(env, [{"name": PET_MASTER_ADDR, "value": master}, {"name": PET_MASTER_PORT, "value": str(MASTER_PORT)}])
        _upsert(env, [{"name": "JOB_COMPLETION_INDEX", "value": str(i)}])
        pod = f"{name}-{NODE}-0-{i}"
        nodes.append(NodeProcess(i, pod, f"{pod}.{name}", trainer.get("image") or container.get("image", ""), argv, env,
                                 MASTER_PORT, copy.deepcopy(resources)))
    return nodes


def resolve_env(env: list[dict], secrets: dict[str, dict[str, str]], where: str = "") -> dict[str, str]:
    """The env as the kubelet gives it: ``secretKeyRef`` s read from ``secrets`` (name -> key -> value, the
    TrainJob's namespace only); a missing secret or key is skipped when ``optional``, else an error (the
    pod would stay in ``CreateContainerConfigError``)."""
    out: dict[str, str] = {}
    for e in env:
        if "value" in e:
            out[e["name"]] = str(e["value"])
            continue
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            raise ConfigError(f"env {e['name']}: only values and secretKeyRef are resolved here, not {e.get('valueFrom')}",
                              "use a value or a secretKeyRef")
        value = (secrets.get(ref["name"]) or {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"{where or 'the pod'}: CreateContainerConfigError: secret {ref['name']!r} (key {ref['key']!r}) not found",
                              "create the secret in the TrainJob's namespace")
        out[e["name"]] = value
    return out


__all__ = ["MASTER_PORT", "NodeProcess", "RESERVED_ENV", "TORCH_DISTRIBUTED", "realise_trainjob", "resolve_env"]
