"""synthesize: rephrase documents with a causal LM, in checkpointed partitions (the WRAP / BeyondWeb recipe).

Each input document with text is given to every rephrasing template (``name=prompt`` entries; the
prompt's ``{text}`` is the document, cut to ``max_prompt_tokens`` tokens), and the model's
continuation becomes a new document. The model is a folder, local or ``s3://``: the one
``fine_tune`` writes (``<output>/model``: config.json, model.pt, tokenizer.json) or a Hugging Face
folder. Engines (:mod:`prepline.generation`): ``torch`` on CPU, ``vllm`` on a GPU worker,
``auto`` picks. One model load per worker; requests are batched by tokens (``batch_tokens``).

Provenance, per new document: ``synth_source_id`` (the source's id), ``synth_template``,
``synth_model`` and ``synth_model_sha256``, ``synth_engine``, ``synth_sampling`` (JSON),
``synth_seed`` (the request's seed, from ``seed``, the source id and the template: a rerun on the
same engine writes the same text), ``synth_prompt_tokens`` and ``synth_new_tokens``. A new
document copies its source's other columns; its id is ``2**62 + source id * 64 + template index``
(unique next to doc_id's ids, which must be below 2**55). Originals, kept with ``keep_originals``,
have null provenance.

Counts: ``docs_in + Σ generated == docs_out + Σ removed``. ``generated.<template>``: the new
documents per template (a continuation that is empty is dropped and counted as
``synth_empty_<template>``). With ``keep_originals`` every original goes out too (documents without
text counted as ``synth_skipped_no_text``); without it the originals are removed as ``rephrased``
(the ones rephrased) and ``no_text``.

Checkpointed partitions: a file is worked in partitions of ``partition_docs`` documents; each
partition's result is written to the stage's work folder as it completes, and a rerun of a file
(after a killed worker) takes the finished partitions from there: a failure costs at most the
partition in flight. Larger partitions cost less per partition (one write, one batch plan), smaller
ones lose less work when a worker dies (docs/transforms/synthesize.md measures both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prepline.config import TransformConfig, param
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

DEFAULT_TEMPLATES = (
    "wiki=Rewrite the following text as a short, factual encyclopedia paragraph.\n\nText: {text}\n\nParagraph:",
    "qa=Write questions about the following text, each followed by its answer.\n\nText: {text}\n\nQuestions and answers:",
    "simple=Rewrite the following text in simple English that a child can follow.\n\nText: {text}\n\nSimple version:",
)
_NAME = re.compile(r"^[a-z0-9_]{1,40}$")
#: new documents' ids: ID_BASE + source id * ID_SLOTS + template index
ID_BASE, ID_SLOTS, MAX_SOURCE_ID = 1 << 62, 64, 1 << 55
#: the work folder's partitions: <PARTS>/<input file>/<first row>.parquet and .json (the marker)
PARTS = "synthesize"
PROVENANCE = pa.schema([("synth_source_id", pa.int64()), ("synth_template", pa.string()), ("synth_model", pa.string()),
                        ("synth_model_sha256", pa.string()), ("synth_engine", pa.string()), ("synth_sampling", pa.string()),
                        ("synth_seed", pa.int64()), ("synth_prompt_tokens", pa.int32()), ("synth_new_tokens", pa.int32())])


def parse_templates(entries: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for entry in entries:
        name, sep, prompt = entry.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise ConfigError(f"template {entry[:60]!r} is not name=prompt (name: a-z, 0-9, _)",
                              "write templates as name=prompt, e.g. --templates 'wiki=Rewrite as an encyclopedia paragraph: {text}'")
        if prompt.count("{text}") != 1:
            raise ConfigError(f"template {name!r} must hold {{text}} exactly once (where the document goes)",
                              f"e.g. {name}=Rewrite the following text in simple English: {{text}}")
        if name in {n for n, _ in out}:
            raise ConfigError(f"template {name!r} is given twice", "give every template its own name")
        out.append((name, prompt))
    if not out:
        raise ConfigError("synthesize needs at least one template", "pass --templates name=prompt (with {text})")
    if len(out) > ID_SLOTS:
        raise ConfigError(f"{len(out)} templates: at most {ID_SLOTS}", "split the templates over two synthesize stages")
    return out


@dataclass(frozen=True)
class SynthesizeConfig(TransformConfig):
    model_path: str = param("", "causal LM folder, local or s3://: fine_tune's <output>/model (config.json, model.pt, "
                                "tokenizer.json) or a Hugging Face folder")
    templates: list[str] = param(list(DEFAULT_TEMPLATES), "rephrasing prompts as name=prompt entries; {text} is the document")
    content_column: str = param("contents", "column holding the document text")
    id_column: str = param("doc_id", "int64 id of each document (doc_id's): the provenance of a new document")
    engine: str = param("auto", "torch (CPU), vllm (GPU, a Hugging Face folder) or auto (vllm when it can run)", choices=("auto", "torch", "vllm"))
    max_new_tokens: int = param(64, "tokens generated per request at most", min=1)
    max_prompt_tokens: int = param(192, "tokens of the document put in the prompt at most (its start)", min=1)
    temperature: float = param(0.8, "sampling temperature (0: greedy)", min=0.0)
    top_k: int = param(50, "sample among the k likeliest tokens (0: all)", min=0)
    seed: int = param(0, "base seed: a request's seed is derived from it, the source id and the template", min=0)
    batch_tokens: int = param(8192, "tokens per generation batch (prompts and new tokens; the torch engine)", min=1)
    partition_docs: int = param(64, "documents per checkpointed partition: a killed worker loses at most one", min=1)
    keep_originals: bool = param(True, "write the original documents too (else they are counted as removed: rephrased)")

    def validate(self) -> None:
        if not self.model_path:
            raise ConfigError("synthesize needs a model: model_path is empty",
                              "pass --model-path <folder of fine_tune's output/model, or a Hugging Face folder; local or s3://>")
        parse_templates(self.templates)
        if self.content_column == self.id_column:
            raise ConfigError("content_column and id_column are the same column", "name the text and the id columns")


def request_seed(seed: int, source_id: int, template: str) -> int:
    digest = hashlib.sha256(f"{seed}:{source_id}:{template}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@register
class Synthesize(Transform):
    name = "synthesize"
    Config = SynthesizeConfig
    summary = "rephrase documents with a causal LM (torch on CPU, vLLM on GPU) into new documents with provenance; checkpointed partitions"
    extra = "train"
    uses_gpu = True  # vLLM on the GPU group's pods
    headline = ("generated.*", "removed.*", "synth_*")

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string", nullable=True),
                Column(self.config.id_column, "int64", fix="run doc_id first (it numbers every document), or set id_column")]

    def added_columns(self) -> list[str]:
        return list(PROVENANCE.names)

    def check_resources(self) -> None:
        """The model folder has config.json and a tokenizer that loads (no weights read)."""
        from prepline.tokens.tokenizer import build_tokenizer, read_file

        path = self.config.model_path.rstrip("/")
        if path.startswith("run:"):
            return
        if path.startswith("override:"):  # a pipeline spec's placeholder (specs/super_synthetic.yaml)
            raise ConfigError(f"synthesize's model_path is not set: the pipeline spec leaves it to you ({path})",
                              "pass --param 'overrides_json={\"synthesize\": {\"params\": {\"model_path\": \"<model folder, local or s3://>\"}}}'")
        if read_file(f"{path}/config.json") is None:
            raise ConfigError(f"model_path {path!r} is not a model folder (no config.json)",
                              "pass fine_tune's <output>/model or a Hugging Face folder, local or s3://")
        build_tokenizer(path)

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        self.check_resources()

    def setup(self, ctx) -> None:
        from prepline.generation import Sampling, fetch_model, load_engine
        from prepline.tokens.tokenizer import build_tokenizer

        c = self.config
        self._ctx = ctx
        self._templates = parse_templates(c.templates)
        model = fetch_model(c.model_path)  # read once: hashed, and copied here when it is remote
        self._tok = build_tokenizer(model.path)
        self._sampling = Sampling(c.max_new_tokens, c.temperature, c.top_k)
        self._engine, self._info = load_engine(model, c.engine, self._sampling, self._tok.eos_id, c.batch_tokens, c.seed)
        self._parts = [tuple(self._tok.tokenizer.encode(p, add_special_tokens=False).ids for p in prompt.split("{text}"))
                       for _, prompt in self._templates]
        fixed = max(len(head) + len(tail) for head, tail in self._parts)
        if self._engine.max_seq_len - c.max_new_tokens - fixed < 1:
            raise ConfigError(f"the templates ({fixed} tokens) and max_new_tokens={c.max_new_tokens} leave no room for the document "
                              f"in the model's {self._engine.max_seq_len} positions",
                              "shorten the templates or lower max_new_tokens")
        self._fingerprint = hashlib.sha256(json.dumps([dataclasses.asdict(c), self._info["model_sha256"], self._info["engine"]],
                                                      sort_keys=True, default=str).encode()).hexdigest()

    def read_batches(self, task: FileTask, ctx):
        """The file in partitions of exactly ``partition_docs`` rows (the last one shorter): the
        same partitions on every run, so that finished ones are found again."""
        size = self.config.partition_docs
        pending: list[pa.Table] = []
        have, sent, schema = 0, False, None
        for table in ctx.iter_input(task, self, None):
            schema = table.schema
            if table.num_rows:
                pending.append(table)
                have += table.num_rows
            while have >= size:
                whole = pa.concat_tables(pending)
                yield whole.slice(0, size)
                sent = True
                rest = whole.slice(size)
                pending, have = ([rest] if rest.num_rows else []), rest.num_rows
        if pending:
            yield pa.concat_tables(pending)
        elif not sent and schema is not None:  # an empty file: one empty table, as the framework's read gives
            yield schema.empty_table()

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        key = f"{PARTS}/{task.rel}/{task.first_row:012d}"
        work = self._ctx.work
        done = work.read_text(f"{key}.json")
        if done:
            marker = json.loads(done)
            if marker.get("fingerprint") == self._fingerprint and marker.get("rows_in") == table.num_rows:
                out = pq.read_table(io.BytesIO(work.read_bytes(f"{key}.parquet")))
                return Output.of(out, marker["removed"], marker["counters"], generated=marker["generated"])
        out, removed, counters, generated = self._rephrase(table, task)
        buf = io.BytesIO()
        pq.write_table(out, buf)
        work.write_bytes(f"{key}.parquet", buf.getvalue())
        work.write_bytes(f"{key}.json", json.dumps({"fingerprint": self._fingerprint, "rows_in": table.num_rows, "removed": removed,
                                                     "counters": counters, "generated": generated}).encode())
        return Output.of(out, removed, counters, generated=generated)

    def _rephrase(self, table: pa.Table, task: FileTask):
        c = self.config
        n = table.num_rows
        text = table.column(c.content_column)
        ids = table.column(c.id_column).to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)
        if n and (ids.min() < 0 or ids.max() >= MAX_SOURCE_ID):
            raise InputError(f"{task.path}: {c.id_column} holds ids outside 0..2**55 (e.g. {int(ids.min())} / {int(ids.max())}); "
                             "new documents are numbered from them", "run doc_id first (it numbers documents from 0)")
        has = np.asarray(pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0), False).to_numpy(zero_copy_only=False), dtype=bool)
        rows = np.flatnonzero(has)
        docs = [e.ids[:c.max_prompt_tokens] for e in self._tok.tokenizer.encode_batch(text.take(pa.array(rows)).to_pylist(),
                                                                                      add_special_tokens=False)] if len(rows) else []
        prompts, seeds, who = [], [], []
        room = self._engine.max_seq_len - c.max_new_tokens
        for j, r in enumerate(rows.tolist()):
            for t, (name, _) in enumerate(self._templates):
                head, tail = self._parts[t]
                body = docs[j][:max(0, room - len(head) - len(tail))]
                prompts.append(list(head) + body + list(tail))
                seeds.append(request_seed(c.seed, int(ids[r]), name))
                who.append((r, t))
        new = self._engine.generate(prompts, seeds) if prompts else []
        texts = self._tok.tokenizer.decode_batch(new, skip_special_tokens=True) if new else []
        keep = [k for k, s in enumerate(texts) if s.strip()]
        kept = set(keep)
        generated: dict[str, int] = {}
        counters: dict[str, int] = {}
        for k in range(len(texts)):
            name = self._templates[who[k][1]][0]
            if k in kept:
                generated[name] = generated.get(name, 0) + 1
            else:
                counters[f"synth_empty_{name}"] = counters.get(f"synth_empty_{name}", 0) + 1
        src = np.array([who[k][0] for k in keep], dtype=np.int64)
        tix = np.array([who[k][1] for k in keep], dtype=np.int64)
        synth = table.take(pa.array(src, pa.int64())) if len(keep) else table.schema.empty_table()
        col = synth.schema.get_field_index(c.content_column)
        synth = synth.set_column(col, synth.schema.field(col), pa.array([texts[k] for k in keep], pa.string()).cast(synth.schema.field(col).type))
        idx = synth.schema.get_field_index(c.id_column)
        source_ids = ids[src] if len(keep) else np.zeros(0, np.int64)
        synth = synth.set_column(idx, synth.schema.field(idx), pa.array(ID_BASE + source_ids * ID_SLOTS + tix, pa.int64()))
        info = self._info
        prov = {
            "synth_source_id": pa.array(source_ids, pa.int64()),
            "synth_template": pa.array([self._templates[t][0] for t in tix.tolist()], pa.string()),
            "synth_model": pa.array([info["model"]] * len(keep), pa.string()),
            "synth_model_sha256": pa.array([info["model_sha256"]] * len(keep), pa.string()),
            "synth_engine": pa.array([info["engine"]] * len(keep), pa.string()),
            "synth_sampling": pa.array([self._sampling.to_json()] * len(keep), pa.string()),
            "synth_seed": pa.array([seeds[k] for k in keep], pa.int64()),
            "synth_prompt_tokens": pa.array([len(prompts[k]) for k in keep], pa.int32()),
            "synth_new_tokens": pa.array([len(new[k]) for k in keep], pa.int32()),
        }
        for f in PROVENANCE:
            synth = synth.append_column(f, prov[f.name])
        removed: dict[str, int] = {}
        skipped = int(n - len(rows))
        if c.keep_originals:
            originals = table
            for f in PROVENANCE:
                originals = originals.append_column(f, pa.nulls(n, f.type))
            out = pa.concat_tables([originals, synth])
            if skipped:
                counters["synth_skipped_no_text"] = skipped
        else:
            out = synth
            removed = {k: v for k, v in (("rephrased", int(len(rows))), ("no_text", skipped)) if v}
        return out, removed, counters, generated
