"""``scripts/bench.py --peers``: prepline, Data Prep Kit and datatrove on the same corpus, same run.

Each peer lives in its own virtual environment under ``.venv-peers/<name>``, created on demand
from PyPI with the exact pins of ``benchmarks/peers/requirements-<name>.txt`` (made with ``pip
freeze`` after installing the packages named at its top). Every stage of every tool runs as its
own process, started through the same launcher as the stage benchmark (wall seconds and the peak
RSS of its largest process), one after the other, so the ratios of a row were measured under the
same load. The tools get the same files: the peer corpus (``corpus.py``), the fastText lid.176.ftz
and the GPT-2 BPE tokenizer that prepline ships (both peers' defaults download theirs from a hub).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS = ("dpk", "datatrove")
TITLES = {"prepline": "prepline", "dpk": "DPK", "datatrove": "datatrove"}
CRITERIA = ["length(contents) >= 20"]  # the filter of every tool (run_dpk.py, run_datatrove.py say the same)


@dataclass(frozen=True)
class PeerStage:
    name: str
    input: str  # corpus | nodups
    params: dict = field(default_factory=dict)
    peers: tuple[str, ...] = PEERS


STAGES = [
    PeerStage("doc_id", "corpus", {"hash_column": "doc_hash", "id_column": "row_id"}, ("dpk",)),
    PeerStage("exact_dedup", "corpus"),
    PeerStage("fuzzy_dedup", "nodups"),
    PeerStage("doc_quality", "corpus"),
    # C4's line cleaning; bad words off (datatrove's C4BadWordsFilter downloads its lists)
    PeerStage("c4_clean", "corpus", {"filter_bad_words": False}, ("datatrove",)),
    PeerStage("filter", "corpus", {"criteria": CRITERIA}),
    PeerStage("lang_id", "corpus"),
    # the training output (the Megatron dataset, as datatrove writes its token files) and num_tokens,
    # without the optional Parquet column of token lists (the super pipeline's setting; DPK's output is that column)
    PeerStage("tokenization", "corpus", {"tokenizer": "<tokenizer_dir>", "tokens_column": ""}),
    # web-text stages (issue 27): the corpus with URLs, user lists and words that both tools take the
    # same way (lower-case URLs, registered domains listed); an evaluation set of excerpts of the corpus
    PeerStage("url_filter", "urls", {"domain_lists": ["<domains_txt>"], "use_default_words": False,
                                     "banned_words": ["porn", "casino"], "soft_banned_words": ["free", "cheap", "pills"],
                                     "action": "remove"}, ("datatrove",)),
    PeerStage("decontaminate", "corpus", {"eval_sets": ["bench=<eval_jsonl>:text"], "action": "remove"}, ("datatrove",)),
    # corpus-level line removal on the corpus without its planted exact copies (after exact_dedup, as in the
    # super pipeline); datatrove's SentenceDedup on lines keeps a line's first copy: lines removed compared, not decisions
    PeerStage("line_dedup", "nodups", {}, ("datatrove",)),
    # a fastText classifier trained by prepline before the run (quality_model: English against the rest of the
    # corpus, a stand-in for the DCLM recipe's reference set); the same model file, a score >= 0.5 kept
    PeerStage("quality_classifier", "corpus", {"model_path": "<quality_model>"}, ("datatrove",)),
]
#: the domains url_filter's lists block in the peer corpus (web_inputs)
BLOCKED_DOMAINS = ("spam-farm.com", "link-mill.net", "ads.example.org")


def ensure_venv(name: str, log=print) -> Path:
    """The interpreter of .venv-peers/<name>, created and installed from its requirements file when needed."""
    req = HERE / f"requirements-{name}.txt"
    d = ROOT / ".venv-peers" / name
    py, stamp = d / "bin" / "python", d / ".installed"
    want = hashlib.sha256(req.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want and py.exists():
        return py
    log(f"[peers] installing {name} into {d} from {req.name} (first time: minutes)")
    if not py.exists():
        base = shutil.which("python3.11") or sys.executable
        subprocess.run([base, "-m", "venv", str(d)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(req)], check=True)
    stamp.write_text(want + "\n")
    return py


def make_assets(folder: Path) -> dict:
    """The model files every tool uses: prepline's packaged lid.176.ftz and GPT-2 BPE tokenizer."""
    from prepline.tokens.tokenizer import build_tokenizer
    from prepline.transforms.lang_id import packaged_model

    tok_dir = folder / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    loaded = build_tokenizer("gpt2")
    (tok_dir / "tokenizer.json").write_text(loaded.json_text)
    # what transformers' AutoTokenizer needs to load the same file (DPK): no special tokens added
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": loaded.eos_token, "model_max_length": 10**9}))
    assets = {"lid_model": str(packaged_model()), "tokenizer_dir": str(tok_dir), "tokenizer_json": str(tok_dir / "tokenizer.json")}
    (folder / "assets.json").write_text(json.dumps(assets, indent=2))
    return assets


