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

from prepline.clusters.base import LABEL_MANAGED, ClusterSpec, NodeGroup
from prepline.errors import ConfigError

log = logging.getLogger("prepline.clusters")

RAY_API_VERSION = "ray.io/v1"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
WORKER_GROUP = "workers"
DASHBOARD_PORT = 8265
GPU_RESOURCE = "nvidia.com/gpu"
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


def replicas(w: NodeGroup) -> tuple[int, int, int, bool]:
    """(replicas, min, max, autoscaling) of the worker group. ``max_replicas`` 0 or == replicas: a
    fixed-size group; ``max_replicas`` > replicas: autoscaling between ``min_replicas`` and it."""
    for f in ("replicas", "min_replicas", "max_replicas"):
        v = getattr(w, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"workers.{f} = {v!r} must be a non-negative integer", "give a whole number of worker pods")
    if w.max_replicas in (0, w.replicas):
        if w.min_replicas > w.replicas:
            raise ConfigError(f"workers.min_replicas ({w.min_replicas}) > workers.replicas ({w.replicas})",
                              "lower min_replicas, or set max_replicas above replicas to autoscale")
        return w.replicas, w.replicas, w.replicas, False
    if w.max_replicas < w.replicas or w.min_replicas > w.replicas:
        raise ConfigError(f"workers: need min_replicas <= replicas <= max_replicas, got {w.min_replicas} <= {w.replicas} <= {w.max_replicas}",
                          "fix the worker counts (max_replicas 0 means a fixed-size group of `replicas`)")
    return w.replicas, w.min_replicas, w.max_replicas, True


def has_workers(spec: ClusterSpec) -> bool:
    return max(spec.workers.replicas, spec.workers.max_replicas) > 0


def _gpu(g: NodeGroup, field: str) -> int:
    if not isinstance(g.gpu, int) or isinstance(g.gpu, bool) or g.gpu < 0:
        raise ConfigError(f"{field}.gpu = {g.gpu!r} must be a non-negative integer", "give a whole number of GPUs per pod")
    return g.gpu


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


def _tolerations(spec: ClusterSpec) -> list[dict]:
    out = []
    for i, t in enumerate(spec.tolerations):
        if not isinstance(t, dict) or set(t) - _TOLERATION_KEYS:
            raise ConfigError(f"tolerations[{i}] = {t!r} is not a toleration", f"use keys among {sorted(_TOLERATION_KEYS)}")
        if t.get("operator", "Equal") not in _TOLERATION_OPS or t.get("effect", "") not in _TOLERATION_EFFECTS:
            raise ConfigError(f"tolerations[{i}] has operator {t.get('operator')!r} / effect {t.get('effect')!r}",
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
        res[GPU_RESOURCE] = str(g.gpu)
    return {"requests": dict(res), "limits": dict(res)}


# -- V2: the RayCluster custom resource -----------------------------------------------------------
def raycluster_body(spec: ClusterSpec) -> dict:
    """A ``ray.io/v1`` RayCluster for the spec: a head group and (unless no workers are asked for)
    one worker group named 'workers'. Labels go on the RayCluster and on its pods."""
    check_name(spec)
    image = resolve_image(spec)
    labels = {**_labels(spec.labels, "labels"), LABEL_MANAGED: "true"}
    env, env_from = _env(spec)
    tolerations = _tolerations(spec)
    node_selector = _labels(spec.node_selector, "node_selector") if spec.node_selector else {}
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
    if has_workers(spec):
        n, lo, hi, autoscale = replicas(spec.workers)
        body["spec"]["workerGroupSpecs"] = [{
            "groupName": WORKER_GROUP, "replicas": n, "minReplicas": lo, "maxReplicas": hi,
            "rayStartParams": start_params(spec, "workers"), "template": pod(WORKER_CONTAINER, spec.workers, "workers"),
        }]
        if autoscale:
            body["spec"]["enableInTreeAutoscaling"] = True
    return body


# -- V1: compute templates, clusters, job submissions ---------------------------------------------
def template_names(name: str) -> tuple[str, str]:
    """Names of the V1 compute templates of a cluster (head, workers)."""
    return f"{name}-head", f"{name}-workers"


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
    if tolerations:
        t["tolerations"] = tolerations
    return t


def compute_template_bodies(spec: ClusterSpec) -> list[dict]:
    """V1 compute templates for the head and (if any) the worker group, named after the cluster.
    Tolerations live in the templates in V1."""
    check_name(spec)
    tolerations = []
    for i, t in enumerate(_tolerations(spec)):
        if "tolerationSeconds" in t or not t.get("key") or "effect" not in t:
            raise ConfigError(f"tolerations[{i}] = {t!r} cannot be expressed in the KubeRay V1 API (needs key and effect, no tolerationSeconds)",
                              "give key, operator and effect, or use api_version='v2'")
        tolerations.append({k: t[k] for k in ("key", "operator", "value", "effect") if k in t} | {"operator": t.get("operator", "Equal")})
    head_t, worker_t = template_names(spec.name)
    out = [_v1_template(head_t, spec.namespace, spec.head, "head", tolerations)]
    if has_workers(spec):
        out.append(_v1_template(worker_t, spec.namespace, spec.workers, "workers", tolerations))
    return out


def cluster_v1_body(spec: ClusterSpec, user: str = "prepline") -> dict:
    """A V1 Cluster referencing the compute templates of ``compute_template_bodies``. V1 cannot set
    labels on the RayCluster itself: prepline's labels go into its annotations (``list`` reads
    them back from there) and onto the pods."""
    check_name(spec)
    if spec.node_selector:
        raise ConfigError("node_selector is not supported by the KubeRay V1 API", "use api_version='v2', or tolerations via compute templates")
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

    head_t, worker_t = template_names(spec.name)
    cluster_spec: dict = {"headGroupSpec": group({"computeTemplate": head_t}, start_params(spec, "head"))}
    if has_workers(spec):
        n, lo, hi, autoscale = replicas(spec.workers)
        cluster_spec["workerGroupSpec"] = [group({"groupName": WORKER_GROUP, "computeTemplate": worker_t, "replicas": n,
                                                  "minReplicas": lo, "maxReplicas": hi}, start_params(spec, "workers"))]
        if autoscale:
            cluster_spec["enableInTreeAutoscaling"] = True
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "user": user,
        "version": str(spec.ray_version),
        "annotations": {**_annotations(spec.annotations), **labels},
        "clusterSpec": cluster_spec,
    }
