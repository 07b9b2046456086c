"""The Kubernetes side of the cluster-mode fine-tune: credentials (the pod's service account or a
kubeconfig), the few API calls on TrainJobs, training runtimes and the trainer pod (idempotent calls
retried on connection errors and 429/5xx), API errors as prepline errors with the RBAC or field to
fix, and the log follower that streams the trainer node's log.

The names mirror Kubeflow Trainer's API (``trainer.kubeflow.org/v1alpha1``) and the JobSet labels its
runtimes put on the trainer pods (``node``, completion index 0).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TextIO

from prepline import logs
from prepline.errors import ConfigError, PreplineError, ServiceError

log = logging.getLogger("prepline.train")

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
TRAINJOBS = "trainjobs"
CLUSTER_RUNTIMES = "clustertrainingruntimes"
RUNTIMES = "trainingruntimes"
#: the trainer's replicated job and container in the Kubeflow runtimes
NODE = "node"
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_INDEX = "batch.kubernetes.io/job-completion-index"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubernetesError(ServiceError):
    """A Kubernetes API call failed."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(f"{SA_DIR}/token")


def kubeconfig_path(kubeconfig: str) -> str:
    path = kubeconfig or (os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]) or os.path.expanduser("~/.kube/config")
    if not os.path.isfile(path):
        raise ConfigError(f"no Kubernetes credentials: not in a pod with a service account, and kubeconfig {path} does not exist",
                          "run the step in the cluster (the pod's service account is used), or pass trainjob_json "
                          '{"kubeconfig": "<path>"} / set KUBECONFIG')
    return path


def api_error(e, what: str) -> PreplineError:
    status = getattr(e, "status", None)
    message = str(getattr(e, "reason", "") or e)
    body = getattr(e, "body", None)
    if body:
        try:
            message = json.loads(body).get("message") or message
        except (ValueError, AttributeError):
            message = str(body)[:500]
    text = f"Kubernetes API: {what} -> HTTP {status}: {message}"
    if status == 401:
        return KubernetesError(text, "the credentials were rejected: check the kubeconfig or the pod's service-account token")
    if status == 403:
        return KubernetesError(text, "grant the step's service account RBAC: create/get/delete trainjobs.trainer.kubeflow.org, "
                                     "get clustertrainingruntimes/trainingruntimes, list pods and get pods/log (see docs/fine_tune.md)")
    if status == 422 or status == 400:
        return ConfigError(f"the API server rejected the TrainJob: {message}", "fix the trainjob_json field named in the message")
    return KubernetesError(text, "check that the Kubernetes API server is reachable and Kubeflow Trainer is installed")