def quality_model(base: Path, assets: dict, per_class: int = 3000) -> None:
    """``assets/quality/quality.bin``: a fastText classifier trained with ``prepline quality train``
    on up to ``per_class`` English documents of the corpus (label hq) against as many of the other
    languages (lq), once; its held-out figures in ``quality_model.json`` next to it."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from prepline.quality import train_quality_classifier

    out = base / "assets" / "quality"
    if not (out / "quality.bin").exists():
        truth = pq.read_table(base / "truth" / "docs.parquet", columns=["id", "lang"])
        corpus = pq.read_table(base / "corpus", columns=["id", "contents"])
        en = pc.is_in(corpus.column("id"), value_set=truth.filter(pc.equal(truth.column("lang"), "en")).column("id"))
        for name, mask in (("hq", en), ("lq", pc.invert(en))):
            (base / "assets" / name).mkdir(parents=True, exist_ok=True)
            pq.write_table(corpus.filter(mask).slice(0, per_class), base / "assets" / name / "part-0.parquet")
        train_quality_classifier(str(base / "assets" / "hq"), str(base / "assets" / "lq"), str(out))
    assets["quality_model"] = str(out / "quality.bin")
    (base / "assets" / "assets.json").write_text(json.dumps(assets, indent=2))


def web_inputs(base: Path, assets: dict) -> None:
    """``urls/``: the corpus with a ``url`` column (about 1 in 8 blocked by domain, 1 in 12 by a banned
    word, 1 in 15 by soft words, 1 in 40 without a URL), ``domains.txt``, and ``eval.jsonl``: 30-word
    excerpts of every 40th document, for url_filter and decontaminate. Deterministic."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(27)
    (base / "urls").mkdir(exist_ok=True)
    excerpts = []
    for f in sorted((base / "corpus").glob("*.parquet")):
        t = pq.read_table(f)
        urls = []
        for i, text in enumerate(t.column("contents").to_pylist()):
            r = rng.random()
            host = rng.choice(["www.", "news.", "a.b.", ""]) + (rng.choice(BLOCKED_DOMAINS) if r < 0.125 else
                                                              rng.choice(["example.com", "wiki.org", "blog.net", "shop.de"]))
            path = rng.choice(["article", "post", "page", "story"]) + f"-{rng.randrange(10**6)}"
            if 0.125 <= r < 0.21:
                path = rng.choice(["porn", "casino"]) + "-" + path
            elif 0.21 <= r < 0.28:
                path = "free-cheap-pills/" + path
            elif 0.28 <= r < 0.31:
                path = "free/" + path  # one soft word: passes
            urls.append(None if 0.31 <= r < 0.335 else f"https://{host}/{path}.html")
            words = (text or "").split()
            if rng.random() < 1 / 40 and len(words) > 60:
                at = rng.randrange(len(words) - 30)
                excerpts.append(" ".join(words[at:at + 30]))
        pq.write_table(t.append_column("url", pa.array(urls, pa.string())), base / "urls" / f.name)
    (base / "assets" / "domains.txt").write_text("\n".join(BLOCKED_DOMAINS) + "\n")
    (base / "assets" / "eval.jsonl").write_text("".join(json.dumps({"text": e}) + "\n" for e in excerpts))
    assets.update(domains_txt=str(base / "assets" / "domains.txt"), eval_jsonl=str(base / "assets" / "eval.jsonl"))
    (base / "assets" / "assets.json").write_text(json.dumps(assets, indent=2))


def _output(tool: str, stage: str, dst: Path) -> Path:
    if tool == "dpk" and stage == "fuzzy_dedup":
        return dst / "cleaned"
    if tool == "datatrove":
        return dst / ("tokens" if stage == "tokenization" else "output")
    return dst


def _dpk_fdedup_input(src: Path) -> Path:
    """DPK 1.1.8's fdedup cluster step reads the id column by its default name whatever
    --document_id_column says (dpk_fdedup/cluster_analysis/transform.py, _jaccard_distance_calculation):
    its input gets doc_id renamed to int_id_column, written before the timed run."""
    import pyarrow.parquet as pq

    dst = src.parent / f"{src.name}_dpk"
    if not (dst / ".done").exists():
        dst.mkdir(exist_ok=True)
        for f in sorted(src.glob("*.parquet")):
            t = pq.read_table(f)
            pq.write_table(t.rename_columns(["int_id_column" if c == "doc_id" else c for c in t.column_names]), dst / f.name)
        (dst / ".done").write_text("")
    return dst


