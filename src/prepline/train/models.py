"""The model to train: a new prepline CausalLM, or a base checkpoint (ours, a state_dict, Hugging Face).

Torch (and transformers, for a Hugging Face checkpoint) is imported inside the functions.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass

from prepline.data_access import Location, open_location
from prepline.errors import ConfigError, InputError
from prepline.tokens.tokenizer import read_file
from prepline.train.config import TrainConfig

MODEL_DIR = "model"


def save_bytes(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def torch_load(data: bytes, what: str):
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

    conf_bytes = read_file(f"{spec.rstrip('/')}/config.json")
    if conf_bytes is not None:
        try:
            conf = json.loads(conf_bytes)
        except ValueError:
            raise ConfigError(f"base model {spec}: config.json is not JSON", "pass a prepline or Hugging Face model folder") from None
        if conf.get("format") == FORMAT:
            mc = ModelConfig.from_dict(conf["model"])
            weights = read_file(f"{spec.rstrip('/')}/model.pt")
            if weights is None:
                raise ConfigError(f"base model {spec}: config.json is there but model.pt is missing", "copy the whole model folder")
            model = CausalLM(mc)
            _load_state(model, _state_dict_of(torch_load(weights, f"{spec}/model.pt"), spec), spec)
            return LoadedModel(model, "prepline", mc.to_dict(), mc.vocab_size, mc.max_seq_len, conf.get("tokenizer_sha256"))
        if "model_type" in conf or "architectures" in conf:
            return _load_hf(spec, conf, workdir)
        raise ConfigError(f"base model {spec}: config.json is neither a prepline ({FORMAT}) nor a Hugging Face config",
                          "pass a prepline model folder, a state_dict file or a Hugging Face checkpoint folder")
    data = read_file(spec)
    if data is None:
        raise ConfigError(f"base model {spec!r} does not exist (no file, and no folder with config.json)",
                          "pass the path or s3:// URI of a model folder (config.json + model.pt) or of a state_dict .pt file, "
                          "or base_model='' to train a new model")
    sd = _state_dict_of(torch_load(data, spec), spec)
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


def logits(model, x):
    """The logits of a prepline CausalLM or a Hugging Face model (its output.logits)."""
    out = model(x)
    return out if hasattr(out, "shape") else out.logits


def write_model(out: Location, lm: LoadedModel, model, extra: dict, tokenizer_files: dict[str, bytes]) -> None:
    """The final model into ``<out>/model/``: our format (config.json + model.pt) or the Hugging Face files, and the tokenizer(s)."""
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
        out.write_bytes(f"{MODEL_DIR}/model.pt", save_bytes(model.state_dict()))
        conf = {"format": FORMAT, "version": FORMAT_VERSION, "model": lm.config, **extra}
        out.write_bytes(f"{MODEL_DIR}/config.json", (json.dumps(conf, indent=2) + "\n").encode())
    for name, data in tokenizer_files.items():
        out.write_bytes(f"{MODEL_DIR}/{name}", data)


def load_trained(output_or_model: str):
    """The final model of a run (``<output>`` or ``<output>/model``) as a CausalLM in eval mode."""
    from prepline.train.model import CausalLM, ModelConfig

    base = output_or_model.rstrip("/")
    if read_file(f"{base}/config.json") is None and read_file(f"{base}/{MODEL_DIR}/config.json") is not None:
        base = f"{base}/{MODEL_DIR}"
    conf_bytes = read_file(f"{base}/config.json")
    if conf_bytes is None:
        raise InputError(f"{base} holds no trained model (config.json)", "point at a training output or its model/ folder")
    conf = json.loads(conf_bytes)
    model = CausalLM(ModelConfig.from_dict(conf["model"]))
    model.load_state_dict(_state_dict_of(torch_load(read_file(f"{base}/model.pt") or b"", f"{base}/model.pt"), base))
    return model.eval()
