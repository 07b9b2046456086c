"""The training parameters (:class:`TrainConfig`): one frozen, documented dataclass, as for transforms."""

from __future__ import annotations

from dataclasses import dataclass

from prepline.config import TransformConfig, param
from prepline.errors import ConfigError

# parameters that do not change what is computed (a resumed run may change them)
_RUN_ONLY = ("steps", "checkpoint_every", "keep_checkpoints", "log_every", "threads")


@dataclass(frozen=True)
class TrainConfig(TransformConfig):
    steps: int = param(200, "optimizer steps to train (a finished run continues when raised)", min=1)
    batch_size: int = param(8, "sequences per optimizer step (global: split across ranks under torchrun)", min=1)
    lr: float = param(1e-3, "peak learning rate (AdamW)", min=0.0, min_exclusive=True)
    lr_schedule: str = param("cosine", "learning-rate schedule after the warm-up", choices=("cosine", "constant"))
    min_lr_ratio: float = param(0.1, "cosine schedule: the final learning rate as a fraction of lr", min=0.0, max=1.0)
    warmup_steps: int = param(0, "steps of linear learning-rate warm-up from 0", min=0)
    weight_decay: float = param(0.0, "AdamW weight decay", min=0.0)
    grad_clip: float = param(1.0, "clip the gradient norm to this (0: no clipping)", min=0.0)
    seq_len: int = param(1024, "tokens per training sequence: windows of seq_len + 1 tokens cut from each input's token stream", min=8)
    seed: int = param(42, "seed of the model initialisation, the batch order and dropout", min=0)
    mixed_tokenizers: str = param(
        "error", "inputs tokenized with different tokenizers: 'error', or 'separate' (one vocabulary after the other: "
        "each tokenizer's ids are offset by the sizes of the ones before it)", choices=("error", "separate"))
    base_model: str = param(
        "", "'' to train a new model from the model_* parameters; or a path / s3:// URI of a prepline model folder "
        "(config.json + model.pt), of a state_dict file (.pt; the architecture from the model_* parameters), "
        "or of a Hugging Face checkpoint folder (needs transformers)")
    model_layers: int = param(2, "new model: decoder blocks", min=1, max=256)
    model_heads: int = param(4, "new model: attention heads per block", min=1, max=256)
    model_dim: int = param(128, "new model: embedding width (a multiple of model_heads)", min=8, max=65536)
    model_ff: int = param(0, "new model: MLP width; 0: 4 * model_dim", min=0)
    dropout: float = param(0.0, "new model: dropout probability", min=0.0, max=0.9)
    tie_embeddings: bool = param(True, "new model: the output head shares the token embedding")
    checkpoint_every: int = param(100, "write a checkpoint every this many steps (and always at the end); 0: only at the end", min=0)
    keep_checkpoints: int = param(2, "checkpoints kept (the oldest are deleted)", min=1)
    log_every: int = param(10, "print a progress line every this many steps", min=1)
    threads: int = param(0, "torch CPU threads; 0: the CPUs the process may use (affinity, capped by the container's CPU limit)", min=0)

    def validate(self) -> None:
        if self.model_dim % self.model_heads:
            raise ConfigError(f"model_dim={self.model_dim} is not a multiple of model_heads={self.model_heads}",
                              "pick model_dim divisible by model_heads, e.g. model_dim=128, model_heads=4")
        if self.base_model != self.base_model.strip():
            raise ConfigError(f"base_model={self.base_model!r} has leading or trailing white space", "remove it")

    def fingerprint_dict(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in _RUN_ONLY}