def _accuracy(stage: str, tool: str, truth: Path, src: Path, out: Path, ref: dict) -> dict:
    import score

    if stage == "exact_dedup":
        return score.exact(truth, src, out)
    if stage == "fuzzy_dedup":
        return score.fuzzy(truth, src, out)
    if stage == "lang_id":
        return score.lang(truth, out, "language" if tool == "datatrove" else "lang")
    if stage == "tokenization":
        if tool == "prepline":
            ref["tokens"] = score.token_counts(out, "id", "num_tokens")
            return {"total": sum(ref["tokens"].values())}
        if tool == "dpk":
            return score.compare_tokens(ref["tokens"], score.token_counts(out, "id", "token_count"))
        return score.compare_tokens(ref["tokens"], None, score.datatrove_tokens(out))
    if stage in ("url_filter", "decontaminate", "quality_classifier"):  # the same documents kept and removed?
        if stage == "quality_classifier" and tool == "prepline":  # prepline annotates: kept is a score >= 0.5
            import pyarrow.compute as pc

            t = score.read_columns(out, ["id", "quality_score"])
            kept = set(t.filter(pc.greater_equal(t.column("quality_score"), 0.5)).column("id").to_pylist())
        else:
            kept = set(score.read_columns(out, ["id"]).column("id").to_pylist()) if out.exists() else set()
        if tool == "prepline":
            ref["kept"] = kept
            return {"docs_out": len(kept)}
        n = len(score.read_columns(src, ["id"]))
        return {"docs_out": len(kept), "agreement": 1 - len(kept ^ ref.get("kept", set())) / max(n, 1),
                "only_prepline_kept": len(ref.get("kept", set()) - kept), "only_peer_kept": len(kept - ref.get("kept", set()))}
    if stage == "c4_clean":
        return score.c4_agreement(src, out, "contents" if tool == "prepline" else "text", ref)
    if stage == "line_dedup":
        kept = score.read_columns(out, ["id", "contents" if tool == "prepline" else "text"])
        if "lines_in" not in ref:  # (the same input for every tool)
            ref["lines_in"] = score.nonblank_lines(score.read_columns(src, ["contents"]).column(0))
        return {"docs_out": len(kept), "lines_removed": ref["lines_in"] - score.nonblank_lines(kept.column(1))}
    return {"docs_out": len(score.read_columns(out, ["id"]))}


def _note(stage: str, acc: dict) -> str:
    if "error" in acc:
        return acc["error"]
    if stage in ("exact_dedup", "fuzzy_dedup"):
        return f"removed {acc['removed']:,}, recall {acc['recall']:.3f}, precision {acc['precision']:.3f}"
    if stage == "lang_id":
        return f"accuracy {acc['accuracy']:.3f}"
    if stage == "tokenization":
        if "identical_docs" in acc:
            return (f"{acc['identical_docs']:,}/{acc['docs']:,} docs with prepline's count, total {acc['total']:,}"
                    + (f", {acc['missing_nonempty']} non-empty docs missing" if acc["missing_nonempty"] else ""))
        if "identical_total" in acc:
            return f"total {acc['total']:,} ({'=' if acc['identical_total'] else '≠'} prepline's)"
        return f"total {acc['total']:,} tokens"
    if stage == "c4_clean" and "agreement" in acc:
        return (f"{acc['docs_out']:,} docs out; keep/remove agreement with prepline {acc['agreement']:.4f}, "
                f"same text {acc['same_text']:,}/{acc['both_kept']:,}")
    if stage == "line_dedup" and "lines_removed" in acc:
        return f"{acc['docs_out']:,} docs out, {acc['lines_removed']:,} lines removed"
    if "agreement" in acc:
        return (f"{acc['docs_out']:,} docs out, decisions agree {acc['agreement']:.4f} (kept only by prepline "
                f"{acc['only_prepline_kept']}, only by the peer {acc['only_peer_kept']})")
    return f"{acc['docs_out']:,} docs out"


#: stages whose decisions are per document and compared between the tools (no truth file): what a
#: replicated corpus (above corpus.REPLICATE_UNIT documents) can measure
PER_DOCUMENT = {"quality_classifier", "decontaminate", "url_filter", "c4_clean"}


