"""Run one stage with datatrove's own blocks on the local executor, 2 workers.

    .venv-peers/datatrove/bin/python benchmarks/peers/run_datatrove.py STAGE INPUT OUTPUT ASSETS.json

Runs inside the datatrove virtual environment (benchmarks/peers/requirements-datatrove.txt), never
imports prepline. Every stage reads the Parquet input with ``ParquetReader`` (one task per file,
``workers=2``) and writes ``ParquetWriter`` output, with datatrove's defaults except where a
default needs the network:

* lang_id: ``LanguageFilter(label_only=True)`` with its fastText model object pointed at the
  lid.176.ftz prepline ships (the default downloads lid.176.bin);
* fuzzy and doc_quality: a whitespace word tokenizer (the English default, NLTK punkt, needs a
  data download); minhash otherwise on its defaults (5-grams, 14 buckets x 8 hashes);
* tokenization: ``DocumentTokenizer`` with the same tokenizer.json as every tool, no EOS, no
  shuffling (prepline does not shuffle either);
* doc_quality: ``GopherQualityFilter`` + ``GopherRepetitionFilter`` (datatrove filters where
  prepline and DPK annotate; C4's bad-word list would be downloaded);
* url_filter, decontaminate: see their functions (no integrated lists, no lighteval).
* line_dedup: ``SentenceDedup`` on lines (see its function).
* quality_classifier: ``FastTextClassifierFilter`` with the model prepline trained (see its function).
* c4_clean: ``C4QualityFilter`` on its defaults (English: its sentence counts come from spaCy's
  sentencizer, no model download); ``C4BadWordsFilter`` is not run (its lists are downloaded),
  nor are prepline's bad words (``filter_bad_words`` false on prepline's side).
"""

from __future__ import annotations

import json
import os
import sys

from datatrove.utils.word_tokenizers import WordTokenizer

WORKERS = 2


class WhitespaceWords(WordTokenizer):
    """Words split on white space; sentences on line breaks."""

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [s for s in text.splitlines() if s.strip()]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        out, at = [], 0
        for s in text.splitlines(keepends=True):
            out.append((at, at + len(s.rstrip("\n"))))
            at += len(s)
        return out


def document_text(doc) -> str:
    """ExactDedupConfig's content getter (datatrove has no default): the raw text, as datatrove's examples do."""
    return doc.text


def _files(src: str) -> int:
    return len([f for f in os.listdir(src) if f.endswith(".parquet")])


def _run(steps: list[tuple[list, int, int]], dst: str) -> None:
    from datatrove.executor import LocalPipelineExecutor

    prev = None
    for n, (pipeline, tasks, workers) in enumerate(steps):
        prev = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=workers, depends=prev,
                                     logging_dir=os.path.join(dst, "_logs", f"step{n}"))
    prev.run()


def _reader(src: str):
    from datatrove.pipeline.readers import ParquetReader

    return ParquetReader(src, text_key="contents", id_key="id")


def _writer(dst: str):
    from datatrove.pipeline.writers import ParquetWriter

    return ParquetWriter(os.path.join(dst, "output"), expand_metadata=True)


