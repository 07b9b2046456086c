"""Remote folders (``s3://``, ``gs://``, ``az://``, ``hf://``) through fsspec.

Why fsspec (s3fs, gcsfs, adlfs, huggingface_hub) and not ``pyarrow.fs``, measured in
docs/storage.md: pyarrow's S3 output stream cannot be aborted (a writer that fails half-way still
completes its multipart upload, apache/arrow#40502), its read timeout is ignored on Linux, and its
errors are strings; s3fs aborts a discarded upload, takes botocore's timeouts and retry modes, and
keeps the botocore error (code, HTTP status) as the cause of what it raises.

S3 settings come from the environment, read when a location is opened (:class:`S3Settings`).
Listing uses ``ListObjectsV2`` pages and takes sizes from them. Reads are range GETs of what is
read; writes stream into a multipart upload (parts of ``PREPLINE_S3_PART_MB``), completed when
the writer finishes and aborted when it fails, so an object is whole or absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import IO, Iterator

from prepline.errors import ConfigError, InputError
from prepline.location import FileInfo, Location, StorageDenied, StorageError, TransientStorageError

log = logging.getLogger("prepline")

#: scheme -> (fsspec protocol, pip package that provides it)
SCHEMES = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("abfs", "adlfs"),
    "abfs": ("abfs", "adlfs"),
    "abfss": ("abfs", "adlfs"),
    "hf": ("hf", "huggingface_hub"),
}
#: pip extra of prepline that installs each package (s3fs is a core dependency)
_EXTRA = {"gcsfs": "gcs", "adlfs": "azure", "huggingface_hub": "tokenize"}

# S3 error codes a retry may cure (botocore's standard retry mode retries the same ones first)
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete", "InternalError",
    "ServiceUnavailable", "BandwidthLimitExceeded", "EC2ThrottledException", "IDPCommunicationError",
}


@dataclass(frozen=True)
class S3Settings:
    """How prepline talks to S3, from the environment (documented in docs/storage.md)."""

    endpoint: str | None  # PREPLINE_S3_ENDPOINT, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL
    connect_timeout: float  # PREPLINE_S3_CONNECT_TIMEOUT (s)
    read_timeout: float  # PREPLINE_S3_READ_TIMEOUT (s)
    max_attempts: int  # PREPLINE_S3_MAX_ATTEMPTS: at most this many requests per call (a cap; the budget below rules)
    call_retries: int  # PREPLINE_S3_CALL_RETRIES: tries of a whole call (a body cut short, SlowDown)
    part_mb: int  # PREPLINE_S3_PART_MB: multipart upload part size (and write buffer)
    #: PREPLINE_S3_RETRY_SECONDS: a request is retried (jittered exponential backoff, at most 20 s
    #: apart) while less than this many seconds passed since it was first sent: a time, not a count,
    #: so a brownout of up to RETRY_SECONDS - 20 s is ridden out however the jitter falls
    retry_seconds: float = 60.0

    @classmethod
    def from_env(cls) -> "S3Settings":
        env = os.environ
        endpoint = env.get("PREPLINE_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        s = cls(
            endpoint=endpoint,
            connect_timeout=_num("PREPLINE_S3_CONNECT_TIMEOUT", 10.0, float),
            read_timeout=_num("PREPLINE_S3_READ_TIMEOUT", 30.0, float),
            max_attempts=_num("PREPLINE_S3_MAX_ATTEMPTS", 40, int),
            call_retries=_num("PREPLINE_S3_CALL_RETRIES", 2, int),
            part_mb=_num("PREPLINE_S3_PART_MB", 16, int),
            retry_seconds=_num("PREPLINE_S3_RETRY_SECONDS", 60.0, float),
        )
        if s.max_attempts < 1 or s.call_retries < 1 or s.connect_timeout <= 0 or s.read_timeout <= 0 or not s.retry_seconds >= 0:
            raise ConfigError("PREPLINE_S3_MAX_ATTEMPTS and _CALL_RETRIES must be >= 1, timeouts > 0, PREPLINE_S3_RETRY_SECONDS >= 0",
                              "fix the environment variable")
        if not 5 <= s.part_mb <= 5120:
            raise ConfigError(f"PREPLINE_S3_PART_MB={s.part_mb}: S3 parts are 5 MiB to 5 GiB", "set it between 5 and 5120")
        if endpoint and not re.match(r"^https?://[^/\s]+", endpoint, re.IGNORECASE):
            var = next(k for k in ("PREPLINE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(k) == endpoint)
            raise ConfigError(f"{var}={endpoint!r} is not a URL (no http:// or https://)",
                              f"set {var}=http://{endpoint.split('://')[-1]} (or https://...)")
        _check_profile(env.get("AWS_PROFILE") or "", env.get("AWS_CONFIG_FILE") or "", env.get("AWS_SHARED_CREDENTIALS_FILE") or "")
        return s

    def botocore_config(self) -> dict:
        cfg: dict = {
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            # botocore's own retries off: RetryBudget (registered on every client) retries instead
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        }
        if self.endpoint:  # MinIO, Ceph, moto: path-style addressing
            cfg["s3"] = {"addressing_style": "path"}
        return cfg


#: a request that has been failing this long is named in a warning (once), before its budget runs out
WARN_AFTER = 30.0


class RetryBudget:
    """botocore's ``needs-retry`` handler for prepline's S3 clients (sync and async).

    It retries what botocore's standard mode retries (its own checks: timeouts, connection errors,
    5xx, 429 and throttling codes, with its jittered exponential backoff, at most 20 s apart), but
    for as long as the request's time budget lasts (``PREPLINE_S3_RETRY_SECONDS``, from when it was
    first sent) rather than for a fixed count, and without botocore's retry quota (which a brownout
    drains). A request failing for ``WARN_AFTER`` seconds is named in a warning, once.
    """

    def __init__(self, settings: "S3Settings"):
        from botocore.retries import standard

        self.settings = settings
        self._adapter = standard.RetryEventAdapter()
        self._checker = standard.StandardRetryConditions(max_attempts=settings.max_attempts)
        self._backoff = standard.ExponentialBackoff()

    def register(self, events) -> None:
        events.register("before-call.s3", self.before_call)
        events.register("needs-retry.s3", self.needs_retry)

    def before_call(self, context=None, **kwargs) -> None:
        if context is not None:
            context["prepline_t0"] = time.monotonic()

    def needs_retry(self, **kwargs):
        ctx = self._adapter.create_retry_context(**kwargs)
        if not self._checker.is_retryable(ctx):
            return None
        rc = kwargs["request_dict"]["context"]
        now = time.monotonic()
        elapsed = now - rc.setdefault("prepline_t0", now)
        delay = self._backoff.delay_amount(ctx)
        budget = self.settings.retry_seconds
        if elapsed >= WARN_AFTER and not rc.get("prepline_warned"):
            rc["prepline_warned"] = True
            op = getattr(kwargs.get("operation"), "name", "a request")
            log.warning("the object store at %s has not answered %s for %.0fs (%s); retrying for up to %.0fs "
                        "(PREPLINE_S3_RETRY_SECONDS)", self.settings.endpoint or "AWS S3", op, elapsed, _why(ctx), budget)
        if elapsed + delay >= budget:
            return None
        return delay


def _why(ctx) -> str:
    if ctx.caught_exception is not None:
        return type(ctx.caught_exception).__name__
    code = (ctx.parsed_response or {}).get("Error", {}).get("Code")
    status = getattr(ctx.http_response, "status_code", None)
    return f"{status} {code}".strip() if code or status else "no answer"


@functools.lru_cache(maxsize=16)
def _check_profile(profile: str, config_file: str, credentials_file: str) -> None:
    """AWS_PROFILE must name a profile of the AWS config or credentials file (botocore would raise
    ProfileNotFound at the first request)."""
    if not profile:
        return
    import botocore.session

    try:
        known = botocore.session.Session().available_profiles
    except Exception:  # noqa: BLE001 - an unreadable config file: botocore says so at the request
        return
    if profile not in known:
        raise ConfigError(f"AWS_PROFILE={profile!r} is not a profile of the AWS config or credentials files"
                          f" (profiles: {', '.join(sorted(known)) or 'none'})",
                          "set AWS_PROFILE to one of them, or unset it and pass AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")


#: S3 bucket names (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html): 3-63 characters,
#: lowercase letters, digits, dots and hyphens, a letter or digit at each end, no '..', not an IP address
_BUCKET_AWS = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
#: what botocore accepts at all (older, looser names that S3-compatible stores may still serve)
_BUCKET_ANY = re.compile(r"^[A-Za-z0-9._-]{1,255}$")


def check_bucket(bucket: str, uri: str, endpoint: str | None) -> None:
    """A ConfigError for a bucket name S3 cannot have: AWS's rules when no endpoint is set, else the
    looser names botocore sends (other stores answer for themselves)."""
    fix = "bucket names are 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"
    if not _BUCKET_ANY.match(bucket):
        raise ConfigError(f"'{uri}': {bucket!r} is not a valid S3 bucket name", fix)
    if endpoint is None and (not _BUCKET_AWS.match(bucket) or ".." in bucket or re.match(r"^\d+\.\d+\.\d+\.\d+$", bucket)):
        raise ConfigError(f"'{uri}': {bucket!r} is not a valid S3 bucket name", fix)


def _num(name: str, default, kind):
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number", f"set {name} to a number (default {default})") from None


def s3_filesystem(settings: S3Settings | None = None):
    """A fresh s3fs filesystem with prepline's settings (never fsspec's shared instance)."""
    import s3fs

    from aiobotocore.session import AioSession

    s = settings or S3Settings.from_env()
    session = AioSession()
    RetryBudget(s).register(session)  # copied into the client s3fs creates from the session
    fs = s3fs.S3FileSystem(
        session=session,
        endpoint_url=s.endpoint,
        config_kwargs=s.botocore_config(),
        default_block_size=s.part_mb * 2**20,
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    fs.retries = s.call_retries  # s3fs's own loop around each call (a class attribute, not an argument)
    return fs


def s3_client():
    """A boto3 client with the same endpoint, timeouts and retries (for tools and tests)."""
    import boto3
    from botocore.config import Config

    s = S3Settings.from_env()
    client = boto3.client("s3", endpoint_url=s.endpoint, config=Config(**s.botocore_config()))
    RetryBudget(s).register(client.meta.events)
    return client


def filesystem(scheme: str, uri: str):
    """The fsspec filesystem for ``scheme``; a clear error when its package is not installed."""
    if scheme not in SCHEMES:
        known = ", ".join(f"{k}://" for k in SCHEMES)
        raise ConfigError(f"'{uri}': the scheme '{scheme}://' is not supported", f"use a local path or one of {known}")
    protocol, package = SCHEMES[scheme]
    try:
        __import__(package)
    except ImportError:
        extra = _EXTRA.get(package)
        how = f"pip install 'prepline[{extra}]' (or pip install {package})" if extra else f"pip install {package}"
        raise ConfigError(f"'{uri}' needs the Python package {package}, which is not installed", how) from None
    if protocol == "s3":
        return s3_filesystem()
    import fsspec

    return fsspec.filesystem(protocol, skip_instance_cache=True, use_listings_cache=False)


# -- errors ---------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _transient_types() -> tuple[type, ...]:
    types: list[type] = [TimeoutError, socket.timeout, ConnectionResetError, ConnectionAbortedError, BrokenPipeError, asyncio.TimeoutError]
    with contextlib.suppress(ImportError):
        from botocore import exceptions as be

        types += [be.ConnectionError, be.HTTPClientError, be.IncompleteReadError, be.ResponseStreamingError]
    with contextlib.suppress(ImportError):
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError]
    with contextlib.suppress(ImportError):
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    return tuple(types)


def _error_code(e: BaseException) -> tuple[str | None, int | None]:
    resp = getattr(e, "response", None)
    if not isinstance(resp, dict):
        return None, None
    return resp.get("Error", {}).get("Code"), resp.get("ResponseMetadata", {}).get("HTTPStatusCode")


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) is one a retry may cure."""
    return transient_cause(exc) is not None


