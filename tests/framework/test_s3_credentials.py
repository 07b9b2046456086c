"""S3 credentials from a mounted folder or file (Elyra custom nodes get no secrets, only volumes)."""

from __future__ import annotations

import pytest

from prepline import s3_credentials
from prepline.errors import ConfigError

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t/+=", "PREPLINE_S3_ENDPOINT": "http://minio:9000"}


@pytest.fixture
def clean_env(monkeypatch):
    for k in s3_credentials.KEYS:
        monkeypatch.delenv(k, raising=False)


def test_a_secret_volume_layout_one_file_per_key(tmp_path, monkeypatch, clean_env):
    for k, v in KEYS.items():
        (tmp_path / k).write_text(v + "\n")
    (tmp_path / "..data").mkdir()  # what the kubelet also puts in a secret volume
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")  # never overwritten
    assert sorted(s3_credentials.apply(str(tmp_path))) == ["AWS_SECRET_ACCESS_KEY", "PREPLINE_S3_ENDPOINT"]
    import os

    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-env" and os.environ["AWS_SECRET_ACCESS_KEY"] == "s3cr3t/+="


def test_key_value_and_aws_ini_files(tmp_path):
    kv = tmp_path / "creds.env"
    kv.write_text("# S3\nexport AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY='sec=ret'\n")
    assert s3_credentials.read(kv) == {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "sec=ret"}
    ini = tmp_path / "credentials"
    ini.write_text("[default]\naws_access_key_id = AKID\naws_secret_access_key = sec\nendpoint_url = http://minio:9000\n")
    assert s3_credentials.read(ini) == {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "sec", "PREPLINE_S3_ENDPOINT": "http://minio:9000"}
    bad = tmp_path / "bad"
    bad.write_text("PASSWORD=x\n")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        s3_credentials.read(bad)


def test_missing_paths_and_half_credentials(tmp_path, clean_env):
    if not __import__("os").path.exists(s3_credentials.DEFAULT_PATH):
        assert s3_credentials.apply(None) == []  # the default mount may be absent: nothing to do
    with pytest.raises(ConfigError, match="does not exist"):
        s3_credentials.apply(str(tmp_path / "nope"))
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("AKID")
    with pytest.raises(ConfigError, match="not both"):
        s3_credentials.apply(str(tmp_path))


@pytest.mark.s3
def test_the_elyra_step_reads_s3_with_mounted_credentials(tmp_path, s3_server, s3_bucket, monkeypatch):
    """Without credentials in its environment (Elyra gives custom nodes none) the step cannot reach S3;
    the entrypoint applies the mounted ones first."""
    import botocore.exceptions

    from prepline.data_access import open_location
    from prepline.elyra import _cli

    creds = tmp_path / "creds"
    creds.mkdir()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PREPLINE_S3_ENDPOINT": s3_server}.items():
        (creds / k).write_text(v)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PREPLINE_S3_ENDPOINT", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises((botocore.exceptions.NoCredentialsError, botocore.exceptions.EndpointConnectionError, Exception)):
        open_location(f"s3://{s3_bucket}/probe").write_bytes("x.txt", b"no")
    # a bad parameter fails after the credentials were applied (and before any cluster or S3 access)
    assert _cli(["run", "doc_id", "--input-path", f"s3://{s3_bucket}/in", "--work-root", f"s3://{s3_bucket}/w", "--run-id", "r",
                 "--s3-credentials", str(creds), "--param", "start_id", "-1"]) == 2
    loc = open_location(f"s3://{s3_bucket}/probe")
    loc.write_bytes("x.txt", b"ok")
    assert loc.read_bytes("x.txt") == b"ok"
