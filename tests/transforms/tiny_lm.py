"""A tiny causal LM for the tests that generate text (synthesize): a byte-level BPE trained on the
given texts and a one-layer prepline CausalLM with random weights, saved as fine_tune saves a model."""

from __future__ import annotations

import json
from pathlib import Path


def make_model(folder: Path, texts: list[str], seq: int = 96) -> Path:
    """A prepline model folder (config.json, model.pt, tokenizer.json) with random weights."""
    import torch

    from prepline.tokens.tokenizer import train_bpe
    from prepline.train.model import FORMAT, FORMAT_VERSION, CausalLM, ModelConfig

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(texts, 320)
    (folder / "tokenizer.json").write_text(tok.to_str())
    torch.manual_seed(3)
    mc = ModelConfig(vocab_size=tok.get_vocab_size(), max_seq_len=seq, n_layer=1, n_head=2, d_model=32)
    torch.save(CausalLM(mc).state_dict(), folder / "model.pt")
    (folder / "config.json").write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": mc.to_dict()}))
    return folder
