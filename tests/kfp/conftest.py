"""Fixtures of the KFP client tests: no KFP settings from the machine, and the local fake server."""

import pytest

from fake_kfp_server import FakeKfp
from prepline import kfp_client as K


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No KFP settings from the machine: env, ~/.config/kfp/context.json, the SA token path."""
    import kfp

    for k in (K.ENV_ENDPOINT, K.ENV_TOKEN, K.ENV_TOKEN_FILE, K.ENV_UI_ENDPOINT, "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setattr(K, "SA_TOKEN_PATH", str(tmp_path / "no-sa-token"))


@pytest.fixture
def fake():
    with FakeKfp() as f:
        yield f
