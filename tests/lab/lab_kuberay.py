"""The lab's KubeRay control plane: RayClusters that the strict fake API server
(tests/clusters/fake_kuberay.py, its schema checks unchanged) accepts are realised as real Ray nodes
on lab hosts, the way the KubeRay operator turns a RayCluster into pods.

What a pod would get, and the file of ray-project/kuberay it comes from
(``ray-operator/controllers/ray/common/pod.go``):

* the command ``ray start --head`` / ``ray start`` with the group's ``rayStartParams`` as
  ``--key=value`` flags, sorted, ``"true"`` as a bare ``--key`` and ``"false"`` dropped except for
  log-color, include-dashboard and include-log-monitor (``convertParamMap``); missing ones filled in
  as ``setMissingRayStartParams`` does (workers: ``address=<cluster>-head-svc.<ns>.svc.cluster.local:<port>``;
  head: ``dashboard-host=0.0.0.0``; both: ``metrics-export-port=8080``, ``block``,
  ``dashboard-agent-listen-port=52365``) and ``num-cpus`` / ``memory`` / ``num-gpus`` from the
  container's limits (``generateRayStartCommand``; cpu falls back to the request);
* the container's ``env`` and ``envFrom``, secrets resolved in the cluster's own namespace only (the
  fake's ``container_env``: a missing secret keeps the cluster pending with
  CreateContainerConfigError and nothing starts), plus what ``setContainerEnvVars`` adds:
  RAY_CLUSTER_NAME, RAY_CLUSTER_NAMESPACE, RAY_PORT, RAY_ADDRESS, RAY_USAGE_STATS_KUBERAY_IN_USE,
  KUBERAY_GEN_RAY_START_CMD, and on workers FQ_RAY_IP / RAY_IP;
* workers wait for the head's GCS first (the injected init container's ``ray health-check`` loop);
* the head service name ``<cluster>-head-svc.<ns>.svc.cluster.local`` resolving to the head (the
  lab's /etc/hosts plays cluster DNS).

One deviation, because lab hosts have no default route (nothing may leave the lab): Ray finds a
pod's address by a UDP "connect" towards the internet, which fails there, so every node gets
``--node-ip-address=<its host's address>`` (the address Ray would have found in the pod).

Each node gets a host of its own (a pod per node); a cluster with more nodes than free hosts stays
pending and its pods say Unschedulable, as on a cluster without room. With ``gpus`` (host -> GPU
count) the hosts are Kubernetes nodes for the fake's scheduler (``nodes()``: one pod each; a GPU host
offers ``nvidia.com/gpu`` and carries the taint GPU pools have) and ``create`` gets its placement: each
pod starts on the host it was given, with ``--num-gpus`` from its limits as KubeRay writes it (Ray then
counts logical GPUs: the lab has no device, so what runs there is the CPU engine, placed as on GPUs);
a pod placed nowhere never starts and the cluster never gets ready. With ``images`` (the lab's
run), each node runs with only the package set of its container's image importable
(tests/runtime_images/image_sets.py); an image the lab does not have never starts (ErrImagePull),
and a node whose process exits makes the head pod CrashLoopBackOff. ``not_ready`` is '' only when
every node of the cluster is ALIVE in the head's own records and the dashboard answers, which is
KubeRay's ``ready`` (all pods running and ready). ``delete`` first keeps Ray's own record of where
each job's tasks ran (``records``: the lab's stand-in for a log collector: the cluster's state dies
with it), then kills every process of the cluster on every host and frees the hosts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import threading
import time

from lab import DASHBOARD_PORT, Lab, http_get

HEAD_CONTAINER, WORKER_CONTAINER = 0, 0  # utils.RayContainerIndex
SPECIAL_BOOL = ("log-color", "include-dashboard", "include-log-monitor")
_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DEC = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity(q) -> int:
    """A Kubernetes quantity's ``Value()``: the integer value rounded up ("500m" -> 1, "4Gi" -> 4294967296)."""
    import math
    import re

    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q).strip())
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    num, suffix = float(m.group(1)), m.group(2)
    mult = _BIN.get(suffix) or _DEC.get(suffix)
    if mult is None:
        raise ValueError(f"not a quantity suffix: {q!r}")
    return math.ceil(num * mult)