def transient_cause(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that a retry may cure (see :func:`is_transient`)."""
    types = _transient_types()
    for e in _chain(exc):
        if isinstance(e, TransientStorageError):
            return e.cause or e
        if isinstance(e, types):
            return e
        code, status = _error_code(e)
        if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
            return e
    return None


def _not_found_bucket(exc: BaseException) -> bool:
    return any(_error_code(e)[0] == "NoSuchBucket" or "bucket does not exist" in str(e) for e in _chain(exc))


def _denied(exc: BaseException) -> bool:
    return any(isinstance(e, PermissionError) or _error_code(e)[0] in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") for e in _chain(exc))


def _no_credentials(exc: BaseException) -> bool:
    return any(type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError") for e in _chain(exc))


def translate(exc: BaseException, what: str, loc: "RemoteLocation") -> BaseException:
    """A storage library's exception as prepline's: transient, missing bucket, denied, missing file."""
    if isinstance(exc, (TransientStorageError, StorageDenied, InputError, ConfigError)):
        return exc
    if loc.scheme == "hf" and (hub := _hub_error(exc, what, loc)) is not None:
        return hub
    user = _user_mistake(exc, loc)
    if user is not None:
        return user
    cause = transient_cause(exc)
    if cause is not None:
        return TransientStorageError(
            f"{what}: {_endpoint(loc)} did not answer in time or failed on its side ({type(cause).__name__}: {_first_line(cause)})",
            "check that the store is up and reachable, then rerun the same command: it resumes; retries and timeouts: "
            "PREPLINE_S3_RETRY_SECONDS, PREPLINE_S3_CALL_RETRIES, PREPLINE_S3_CONNECT_TIMEOUT, PREPLINE_S3_READ_TIMEOUT (docs/storage.md)",
            cause=cause,
        )
    if _not_found_bucket(exc):
        return StorageError(f"{what}: bucket '{loc.bucket}' does not exist ({loc.uri})", "create it or fix the URI")
    if _no_credentials(exc):
        return StorageDenied(f"{what}: no S3 credentials found ({_first_line(exc)})", _credentials_fix())
    if _denied(exc):
        return StorageDenied(f"{what}: access denied by {_endpoint(loc)} ({_first_line(exc)})",
                             "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile or role) and the bucket policy")
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(what)
    return exc


def _credentials_fix() -> str:
    """Where the credentials should come from, here: on a KubeRay pod (KubeRay sets RAY_CLUSTER_NAMESPACE
    in every Ray container: ray-operator/controllers/ray/common/pod.go) they come from the S3 secret
    of the cluster's own namespace, which the pipeline mounts as optional: a missing one gives none."""
    ns = os.environ.get("RAY_CLUSTER_NAMESPACE")
    if ns:
        from prepline.s3_credentials import DEFAULT_S3_SECRET

        return (f"the Ray pods of cluster {os.environ.get('RAY_CLUSTER_NAME', '?')} got none: they take every key of the secret "
                f"that the pipeline's s3_secret_name names (default {DEFAULT_S3_SECRET}; optional, so a missing secret means no "
                f"credentials) from their own namespace '{ns}': create it there (kubectl -n {ns} create secret generic "
                f"{DEFAULT_S3_SECRET} --from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...), or give "
                "cluster_json env_from_secrets, or a workload identity")
    return "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role)"


def _user_mistake(exc: BaseException, loc: "RemoteLocation") -> ConfigError | None:
    """What the user typed or set, refused by botocore or the store: a usage error, not a bug."""
    for e in _chain(exc):
        name = type(e).__name__
        if name == "ProfileNotFound":
            return ConfigError(f"{_first_line(e)} (AWS_PROFILE)", "set AWS_PROFILE to a profile of ~/.aws/config, or unset it")
        if name == "ParamValidationError" or _error_code(e)[0] in ("InvalidBucketName", "InvalidURI"):
            return ConfigError(f"{loc.uri}: {' '.join(str(e).split())[:300]}",
                               "bucket names are 3-63 lowercase letters, digits, dots and hyphens; check the URI")
    return None


#: the Hugging Face Hub's exceptions (huggingface_hub, httpx, requests) by class name, and what they mean
_HUB_OFFLINE = {"OfflineModeIsEnabled", "LocalEntryNotFoundError"}
_HUB_UNREACHABLE = {"ConnectError", "ConnectTimeout", "NameResolutionError", "ProxyError", "NewConnectionError"}
_HUB_MISSING = {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"}


def _hub_error(exc: BaseException, what: str, loc: "RemoteLocation") -> StorageError | None:
    """An ``hf://`` error the user can act on (offline mode, no network, a missing or gated
    repository) as an input error with its fix (exit 6), not an unexpected one."""
    import os

    chain = list(_chain(exc))
    names = {type(e).__name__ for e in chain}
    hub = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    local = ("or download the dataset once (hf download --repo-type dataset <owner>/<name> --local-dir <folder>) "
             "and pass that folder as the input")
    if names & _HUB_OFFLINE:
        return StorageError(f"{what}: HF_HUB_OFFLINE is set, so {loc.uri} cannot be read from the Hugging Face Hub",
                            f"unset HF_HUB_OFFLINE (and check the network) to read from {hub}, {local}")
    unreachable = next((e for e in chain if type(e).__name__ in _HUB_UNREACHABLE
                        or (type(e).__name__ == "ConnectionError" and type(e).__module__.startswith("requests"))), None)
    if unreachable is not None:
        return StorageError(f"{what}: cannot reach the Hugging Face Hub at {hub} ({type(unreachable).__name__}: {_first_line(unreachable)})",
                            f"check the network (a proxy: HTTPS_PROXY; another Hub: HF_ENDPOINT), {local}")
    if names & _HUB_MISSING:
        return StorageError(f"{what}: {loc.uri}: no such dataset or revision on {hub}, or it is private or gated",
                            "check the name (hf://datasets/<owner>/<name>/<folder>); for a private or gated dataset set HF_TOKEN")
    return None


def _endpoint(loc: "RemoteLocation") -> str:
    if loc.scheme in ("s3", "s3a"):
        return f"the object store at {S3Settings.from_env().endpoint or 'AWS S3'}"
    return f"the {loc.scheme}:// store"


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:300]


@contextlib.contextmanager
def _translated(what: str, loc: "RemoteLocation") -> Iterator[None]:
    try:
        yield
    except Exception as e:
        new = translate(e, what, loc)
        if new is e:
            raise
        raise new from e


# -- locations ------------------------------------------------------------------------------------


#: listing fields that identify an object's version, in order of preference: S3 (s3fs: ``ETag``, the same in a listing and a HEAD;
#: ``VersionId``), GCS (gcsfs: ``generation``, ``md5Hash``), Azure (adlfs: ``etag``), the Hub (``blob_id``),
#: and a modification time where nothing better is listed
_TAG_FIELDS = ("ETag", "etag", "VersionId", "generation", "md5Hash", "blob_id", "LastModified", "last_modified", "mtime")


def remote_tag(info: dict) -> str:
    """What identifies an object's version in an fsspec listing entry ('' when nothing does)."""
    for k in _TAG_FIELDS:
        v = info.get(k)
        if v not in (None, ""):
            return f"{k}={str(v).strip(chr(34))}"
    return ""


class RemoteLocation(Location):
    """A prefix on an object store (or the Hugging Face Hub), through one fsspec filesystem."""

    def at(self, uri: str) -> "RemoteLocation":
        return RemoteLocation(uri, self.scheme)

    def __init__(self, uri: str, scheme: str):
        rest = uri[len(scheme) + 3 :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise InputError(f"'{uri}' names no bucket", f"use {scheme}://<bucket>/<prefix>")
        self.scheme, self.bucket, self.prefix = scheme, bucket, prefix.strip("/")
        self.uri = f"{scheme}://{bucket}/{self.prefix}" if self.prefix else f"{scheme}://{bucket}"
        self._fs = None
        self.fs  # fail now when the scheme's package is missing

    @property
    def fs(self):
        if self._fs is None:
            self._fs = filesystem(self.scheme, self.uri)
        return self._fs

    def __getstate__(self):  # filesystems hold sockets and an event loop: workers make their own
        d = dict(self.__dict__)
        d["_fs"] = None
        return d

    def key(self, rel: str = "") -> str:
        return "/".join(p for p in (self.prefix, rel.strip("/")) if p)

    def _p(self, rel: str = "") -> str:  # the filesystem's own path: bucket/key
        return "/".join(p for p in (self.bucket, self.key(rel)) if p)

    def path(self, rel: str = "") -> str:
        return f"{self.scheme}://{self._p(rel)}"

    def list_all(self, rel_prefix: str = "") -> list[FileInfo]:
        base = self._p()
        with _translated(f"listing {self.path(rel_prefix)}", self):
            try:
                found = self.fs.find(self._p(rel_prefix), detail=True)
            except FileNotFoundError as e:
                if _not_found_bucket(e):
                    raise
                return []
        out = [
            FileInfo(name[len(base) + 1 :], int(info.get("size") or 0), remote_tag(info))
            for name, info in found.items()
            if info.get("type") != "directory" and name.startswith(base + "/") and not name.endswith("/")
        ]
        return sorted(out, key=lambda f: f.rel)

    def exists(self) -> bool:
        return bool(self.list_all())

    def file_size(self, rel: str = "") -> int | None:
        with _translated(f"looking up {self.path(rel)}", self):
            try:
                info = self.fs.info(self._p(rel))
            except FileNotFoundError as e:
                if _not_found_bucket(e):
                    raise
                return None
        return int(info["size"]) if info.get("type") == "file" else None

    def file_info(self, rel: str = "") -> FileInfo | None:
        with _translated(f"looking up {self.path(rel)}", self):
            try:
                info = self.fs.info(self._p(rel))
            except FileNotFoundError as e:
                if _not_found_bucket(e):
                    raise
                return None
        if info.get("type") != "file":
            return None
        return FileInfo(rel or self.prefix.rpartition("/")[2], int(info["size"]), remote_tag(info))

    def parent_and_name(self) -> tuple[Location, str]:
        head, _, name = self.prefix.rpartition("/")
        return self.at(f"{self.scheme}://{self.bucket}/{head}".rstrip("/")), name

    def read_bytes(self, rel: str) -> bytes:
        with _translated(f"reading {self.path(rel)}", self):
            return self.fs.cat_file(self._p(rel), max_concurrency=1)  # one GET (no HEAD first)

    def write_bytes(self, rel: str, data: bytes) -> None:
        with _translated(f"writing {self.path(rel)}", self):
            self.check_fence()
            self.fs.pipe_file(self._p(rel), bytes(data))

    def delete(self, rel_prefix: str = "") -> None:
        with _translated(f"deleting {self.path(rel_prefix)}", self):
            self.check_fence()
        keys = [self._p(f.rel) for f in self.list_all(rel_prefix)]
        if rel_prefix.strip("/") and self.file_size(rel_prefix) is not None:
            keys.insert(0, self._p(rel_prefix))  # a single object at exactly that name
        with _translated(f"deleting {self.path(rel_prefix)}", self):
            for i in range(0, len(keys), 1000):
                self._delete_batch(keys[i : i + 1000])

    def _delete_batch(self, paths: list[str]) -> None:
        self.fs.rm(paths)

    def open_input(self, rel: str, size: int | None = None):
        with _translated(f"opening {self.path(rel)}", self):
            f = self.fs.open(self._p(rel), "rb", block_size=1 << 20, cache_type="readahead", **({"size": size} if size is not None else {}))
        if size is not None and hasattr(type(f), "details"):
            f.details = {"name": self._p(rel), "size": size, "type": "file"}  # from the listing: no HEAD request
        return _TranslatingReader(f, self, rel)

    @contextlib.contextmanager
    def open_output(self, rel: str) -> Iterator[IO[bytes]]:
        what = f"writing {self.path(rel)}"
        with _translated(what, self):
            f = self.fs.open(self._p(rel), "wb")
        try:
            yield f
            with _translated(what, self):
                self.check_fence()  # before the upload is completed: a run that lost its output discards it
        except BaseException:
            with contextlib.suppress(Exception):
                f.discard()  # S3: aborts the multipart upload; nothing becomes visible
            f.closed = True  # (so that the file's finaliser does not try to complete it)
            raise
        with _translated(what, self):
            f.close()


def read_range(loc: "RemoteLocation", rel: str, lo: int, hi: int, tag: str = "") -> bytes:
    """Bytes ``[lo, hi)`` of an object, one ranged GET. On S3, with ``tag`` its ETag (``ETag=...``, as
    :func:`remote_tag` gives it), the GET carries ``If-Match``: an object replaced since the tag was
    read answers 412 and fails with an InputError instead of returning bytes of another version."""
    what = f"reading {loc.path(rel)}"
    if loc.scheme in ("s3", "s3a") and tag.startswith("ETag="):
        import fsspec.asyn

        etag = tag[len("ETag="):]

        async def get() -> bytes:
            resp = await loc.fs._call_s3("get_object", Bucket=loc.bucket, Key=loc.key(rel), Range=f"bytes={lo}-{hi - 1}",
                                         IfMatch=f'"{etag}"')
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()

        try:
            with _translated(what, loc):
                return fsspec.asyn.sync(loc.fs.loop, get)
        except Exception as e:  # noqa: BLE001 - the precondition is ours to explain; the rest is translated
            text = f"{e} {getattr(e, '__cause__', '')}"
            if "PreconditionFailed" in text or "412" in text:
                raise InputError(f"{loc.path(rel)} changed while it was read (its ETag is no longer {etag})",
                                 "rerun the job: it reads the new version from the start") from None
            raise
    with _translated(what, loc):
        return loc.fs.cat_file(loc._p(rel), start=lo, end=hi)


class _TranslatingReader:
    """A read-only file that turns the store's errors into prepline's (transient or not)."""

    def __init__(self, f, loc: RemoteLocation, rel: str):
        self._f, self._loc, self._rel = f, loc, rel
        self.closed = False

    def __getattr__(self, name):
        return getattr(self._f, name)

    def _call(self, fn, *a):
        with _translated(f"reading {self._loc.path(self._rel)}", self._loc):
            return fn(*a)

    def read(self, n: int = -1) -> bytes:
        return self._call(self._f.read, n)

    def readinto(self, b) -> int:
        return self._call(self._f.readinto, b)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._call(self._f.seek, offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class S3Location(RemoteLocation):
    """``s3://bucket/prefix``: endpoint, credentials, timeouts and retries from the environment."""

    def __init__(self, uri: str):
        rest = uri.split("://", 1)[1]
        bucket = rest.partition("/")[0]
        if bucket:
            check_bucket(bucket, uri, S3Settings.from_env().endpoint)
        super().__init__("s3://" + rest, "s3")

    def at(self, uri: str) -> "S3Location":
        return S3Location(uri)

    @property
    def client(self):
        """The (aiobotocore) S3 client under the filesystem, e.g. to observe its requests."""
        return self.fs.s3

    def exists(self) -> bool:
        key = self.key()
        with _translated(f"listing {self.uri}", self):
            resp = self.fs.call_s3("list_objects_v2", Bucket=self.bucket, Prefix=key + "/" if key else "", MaxKeys=1)
        return bool(resp.get("Contents"))

    def _delete_batch(self, paths: list[str]) -> None:
        keys = [p[len(self.bucket) + 1 :] for p in paths]
        resp = self.fs.call_s3("delete_objects", Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        errors = resp.get("Errors") or []
        if errors:
            e = errors[0]
            raise OSError(f"could not delete {len(errors)} object(s) from {self.uri}; first: {e.get('Key')}: {e.get('Code')} {e.get('Message')}")
