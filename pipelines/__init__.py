"""Pipelines built from the registry: one simple pipeline per transform and the super pipelines."""
