"""What ``prepline pipeline run --local`` shows of kfp.local's tasks, and each task's whole log.

kfp.local runs every task as a subprocess and prints all it writes (upstream
``kfp/local/subprocess_task_handler.py``, ``run_local_subprocess``: the executor's
``executor_input`` dump, its own info lines, the Ray job's log, ...) and logs two lines per task
itself. :func:`task_output` replaces that one function while a run lasts (kfp is pinned; the
replacement takes the same arguments, runs the same command with the same environment and returns
its exit code): every line goes to ``task.log`` in the task's folder under the pipeline root, and
only prepline's own log lines are printed (all of them with ``verbose``). A task that fails also
prints the end of its log. kfp.local's own info lines, its rules between tasks and its two warnings
per task about settings a local run ignores (display names, images) are left out unless ``verbose``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import logging
import os
import re
import subprocess
import threading
import warnings
from collections import deque
from pathlib import Path
from typing import Iterator

from prepline.logs import is_prepline_line

TASK_LOG = "task.log"
#: lines of a failed task's log printed below it
TAIL_LINES = 40


def task_log_path(full_command: list[str]) -> Path | None:
    """``task.log`` in the task's folder: where kfp.local asks the executor to write its output file."""
    try:
        i = full_command.index("--executor_input")
        out = json.loads(full_command[i + 1])["outputs"]["outputFile"]
    except (ValueError, IndexError, KeyError, TypeError, json.JSONDecodeError):
        return None
    return Path(out).parent / TASK_LOG


#: a JSON file {image name: {VAR: value}}: each task runs with the variables given for the name of its
#: image (the part after the registry, without the tag), e.g. the lab's per-image package sets (docs/lab.md)
ENV_TASK_ENV_BY_IMAGE = "PREPLINE_TASK_ENV_BY_IMAGE"
#: the image of the task kfp.local runs now in this thread (set around SubprocessTaskHandler.run)
_TASK = threading.local()


def image_env(image: str) -> dict[str, str]:
    """The variables ``PREPLINE_TASK_ENV_BY_IMAGE`` gives a task of ``image`` ({} without the setting).
    An image the file does not name is refused: the task would run with a package set nobody declared."""
    path = os.environ.get(ENV_TASK_ENV_BY_IMAGE)
    if not path or not image:
        return {}
    by_name = json.loads(Path(path).read_text())
    from prepline.images import image_name

    name = image_name(image)
    if name not in by_name:
        raise RuntimeError(f"{ENV_TASK_ENV_BY_IMAGE}={path} gives no environment for image {image} (names: {sorted(by_name)})")
    return dict(by_name[name])


_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")


def task_image(image: str, full_command: list[str]) -> str:
    """The task's image; a pipeline parameter (``{{$.inputs.parameters['pipelinechannel--launcher_image']}}``,
    which kfp.local leaves unresolved) is read from the task's executor input, which carries it."""
    m = _PLACEHOLDER.match(image or "")
    if not m:
        return image
    try:
        i = full_command.index("--executor_input")
        return str(json.loads(full_command[i + 1])["inputs"]["parameterValues"][m.group(1)])
    except (ValueError, IndexError, KeyError, TypeError, json.JSONDecodeError):
        return image


def run_task(full_command: list[str], env_vars: dict[str, str] | None = None, verbose: bool = False) -> int:
    """Run one task's command like kfp.local does; its lines to task.log, prepline's to the screen."""
    extra = {**image_env(task_image(getattr(_TASK, "image", ""), full_command)), **(env_vars or {})}
    env = {**os.environ, **extra} if extra else None
    path = task_log_path(full_command)
    say = builtins.print  # kfp.local indents task output by replacing print while a task runs
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with contextlib.ExitStack() as stack:
        log = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(path, "w", encoding="utf-8"))
        proc = stack.enter_context(subprocess.Popen(full_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                    bufsize=1, env=env, errors="replace"))
        for line in iter(proc.stdout.readline, ""):
            if log is not None:
                log.write(line)
            if verbose or is_prepline_line(line):
                say(line, end="")
            else:
                tail.append(line)
        rc = proc.wait()
    if rc != 0:
        err = task_error(list(tail), path)
        if err is not None:
            FAILURES.append(err)
        if err is not None and not verbose:  # prepline's own error: no executor dump, the log keeps it
            say(f"error in task {err.task}: {err.message}\n  fix: {err.fix}\n(the task's whole log: {path})")
        elif not verbose:
            say(f"(the last lines of the task's log{f', all of it in {path}' if path else ''}:)")
            for line in tail:
                say(line, end="")
    return rc


