"""A small kube-scheduler for the fakes: which node each pod of a RayCluster goes to, or the message a
pod that fits nowhere gets on its ``PodScheduled`` condition (reason ``Unschedulable``).

Per node the filters run in the default profile's order and the first that refuses gives the node's
reason (``pkg/scheduler/framework/runtime/framework.go`` RunFilterPlugins stops at the first failure):

* TaintToleration: a ``NoSchedule``/``NoExecute`` taint that no toleration matches ->
  ``node(s) had untolerated taint(s)`` (the wording of Kubernetes >= 1.32);
* NodeAffinity: ``nodeSelector`` labels the node does not have -> ``node(s) didn't match Pod's node
  affinity/selector``;
* NodeResourcesFit: requests over what is left of the node's allocatable (other pods placed there
  count) -> ``Insufficient <resource>`` per resource, ``Too many pods`` over its pod count.

The message is ``FitError.Error()``'s: ``0/N nodes are available: <count> <reason>, ...`` (reasons
sorted), then the preemption post-filter's sentence: a node refused for resources could free them by
preemption (``No preemption victims found for incoming pod``: the fakes run no other pods of higher
priority), one refused by a taint or a selector cannot (``Preemption is not helpful for scheduling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DEC = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
RESOURCE_REASONS = ("Insufficient", "Too many pods")


def amount(q) -> float:
    import re

    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q).strip())
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    return float(m.group(1)) * (_BIN.get(m.group(2)) or _DEC[m.group(2)])


@dataclass
class Node:
    name: str
    allocatable: dict  # e.g. {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1", "pods": "110"}
    labels: dict = field(default_factory=dict)
    taints: list = field(default_factory=list)  # [{"key", "value", "effect"}]
    used: dict = field(default_factory=dict)  # resource -> amount taken by pods placed on it


@dataclass
class Pod:
    name: str
    group: str  # ray.io/group: headgroup, workers, gpu-workers
    requests: dict
    node_selector: dict
    tolerations: list


def pods_of(obj: dict) -> list[Pod]:
    """The pods the operator creates for a ``ray.io/v1`` RayCluster: the head, then each worker group's replicas."""
    name, spec = obj["metadata"]["name"], obj["spec"]

    def pod(pod_name: str, group: str, template: dict) -> Pod:
        ps = template.get("spec") or {}
        c = (ps.get("containers") or [{}])[0]
        res = c.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}  # a limit alone is also the request
        return Pod(pod_name, group, req, dict(ps.get("nodeSelector") or {}), list(ps.get("tolerations") or []))

    out = [pod(f"{name}-head-x7k2p", "headgroup", spec["headGroupSpec"]["template"])]
    for g in spec.get("workerGroupSpecs") or []:
        n = g.get("replicas") if g.get("replicas") is not None else g.get("minReplicas", 0)
        if g.get("suspend"):
            continue
        for i in range(int(n)):
            out.append(pod(f"{name}-{g['groupName']}-worker-{i:05d}", g["groupName"], g["template"]))
    return out


def _tolerated(taint: dict, tolerations: list) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and str(t.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def _refusal(pod: Pod, node: Node) -> list[str]:
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, pod.tolerations):
            return ["node(s) had untolerated taint(s)"]
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    out = []
    if node.used.get("pods", 0) + 1 > amount(node.allocatable.get("pods", 110)):
        out.append("Too many pods")
    for r, q in sorted(pod.requests.items()):
        if node.used.get(r, 0) + amount(q) > amount(node.allocatable.get(r, 0)) + 1e-9:
            out.append(f"Insufficient {r}")
    return out


def schedule(pods: list[Pod], nodes: list[Node]) -> dict[str, str]:
    """Places the pods in order: pod name -> node name, or -> ``"!" + the scheduler's message``. The
    nodes' ``used`` counts what was placed (a later cluster sees it)."""
    out = {}
    for p in pods:
        reasons: dict[str, int] = {}
        preempt = {"Preemption is not helpful for scheduling": 0, "No preemption victims found for incoming pod": 0}
        chosen = None
        for n in nodes:
            why = _refusal(p, n)
            if not why:
                chosen = n
                break
            for w in why:
                reasons[w] = reasons.get(w, 0) + 1
            key = "No preemption victims found for incoming pod" if why[0].startswith(RESOURCE_REASONS) else \
                "Preemption is not helpful for scheduling"
            preempt[key] += 1
        if chosen is not None:
            for r, q in p.requests.items():
                chosen.used[r] = chosen.used.get(r, 0) + amount(q)
            chosen.used["pods"] = chosen.used.get("pods", 0) + 1
            out[p.name] = chosen.name
            continue
        n = len(nodes)
        fit = ", ".join(f"{c} {r}" for r, c in sorted(reasons.items()))
        pre = ", ".join(f"{c} {r}" for r, c in sorted(preempt.items()) if c)
        out[p.name] = f"!0/{n} nodes are available: {fit}. preemption: 0/{n} nodes are available: {pre}."
    return out


def release(placed: dict[str, str], pods: list[Pod], nodes: list[Node]) -> None:
    """Frees what ``schedule`` took for these pods (their cluster was deleted)."""
    by_name = {n.name: n for n in nodes}
    for p in pods:
        node = by_name.get(placed.get(p.name, "!"))
        if node is None:
            continue
        for r, q in p.requests.items():
            node.used[r] = node.used.get(r, 0) - amount(q)
        node.used["pods"] = node.used.get("pods", 0) - 1
