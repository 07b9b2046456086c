"""Ray cluster providers: where a stage's Ray cluster comes from.

``local``: a real Ray head on this machine in its own process session (the embedded default).
``kuberay``: a RayCluster through the KubeRay API server (V2, with a V1 adapter).
Both hand out a Ray job-submission address, so the execute step is the same for either.
"""

from __future__ import annotations

from prepline.clusters.base import ClusterInfo, ClusterProvider, ClusterSpec, JobInfo, NodeGroup, cluster_name

__all__ = ["ClusterInfo", "ClusterProvider", "ClusterSpec", "JobInfo", "NodeGroup", "cluster_name", "get_provider"]


def get_provider(kind: str, **options) -> ClusterProvider:
    """``kind``: 'local' or 'kuberay' (options: server URL, namespace, token, api version...)."""
    if kind == "local":
        from prepline.clusters.local import LocalProvider

        return LocalProvider(**options)
    if kind == "kuberay":
        from prepline.clusters.kuberay import KubeRayProvider

        return KubeRayProvider(**options)
    from prepline.errors import ConfigError

    raise ConfigError(f"unknown cluster provider '{kind}'", "use 'local' or 'kuberay'")
