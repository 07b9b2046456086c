"""The checkpoints of a training run: what lets a restarted run end with the same weights.

``<output>/checkpoints/step-<8 digits>/checkpoint.pt`` holds the model, optimizer and torch RNG
states (``torch.save``, loadable with ``weights_only=True``); ``state.json`` beside it (written
last: a checkpoint without it is incomplete) holds the step, the run's fingerprint and the
metrics so far. Only the ``keep`` newest are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from prepline.data_access import Location, open_location
from prepline.errors import ConfigError
from prepline.train.models import save_bytes, torch_load

CHECKPOINTS = "checkpoints"
CHECKPOINT_FILE = "checkpoint.pt"
STATE_FILE = "state.json"
METRICS = "metrics.json"
METRICS_LINES = "metrics.jsonl"


@dataclass
class Progress:
    """Where a run stands: the last step done, the per-step records, tokens and seconds so far."""

    step: int = 0
    records: list = field(default_factory=list)
    tokens_seen: int = 0
    train_seconds: float = 0.0


def step_dir(step: int) -> str:
    return f"{CHECKPOINTS}/step-{step:08d}"


def list_checkpoints(out: Location) -> list[int]:
    """The steps of the complete checkpoints (those with state.json), in order."""
    steps = set()
    for f in out.list_all(CHECKPOINTS):
        parts = f.rel.split("/")
        if len(parts) == 3 and parts[2] == STATE_FILE and parts[1].startswith("step-") and parts[1][5:].isdigit():
            steps.add(int(parts[1][5:]))
    return sorted(steps)


def save_checkpoint(out: Location, model, opt, progress: Progress, fingerprint: str, keep: int) -> None:
    """Write the checkpoint of ``progress.step`` (state.json last), the metrics lines, and drop old ones."""
    import torch

    d = step_dir(progress.step)
    out.write_bytes(f"{d}/{CHECKPOINT_FILE}", save_bytes(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": progress.step}))
    state = {"step": progress.step, "fingerprint": fingerprint, "metrics": progress.records, "tokens_seen": progress.tokens_seen,
             "train_seconds": progress.train_seconds}
    out.write_bytes(f"{d}/{STATE_FILE}", json.dumps(state).encode())
    out.write_bytes(METRICS_LINES, "".join(json.dumps(r) + "\n" for r in progress.records).encode())
    kept = {step_dir(k) for k in list_checkpoints(out)[-keep:]}
    for old in sorted({"/".join(f.rel.split("/")[:2]) for f in out.list_all(CHECKPOINTS)} - kept):
        out.delete(old)  # older ones, and any a killed run left half-written


def resume(out: Location, fingerprint: str, steps: int, model, opt, overwrite: bool) -> Progress | None:
    """Load the newest checkpoint of this run into ``model`` and ``opt`` (and the RNG); None when there is none.

    A checkpoint of another run (another fingerprint) is an error, or skipped with ``overwrite``.
    """
    import torch

    for step in reversed(list_checkpoints(out)):
        state = json.loads(out.read_bytes(f"{step_dir(step)}/{STATE_FILE}"))
        if state.get("fingerprint") != fingerprint:
            if overwrite:
                continue
            raise ConfigError(f"{out.uri} holds checkpoints of a training run with other inputs or parameters",
                              "use another output folder, or pass overwrite (--overwrite) to start over")
        if step > steps:
            raise ConfigError(f"{out.uri} has a checkpoint at step {step}, past steps={steps}", f"pass steps >= {step}, or overwrite")
        ck = torch_load(out.read_bytes(f"{step_dir(step)}/{CHECKPOINT_FILE}"), f"checkpoint {step}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        return Progress(step, state["metrics"], state["tokens_seen"], state["train_seconds"])
    return None


def read_summary(output: str) -> dict | None:
    """The summary (metrics.json) of a finished run in ``output``, or None."""
    text = open_location(output).read_text(METRICS)
    return json.loads(text) if text else None
