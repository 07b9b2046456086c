"""Smoke test of a prepline runtime: every registered transform runs, chained in the super
pipeline's order, on a small multilingual corpus, with nothing fetched from the network.

The Ray image runs it at build time with ``RUN --network=none`` (and ``HF_HUB_OFFLINE=1``): a
model that is not baked into the image fails the build. It also compiles numba's passes
(:mod:`prepline.kernels`) into the image. tests/runtime_images runs it in the
project's .venv.

    python runtime_images/smoke_test.py [WORK_DIR]
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: parameters a transform needs beyond its defaults to run on this corpus
PARAMS = {
    "filter": {"criteria": ["length(trim(contents)) >= 20"]},
    "tokenization": {"vocab_size": 300},
    "c4_clean": {"min_sentences": 1},  # the corpus's documents are one or two sentences long
}

#: an evaluation set sharing a sentence with the corpus: decontaminate must flag that document
CONTAMINATED = 1
#: documents unlike the corpus: the negative class of the quality classifier the smoke test trains
SPAM = ["BUY NOW cheap pills click here free free free winner winner", "click here to win a prize now now now limited offer",
        "cheap loans fast cash no credit check apply today click", "hot singles in your area click now free access today"]

EN = [
    "The river rose overnight and the old bridge was closed to traffic until the engineers could inspect it.",
    "Our team meets every Tuesday to review open issues, plan the next release and share what we learned.",
    "Fresh bread, a little butter and a cup of strong coffee make the best breakfast on a cold morning.",
    "Please write to jane.doe@example.com or call +1 415 555 0134 if the delivery does not arrive on time.",
    "The library extends its opening hours during exams so that students have a quiet place to work late.",
    "A careful review of the budget showed that most of the savings came from cheaper energy contracts.",
]
JA = [
    "今日は朝から雨が降っていたので、駅まで歩かずにバスに乗って会社へ行きました。",
    "新しい図書館は駅の近くにあり、週末になると多くの家族連れでにぎわっています。",
    "来週の会議では、今年の計画と予算について全員で話し合う予定になっています。",
    "祖母が作ってくれた味噌汁の味は、今でもはっきりと覚えていてとても懐かしいです。",
]
FR = [
    "Le marché du samedi matin attire les habitants du quartier qui viennent acheter des légumes frais.",
    "Nous avons visité le musée hier après-midi et nous avons beaucoup aimé la nouvelle exposition.",
    "La réunion de lundi est reportée à jeudi parce que plusieurs membres de l'équipe sont en congé.",
    "Il faut arroser les plantes du balcon tous les deux jours pendant les semaines les plus chaudes.",
]


def stage_order() -> list[str]:
    """The shipped super pipeline's stage order, ingest first (its spec: package data, no kfp needed)."""
    from prepline.pipelines.spec import shipped

    return shipped().order()


