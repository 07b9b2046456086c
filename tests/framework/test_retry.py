"""The S3 retry budget and the classification of faults (prepline.retry)."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from prepline import retry
from prepline.errors import ConfigError, ServiceError, ServiceUnavailable


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} said"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


@pytest.mark.parametrize("e, transient", [
    (_client_error("SlowDown", 503), True),
    (_client_error("InternalError", 500), True),
    (_client_error("Whatever", 502), True),
    (ReadTimeoutError(endpoint_url="http://x"), True),
    (EndpointConnectionError(endpoint_url="http://x"), True),
    (ConnectionResetError(104, "reset"), True),
    (OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7"), True),  # pyarrow.fs
    (_client_error("NoSuchKey", 404), False),
    (_client_error("AccessDenied", 403), False),
    (ValueError("no"), False),
])
def test_transient_faults_are_told_from_the_rest(e, transient):
    assert retry.is_transient(e) is transient


def test_a_transient_fault_is_retried_then_passes():
    calls = []

    def fn():
        calls.append(1)
        if len(calls) < 3:
            raise _client_error("SlowDown", 503)
        return "ok"

    assert retry.call(fn, "s3://b/k", "http://e", retry.RetryPolicy(attempts=5, backoff=0.01)) == "ok" and len(calls) == 3


def test_the_budget_bounds_a_call_and_the_error_names_object_and_endpoint():
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=r"s3://b/k: the object store at http://e did not answer .* gave up after 4") as e:
        retry.call(lambda: (_ for _ in ()).throw(ReadTimeoutError(endpoint_url="http://e")), "s3://b/k", "http://e",
                   retry.RetryPolicy(attempts=4, backoff=0.01, budget=5))
    assert time.monotonic() - t0 < 1 and e.value.transient and "rerun" in e.value.fix


def test_credentials_refused_or_missing_are_service_errors_not_retried():
    calls = []

    def refused():
        calls.append(1)
        raise _client_error("InvalidAccessKeyId", 403)

    with pytest.raises(ServiceError, match="refused the request \\(InvalidAccessKeyId: InvalidAccessKeyId said\\)"):
        retry.call(refused, "s3://b/k", "http://e")
    assert len(calls) == 1
    with pytest.raises(ServiceError, match="no S3 credentials"):
        retry.call(lambda: (_ for _ in ()).throw(NoCredentialsError()), "s3://b/k", "http://e")


def test_other_errors_pass_through_unchanged():
    with pytest.raises(ClientError, match="NoSuchKey"):
        retry.call(lambda: (_ for _ in ()).throw(_client_error("NoSuchKey", 404)), "s3://b/k", "http://e")


def test_policy_from_the_environment(monkeypatch):
    monkeypatch.setenv("PREPLINE_S3_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("PREPLINE_S3_READ_TIMEOUT", "7.5")
    p = retry.RetryPolicy.from_env()
    assert (p.attempts, p.read_timeout) == (3, 7.5) and p.worst_case == p.budget + p.connect_timeout + 7.5
    monkeypatch.setenv("PREPLINE_S3_RETRY_SECONDS", "nan")
    with pytest.raises(ConfigError, match="PREPLINE_S3_RETRY_SECONDS"):
        retry.RetryPolicy.from_env()
