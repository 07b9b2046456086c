"""How a run is carried out (never what it computes): the options every runtime understands."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from prepline.errors import ConfigError

ENV_TASK_TIMEOUT = "PREPLINE_TASK_TIMEOUT"
#: seconds a task may make no progress (no document read, no CPU used by its worker) before its
#: worker is stopped and the task runs again elsewhere (or, past --task-retries, fails the run).
#: Above the S3 layer's budget for one call (about 2 minutes for a store that stopped answering),
#: so a dead store is reported as such first.
DEFAULT_TASK_TIMEOUT = 300.0


def default_task_timeout() -> float:
    """PREPLINE_TASK_TIMEOUT, else 300 seconds (0: no task timeout)."""
    raw = os.environ.get(ENV_TASK_TIMEOUT, "")
    if raw == "":
        return DEFAULT_TASK_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_TASK_TIMEOUT}={raw!r} is not a number of seconds", f"e.g. {ENV_TASK_TIMEOUT}=300 (0: no timeout)") from None


#: environment variable that allows more local workers than CPUs (like ``--workers-over-cpus``)
WORKERS_OVER_CPUS_ENV = "PREPLINE_WORKERS_OVER_CPUS"
#: with that override, local workers are still at most this many per CPU
MAX_WORKERS_PER_CPU = 8


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's limit), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def over_cpus_from_env() -> bool:
    return os.environ.get(WORKERS_OVER_CPUS_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_workers(workers: int, runtime: str = "local", over_cpus: bool = False) -> None:
    """``--workers`` of a local run: 0 (one per CPU) up to the usable CPUs; with ``over_cpus`` (or
    PREPLINE_WORKERS_OVER_CPUS=1) up to MAX_WORKERS_PER_CPU per CPU. Each local worker is a process
    holding its own batch and models: more than the CPUs only adds memory and contention. On Ray the
    cluster's resources bound the actors."""
    if workers < 0:
        raise ConfigError(f"workers={workers} must be >= 0", "pass --workers N (0 = one per CPU)")
    if runtime != "local":
        return
    cpus = usable_cpus()
    over = over_cpus or over_cpus_from_env()
    limit = cpus * MAX_WORKERS_PER_CPU if over else cpus
    if workers > limit:
        if over:
            raise ConfigError(f"--workers {workers} is more than {MAX_WORKERS_PER_CPU} per CPU ({cpus} CPU(s) usable here)",
                              f"pass --workers {limit} or fewer (0 = one per CPU)")
        raise ConfigError(f"--workers {workers} is more than the {cpus} CPU(s) this process may use (each local worker is a process)",
                          f"pass --workers {cpus} or fewer (0 = one per CPU); to run more anyway (I/O-bound work), add "
                          f"--workers-over-cpus or set {WORKERS_OVER_CPUS_ENV}=1")


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to compute): these never change the output."""

    input: str
    output: str
    runtime: str = "local"  # local | ray
    workers: int = 0  # 0: one per CPU (local) or per `cpus_per_worker` of the cluster (ray)
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0  # ray: GPUs each actor reserves (Ray places it on a node that has them)
    ray_address: str | None = None  # join this cluster; None: start a local one
    max_failed_files: int = 0  # failed files tolerated (listed in metadata.json)
    overwrite: bool = False  # delete an existing, different output first
    progress: bool = True
    #: times a task whose worker process or actor died is run again (tasks are idempotent)
    task_retries: int = 2
    #: seconds a task may make no progress before its worker is stopped (0: never); see default_task_timeout
    task_timeout: float = field(default_factory=default_task_timeout)
    #: allow more local workers than CPUs (up to MAX_WORKERS_PER_CPU per CPU); also PREPLINE_WORKERS_OVER_CPUS=1
    workers_over_cpus: bool = False
    #: a run that removes every document of a non-empty input fails unless this is set
    allow_empty_output: bool = False

    def __post_init__(self) -> None:
        if self.runtime not in ("local", "ray"):
            raise ConfigError(f"unknown runtime '{self.runtime}'", "use --runtime local or --runtime ray")
        check_workers(self.workers, self.runtime, self.workers_over_cpus)
        if self.max_failed_files < 0:
            raise ConfigError("max_failed_files must be >= 0", "pass --max-failed-files N")
        if self.cpus_per_worker <= 0:
            raise ConfigError("cpus_per_worker must be > 0", "pass --cpus-per-worker 1 (or 0.5, 2, ...)")
        if not self.gpus_per_worker >= 0:
            raise ConfigError("gpus_per_worker must be >= 0", "pass --gpus-per-worker 1 (or 0.5: two workers share a GPU; 0: none)")
        if self.gpus_per_worker and self.runtime != "ray":
            raise ConfigError("--gpus-per-worker places workers on a Ray cluster's GPUs: a local run has no such placement",
                              "add --runtime ray (with --ray-address of a cluster that has GPUs), or drop --gpus-per-worker")
        if self.task_retries < 0:
            raise ConfigError("task_retries must be >= 0", "pass --task-retries N (0: a lost worker fails its task at once)")
        if not self.task_timeout >= 0 or self.task_timeout == float("inf"):
            raise ConfigError(f"task_timeout={self.task_timeout} must be a number of seconds >= 0",
                              "pass --task-timeout SECONDS (0: no timeout; default 300, or PREPLINE_TASK_TIMEOUT)")
