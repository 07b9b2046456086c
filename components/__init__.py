"""Reusable Kubeflow Pipelines components (lightweight Python components calling into prepline).

Import needs the ``kfp`` extra. :func:`catalog` is every component by its compiled file stem.
"""


def catalog() -> dict:
    from prepline.components.fine_tune import COMPONENTS as FINE_TUNE
    from prepline.components.ray_stage import COMPONENTS
    from prepline.components.run_pipeline import COMPONENTS as CHAINING

    return {**COMPONENTS, **CHAINING, **FINE_TUNE}