def build_corpus(folder: Path) -> int:
    texts = EN + JA + FR
    texts = texts + [texts[0], texts[6] + " ", "", "short"]  # an exact duplicate, a near one, empty and short documents
    folder.mkdir(parents=True, exist_ok=True)
    half = len(texts) // 2
    # raw input as users have it (JSONL.gz with a "text" field): ingest turns it into Parquet
    for i, part in enumerate((texts[:half], texts[half:])):
        with gzip.open(folder / f"part-{i}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in part)
    return len(texts)


def resources(work: Path) -> dict[str, dict]:
    """Parameters of the transforms that need files: an evaluation set, a quality classifier
    trained here with ``prepline quality train``'s function (fastText from the image, no download),
    and a tiny causal LM for synthesize (a BPE trained on the corpus, random weights: no download)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prepline.quality import train_quality_classifier

    evals = work / "evals.jsonl"
    evals.write_text(json.dumps({"question": EN[CONTAMINATED], "answer": "yes"}) + "\n", encoding="utf-8")
    # pairs of sentences (fastText reported NaN on and off on the bare 18; these train 16 of 16 times)
    good = [a + " " + b for a in EN + FR for b in EN[:3]]
    spam = [a + " " + b for a in SPAM for b in SPAM * 5]
    for name, texts in (("good", good), ("spam", spam)):
        (work / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"contents": texts}), work / name / "part-0.parquet")
    train_quality_classifier(str(work / "good"), str(work / "spam"), str(work / "quality_model"), {"min_count": 1, "epoch": 5})
    return {"decontaminate": {"eval_sets": [f"smoke={evals}:question,answer"]},
            "quality_classifier": {"model_path": str(work / "quality_model")},
            "synthesize": {"model_path": tiny_lm(work / "lm"), "templates": ["wiki=Rewrite: {text} Paragraph:"], "max_new_tokens": 8}}


def tiny_lm(folder: Path) -> str:
    """A prepline model folder (config.json, model.pt, tokenizer.json) made here, as fine_tune writes one."""
    import torch

    from prepline.tokens.tokenizer import train_bpe
    from prepline.train.model import FORMAT, FORMAT_VERSION, CausalLM, ModelConfig

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(EN + JA + FR, 400)
    (folder / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    torch.manual_seed(0)
    mc = ModelConfig(vocab_size=tok.get_vocab_size(), max_seq_len=256, n_layer=1, n_head=2, d_model=32)
    torch.save(CausalLM(mc).state_dict(), folder / "model.pt")
    (folder / "config.json").write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": mc.to_dict()}))
    return str(folder)


def run(work: Path) -> dict[str, dict]:
    from prepline import registry
    from prepline.engine import RunOptions, run_transform

    names = registry.names()
    order = stage_order()
    order = [n for n in order if n in names] + sorted(set(names) - set(order))
    src = work / "input"
    n = build_corpus(src)
    params = {**PARAMS, **resources(work)}
    results = {}
    for name in order:
        t0 = time.perf_counter()
        out = work / name
        meta = run_transform(name, params.get(name, {}), RunOptions(input=str(src), output=str(out), workers=1, progress=False)).metadata
        t = meta["totals"]
        assert meta["status"] == "success", (name, meta.get("failures"))
        assert t["docs_in"] + sum(t.get("generated", {}).values()) == t["docs_out"] + sum(t["removed"].values()), (name, t)
        print(f"{name:>18}: {t['docs_in']:>3} in, {t['docs_out']:>3} out, removed {t['removed']} ({time.perf_counter() - t0:.1f}s)",
              flush=True)
        results[name] = meta
        src = out
    assert results[order[0]]["totals"]["docs_in"] == n
    check_models(work, names)
    return results


def _table(folder: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(f) for f in sorted(folder.rglob("*.parquet")) if "_prepline" not in f.parts])


def check_models(work: Path, names: list[str]) -> None:
    """The model-backed stages really used their models (not a silent fallback)."""
    if "lang_id" in names:
        t = _table(work / "lang_id").to_pydict()
        lang = dict(zip(t["contents"], t["lang"]))
        for texts, code in ((EN, "en"), (JA, "ja"), (FR, "fr")):
            got = [lang[x] for x in texts if x in lang]
            assert got and all(g == code for g in got), (code, got)
    if "pii_redactor" in names:
        texts = _table(work / "pii_redactor").column("contents").to_pylist()
        assert not any("jane.doe@example.com" in x for x in texts), "the e-mail address was not redacted"
    if "hap" in names:
        scores = _table(work / "hap").column("hap_score").to_pylist()
        assert all(0.0 <= s <= 1.0 for s in scores), scores
    if "decontaminate" in names:
        t = _table(work / "decontaminate").to_pydict()
        caught = [x for x, s in zip(t["contents"], t["decont_set"]) if s]
        assert caught == [EN[CONTAMINATED]], caught
    if "quality_classifier" in names:
        scores = _table(work / "quality_classifier").column("quality_score").to_pylist()
        assert scores and all(s is not None and 0.0 <= s <= 1.0 for s in scores), scores
    if "tokenization" in names:
        t = _table(work / "tokenization")
        assert min(t.column("num_tokens").to_pylist()) > 0
    if "synthesize" in names:
        t = _table(work / "synthesize")
        made = t.filter(t.column("synth_template").is_valid())
        assert made.num_rows > 0 and made.column("synth_model_sha256").null_count == 0, made.num_rows


def main() -> int:
    from prepline.kernels import warm

    # numba's compiled passes, compiled here into the image (its cache, next to the installed source):
    # a worker pod loads them instead of compiling them again
    print(f"compiled passes: {warm()}")
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp))
    print("smoke test passed: every transform ran offline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
