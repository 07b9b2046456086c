"""Kubeflow Pipelines, by concern (the ``kfp`` SDK itself is imported only where it is used):

* :mod:`prepline.kfp.connection`: host, namespace and token of a KFP API;
* :mod:`prepline.kfp.params`: compiled pipeline packages, run parameters checked against them;
* :mod:`prepline.kfp.client`: :class:`~prepline.kfp.client.KfpClient` (upload, run, clone, wait, list);
* :mod:`prepline.kfp.chained`: a pre-uploaded pipeline started as a child run (the chained super pipeline);
* :mod:`prepline.kfp.cli`: the ``prepline kfp`` command;
* :mod:`prepline.kfp.compile`: the catalog compiled into ``compiled/``;
* :mod:`prepline.kfp.local`: a pipeline run on this machine with kfp's local runner;
* :mod:`prepline.kfp.local_tasks`: what such a run shows of its tasks, and each task's whole log.
"""

from __future__ import annotations

from prepline.errors import ConfigError


def require_kfp() -> None:
    """Fail with the install command when the kfp SDK (the ``kfp`` extra) is missing."""
    try:
        import kfp  # noqa: F401
    except ImportError:
        raise ConfigError("this command needs Kubeflow Pipelines", "pip install 'prepline[kfp]'") from None