def start_flags(params: dict, head: bool, fqdn: str, head_port: str, resources: dict) -> list[str]:
    """The ``ray start`` arguments KubeRay generates for a node (pod.go: setMissingRayStartParams,
    generateRayStartCommand, convertParamMap)."""
    p = {k: str(v) for k, v in (params or {}).items()}
    if not head:
        p.setdefault("address", f"{fqdn}:{head_port}")
    else:
        p.setdefault("dashboard-host", "0.0.0.0")
    p.setdefault("metrics-export-port", "8080")
    p["block"] = "true"
    p.setdefault("dashboard-agent-listen-port", "52365")
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" not in p:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu and quantity(cpu):
            p["num-cpus"] = str(quantity(cpu))
    if "memory" not in p and limits.get("memory") and quantity(limits["memory"]):
        p["memory"] = str(quantity(limits["memory"]))
    if "num-gpus" not in p:
        for k in sorted(limits):
            if k.endswith("/gpu") and quantity(limits[k]):
                p["num-gpus"] = str(quantity(limits[k]))
                break
    out = ["--head"] if head else []
    for k in sorted(p):
        v = p[k]
        if v.lower() in ("true", "false") and k not in SPECIAL_BOOL:
            if v.lower() == "true":
                out.append(f"--{k}")
        else:
            out.append(f"--{k}={v}")
    return out


