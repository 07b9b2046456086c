#!/usr/bin/env python
"""Peak RSS of every transform on ONE input file of each size: memory must follow the row group,
not the file (target: the largest file's peak within 1.5x the smallest's).

    .venv/bin/python scripts/bench_memory.py --sizes-mb 200,2000
    .venv/bin/python scripts/bench_memory.py --sizes-mb 20,200 --only doc_id,exact_dedup,ingest

For each size it builds one Parquet file: a sample of up to 200 MB (``prepline sample --files 1``,
~573 bytes of zstd Parquet per document), then as many spliced copies of it as the size needs (each
text's first half joined to another text's second half: all texts new, none a near duplicate),
appended in 64k-row row groups; writes the first documents of it as
one JSONL file of about the same size (``{"id", "text"}`` per line) for ``ingest``, runs doc_id on
the Parquet file, then every other stage on doc_id's output (one file again), each as ``prepline
run`` with one worker in a fresh process, through the stage benchmark's launcher (peak RSS of the
largest process). Prints one row per stage: seconds and peak RSS per size, the RSS ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench import default_order, load_specs, timed  # noqa: E402  (one launcher for every benchmark)

BYTES_PER_DOC = 573  # zstd Parquet of the sample (114.5 MB for 200k documents)
CHUNK_MB = 200  # the largest sample built (~1.7 GB in the builder); larger files add spliced copies of it
TARGET = 1.5


def spliced(texts: list[str], k: int) -> list[str]:
    """Copy k of the base texts: the first half of each text joined to the second half of another
    (a permutation seeded by k). Real sentences, all new texts; a spliced text shares about a third
    of its word shingles with either source, far below any near-duplicate threshold."""
    import random

    order = list(range(len(texts)))
    random.Random(k).shuffle(order)
    return [a[: len(a) // 2] + texts[j][len(texts[j]) // 2 :] for a, j in zip(texts, order)]


def build_parquet(target: Path, mb: int, base_dir: Path, chunk_mb: int = CHUNK_MB) -> None:
    """One Parquet file of about mb MB, appended row group by row group: a sample of up to chunk_mb
    (seed 42; shared by every size), then spliced copies of it (see :func:`spliced`).

    One sample of 3.5M documents would need ~17 GB and an hour in the builder on this machine."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prepline.data_access import PARQUET_WRITE_OPTIONS

    docs = int(min(mb, chunk_mb) * 1e6 / BYTES_PER_DOC)
    base = base_dir / f"sample{docs}"
    if not (base / "_truth" / "summary.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "prepline.cli", "sample", "--output", str(base), "--docs", str(docs), "--files", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"[memory] {docs:,}-document sample built in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    table = pq.read_table(base / "part-00000.parquet")
    texts = table.column("contents").to_pylist()
    opts = {k: v for k, v in PARQUET_WRITE_OPTIONS.items() if k != "row_group_size"}
    tmp = target.with_name(".part.tmp")
    with pq.ParquetWriter(tmp, table.schema, **opts) as writer:
        for k in range(max(1, round(mb / min(mb, chunk_mb)))):
            chunk = table if k == 0 else table.set_column(1, "contents", pa.array(spliced(texts, k), pa.string()))
            writer.write_table(chunk, row_group_size=PARQUET_WRITE_OPTIONS["row_group_size"])
    os.replace(tmp, target)


def build_inputs(work: Path, mb: int, chunk_mb: int = CHUNK_MB) -> tuple[Path, Path]:
    """One Parquet file of about mb MB and one JSONL file of about mb MB (its first documents)."""
    import pyarrow.parquet as pq

    sample, jsonl = work / "sample", work / "jsonl"
    if not (sample / "part-00000.parquet").exists():
        sample.mkdir(parents=True, exist_ok=True)
        build_parquet(sample / "part-00000.parquet", mb, work.parent, chunk_mb)
    target = jsonl / "part-00000.jsonl"
    if not target.exists():
        jsonl.mkdir(parents=True, exist_ok=True)
        tmp, written = target.with_suffix(".tmp"), 0
        with open(tmp, "w", encoding="utf-8") as out:
            for batch in pq.ParquetFile(sample / "part-00000.parquet").iter_batches(columns=["sample_id", "contents"]):
                for sid, text in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    line = json.dumps({"id": sid, "text": text}, ensure_ascii=False) + "\n"
                    out.write(line)
                    written += len(line.encode("utf-8"))
                    if written >= mb * 1e6:
                        break
                if written >= mb * 1e6:
                    break
        os.replace(tmp, target)
    return sample, jsonl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="200,2000", help="input file sizes in MB (the first is the reference)")
    ap.add_argument("--only", default="", help="comma-separated stages (default: ingest and every registered stage)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_memory"))
    ap.add_argument("--chunk-mb", type=int, default=CHUNK_MB, help="the largest sample built at once")
    ap.add_argument("--json", default="", help="write the results here too (rewritten after every stage)")
    ap.add_argument("--params", default="{}", help="JSON parameters over the stage benchmark's (e.g. '{\"verify\": \"none\"}')")
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from prepline import registry

    specs = load_specs()
    order = ["ingest", *[n for n in default_order() if n in registry.names()]]
    wanted = [n for n in order if not args.only or n in args.only.split(",")]
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    results: dict[str, dict[int, dict]] = {}
    inputs = {mb: build_inputs(Path(args.work) / f"file{mb}mb", mb, args.chunk_mb) for mb in sizes}
    for name in wanted:  # stage by stage, every size: the rows of the cheap stages are complete first
        for mb in sizes:
            work = Path(args.work) / f"file{mb}mb"
            (sample, jsonl), ids = inputs[mb], work / "doc_id"
            if name == "ingest":
                src, params = jsonl, {"text_field": "text"}
            elif name == "doc_id":
                src, params = sample, {}
            else:
                if not (ids / "metadata.json").exists():
                    timed([sys.executable, "-m", "prepline.cli", "run", "doc_id", "--input", str(sample), "--output", str(ids),
                           "--workers", "1", "--overwrite", "--no-progress"], "doc_id")
                src, params = ids, {**specs.get(name, {}).get("params", {}), **json.loads(args.params)}
            dst = work / "measured" / name  # never doc_id's output that the other stages read
            load = os.getloadavg()[0]
            secs, rss = timed([sys.executable, "-m", "prepline.cli", "run", name, "--input", str(src), "--output", str(dst),
                               "--workers", "1", "--overwrite", "--no-progress", "--params", json.dumps(params)], name)
            file_mb = sum(f.stat().st_size for f in src.glob("part-*")) / 1e6
            meta = json.loads((dst / "metadata.json").read_text())
            results.setdefault(name, {})[mb] = {"seconds": secs, "peak_rss_mib": rss, "input_mb": file_mb,
                                                "docs_in": meta["totals"]["docs_in"], "load_before": load, "params": params}
            print(f"[memory] {name:<13} {file_mb:8.0f} MB file: {secs:8.1f}s  peak RSS {rss:6.0f} MiB  (load {load:.1f})", file=sys.stderr)
            subprocess.run(["rm", "-rf", str(dst)], check=False)  # keep the disk small: only the inputs are kept
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2))
    base, top = sizes[0], sizes[-1]
    print(f"\n| stage | input MB ({base} / {top}) | docs | seconds | peak RSS MiB | ratio | ≤ {TARGET}× |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        if base in r and top in r:
            a, b = r[base], r[top]
            ratio = b["peak_rss_mib"] / a["peak_rss_mib"]
            print(f"| {name} | {a['input_mb']:.0f} / {b['input_mb']:.0f} | {a['docs_in']:,} / {b['docs_in']:,} | "
                  f"{a['seconds']:.0f} / {b['seconds']:.0f} | {a['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} | {ratio:.2f} | "
                  f"{'✓' if ratio <= TARGET else '✗'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
