"""Typed request builders for the KubeRay API server: a ``ClusterSpec`` in, a JSON body out.

* V2 (``raycluster_body``): a ``ray.io/v1`` RayCluster custom resource, exactly what the
  Kubernetes API (proxied by the API server) accepts; checked in the tests against the CRD's
  openAPIV3Schema with unknown fields rejected.
* V1 (``compute_template_bodies``, ``cluster_v1_body``, ``job_submission_v1_body``): the
  deprecated gRPC-gateway API; checked against the V1 swagger definitions.

Every builder validates what Kubernetes or KubeRay would reject later (names, label syntax,
quantities, replica counts, duplicate env names, fields V1 cannot express) and raises
``ConfigError`` naming the ``ClusterSpec`` field and the fix, so a bad spec fails before any
request is sent.
"""

from __future__ import annotations

import logging
import math
import re
from decimal import Decimal, InvalidOperation

from prepline.clusters.base import GPU_RESOURCE, LABEL_MANAGED, ClusterSpec, NodeGroup
from prepline.errors import ConfigError

log = logging.getLogger("prepline.clusters")

RAY_API_VERSION = "ray.io/v1"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
WORKER_GROUP = "workers"
GPU_GROUP = "gpu-workers"
#: the ClusterSpec field of each worker group, by KubeRay group name (the order of workerGroupSpecs)
WORKER_GROUPS = ((WORKER_GROUP, "workers"), (GPU_GROUP, "gpu_workers"))
DASHBOARD_PORT = 8265
#: KubeRay's MaxRayClusterNameLength (ray-operator/controllers/ray/utils/constant.go, 53 in v1.3.0 to HEAD): the
#: operator never reconciles a longer name (utils/validation.go ValidateRayClusterMetadata, a Warning event only);
#: it also keeps "<cluster>-head-svc" within a DNS-1035 label
MAX_CLUSTER_NAME = 53

_QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
            "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_TOLERATION_OPS = {"Equal", "Exists"}
_TOLERATION_EFFECTS = {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}


# -- small validators -----------------------------------------------------------------------------
def quantity(value: str, field: str) -> Decimal:
    """A Kubernetes resource quantity as a Decimal (cores for CPU, bytes for memory)."""
    text = str(value).strip()
    if not _QUANTITY.match(text):
        raise ConfigError(f"{field} = '{value}' is not a Kubernetes quantity", "use e.g. cpu '2' or '500m', memory '4Gi' or '512Mi'")
    m = re.match(r"^([+-]?[0-9.]+)(.*)$", text)
    number, suffix = m.group(1), m.group(2)
    try:
        if suffix in _BINARY:
            q = Decimal(number) * _BINARY[suffix]
        elif suffix in _DECIMAL:
            q = Decimal(number) * _DECIMAL[suffix]
        else:  # exponent form, e.g. 1e3
            q = Decimal(text)
    except InvalidOperation as e:  # pragma: no cover - the regex rules this out
        raise ConfigError(f"{field} = '{value}' is not a Kubernetes quantity", "use e.g. '2', '500m', '4Gi'") from e
    if q <= 0:
        raise ConfigError(f"{field} = '{value}' must be positive", "give a positive amount")
    return q


