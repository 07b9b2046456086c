"""The training function: a causal LM trained on the Megatron token data of tokenization outputs.

:func:`train` reads the ``tokens/`` folders written by the tokenization stage (local paths or
``s3://`` URIs; :mod:`prepline.train.data`), trains a small GPT-style model
(:mod:`prepline.train.model`) or continues a base checkpoint (:mod:`prepline.train.models`), and
writes to ``output``::

    checkpoints/step-00000050/checkpoint.pt   model + optimizer + RNG state (torch.save, weights only)
    checkpoints/step-00000050/state.json      step, fingerprint, metrics so far (written last)
    model/config.json, model/model.pt         the final model (prepline.causal_lm format)
    model/tokenizer.json                      the tokenizer of the token data
    metrics.jsonl                             one line per step: loss, lr, tokens, tokens/s
    metrics.json                              the summary, written last: the run is complete

A restarted run resumes from its last checkpoint and ends with the same weights as an
uninterrupted run (the batch order is a function of the step and the seed; the optimizer and
RNG states are in the checkpoint; :mod:`prepline.train.checkpoints`). Deterministic on CPU for a
fixed thread count.

Under ``torchrun`` (``WORLD_SIZE`` > 1) the model is wrapped in DistributedDataParallel
(gloo on CPU, nccl on GPU): each rank takes its slice of every global batch and rank 0 writes.

Also here: the command line (``python -m prepline.train``, :func:`main`) and the local mode
(:func:`run_local`, a subprocess). Torch is imported inside the functions: ``prepline.train``
imports without the ``train`` extra.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, TextIO

from prepline import logs
from prepline.data_access import Location, open_location
from prepline.errors import ConfigError, RunFailed, exit_code
from prepline.train.checkpoints import (CHECKPOINTS, METRICS, METRICS_LINES, Progress, read_summary, resume, save_checkpoint,
                                        step_dir)
from prepline.train.config import TrainConfig
from prepline.train.data import TokenData
from prepline.train.models import MODEL_DIR, LoadedModel, load_base_model, logits, new_model, write_model

SUMMARY_FORMAT = "prepline.train.metrics"


def _say(out: TextIO | None, msg: str) -> None:
    logs.say(out, "prepline.train", msg)


@dataclass
class _Run:
    """What every step of :func:`train` shares."""

    cfg: TrainConfig
    data: TokenData
    out: Location
    output: str
    rank: int
    world: int
    distributed: bool
    fingerprint: str
    say: Callable[[str], None]
    t_start: float

    @property
    def seq_len(self) -> int:
        return self.data.seq_len


def train(
    inputs: list[str],
    output: str,
    params: dict | None = None,
    *,
    overwrite: bool = False,
    out: TextIO | None = None,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict:
    """Train on the token data of ``inputs`` into ``output``; returns the summary (metrics.json).

    ``on_step(step, record)`` is called after every optimizer step (rank 0); an exception from it
    stops the run like a crash would (the last checkpoint stays).
    """
    run = _prepare(inputs, output, TrainConfig.from_params(params or {}), out)
    done = _finished_run(run, overwrite)
    if done is not None:
        return done
    _clear_output(run, overwrite)
    workdir = tempfile.mkdtemp(prefix="prepline-train-")
    try:
        lm = _build_model(run, workdir)
        opt = _optimizer(run.cfg, lm.model)
        progress = _resume_or_start(run, lm, opt, overwrite)
        resumed_from = progress.step
        loop_seconds = _loop(run, lm, opt, progress, on_step)
        summary = _summary(run, lm, progress, resumed_from, loop_seconds)
        _write_result(run, lm, summary)
        return summary
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        _end_distributed(run)


def _prepare(inputs: list[str], output: str, cfg: TrainConfig, out: TextIO | None) -> _Run:
    """Check the inputs (before torch is imported: bad input fails in a moment), set torch up, fingerprint the run."""
    t_start = time.perf_counter()
    say = (lambda m: _say(out, m)) if int(os.environ.get("RANK", "0")) == 0 else (lambda m: None)
    data = TokenData(list(inputs), cfg.seq_len, cfg.mixed_tokenizers)

    import torch

    rank, world, distributed = _dist()
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size={cfg.batch_size} is not divisible by the {world} ranks", f"pass a multiple of {world}")
    torch.set_num_threads(cfg.threads or cpu_threads())
    torch.use_deterministic_algorithms(True)
    if len(data.vocabularies) > 1:
        say(f"the inputs use {len(data.vocabularies)} different tokenizers: training with separate vocabularies "
            f"(offsets {', '.join(str(v['offset']) for v in data.vocabularies)}; see model/tokenizers.json)")
    fingerprint = hashlib.sha256(json.dumps(
        {"config": cfg.fingerprint_dict(), "data": data.fingerprint(), "seq_len": data.seq_len, "world_batch": cfg.batch_size},
        sort_keys=True).encode()).hexdigest()
    return _Run(cfg, data, open_location(output), output, rank, world, distributed, fingerprint, say, t_start)


def _finished_run(run: _Run, overwrite: bool) -> dict | None:
    """The summary of a finished run of the same fingerprint with enough steps (nothing to do), else None."""
    prior = read_summary(run.output)
    if prior is None or overwrite:
        return None
    if prior.get("fingerprint") != run.fingerprint:
        raise ConfigError(f"{run.output} holds a finished training run with other inputs or parameters",
                          "use another output folder, or pass overwrite (--overwrite) to replace it")
    if prior.get("steps", 0) >= run.cfg.steps:
        run.say(f"{run.output} is already complete ({prior['steps']} steps, same inputs and parameters): nothing to do")
        return prior
    return None


def _clear_output(run: _Run, overwrite: bool) -> None:
    if overwrite and run.rank == 0:
        for rel in (CHECKPOINTS, MODEL_DIR, METRICS, METRICS_LINES):
            run.out.delete(rel)
    if run.distributed:
        import torch

        torch.distributed.barrier()


def _build_model(run: _Run, workdir: str) -> LoadedModel:
    """A new model, or the base checkpoint, checked against the data (vocabulary, context, tokenizer)."""
    import torch

    cfg, data, L = run.cfg, run.data, run.seq_len
    if cfg.base_model:
        lm = load_base_model(cfg.base_model, cfg, workdir)
        torch.manual_seed(cfg.seed)
    else:
        lm = new_model(cfg, data.vocab_size, L)
    if data.vocab_size > lm.vocab_size:
        raise ConfigError(f"the token data holds ids up to {data.vocab_size - 1} but the base model has {lm.vocab_size} ids",
                          "tokenize with the base model's tokenizer")
    if L > lm.max_seq_len:
        raise ConfigError(f"seq_len={L} is longer than the base model's {lm.max_seq_len} positions", f"pass seq_len <= {lm.max_seq_len}")
    if lm.tokenizer_sha256 and lm.tokenizer_sha256 != data.tokenizer_sha256:
        raise ConfigError(f"base model {cfg.base_model} was trained with another tokenizer than the token data's "
                          f"({lm.tokenizer_sha256[:12]} vs {str(data.tokenizer_sha256 or 'several')[:12]})",
                          "tokenize with the base model's tokenizer.json (the tokenization stage's 'tokenizer' parameter)")
    lm.model.train()
    return lm


def _optimizer(cfg: TrainConfig, model):
    """AdamW, no weight decay on biases and norms."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95))


