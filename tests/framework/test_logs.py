"""Logging and progress: prepline's own lines with time and level (text or JSON), other libraries
quiet, repeated warnings counted; progress lines on a steady schedule with documents and bytes."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from prepline import logs, progress
from prepline.errors import ConfigError


@pytest.fixture
def restore_logging():
    root, own = logging.getLogger(), logging.getLogger("prepline")
    saved = (root.handlers[:], root.level, own.handlers[:], own.level, own.propagate, os.environ.get(logs.ENV_FORMAT))
    yield
    root.handlers[:], own.handlers[:] = saved[0], saved[2]
    root.setLevel(saved[1])
    own.setLevel(saved[3])
    own.propagate = saved[4]
    logs._State.handler = logs._State.repeats = None
    if saved[5] is None:
        os.environ.pop(logs.ENV_FORMAT, None)
    else:
        os.environ[logs.ENV_FORMAT] = saved[5]


def test_text_and_json_lines_and_quiet_libraries(restore_logging):
    buf = io.StringIO()
    logs.setup("text", stream=buf)
    logging.getLogger("prepline.engine").info("hello %s", "there")
    logging.getLogger("presidio-analyzer").info("Skipping context extraction due to lack of NLP artifacts")  # quiet
    logging.getLogger("presidio-analyzer").warning("a library warning")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and logs.is_prepline_line(lines[0]) and not logs.is_prepline_line(lines[1])
    assert lines[0].endswith("INFO prepline.engine: hello there") and " WARNING presidio-analyzer: a library warning" in lines[1]
    buf = io.StringIO()
    logs.setup("json", stream=buf)
    assert os.environ[logs.ENV_FORMAT] == "json"  # workers, task subprocesses and Ray jobs started from here log alike
    logging.getLogger("prepline.progress").info("p", extra={"fields": {"docs": 3}})
    rec = json.loads(buf.getvalue())
    assert rec["logger"] == "prepline.progress" and rec["level"] == "INFO" and rec["docs"] == 3 and rec["time"].endswith("Z")
    assert logs.is_prepline_line(buf.getvalue())
    with pytest.raises(ConfigError, match="not a log format"):
        logs.setup("xml")


def test_a_repeated_warning_is_shown_once_then_counted(restore_logging):
    buf = io.StringIO()
    logs.setup(stream=buf)
    lib = logging.getLogger("some.library")
    for _ in range(50):
        lib.warning("the same thing again")
    lib.warning("something else")
    logs.flush_repeats()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "the same thing again" in lines[0] and "something else" in lines[1]
    assert "some.library" in lines[2] and "repeated 49 more time(s)" in lines[2]


def test_tracker_counts_running_and_finished_tasks_and_estimates():
    t = progress.Tracker("s", "final", tasks=4, bytes_total=4000, by_files=True, counts_docs=True)
    t.resumed(1, docs=100, nbytes=1000)  # done by an earlier run: not in the rate
    t.report("b", 50, 500)
    t.report("b", 80, 800)  # cumulative: the newer report replaces the older
    s = t.snapshot()
    assert (s["tasks_done"], s["docs"], s["bytes"], s["running"]) == (1, 180, 1800, 1)
    t.finished("b", 100, 1000)  # exact, from the result
    t.report("b", 90, 900)  # late: its result is in
    t.report("c", 10, 5000)  # an estimate never goes past the total
    s = t.snapshot()
    assert (s["tasks_done"], s["docs"], s["bytes"]) == (2, 210, 4000) and s["eta_s"] is not None
    text = progress.line(s)
    assert text.startswith("s final: 2/4 files, 210 docs, 0.0/0.0 MB (100%)") and "ETA" in text


def test_log_view_keeps_a_steady_schedule(restore_logging):
    buf = io.StringIO()
    logs.setup("json", stream=buf)
    t = progress.Tracker("s", "final", 2, 100, True, True)
    view = progress.LogView(t, every=0.2)
    time.sleep(1.1)
    view.close()
    recs = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert all(r["logger"] == "prepline.progress" and "progress" in r for r in recs)
    elapsed = [r["progress"]["elapsed_s"] for r in recs[:-1]]
    assert len(elapsed) >= 4 and recs[-1]["progress"]["final"] is True
    assert max(b - a for a, b in zip(elapsed, elapsed[1:])) <= 0.45


def test_worker_reports_each_batch(tmp_path, monkeypatch):
    """process_file tells the driver's progress after every batch: documents so far and the file's
    bytes by its share of rows."""
    from conftest import write_parquet

    from prepline.context import PhaseContext, WorkerSpec
    from prepline.transform import FileTask
    from prepline.worker import process_file
    from prepline import registry

    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.001")  # ~1 kB batches: several per file
    write_parquet(tmp_path / "in", "a.parquet", {"contents": [f"document number {i} " * 5 for i in range(200)]})
    size = (tmp_path / "in" / "a.parquet").stat().st_size
    spec = WorkerSpec("doc_id", {}, str(tmp_path / "in"), str(tmp_path / "out"), "final")
    tr, ctx = registry.build("doc_id", {}), PhaseContext(spec)
    tr.setup(ctx)
    got = []
    r = process_file(tr, ctx, FileTask(str(tmp_path / "in" / "a.parquet"), "a.parquet", size, {"offset": 0}),
                     lambda *a: got.append(a))
    assert len(got) > 3 and got[-1] == ("a.parquet", 200, size) and r["docs_in"] == 200
    assert [g[1] for g in got] == sorted(g[1] for g in got) and all(0 < g[2] <= size for g in got)


def _cli(args: list[str], env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prepline.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_a_piped_stage_logs_json_progress_on_schedule(tmp_path):
    from prepline.sample import build_sample

    # enough documents that the final phase outlasts several intervals even with the pool started
    # as the command begins (400 documents took 0.2 s: one interval, no tick to check)
    build_sample(str(tmp_path / "in"), docs=4000, files=4)
    r = _cli(["--log-format", "json", "run", "doc_quality", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"),
              "--workers", "2", "--progress-interval", "0.25"], {"PREPLINE_BATCH_MB": "0.02"})
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stderr.splitlines()]  # every log line is JSON
    prog = [x for x in recs if x["logger"] == "prepline.progress"]
    assert prog[-1]["progress"]["final"] and prog[-1]["progress"]["docs"] == 4000 and prog[-1]["progress"]["tasks_done"] == 4
    ticks = [x["progress"]["elapsed_s"] for x in prog if x["phase"] == "final" and not x["progress"]["final"]]
    # on schedule: a line at least every interval (plus scheduling slack) from the start to the end
    times = [0.0, *ticks, prog[-1]["progress"]["elapsed_s"]]
    assert ticks and max(b - a for a, b in zip(times, times[1:])) <= 0.6, times
    assert all(x["time"].endswith("Z") for x in recs)
    assert "doc_quality: success" in r.stdout  # the summary table goes to stdout


@pytest.mark.slow
def test_pii_redactor_on_1000_documents_prints_few_lines(tmp_path):
    """A stage run piped (as in CI or a KFP log): progress lines with time stamps, no library noise."""
    from prepline.sample import build_sample

    build_sample(str(tmp_path / "in"), docs=1000, files=4)
    r = _cli(["run", "pii_redactor", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--workers", "2"])
    assert r.returncode == 0, r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    assert len(lines) < 20, "\n".join(lines)
    assert any(logs.is_prepline_line(x) and "pii_redactor final: 4/4 files, 1,000 docs" in x for x in r.stderr.splitlines())
    assert "Skipping context extraction" not in r.stderr and "pii_docs" in r.stdout
