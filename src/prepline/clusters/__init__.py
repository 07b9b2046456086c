"""Ray cluster providers: where a stage's Ray cluster comes from.

``local``: a real Ray head on this machine in its own process session (kfp.local, scripts/main.sh).
``kuberay``: a RayCluster through the KubeRay API server (V2, with a V1 adapter) — the compiled default.
Both hand out a job client for Ray's job REST API on the head (:mod:`prepline.clusters.ray_jobs`),
so the execute step is the same for either.
"""

from __future__ import annotations

from prepline.clusters.base import ClusterInfo, ClusterProvider, ClusterSpec, JobInfo, NodeGroup, cluster_name

__all__ = ["ClusterInfo", "ClusterProvider", "ClusterSpec", "JobInfo", "NodeGroup", "cluster_name", "get_provider"]


def get_provider(kind: str, **options) -> ClusterProvider:
    """``kind``: 'local' or 'kuberay' (options: server URL, namespace, token, api version...)."""
    if kind == "local":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            from prepline.errors import ConfigError

            raise ConfigError("provider 'local' starts a Ray head on this machine, and Ray is not installed here "
                              "(the launcher image of the KFP steps has no Ray)",
                              "use provider='kuberay' on a cluster (the compiled default), or install prepline[ray] for local runs")
        from prepline.clusters.local import LocalProvider

        return LocalProvider(**options)
    if kind == "kuberay":
        from prepline.clusters.kuberay import KubeRayProvider

        return KubeRayProvider(**options)
    from prepline.errors import ConfigError

    raise ConfigError(f"unknown cluster provider '{kind}'", "use 'local' or 'kuberay'")
