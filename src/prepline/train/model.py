"""A small GPT-style causal language model in plain torch, defined by a :class:`ModelConfig`.

Pre-LayerNorm decoder blocks (causal multi-head self-attention through
``torch.nn.functional.scaled_dot_product_attention``, a GELU MLP), learned position
embeddings, and an output head tied to the token embedding by default. ``forward(ids)`` returns
logits of shape ``(batch, seq, vocab_size)``; :func:`lm_loss` is the next-token cross-entropy.

Our checkpoint format (``save_model`` / ``load_model``): a folder with ``config.json``
(``{"format": "prepline.causal_lm", "version": 1, "model": {...ModelConfig...}, ...}``) and
``model.pt`` (the ``state_dict``, loadable with ``torch.load(..., weights_only=True)``).
Torch is imported by this module: import it only where torch is installed (the ``train`` extra).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from prepline.errors import ConfigError

FORMAT = "prepline.causal_lm"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    max_seq_len: int = 256
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    d_ff: int = 0  # 0: 4 * d_model
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "n_layer", "n_head", "d_model"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model {name}={getattr(self, name)} must be >= 1", f"pass {name} >= 1")
        if self.d_model % self.n_head:
            raise ConfigError(f"model d_model={self.d_model} is not a multiple of n_head={self.n_head}",
                              "pick d_model divisible by n_head, e.g. d_model=128, n_head=4")
        if self.d_ff < 0 or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model d_ff={self.d_ff} / dropout={self.dropout} out of range", "d_ff >= 0 (0 = 4*d_model), 0 <= dropout < 1")

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"model config has unknown key(s) {', '.join(unknown)}", f"known keys: {', '.join(sorted(known))}")
        return cls(**d)


class _Block(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_head, self.dropout = c.n_head, c.dropout
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, c.ff)
        self.out = nn.Linear(c.ff, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class CausalLM(nn.Module):
    """GPT-style decoder: ``forward(ids[b, t]) -> logits[b, t, vocab_size]``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.tok.weight
        self.apply(self._init)
        # GPT-2 style: scale the residual projections by depth
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than max_seq_len={self.config.max_seq_len}")
        x = self.drop(self.tok(ids) + self.pos(torch.arange(t, device=ids.device)))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (``targets`` are the inputs shifted by one)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
