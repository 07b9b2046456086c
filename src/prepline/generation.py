"""Batch text generation with a causal LM: the engines of the ``synthesize`` transform.

Two engines behind one interface (:class:`Engine`: token ids in, token ids out, one seed per
request):

* ``torch`` (CPU, the default here): a prepline CausalLM folder (``config.json`` + ``model.pt`` +
  ``tokenizer.json``, what ``fine_tune`` writes) or a Hugging Face folder (with ``transformers``).
  Requests are sorted by length and grouped so that a batch holds at most ``batch_tokens`` tokens
  (prompts and new tokens); rows are right-padded (attention is causal, so a row never sees the
  padding after it) and a row leaves the batch when it ends, so the batch shrinks as it goes.
  Each request samples with its own ``torch.Generator`` seeded from the request: its text does not
  depend on which other requests share its batch (up to float rounding of a batched matmul).
* ``vllm`` (GPU): vLLM's offline ``LLM.generate`` over token-id prompts, one ``SamplingParams`` per
  request with its seed; vLLM batches continuously. It needs a Hugging Face folder and a GPU.

``auto`` picks vLLM when it is installed, a GPU is visible and the model is a Hugging Face folder,
else torch. Torch (and vLLM) are imported inside the functions: the ``train`` extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass

from prepline.errors import ConfigError

ENGINES = ("auto", "torch", "vllm")


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: ``temperature`` 0 is greedy; ``top_k`` 0 keeps every token."""

    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int = 50

    def to_json(self) -> str:
        return json.dumps({"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k}, sort_keys=True)


class Engine:
    """``generate(prompts, seeds)``: the new token ids of each prompt (ending at ``stop_id`` when the
    model writes it, which is kept out)."""

    name = ""
    max_seq_len = 1 << 30

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[int]]:
        raise NotImplementedError


@dataclass(frozen=True)
class ModelFolder:
    """A model folder on this machine: the folder itself when it is local, else a copy of the
    object-store folder, made once per worker (the engine and the tokenizer then read it there)."""

    uri: str
    path: str
    sha256: str  # of the files' names and bytes, in name order
    hf: bool  # a Hugging Face folder (else prepline's format)


def fetch_model(model_path: str) -> ModelFolder:
    """The folder of ``model_path`` (local or object store), each file read once: hashed, and copied
    when remote; a clear error when it has no ``config.json``."""
    from prepline.data_access import open_location, scheme_of
    from prepline.train.model import FORMAT

    uri = model_path.rstrip("/")
    loc = open_location(uri)
    try:
        names = sorted(f.rel for f in loc.list_all() if not f.rel.startswith("."))
    except FileNotFoundError:
        names = []
    if "config.json" not in names:
        raise ConfigError(f"model_path {model_path!r} is not a model folder (no config.json in it)",
                          "pass the folder fine_tune writes (<output>/model: config.json, model.pt, tokenizer.json) "
                          "or a Hugging Face model folder, local or s3://")
    local = scheme_of(uri) is None
    path = loc.path() if local else tempfile.mkdtemp(prefix="prepline-model-")
    h = hashlib.sha256()
    for name in names:
        if local:
            with open(os.path.join(path, name), "rb") as f:
                digest = hashlib.file_digest(f, "sha256").digest()
        else:
            data = loc.read_bytes(name)
            digest = hashlib.sha256(data).digest()
            os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)
        h.update(name.encode() + b"\0" + digest)
    with open(os.path.join(path, "config.json"), "rb") as f:
        conf = json.loads(f.read())
    hf = conf.get("format") != FORMAT and ("model_type" in conf or "architectures" in conf)
    return ModelFolder(uri, path, h.hexdigest(), hf)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def vllm_missing() -> str:
    """Why the vLLM engine cannot run here ('' when it can)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (the GPU image has it: runtime_images/ray, PREPLINE_EXTRAS with gpu)"
    if not gpu_available():
        return "no GPU is visible (torch.cuda.is_available() is False)"
    return ""


def pick_engine(engine: str, hf: bool) -> str:
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r} is not one of {', '.join(ENGINES)}", "pass engine=auto, torch or vllm")
    if engine == "auto":
        return "vllm" if hf and not vllm_missing() else "torch"
    if engine == "vllm":
        why = vllm_missing() or ("" if hf else "vLLM loads Hugging Face model folders only; this is a prepline model folder")
        if why:
            raise ConfigError(f"engine=vllm cannot run: {why}", "run on a GPU worker group of the Ray image with vLLM, or pass engine=torch")
    return engine


def load_engine(model: ModelFolder, engine: str, sampling: Sampling, stop_id: int, batch_tokens: int, seed: int) -> tuple[Engine, dict]:
    """The engine for ``model`` and what provenance records of it (engine, model, its hash)."""
    name = pick_engine(engine, model.hf)
    info = {"engine": name, "model": model.uri, "model_sha256": model.sha256}
    if name == "vllm":
        return VllmEngine(model.path, sampling, stop_id, seed), info
    return TorchEngine(model.path, sampling, stop_id, batch_tokens), info


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, path: str, sampling: Sampling, stop_id: int, batch_tokens: int):
        """``path``: a local model folder (:func:`fetch_model`)."""
        from prepline.train.config import TrainConfig
        from prepline.train.models import load_base_model

        with tempfile.TemporaryDirectory() as tmp:
            lm = load_base_model(path, TrainConfig(), tmp)
        self.model = lm.model.eval()
        self.max_seq_len = int(lm.max_seq_len)
        self.sampling, self.stop_id, self.batch_tokens = sampling, stop_id, batch_tokens

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[int]]:
        order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
        out: list[list[int]] = [[] for _ in prompts]
        i = 0
        while i < len(order):
            width = len(prompts[order[i]]) + self.sampling.max_new_tokens  # the longest row of this batch
            rows = max(1, self.batch_tokens // max(width, 1))
            batch = order[i:i + rows]
            for k, ids in zip(batch, self._batch([prompts[k] for k in batch], [seeds[k] for k in batch])):
                out[k] = ids
            i += len(batch)
        return out

    def _batch(self, prompts: list[list[int]], seeds: list[int]) -> list[list[int]]:
        import torch

        from prepline.train.model import CausalLM

        gens = [torch.Generator().manual_seed(int(x)) for x in seeds]
        with torch.inference_mode():
            if isinstance(self.model, CausalLM):
                return self._cached(prompts, gens)
            return self._uncached(prompts, gens)

    def _cached(self, prompts: list[list[int]], gens: list) -> list[list[int]]:
        """prepline's CausalLM: a key/value cache (its Decoder); rows that are done leave the batch
        once a quarter of it is done."""
        import torch

        s = self.sampling
        dec = self.model.decoder(prompts, s.max_new_tokens)
        out: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))  # the request of each row of the decoder; -1 once it is done
        for _ in range(s.max_new_tokens):
            logits = dec.logits.float()
            tokens = []
            for j, r in enumerate(live):
                tok = 0
                if r >= 0:
                    tok = self._draw(logits[j], gens[r])
                    if tok == self.stop_id:
                        live[j], tok = -1, 0
                    else:
                        out[r].append(tok)
                        if len(out[r]) == s.max_new_tokens:
                            live[j] = -1
                tokens.append(tok)
            going = [j for j, r in enumerate(live) if r >= 0]
            if not going:
                break
            if len(going) <= 3 * len(live) // 4:
                dec.keep(torch.tensor(going))
                live, tokens = [live[j] for j in going], [tokens[j] for j in going]
            dec.push(torch.tensor(tokens, dtype=torch.long))
        return out

    def _uncached(self, prompts: list[list[int]], gens: list) -> list[list[int]]:
        """Another model (Hugging Face): the whole sequence each step, right-padded (attention is
        causal: a row never sees the padding after it); a row leaves the batch when it is done."""
        import torch

        from prepline.train.models import logits

        s = self.sampling
        n = len(prompts)
        width = max(len(p) for p in prompts) + s.max_new_tokens
        ids = torch.zeros((n, width), dtype=torch.long)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        out: list[list[int]] = [[] for _ in prompts]
        active = list(range(n))
        for _ in range(s.max_new_tokens):
            if not active:
                break
            rows = torch.tensor(active)
            t = int(lens[rows].max())
            last = logits(self.model, ids[rows, :t])[torch.arange(len(active)), lens[rows] - 1].float()
            still = []
            for j, r in enumerate(active):
                tok = self._draw(last[j], gens[r])
                if tok == self.stop_id:
                    continue
                ids[r, lens[r]] = tok
                lens[r] += 1
                out[r].append(tok)
                if len(out[r]) < s.max_new_tokens:
                    still.append(r)
            active = still
        return out

    def _draw(self, row, gen) -> int:
        import torch

        s = self.sampling
        if s.temperature <= 0:
            return int(torch.argmax(row))
        row = row / s.temperature
        if 0 < s.top_k < row.shape[0]:
            kth = torch.topk(row, s.top_k).values[-1]
            row = torch.where(row < kth, torch.full_like(row, float("-inf")), row)
        return int(torch.multinomial(torch.softmax(row, dim=0), 1, generator=gen))


class VllmEngine(Engine):  # pragma: no cover - needs a GPU and vLLM (scripts/bench.py --synthesize checks it where present)
    name = "vllm"

    def __init__(self, path: str, sampling: Sampling, stop_id: int, seed: int):
        """``path``: a local Hugging Face folder (:func:`fetch_model`)."""
        from vllm import LLM

        self.llm = LLM(model=path, seed=seed, skip_tokenizer_init=True)
        self.sampling, self.stop_id = sampling, stop_id
        self.max_seq_len = int(self.llm.llm_engine.model_config.max_model_len)

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[int]]:
        from vllm import SamplingParams

        s = self.sampling
        params = [SamplingParams(temperature=s.temperature, top_k=s.top_k if s.top_k > 0 else -1, max_tokens=s.max_new_tokens,
                                 seed=int(x), stop_token_ids=[self.stop_id], detokenize=False) for x in seeds]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [[t for t in o.outputs[0].token_ids if t != self.stop_id] for o in outs]
