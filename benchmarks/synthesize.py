"""synthesize's generation throughput: new tokens per second by batch size and max_new_tokens, on
the engines that can run here (``scripts/bench.py --synthesize``).

The model is a prepline CausalLM with the shape given (random weights: throughput does not depend on
what the weights say, only on the shapes and on when rows stop, so every request runs to
``max_new_tokens``: the stop token is masked out), its tokenizer a byte-level BPE trained on the
bundled sample, the prompts the sample's documents in the ``wiki`` template. The torch engine runs
on the CPU; the vLLM engine where vLLM and a GPU are (it needs a Hugging Face folder: the same shape
as a GPT-2 config through ``transformers``), and the row says why it was skipped elsewhere.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


def _tokenizer(texts: list[str], folder: Path):
    from prepline.tokens.tokenizer import build_tokenizer, train_bpe

    (folder / "tokenizer.json").write_text(train_bpe(texts, 2048).to_str())
    return build_tokenizer(str(folder))


def _model(folder: Path, vocab: int, seq: int, layers: int, dim: int) -> int:
    import torch

    from prepline.train.model import FORMAT, FORMAT_VERSION, CausalLM, ModelConfig

    torch.manual_seed(0)
    mc = ModelConfig(vocab_size=vocab, max_seq_len=seq, n_layer=layers, n_head=max(1, dim // 64), d_model=dim)
    model = CausalLM(mc)
    torch.save(model.state_dict(), folder / "model.pt")
    (folder / "config.json").write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": mc.to_dict()}))
    return model.num_parameters()


def run(requests: int = 64, batch_tokens: tuple[int, ...] = (512, 2048, 8192), max_new: tuple[int, ...] = (32, 128),
        layers: int = 4, dim: int = 256, log=print) -> dict:
    import pyarrow.parquet as pq
    import torch

    from prepline.generation import Sampling, TorchEngine, vllm_missing
    from prepline.sample import build_sample

    torch.set_num_threads(1)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_sample(tmp / "sample", docs=300, files=1)
        texts = [t for f in sorted((tmp / "sample").glob("part-*.parquet")) for t in pq.read_table(f, columns=["contents"]).column(0).to_pylist() if t]
        (tmp / "model").mkdir()
        tok = _tokenizer(texts, tmp / "model")
        seq = 64 + max(max_new)
        params = _model(tmp / "model", tok.vocab_size, seq, layers, dim)
        head, tail = (tok.tokenizer.encode(p, add_special_tokens=False).ids
                      for p in "Rewrite the following text as a short, factual encyclopedia paragraph.\n\nText: {text}\n\nParagraph:".split("{text}"))
        body = [tok.tokenizer.encode(t, add_special_tokens=False).ids[:64 - len(head) - len(tail)] for t in texts[:requests]]
        prompts = [head + b + tail for b in body]
        log(f"[synthesize] model: {params:,} parameters ({layers} layers, d_model {dim}), {len(prompts)} prompts of "
            f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, 1 CPU thread")
        for new in max_new:
            for bt in batch_tokens:
                engine = TorchEngine(str(tmp / "model"), Sampling(new, 0.8, 50), stop_id=-1, batch_tokens=bt)  # never stops early
                t0 = time.perf_counter()
                out = engine.generate(prompts, list(range(len(prompts))))
                secs = time.perf_counter() - t0
                n = sum(map(len, out))
                rows.append({"engine": "torch (CPU)", "max_new_tokens": new, "batch_tokens": bt, "rows_per_batch": max(1, bt // (max(map(len, prompts)) + new)),
                             "new_tokens": n, "seconds": round(secs, 2), "tokens_per_s": round(n / secs, 1)})
                log(f"[synthesize] torch max_new_tokens={new} batch_tokens={bt}: {n:,} tokens in {secs:.1f} s ({n / secs:,.0f}/s)")
        why = vllm_missing()
        rows.append({"engine": "vllm (GPU)", "skipped": why} if why else _vllm_rows(tmp, tok, prompts, max_new, layers, dim, log))
    return {"params": params, "requests": len(prompts), "rows": rows}


def _vllm_rows(tmp: Path, tok, prompts, max_new, layers, dim, log) -> dict:  # pragma: no cover - needs a GPU
    from transformers import GPT2Config, GPT2LMHeadModel

    from prepline.generation import Sampling, VllmEngine

    hf = tmp / "hf"
    GPT2LMHeadModel(GPT2Config(vocab_size=tok.vocab_size, n_positions=64 + max(max_new), n_layer=layers, n_embd=dim,
                               n_head=max(1, dim // 64))).save_pretrained(hf)
    (hf / "tokenizer.json").write_text(tok.json_text)
    out = {}
    for new in max_new:
        engine = VllmEngine(str(hf), Sampling(new, 0.8, 50), stop_id=-1, seed=0)
        t0 = time.perf_counter()
        n = sum(map(len, engine.generate(prompts, list(range(len(prompts))))))
        out[new] = round(n / (time.perf_counter() - t0), 1)
        log(f"[synthesize] vllm max_new_tokens={new}: {out[new]:,}/s")
    return {"engine": "vllm (GPU)", "tokens_per_s_by_max_new_tokens": out}


def table(res: dict) -> str:
    lines = [f"synthesize: {res['requests']} requests, a {res['params']:,}-parameter model",
             "", "| engine | max_new_tokens | batch_tokens | rows per batch | new tokens | seconds | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['engine']} | — | — | — | — | — | skipped: {r['skipped']} |")
        elif "tokens_per_s" in r:
            lines.append(f"| {r['engine']} | {r['max_new_tokens']} | {r['batch_tokens']} | {r['rows_per_batch']} | {r['new_tokens']:,} | "
                         f"{r['seconds']} | {r['tokens_per_s']:,} |")
        else:
            lines += [f"| {r['engine']} | {k} | — | — | — | — | {v:,} |" for k, v in r["tokens_per_s_by_max_new_tokens"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(log=lambda m: print(m, file=sys.stderr))
    print(table(res))