def _resume_or_start(run: _Run, lm: LoadedModel, opt, overwrite: bool) -> Progress:
    progress = resume(run.out, run.fingerprint, run.cfg.steps, lm.model, opt, overwrite)
    if progress is not None:
        run.say(f"resuming from the checkpoint at step {progress.step} ({step_dir(progress.step)})")
        return progress
    nparams = sum(p.numel() for p in lm.model.parameters())
    run.say(f"training a {lm.kind} model ({nparams:,} parameters) on {run.data.num_windows:,} sequences of {run.seq_len} tokens "
            f"from {len(run.data.sources)} input(s), {run.cfg.steps} steps of {run.cfg.batch_size}, world size {run.world}")
    return Progress()


def _loop(run: _Run, lm: LoadedModel, opt, progress: Progress, on_step: Callable[[int, dict], None] | None) -> float:
    """The optimizer steps from ``progress.step + 1`` to ``steps``; returns the seconds spent here."""
    cfg, model = run.cfg, lm.model
    train_model = model
    if run.distributed:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
    per_rank = cfg.batch_size // run.world
    part = slice(run.rank * per_rank, (run.rank + 1) * per_rank)
    start = progress.step
    t_loop = time.perf_counter()
    for step in range(start + 1, cfg.steps + 1):
        t0, w0 = time.perf_counter(), run.data.wait_seconds
        lr, loss = _step(run, train_model, model, opt, step, part)
        dt = time.perf_counter() - t0
        progress.step = step
        progress.train_seconds += dt
        progress.tokens_seen += cfg.batch_size * run.seq_len
        rec = {"step": step, "loss": round(loss, 6), "lr": lr, "tokens": progress.tokens_seen, "seconds": round(dt, 4),
               "data_wait_s": round(run.data.wait_seconds - w0, 5),
               "tokens_per_s": round(cfg.batch_size * run.seq_len / dt, 1) if dt > 0 else None}
        progress.records.append(rec)
        if step % cfg.log_every == 0 or step == start + 1 or step == cfg.steps:
            run.say(f"step {step}/{cfg.steps} loss {loss:.4f} lr {lr:.3g} tokens {progress.tokens_seen:,} "
                    f"({rec['tokens_per_s'] or 0:,.0f} tokens/s)")
        if run.rank == 0 and (step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)):
            save_checkpoint(run.out, model, opt, progress, run.fingerprint, cfg.keep_checkpoints)
        if on_step is not None and run.rank == 0:
            on_step(step, rec)
    return time.perf_counter() - t_loop