def run(work: Path, docs: int, only: list[str], timed: Callable, skip_install: bool = False,
        tools: tuple[str, ...] = PEERS) -> list[dict]:
    """Build the corpus, install the peers, run every stage with every tool; return the rows."""
    sys.path.insert(0, str(HERE))
    import corpus

    base = work / "peers" / f"docs{docs}"
    t0 = time.perf_counter()
    summary = corpus.build(base, docs)
    print(f"[peers] corpus: {json.dumps(summary)} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    if summary.get("replicas"):  # copies of one corpus: only the stages that judge each document alone, without truth
        bad = [s.name for s in STAGES if (not only or s.name in only) and s.name not in PER_DOCUMENT]
        if bad:
            raise SystemExit(f"--docs {docs}: the corpus is {summary['replicas']} copies of a smaller one, which has no truth for "
                             f"{', '.join(bad)}; run them at --docs {corpus.REPLICATE_UNIT} or less, or pass --only "
                             f"{','.join(sorted(PER_DOCUMENT))}")
    assets = make_assets(base / "assets")
    web_inputs(base, assets)
    if any(s.name == "quality_classifier" for s in STAGES if not only or s.name in only):
        quality_model(base, assets)
    assets_file = base / "assets" / "assets.json"
    pythons = {p: (ROOT / ".venv-peers" / p / "bin" / "python") if skip_install else ensure_venv(p) for p in tools}
    rows = []
    for st in [s for s in STAGES if not only or s.name in only]:
        src = base / st.input
        ref: dict = {}
        row = {"stage": st.name, "docs": summary["docs"], "tools": {}}
        for tool in ("prepline", *[p for p in st.peers if p in tools]):
            dst = base / "out" / tool / st.name
            shutil.rmtree(dst, ignore_errors=True)
            if tool == "prepline":
                params = json.loads(json.dumps(st.params).replace("<tokenizer_dir>", assets["tokenizer_dir"])
                                    .replace("<domains_txt>", assets["domains_txt"]).replace("<eval_jsonl>", assets["eval_jsonl"])
                                    .replace("<quality_model>", assets.get("quality_model", "")))
                cmd = [sys.executable, "-m", "prepline.cli", "run", st.name, "--input", str(src), "--output", str(dst),
                       "--workers", "2", "--overwrite", "--no-progress", "--params", json.dumps(params)]
            else:
                dst.mkdir(parents=True)
                tool_src = _dpk_fdedup_input(src) if (tool, st.name) == ("dpk", "fuzzy_dedup") else src
                cmd = [str(pythons[tool]), str(HERE / f"run_{tool}.py"), st.name, str(tool_src), str(dst), str(assets_file)]
            load = os.getloadavg()[0]
            secs, rss = timed(cmd, f"{tool} {st.name}", env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            acc = _accuracy(st.name, tool, base / "truth", src, _output(tool, st.name, dst), ref)
            row["tools"][tool] = {"seconds": secs, "peak_rss_mib": rss, "load_before": load, "accuracy": acc}
            print(f"[peers] {st.name:<13} {tool:<10} {secs:8.2f}s {rss:6.0f} MiB  {_note(st.name, acc)}", file=sys.stderr)
        rows.append(row)
    return rows


def rescore(work: Path, docs: int, rows: list[dict]) -> list[dict]:
    """The accuracy of an earlier run's outputs again, against the truth as it is now (timings kept)."""
    sys.path.insert(0, str(HERE))
    base = work / "peers" / f"docs{docs}"
    by_name = {s.name: s for s in STAGES}
    for row in rows:
        st, ref = by_name[row["stage"]], {}
        for tool, r in row["tools"].items():
            out = _output(tool, st.name, base / "out" / tool / st.name)
            r["accuracy"] = _accuracy(st.name, tool, base / "truth", base / st.input, out, ref)
    return rows


def print_table(rows: list[dict]) -> None:
    """Markdown table: wall seconds per tool, prepline / peer, accuracy per tool."""
    print("\n| stage | prepline s | DPK s | datatrove s | prepline/DPK | prepline/datatrove | accuracy |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        t = r["tools"]
        p = t["prepline"]["seconds"]
        cells = [f"{t[k]['seconds']:.2f}" if k in t else "—" for k in ("prepline", "dpk", "datatrove")]
        ratios = [f"{p / t[k]['seconds']:.2f}" if k in t else "—" for k in PEERS]
        acc = "; ".join(f"{TITLES[k]}: {_note(r['stage'], v['accuracy'])}" for k, v in t.items())
        print(f"| {r['stage']} | " + " | ".join(cells + ratios) + f" | {acc} |")
    print("\nprepline/peer: wall seconds of prepline's process / the peer's (< 1: prepline is faster); peak RSS in the JSON")
