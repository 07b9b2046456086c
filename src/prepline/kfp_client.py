"""The names of the former ``prepline.kfp_client`` module, now homed in :mod:`prepline.kfp`.

Kept because compiled components import from here (``compiled/components/run_pipeline.yaml`` and
``compiled/pipelines/super_chained.yaml`` embed ``from prepline.kfp_client import KfpClient,
resolve_connection, run_child``), and images and YAML already deployed run that code.
"""

from prepline.kfp.chained import child_run_name, run_child
from prepline.kfp.cli import main
from prepline.kfp.client import (
    EXIT_API, EXIT_CANCELED, EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, TERMINAL_STATES, ChildRunFailed, KfpAuthError,
    KfpClient, KfpError, KfpNotFound, KfpTimeout, KfpUnreachable,
)
from prepline.kfp.connection import Connection, resolve_connection
from prepline.kfp.params import check_parameters, content_digest, gather_parameters, read_package, root_inputs

__all__ = [
    "EXIT_API", "EXIT_CANCELED", "EXIT_FAILED", "EXIT_OK", "EXIT_TIMEOUT", "EXIT_USAGE", "TERMINAL_STATES", "ChildRunFailed",
    "Connection", "KfpAuthError", "KfpClient", "KfpError", "KfpNotFound", "KfpTimeout", "KfpUnreachable", "check_parameters",
    "child_run_name", "content_digest", "gather_parameters", "main", "read_package", "resolve_connection", "root_inputs", "run_child",
]
