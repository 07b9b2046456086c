"""How a run is carried out (never what it computes): the options every runtime understands."""

from __future__ import annotations

from dataclasses import dataclass

from prepline.errors import ConfigError


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to compute): these never change the output."""

    input: str
    output: str
    runtime: str = "local"  # local | ray
    workers: int = 0  # 0: one per CPU (local) or per `cpus_per_worker` of the cluster (ray)
    cpus_per_worker: float = 1.0
    ray_address: str | None = None  # join this cluster; None: start a local one
    max_failed_files: int = 0  # failed files tolerated (listed in metadata.json)
    overwrite: bool = False  # delete an existing, different output first
    progress: bool = True
    #: times a task whose worker process or actor died is run again (tasks are idempotent)
    task_retries: int = 2
    #: a run that removes every document of a non-empty input fails unless this is set
    allow_empty_output: bool = False

    def __post_init__(self) -> None:
        if self.runtime not in ("local", "ray"):
            raise ConfigError(f"unknown runtime '{self.runtime}'", "use --runtime local or --runtime ray")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers} must be >= 0", "pass --workers N (0 = automatic)")
        if self.max_failed_files < 0:
            raise ConfigError("max_failed_files must be >= 0", "pass --max-failed-files N")
        if self.cpus_per_worker <= 0:
            raise ConfigError("cpus_per_worker must be > 0", "pass --cpus-per-worker 1 (or 0.5, 2, ...)")
        if self.task_retries < 0:
            raise ConfigError("task_retries must be >= 0", "pass --task-retries N (0: a lost worker fails its task at once)")
