"""CausalLM.decoder: generation with a key/value cache gives each row the logits a full forward of
its own sequence gives, for prompts of different lengths, also after rows leave the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from prepline.train.model import CausalLM, ModelConfig  # noqa: E402


def test_cached_steps_match_full_forwards():
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(vocab_size=50, max_seq_len=40, n_layer=2, n_head=2, d_model=16)).eval()
    seqs = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    with torch.inference_mode():
        dec = model.decoder(seqs, 6)
        for step in range(6):
            for r, seq in enumerate(seqs):
                assert torch.allclose(model(torch.tensor([seq]))[0, -1], dec.logits[r], atol=1e-5), (step, r)
            tokens = dec.logits.argmax(-1)
            for r, seq in enumerate(seqs):
                seq.append(int(tokens[r]))
            if step == 2:  # the middle row is done: it leaves the batch
                dec.keep(torch.tensor([0, 2]))
                seqs, tokens = [seqs[0], seqs[2]], tokens[[0, 2]]
            dec.push(tokens)


def test_a_batch_longer_than_the_positions_is_refused():
    model = CausalLM(ModelConfig(vocab_size=10, max_seq_len=8, n_layer=1, n_head=1, d_model=8)).eval()
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model.decoder([[1, 2, 3]], 6)
