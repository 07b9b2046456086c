"""S3 credentials from a mounted file, for steps that cannot get them as environment variables.

Elyra 4.1.1 applies neither ``KubernetesSecret`` nor ``EnvironmentVariable`` to custom-component
nodes (``applies_to_custom = False`` in ``elyra/pipeline/properties.py``); its ``VolumeMount``
("Data Volumes": a PersistentVolumeClaim) does. So the Elyra stage step reads its credentials
from a mounted folder or file (:data:`DEFAULT_PATH`, or ``--s3-credentials``), in one of three forms:

* a folder with one file per key (what a Kubernetes Secret volume holds, and what
  ``deploy/elyra`` copies from the secret ``prepline-s3`` onto the claim): ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, optionally ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``,
  ``PREPLINE_S3_ENDPOINT``;
* a file of ``KEY=VALUE`` lines with those keys (``#`` comments allowed);
* an AWS shared-credentials INI file (its ``[default]`` profile: ``aws_access_key_id`` ...).

:func:`apply` puts them into ``os.environ`` (never over variables already set), where
:func:`prepline.data_access.s3_client` and boto3 find them; values are never logged.
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path

from prepline.errors import ConfigError

#: S3 credentials reach the component pods (and, optionally, the Ray pods) from this Kubernetes secret
#: (the pipelines' ``s3_secret_name`` parameter)
DEFAULT_S3_SECRET = "prepline-s3"

log = logging.getLogger("prepline")

DEFAULT_PATH = "/etc/prepline/s3"
KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "PREPLINE_S3_ENDPOINT")
_INI = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "aws_session_token": "AWS_SESSION_TOKEN", "region": "AWS_DEFAULT_REGION", "endpoint_url": "PREPLINE_S3_ENDPOINT"}


def read(path: str | Path) -> dict[str, str]:
    """The credentials at ``path`` (a folder of key files, a KEY=VALUE file, or an AWS INI file)."""
    p = Path(path)
    if p.is_dir():
        return {k: (p / k).read_text().strip() for k in KEYS if (p / k).is_file() and (p / k).read_text().strip()}
    text = p.read_text()
    if text.lstrip().startswith("["):
        ini = configparser.ConfigParser()
        ini.read_string(text)
        if "default" not in ini:
            raise ConfigError(f"{p}: an AWS credentials file without a [default] profile", "name the profile [default]")
        return {_INI[k]: v.strip() for k, v in ini["default"].items() if k in _INI and v.strip()}
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, eq, v = line.partition("=")
        k = k.strip().removeprefix("export ").strip()
        if not eq or k not in KEYS:
            raise ConfigError(f"{p}:{n}: not a KEY=VALUE line with one of {', '.join(KEYS)}", "write e.g. AWS_ACCESS_KEY_ID=...")
        out[k] = v.strip().strip("'\"")
    return out


def apply(path: str | None = None) -> list[str]:
    """Load the credentials into ``os.environ``; returns the keys set. ``path`` None = the default
    mount, which may be absent (then nothing happens); a given path must exist."""
    where = path or DEFAULT_PATH
    if not Path(where).exists():
        if path:
            raise ConfigError(f"S3 credentials path {path} does not exist",
                              f"mount the credentials volume there (Elyra: Data Volumes, claim prepline-s3-credentials at {DEFAULT_PATH}) "
                              "or pass an existing path")
        return []
    creds = read(where)
    if creds and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(creds):
        raise ConfigError(f"S3 credentials at {where} have {', '.join(sorted(creds))} but not both AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY", "store both keys in the secret / file")
    applied = [k for k, v in creds.items() if not os.environ.get(k)]
    for k in applied:
        os.environ[k] = creds[k]
    log.info("S3 credentials from %s: %s", where, ", ".join(applied) or "none needed (already in the environment)")
    return applied