@dataclasses.dataclass(frozen=True)
class TaskFailure:
    """The prepline error a failed task ended with (the last lines of its traceback)."""

    task: str
    kind: str  # a class name of prepline.errors
    message: str
    fix: str
    log: str


#: the failures of the tasks of the run in progress, in order (kfp.local stops at the first)
FAILURES: list[TaskFailure] = []
_ERROR_LINE = re.compile(r"^prepline\.(?:\w+\.)*(\w+): (.*)$")  # an error class of any prepline module


def task_error(lines: list[str], path: Path | None) -> TaskFailure | None:
    """The prepline error (class, message, fix) at the end of a failed task's output, if it is one."""
    for i in range(len(lines) - 1, -1, -1):
        m = _ERROR_LINE.match(lines[i].rstrip("\n"))
        if m:
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            fix = nxt[len("fix: "):] if nxt.startswith("fix: ") else ""
            task = path.parent.name if path is not None else "?"
            return TaskFailure(task, m.group(1), m.group(2), fix, str(path) if path else "")
    return None


class _HideKfpInfo(logging.Filter):
    """kfp.local's own info lines (a task started, finished) are logged on the root logger; a task
    that failed with prepline's error was said already (its line names the task)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if FAILURES and "finished with status" in str(record.msg) and "FAILURE" in str(record.msg):
            return False
        return record.levelno >= logging.WARNING


@contextlib.contextmanager
def task_output(verbose: bool = False) -> Iterator[None]:
    """While a kfp.local run lasts: tasks' logs into task.log, prepline's lines on the screen."""
    from kfp.local import logging_utils
    from kfp.local import subprocess_task_handler as handler

    original, rule = handler.run_local_subprocess, logging_utils.print_horizontal_line
    # kfp/local/logging_utils.py indented_print swaps builtins.print per task and puts back what it
    # found: two ParallelFor iterations at once can leave an indenting print in place after the run
    real_print = builtins.print
    hide = _HideKfpInfo()

    def run_local_subprocess(full_command, env_vars=None):
        return run_task(list(full_command), env_vars, verbose)

    original_run = handler.SubprocessTaskHandler.run

    def run_with_image(self):  # kfp/local/subprocess_task_handler.py: the handler knows its task's image
        _TASK.image = getattr(self, "image", "") or ""
        try:
            return original_run(self)
        finally:
            _TASK.image = ""

    handler.run_local_subprocess = run_local_subprocess
    handler.SubprocessTaskHandler.run = run_with_image
    FAILURES.clear()
    with warnings.catch_warnings():
        if not verbose:
            logging.getLogger().addFilter(hide)
            logging_utils.print_horizontal_line = lambda: None
            # kfp/local/orchestrator/task_executor.py (settings with no effect locally) and
            # kfp/local/subprocess_task_handler.py (the image is a pipeline parameter: we run this Python on purpose)
            warnings.filterwarnings("ignore", message=r"Task '.*': settings .* have no effect in the current local runner")
            warnings.filterwarnings("ignore", message=r"You may be attemping to run a task that uses custom or non-Python base image")
        try:
            yield
        finally:
            handler.run_local_subprocess, logging_utils.print_horizontal_line = original, rule
            handler.SubprocessTaskHandler.run = original_run
            builtins.print = real_print
            logging.getLogger().removeFilter(hide)
