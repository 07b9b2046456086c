"""The training function: a causal LM trained on the token shards of tokenization outputs.

:func:`train` reads the ``tokens/`` folders written by the tokenization stage (local paths or
``s3://`` URIs, through :mod:`prepline.data_access`), trains a small GPT-style model
(:mod:`prepline.train.model`) or continues a base checkpoint, and writes to ``output``::

    checkpoints/step-00000050/checkpoint.pt   model + optimizer + RNG state (torch.save, weights only)
    checkpoints/step-00000050/state.json      step, fingerprint, metrics so far (written last)
    model/config.json, model/model.pt         the final model (prepline.causal_lm format)
    model/tokenizer.json                      the tokenizer of the shards
    metrics.jsonl                             one line per step: loss, lr, tokens, tokens/s
    metrics.json                              the summary, written last: the run is complete

A restarted run resumes from its last checkpoint and ends with the same weights as an
uninterrupted run (the batch order is a function of the step and the seed; the optimizer and
RNG states are in the checkpoint). Deterministic on CPU for a fixed thread count.

Under ``torchrun`` (``WORLD_SIZE`` > 1) the model is wrapped in DistributedDataParallel
(gloo on CPU, nccl on GPU): each rank takes its slice of every global batch and rank 0 writes.

Torch is imported inside the functions: ``prepline.train`` imports without the ``train`` extra.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, TextIO

import numpy as np

from prepline.config import TransformConfig, param
from prepline.data_access import Location, open_location
from prepline.errors import ConfigError, InputError, RunFailed, exit_code

CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
METRICS = "metrics.json"
METRICS_LINES = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
STATE_FILE = "state.json"
SUMMARY_FORMAT = "prepline.train.metrics"

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
    seq_len: int = param(0, "tokens per training sequence; 0: the shards' seq_len (the smallest if inputs differ)", min=0)
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


# ----------------------------------------------------------------------------------------------
# the token data


@dataclass
class _Source:
    uri: str
    index: dict
    shards: list  # arrays (rows, L_s + 1), memory-mapped locally
    row_len: int
    row_start: np.ndarray  # first global row of each shard
    rows: int
    offset: int = 0  # added to every id (mixed_tokenizers='separate')

    @property
    def stride(self) -> int:
        return self.row_len - 1

    @property
    def covered(self) -> int:
        """Tokens of the stream covered by the rows (rows overlap by one token)."""
        return self.rows * self.stride + 1 if self.rows else 0

    def take(self, start: int, length: int, out: np.ndarray) -> None:
        """``out[:length] = stream[start : start + length]``."""
        s, filled, p = self.stride, 0, start
        while filled < length:
            row = min(p // s, self.rows - 1)
            col = p - row * s
            k = int(np.searchsorted(self.row_start, row, side="right")) - 1
            n = min(self.row_len - col, length - filled)
            out[filled : filled + n] = self.shards[k][row - self.row_start[k], col : col + n]
            if self.offset:
                out[filled : filled + n] += self.offset
            filled += n
            p += n


class TokenData:
    """Fixed-length training windows over the token streams of one or more tokenization outputs.

    Window ``k`` of an input is ``stream[k*L : k*L + L + 1]`` (``x = w[:-1]``, ``y = w[1:]``);
    windows never cross inputs. Works for any ``L``: the shards' rows are re-cut.
    """

    def __init__(self, inputs: list[str], seq_len: int = 0, mixed_tokenizers: str = "error"):
        from prepline.transforms.tokenization import load_token_shards, read_token_index

        if not inputs:
            raise ConfigError("no training input given", "pass the tokenization output(s) (paths or s3:// URIs)")
        self.sources: list[_Source] = []
        for uri in inputs:
            index = read_token_index(uri)  # InputError naming the path when there is none
            shards = list(load_token_shards(uri))
            counts = [int(a.shape[0]) for a in shards]
            start = np.cumsum([0] + counts)[:-1].astype(np.int64)
            self.sources.append(_Source(uri, index, shards, int(index["row_len"]), start, int(sum(counts))))
        shas = list(dict.fromkeys(s.index.get("tokenizer_sha256") for s in self.sources))
        if len(shas) > 1 and mixed_tokenizers != "separate":
            listing = "; ".join(f"{s.uri}: {s.index.get('tokenizer_source')} ({str(s.index.get('tokenizer_sha256'))[:12]})" for s in self.sources)
            raise ConfigError(
                f"the inputs were tokenized with {len(shas)} different tokenizers ({listing}): their token ids do not mean the same",
                "give every branch the same tokenizer (the tokenization stage's 'tokenizer' parameter, e.g. in overrides_json "
                '{"tokenization": {"params": {"tokenizer": "s3://.../tokenizer.json"}}}), train on one language, or pass '
                "mixed_tokenizers='separate' (one vocabulary per tokenizer)",
            )
        # one vocabulary per distinct tokenizer, in input order (a single one: offset 0)
        self.vocabularies: list[dict] = []
        for sha in shas:
            group = [s for s in self.sources if s.index.get("tokenizer_sha256") == sha]
            offset = sum(v["vocab_size"] for v in self.vocabularies)
            size = max(int(s.index["vocab_size"]) for s in group)
            for s in group:
                s.offset = offset
            self.vocabularies.append({"tokenizer_sha256": sha, "offset": offset, "vocab_size": size,
                                      "eos_id": group[0].index.get("eos_id"), "tokenizer_source": group[0].index.get("tokenizer_source"),
                                      "inputs": [s.uri for s in group]})
        if all(s.rows == 0 for s in self.sources):
            total = sum(int(s.index.get("num_tokens", 0)) for s in self.sources)
            raise InputError(
                f"no token shards in {', '.join(s.uri for s in self.sources)}: {total} tokens in all, no training sequence "
                "(every document was filtered out, or the corpus is shorter than one tokenization sequence)",
                "check the filter stage's counts in metadata.json, lower the tokenization seq_len, or give the run more data",
            )
        shard_lens = sorted({s.stride for s in self.sources if s.rows})
        self.seq_len = seq_len or shard_lens[0]
        L = self.seq_len
        self.windows = np.array([(s.covered - 1) // L if s.covered > L else 0 for s in self.sources], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.windows)]).astype(np.int64)
        self.num_windows = int(self.windows.sum())
        if self.num_windows == 0:
            longest = max(s.covered for s in self.sources)
            raise InputError(
                f"the token shards are shorter than one training sequence: the longest input holds {longest} tokens, "
                f"seq_len={L} needs {L + 1}",
                f"lower seq_len (at most {max(longest - 1, 0)}), or give the run more data",
            )
        self.vocab_size = sum(v["vocab_size"] for v in self.vocabularies)
        self.tokenizer_sha256 = shas[0] if len(shas) == 1 else None
        self.eos_id = self.vocabularies[0]["eos_id"] if len(shas) == 1 else None
        self._perm: tuple[int, np.ndarray] | None = None

    @property
    def tokens(self) -> int:
        return sum(s.covered for s in self.sources)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for s in self.sources:
            h.update(json.dumps([s.index.get("tokenizer_sha256"), s.offset, [x.get("sha256") for x in s.index["shards"]]]).encode())
        return h.hexdigest()

    def window(self, g: int, out: np.ndarray) -> None:
        i = int(np.searchsorted(self.offsets, g, side="right")) - 1
        k = g - int(self.offsets[i])
        self.sources[i].take(k * self.seq_len, self.seq_len + 1, out)

    def _order(self, epoch: int, seed: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([seed, epoch]).permutation(self.num_windows))
        return self._perm[1]

    def batch(self, step: int, batch_size: int, seed: int, part: slice = slice(None)) -> np.ndarray:
        """The windows of optimizer step ``step`` (1-based): a function of the step and the seed only."""
        ids = range((step - 1) * batch_size, step * batch_size)[part]
        out = np.empty((len(ids), self.seq_len + 1), np.int64)
        for j, g in enumerate(ids):
            epoch, pos = divmod(g, self.num_windows)
            self.window(int(self._order(epoch, seed)[pos]), out[j])
        return out

    def tokenizer_files(self) -> dict[str, bytes]:
        """What goes next to the model: ``tokenizer.json`` (one vocabulary), or ``tokenizer-<k>.json``
        per vocabulary plus ``tokenizers.json`` (offsets, sizes, inputs) for separate vocabularies."""
        from prepline.transforms.tokenization import INDEX, TOKENS_DIR

        def read(uri: str) -> bytes | None:
            src = next(s for s in self.sources if s.uri == uri)
            loc = open_location(uri)  # the stage output or its tokens/ folder, as load_token_shards takes it
            if loc.read_text(INDEX) is None:
                loc = loc.sub(TOKENS_DIR)
            try:
                return loc.read_bytes(src.index.get("tokenizer", "tokenizer.json"))
            except FileNotFoundError:
                return None

        if len(self.vocabularies) == 1:
            data = read(self.sources[0].uri)
            return {"tokenizer.json": data} if data is not None else {}
        files, listing = {}, []
        for k, v in enumerate(self.vocabularies):
            data = read(v["inputs"][0])
            if data is not None:
                files[f"tokenizer-{k}.json"] = data
            listing.append({"file": f"tokenizer-{k}.json", **v})
        files["tokenizers.json"] = (json.dumps({"vocabularies": listing}, indent=2) + "\n").encode()
        return files


# ----------------------------------------------------------------------------------------------
# models: new, ours, a state_dict, Hugging Face


def _split(uri: str) -> tuple[str, str]:
    uri = uri.rstrip("/")
    if uri.startswith("s3://"):
        rest = uri[5:]
        parent, _, name = rest.rpartition("/")
        return ("s3://" + parent, name) if parent else ("s3://" + rest, "")
    return os.path.dirname(os.path.abspath(uri)), os.path.basename(uri)


def _read(uri: str) -> bytes | None:
    parent, name = _split(uri)
    if not name:
        return None
    try:
        return open_location(parent).read_bytes(name)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return None


def _torch_load(data: bytes, what: str):
    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a bad file
        raise ConfigError(f"{what} is not a torch checkpoint loadable with weights_only=True ({type(e).__name__}: {str(e)[:200]})",
                          "pass a state_dict saved with torch.save, or a prepline model folder") from None


def _state_dict_of(obj, what: str) -> dict:
    import torch

    if isinstance(obj, dict):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConfigError(f"{what} holds no state_dict (a dict of tensors)", "save the model with torch.save(model.state_dict(), path)")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _model_config_from_state(sd: dict, cfg: TrainConfig, what: str):
    import torch

    from prepline.train.model import ModelConfig

    try:
        V, d = sd["tok.weight"].shape
        S = sd["pos.weight"].shape[0]
        layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
        ff = sd["blocks.0.fc.weight"].shape[0]
    except (KeyError, ValueError, IndexError):
        raise ConfigError(f"{what} is not the state_dict of a prepline CausalLM (no tok/pos/blocks weights)",
                          "pass a prepline model folder, a CausalLM state_dict, or a Hugging Face checkpoint folder") from None
    head = sd.get("head.weight")
    tied = head is not None and head.shape == sd["tok.weight"].shape and bool(torch.equal(head, sd["tok.weight"]))
    return ModelConfig(vocab_size=int(V), max_seq_len=int(S), n_layer=layers, n_head=cfg.model_heads, d_model=int(d),
                       d_ff=int(ff) if ff != 4 * d else 0, dropout=cfg.dropout, tie_embeddings=tied)


def _download_folder(uri: str, dest: str) -> None:
    loc = open_location(uri)
    for f in loc.list_all():
        p = os.path.join(dest, *f.rel.split("/"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(loc.read_bytes(f.rel))


@dataclass
class LoadedModel:
    model: object  # torch.nn.Module
    kind: str  # new | prepline | state_dict | huggingface
    config: dict  # the ModelConfig dict (ours) or the HF config dict
    vocab_size: int
    max_seq_len: int
    tokenizer_sha256: str | None = None
    hf_dir: str | None = None  # a local copy of a Hugging Face checkpoint


def new_model(cfg: TrainConfig, vocab_size: int, seq_len: int) -> LoadedModel:
    import torch

    from prepline.train.model import CausalLM, ModelConfig

    mc = ModelConfig(vocab_size=vocab_size, max_seq_len=seq_len, n_layer=cfg.model_layers, n_head=cfg.model_heads,
                     d_model=cfg.model_dim, d_ff=cfg.model_ff, dropout=cfg.dropout, tie_embeddings=cfg.tie_embeddings)
    torch.manual_seed(cfg.seed)
    return LoadedModel(CausalLM(mc), "new", mc.to_dict(), vocab_size, seq_len)


def load_base_model(spec: str, cfg: TrainConfig, workdir: str) -> LoadedModel:
    """A base checkpoint from a path or S3 URI: a prepline model folder, a state_dict file, or a
    Hugging Face checkpoint folder (with ``transformers`` installed)."""
    from prepline.train.model import FORMAT, CausalLM, ModelConfig

    conf_bytes = _read(f"{spec.rstrip('/')}/config.json")
    if conf_bytes is not None:
        try:
            conf = json.loads(conf_bytes)
        except ValueError:
            raise ConfigError(f"base model {spec}: config.json is not JSON", "pass a prepline or Hugging Face model folder") from None
        if conf.get("format") == FORMAT:
            mc = ModelConfig.from_dict(conf["model"])
            weights = _read(f"{spec.rstrip('/')}/model.pt")
            if weights is None:
                raise ConfigError(f"base model {spec}: config.json is there but model.pt is missing", "copy the whole model folder")
            model = CausalLM(mc)
            _load_state(model, _state_dict_of(_torch_load(weights, f"{spec}/model.pt"), spec), spec)
            return LoadedModel(model, "prepline", mc.to_dict(), mc.vocab_size, mc.max_seq_len, conf.get("tokenizer_sha256"))
        if "model_type" in conf or "architectures" in conf:
            return _load_hf(spec, conf, workdir)
        raise ConfigError(f"base model {spec}: config.json is neither a prepline ({FORMAT}) nor a Hugging Face config",
                          "pass a prepline model folder, a state_dict file or a Hugging Face checkpoint folder")
    data = _read(spec)
    if data is None:
        raise ConfigError(f"base model {spec!r} does not exist (no file, and no folder with config.json)",
                          "pass the path or s3:// URI of a model folder (config.json + model.pt) or of a state_dict .pt file, "
                          "or base_model='' to train a new model")
    sd = _state_dict_of(_torch_load(data, spec), spec)
    mc = _model_config_from_state(sd, cfg, spec)
    model = CausalLM(mc)
    _load_state(model, sd, spec)
    return LoadedModel(model, "state_dict", mc.to_dict(), mc.vocab_size, mc.max_seq_len)


def _load_state(model, sd: dict, what: str) -> None:
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise ConfigError(f"the weights of {what} do not fit the model: {' '.join(first[:3])[:400]}",
                          "pass model_heads (and the other model_* parameters) of the checkpoint's architecture") from None


def _load_hf(spec: str, conf: dict, workdir: str) -> LoadedModel:
    try:
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError(
            f"base model {spec} is a Hugging Face checkpoint (model_type={conf.get('model_type')!r}); loading it needs the "
            "transformers package, which is not installed",
            "install transformers (and safetensors) into the trainer image, or convert the checkpoint to a prepline "
            "model folder / state_dict",
        ) from None
    local = spec
    if spec.startswith("s3://"):
        local = os.path.join(workdir, "base_model")
        _download_folder(spec, local)
    model = AutoModelForCausalLM.from_pretrained(local, local_files_only=True)
    cfgd = model.config.to_dict()
    max_len = int(cfgd.get("n_positions") or cfgd.get("max_position_embeddings") or 1 << 30)
    return LoadedModel(model, "huggingface", cfgd, int(model.config.vocab_size), max_len, hf_dir=local)


def _logits(model, x):
    out = model(x)
    return out if hasattr(out, "shape") else out.logits


# ----------------------------------------------------------------------------------------------
# checkpoints


def _save_bytes(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _step_dir(step: int) -> str:
    return f"{CHECKPOINTS}/step-{step:08d}"


def _checkpoints(out: Location) -> list[int]:
    steps = set()
    for f in out.list_all(CHECKPOINTS):
        parts = f.rel.split("/")
        if len(parts) == 3 and parts[2] == STATE_FILE and parts[1].startswith("step-") and parts[1][5:].isdigit():
            steps.add(int(parts[1][5:]))
    return sorted(steps)


def _lr_at(cfg: TrainConfig, step: int) -> float:
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _write_model(out: Location, lm: LoadedModel, model, extra: dict, tokenizer_files: dict[str, bytes]) -> None:
    from prepline.train.model import FORMAT, FORMAT_VERSION

    out.delete(MODEL_DIR)
    if lm.kind == "huggingface":
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            for root, _, files in os.walk(tmp):
                for name in files:
                    p = os.path.join(root, name)
                    with open(p, "rb") as fh:
                        out.write_bytes(f"{MODEL_DIR}/{os.path.relpath(p, tmp).replace(os.sep, '/')}", fh.read())
        out.write_bytes(f"{MODEL_DIR}/prepline_train.json", (json.dumps(extra, indent=2) + "\n").encode())
    else:
        out.write_bytes(f"{MODEL_DIR}/model.pt", _save_bytes(model.state_dict()))
        conf = {"format": FORMAT, "version": FORMAT_VERSION, "model": lm.config, **extra}
        out.write_bytes(f"{MODEL_DIR}/config.json", (json.dumps(conf, indent=2) + "\n").encode())
    for name, data in tokenizer_files.items():
        out.write_bytes(f"{MODEL_DIR}/{name}", data)


# ----------------------------------------------------------------------------------------------
# training


def _say(out: TextIO | None, msg: str) -> None:
    print(f"[prepline.train] {msg}", file=out or sys.stdout, flush=True)


def cpu_threads() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota (a pod's CPU limit),
    since torch's default (every core of the node) oversubscribes a limited container."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _dist():
    """(rank, world) and whether torch.distributed was initialised here (under torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), True


