"""Errors that carry the fix, and the one mapping from errors to exit codes.

Every user-facing failure is a :class:`PreplineError`: a message naming what is wrong (the file,
endpoint, parameter or process) and a ``fix`` saying what to do. Each family has one exit code
(:data:`EXIT_CODES`, documented in docs/reliability.md); every command (``prepline ...``, the
training step, ``prepline kfp ...``) maps errors to exit codes through :func:`exit_code`.
``transient`` errors (an object store or API that did not answer) are worth a rerun as they are:
runs resume where they stopped.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # RunFailed: the run went through and failed (files beyond the tolerance, a job failed)
EXIT_USAGE = 2  # ConfigError: a bad command, option or parameter; nothing ran
EXIT_CANCELED = 3  # Canceled: a KFP run was canceled
EXIT_TIMEOUT = 4  # TimedOut: a wait ran out of time
EXIT_SERVICE = 5  # ServiceError: an object store or API was unreachable, refused the credentials or failed
EXIT_INPUT = 6  # InputError: bad input data (a file, a column, a missing folder)
EXIT_OUTPUT = 7  # OutputError: the output cannot be written (not a folder, read-only, disk full) or is in use
EXIT_INTERNAL = 70  # an unexpected error (a bug): the traceback is shown with --debug
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C); SIGTERM gives 143 (128 + 15)
EXIT_TERMINATED = 143

#: exit code -> what it means (the table in docs/reliability.md is checked against it)
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "the run failed: input files failed beyond --max-failed-files, a worker was lost for good, a job or child run failed",
    EXIT_USAGE: "a bad command, option or parameter (nothing ran)",
    EXIT_CANCELED: "a KFP run was canceled",
    EXIT_TIMEOUT: "a wait ran out of time (the run may go on)",
    EXIT_SERVICE: "an object store or API did not answer within its retry budget, refused the credentials or failed",
    EXIT_INPUT: "bad input data: a file, a column or a missing input folder",
    EXIT_OUTPUT: "the output cannot be written (a file in its place, read-only, disk full) or another run holds it",
    EXIT_INTERNAL: "an unexpected error (a bug): rerun with --debug for the traceback and report it",
    EXIT_INTERRUPTED: "interrupted (SIGINT): rerun the same command to resume",
    EXIT_TERMINATED: "terminated (SIGTERM): rerun the same command to resume",
}


class PreplineError(Exception):
    """Base error. ``fix`` tells the user what to do; the CLI prints both and exits with ``exit_code``."""

    exit_code = EXIT_FAILED
    #: worth a rerun as is (the service may answer next time)
    transient = False

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(PreplineError):
    """A bad parameter, option or transform name."""

    exit_code = EXIT_USAGE


class InputError(PreplineError):
    """Bad input data: a missing folder, an unreadable file, a missing or mistyped column."""

    exit_code = EXIT_INPUT


class OutputError(PreplineError):
    """The output cannot be written: a file where the folder should be, no permission, disk full."""

    exit_code = EXIT_OUTPUT


class OutputLocked(OutputError):
    """Another run holds the output's lock (one writer per output)."""


class RunFailed(PreplineError):
    """The run finished but did not succeed (failed files beyond the tolerance, broken counts)."""


class ServiceError(PreplineError):
    """An external service (object store, KFP API, KubeRay, Kubernetes) failed a request."""

    exit_code = EXIT_SERVICE


class ServiceUnavailable(ServiceError):
    """No usable answer within the retry budget (timeouts, resets, 5xx, throttling): transient."""

    transient = True


class TimedOut(PreplineError):
    """A wait ran out of time."""

    exit_code = EXIT_TIMEOUT


class Canceled(PreplineError):
    """Someone canceled the run."""

    exit_code = EXIT_CANCELED


class InternalError(PreplineError):
    """A task raised an unexpected error (a bug, or a library failing on odd data)."""

    exit_code = EXIT_INTERNAL


class Terminated(PreplineError):
    """The process was told to stop (SIGTERM)."""

    exit_code = EXIT_TERMINATED


class Interrupted(Terminated):
    """Ctrl-C (SIGINT)."""

    exit_code = EXIT_INTERRUPTED


def os_error(e: OSError, where: str = "") -> OutputError:
    """An OSError met while writing the output, as an :class:`OutputError` naming the path and the fix."""
    import errno

    path = e.filename or where
    what = e.strerror or type(e).__name__
    resume = "; then rerun the same command: it resumes where it stopped"
    fixes = {
        errno.ENOSPC: "free space on that disk or choose an --output on a bigger one" + resume,
        errno.EDQUOT: "raise your disk quota or free space" + resume,
        errno.EROFS: "choose an --output on a writable file system",
        errno.EACCES: f"make {where or path} writable for this user, or choose another --output",
        errno.EPERM: f"make {where or path} writable for this user, or choose another --output",
        errno.ENOTDIR: f"a file stands where a folder of {where or path} should be: move it away or choose another --output",
        errno.EEXIST: f"a file stands where a folder of {where or path} should be: move it away or choose another --output",
        errno.EISDIR: f"a folder stands where a file of {where or path} should be: choose an empty --output",
    }
    return OutputError(f"cannot write {path}: {what}", fixes.get(e.errno, "check the output folder and the disk" + resume))


def user_mistake(e: BaseException) -> PreplineError | None:
    """A library's exception that a user's setting causes (an AWS profile that does not exist, an
    endpoint that is not a URL, a bucket name botocore refuses), as a ConfigError; None for others.
    The storage layer says it with more context where it can; this is the net under every command."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        name, text = type(x).__name__, " ".join(str(x).split())[:300]
        if name == "ProfileNotFound":
            return ConfigError(f"{text} (AWS_PROFILE)", "set AWS_PROFILE to a profile of ~/.aws/config, or unset it")
        if name == "ParamValidationError":
            return ConfigError(text, "check the s3:// URI: bucket names are 3-63 lowercase letters, digits, dots and hyphens")
        if isinstance(x, ValueError) and text.startswith("Invalid endpoint"):
            return ConfigError(text, "write the S3 endpoint as a URL: http://host:port or https://host")
        x = x.__cause__ or x.__context__
    return None


def exit_code(e: BaseException) -> int:
    """The exit code of any exception: a PreplineError's own, 130 for Ctrl-C, 70 for the rest (bugs)."""
    if isinstance(e, PreplineError):
        return e.exit_code
    if (u := user_mistake(e)) is not None:
        return u.exit_code
    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_INTERNAL


def user_message(e: BaseException) -> str:
    """What the user sees on stderr: ``error: ...`` and ``  fix: ...``."""
    if isinstance(e, PreplineError):
        return f"error: {e.message}" + (f"\n  fix: {e.fix}" if e.fix else "")
    if isinstance(e, KeyboardInterrupt):
        return "error: interrupted\n  fix: rerun the same command to resume"
    if (u := user_mistake(e)) is not None:
        return user_message(u)
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return (f"error: unexpected {type(e).__name__}" + (f": {text}" if text else "")
            + "\n  fix: rerun with --debug for the traceback and report it (this is a bug)")
