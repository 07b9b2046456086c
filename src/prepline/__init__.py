"""prepline: LLM pre-training data preparation on Ray, packaged as Kubeflow Pipelines components.

The Python API (docs/python_api.md), loaded on first use so that ``import prepline`` stays fast::

    import prepline
    prepline.list_transforms()                    # every transform (built-ins and plug-ins), typed
    prepline.describe("doc_id").params            # its parameters
    m = prepline.run("doc_id", "data/sample", "data/ids")
    prepline.read_metadata("data/ids").totals.docs_out
    spec = prepline.load_pipeline("my_pipeline.yaml")   # a pipeline spec (docs/pipelines.md)
    prepline.compile_pipeline(spec, "compiled/")        # its KFP YAML
    prepline.run_pipeline(spec, "work/")                # a local run
"""

__version__ = "0.1.0"

#: public name -> module holding it (imported on first access, PEP 562)
_LAZY = {
    "run": "prepline.api",
    "load_pipeline": "prepline.api",
    "compile_pipeline": "prepline.api",
    "run_pipeline": "prepline.api",
    "list_transforms": "prepline.api",
    "describe": "prepline.api",
    "read_metadata": "prepline.api",
    "StageMetadata": "prepline.api",
    "Totals": "prepline.api",
    "TransformInfo": "prepline.api",
    "train_quality_classifier": "prepline.quality",
    "RunOptions": "prepline.runtime.options",
    "PreplineError": "prepline.errors",
    "ConfigError": "prepline.errors",
}

__all__ = ["__version__", *_LAZY]

TYPE_CHECKING = False  # (not imported from typing: `import prepline` imports nothing)
if TYPE_CHECKING:  # for type checkers and IDEs; at run time these load lazily
    from prepline.api import (StageMetadata, Totals, TransformInfo, compile_pipeline, describe, list_transforms,  # noqa: F401
                              load_pipeline, read_metadata, run, run_pipeline)
    from prepline.errors import ConfigError, PreplineError  # noqa: F401
    from prepline.quality import train_quality_classifier  # noqa: F401
    from prepline.runtime.options import RunOptions  # noqa: F401


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prepline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