def read_summary(output: str) -> dict | None:
    text = open_location(output).read_text(METRICS)
    return json.loads(text) if text else None


def train(
    inputs: list[str],
    output: str,
    params: dict | None = None,
    *,
    overwrite: bool = False,
    out: TextIO | None = None,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict:
    """Train on the token shards of ``inputs`` into ``output``; returns the summary (metrics.json).

    ``on_step(step, record)`` is called after every optimizer step (rank 0); an exception from it
    stops the run like a crash would (the last checkpoint stays).
    """
    cfg = TrainConfig.from_params(params or {})
    t_start = time.perf_counter()
    say = (lambda m: _say(out, m)) if int(os.environ.get("RANK", "0")) == 0 else (lambda m: None)
    outloc = open_location(output)
    # the inputs are checked before torch is imported: bad input fails in a moment
    data = TokenData(list(inputs), cfg.seq_len, cfg.mixed_tokenizers)

    import torch

    rank, world, distributed = _dist()
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size={cfg.batch_size} is not divisible by the {world} ranks", f"pass a multiple of {world}")
    torch.set_num_threads(cfg.threads or cpu_threads())
    torch.use_deterministic_algorithms(True)
    if len(data.vocabularies) > 1:
        say(f"the inputs use {len(data.vocabularies)} different tokenizers: training with separate vocabularies "
            f"(offsets {', '.join(str(v['offset']) for v in data.vocabularies)}; see model/tokenizers.json)")
    L = data.seq_len
    fingerprint = hashlib.sha256(json.dumps(
        {"config": cfg.fingerprint_dict(), "data": data.fingerprint(), "seq_len": L, "world_batch": cfg.batch_size},
        sort_keys=True).encode()).hexdigest()

    prior = read_summary(output)
    if prior is not None and not overwrite:
        if prior.get("fingerprint") != fingerprint:
            raise ConfigError(f"{output} holds a finished training run with other inputs or parameters",
                              "use another output folder, or pass overwrite (--overwrite) to replace it")
        if prior.get("steps", 0) >= cfg.steps:
            say(f"{output} is already complete ({prior['steps']} steps, same inputs and parameters): nothing to do")
            return prior
    if overwrite and rank == 0:
        for rel in (CHECKPOINTS, MODEL_DIR, METRICS, METRICS_LINES):
            outloc.delete(rel)
    if distributed:
        torch.distributed.barrier()

    workdir = tempfile.mkdtemp(prefix="prepline-train-")
    try:
        if cfg.base_model:
            lm = load_base_model(cfg.base_model, cfg, workdir)
            torch.manual_seed(cfg.seed)
        else:
            lm = new_model(cfg, data.vocab_size, L)
        if data.vocab_size > lm.vocab_size:
            raise ConfigError(f"the shards hold token ids up to {data.vocab_size - 1} but the base model has {lm.vocab_size} ids",
                              "tokenize with the base model's tokenizer")
        if L > lm.max_seq_len:
            raise ConfigError(f"seq_len={L} is longer than the base model's {lm.max_seq_len} positions", f"pass seq_len <= {lm.max_seq_len}")
        if lm.tokenizer_sha256 and lm.tokenizer_sha256 != data.tokenizer_sha256:
            raise ConfigError(f"base model {cfg.base_model} was trained with another tokenizer than the shards' "
                              f"({lm.tokenizer_sha256[:12]} vs {str(data.tokenizer_sha256 or 'several')[:12]})",
                              "tokenize with the base model's tokenizer.json (the tokenization stage's 'tokenizer' parameter)")
        model = lm.model
        model.train()
        nparams = sum(p.numel() for p in model.parameters())
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg.lr, betas=(0.9, 0.95))

        # resume ---------------------------------------------------------------------------------
        start, records, tokens_seen, train_seconds = 0, [], 0, 0.0
        for step in reversed(_checkpoints(outloc)):
            state = json.loads(outloc.read_bytes(f"{_step_dir(step)}/{STATE_FILE}"))
            if state.get("fingerprint") != fingerprint:
                if overwrite:
                    continue
                raise ConfigError(f"{output} holds checkpoints of a training run with other inputs or parameters",
                                  "use another output folder, or pass overwrite (--overwrite) to start over")
            if step > cfg.steps:
                raise ConfigError(f"{output} has a checkpoint at step {step}, past steps={cfg.steps}", f"pass steps >= {step}, or overwrite")
            ck = _torch_load(outloc.read_bytes(f"{_step_dir(step)}/{CHECKPOINT_FILE}"), f"checkpoint {step}")
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            torch.set_rng_state(ck["rng"])
            start, records = step, state["metrics"]
            tokens_seen, train_seconds = state["tokens_seen"], state["train_seconds"]
            say(f"resuming from the checkpoint at step {step} ({_step_dir(step)})")
            break
        if start == 0:
            say(f"training a {lm.kind} model ({nparams:,} parameters) on {data.num_windows:,} sequences of {L} tokens "
                f"from {len(data.sources)} input(s), {cfg.steps} steps of {cfg.batch_size}, world size {world}")
        train_model = model
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            train_model = DistributedDataParallel(model)
        per_rank = cfg.batch_size // world
        part = slice(rank * per_rank, (rank + 1) * per_rank)
        tokenizer_files = data.tokenizer_files()

        def checkpoint(step: int) -> None:
            if rank != 0:
                return
            d = _step_dir(step)
            outloc.write_bytes(f"{d}/{CHECKPOINT_FILE}", _save_bytes(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": step}))
            state = {"step": step, "fingerprint": fingerprint, "metrics": records, "tokens_seen": tokens_seen,
                     "train_seconds": train_seconds}
            outloc.write_bytes(f"{d}/{STATE_FILE}", json.dumps(state).encode())
            outloc.write_bytes(METRICS_LINES, "".join(json.dumps(r) + "\n" for r in records).encode())
            keep = {_step_dir(k) for k in _checkpoints(outloc)[-cfg.keep_checkpoints:]}
            for d_old in sorted({"/".join(f.rel.split("/")[:2]) for f in outloc.list_all(CHECKPOINTS)} - keep):
                outloc.delete(d_old)  # older ones, and any a killed run left half-written

        # the loop -----------------------------------------------------------------------------
        t_loop = time.perf_counter()
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            batch = torch.from_numpy(data.batch(step, cfg.batch_size, cfg.seed, part))
            lr = _lr_at(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            logits = _logits(train_model, batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            value = loss.detach()
            if distributed:
                torch.distributed.all_reduce(value)
                value = value / world
            loss_value = float(value)
            if not math.isfinite(loss_value):
                raise RunFailed(f"the loss is {loss_value} at step {step}", "lower lr, or raise warmup_steps / grad_clip")
            dt = time.perf_counter() - t0
            train_seconds += dt
            tokens_seen += cfg.batch_size * L
            rec = {"step": step, "loss": round(loss_value, 6), "lr": lr, "tokens": tokens_seen, "seconds": round(dt, 4),
                   "tokens_per_s": round(cfg.batch_size * L / dt, 1) if dt > 0 else None}
            records.append(rec)
            if step % cfg.log_every == 0 or step == start + 1 or step == cfg.steps:
                say(f"step {step}/{cfg.steps} loss {loss_value:.4f} lr {lr:.3g} tokens {tokens_seen:,} "
                    f"({rec['tokens_per_s'] or 0:,.0f} tokens/s)")
            if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                checkpoint(step)
            if on_step is not None and rank == 0:
                on_step(step, rec)
        loop_seconds = time.perf_counter() - t_loop

        # the result ---------------------------------------------------------------------------
        losses = [r["loss"] for r in records]
        tail = losses[-min(10, len(losses)):]
        summary = {
            "format": SUMMARY_FORMAT,
            "fingerprint": fingerprint,
            "steps": cfg.steps,
            "resumed_from": start,
            "initial_loss": losses[0],
            "final_loss": losses[-1],
            "final_loss_mean10": round(sum(tail) / len(tail), 6),
            "min_loss": min(losses),
            "tokens_seen": tokens_seen,
            "tokens_per_s": round(tokens_seen / train_seconds, 1) if train_seconds else None,
            "train_seconds": round(train_seconds, 3),
            "seconds_this_process": round(time.perf_counter() - t_start, 3),
            "loop_seconds_this_process": round(loop_seconds, 3),
            "seq_len": L,
            "batch_size": cfg.batch_size,
            "world_size": world,
            "sequences_available": data.num_windows,
            "epochs": round(cfg.steps * cfg.batch_size / data.num_windows, 4),
            "parameters": nparams,
            "model_kind": lm.kind,
            "inputs": [s.uri for s in data.sources],
            "output": outloc.uri,
            "model": outloc.path(MODEL_DIR),
            "tokenizer_sha256": data.tokenizer_sha256,
            "vocabularies": len(data.vocabularies),
            "vocab_size": lm.vocab_size,
            "config": cfg.to_dict(),
        }
        if rank == 0:
            extra = {"tokenizer_sha256": data.tokenizer_sha256, "eos_id": data.eos_id, "vocabularies": data.vocabularies, "trained": {
                k: summary[k] for k in ("steps", "final_loss", "tokens_seen", "inputs", "seq_len")}}
            _write_model(outloc, lm, model, extra, tokenizer_files)
            outloc.write_bytes(METRICS, (json.dumps(summary, indent=2) + "\n").encode())
            say(f"done: loss {summary['initial_loss']:.4f} -> {summary['final_loss']:.4f}, {tokens_seen:,} tokens, "
                f"{summary['tokens_per_s'] or 0:,.0f} tokens/s; model in {summary['model']}")
        if distributed:
            torch.distributed.barrier()
        return summary
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def load_trained(output_or_model: str):
    """The final model of a run (``<output>`` or ``<output>/model``) as a CausalLM in eval mode."""
    from prepline.train.model import CausalLM, ModelConfig

    base = output_or_model.rstrip("/")
    if _read(f"{base}/config.json") is None and _read(f"{base}/{MODEL_DIR}/config.json") is not None:
        base = f"{base}/{MODEL_DIR}"
    conf_bytes = _read(f"{base}/config.json")
    if conf_bytes is None:
        raise InputError(f"{base} holds no trained model (config.json)", "point at a training output or its model/ folder")
    conf = json.loads(conf_bytes)
    model = CausalLM(ModelConfig.from_dict(conf["model"]))
    model.load_state_dict(_state_dict_of(_torch_load(_read(f"{base}/model.pt") or b"", f"{base}/model.pt"), base))
    return model.eval()


# ----------------------------------------------------------------------------------------------
# the command line (python -m prepline.train) and the local mode


def build_args(inputs: list[str], output: str, params: dict | None = None, overwrite: bool = False) -> list[str]:
    """The arguments of ``python -m prepline.train`` for these inputs (what local and cluster modes run)."""
    args: list[str] = []
    for uri in inputs:
        args += ["--input", uri]
    args += ["--output", output, "--params", json.dumps(params or {}, sort_keys=True, separators=(",", ":"))]
    return args + (["--overwrite"] if overwrite else [])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from prepline.errors import PreplineError

    ap = argparse.ArgumentParser(prog="python -m prepline.train",
                                 description="Train a causal LM on the token shards of tokenization outputs.")
    ap.add_argument("--input", action="append", required=True, help="a tokenization output (path or s3:// URI); repeat for several")
    ap.add_argument("--output", required=True, help="folder or s3:// URI for checkpoints, the model and the metrics")
    ap.add_argument("--params", default="{}", help="training parameters as a JSON object (see docs/fine_tune.md)")
    ap.add_argument("--overwrite", action="store_true", help="replace a different run found in --output")
    a = ap.parse_args(argv)
    try:
        try:
            params = json.loads(a.params)
        except ValueError as e:
            raise ConfigError(f"--params is not valid JSON ({e})", 'pass a JSON object, e.g. {"steps": 100}') from None
        if not isinstance(params, dict):
            raise ConfigError("--params must be a JSON object", 'e.g. {"steps": 100, "lr": 0.001}')
        train(a.input, a.output, params, overwrite=a.overwrite)
    except PreplineError as e:
        print(f"error: {e.message}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr, flush=True)
        return exit_code(e)
    except KeyboardInterrupt:
        print("error: interrupted (the last checkpoint stays; run again to resume)", file=sys.stderr, flush=True)
        return 130
    return 0


def run_local(
    inputs: list[str],
    output: str,
    params: dict | None = None,
    *,
    overwrite: bool = False,
    timeout: float | None = None,
    out: TextIO | None = None,
    env: dict | None = None,
    python: str | None = None,
) -> dict:
    """Run the training function in a local subprocess (``python -m prepline.train``), streaming its
    log to ``out``; return the summary. A non-zero exit or ``timeout`` raises :class:`RunFailed`."""
    import subprocess
    import threading

    TrainConfig.from_params(params or {})  # a bad parameter fails here, before a process starts
    cmd = [python or sys.executable, "-m", "prepline.train", *build_args(inputs, output, params, overwrite)]
    out = out or sys.stdout
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.daemon = True
        timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            tail = (tail + [line.rstrip()])[-40:]
        rc = proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
    if timed_out.is_set():
        raise RunFailed(f"local training ran longer than {timeout:.0f}s and was stopped (its checkpoints stay in {output})",
                        "raise the timeout (the next run resumes from the last checkpoint), or lower steps")
    if rc != 0:
        errs = [ln for ln in tail if ln.startswith(("error:", "  fix:"))] or tail[-5:]
        raise RunFailed(f"local training exited with code {rc}: " + " ".join(e.strip() for e in errs), "see the log above")
    summary = read_summary(output)
    if summary is None:
        raise RunFailed(f"local training exited 0 but wrote no {METRICS} in {output}", "see the log above")
    return summary


__all__ = ["TrainConfig", "TokenData", "build_args", "load_base_model", "load_trained", "main", "read_summary", "run_local", "train"]
