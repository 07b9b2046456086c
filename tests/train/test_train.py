"""The training function on real tokens: loss goes down, a resumed run ends where an uninterrupted
one does, the local mode runs it in a subprocess, bad input fails clearly."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from prepline.engine import RunOptions, run_transform  # noqa: E402
from prepline.errors import ConfigError, InputError, RunFailed  # noqa: E402
from prepline.train import run_local, train  # noqa: E402
from prepline.train.data import TokenData  # noqa: E402
from prepline.train.models import load_trained  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: small and fast on 2 CPUs: a 320-id byte-level BPE, 64-token sequences, a 2-block model of width 64
TOK = {"vocab_size": 320, "tokens_column": ""}
FAST = {"threads": 1, "model_dim": 64, "batch_size": 16, "lr": 0.01, "warmup_steps": 5, "log_every": 8, "seq_len": 64}


def _tokenize(src: Path, out: Path, **params) -> Path:
    run_transform("tokenization", {**TOK, **params}, RunOptions(input=str(src), output=str(out), workers=1, progress=False))
    return out


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    """The Megatron token data of a real multilingual sample (prepline.sample), tokenized by the real stage."""
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("train")
    build_sample(str(root / "sample"), docs=300, files=2)
    return _tokenize(root / "sample", root / "tokenization")


def _weights(path) -> dict:
    return load_trained(str(path)).state_dict()


@pytest.mark.slow
def test_loss_goes_down_on_real_tokens(tokens, tmp_path):
    out = tmp_path / "ft"
    log = io.StringIO()
    s = train([str(tokens)], str(out), {**FAST, "steps": 48}, out=log)
    assert s["final_loss"] <= 0.8 * s["initial_loss"], s
    assert s["steps"] == 48 and s["tokens_seen"] == 48 * 16 * 64 and s["tokens_per_s"] > 0
    assert s["seq_len"] == 64 and s["vocab_size"] == json.loads((tokens / "tokens" / "index.json").read_text())["vocab_size"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 49)) and lines[-1]["loss"] == s["final_loss"]
    assert "step 48/48" in log.getvalue() and "done: loss" in log.getvalue()
    # the final model: our format, with the token data's tokenizer, loads back and predicts
    conf = json.loads((out / "model" / "config.json").read_text())
    assert conf["format"] == "prepline.causal_lm" and conf["model"]["vocab_size"] == s["vocab_size"]
    assert (out / "model" / "tokenizer.json").read_bytes() == (tokens / "tokens" / "tokenizer.json").read_bytes()
    model = load_trained(str(out))
    ids = torch.from_numpy(np.array(TokenData([str(tokens)], 64).sources[0].stream[:128], np.int64).reshape(2, 64))
    assert model(ids).shape == (2, 64, s["vocab_size"])
    print(f"\nloss {s['initial_loss']:.3f} -> {s['final_loss']:.3f} ({s['final_loss'] / s['initial_loss']:.3f}x); tokens/s on this "
          f"machine: {s['tokens_per_s']:,.0f} ({s['parameters']:,} parameters, batch 16 x 64, 1 thread)")


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_same_weights(tokens, tmp_path):
    p = {**FAST, "steps": 24, "checkpoint_every": 8, "keep_checkpoints": 2, "batch_size": 8}
    whole = train([str(tokens)], str(tmp_path / "whole"), p, out=io.StringIO())

    class Crash(Exception):
        pass

    def crash(step, rec):
        if step == 13:
            raise Crash()

    with pytest.raises(Crash):
        train([str(tokens)], str(tmp_path / "cut"), p, out=io.StringIO(), on_step=crash)
    assert sorted(os.listdir(tmp_path / "cut" / "checkpoints")) == ["step-00000008"]
    assert not (tmp_path / "cut" / "metrics.json").exists()
    log = io.StringIO()
    resumed = train([str(tokens)], str(tmp_path / "cut"), p, out=log)
    assert "resuming from the checkpoint at step 8" in log.getvalue()
    assert resumed["resumed_from"] == 8 and resumed["final_loss"] == whole["final_loss"]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "whole" / "metrics.jsonl").read_text() != ""
    losses = lambda d: [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(tmp_path / "whole") == losses(tmp_path / "cut")
    assert sorted(os.listdir(tmp_path / "cut" / "checkpoints")) == ["step-00000016", "step-00000024"]
    # done: a rerun does nothing; more steps continue from the last checkpoint
    again = io.StringIO()
    assert train([str(tokens)], str(tmp_path / "cut"), p, out=again)["final_loss"] == whole["final_loss"]
    assert "already complete" in again.getvalue()
    more = train([str(tokens)], str(tmp_path / "cut"), {**p, "steps": 26}, out=io.StringIO())
    assert more["resumed_from"] == 24 and more["steps"] == 26
    # another run's output is not resumed
    with pytest.raises(ConfigError, match="other inputs or parameters"):
        train([str(tokens)], str(tmp_path / "cut"), {**p, "lr": 0.02}, out=io.StringIO())


@pytest.mark.slow  # the module's token fixture builds a sample (~15 s)
def test_windows_recut_the_stream_for_any_seq_len(tokens):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    # the stream: every document of megatron-core's own reading of the .bin/.idx, one after the other
    ds = IndexedDataset(str(tokens / "tokens" / "text_document"))
    stream = np.concatenate([ds[i] for i in range(len(ds))])
    for L in (16, 64, 100, 150):
        d = TokenData([str(tokens)], L)
        assert d.num_windows == (stream.size - 1) // L
        out = np.empty(L + 1, np.int64)
        for k in (0, 1, d.num_windows // 2, d.num_windows - 1):
            d.window(k, out)
            assert np.array_equal(out, stream[k * L : k * L + L + 1])
    # the batch order is a seeded function of the step: the same batch twice, another for another step
    d = TokenData([str(tokens)], 32)
    assert np.array_equal(d.batch(5, 4, seed=1), TokenData([str(tokens)], 32).batch(5, 4, seed=1))
    assert not np.array_equal(d.batch(5, 4, seed=1), d.batch(6, 4, seed=1))
    assert np.array_equal(d.batch(5, 4, seed=1, part=slice(2, 4)), d.batch(5, 4, seed=1)[2:])


@pytest.mark.slow
def test_local_mode_runs_the_cli_in_a_subprocess(tokens, tmp_path):
    log = io.StringIO()
    s = run_local([str(tokens)], str(tmp_path / "ft"), {**FAST, "steps": 4, "log_every": 1}, out=log)
    assert s["steps"] == 4 and (tmp_path / "ft" / "model" / "model.pt").is_file()
    assert "prepline.train: step 4/4" in log.getvalue()
    with pytest.raises(RunFailed, match="does not exist: not a tokenization output"):
        run_local([str(tmp_path / "nothing")], str(tmp_path / "ft2"), {"steps": 2}, out=io.StringIO())
    with pytest.raises(ConfigError, match="unknown parameter"):  # before any process starts
        run_local([str(tokens)], str(tmp_path / "ft3"), {"stepz": 2})
    with pytest.raises(RunFailed, match="longer than 1s and was stopped"):
        run_local([str(tokens)], str(tmp_path / "ft4"), {**FAST, "steps": 10_000}, out=io.StringIO(), timeout=1)


@pytest.mark.slow
def test_continues_a_base_checkpoint_ours_a_state_dict_or_clearly_not_hf(tokens, tmp_path):
    base = train([str(tokens)], str(tmp_path / "base"), {**FAST, "steps": 3}, out=io.StringIO())
    ours = train([str(tokens)], str(tmp_path / "ours"), {**FAST, "steps": 3, "base_model": str(tmp_path / "base" / "model")},
                 out=io.StringIO())
    assert ours["model_kind"] == "prepline" and ours["initial_loss"] < base["initial_loss"]
    sd_path = tmp_path / "weights.pt"
    torch.save(load_trained(str(tmp_path / "base")).state_dict(), sd_path)
    sd = train([str(tokens)], str(tmp_path / "sd"), {**FAST, "steps": 3, "base_model": str(sd_path)}, out=io.StringIO())
    assert sd["model_kind"] == "state_dict" and sd["initial_loss"] == ours["initial_loss"]
    weights = torch.load(sd_path, weights_only=True)
    del weights["ln_f.bias"]
    torch.save(weights, tmp_path / "broken.pt")
    with pytest.raises(ConfigError, match="do not fit the model.*ln_f.bias"):
        train([str(tokens)], str(tmp_path / "sd2"), {**FAST, "steps": 1, "base_model": str(tmp_path / "broken.pt")}, out=io.StringIO())
    torch.save({"w": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not the state_dict of a prepline CausalLM"):
        train([str(tokens)], str(tmp_path / "sd3"), {**FAST, "steps": 1, "base_model": str(tmp_path / "other.pt")}, out=io.StringIO())
    with pytest.raises(ConfigError, match="does not exist"):
        train([str(tokens)], str(tmp_path / "x"), {**FAST, "steps": 1, "base_model": str(tmp_path / "missing")}, out=io.StringIO())
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 400, "n_positions": 128, "n_embd": 32,
                                                "n_layer": 1, "n_head": 2, "architectures": ["GPT2LMHeadModel"]}))
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs the transformers package"):
            train([str(tokens)], str(tmp_path / "y"), {**FAST, "steps": 1, "base_model": str(hf)}, out=io.StringIO())
    else:  # with transformers (a scratch venv): a real tiny GPT-2, made here, is fine-tuned and saved
        from transformers import GPT2Config, GPT2LMHeadModel

        GPT2LMHeadModel(GPT2Config(vocab_size=400, n_positions=128, n_embd=32, n_layer=1, n_head=2)).save_pretrained(hf)
        s = train([str(tokens)], str(tmp_path / "y"), {**FAST, "steps": 4, "base_model": str(hf)}, out=io.StringIO())
        assert s["model_kind"] == "huggingface" and (tmp_path / "y" / "model" / "config.json").is_file()
        assert GPT2LMHeadModel.from_pretrained(tmp_path / "y" / "model").config.vocab_size == 400


@pytest.mark.slow  # the module's token fixture builds a sample (~15 s)
def test_no_tokens_and_too_few_tokens_are_clear_errors(tokens, tmp_path):
    # every document filtered out upstream: the tokenization output has no sequence
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(pa.table({"contents": pa.array([], pa.string())}), empty / "part-0.parquet")
    _tokenize(empty, tmp_path / "tok_empty", tokenizer=str(tokens / "tokens" / "tokenizer.json"))
    with pytest.raises(InputError, match="no tokens in .*every document was filtered out"):
        train([str(tmp_path / "tok_empty")], str(tmp_path / "o1"), {"steps": 1})
    # token data shorter than one training sequence
    with pytest.raises(InputError, match="shorter than one training sequence"):
        train([str(tokens)], str(tmp_path / "o2"), {"steps": 1, "seq_len": 10_000_000})
    with pytest.raises(InputError, match="not a tokenization output"):
        train([str(tmp_path / "nowhere")], str(tmp_path / "o3"), {"steps": 1})
    with pytest.raises(ConfigError, match="model_dim=100 is not a multiple of model_heads=3"):
        train([str(tokens)], str(tmp_path / "o4"), {"model_dim": 100, "model_heads": 3})
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_inputs_with_different_tokenizers(tokens, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    text = (Path(json.__file__).read_text() + Path(io.__file__).read_text()).split("\n\n")
    pq.write_table(pa.table({"contents": text}), src / "part-0.parquet")
    other = _tokenize(src, tmp_path / "other", vocab_size=300)  # its own BPE: other ids
    with pytest.raises(ConfigError, match="2 different tokenizers"):
        train([str(tokens), str(other)], str(tmp_path / "o"), {"steps": 1})
    s = train([str(tokens), str(other)], str(tmp_path / "o"), {**FAST, "steps": 2, "mixed_tokenizers": "separate"}, out=io.StringIO())
    listing = json.loads((tmp_path / "o" / "model" / "tokenizers.json").read_text())["vocabularies"]
    assert [v["offset"] for v in listing] == [0, listing[0]["vocab_size"]] and s["vocab_size"] == sum(v["vocab_size"] for v in listing)
    assert s["vocabularies"] == 2 and (tmp_path / "o" / "model" / "tokenizer-1.json").is_file()
    # the second input's ids are shifted past the first vocabulary
    d = TokenData([str(tokens), str(other)], 64, "separate")
    w = np.empty(65, np.int64)
    d.window(int(d.offsets[1]), w)
    assert w.min() >= listing[1]["offset"]


@pytest.mark.slow
@pytest.mark.s3
def test_reads_and_writes_s3(tokens, tmp_path, s3_bucket, monkeypatch):
    from prepline.data_access import open_location

    monkeypatch.setenv("PREPLINE_TOKEN_CACHE", str(tmp_path / "token-cache"))
    monkeypatch.setenv("PREPLINE_TOKEN_BLOCK_MB", "0.0625")  # 64 KiB blocks: several per input

    dst = open_location(f"s3://{s3_bucket}/run/lang=en/tokenization")
    for p in (tokens / "tokens").rglob("*"):
        if p.is_file():
            dst.write_bytes(f"tokens/{p.relative_to(tokens / 'tokens').as_posix()}", p.read_bytes())
    out = f"s3://{s3_bucket}/run/fine_tune"
    s = train([dst.uri], out, {**FAST, "steps": 3, "checkpoint_every": 2}, out=io.StringIO())
    loc = open_location(out)
    names = {f.rel for f in loc.list_all()}
    assert {"metrics.json", "metrics.jsonl", "model/model.pt", "model/config.json", "model/tokenizer.json",
            "checkpoints/step-00000003/checkpoint.pt"} <= names
    assert json.loads(loc.read_text("metrics.json"))["final_loss"] == s["final_loss"]
    local = train([str(tokens)], str(tmp_path / "local"), {**FAST, "steps": 3, "checkpoint_every": 2}, out=io.StringIO())
    assert local["final_loss"] == s["final_loss"]  # same data, same seed: same run wherever it is stored
    # read in ranges (not the whole .bin), through the node's cache: a second job reads nothing from S3
    reads = s["data_reads"]
    assert reads["remote_inputs"] == 1 and reads["gets"] >= 1 and 0 <= s["data_wait_share"] < 1
    again = train([dst.uri], f"s3://{s3_bucket}/run/fine_tune2", {**FAST, "steps": 3, "checkpoint_every": 2}, out=io.StringIO())
    assert again["data_reads"]["gets"] == 0 and again["data_reads"]["cache_hits"] > 0 and again["final_loss"] == s["final_loss"]
