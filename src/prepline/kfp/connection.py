"""Where the Kubeflow Pipelines API is and who we are to it: host, namespace and bearer token, found
the usual KFP ways (flags, ``KF_PIPELINES_ENDPOINT``, ``KF_PIPELINES_TOKEN``, a token file, the
in-cluster service-account token)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prepline.errors import ConfigError

ENV_ENDPOINT = "KF_PIPELINES_ENDPOINT"
ENV_UI_ENDPOINT = "KF_PIPELINES_UI_ENDPOINT"
ENV_TOKEN = "KF_PIPELINES_TOKEN"
#: kfp's own variable naming the (projected) service-account token file
ENV_TOKEN_FILE = "KF_PIPELINES_SA_TOKEN_PATH"
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
IN_CLUSTER_HOST = "http://ml-pipeline.kubeflow.svc.cluster.local:8888"


@dataclass(frozen=True)
class Connection:
    host: str
    namespace: str = ""
    token: str | None = None
    token_file: str | None = None
    token_source: str = "none"
    request_timeout: float = 60.0
    connect_timeout: float = 10.0

    @property
    def ui(self) -> str:
        return (os.environ.get(ENV_UI_ENDPOINT) or self.host).rstrip("/")


def _normalize_host(host: str) -> str:
    host = host.strip().rstrip("/")
    if "://" not in host:
        local = any(h in host for h in ("localhost", "127.0.0.1", "[::1]", ".svc", ":8888"))
        host = ("http://" if local else "https://") + host
    if not host.startswith(("http://", "https://")):
        raise ConfigError(f"KFP host {host!r} is not an http(s) URL", "e.g. --host http://localhost:8888 or https://kubeflow.example.com/pipeline")
    return host


def resolve_connection(host: str | None = None, namespace: str | None = None, token: str | None = None,
                       token_file: str | None = None, env: dict | None = None, request_timeout: float = 60.0) -> Connection:
    """Host: ``host`` > ``$KF_PIPELINES_ENDPOINT`` > the in-cluster service when running in a pod.
    Token: ``token`` > ``$KF_PIPELINES_TOKEN`` > ``token_file`` > ``$KF_PIPELINES_SA_TOKEN_PATH`` >
    the in-cluster service-account token file when present > none. Token files are read on every
    request (projected tokens rotate)."""
    env = os.environ if env is None else env
    h = host or env.get(ENV_ENDPOINT)
    if not h:
        if env.get("KUBERNETES_SERVICE_HOST"):
            h = IN_CLUSTER_HOST
        else:
            raise ConfigError(
                "no Kubeflow Pipelines host given",
                f"pass --host (e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888` then --host http://localhost:8888) or set {ENV_ENDPOINT}",
            )
    conn: dict[str, Any] = {"host": _normalize_host(h), "namespace": namespace or "", "request_timeout": request_timeout}
    if token:
        conn.update(token=token.strip(), token_source="--token")
    elif env.get(ENV_TOKEN):
        conn.update(token=env[ENV_TOKEN].strip(), token_source=f"${ENV_TOKEN}")
    else:
        path, source, required = None, "none", False
        if token_file:
            path, source, required = token_file, f"--token-file {token_file}", True
        elif env.get(ENV_TOKEN_FILE):
            path, source, required = env[ENV_TOKEN_FILE], f"${ENV_TOKEN_FILE}={env[ENV_TOKEN_FILE]}", True
        elif Path(SA_TOKEN_PATH).is_file():
            path, source = SA_TOKEN_PATH, f"service-account token {SA_TOKEN_PATH}"
        if path:
            try:
                if not Path(path).read_text().strip():
                    raise ConfigError(f"token file {path} is empty", "point --token-file at a file holding the bearer token")
            except OSError as e:
                if required:
                    raise ConfigError(f"cannot read token file {path}: {e.strerror or e}", "check the path, or pass --token / $KF_PIPELINES_TOKEN") from None
                path, source = None, "none"
            conn.update(token_file=path, token_source=source)
    return Connection(**conn)

