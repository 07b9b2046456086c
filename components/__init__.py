"""Reusable Kubeflow Pipelines components (lightweight Python components calling into prepline).

Import needs the ``kfp`` extra. :func:`catalog` is every component by its compiled file stem, its
images from one registry/tag setting (:class:`prepline.images.ImageSet`).
"""


def _in_image(component, image: str):
    """A copy of ``component`` whose container runs ``image``."""
    import copy

    c = copy.deepcopy(component)
    c.component_spec.implementation.container.image = image
    return c


def catalog(images=None) -> dict:
    from prepline.components.fine_tune import COMPONENTS as FINE_TUNE
    from prepline.components.ray_stage import COMPONENTS
    from prepline.components.run_pipeline import COMPONENTS as CHAINING
    from prepline.images import DEFAULT

    images = images or DEFAULT
    out = {k: _in_image(c, images.launcher) for k, c in {**COMPONENTS, **CHAINING}.items()}
    out.update({k: _in_image(c, images.trainer) for k, c in FINE_TUNE.items()})
    return out
