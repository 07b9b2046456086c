"""Object-store calls under a retry budget, and what a failed call means.

Every S3 call (listing pages, reads with their bodies, writes, deletes, the output's lease) goes
through :func:`call`: connect and read timeouts bound each attempt, transient faults (timeouts,
dropped or reset connections, bodies cut short, 5xx answers, throttling) are retried with
exponential backoff and jitter, and the whole call never takes longer than the budget plus one
attempt. When the budget is spent the call fails with :class:`~prepline.errors.ServiceUnavailable`
naming the object and the endpoint: a transient error, never taken for bad input and never counted
against ``--max-failed-files``; the run stops, records it, and a rerun resumes. Other failures are
named for what they are (credentials refused, no credentials, a missing bucket).

Faults are recognised by exception class names and S3 error codes, not by importing a client
library, so the same rules hold for boto3, s3fs or pyarrow.fs errors (whose wrapped cause is read).

Settings (environment): ``PREPLINE_S3_MAX_ATTEMPTS`` (10), ``PREPLINE_S3_CONNECT_TIMEOUT`` (5 s),
``PREPLINE_S3_READ_TIMEOUT`` (30 s), ``PREPLINE_S3_RETRY_SECONDS`` (60 s, the budget of one call).
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from prepline.errors import ServiceError, ServiceUnavailable

log = logging.getLogger("prepline")
T = TypeVar("T")

#: S3 (and S3-compatible) error codes of faults that pass: throttling, server-side errors, timeouts
TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestLimitExceeded",
    "TooManyRequests", "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "PriorRequestNotComplete", "BandwidthLimitExceeded", "EC2ThrottledException",
    "500", "502", "503", "504",
})
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: exception classes (by name: botocore, urllib3, requests, aiohttp, the socket layer) of dropped,
#: reset, refused, timed-out or cut-short connections
TRANSIENT_EXCEPTIONS = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError", "ConnectionError",
    "IncompleteReadError", "ResponseStreamingError", "ProtocolError", "ReadTimeout", "ConnectTimeout",
    "ChunkedEncodingError", "HTTPClientError", "IncompleteRead", "ConnectionResetError", "ConnectionAbortedError",
    "ConnectionRefusedError", "BrokenPipeError", "TimeoutError", "timeout", "RemoteDisconnected",
    "ServerDisconnectedError", "ClientPayloadError", "ClientOSError",
})
#: pyarrow.fs and other C++ clients speak in messages only
_TRANSIENT_TEXT = ("NETWORK_CONNECTION", "SLOW_DOWN", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE", "REQUEST_TIMEOUT",
                   "Connection reset", "timed out", "Timeout was reached")
AUTH_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
                        "AuthorizationHeaderMalformed", "AllAccessDisabled", "InvalidClientTokenId", "Forbidden", "403"})
NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10  # waits 0.25, 0.5, 1, 2, 4, 8, 8 ... s: an outage of ~40 s is bridged
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    budget: float = 60.0  # seconds for one call: all its attempts and waits
    backoff: float = 0.25  # first wait; doubles each attempt, with jitter
    backoff_max: float = 8.0

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        from prepline.errors import ConfigError

        env = {"attempts": "PREPLINE_S3_MAX_ATTEMPTS", "connect_timeout": "PREPLINE_S3_CONNECT_TIMEOUT",
               "read_timeout": "PREPLINE_S3_READ_TIMEOUT", "budget": "PREPLINE_S3_RETRY_SECONDS"}
        kw: dict[str, Any] = {}
        for field, var in env.items():
            raw = os.environ.get(var)
            if raw is None:
                continue
            try:
                v = int(raw) if field == "attempts" else float(raw)
            except ValueError:
                v = -1
            if not v > 0 or v != v or v == float("inf"):
                raise ConfigError(f"{var}={raw!r} is not a positive number", f"unset {var} or give it a positive number")
            kw[field] = v
        return cls(**kw)

    @property
    def worst_case(self) -> float:
        """The longest one call can take before it fails: the budget, then one last attempt."""
        return self.budget + self.connect_timeout + self.read_timeout


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def error_code(e: BaseException) -> str:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
    return ""


def _status(e: BaseException) -> int:
    resp = getattr(e, "response", None)
    return int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) if isinstance(resp, dict) else 0


def is_transient(e: BaseException) -> bool:
    """A fault that may pass: worth another attempt, never a judgement on the data."""
    for x in _chain(e):
        if type(x).__name__ in TRANSIENT_EXCEPTIONS or error_code(x) in TRANSIENT_CODES or _status(x) in TRANSIENT_STATUS:
            return True
        if isinstance(x, OSError) and type(x).__name__ == "OSError" and any(t in str(x) for t in _TRANSIENT_TEXT):
            return True
    return False


def short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0][:240] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def classify(e: BaseException, what: str, endpoint: str) -> Exception:
    """A failed call as the error to raise: credentials refused or missing become a
    :class:`ServiceError` naming the endpoint; anything else comes back as it is."""
    for x in _chain(e):
        if type(x).__name__ in NO_CREDENTIALS:
            return ServiceError(f"{what}: no S3 credentials found ({short(x)})",
                                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role)")
        if error_code(x) in AUTH_CODES:
            said = (getattr(x, "response", None) or {}).get("Error", {}).get("Message") or short(x)
            return ServiceError(f"{what}: the object store at {endpoint} refused the request ({error_code(x)}: {said})",
                                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the profile/role) and the "
                                "bucket's permissions for this endpoint (PREPLINE_S3_ENDPOINT)")
    return e  # type: ignore[return-value]


def call(fn: Callable[[], T], what: str, endpoint: str, policy: RetryPolicy | None = None) -> T:
    """``fn()`` with transient faults retried within ``policy``'s budget (see the module doc)."""
    policy = policy or RetryPolicy.from_env()
    t0 = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                err = classify(e, what, endpoint)
                if err is e:
                    raise
                raise err from e
            elapsed = time.monotonic() - t0
            wait = min(policy.backoff_max, policy.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            if attempt >= policy.attempts or elapsed + wait > policy.budget:
                raise ServiceUnavailable(
                    f"{what}: the object store at {endpoint} did not answer ({short(e)}); "
                    f"gave up after {attempt} attempt(s) in {elapsed:.1f}s",
                    "check that the endpoint is up and reachable (PREPLINE_S3_ENDPOINT), then rerun the same command: "
                    "it resumes; PREPLINE_S3_MAX_ATTEMPTS and PREPLINE_S3_RETRY_SECONDS set the retry budget",
                ) from e
            log.warning("%s: %s; retrying in %.1fs (attempt %d of %d)", what, short(e), wait, attempt + 1, policy.attempts)
            time.sleep(wait)
