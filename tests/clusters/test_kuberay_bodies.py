"""Request bodies of the kuberay provider against the published schemas (the RayCluster CRD, the V1
swagger, Ray's JobSubmitRequest), and what a spec that cannot work fails with before any request."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from prepline.clusters.base import LABEL_RUN, NodeGroup
from prepline.clusters.kuberay_bodies import check_name, cluster_v1_body, compute_template_bodies, raycluster_body
from prepline.clusters.ray_jobs import job_submission_v1_body, ray_job_body
from prepline.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent))
from kuberay_schemas import validate_raycluster, validate_swagger  # noqa: E402
from test_kuberay import IMAGE, fake, make_provider, make_spec  # noqa: E402,F401 (fake: a fixture)


# -- request bodies against the schemas ------------------------------------------------------------
SPEC_MATRIX = {
    "default": {},
    "gpu-workers": {"workers": NodeGroup(cpu="8", memory="30Gi", gpu=2, replicas=2)},
    "gpu-head": {"head": NodeGroup(cpu="4", memory="16Gi", gpu=1)},
    "gpu-group": {"gpu_workers": NodeGroup(cpu="8", memory="32Gi", gpu=1, replicas=2,
                                           node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                                           tolerations=[{"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
                  "node_selector": {"team": "data"}},
    "amd-group": {"workers": NodeGroup(replicas=0), "gpu_workers": NodeGroup(cpu="8", memory="32Gi", gpu=2, replicas=1, max_replicas=4,
                                                                             gpu_resource="amd.com/gpu")},
    "secrets": {"env": {"HF_HUB_OFFLINE": "1", "N": 3},
                "env_from_secrets": [{"name": "AWS_ACCESS_KEY_ID", "secret": "s3-creds", "key": "access"},
                                     {"name": "AWS_SECRET_ACCESS_KEY", "secret": "s3-creds", "key": "secret"}]},
    "whole-secret": {"env_from_secrets": [{"secret": "s3-creds"}, {"secret": "prepline-s3", "optional": True}]},
    "tolerations": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                    {"key": "pool", "operator": "Equal", "value": "ray", "effect": "NoExecute", "tolerationSeconds": 60}],
                    "node_selector": {"pool": "ray"}},
    "no-workers": {"workers": NodeGroup(replicas=0)},
    "autoscaling": {"workers": NodeGroup(cpu="2", memory="4Gi", replicas=1, min_replicas=0, max_replicas=5)},
    "millicpu": {"head": NodeGroup(cpu="500m", memory="1536Mi")},
    "pod-options": {"service_account": "prepline-runner", "image_pull_secrets": ["regcred", {"name": "other"}],
                    "annotations": {"example.com/team": "data", "note": "free text: anything"},
                    "ray_start_params": {"num-cpus": 0, "block": True, "workers": {"num-cpus": 2}}},
}
V1_MATRIX = {k: v for k, v in SPEC_MATRIX.items() if k not in ("whole-secret", "tolerations", "millicpu", "gpu-group")}
V1_MATRIX["gpu-group"] = {"gpu_workers": NodeGroup(cpu="8", memory="32Gi", gpu=1, replicas=2, tolerations=[
    {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])}
V1_MATRIX["tolerations"] = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
V1_MATRIX["mebibytes"] = {"head": NodeGroup(cpu="1", memory="1536Mi")}
V1_MATRIX["pod-options"] = {**SPEC_MATRIX["pod-options"], "image_pull_secrets": ["regcred"]}


@pytest.mark.parametrize("case", sorted(SPEC_MATRIX))
def test_raycluster_bodies_validate_against_the_crd(case):
    spec = make_spec(**SPEC_MATRIX[case])
    body = raycluster_body(spec)
    assert validate_raycluster(body) == []
    head = body["spec"]["headGroupSpec"]
    c = head["template"]["spec"]["containers"][0]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0" and c["image"] == IMAGE
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    assert head["template"]["metadata"]["labels"][LABEL_RUN] == "run-1"
    assert c["resources"]["requests"] == c["resources"]["limits"]
    workers = body["spec"].get("workerGroupSpecs", [])
    if case == "no-workers":
        assert workers == []
    elif case == "amd-group":
        assert [w["groupName"] for w in workers] == ["gpu-workers"] and body["spec"]["enableInTreeAutoscaling"] is True
        assert workers[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "2"
        assert workers[0]["template"]["spec"]["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    elif case == "gpu-group":
        assert [w["groupName"] for w in workers] == ["workers", "gpu-workers"]
        cpu_pod, gpu_pod = (w["template"]["spec"] for w in workers)
        assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"] and "tolerations" not in cpu_pod
        assert cpu_pod["nodeSelector"] == {"team": "data"}
        assert gpu_pod["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
        assert gpu_pod["nodeSelector"] == {"team": "data", "cloud.google.com/gke-accelerator": "nvidia-l4"}
        assert gpu_pod["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                                          {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert workers[1]["replicas"] == 2 and workers[1]["template"]["metadata"]["labels"][LABEL_RUN] == "run-1"
    else:
        assert [w["groupName"] for w in workers] == ["workers"]
    if case == "gpu-workers":
        assert workers[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert "nvidia.com/gpu" not in c["resources"]["limits"] and workers[0]["replicas"] == workers[0]["maxReplicas"] == 2
    if case == "secrets":
        env = {e["name"]: e for e in c["env"]}
        assert env["N"]["value"] == "3" and env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "secret"}
    if case == "whole-secret":
        assert c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}, {"secretRef": {"name": "prepline-s3", "optional": True}}]
    if case == "autoscaling":
        assert body["spec"]["enableInTreeAutoscaling"] is True and (workers[0]["minReplicas"], workers[0]["maxReplicas"]) == (0, 5)
    if case == "pod-options":
        assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-cpus": "0", "block": "true"}
        assert workers[0]["rayStartParams"] == {"num-cpus": "2", "block": "true"}
        assert head["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]


def test_the_crd_validator_is_not_vacuous():
    body = raycluster_body(make_spec())
    assert validate_raycluster(body) == []

    def broken(edit):
        b = yaml.safe_load(yaml.safe_dump(body))
        edit(b)
        return validate_raycluster(b)

    assert broken(lambda b: b["spec"].update(bogus=1))  # unknown field
    assert broken(lambda b: b["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 1}))  # not a string
    assert broken(lambda b: b["spec"]["headGroupSpec"].pop("template"))  # required
    assert broken(lambda b: b["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"].update(cpu="lots"))
    assert broken(lambda b: b["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(
        env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]))  # list-map duplicate
    assert broken(lambda b: b["metadata"]["labels"].update({"x": "not a valid value!"}))
    assert broken(lambda b: b["metadata"].update(name="Upper_Case"))


@pytest.mark.parametrize("case", sorted(V1_MATRIX))
def test_v1_bodies_validate_against_the_swagger(case):
    spec = make_spec(**V1_MATRIX[case])
    templates = compute_template_bodies(spec)
    for t in templates:
        assert validate_swagger("config.swagger.json", "protoComputeTemplate", t) == []
    body = cluster_v1_body(spec)
    assert validate_swagger("cluster.swagger.json", "protoCluster", body) == []
    assert body["annotations"][LABEL_RUN] == "run-1" and body["clusterSpec"]["headGroupSpec"]["rayStartParams"]
    assert len(templates) == {"no-workers": 1, "gpu-group": 3}.get(case, 2)
    assert [g["computeTemplate"] for g in [body["clusterSpec"]["headGroupSpec"], *body["clusterSpec"].get("workerGroupSpec", [])]] \
        == [t["name"] for t in templates]
    if case == "gpu-group":
        gpu_t = templates[2]
        assert gpu_t["name"].endswith("-gpu-workers") and gpu_t["gpu"] == 1 and "gpuAccelerator" not in gpu_t
        assert [t["key"] for t in gpu_t["tolerations"]] == ["pool", "nvidia.com/gpu"] and "tolerations" not in templates[1]
        assert [g["groupName"] for g in body["clusterSpec"]["workerGroupSpec"]] == ["workers", "gpu-workers"]
    if case == "amd-group":
        assert templates[1]["gpuAccelerator"] == "amd.com/gpu" and templates[1]["gpu"] == 2
    if case == "mebibytes":
        assert (templates[0]["memory"], templates[0]["memoryUnit"]) == (1536, "Mi")
    if case == "secrets":
        env = body["clusterSpec"]["headGroupSpec"]["environment"]
        assert env["values"] == {"HF_HUB_OFFLINE": "1", "N": "3"}
        assert env["valuesFrom"]["AWS_ACCESS_KEY_ID"] == {"source": "SECRET", "name": "s3-creds", "key": "access"}
    job = job_submission_v1_body("python x.py", "id-1", {"pip": ["a"], "env_vars": {"A": "1"}}, 1)
    assert validate_swagger("job_submission.swagger.json", "protoRayJobSubmission", job) == []


def test_the_swagger_validator_is_not_vacuous():
    t = compute_template_bodies(make_spec())[0]
    assert validate_swagger("config.swagger.json", "protoComputeTemplate", {**t, "cpus": 1})
    assert validate_swagger("config.swagger.json", "protoComputeTemplate", {k: v for k, v in t.items() if k != "memory"})
    body = cluster_v1_body(make_spec())
    assert validate_swagger("cluster.swagger.json", "protoCluster", {**body, "clusterState": "ready"})  # read-only
    assert validate_swagger("cluster.swagger.json", "protoCluster", {**body, "version": 2})
    job = job_submission_v1_body("python x.py", "id-1", {"pip": ["a"]})
    assert validate_swagger("job_submission.swagger.json", "protoRayJobSubmission", {**job, "runtimeEnv": {"pip": ["a"]}})


def test_ray_job_body_is_what_rays_client_accepts():
    from ray.dashboard.modules.job.common import JobSubmitRequest

    body = ray_job_body("python x.py", "sid-1", {"env_vars": {"A": "1"}}, 2, {"stage": "doc_id"})
    assert JobSubmitRequest(**body).submission_id == "sid-1"


@pytest.mark.parametrize("kw, match", [
    ({"head": NodeGroup(cpu="two")}, "head.cpu"),
    ({"workers": NodeGroup(memory="4GB")}, "workers.memory"),
    ({"labels": {LABEL_RUN: "has spaces"}}, "label value"),
    ({"labels": {"bad key!": "x"}}, "label/annotation key"),
    ({"env": {"A": "1"}, "env_from_secrets": [{"name": "A", "secret": "s", "key": "k"}]}, "defined twice"),
    ({"env_from_secrets": [{"name": "A", "secret": "s"}]}, "only one of"),
    ({"tolerations": [{"key": "a", "operator": "Sometimes"}]}, "operator"),
    ({"workers": NodeGroup(replicas=3, max_replicas=2)}, "min_replicas <= replicas <= max_replicas"),
    ({"head": NodeGroup(gpu=-1)}, "head.gpu"),
    ({"gpu_workers": NodeGroup(gpu=0, replicas=1)}, "at least one GPU per pod"),
    ({"gpu_workers": NodeGroup(gpu=1, replicas=1, gpu_resource="nvidia.com/cuda")}, "gpu_resource"),
    ({"gpu_workers": NodeGroup(gpu=1, replicas=1, tolerations=[{"key": "a", "operator": "Maybe"}])}, r"gpu_workers.tolerations\[0\]"),
    ({"gpu_workers": NodeGroup(gpu=1, replicas=1, node_selector={"bad key!": "x"})}, "gpu_workers.node_selector"),
    ({"gpu_workers": NodeGroup(gpu=1, replicas=2, max_replicas=1)}, "gpu_workers: need min_replicas"),
    ({"ray_start_params": {"resources": {"a": 1}}}, "scalar"),
])
def test_bad_specs_fail_before_any_request(kw, match):
    with pytest.raises(ConfigError, match=match):
        raycluster_body(make_spec(**kw))


@pytest.mark.parametrize("kw, match", [
    ({"node_selector": {"pool": "ray"}}, "node_selector"),
    ({"gpu_workers": NodeGroup(gpu=1, replicas=1, node_selector={"gpu": "l4"})}, "gpu_workers.node_selector"),
    ({"env_from_secrets": [{"secret": "all-keys"}]}, "all keys"),
    ({"head": NodeGroup(cpu="500m")}, "whole CPUs"),
    ({"image_pull_secrets": ["a", "b"]}, "at most one"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]}, "V1"),
])
def test_v1_refuses_what_it_cannot_express(fake, kw, match):
    p = make_provider(fake, "v1")
    with pytest.raises(ConfigError, match=match):
        p.create(make_spec(**kw))
    assert not fake.requests  # nothing half-created


def test_names_kuberay_cannot_use_and_the_default_image():
    check_name(make_spec("a" * 53))  # KubeRay's MaxRayClusterNameLength (utils/constant.go)
    for bad in ("a" * 54, "a" * 60, "9lives"):
        with pytest.raises(ConfigError, match="DNS-1035 label .start with a letter. of at most 53 chars"):
            check_name(make_spec(bad))
    try:
        from prepline.images import RAY_IMAGE  # type: ignore[import-not-found]
    except ImportError:
        RAY_IMAGE = ""
    if RAY_IMAGE:
        assert raycluster_body(make_spec(image=""))["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == RAY_IMAGE
    else:
        with pytest.raises(ConfigError, match="no Ray image"):
            raycluster_body(make_spec(image=""))


# -- Istio ----------------------------------------------------------------------------------------------
def _pod_annotations_v2(body: dict) -> list[dict]:
    return [body["spec"]["headGroupSpec"]["template"]["metadata"].get("annotations")] + \
        [w["template"]["metadata"].get("annotations") for w in body["spec"].get("workerGroupSpecs", [])]


def test_ray_pods_run_without_istio_sidecars_by_default_and_it_can_be_changed():
    """In a Kubeflow profile namespace Istio injects Envoy sidecars, which block Ray's random ports and the
    steps' direct calls to the head: Ray pods get sidecar.istio.io/inject "false" unless cluster_json says otherwise."""
    import json

    from prepline import stages

    off = {"sidecar.istio.io/inject": "false"}
    body = raycluster_body(make_spec())
    assert _pod_annotations_v2(body) == [off, off] and "annotations" not in body["metadata"]
    assert not validate_raycluster(body)
    v1 = cluster_v1_body(make_spec())
    assert v1["clusterSpec"]["headGroupSpec"]["annotations"] == off == v1["clusterSpec"]["workerGroupSpec"][0]["annotations"]
    assert not validate_swagger("cluster.swagger.json", "protoCluster", v1)
    for given, want in (({"sidecar.istio.io/inject": "true"}, {"sidecar.istio.io/inject": "true"}),
                        ({"sidecar.istio.io/inject": None}, None),
                        ({"proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}'},
                         {**off, "proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}'})):
        spec = stages.cluster_spec(json.dumps({"pod_annotations": given, "namespace": "team-a", "image": IMAGE}), "pl-x-1", "r", "doc_id")
        assert _pod_annotations_v2(raycluster_body(spec)) == [want, want]
    assert stages.cluster_spec("{}", "pl-x-1", "r", "doc_id").pod_annotations == off
    with pytest.raises(ConfigError, match="pod_annotations key"):
        raycluster_body(make_spec(pod_annotations={"bad key!": "x"}))


def test_the_fake_accepts_the_pod_annotations_on_both_apis(fake):
    for version in ("v2", "v1"):
        p = make_provider(fake, version)
        p.create(make_spec(f"pl-istio-{version}"))
        assert p.wait_ready(f"pl-istio-{version}", timeout=10).state == "ready"
