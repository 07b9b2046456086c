"""Reusable Kubeflow Pipelines components (lightweight Python components calling into prepline)."""
