"""Sizing a run before renting a cluster: workers, memory, shards, S3 requests and hours per stage of
the super pipeline, computed from measured per-core rates (``prepline plan``; docs/scale.md is this
module's table for 10 billion documents, written by scripts/gen_docs.py, so the two cannot differ).

Every constant names the benchmark it came from. The model, stated so it can be checked:

* **Time.** A stage's core-seconds are ``docs × bytes_per_doc / (rate × SAMPLE_TEXT_BYTES)``: the
  measured documents per second of one worker on the sample, scaled by text size (every stage's
  cost grows with the text it reads; the dedup stages' per-document state does not, see below).
  Every stage is assumed to see every document (an upper bound: dedup and filters shrink what later
  stages read). Stages run one after another, each on its own cluster of ``workers`` one-core
  workers, plus ``cluster_start_s`` to start it, plus, for a dedup stage, its shard tasks' reads of
  the shuffle's partitioned files (``PARTITION_FILE_S`` a file, measured); the worker count is the
  smallest that fits the deadline with the same count for every stage.
* **Memory.** A worker holds one batch: the measured peak RSS of a Ray worker at 1M documents
  (``measured_batch_docs`` a file, one row group; pii_redactor's still a local process's), of which
  ``FIXED_MIB`` is the process and the rest scales with the row group's text
  (``min(documents per file, 65,536) × bytes_per_doc``), plus, for the dedup stages, its shard of the global
  state (measured bytes per document × documents / shards). A worker's pod holds the Ray node's own
  processes too (``NODE_MIB``): the plan's memory per worker is the pod's. Shards are the smallest
  power of two ≥ workers that keeps a pod within ``worker_memory_gib``.
* **S3.** Files of ``file_mb`` (zstd Parquet at ``SAMPLE_DISK_BYTES`` per ``SAMPLE_TEXT_BYTES`` of
  text); a read of a file is a footer GET plus one ranged GET per 64k-row row group
  (``location.PARQUET_WRITE_OPTIONS``); a written file is a multipart upload of
  ``PREPLINE_S3_PART_MB`` (16 MiB) parts plus its start and completion, and a marker object; a
  listing is one LIST per 1,000 keys. The dedup stages read their input twice (the plan, then the
  final map), and each shard task reads every partitioned file of a shuffle (``PARTITION_ROUND_TRIPS``
  requests each) after listing them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: UTF-8 text bytes per document of `prepline sample` (the scale benchmarks' corpus): measured on
#: `prepline sample --docs 20000 --files 2` (2026-12-06): 1,450.1 bytes of text, 700.7 bytes of zstd Parquet
SAMPLE_TEXT_BYTES = 1450.0
SAMPLE_DISK_BYTES = 700.7
ROWS_PER_GROUP = 64 * 1024
#: the scale curve's 1M files held 62,500 documents (one row group); of a worker's RSS this much is the
#: interpreter, pyarrow and numpy (the idle `prepline run` pool process, docs/performance.md), the rest grows with the batch
MEASURED_BATCH_DOCS = 62_500
FIXED_MIB = 150.0
PART_MB = 16
#: one S3 request's latency from a worker in the bucket's region (an assumption, as cluster_start_s is)
GET_LATENCY_S = 0.030
#: partitioned files a shard task reads at once (prepline.sharded.PARTITION_READERS; a test keeps them equal)
PARTITION_READERS = 16
SHUFFLE_READS = "docs/performance.md, 'Shuffle reads from S3': scripts/bench.py --shuffle-reads, moto behind a 30 ms proxy (2026-12-07, tail index)"
#: a shard task's read of one partitioned file at 30 ms a request (SHUFFLE_READS, 65,536-row files, 16 shards):
#: 2.00 requests a file (its tail with the index, then its batch), 76.1 ms a file one at a time, 10.8 ms with
#: 16 at once (Arrow's file format before it: 4.00 requests, 152.0 and 22.7 ms)
PARTITION_ROUND_TRIPS = 2
PARTITION_FILE_S = 0.0108
#: the proxy's latency PARTITION_FILE_S was measured at (the reads are latency: they scale with GET_LATENCY_S)
PARTITION_FILE_LATENCY_S = 0.030
SCALE_CURVE = "docs/performance.md, 'Scale curve': scripts/bench.py --memory-sizes, 1M documents, 1 worker (2026-12-03)"
PEERS_200K = "docs/performance.md, 'The web-text stages at 200,000 documents': scripts/bench.py --peers, 2 workers, start-up included"
PEERS_50K = "docs/performance.md, 'The web-text stages against datatrove, after two speed-ups': scripts/bench.py --peers --docs 50000, 2 workers"
STATE_80 = "docs/performance.md, 'Memory per document, global state': 80 files at 1M documents, RSS growth per document"
SCALE_10M = "docs/performance.md, 'Scale to 10M documents': scripts/bench.py --scale 1e6,3e6,1e7, Ray, 2 workers (2026-12-07)"
SCALE_MODELS = ("docs/performance.md, 'Scale to 10M documents': scripts/bench.py --scale 1e6,3e6 --only lang_id,doc_quality,hap,"
                "filter,tokenization, Ray, 2 workers (2026-12-07)")
SCALE_MODELS_10M = ("docs/performance.md, 'Scale to 10M documents': scripts/bench.py --scale 1e6,1e7 --only lang_id,doc_quality,hap,"
                    "filter,tokenization, Ray, 2 workers (2026-12-07, 16:21)")
NODES_SIM = "docs/performance.md, 'Shard shape of the 10-billion-document plan on 10 lab hosts': scripts/bench.py --nodes 10 (2026-12-07)"
#: a one-CPU Ray worker node's own processes (raylet, its agents and log monitor, an idle worker) after
#: ``ray start``, anonymous and shared memory of the host's cgroup (NODES_SIM): in a worker's pod beside the worker
NODE_MIB = 199.0
#: the shard count of the runs that measured the dedup stages' state (their default num_shards): a
#: worker's peak grows with its shard's share of the corpus, so the corpus-wide state per document
#: is the per-worker growth per document times this
MEASURED_SHARDS = 16


@dataclass(frozen=True)
class StageCost:
    name: str
    docs_per_s: float  # one worker (one core) on the sample
    rss_mib: float  # peak RSS of a worker at 1M documents (62,500-document files)
    #: the corpus-wide state (and its working memory) a dedup stage spreads over its shards, bytes per
    #: document: a worker holding one of ``shards`` shards needs ``docs × this / shards`` more
    state_bytes_per_doc: float
    reads: int  # times the stage reads its input
    source: str
    #: documents per file of the input the RSS was measured on (a stage reads the previous one's output)
    measured_batch_docs: float = 62_500
    #: shuffles from the file map to the shards (prepline.sharded's partitioned files, one per input
    #: batch): exact_dedup's distinct keys; fuzzy_dedup's ids, bands and candidate documents; line_dedup's counts
    shuffles: int = 0


#: the super pipeline's stages, in order (global stages, then one branch's)
STAGES: tuple[StageCost, ...] = (
    # the global stages' worker RSS: a Ray worker's peak at 1M documents (SCALE_10M); their rates: one core
    StageCost("doc_id", 97_081, 442, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_10M}"),
    # state: one shard of 10,000,000 documents (the 10B plan's shard holds 9,765,625) peaked at 1,692.2 MiB in
    # its reduce over a Ray worker's idle 175.9 (NODES_SIM): 159 bytes a document (the 16-shard estimate of
    # STATE_80, 256, was 1.6× too much at this shard size)
    StageCost("exact_dedup", 52_673, 686, (1692.2 - 175.9) * 2**20 / 10_000_000, 2,
              f"{SCALE_CURVE}; RSS: {SCALE_10M}; state: {NODES_SIM}; shuffle: {SHUFFLE_READS}", shuffles=1),
    # the buckets phase's peak at 10M (714.6 MiB) over a Ray worker's idle 175.9 MiB, 9,657,600 documents, 16 shards
    StageCost("fuzzy_dedup", 12_234, 586, (714.6 - 175.9) * 2**20 * MEASURED_SHARDS / 9_657_600, 2,
              f"{SCALE_CURVE}; RSS and state: {SCALE_10M}; shuffle: {SHUFFLE_READS}", 967_501 / 16, shuffles=3),
    # rate: 12.9 µs per document of engine time on 2 workers at 10M; state: its reduce stayed under the count
    # phase's peak (744.8 MiB at 10M, 9,312,587 documents): an upper bound
    StageCost("line_dedup", 38_760, 728, (744.8 - 175.9) * 2**20 * MEASURED_SHARDS / 9_312_587, 2, f"{SCALE_10M}; shuffle: {SHUFFLE_READS}", 933_918 / 16, shuffles=1),
    # lang_id's and tokenization's worker peaks grew from 8 to 80 files a worker (574 -> 632, 999 -> 1,313 MiB,
    # tokenization's not understood yet): a plan's worker at 10B reads ~100 files, so these are the 10M peaks
    StageCost("lang_id", 4_980, 632, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_MODELS_10M}"),
    StageCost("doc_quality", 7_333, 631, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_MODELS}"),
    StageCost("pii_redactor", 1_576, 764, 0, 1, SCALE_CURVE),
    StageCost("hap", 10_335, 809, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_MODELS}"),
    StageCost("filter", 90_525, 487, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_10M}", 736_951 / 16),
    StageCost("tokenization", 5_098, 1_313, 0, 1, f"{SCALE_CURVE}; RSS: {SCALE_MODELS_10M}"),
)
#: opt-in web stages (docs/recipes.md), for a plan that adds them
OPTIONAL: tuple[StageCost, ...] = (
    StageCost("url_filter", 50_000, 271, 0, 1, PEERS_200K),
    StageCost("c4_clean", 11_628, 500, 0, 1, f"{PEERS_50K} (RSS not measured: 500 MiB assumed)"),
    StageCost("decontaminate", 9_174, 288, 0, 1, PEERS_200K),
    StageCost("quality_classifier", 11_792, 519, 0, 1, PEERS_200K),
)


@dataclass(frozen=True)
class Plan:
    docs: float
    bytes_per_doc: float
    hours: float
    workers: int
    files: int
    rows: list[dict]
    notes: list[str]

    @property
    def wall_hours(self) -> float:
        return sum(r["wall_h"] for r in self.rows)

    @property
    def verdict(self) -> str:
        """The wall time, and whether it meets the deadline."""
        if self.wall_hours <= self.hours * (1 + 1e-9):  # plan()'s own test of the deadline
            return f"{self.wall_hours:.1f} h of wall time"
        return (f"{self.wall_hours:.2f} h of wall time: **over the {self.hours:g} h deadline**, set by the dedup shuffles' "
                f"S3 requests (below): more workers shorten them only down to one shard task each")


def stage_cost(name: str) -> StageCost:
    """A stage's measured constants (the super pipeline's stages and the opt-in web stages)."""
    for s in STAGES + OPTIONAL:
        if s.name == name:
            return s
    raise KeyError(name)


def worker_mib(stage: StageCost | str, docs: float, docs_per_file: float, bytes_per_doc: float = SAMPLE_TEXT_BYTES,
               shards: int = 0) -> float:
    """The memory a worker of ``stage`` needs, MiB: the process, one row group's batch of the file size,
    and its shard of the corpus-wide state (``shards`` of them; 0: the batch alone). The plan sizes
    workers with it, and ``scripts/bench.py --scale`` fails when a measured worker peak exceeds it."""
    s = stage_cost(stage) if isinstance(stage, str) else stage
    batch = min(docs_per_file, ROWS_PER_GROUP) * bytes_per_doc / (min(s.measured_batch_docs, ROWS_PER_GROUP) * SAMPLE_TEXT_BYTES)
    state = docs * s.state_bytes_per_doc / shards / 2**20 if shards else 0.0
    return FIXED_MIB + max(0.0, s.rss_mib - FIXED_MIB) * batch + state


def _pow2(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


def plan(docs: float, bytes_per_doc: float = SAMPLE_TEXT_BYTES, hours: float = 24.0, worker_memory_gib: float = 8.0,
         file_mb: float = 256.0, cluster_start_s: float = 120.0, extra: tuple[str, ...] = (), workers: int = 0) -> Plan:
    """The plan for ``docs`` documents of ``bytes_per_doc`` text bytes to finish in ``hours`` (``workers``:
    that many instead of the fewest that meet it)."""
    from prepline.errors import ConfigError

    if docs < 1 or bytes_per_doc <= 0 or hours <= 0 or worker_memory_gib <= 0 or file_mb <= 0 or cluster_start_s < 0:
        raise ConfigError("plan: docs >= 1 and positive bytes per document, hours, memory and file size are needed",
                          "e.g. prepline plan --docs 10e9 --bytes-per-doc 3000 --hours 24")
    known = {s.name: s for s in OPTIONAL}
    unknown = [x for x in extra if x not in known]
    if unknown:
        raise ConfigError(f"plan: no measured cost for {', '.join(unknown)}", f"--add takes {', '.join(known)}")
    stages = list(STAGES) + [known[x] for x in extra]
    scale = bytes_per_doc / SAMPLE_TEXT_BYTES
    core_s = [docs * scale / s.docs_per_s for s in stages]
    budget = hours * 3600 - len(stages) * cluster_start_s
    if budget <= 0:
        raise ConfigError(f"plan: {hours} h leaves no time after starting {len(stages)} clusters of {cluster_start_s:.0f} s",
                          "give more hours, or a smaller --cluster-start-s if your clusters start faster")
    cpu_workers = max(1, math.ceil(sum(core_s) / budget))
    kw = dict(docs=docs, bytes_per_doc=bytes_per_doc, hours=hours, worker_memory_gib=worker_memory_gib, file_mb=file_mb,
              cluster_start_s=cluster_start_s, stages=stages, core_s=core_s)
    if workers:
        return _plan_for(workers, **kw)
    # the CPU's count, raised until the dedup shuffles' reads fit too (fewer shard tasks per worker), up to
    # 16× (past that, the plan says it misses the deadline). The wall time is not monotonic in the workers
    # (a count just past a power of two doubles some workers' shard tasks): counts are tried in order
    w = cpu_workers
    while w <= 16 * cpu_workers:
        best = _plan_for(w, **kw)
        if best.wall_hours <= hours:
            return best
        w += 1 if w - cpu_workers < 4096 else max(1, w // 100)
    return _plan_for(cpu_workers, **kw)  # none meets it: the CPU's count, and the verdict says by how much


def _plan_for(workers: int, *, docs: float, bytes_per_doc: float, hours: float, worker_memory_gib: float, file_mb: float,
              cluster_start_s: float, stages: list[StageCost], core_s: list[float]) -> Plan:
    """The plan with ``workers`` one-core workers per stage."""
    from prepline.errors import ConfigError

    disk_bytes = docs * bytes_per_doc * SAMPLE_DISK_BYTES / SAMPLE_TEXT_BYTES
    files = max(1, math.ceil(disk_bytes / (file_mb * 2**20)))
    docs_per_file = docs / files
    groups = max(1, math.ceil(docs_per_file / ROWS_PER_GROUP))
    parts = max(1, math.ceil(file_mb / PART_MB))
    lists = math.ceil(files / 1000)
    rows, notes = [], []
    for s, cs in zip(stages, core_s):
        batch_gib = (worker_mib(s, docs, docs_per_file, bytes_per_doc) + NODE_MIB) / 1024
        state_gib = docs * s.state_bytes_per_doc / 2**30
        room = worker_memory_gib - batch_gib
        if room <= 0:
            raise ConfigError(f"plan: {s.name} needs {batch_gib:.1f} GiB for a batch alone, more than --worker-memory-gib",
                              "give workers more memory")
        shards = max(_pow2(workers), _pow2(state_gib / room)) if state_gib else 0
        mem = (worker_mib(s, docs, docs_per_file, bytes_per_doc, shards) + NODE_MIB) / 1024  # the pod
        get = files * s.reads * (1 + groups) + lists * s.reads
        # a shard task reads its batch of every partitioned file (one per input batch): the IPC footer and
        # the batch, PARTITION_READERS files at once (prepline.sharded.iter_partition), after listing the prefix
        producers = files * groups
        shuffle_get = PARTITION_ROUND_TRIPS * s.shuffles * producers * shards
        get += shuffle_get
        put = files * (parts + 2) + files + s.shuffles * producers  # the parts, create and complete; a marker per file; partitioned files
        shuffle_list = s.shuffles * shards * math.ceil(producers / 1000)
        # its shard tasks' reads, on top of the CPU time (a worker waits on them)
        read_s = math.ceil(shards / workers) * s.shuffles * producers * PARTITION_FILE_S * GET_LATENCY_S / PARTITION_FILE_LATENCY_S if shards else 0.0
        if read_s > cs / workers:
            notes.append(f"{s.name}: {shuffle_get:,} of its GETs are the shuffle ({s.shuffles} × {producers:,} partitioned files × "
                         f"{shards:,} shards × {PARTITION_ROUND_TRIPS}); a worker's {math.ceil(shards / workers)} shard "
                         f"task{'s read their' if shards > workers else ' reads its'} files {PARTITION_READERS} at a time, {read_s / 3600:,.1f} h at {GET_LATENCY_S * 1000:.0f} ms a request against "
                         f"{cs / workers / 3600:,.1f} h of CPU: the requests set its time (docs/scale.md, 'Where the design breaks first')")
        rows.append({
            "stage": s.name, "core_h": cs / 3600, "wall_h": (cs / workers + read_s + cluster_start_s) / 3600, "read_h": read_s / 3600,
            "worker_gib": mem, "shards": shards, "state_gib": state_gib,
            "get": get, "put": put, "list": lists * s.reads + shuffle_list,
            "read_gb": disk_bytes * s.reads / 1e9, "written_gb": disk_bytes / 1e9, "source": s.source,
        })
    dd = docs * sum(s.state_bytes_per_doc for s in stages) / 2**30
    notes.append(f"global dedup state {dd:,.0f} GiB over the corpus, spread over the shards of each dedup stage")
    notes.append(f"{files:,} files of {file_mb:.0f} MB ({docs_per_file:,.0f} documents, {groups} row groups each); "
                 f"the driver lists them in {lists:,} LIST pages and keeps one marker per file")
    return Plan(docs, bytes_per_doc, hours, workers, files, rows, notes)


def table_markdown(p: Plan) -> str:
    """The plan as a Markdown table (what `prepline plan` prints and docs/scale.md holds)."""
    head = ("| stage | core-hours | wall hours on " + f"{p.workers:,} workers | GiB per worker pod | shards | "
            "S3 GET | S3 PUT | S3 LIST | read GB | written GB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in p.rows:
        lines.append(f"| {r['stage']} | {r['core_h']:,.0f} | {r['wall_h']:,.2f} | {r['worker_gib']:.2f} | "
                     f"{r['shards'] or '—'} | {r['get']:,} | {r['put']:,} | {r['list']:,} | {r['read_gb']:,.0f} | {r['written_gb']:,.0f} |")
    total_core = sum(r["core_h"] for r in p.rows)
    lines.append(f"| **total** | {total_core:,.0f} | **{p.wall_hours:,.2f}** | | | {sum(r['get'] for r in p.rows):,} | "
                 f"{sum(r['put'] for r in p.rows):,} | {sum(r['list'] for r in p.rows):,} | "
                 f"{sum(r['read_gb'] for r in p.rows):,.0f} | {sum(r['written_gb'] for r in p.rows):,.0f} |")
    return "\n".join(lines)


def sources_markdown(p: Plan) -> str:
    return "\n".join(f"- {r['stage']}: {r['source']}" for r in p.rows)


#: docs/scale.md's generated part lies between these lines (scripts/gen_docs.py writes it)
BEGIN, END = "<!-- prepline plan: begin (generated by scripts/gen_docs.py from prepline.sizing) -->", "<!-- prepline plan: end -->"
DOC_COMMAND = dict(docs=10e9, bytes_per_doc=3000.0, hours=24.0)


def scale_block() -> str:
    """The generated part of docs/scale.md: the 10-billion-document plan, as `prepline plan` prints it."""
    p = plan(**DOC_COMMAND)
    notes = "\n".join(f"- {n}" for n in p.notes)
    return (f"{BEGIN}\n<!-- docs-test: not run: the same table is checked by scripts/gen_docs.py --check -->\n"
            "```bash\nprepline plan --docs 10e9 --bytes-per-doc 3000 --hours 24\n```\n\n"
            f"{p.docs:,.0f} documents of {p.bytes_per_doc:,.0f} bytes, done in {p.hours:g} h: **{p.workers:,} one-core workers "
            f"per stage**, {p.verdict}.\n\n{table_markdown(p)}\n\n{notes}\n\nWhere each stage's constants "
            f"come from:\n\n{sources_markdown(p)}\n- every worker pod: the Ray node's own processes, "
            f"{NODE_MIB:.0f} MiB: {NODES_SIM}\n{END}")


def render_scale_doc(text: str) -> str:
    """docs/scale.md with its generated part replaced (appended when the markers are missing)."""
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return f"{head}{scale_block()}{tail}"
    return text.rstrip("\n") + "\n\n" + scale_block() + "\n"
