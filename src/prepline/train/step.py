"""What the ``fine_tune`` KFP component does, as a plain function (tested without KFP).

Inputs are the tokenization outputs of the run's language branches, found by their
deterministic paths (``stages.stage_output(work_root, run_id, "tokenization", lang)``); the output
is ``<work_root>/<run>/fine_tune``. ``mode='local'`` runs the training function in a local
subprocess; ``mode='cluster'`` runs it as a Kubeflow Trainer TrainJob.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TextIO

from prepline import logs
from prepline.errors import ConfigError

STAGE = "fine_tune"
INPUT_STAGE = "tokenization"


def _json(name: str, text, default):
    if isinstance(text, type(default)):
        return text
    if text in ("", None):
        return default
    try:
        v = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"parameter {name} is not valid JSON ({e})", f"pass {name} as JSON, e.g. {json.dumps(default)}") from None
    if not isinstance(v, type(default)):
        raise ConfigError(f"parameter {name} must be a JSON {type(default).__name__}, got {type(v).__name__}", f"e.g. {json.dumps(default)}")
    return v


def plan(work_root: str, run_id: str, languages, train_languages=None, input_stage: str = INPUT_STAGE) -> dict:
    """The inputs (one tokenization output per language) and the output of the step."""
    from prepline.stages import stage_output

    if not work_root:
        raise ConfigError("work_root is empty", "pass the folder or s3:// URI where stage outputs go")
    langs = _json("train_languages", train_languages, []) or _json("languages", languages, [])
    if not langs or not all(isinstance(lang, str) and lang for lang in langs):
        raise ConfigError(f"no languages to train on ({langs!r})", 'pass train_languages (or languages) as a JSON list, e.g. ["en"]')
    langs = list(dict.fromkeys(langs))
    return {"languages": langs, "inputs": [stage_output(work_root, run_id, input_stage, lang) for lang in langs],
            "output": stage_output(work_root, run_id, STAGE)}


def fine_tune(
    mode: str,
    work_root: str,
    run_id: str,
    languages,
    train_languages=None,
    params_json: str | dict = "{}",
    trainjob_json: str | dict = "{}",
    s3_secret_name: str = "",
    timeout: float = 86400,
    out: TextIO | None = None,
    image: str = "",
) -> dict:
    """Train on the run's tokenization outputs; returns the summary (metrics.json) plus ``languages``.
    ``image`` is the TrainJob's image unless trainjob_json names one (the pipeline's trainer_image)."""
    from prepline.train.train import TrainConfig, run_local

    out = out or sys.stdout
    p = plan(work_root, run_id, languages, train_languages)
    params = _json("train_params_json", params_json, {})
    TrainConfig.from_params(params)  # a bad parameter fails before anything starts
    if timeout <= 0:
        raise ConfigError(f"timeout={timeout} must be > 0", "pass timeout_seconds, e.g. 86400")
    logs.say(out, "prepline.train", f"fine_tune ({mode}): {', '.join(p['languages'])} -> {p['output']}")
    if mode == "local":
        summary = run_local(p["inputs"], p["output"], params, timeout=timeout, out=out)
    elif mode == "cluster":
        from prepline.clusters.base import LABEL_MANAGED, LABEL_RUN, LABEL_STAGE
        from prepline.stages import run_key
        from prepline.train.trainjob import TrainJobOptions, run_trainjob, trainjob_name

        opts = TrainJobOptions.from_json(trainjob_json)
        if s3_secret_name and not opts.s3_secret:
            opts = replace(opts, s3_secret=s3_secret_name)
        if image and not opts.image:
            opts = replace(opts, image=image)
        labels = {LABEL_MANAGED: "true", LABEL_RUN: run_key(run_id)[:63], LABEL_STAGE: "fine-tune"}
        summary = run_trainjob(p["inputs"], p["output"], params, opts, trainjob_name(run_key(run_id)), labels=labels,
                               timeout=timeout, out=out)
    else:
        raise ConfigError(f"mode={mode!r} is not 'local' or 'cluster'", "use 'local' (a subprocess) or 'cluster' (a Kubeflow Trainer TrainJob)")
    return {**summary, "languages": p["languages"]}


def summary_markdown(s: dict) -> str:
    rows = [("languages", ", ".join(s.get("languages", []))), ("model", f"`{s['model']}`"), ("model kind", s["model_kind"]),
            ("parameters", f"{s['parameters']:,}"), ("steps", f"{s['steps']:,} (resumed from {s['resumed_from']})"),
            ("loss: first step -> last", f"{s['initial_loss']:.4f} -> {s['final_loss']:.4f}"),
            ("loss: mean of the last 10 steps", f"{s['final_loss_mean10']:.4f}"), ("tokens seen", f"{s['tokens_seen']:,}"),
            ("tokens/s", f"{s['tokens_per_s'] or 0:,.0f}"), ("sequences available", f"{s['sequences_available']:,} x {s['seq_len']} tokens"),
            ("epochs", f"{s['epochs']:.3f}"), ("vocabularies", str(s.get("vocabularies", 1)))]
    return "## fine_tune\n\n| measure | value |\n|---|---:|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