class K8s:
    """The few Kubernetes calls the cluster mode makes, over the ``kubernetes`` client."""

    def __init__(self, kubeconfig: str = "", context: str = "", request_timeout: float = 30.0, retries: int = 4):
        try:
            from kubernetes import client, config
        except ImportError:
            raise ConfigError("the cluster mode needs the kubernetes package", "pip install 'prepline[kfp]' (kfp brings kubernetes)") from None
        if kubeconfig or not in_cluster():
            self.api = config.new_client_from_config(config_file=kubeconfig_path(kubeconfig), context=context or None)
        else:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            self.api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.timeout, self.retries = request_timeout, retries

    def host(self) -> str:
        return self.api.configuration.host

    def _call(self, what: str, fn, *args, retry: bool = True, **kw):
        """One call; connection errors and 429/5xx are retried (idempotent calls) with backoff."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                return fn(*args, _request_timeout=self.timeout, **kw)
            except ApiException as e:
                if e.status in (429, 500, 502, 503, 504) and attempt + 1 < attempts:
                    time.sleep(min(8.0, 0.5 * 2**attempt))
                    continue
                raise
            except HTTPError as e:
                if attempt + 1 < attempts:
                    time.sleep(min(8.0, 0.5 * 2**attempt))
                    continue
                raise KubernetesError(f"Kubernetes API {self.host()}: {what}: {type(e).__name__}: {e}",
                                      "check that the API server is reachable (kubeconfig / in-cluster service)") from None

    def get_runtime(self, name: str, kind: str, namespace: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "ClusterTrainingRuntime":
                return self._call(f"get {kind} {name}", self.custom.get_cluster_custom_object, GROUP, VERSION, CLUSTER_RUNTIMES, name)
            return self._call(f"get {kind} {namespace}/{name}", self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, RUNTIMES, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise api_error(e, f"get {kind} {name}") from None

    def runtime_names(self, kind: str, namespace: str) -> list[str]:
        try:
            if kind == "ClusterTrainingRuntime":
                items = self._call("list", self.custom.list_cluster_custom_object, GROUP, VERSION, CLUSTER_RUNTIMES)
            else:
                items = self._call("list", self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, RUNTIMES)
            return sorted(i["metadata"]["name"] for i in items.get("items", []))
        except Exception:  # noqa: BLE001 - only for the error message
            return []

    def create(self, manifest: dict) -> dict:
        from kubernetes.client.exceptions import ApiException

        md = manifest["metadata"]
        try:
            return self._call(f"create TrainJob {md['name']}", self.custom.create_namespaced_custom_object, GROUP, VERSION,
                              md["namespace"], TRAINJOBS, manifest, retry=False)
        except ApiException as e:
            if e.status == 409:
                raise
            raise api_error(e, f"create TrainJob {md['namespace']}/{md['name']}") from None

    def get(self, namespace: str, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(f"get TrainJob {name}", self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, TRAINJOBS, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise api_error(e, f"get TrainJob {namespace}/{name}") from None

    def delete(self, namespace: str, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._call(f"delete TrainJob {name}", self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, TRAINJOBS,
                       name, propagation_policy="Foreground")
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise api_error(e, f"delete TrainJob {namespace}/{name}") from None

    def trainer_pod(self, namespace: str, name: str) -> dict | None:
        """The newest pod of the trainer node 0 (replicated job ``node``, completion index 0)."""
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self._call("list pods", self.core.list_namespaced_pod, namespace,
                              label_selector=f"{LABEL_JOBSET}={name},{LABEL_RJOB}={NODE}")
        except ApiException as e:
            raise api_error(e, f"list pods of TrainJob {namespace}/{name}") from None
        items = [p for p in pods.items if (p.metadata.labels or {}).get(LABEL_INDEX, "0") == "0"]
        if not items:
            return None
        p = max(items, key=lambda p: (p.metadata.creation_timestamp is not None, p.metadata.creation_timestamp or 0, p.metadata.name))
        return {"name": p.metadata.name, "phase": (p.status.phase if p.status else None) or "Pending"}

    def pod_log(self, namespace: str, pod: str, container: str = NODE) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(f"log of {pod}", self.core.read_namespaced_pod_log, pod, namespace, container=container) or ""
        except ApiException as e:
            if e.status in (400, 404):  # container not started yet / pod gone
                return ""
            raise api_error(e, f"log of pod {namespace}/{pod}") from None


def condition(obj: dict) -> tuple[str, str, str] | None:
    """(type, reason, message) of a true ``Complete`` / ``Failed`` condition, else None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c["type"], c.get("reason", ""), c.get("message", "")
    return None


class LogFollower:
    """Prints what is new in the trainer node's log at every poll (a new pod starts over)."""

    def __init__(self, k8s: K8s, namespace: str, name: str, out: TextIO):
        self.k8s, self.ns, self.name, self.out = k8s, namespace, name, out
        self.pod, self.seen = None, 0

    def poll(self) -> None:
        try:
            pod = self.k8s.trainer_pod(self.ns, self.name)
            if pod is None or pod["phase"] == "Pending":
                return
            if pod["name"] != self.pod:
                self.pod, self.seen = pod["name"], 0
                logs.say(self.out, "prepline.train", f"trainer pod {pod['name']} ({pod['phase']}):")
            text = self.k8s.pod_log(self.ns, pod["name"])
        except PreplineError as e:  # logs are best effort: the job's state decides
            log.warning("cannot read the trainer log: %s", e.message)
            return
        if len(text) > self.seen:
            self.out.write(text[self.seen:] + ("" if text.endswith("\n") else "\n"))
            self.out.flush()
            self.seen = len(text)
