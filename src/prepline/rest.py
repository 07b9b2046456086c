"""HTTP plumbing for prepline's REST clients: one retry policy (urllib3's ``Retry``) and one reading
of an error answer.

``urllib3`` is always installed (botocore and kfp depend on it; kfp pins it exactly).
"""

from __future__ import annotations

import json

import urllib3

__all__ = ["TRANSIENT_STATUS", "retry_policy", "server_message"]

#: answers worth another try: too many requests, a gateway or a server that is not ready (yet)
TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def retry_policy(attempts: int = 5, backoff: float = 0.5, backoff_max: float = 8.0, idempotent: bool = True) -> urllib3.Retry:
    """Up to ``attempts`` more tries with exponential backoff (``backoff`` × 2^n, at most
    ``backoff_max`` seconds; a ``Retry-After`` header is honoured).

    A connection that could not be made is retried for every method (the request never reached the
    server). A lost answer (read error) and a transient status (429, 502, 503, 504) are retried
    only for idempotent methods, and only when ``idempotent``: a POST that may have taken effect is
    never sent twice. After the last try the last answer is returned (not raised), so the caller's
    own error handling sees its status and body. Redirects are not followed.
    """
    answered = attempts if idempotent else 0  # (an empty allowed_methods would mean every method to urllib3)
    return urllib3.Retry(
        total=attempts, connect=attempts, read=answered, status=answered, other=0, redirect=0,
        status_forcelist=TRANSIENT_STATUS, allowed_methods=_IDEMPOTENT, backoff_factor=backoff, backoff_max=backoff_max,
        respect_retry_after_header=True, raise_on_status=False, raise_on_redirect=False,
    )


def server_message(body: bytes | str | None, status: int | None = None, limit: int = 2000) -> str:
    """The useful part of an error answer: the ``message`` (or ``error``, ``error_message``) of a
    JSON body (a Kubernetes Status, a gRPC-gateway error, the KFP API's), the last line of a Python
    traceback (Ray's dashboard), a note for an HTML page (a login page or a proxy), else the text;
    at most ``limit`` characters. An empty body gives ``HTTP <status>`` (or '' without a status)."""
    text = (body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")).strip()
    if not text:
        return f"HTTP {status}" if status else ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        text = str(data.get("message") or data.get("error") or data.get("error_message") or text)
    elif "Traceback (most recent call last)" in text:
        text = [ln for ln in text.splitlines() if ln.strip()][-1].strip()
    elif text.startswith("<"):
        return "an HTML page (a login page or a proxy?)"
    return text[:limit]