def _step(run: _Run, train_model, model, opt, step: int, part: slice) -> tuple[float, float]:
    """One optimizer step on the batch of ``step``; returns (learning rate, loss averaged over the ranks)."""
    import torch

    cfg = run.cfg
    batch = torch.from_numpy(run.data.batch(step, cfg.batch_size, cfg.seed, part))
    if step < cfg.steps:
        run.data.prefetch(step + 1, cfg.batch_size, cfg.seed, part)  # remote inputs: read while this step computes
    lr = _lr_at(cfg, step)
    for g in opt.param_groups:
        g["lr"] = lr
    out = logits(train_model, batch[:, :-1])
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    value = loss.detach()
    if run.distributed:
        torch.distributed.all_reduce(value)
        value = value / run.world
    loss_value = float(value)
    if not math.isfinite(loss_value):
        raise RunFailed(f"the loss is {loss_value} at step {step}", "lower lr, or raise warmup_steps / grad_clip")
    return lr, loss_value


def _lr_at(cfg: TrainConfig, step: int) -> float:
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _summary(run: _Run, lm: LoadedModel, progress: Progress, resumed_from: int, loop_seconds: float) -> dict:
    """What metrics.json holds (and :func:`train` returns)."""
    cfg, data = run.cfg, run.data
    losses = [r["loss"] for r in progress.records]
    tail = losses[-min(10, len(losses)):]
    secs = progress.train_seconds
    return {
        "format": SUMMARY_FORMAT,
        "fingerprint": run.fingerprint,
        "steps": cfg.steps,
        "resumed_from": resumed_from,
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "final_loss_mean10": round(sum(tail) / len(tail), 6),
        "min_loss": min(losses),
        "tokens_seen": progress.tokens_seen,
        "tokens_per_s": round(progress.tokens_seen / secs, 1) if secs else None,
        "data_wait_seconds": round(data.wait_seconds, 3),  # this process's steps waiting for their batch
        "data_wait_share": round(data.wait_seconds / loop_seconds, 4) if loop_seconds else None,
        "data_reads": data.stream_stats(),
        "train_seconds": round(secs, 3),
        "seconds_this_process": round(time.perf_counter() - run.t_start, 3),
        "loop_seconds_this_process": round(loop_seconds, 3),
        "seq_len": run.seq_len,
        "batch_size": cfg.batch_size,
        "world_size": run.world,
        **({"ranks": _ranks(run, progress, resumed_from)} if run.distributed else {}),
        "sequences_available": data.num_windows,
        "epochs": round(cfg.steps * cfg.batch_size / data.num_windows, 4),
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "model_kind": lm.kind,
        "inputs": [s.uri for s in data.sources],
        "output": run.out.uri,
        "model": run.out.path(MODEL_DIR),
        "tokenizer_sha256": data.tokenizer_sha256,
        "vocabularies": len(data.vocabularies),
        "vocab_size": lm.vocab_size,
        "config": cfg.to_dict(),
    }


