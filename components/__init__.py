"""Reusable Kubeflow Pipelines components (lightweight Python components calling into prepline).

Import needs the ``kfp`` extra. :func:`catalog` is every component by its compiled file stem, its
images from one registry/tag setting (:class:`prepline.images.ImageSet`).
"""


def _in_image(component, image: str, images):
    """A copy of ``component`` whose container runs ``image``, its image inputs defaulting to ``images``."""
    import copy

    c = copy.deepcopy(component)
    c.component_spec.implementation.container.image = image
    for name, kind in (("ray_image", "ray"), ("trainer_image", "trainer")):
        if name in (c.component_spec.inputs or {}):
            c.component_spec.inputs[name].default = images.image(kind)
            c.component_spec.inputs[name].optional = True
    return c


def catalog(images=None) -> dict:
    from prepline.components.fine_tune import COMPONENTS as FINE_TUNE
    from prepline.components.pipeline_steps import COMPONENTS as STEPS
    from prepline.components.ray_stage import COMPONENTS
    from prepline.components.run_pipeline import COMPONENTS as CHAINING
    from prepline.images import DEFAULT

    images = images or DEFAULT
    out = {k: _in_image(c, images.launcher, images) for k, c in {**COMPONENTS, **CHAINING, **STEPS}.items()}
    out.update({k: _in_image(c, images.trainer, images) for k, c in FINE_TUNE.items()})
    return out
