"""Reusable Kubeflow Pipelines components (lightweight Python components calling into prepline).

Import needs the ``kfp`` extra. :func:`catalog` is every component by its compiled file stem.
"""


def catalog() -> dict:
    from prepline.components.ray_stage import COMPONENTS

    return dict(COMPONENTS)
