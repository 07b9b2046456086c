"""The fine_tune component: train a causal LM on the run's token shards, locally or as a TrainJob.

A thin, typed KFP lightweight component (like :mod:`prepline.components.ray_stage`): its body
imports prepline and calls :func:`prepline.train.step.fine_tune`, where the logic lives and is
tested without KFP. It runs in the trainer image (the Ray image plus torch and kfp):
``mode='local'`` trains in a subprocess of the step, ``mode='cluster'`` creates a Kubeflow Trainer
TrainJob whose nodes run the same image.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Model, Output

from prepline.images import TRAINER_IMAGE

_component = dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)


@_component
def fine_tune(
    mode: str,
    work_root: str,
    run_id: str,
    languages: list,
    train_languages: list,
    train_params_json: str,
    trainjob_json: str,
    s3_secret_name: str,
    timeout_seconds: int,
    model: Output[Model],
    metrics: Output[Metrics],
    summary: Output[Markdown],
    trainer_image: str = "",
    defaults_json: str = "{}",
) -> NamedTuple("FineTuned", [("model_uri", str), ("final_loss", float)]):
    """Train a causal LM on the token shards of the run's tokenization outputs (one per language of
    train_languages, or of languages when that is empty) into <work_root>/<run>/fine_tune: locally
    (mode='local', a subprocess) or as a Kubeflow Trainer TrainJob (mode='cluster', options in
    trainjob_json). The final model is copied into the Model artifact; Metrics get the final loss,
    the tokens seen and tokens/s. A restarted step resumes from the last checkpoint. train_params_json
    is merged over defaults_json (a pipeline spec's train.params)."""
    from collections import namedtuple

    from prepline.data_access import open_location
    from prepline.pipelines.steps import train_params
    from prepline.train.step import fine_tune as run, summary_markdown

    s = run(mode, work_root, run_id, languages, train_languages, train_params(defaults_json, train_params_json), trainjob_json,
            s3_secret_name, timeout_seconds, image=trainer_image)
    src = open_location(s["model"])
    dst = open_location(model.path)
    for f in src.list_all():
        dst.write_bytes(f.rel, src.read_bytes(f.rel))
    model.metadata.update({"source_uri": s["model"], "model_kind": s["model_kind"], "parameters": s["parameters"],
                           "steps": s["steps"], "seq_len": s["seq_len"], "vocab_size": s["vocab_size"],
                           "languages": ",".join(s["languages"]), "tokenizer_sha256": s.get("tokenizer_sha256") or ""})
    for k in ("initial_loss", "final_loss", "final_loss_mean10", "tokens_seen", "tokens_per_s", "steps", "train_seconds", "parameters"):
        if s.get(k) is not None:
            metrics.log_metric(k, s[k])
    with open(summary.path, "w") as fh:
        fh.write(summary_markdown(s))
    out = namedtuple("FineTuned", ["model_uri", "final_loss"])
    return out(s["model"], float(s["final_loss"]))


COMPONENTS = {"fine_tune": fine_tune}