def _ranks(run: _Run, progress: Progress, resumed_from: int) -> list[dict]:
    """Every rank's own account (a collective: all ranks call it): its node (torchrun's GROUP_RANK), host and
    the steps it took part in, so the summary shows that each rank trained."""
    import socket

    import torch

    mine = {"rank": run.rank, "node_rank": int(os.environ.get("GROUP_RANK", "0")),
            "host": os.environ.get("HOSTNAME") or socket.gethostname(), "steps": progress.step - resumed_from,
            "batch_per_step": run.cfg.batch_size // run.world}
    gathered: list = [None] * run.world
    torch.distributed.all_gather_object(gathered, mine)
    return gathered


def _write_result(run: _Run, lm: LoadedModel, summary: dict) -> None:
    """Rank 0 writes the model (with the tokenizer files), then metrics.json last."""
    if run.rank == 0:
        data = run.data
        extra = {"tokenizer_sha256": data.tokenizer_sha256, "eos_id": data.eos_id, "vocabularies": data.vocabularies, "trained": {
            k: summary[k] for k in ("steps", "final_loss", "tokens_seen", "inputs", "seq_len")}}
        write_model(run.out, lm, lm.model, extra, data.tokenizer_files())
        run.out.write_bytes(METRICS, (json.dumps(summary, indent=2) + "\n").encode())
        run.say(f"done: loss {summary['initial_loss']:.4f} -> {summary['final_loss']:.4f}, {summary['tokens_seen']:,} tokens, "
                f"{summary['tokens_per_s'] or 0:,.0f} tokens/s; model in {summary['model']}")
    if run.distributed:
        import torch

        torch.distributed.barrier()


def _end_distributed(run: _Run) -> None:
    if run.distributed:
        import torch

        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# the machine


def cpu_threads() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota (a pod's CPU limit),
    since torch's default (every core of the node) oversubscribes a limited container."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _dist():
    """(rank, world) and whether torch.distributed was initialised here (under torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), True


# ----------------------------------------------------------------------------------------------
# the command line (python -m prepline.train) and the local mode


def build_args(inputs: list[str], output: str, params: dict | None = None, overwrite: bool = False) -> list[str]:
    """The arguments of ``python -m prepline.train`` for these inputs (what local and cluster modes run)."""
    args: list[str] = []
    for uri in inputs:
        args += ["--input", uri]
    args += ["--output", output, "--params", json.dumps(params or {}, sort_keys=True, separators=(",", ":"))]
    return args + (["--overwrite"] if overwrite else [])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from prepline.errors import PreplineError

    ap = argparse.ArgumentParser(prog="python -m prepline.train",
                                 description="Train a causal LM on the Megatron token data of tokenization outputs.")
    ap.add_argument("--input", action="append", required=True, help="a tokenization output (path or s3:// URI); repeat for several")
    ap.add_argument("--output", required=True, help="folder or s3:// URI for checkpoints, the model and the metrics")
    ap.add_argument("--params", default="{}", help="training parameters as a JSON object (see docs/fine_tune.md)")
    ap.add_argument("--overwrite", action="store_true", help="replace a different run found in --output")
    a = ap.parse_args(argv)
    try:
        try:
            params = json.loads(a.params)
        except ValueError as e:
            raise ConfigError(f"--params is not valid JSON ({e})", 'pass a JSON object, e.g. {"steps": 100}') from None
        if not isinstance(params, dict):
            raise ConfigError("--params must be a JSON object", 'e.g. {"steps": 100, "lr": 0.001}')
        train(a.input, a.output, params, overwrite=a.overwrite)
    except PreplineError as e:
        print(f"error: {e.message}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr, flush=True)
        return exit_code(e)
    except KeyboardInterrupt:
        print("error: interrupted (the last checkpoint stays; run again to resume)", file=sys.stderr, flush=True)
        return 130
    return 0


def run_local(
    inputs: list[str],
    output: str,
    params: dict | None = None,
    *,
    overwrite: bool = False,
    timeout: float | None = None,
    out: TextIO | None = None,
    env: dict | None = None,
    python: str | None = None,
) -> dict:
    """Run the training function in a local subprocess (``python -m prepline.train``), streaming its
    log to ``out``; return the summary. A non-zero exit or ``timeout`` raises :class:`RunFailed`."""
    import subprocess
    import threading

    TrainConfig.from_params(params or {})  # a bad parameter fails here, before a process starts
    cmd = [python or sys.executable, "-m", "prepline.train", *build_args(inputs, output, params, overwrite)]
    out = out or sys.stdout
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.daemon = True
        timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            tail = (tail + [line.rstrip()])[-40:]
        rc = proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
    if timed_out.is_set():
        raise RunFailed(f"local training ran longer than {timeout:.0f}s and was stopped (its checkpoints stay in {output})",
                        "raise the timeout (the next run resumes from the last checkpoint), or lower steps")
    if rc != 0:
        errs = [ln for ln in tail if ln.startswith(("error:", "  fix:"))] or tail[-5:]
        raise RunFailed(f"local training exited with code {rc}: " + " ".join(e.strip() for e in errs), "see the log above")
    summary = read_summary(output)
    if summary is None:
        raise RunFailed(f"local training exited 0 but wrote no {METRICS} in {output}", "see the log above")
    return summary



__all__ = ["TrainConfig", "build_args", "cpu_threads", "main", "read_summary", "run_local", "train"]