def _check_label_key(key: str, field: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ConfigError(f"{field} key '{key}' is not a valid Kubernetes label/annotation key",
                          "use '[prefix/]name' with name <= 63 chars of [A-Za-z0-9-_.], starting and ending alphanumeric")


def _labels(values: dict, field: str) -> dict[str, str]:
    if not isinstance(values, dict):
        raise ConfigError(f"{field} must be a mapping of strings", f"pass {field} as a JSON object")
    out = {}
    for k, v in values.items():
        _check_label_key(str(k), field)
        v = str(v)
        if len(v) > 63 or (v and not _LABEL_NAME.match(v)):
            raise ConfigError(f"{field}['{k}'] = '{v}' is not a valid label value",
                              "use <= 63 chars of [A-Za-z0-9-_.], starting and ending alphanumeric (or empty)")
        out[str(k)] = v
    return out


def _annotations(values: dict, field: str = "annotations") -> dict[str, str]:
    if not isinstance(values, dict):
        raise ConfigError(f"{field} must be a mapping of strings", f"pass {field} as a JSON object")
    for k in values:
        _check_label_key(str(k), field)
    return {str(k): str(v) for k, v in values.items()}


def check_name(spec: ClusterSpec) -> None:
    if len(spec.name) > MAX_CLUSTER_NAME or not spec.name[0].isalpha():
        raise ConfigError(f"cluster name '{spec.name}' cannot be used with KubeRay: a RayCluster name must be a DNS-1035 label "
                          f"(start with a letter) of at most {MAX_CLUSTER_NAME} chars (the operator never reconciles a longer one)",
                          f"use cluster_name(run, stage, branch) (starts with a letter, <= 40 chars); at most {MAX_CLUSTER_NAME} chars")
    if not _DNS_LABEL.match(spec.namespace) or len(spec.namespace) > 63:
        raise ConfigError(f"namespace '{spec.namespace}' is not a valid DNS-1123 label", "use the Kubernetes namespace name, e.g. 'ray'")


def resolve_image(spec: ClusterSpec) -> str:
    if spec.image:
        return spec.image
    try:
        from prepline.images import RAY_IMAGE  # type: ignore[import-not-found]
    except ImportError:
        RAY_IMAGE = ""
    if not RAY_IMAGE:
        raise ConfigError("no Ray image: ClusterSpec.image is empty and the project has no default runtime image",
                          "set image to the prepline Ray runtime image (it must contain prepline and the transforms' extras)")
    return RAY_IMAGE


def replicas(w: NodeGroup, field: str = "workers") -> tuple[int, int, int, bool]:
    """(replicas, min, max, autoscaling) of a worker group. ``max_replicas`` 0 or == replicas: a
    fixed-size group; ``max_replicas`` > replicas: autoscaling between ``min_replicas`` and it."""
    for f in ("replicas", "min_replicas", "max_replicas"):
        v = getattr(w, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"{field}.{f} = {v!r} must be a non-negative integer", "give a whole number of worker pods")
    if w.max_replicas in (0, w.replicas):
        if w.min_replicas > w.replicas:
            raise ConfigError(f"{field}.min_replicas ({w.min_replicas}) > {field}.replicas ({w.replicas})",
                              "lower min_replicas, or set max_replicas above replicas to autoscale")
        return w.replicas, w.replicas, w.replicas, False
    if w.max_replicas < w.replicas or w.min_replicas > w.replicas:
        raise ConfigError(f"{field}: need min_replicas <= replicas <= max_replicas, got {w.min_replicas} <= {w.replicas} <= {w.max_replicas}",
                          "fix the worker counts (max_replicas 0 means a fixed-size group of `replicas`)")
    return w.replicas, w.min_replicas, w.max_replicas, True


def worker_groups(spec: ClusterSpec) -> list[tuple[str, str, NodeGroup]]:
    """(KubeRay group name, ClusterSpec field, group) of each worker group the cluster gets: ``workers``
    unless it has no pods, ``gpu-workers`` when asked for (each of its pods needs at least one GPU)."""
    out = []
    for name, f in WORKER_GROUPS:
        g = getattr(spec, f)
        replicas(g, f)
        if g.pods() <= 0:
            continue
        if f == "gpu_workers" and _gpu(g, f) < 1:
            raise ConfigError(f"gpu_workers.gpu = {g.gpu!r}: a GPU worker group needs at least one GPU per pod",
                              'give gpu_workers.gpu >= 1 (e.g. {"gpu_workers": {"replicas": 2, "gpu": 1}}), or use workers for CPU pods')
        out.append((name, f, g))
    return out


def _gpu(g: NodeGroup, field: str) -> int:
    if not isinstance(g.gpu, int) or isinstance(g.gpu, bool) or g.gpu < 0:
        raise ConfigError(f"{field}.gpu = {g.gpu!r} must be a non-negative integer", "give a whole number of GPUs per pod")
    if g.gpu and (not isinstance(g.gpu_resource, str) or not g.gpu_resource.endswith("gpu") or "/" not in g.gpu_resource):
        raise ConfigError(f"{field}.gpu_resource = {g.gpu_resource!r} is not a GPU resource KubeRay recognises",
                          f"use the device plugin's resource, e.g. '{GPU_RESOURCE}' or 'amd.com/gpu' (KubeRay gives Ray --num-gpus "
                          "only for a resource whose name ends in 'gpu')")
    if g.gpu:
        _check_label_key(g.gpu_resource, f"{field}.gpu_resource")
    return g.gpu


def group_tolerations(spec: ClusterSpec, g: NodeGroup, field: str) -> list[dict]:
    """The cluster's tolerations, then the group's own; a GPU group also tolerates the taint GPU node
    pools carry on their resource's name (``nvidia.com/gpu``, any value, NoSchedule) unless one of
    its tolerations already names that key."""
    out = _tolerations(spec.tolerations, "tolerations") + _tolerations(g.tolerations, f"{field}.tolerations")
    if _gpu(g, field) and not any(t.get("key") == g.gpu_resource for t in out):
        out.append({"key": g.gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    return out


def group_node_selector(spec: ClusterSpec, g: NodeGroup, field: str) -> dict[str, str]:
    """The cluster's node selector with the group's own over it."""
    out = _labels(spec.node_selector, "node_selector") if spec.node_selector else {}
    if g.node_selector:
        out.update(_labels(g.node_selector, f"{field}.node_selector"))
    return out


def start_params(spec: ClusterSpec, group: str) -> dict[str, str]:
    """rayStartParams for 'head' or 'workers': scalar entries of ``ray_start_params`` apply to both
    groups, a nested ``{"head": {...}}`` / ``{"workers": {...}}`` to one. The head always serves the
    dashboard on all interfaces (the API server's service proxy needs it)."""
    params = {"dashboard-host": "0.0.0.0"} if group == "head" else {}
    rsp = spec.ray_start_params
    if not isinstance(rsp, dict):
        raise ConfigError("ray_start_params must be a mapping", 'e.g. {"num-cpus": "0"} or {"head": {"num-cpus": "0"}}')
    items = [(k, v) for k, v in rsp.items() if k not in ("head", "workers")] + list((rsp.get(group) or {}).items())
    for k, v in items:
        if isinstance(v, (dict, list)):
            raise ConfigError(f"ray_start_params['{k}'] must be a scalar", "ray start flags take strings, numbers or booleans")
        params[str(k)] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return params


def _env(spec: ClusterSpec) -> tuple[list[dict], list[dict]]:
    """(env, envFrom) of the Ray containers."""
    env, env_from, seen = [], [], set()
    if not isinstance(spec.env, dict):
        raise ConfigError("env must be a mapping of strings", 'e.g. {"HF_HUB_OFFLINE": "1"}')
    for k in sorted(spec.env):
        if not _ENV_NAME.match(str(k)):
            raise ConfigError(f"env name '{k}' is not a valid environment variable name", "use letters, digits, '_', '-' and '.'")
        env.append({"name": str(k), "value": str(spec.env[k])})
        seen.add(str(k))
    for i, item in enumerate(spec.env_from_secrets):
        field = f"env_from_secrets[{i}]"
        if not isinstance(item, dict) or not item.get("secret") or set(item) - {"name", "secret", "key", "optional"}:
            raise ConfigError(f"{field} = {item!r} is not a secret reference",
                              'use {"name": ENV, "secret": SECRET, "key": KEY} for one key or {"secret": SECRET} for all keys '
                              '(add "optional": true when the secret may be missing)')
        optional = {"optional": True} if item.get("optional") is True else {}
        secret = str(item["secret"])
        if not _DNS_SUBDOMAIN.match(secret) or len(secret) > 253:
            raise ConfigError(f"{field}: secret name '{secret}' is not a valid Kubernetes name", "use the Secret's metadata.name")
        if ("name" in item) != ("key" in item):
            raise ConfigError(f"{field} has only one of 'name' and 'key'", "give both (one key as one variable) or neither (every key of the secret)")
        if "name" in item:
            name = str(item["name"])
            if not _ENV_NAME.match(name):
                raise ConfigError(f"{field}: '{name}' is not a valid environment variable name", "use letters, digits, '_', '-' and '.'")
            if name in seen:
                raise ConfigError(f"environment variable '{name}' is defined twice (env / env_from_secrets)", "keep one definition")
            seen.add(name)
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": str(item["key"]), **optional}}})
        else:
            env_from.append({"secretRef": {"name": secret, **optional}})
    return env, env_from


def _tolerations(items: list, field: str) -> list[dict]:
    if not isinstance(items, list):
        raise ConfigError(f"{field} must be a list of tolerations", 'e.g. [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]')
    out = []
    for i, t in enumerate(items):
        if not isinstance(t, dict) or set(t) - _TOLERATION_KEYS:
            raise ConfigError(f"{field}[{i}] = {t!r} is not a toleration", f"use keys among {sorted(_TOLERATION_KEYS)}")
        if t.get("operator", "Equal") not in _TOLERATION_OPS or t.get("effect", "") not in _TOLERATION_EFFECTS:
            raise ConfigError(f"{field}[{i}] has operator {t.get('operator')!r} / effect {t.get('effect')!r}",
                              f"operator is one of {sorted(_TOLERATION_OPS)}, effect one of {sorted(e for e in _TOLERATION_EFFECTS if e)}")
        tt = {k: str(v) for k, v in t.items() if k != "tolerationSeconds"}
        if "tolerationSeconds" in t:
            tt["tolerationSeconds"] = int(t["tolerationSeconds"])
        out.append(tt)
    return out


def _pull_secrets(spec: ClusterSpec) -> list[str]:
    names = []
    for i, s in enumerate(spec.image_pull_secrets):
        n = s.get("name") if isinstance(s, dict) else s
        if not isinstance(n, str) or not _DNS_SUBDOMAIN.match(n):
            raise ConfigError(f"image_pull_secrets[{i}] = {s!r} is not a secret name", 'give secret names, e.g. ["regcred"]')
        names.append(n)
    return names


def _resources(g: NodeGroup, field: str) -> dict:
    quantity(g.cpu, f"{field}.cpu")
    quantity(g.memory, f"{field}.memory")
    res = {"cpu": str(g.cpu), "memory": str(g.memory)}
    if _gpu(g, field) > 0:
        res[g.gpu_resource] = str(g.gpu)
    return {"requests": dict(res), "limits": dict(res)}


# -- V2: the RayCluster custom resource -----------------------------------------------------------
def raycluster_body(spec: ClusterSpec) -> dict:
    """A ``ray.io/v1`` RayCluster for the spec: a head group and a worker group per
    :func:`worker_groups` ('workers', 'gpu-workers'). Labels go on the RayCluster and on its pods;
    each group's pods get the cluster's tolerations and node selector plus the group's own."""
    check_name(spec)
    image = resolve_image(spec)
    labels = {**_labels(spec.labels, "labels"), LABEL_MANAGED: "true"}
    env, env_from = _env(spec)
    pull = _pull_secrets(spec)
    pod_annotations = _annotations(spec.pod_annotations, "pod_annotations")
    if spec.service_account and not _DNS_SUBDOMAIN.match(spec.service_account):
        raise ConfigError(f"service_account '{spec.service_account}' is not a valid name", "use the ServiceAccount's metadata.name")

    def pod(container: str, group: NodeGroup, field: str) -> dict:
        c: dict = {"name": container, "image": image, "resources": _resources(group, field)}
        if env:
            c["env"] = env
        if env_from:
            c["envFrom"] = env_from
        ps: dict = {"containers": [c]}
        tolerations = group_tolerations(spec, group, field)
        node_selector = group_node_selector(spec, group, field)
        if tolerations:
            ps["tolerations"] = tolerations
        if node_selector:
            ps["nodeSelector"] = node_selector
        if spec.service_account:
            ps["serviceAccountName"] = spec.service_account
        if pull:
            ps["imagePullSecrets"] = [{"name": n} for n in pull]
        return {"metadata": {"labels": dict(labels), **({"annotations": dict(pod_annotations)} if pod_annotations else {})}, "spec": ps}

    body: dict = {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "rayVersion": str(spec.ray_version),
            "headGroupSpec": {"rayStartParams": start_params(spec, "head"), "template": pod(HEAD_CONTAINER, spec.head, "head")},
        },
    }
    if spec.annotations:
        body["metadata"]["annotations"] = _annotations(spec.annotations)
    groups = []
    for group_name, f, g in worker_groups(spec):
        n, lo, hi, autoscale = replicas(g, f)
        groups.append({"groupName": group_name, "replicas": n, "minReplicas": lo, "maxReplicas": hi,
                       "rayStartParams": start_params(spec, "workers"), "template": pod(WORKER_CONTAINER, g, f)})
        if autoscale:
            body["spec"]["enableInTreeAutoscaling"] = True
    if groups:
        body["spec"]["workerGroupSpecs"] = groups
    return body


# -- V1: compute templates, clusters, job submissions ---------------------------------------------
def template_names(name: str) -> tuple[str, ...]:
    """Names of the V1 compute templates a cluster may have: the head's, then one per worker group."""
    return (f"{name}-head", *(f"{name}-{group}" for group, _ in WORKER_GROUPS))


def _v1_template(name: str, namespace: str, g: NodeGroup, field: str, tolerations: list[dict]) -> dict:
    cpu = quantity(g.cpu, f"{field}.cpu")
    if cpu != cpu.to_integral_value():
        raise ConfigError(f"{field}.cpu = '{g.cpu}': the KubeRay V1 API only takes whole CPUs",
                          "use a whole number of CPUs, or api_version='v2'")
    mem = quantity(g.memory, f"{field}.memory")
    if mem % _BINARY["Gi"] == 0:
        memory, unit = int(mem / _BINARY["Gi"]), "Gi"
    else:  # V1 takes an integer amount plus a unit: whole MiB, rounded up
        memory, unit = int(math.ceil(mem / _BINARY["Mi"])), "Mi"
    t: dict = {"name": name, "namespace": namespace, "cpu": int(cpu), "memory": memory, "memoryUnit": unit}
    if _gpu(g, field) > 0:
        t["gpu"] = g.gpu
        if g.gpu_resource != GPU_RESOURCE:  # V1's default accelerator (apiserver/pkg/util/cluster.go)
            t["gpuAccelerator"] = g.gpu_resource
    if tolerations:
        t["tolerations"] = tolerations
    return t


def _v1_tolerations(spec: ClusterSpec, g: NodeGroup, field: str) -> list[dict]:
    out = []
    for t in group_tolerations(spec, g, field):
        if "tolerationSeconds" in t or not t.get("key") or "effect" not in t:
            raise ConfigError(f"toleration {t!r} ({field}) cannot be expressed in the KubeRay V1 API (needs key and effect, no tolerationSeconds)",
                              "give key, operator and effect, or use api_version='v2'")
        out.append({k: t[k] for k in ("key", "operator", "value", "effect") if k in t} | {"operator": t.get("operator", "Equal")})
    return out


def compute_template_bodies(spec: ClusterSpec) -> list[dict]:
    """V1 compute templates for the head and each worker group, named after the cluster and the group.
    Tolerations live in the templates in V1 (the cluster's, then the group's own)."""
    check_name(spec)
    out = [_v1_template(f"{spec.name}-head", spec.namespace, spec.head, "head", _v1_tolerations(spec, spec.head, "head"))]
    for group_name, f, g in worker_groups(spec):
        out.append(_v1_template(f"{spec.name}-{group_name}", spec.namespace, g, f, _v1_tolerations(spec, g, f)))
    return out


def cluster_v1_body(spec: ClusterSpec, user: str = "prepline") -> dict:
    """A V1 Cluster referencing the compute templates of ``compute_template_bodies``. V1 cannot set
    labels on the RayCluster itself: prepline's labels go into its annotations (``list`` reads
    them back from there) and onto the pods."""
    check_name(spec)
    selectors = [f for f in ("head", "workers", "gpu_workers") if getattr(spec, f).node_selector]
    if spec.node_selector or selectors:
        where = ", ".join(["node_selector"] * bool(spec.node_selector) + [f"{f}.node_selector" for f in selectors])
        raise ConfigError(f"{where}: node selectors are not supported by the KubeRay V1 API",
                          "use api_version='v2', or tolerations via compute templates")
    pull = _pull_secrets(spec)
    if len(pull) > 1:
        raise ConfigError("the KubeRay V1 API takes at most one image pull secret", "use one secret, or api_version='v2'")
    env, env_from = _env(spec)
    if [e for e in env_from if not e["secretRef"].get("optional")]:
        raise ConfigError("env_from_secrets without 'key' (all keys of a secret) is not supported by the KubeRay V1 API",
                          'list the keys: {"name": ENV, "secret": SECRET, "key": KEY}, or use api_version=\'v2\'')
    if env_from:  # the default (every key of s3_secret_name, optional) cannot be expressed in V1: say so
        log.warning("KubeRay V1 cannot pass every key of secret(s) %s to the Ray pods: they get no S3 credentials from it; "
                    "list the keys in cluster_json env_from_secrets, or use api_version='v2'",
                    ", ".join(e["secretRef"]["name"] for e in env_from))
    if [e for e in env if e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional")]:
        raise ConfigError("optional secret keys are not supported by the KubeRay V1 API", "drop 'optional' or use api_version='v2'")
    environment: dict = {}
    values = {e["name"]: e["value"] for e in env if "value" in e}
    values_from = {e["name"]: {"source": "SECRET", "name": e["valueFrom"]["secretKeyRef"]["name"], "key": e["valueFrom"]["secretKeyRef"]["key"]}
                   for e in env if "valueFrom" in e}
    if values:
        environment["values"] = values
    if values_from:
        environment["valuesFrom"] = values_from
    image = resolve_image(spec)
    labels = {**_labels(spec.labels, "labels"), LABEL_MANAGED: "true"}
    if spec.service_account and not _DNS_SUBDOMAIN.match(spec.service_account):
        raise ConfigError(f"service_account '{spec.service_account}' is not a valid name", "use the ServiceAccount's metadata.name")

    pod_annotations = _annotations(spec.pod_annotations, "pod_annotations")

    def group(extra: dict, params: dict) -> dict:
        g = {**extra, "image": image, "rayStartParams": params, "labels": dict(labels)}
        if pod_annotations:  # the head's / workers' pod annotations (apiserver/pkg/util/cluster.go)
            g["annotations"] = dict(pod_annotations)
        if environment:
            g["environment"] = environment
        if spec.service_account:
            g["serviceAccount"] = spec.service_account
        if pull:
            g["imagePullSecret"] = pull[0]
        return g

    cluster_spec: dict = {"headGroupSpec": group({"computeTemplate": f"{spec.name}-head"}, start_params(spec, "head"))}
    groups = []
    for group_name, f, g in worker_groups(spec):
        n, lo, hi, autoscale = replicas(g, f)
        groups.append(group({"groupName": group_name, "computeTemplate": f"{spec.name}-{group_name}", "replicas": n,
                             "minReplicas": lo, "maxReplicas": hi}, start_params(spec, "workers")))
        if autoscale:
            cluster_spec["enableInTreeAutoscaling"] = True
    if groups:
        cluster_spec["workerGroupSpec"] = groups
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "user": user,
        "version": str(spec.ray_version),
        "annotations": {**_annotations(spec.annotations), **labels},
        "clusterSpec": cluster_spec,
    }
