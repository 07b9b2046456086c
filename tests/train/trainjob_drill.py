"""The 2-node fine-tune and the trainer-host-kill drill, shared by the localhost test
(tests/train/test_trainjob_nodes.py) and the lab test (tests/lab/test_trainjob_lab.py): only where
the nodes run (``spawn``) and how a host is killed (``kill``) differ."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from prepline.data_access import open_location
from prepline.train.checkpoints import list_checkpoints
from prepline.train.nodes import JobResult, run_nodes
from prepline.train.realise import realise_trainjob, resolve_env
from prepline.train.train import read_summary
from prepline.train.trainjob import TrainJobOptions, trainjob_manifest, trainjob_name

#: small and quick on 2 loaded cores; batch 16 splits into 8 per rank
PARAMS = {"threads": 1, "model_dim": 64, "batch_size": 16, "lr": 0.01, "warmup_steps": 5, "log_every": 20, "seq_len": 64,
          "steps": 200, "checkpoint_every": 20, "keep_checkpoints": 2}
SECRET = "s3-creds"  # the S3 secret of the TrainJob's namespace


def make_tokens(bucket: str, workdir: Path) -> str:
    """The bundled sample, tokenized by the real stage straight to S3: the fine-tune's input."""
    from prepline.engine import RunOptions, run_transform
    from prepline.sample import build_sample

    build_sample(str(workdir / "sample"), docs=300, files=2)
    uri = f"s3://{bucket}/tokenization"
    run_transform("tokenization", {"vocab_size": 320, "tokens_column": ""},
                  RunOptions(input=str(workdir / "sample"), output=uri, workers=1, progress=False))
    return uri


def body(tokens: str, output: str, num_nodes: int, run_id: str) -> dict:
    """The TrainJob exactly as prepline's fine-tune step builds it."""
    return trainjob_manifest(trainjob_name(run_id), "team-a", [tokens], output, PARAMS,
                             TrainJobOptions(num_nodes=num_nodes, s3_secret=SECRET, env={"OMP_NUM_THREADS": "1"}))


def run(job: dict, spawn, logs: Path, secrets: dict, **kw) -> JobResult:
    nodes = realise_trainjob(job)
    # every node gets the same secret references: resolve them once, in the job's namespace
    return run_nodes(nodes, spawn, logs, extra_env=resolve_env(nodes[0].env, secrets), **kw)


def losses(output: str) -> list[float]:
    text = open_location(output).read_text("metrics.jsonl") or ""
    return [json.loads(x)["loss"] for x in text.splitlines()]


def wait_for_checkpoint(output: str, step: int, procs: dict, timeout: float = 300) -> int:
    """Poll S3 until a checkpoint at ``step`` or later exists (the run is past it); return its step."""
    loc = open_location(output)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [s for s in list_checkpoints(loc) if s >= step]
        if done:
            return done[0]
        if any(p.poll() is not None for p in procs.values()):
            raise AssertionError(f"a node ended before the checkpoint at step {step}: {[p.poll() for p in procs.values()]}")
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint at step >= {step} within {timeout} s")


def drill(tokens: str, output: str, spawn, logs: Path, secrets: dict, kill: Callable[[dict], None],
          kill_after_step: int = 20, timeout: float = 600, **kw) -> tuple[JobResult, int]:
    """Run 2 nodes, kill trainer node 1 (``kill(procs)``) once a checkpoint at ``kill_after_step`` (or later) is on S3;
    return (the job's result, the last checkpoint's step on S3 after it)."""
    def on_start(procs: dict) -> None:
        wait_for_checkpoint(output, kill_after_step, procs)
        kill(procs)

    res = run(body(tokens, output, 2, "drill"), spawn, logs, secrets, timeout=timeout, on_start=on_start, **kw)
    steps = list_checkpoints(open_location(output))
    return res, steps[-1] if steps else 0


def summary_or_none(output: str) -> dict | None:
    return read_summary(output)


def summary(output: str) -> dict:
    s = read_summary(output)
    assert s is not None, f"no metrics.json in {output}"
    return s
