"""One writer per output: a lock held for the whole run, taken before anything is read or written there.

The lock is ``<output>/_prepline/lock``. A second run on the same output refuses at once, whatever
the timing (it never waits and never writes). A run that was killed leaves no live lock behind:

- **local folders**: an ``flock`` on the lock file; the kernel releases it when the process dies,
  however it dies. After taking it, the run checks that the file it locked is still the one at
  that path (a run that just finished deletes it), else it tries again.
- **S3**: a lease object created with ``If-None-Match: *`` (S3 conditional writes: only one
  create succeeds) and renewed with ``If-Match: <etag>`` every ``ttl / 4`` seconds. A lease not
  renewed for ``ttl`` seconds (by the server's clock), or one whose owner process is gone on this
  very host, is stale: it is taken over with ``If-Match`` on its ETag, so two runs cannot both
  take it over. A run whose renewal is refused has lost the lease and stops before writing more.

**Fencing.** A run paused longer than its lease (SIGSTOP, a frozen VM, a long GC), or whose local
lock file was replaced (a network file system whose lock lease expired), may wake up after another
run took the output over. So every write of a run, in the driver and in every worker, checks first
that the lock is still its own (:class:`Fence`, the ``fence`` of each output
:class:`~prepline.location.Location`): the lock holds the run's token (``owner``, new at every
acquisition), and right before a file is committed (local: renamed into place; S3: its upload
completed), a completion marker or ``metadata.json`` written, or anything deleted, the lock is read
again (local: the lock file at its path; S3: a GET of the lease object) and compared. A run that
lost it fails with :class:`~prepline.errors.OutputLocked` and writes nothing more; its upload is
aborted, its temp file removed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from prepline.errors import ConfigError, OutputError, OutputLocked

log = logging.getLogger("prepline")

#: the lock's name under the output (inside the stage's private folder)
LOCK = "_prepline/lock"
#: seconds an S3 lease lives without renewal
LEASE_TTL = float(os.environ.get("PREPLINE_LEASE_TTL", "60"))

_FIX = ("wait for the other run to finish (or stop it), or choose another --output: two runs writing one output "
        "would lose or duplicate documents")


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "owner": uuid.uuid4().hex, "since": time.time()}


def _describe(info: dict | None) -> str:
    if not info:
        return "another run"
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"another run (pid {info.get('pid', '?')} on {info.get('host', '?')}, since {when})"


_LOST_FIX = ("another run took this output over (this run was paused longer than its lease, or its lock was removed): "
             "nothing more was written by this run; check the other run's result, and rerun only if it failed")


@dataclass(frozen=True)
class Fence:
    """A run's fencing token, picklable for workers: calling it raises :class:`OutputLocked` when
    the output's lock no longer holds ``owner`` (see the module's docstring)."""

    kind: str  # "local": ``where`` is the lock file; "s3": ``where`` is "bucket/key" of the lease
    where: str
    owner: str
    uri: str  # the output, for messages

    def __call__(self) -> None:
        holder = self._holder()
        if holder != self.owner:
            raise OutputLocked(f"output {self.uri}: this run no longer holds its lock ({self._who(holder)}); it stops without writing more",
                               _LOST_FIX)

    @staticmethod
    def _who(holder: str | None) -> str:
        return "the lock is gone" if holder is None else "another run holds it now"

    def _holder(self) -> str | None:
        if self.kind == "local":
            try:
                with open(self.where, "rb") as f:
                    info = json.loads(f.read(4096) or b"null")
            except FileNotFoundError:
                return None
            except (OSError, ValueError):
                return ""
            return info.get("owner") if isinstance(info, dict) else ""
        bucket, _, key = self.where.partition("/")
        c = _fence_client()
        try:
            body = c.get_object(Bucket=bucket, Key=key)["Body"].read()
        except c.exceptions.NoSuchKey:
            return None
        try:
            info = json.loads(body)
        except ValueError:
            return ""
        return info.get("owner") if isinstance(info, dict) else ""


_clients: dict[tuple, Any] = {}


def _fence_client() -> Any:
    """One S3 client per process and S3 environment for fence checks (its endpoint, credentials,
    timeouts, retries). Keyed by that environment, not cached once: a process that runs stages
    against two endpoints (the Python API, a test session) must not ask an old endpoint, which
    answers a plain 404 for a lease that exists, or whatever now listens on its port."""
    from prepline.objstore import S3Settings, s3_client

    env = os.environ
    key = (S3Settings.from_env(), *(env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                         "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION")))
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = s3_client()
    return client


class OutputLock:
    """Base: ``acquire()``, ``check()`` (raises if the lock was lost), ``release()``, ``fence()``."""

    uri: str

    def fence(self) -> Fence:
        """The fencing token of this acquisition (for every output location of the run)."""
        raise NotImplementedError

    def acquire(self) -> "OutputLock":
        raise NotImplementedError

    def check(self) -> None:
        """Raise :class:`OutputLocked` when the lock is no longer ours (only an S3 lease can be lost)."""

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class LocalLock(OutputLock):
    def __init__(self, folder: str):
        self.folder = folder
        self.uri = folder
        self.path = os.path.join(folder, *LOCK.split("/"))
        self._fd: int | None = None
        self._made = False
        self._owner = ""

    def fence(self) -> Fence:
        return Fence("local", self.path, self._owner, self.uri)

    def acquire(self) -> "LocalLock":
        import fcntl

        if os.path.lexists(self.folder) and not os.path.isdir(self.folder):
            raise OutputError(f"output {self.folder} is a file, not a folder", "choose a folder for --output (or move the file away)")
        self._made = not os.path.lexists(self.folder)  # a run that fails before writing leaves no folder behind
        for _ in range(100):
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                from prepline.errors import os_error

                raise os_error(e, self.folder) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _read_info(fd)
                os.close(fd)
                raise OutputLocked(f"output {self.folder} is being written by {_describe(info)}", _FIX) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed it as it finished: lock the new one
                os.close(fd)
                continue
            holder = _holder()
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
            self._fd, self._owner = fd, holder["owner"]
            return self
        raise OutputLocked(f"output {self.folder}: could not take its lock", _FIX)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:  # (a lock file that replaced ours is not ours to remove)
                os.unlink(self.path)  # while still holding it: a waiting run then locks a fresh file
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        for d in [os.path.dirname(self.path)] + ([self.folder] if self._made else []):
            try:
                os.rmdir(d)  # _prepline/ (and the output folder this run made), when nothing else is in it
            except OSError:
                break


def _read_info(fd: int) -> dict | None:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None


class S3Lease(OutputLock):
    """A lease object on S3 (conditional writes); see the module's docstring."""

    def __init__(self, client: Any, bucket: str, key: str, uri: str, ttl: float = LEASE_TTL, loc: Any = None):
        self.c, self.bucket, self.key, self.uri, self.ttl, self.loc = client, bucket, key, uri, ttl, loc
        self.info = _holder()
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fence(self) -> Fence:
        return Fence("s3", f"{self.bucket}/{self.key}", self.info["owner"], self.uri)

    # -- S3 calls (botocore's timeouts and retries, errors as the storage layer names them) ----------
    def _call(self, fn):
        try:
            return fn()
        except Exception as e:
            if _status(e) in (409, 412):  # a refused condition: the caller decides
                raise
            if _code(e) == "NoSuchBucket":
                raise OutputError(f"bucket '{self.bucket}' of output {self.uri} does not exist", "create it or fix the --output URI") from None
            if self.loc is None:
                raise
            from prepline.objstore import translate

            new = translate(e, f"locking {self.uri}", self.loc)
            if new is e:
                raise
            raise new from e

    def _put(self, **cond) -> str:
        body = json.dumps({**self.info, "renewed": time.time(), "ttl": self.ttl}).encode()
        return self._call(lambda: self.c.put_object(Bucket=self.bucket, Key=self.key, Body=body, **cond))["ETag"]

    def _get(self) -> tuple[dict | None, str | None, float]:
        """(lease, etag, age in seconds by the server's clock); (None, None, 0) when there is none."""
        import email.utils

        def get():
            try:
                r = self.c.get_object(Bucket=self.bucket, Key=self.key)
            except self.c.exceptions.NoSuchKey:
                return None
            return r, r["Body"].read()

        got = self._call(get)
        if got is None:
            return None, None, 0.0
        r, body = got
        date = r["ResponseMetadata"]["HTTPHeaders"].get("date")
        now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
        try:
            info = json.loads(body)
        except ValueError:
            info = {}
        return info, r["ETag"], now - r["LastModified"].timestamp()

    def _ours(self) -> bool:
        """After a conditional put was refused: was it refused because an earlier attempt of ours, whose
        answer was lost, had already succeeded?"""
        info, etag, _ = self._get()
        if info and info.get("owner") == self.info["owner"]:
            self.etag = etag
            return True
        return False

    def _stale(self, info: dict, age: float) -> bool:
        if age > float(info.get("ttl", self.ttl)):
            return True
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            try:
                os.kill(info["pid"], 0)
            except ProcessLookupError:
                return True  # its owner died on this machine
            except PermissionError:
                pass
        return False

    # -- protocol --------------------------------------------------------------------------------
    def acquire(self) -> "S3Lease":
        from botocore.exceptions import ClientError

        try:
            self.etag = self._put(IfNoneMatch="*")
        except ClientError as e:
            if _status(e) not in (409, 412):
                raise
            if self._ours():
                return self._started()
            info, etag, age = self._get()
            if info is None or etag is None:
                raise OutputLocked(f"output {self.uri} is being locked by another run right now", _FIX) from None
            if not self._stale(info, age):
                raise OutputLocked(f"output {self.uri} is being written by {_describe(info)}; its lease was renewed "
                                   f"{age:.0f}s ago and expires after {float(info.get('ttl', self.ttl)):.0f}s", _FIX) from None
            try:
                self.etag = self._put(IfMatch=etag)
            except ClientError as e2:
                if _status(e2) in (409, 412) and not self._ours():
                    raise OutputLocked(f"output {self.uri}: another run took over its stale lease first", _FIX) from None
                raise
            log.warning("output %s: took over the stale lease of %s", self.uri, _describe(info))
        # read back: the lease must be ours. Redundant on S3, whose conditional writes are atomic; moto's
        # server checks If-None-Match and then writes without a lock (moto/s3/responses.py put_object),
        # so two racing creates can both succeed there: the second one's read-back tells the first.
        if not self._ours():
            info, _, _ = self._get()
            raise OutputLocked(f"output {self.uri} is being written by {_describe(info)}", _FIX)
        return self._started()

    def _started(self) -> "S3Lease":
        self._thread = threading.Thread(target=self._renew_loop, name="prepline-lease", daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.etag = self._put(IfMatch=self.etag)
            except Exception as e:  # noqa: BLE001 - a thread must not die of it
                try:
                    if _status(e) in (404, 409, 412) and not self._ours():
                        self.lost = f"the lease on {self.uri} was taken over by another run"
                        return
                except Exception:  # noqa: BLE001
                    pass
                log.warning("output %s: could not renew the lease (%s); trying again", self.uri, e)

    def check(self) -> None:
        if self.lost:
            raise OutputLocked(f"output {self.uri}: this run no longer holds its lock ({self.lost}); it stops without writing more",
                               _LOST_FIX)

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.etag and not self.lost:
            try:
                if not self._ours():  # taken over while this run was paused: the lease is the other run's
                    self.etag = None
                    return
                self.c.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
            except Exception as e:  # noqa: BLE001 - it expires anyway
                log.warning("output %s: could not delete the lease (%s); it expires in %.0fs", self.uri, e, self.ttl)
        self.etag = None


def _status(e: Any) -> int:
    return int((getattr(e, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(e: Any) -> str:
    return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code") or "")


def output_lock(out: Any) -> OutputLock:
    """The lock of a :class:`~prepline.data_access.Location` (local folder or S3 prefix)."""
    from prepline.data_access import LocalLocation, S3Location

    if isinstance(out, S3Location):
        from prepline.objstore import s3_client

        return S3Lease(s3_client(), out.bucket, out.key(LOCK), out.uri, loc=out)
    if isinstance(out, LocalLocation):
        return LocalLock(out.path())
    raise ConfigError(f"output {out.uri}: prepline writes to local folders and s3:// only (one writer per output needs a lock "
                      "there)", "write to a local folder or an s3:// prefix")
