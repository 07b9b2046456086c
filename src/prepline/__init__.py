"""prepline: LLM pre-training data preparation on Ray, packaged as Kubeflow Pipelines components."""

__version__ = "0.1.0"
