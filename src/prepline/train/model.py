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
        return self.prefill(x)[0]

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The causal forward, and its keys and values (each (b, heads, t, d_head)) for a decoder's cache."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x))))), (k, v)

    def step(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], at: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """One new position per row (``x``: (b, 1, d)) at row positions ``at``: its key and value go
        into ``cache`` (keys, values: (b, heads, length, d_head)), and it attends to the positions
        ``valid`` marks ((b, length) bool: the row's earlier positions and itself)."""
        b, _, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, 1, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        keys, values = cache
        rows = torch.arange(b)
        keys[rows, :, at] = k[:, :, 0]
        values[rows, :, at] = v[:, :, 0]
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=valid[:, None, None, :])
        x = x + self.proj(a.transpose(1, 2).reshape(b, 1, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))



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

    def decoder(self, prompts: list[list[int]], new_tokens: int) -> "Decoder":
        """Incremental decoding of a batch of prompts (of any lengths) with a key/value cache."""
        return Decoder(self, prompts, new_tokens)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Decoder:
    """Generation with a key/value cache for a batch of prompts of different lengths: each prompt is
    run alone (an exact causal forward; its keys and values kept), then every step adds one token per
    row, each row at its own position, attending only to its own positions (a mask over the padded
    cache). ``logits``: each row's next-token logits; :meth:`push` appends one token per row;
    :meth:`keep` drops the rows that are done."""

    def __init__(self, model: CausalLM, prompts: list[list[int]], new_tokens: int):
        c = model.config
        self.model = model
        n, self.width = len(prompts), max(len(p) for p in prompts) + new_tokens
        if self.width > c.max_seq_len:
            raise ValueError(f"{self.width} positions (prompt and new tokens) are more than max_seq_len={c.max_seq_len}")
        dh = c.d_model // c.n_head
        self.cache = [(torch.zeros(n, c.n_head, self.width, dh), torch.zeros(n, c.n_head, self.width, dh)) for _ in model.blocks]
        self.lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        last = []
        for r, p in enumerate(prompts):
            x = model.tok(torch.tensor([p], dtype=torch.long)) + model.pos(torch.arange(len(p)))
            for blk, (keys, values) in zip(model.blocks, self.cache):
                x, (k, v) = blk.prefill(x)
                keys[r, :, :len(p)] = k[0]
                values[r, :, :len(p)] = v[0]
            last.append(model.head(model.ln_f(x[:, -1])))
        self.logits = torch.cat(last)

    def push(self, tokens: torch.Tensor) -> None:
        """Append one token per row (at the row's next position) and compute the next logits."""
        m = self.model
        at = self.lens.clamp(max=self.width - 1)
        x = m.tok(tokens[:, None]) + m.pos(at)[:, None]
        valid = torch.arange(self.width)[None, :] <= at[:, None]
        for blk, cache in zip(m.blocks, self.cache):
            x = blk.step(x, cache, at, valid)
        self.lens += 1
        self.logits = m.head(m.ln_f(x[:, 0]))

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices of the current rows, in order)."""
        self.cache = [(k[rows], v[rows]) for k, v in self.cache]
        self.lens, self.logits = self.lens[rows], self.logits[rows]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (``targets`` are the inputs shifted by one)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
