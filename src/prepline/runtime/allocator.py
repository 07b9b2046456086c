"""The memory allocator of the processes that run transforms: mimalloc where it is installed.

The HTML parser behind ingest (Lexbor, in Resiliparse) allocates every node of every page's tree
through ``malloc``: with glibc's allocator that is about a third of the instructions of extracting
a page (callgrind, docs/performance.md), and preloaded, mimalloc ran the same reading loop in
0.80-0.88x the time (other stages' libraries allocate through it too; they were not measured one by
one). An allocator is chosen when a process starts (``LD_PRELOAD``), so:

- ``prepline run`` (a command, not the Python API) starts itself again, once, with mimalloc
  preloaded, before it imports anything heavy (:func:`reexec`); the local pool's processes, forked
  or spawned from it, run on it too;
- Ray's own processes keep their allocators: a local Ray the run starts does not inherit the
  preload (:func:`not_inherited`), and Ray heads are started as before. Ray preloads its own
  jemalloc into the raylet (its environment holds ``LD_PRELOAD=.../ray/core/libjemalloc.so``), and
  once, in a full test run with a local head's processes preloaded with mimalloc too, that head's
  dashboard died at a job submission (the cause was not proven). On Ray, the driver runs on
  mimalloc and the actors on the system allocator;
- ``metadata.json`` records which allocator the stage's driver ran with (:func:`current`).

mimalloc comes from the system (Debian/Ubuntu: ``apt-get install libmimalloc2.0``; ``scripts/setup.sh``
installs it). Without it everything runs on the system allocator, as before. ``PREPLINE_ALLOCATOR``
chooses: ``mimalloc`` (the default: use it when found), ``system`` (never preload), or the path of
a shared library to preload instead. A user's own ``LD_PRELOAD`` is left as it is.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
from typing import Iterator

ENV = "PREPLINE_ALLOCATOR"
#: set in the environment of a command started again with the allocator (it is not started a third time)
_DONE = "PREPLINE_ALLOCATOR_PRELOADED"
#: where Debian and Ubuntu put libmimalloc2.0's library, besides what the linker cache lists
_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def library(env: dict[str, str] | None = None) -> str | None:
    """The shared library to preload (None: the system allocator)."""
    env = os.environ if env is None else env
    choice = env.get(ENV, "mimalloc").strip() or "mimalloc"
    if choice == "system" or not sys.platform.startswith("linux"):
        return None
    if choice != "mimalloc":
        if not os.path.isfile(choice):
            from prepline.errors import ConfigError

            raise ConfigError(f"{ENV}={choice}: no such file", f"set {ENV} to mimalloc, system or the path of an allocator's shared library")
        return choice
    for d in _DIRS:
        for name in ("libmimalloc.so.2", "libmimalloc.so"):
            if os.path.isfile(os.path.join(d, name)):
                return os.path.join(d, name)
    found = ctypes.util.find_library("mimalloc")  # the linker cache: a name, which ld.so resolves
    return found or None


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """What to add to a child process's environment so that it starts with the allocator ({}: the
    system allocator, or an ``LD_PRELOAD`` the user set)."""
    env = os.environ if env is None else env
    lib = library(env)
    if lib is None or env.get("LD_PRELOAD", "").strip():
        return {}
    return {"LD_PRELOAD": lib}


def reexec() -> None:
    """Start this command again with the allocator preloaded (no return), unless it already runs
    with it, there is none, or the user chose the system allocator. Called before heavy imports."""
    if os.environ.get(_DONE) or not getattr(sys, "orig_argv", None):
        return
    extra = preload_env()
    if not extra:
        return
    env = dict(os.environ, **extra, **{_DONE: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


@contextlib.contextmanager
def not_inherited() -> Iterator[None]:
    """Processes started in this block do not inherit the preload :func:`reexec` added (a user's
    own ``LD_PRELOAD`` is theirs, and stays)."""
    ours = os.environ.get(_DONE) and os.environ.pop("LD_PRELOAD", None)
    try:
        yield
    finally:
        if ours:
            os.environ["LD_PRELOAD"] = ours


def current() -> str:
    """The allocator this process runs with: ``mimalloc``, another preloaded library's name, or
    ``system`` (read from the libraries mapped into the process)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "system"
    if "libmimalloc" in maps:
        return "mimalloc"
    for lib in filter(None, os.environ.get("LD_PRELOAD", "").replace(":", " ").split()):
        name = os.path.basename(lib)
        if name in maps:
            return name
    return "system"