class LabKubeRay:
    """Realises accepted RayClusters on the lab hosts ``hosts`` (one node per host)."""

    def __init__(self, lab: Lab, hosts=("ray-0", "ray-1", "ray-2"), probe_interval: float = 0.5, images=None, gpus=None):
        self.lab, self.free = lab, list(hosts)
        self.hosts, self.gpus = tuple(hosts), dict(gpus or {})
        #: image reference -> the env that gives a process only that image's packages, or None when the lab
        #: does not have the image (its pods never start: ErrImagePull); None here: every image is the .venv
        self.images = images
        self.probe_interval = probe_interval
        self.lock = threading.RLock()
        self.clusters: dict[tuple[str, str], dict] = {}
        #: (ns, name) -> {"nodes": {host: ip}, "commands": {host: argv}, "tasks": {host: n}, "jobs": [...]}
        self.records: dict[tuple[str, str], dict] = {}
        self.events: list[str] = []

    def nodes(self) -> list:
        """The hosts as Kubernetes nodes for the fake's scheduler (tests/clusters/fake_scheduler.py)."""
        from fake_scheduler import Node

        out = []
        for h in self.hosts:
            alloc = {"cpu": "64", "memory": "256Gi", "pods": "1"}
            taints = []
            if self.gpus.get(h):
                alloc["nvidia.com/gpu"] = str(self.gpus[h])
                taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            out.append(Node(h, alloc, {"kubernetes.io/hostname": h, **({"gpu": "lab"} if self.gpus.get(h) else {})}, taints))
        return out

    # ---- the fake's hooks ----------------------------------------------------------------------
    def create(self, ns: str, name: str, obj: dict, env_of, placement: dict | None = None) -> None:
        """``placement`` (from the fake's scheduler): pod name -> (group, host or "!" + why it fits nowhere),
        in the operator's pod order (the head, then each group's replicas)."""
        spec = obj["spec"]
        head_group = spec["headGroupSpec"]
        groups = [(head_group, True, 1)]
        for g in spec.get("workerGroupSpecs") or []:
            if not g.get("suspend"):
                groups.append((g, False, int(g.get("replicas", 1) if g.get("replicas") is not None else g.get("minReplicas", 0))))
        need = sum(n for _, _, n in groups)
        where = [host for _, host in (placement or {}).values()]
        c = {"ns": ns, "name": name, "hosts": [], "failure": "", "deleted": False, "ready": False, "why": "pods are starting",
             "need": need, "procs": []}
        image_env = {}
        for group, _, _ in groups:
            for ct in group["template"]["spec"]["containers"][:1]:
                env = self.images(ct.get("image", "")) if self.images else {}
                if env is None:
                    c.update(failure="broken", why=f"image {ct.get('image')} is not one of the lab's images")
                image_env[id(group)] = env or {}
        with self.lock:
            self.clusters[(ns, name)] = c
            if c["failure"]:
                self.events.append(f"{ns}/{name}: not started ({c['why']})")
                return
            if placement is None and need > len(self.free):
                c["failure"] = "unsched"
                c["why"] = f'no endpoints available for service "{name}-head-svc"'
                self.events.append(f"{ns}/{name}: unschedulable (0/{len(self.free)} free lab hosts for {need} Ray nodes)")
                return
            if placement is None:
                hosts = [self.free.pop(0) for _ in range(need)]
            else:  # where the scheduler put each pod ("!...": nowhere; that pod never starts)
                hosts = where
                for h in hosts:
                    if not h.startswith("!"):
                        self.free.remove(h)
                if hosts[0].startswith("!"):
                    c["failure"] = "unsched"  # the fake says so for the head itself; nothing starts
                    c["hosts"] = []
                    return
            c["hosts"] = [h for h in hosts if not h.startswith("!")]
        fqdn = f"{name}-head-svc.{ns}.svc.cluster.local"
        head_port = str((head_group.get("rayStartParams") or {}).get("port", "6379"))
        self.lab.add_alias(fqdn, hosts[0])
        c["alias"] = fqdn
        nodes, i = [], 0
        for group, is_head, n in groups:
            ct = group["template"]["spec"]["containers"][HEAD_CONTAINER if is_head else WORKER_CONTAINER]
            env, err = env_of(ct.get("env") or [], ct.get("envFrom") or [])
            assert not err, err  # the fake keeps such a cluster pending and never calls create
            for _ in range(n):
                host = hosts[i]
                i += 1
                if host.startswith("!"):
                    continue
                flags = start_flags(group.get("rayStartParams") or {}, is_head, fqdn, head_port, ct.get("resources") or {})
                argv = ["ray", "start", *flags, f"--node-ip-address={self.lab.ip(host)}"]
                pod_env = {**image_env[id(group)], **env, "RAY_CLUSTER_NAME": name, "RAY_CLUSTER_NAMESPACE": ns, "RAY_PORT": head_port,
                           "RAY_ADDRESS": f"127.0.0.1:{head_port}" if is_head else f"{fqdn}:{head_port}",
                           "RAY_USAGE_STATS_KUBERAY_IN_USE": "1", "KUBERAY_GEN_RAY_START_CMD": shlex.join(argv[:-1])}
                if not is_head:
                    pod_env.update(FQ_RAY_IP=fqdn, RAY_IP=f"{name}-head-svc")
                nodes.append((host, is_head, argv, pod_env))
        self.records[(ns, name)] = {"nodes": {h: self.lab.ip(h) for h in c["hosts"]},
                                    "commands": {h: a for h, _, a, _ in nodes}, "tasks": {}, "worker_tasks": {}, "jobs": []}
        nowhere = sum(h.startswith("!") for h in hosts)
        self.events.append(f"{ns}/{name}: head on {hosts[0]}, workers on {', '.join(c['hosts'][1:]) or 'none'}"
                           + (f"; {nowhere} pod(s) placed nowhere" if nowhere else ""))
        threading.Thread(target=self._run, args=(c, nodes, fqdn, head_port), daemon=True).start()

    def not_ready(self, ns: str, name: str) -> str:
        c = self.clusters.get((ns, name))
        if c is None:
            return f'no endpoints available for service "{name}-head-svc"'
        return "" if c["ready"] else c["why"]

    def failure(self, ns: str, name: str) -> str:
        """'unsched' (more nodes than free hosts), 'broken' (a container image the lab does not have), or ''."""
        c = self.clusters.get((ns, name))
        return (c.get("failure") or "") if c else ""

    def delete(self, ns: str, name: str) -> None:
        with self.lock:
            c = self.clusters.pop((ns, name), None)
        if c is None:
            return
        c["deleted"] = True
        if c["hosts"]:
            self._keep_records(ns, name, c)
            for h in c["hosts"]:
                self.lab._kill_ns(self.lab.ns(h))
            for p in c["procs"]:
                p.wait(timeout=30)
            for h in c["hosts"]:
                shutil.rmtree(self.lab.scratch(h) / "ray", ignore_errors=True)  # the pod's file system goes with it
            self.lab.remove_alias(c["alias"])
            with self.lock:
                self.free.extend(c["hosts"])
        self.events.append(f"{ns}/{name}: deleted")

    def close(self) -> None:
        for ns, name in list(self.clusters):
            self.delete(ns, name)

    # ---- the "pods" ----------------------------------------------------------------------------
    def _run(self, c: dict, nodes: list, fqdn: str, head_port: str) -> None:
        head = nodes[0]
        log = open(self.lab.scratch(head[0]) / "pod.log", "ab")
        c["procs"].append(self.lab.popen(head[0], head[2], env=head[3], stdout=log, stderr=log))
        for host, _, argv, env in nodes[1:]:  # the init container waits for the GCS, then the worker starts
            wait = f"until ray health-check --address {fqdn}:{head_port} >/dev/null 2>&1; do sleep 1; done; exec \"$@\""
            log = open(self.lab.scratch(host) / "pod.log", "ab")
            c["procs"].append(self.lab.popen(host, ["sh", "-c", wait, "sh", *argv], env=env, stdout=log, stderr=log))
        dash = f"http://{self.lab.ip(head[0])}:{DASHBOARD_PORT}"
        c["dashboard"] = dash
        while not c["deleted"]:
            try:
                with http_get(f"{dash}/api/v0/nodes?limit=100", timeout=5) as r:
                    alive = [n for n in json.loads(r.read())["data"]["result"]["result"] if n.get("state") == "ALIVE"]
                with http_get(f"{dash}/api/version", timeout=5):
                    pass
                ok = len(alive) >= c["need"]
                c["why"] = "" if ok else f"containers with unready status: {c['need'] - len(alive)} of {c['need']} Ray nodes not up"
                c["ready"] = ok
            except Exception as e:  # noqa: BLE001 - the dashboard is not serving yet (or any more)
                c["ready"] = False
                c["why"] = f"dial tcp {self.lab.ip(head[0])}:{DASHBOARD_PORT}: {type(e).__name__}"
            for p in c["procs"]:
                if p.poll() is not None and not c["deleted"]:  # the container exited: the kubelet restarts it, in vain
                    c["ready"] = False
                    c["failure"] = "crash"
                    c["why"] = f"a Ray node of {c['name']} exited with {p.returncode} (see pod.log on its host)"
            time.sleep(self.probe_interval)

    def _keep_records(self, ns: str, name: str, c: dict) -> None:
        """Ray's own record of where each job's tasks ran, read from the head before the cluster dies."""
        dash, rec = c.get("dashboard"), self.records[(ns, name)]
        if not dash:
            return
        ip_host = {ip: h for h, ip in rec["nodes"].items()}
        try:
            with http_get(f"{dash}/api/v0/nodes?limit=100", timeout=10) as r:
                node_host = {n["node_id"]: ip_host.get(n["node_ip"], n["node_ip"]) for n in json.loads(r.read())["data"]["result"]["result"]}
            with http_get(f"{dash}/api/jobs/", timeout=10) as r:
                jobs = json.loads(r.read())
            for j in jobs:
                if not j.get("job_id") or j.get("type") != "SUBMISSION":
                    continue
                rec["jobs"].append({"submission_id": j.get("submission_id"), "status": j.get("status")})
                url = (f"{dash}/api/v0/tasks?limit=10000&filter_keys=job_id&filter_predicates=%3D&filter_values={j['job_id']}")
                with http_get(url, timeout=30) as r:
                    tasks = json.loads(r.read())["data"]["result"]["result"]
                for t in tasks:
                    if t.get("type") == "DRIVER_TASK" or not t.get("node_id"):
                        continue
                    h = node_host.get(t["node_id"], t["node_id"])
                    rec["tasks"][h] = rec["tasks"].get(h, 0) + 1
                    if str(t.get("name", "")).startswith("_RayWorker.run"):  # a transform's task (not progress or pings)
                        rec["worker_tasks"][h] = rec["worker_tasks"].get(h, 0) + 1
        except Exception as e:  # noqa: BLE001 - recorded, the test decides
            rec["error"] = repr(e)


def trainer_spawn(lab: Lab, job: dict, namespace: str = "team-a", prefix: str = "trainer-"):
    """The spawn function (prepline.train.nodes) that runs node i of a TrainJob on host ``trainer-i``,
    each pod's name and its service name (also fully qualified in ``namespace``) resolving to its host
    through the lab's /etc/hosts, as the JobSet's headless service would."""
    from prepline.train.nodes import host_spawn
    from prepline.train.realise import realise_trainjob

    nodes = realise_trainjob(job)
    placement = {n.pod: f"{prefix}{n.index}" for n in nodes}
    for n in nodes:
        lab.add_alias(n.pod, placement[n.pod])
        lab.add_alias(n.dns_name, placement[n.pod])
        lab.add_alias(f"{n.dns_name}.{namespace}.svc.cluster.local", placement[n.pod])
    return host_spawn(lab.popen, placement)