def exact_dedup(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig, ExactDedupFilter, ExactDedupSignature, ExactFindDedups

    cfg, work, f = ExactDedupConfig(content_getter=document_text), os.path.join(dst, "_work"), _files(src)
    _run([([_reader(src), ExactDedupSignature(output_folder=f"{work}/sigs", config=cfg)], f, WORKERS),
          ([ExactFindDedups(data_folder=f"{work}/sigs", output_folder=f"{work}/dups", config=cfg)], 1, 1),
          ([_reader(src), ExactDedupFilter(data_folder=f"{work}/dups", config=cfg), _writer(dst)], f, WORKERS)], dst)


def fuzzy_dedup(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    cfg, work, f = MinhashConfig(), os.path.join(dst, "_work"), _files(src)
    _run([([_reader(src), MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg, language=WhitespaceWords("en"))], f, WORKERS),
          ([MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)], cfg.num_buckets, WORKERS),
          ([MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove", config=cfg)], 1, 1),
          ([_reader(src), MinhashDedupFilter(input_folder=f"{work}/remove"), _writer(dst)], f, WORKERS)], dst)


def _local_fasttext(path: str) -> property:
    """A ``model`` property for a datatrove block that loads its fastText model from ``path`` (the
    block's default downloads it) on first use, into the block's ``_model``."""

    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(path)
        return self._model

    return property(model)


def lang_id(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.utils.lid import FT176LID

    class PackagedFT176(FT176LID):
        model = _local_fasttext(assets["lid_model"])

    lf = LanguageFilter(label_only=True)
    lf.model = PackagedFT176()
    _run([([_reader(src), lf, _writer(dst)], _files(src), WORKERS)], dst)


def doc_quality(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter

    words = WhitespaceWords("en")
    steps = [_reader(src), GopherRepetitionFilter(language=words), GopherQualityFilter(language=words), _writer(dst)]
    _run([(steps, _files(src), WORKERS)], dst)


def c4_clean(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.filters import C4QualityFilter

    _run([([_reader(src), C4QualityFilter(), _writer(dst)], _files(src), WORKERS)], dst)


def filter(src: str, dst: str, assets: dict) -> None:  # noqa: A001 - the stage's name
    from datatrove.pipeline.filters import LambdaFilter

    _run([([_reader(src), LambdaFilter(lambda doc: len(doc.text) >= 20), _writer(dst)], _files(src), WORKERS)], dst)


def tokenization(src: str, dst: str, assets: dict) -> None:
    from datatrove.pipeline.tokens import DocumentTokenizer

    tok = DocumentTokenizer(output_folder=os.path.join(dst, "tokens"), tokenizer_name_or_path=assets["tokenizer_json"],
                            eos_token=None, shuffle_documents=False)
    _run([([_reader(src), tok], _files(src), WORKERS)], dst)


def url_filter(src: str, dst: str, assets: dict) -> None:
    """``URLFilter`` with the lists and words prepline gets (harness.py), without the integrated lists
    (prepline ships none), the public suffix list from tldextract's bundled snapshot (no download),
    and documents without a URL kept (datatrove asserts one; prepline lets them pass)."""
    from datatrove.pipeline.filters import URLFilter
    from tldextract import TLDExtract

    class KeepMissing(URLFilter):
        def filter(self, document):
            return True if not document.metadata.get("url") else super().filter(document)

    with open(assets["domains_txt"]) as f:
        domains = [line.strip() for line in f if line.strip()]
    uf = KeepMissing(extra_domains=domains, banned_words=["porn", "casino"], soft_banned_words=["free", "cheap", "pills"],
                     use_integrated_lists=False)
    uf.tldextractor = TLDExtract(suffix_list_urls=())
    _run([([_reader(src), uf, _writer(dst)], _files(src), WORKERS)], dst)


def decontaminate(src: str, dst: str, assets: dict) -> None:
    """``NGramsDecontFilter`` (13-grams, white-space words) with its index of the evaluation set's
    n-grams written as ``NGramsDecontIndexer`` writes it (which needs lighteval to load tasks):
    datatrove's ``simplify_text`` and hash function over each text's n-grams."""
    import numpy as np
    from datatrove.pipeline.decont import NGramsDecontConfig, NGramsDecontFilter
    from datatrove.utils.hashing import create_hash_func
    from datatrove.utils.text import ngrams, simplify_text

    cfg, words = NGramsDecontConfig(n_grams=13), WhitespaceWords("en")
    h = create_hash_func(cfg.hash_config)
    hashes = set()
    with open(assets["eval_jsonl"]) as f:
        for line in f:
            toks = words.word_tokenize(simplify_text(json.loads(line)["text"], cfg.norm_config))
            hashes.update(h(" ".join(g)) for g in ngrams(toks, cfg.n_grams))
    index = os.path.join(dst, "_index")
    os.makedirs(index, exist_ok=True)
    np.array(sorted(hashes), dtype=cfg.hash_config.np_descr).tofile(os.path.join(index, "bench.index.hashes"))
    _run([([_reader(src), NGramsDecontFilter(index_folder=index, config=cfg, language=words), _writer(dst)], _files(src), WORKERS)], dst)


def line_dedup(src: str, dst: str, assets: dict) -> None:
    """``SentenceDedup`` at its closest to line_dedup: spans of one line (``split_sentences=False``,
    ``n_sentences=1``), every copy of a recurring line but the first removed (C4's rule, where
    line_dedup removes all copies of a line in more than ``max_docs`` documents: not the same
    decisions, so only lines removed are compared); no minimum of words or sentences left (those
    are doc_quality's job in prepline), a document left empty goes."""
    from datatrove.pipeline.dedup.sentence_dedup import SentDedupConfig, SentenceDedupFilter, SentenceDedupSignature, SentenceFindDedups

    cfg = SentDedupConfig(n_sentences=1, split_sentences=False, min_doc_words=0, min_num_sentences=0)
    work, f, words = os.path.join(dst, "_work"), _files(src), WhitespaceWords("en")
    _run([([_reader(src), SentenceDedupSignature(output_folder=f"{work}/sigs", config=cfg, language=words)], f, WORKERS),
          ([SentenceFindDedups(data_folder=f"{work}/sigs", output_folder=f"{work}/dups", config=cfg)], 1, 1),
          ([_reader(src), SentenceDedupFilter(data_folder=f"{work}/dups", config=cfg, language=words), _writer(dst)], f, WORKERS)], dst)


def quality_classifier(src: str, dst: str, assets: dict) -> None:
    """``FastTextClassifierFilter`` with the model prepline trained (assets' quality_model), keeping a
    score of at least 0.5 for hq; newlines become spaces, as prepline puts a document on one line."""
    from datatrove.pipeline.filters import FastTextClassifierFilter

    class LocalModel(FastTextClassifierFilter):
        model = _local_fasttext(assets["quality_model"])

    step = LocalModel(assets["quality_model"], keep_labels=("hq", 0.5), newline_replacement=" ")
    _run([([_reader(src), step, _writer(dst)], _files(src), WORKERS)], dst)


STAGES = {f.__name__: f for f in (exact_dedup, fuzzy_dedup, lang_id, doc_quality, c4_clean, filter, tokenization, url_filter, decontaminate,
                                  line_dedup, quality_classifier)}

if __name__ == "__main__":
    stage, src, dst, assets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(open(sys.argv[4]).read())
    STAGES[stage](src, dst, assets)
