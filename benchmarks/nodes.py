"""The 10-billion-document plan's shard shape on N lab hosts (``scripts/bench.py --nodes 10``).

``prepline plan`` sizes the dedup stages for 10 billion documents: so many shards that one shard's
state fits a worker, and a memory limit per worker. This benchmark gives a real multi-host Ray
cluster that shape and checks the plan's memory model where it matters, on one shard:

* the lab (``scripts/lab.py``) makes a head host (no CPUs for tasks, as KubeRay's head) and ``nodes``
  worker hosts of one CPU each, every worker host in a memory cgroup (``Lab.limit_memory``) limited
  to the plan's memory per worker for the stage that runs: the kernel OOM-kills past it, as the
  kubelet does to a pod;
* doc_id, exact_dedup and fuzzy_dedup run on the corpus (10M documents in docs/performance.md) as the
  execute step runs them: a job submitted to the head's job API, ``--workers nodes``;
* each dedup stage gets the shard count that gives **each shard as many documents as the plan's
  shards have at 10 billion** (``docs × plan shards / 10e9``, at least 1): at 10M documents that is
  one shard for exact_dedup (1,024 shards at 10B) and two for fuzzy_dedup (2,048), so one worker
  holds what a worker holds at 10 billion documents;
* it fails (exit 1) when a job fails, the kernel OOM-killed anything, or a worker's peak passes the
  plan's memory per worker or its own bound (``prepline.sizing.worker_mib`` for the corpus's file
  size and the shard's documents, plus the scale benchmark's slack; for files of at least
  ``MIN_DOCS_PER_FILE`` documents, the model's range).

The corpus is on this machine's disk, which every lab host sees (a shared volume's role): the
benchmark measures memory per shard, not S3 (``--shuffle-reads`` measures that). The hosts share two
cores: the times say nothing about a real cluster's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

STAGES = ("doc_id", "exact_dedup", "fuzzy_dedup")
MIB = 2**20
#: files smaller than this are outside the memory model's range (``sizing.worker_mib``): no bound is checked
MIN_DOCS_PER_FILE = 10_000


def sim_shards(docs_in: int, plan_shards: int, plan_docs: float) -> int:
    """The shard count nearest to giving each of this corpus's shards the documents a plan shard has."""
    return max(1, round(docs_in * plan_shards / plan_docs))


def run(corpus: str, work: str, nodes: int = 10, plan_docs: float = 10e9, bytes_per_doc: float = 3000.0,
        hours: float = 24.0, lab_name: str = "nodes", limits_mib: dict | None = None, job_env: dict | None = None,
        log=print) -> dict:
    """The stages on the lab (``limits_mib``: a stage's host memory limit instead of the plan's, e.g. to
    see one too small fail the job; ``job_env``: the jobs' environment variables)."""
    from lab import Lab

    from prepline import sizing
    from prepline.clusters.ray_jobs import RayJobClient
    from prepline.stages import check_output, entrypoint
    from scale import WORKER_SLACK

    for what, path in (("corpus", corpus), ("work folder", work)):
        if Path(path).resolve().is_relative_to("/tmp"):
            raise ValueError(f"the {what} {path} is under /tmp, which each lab host has its own of: put it on a disk "
                             "the hosts share (e.g. /var/tmp or the --work folder)")
    plan = sizing.plan(plan_docs, bytes_per_doc, hours)
    prow = {r["stage"]: r for r in plan.rows}
    hosts = [f"node-{i}" for i in range(nodes)]
    out = Path(work)
    out.mkdir(parents=True, exist_ok=True)
    res = {"nodes": nodes, "plan": {"docs": plan_docs, "bytes_per_doc": bytes_per_doc, "hours": hours, "workers": plan.workers},
           "corpus": corpus, "stages": []}
    lab = Lab(lab_name)
    lab.down()  # a half-made lab of an earlier crash
    try:
        t0 = time.time()
        lab.up(["head", *hosts])
        for h in hosts:
            lab.limit_memory(h, None)
        lab.start_ray("head", hosts, num_cpus=1, head_cpus=0, timeout=600)
        res["lab_up_s"] = round(time.time() - t0, 1)
        res["node_idle_mib"] = max(lab.memory(h)["rss_bytes"] for h in hosts) / MIB
        log(f"[nodes] head + {nodes} one-CPU hosts up with Ray in {res['lab_up_s']} s; a node's own processes {res['node_idle_mib']:.0f} MiB")
        jobs = RayJobClient(lab.state["ray"]["dashboard"])
        src = corpus
        for stage in STAGES:
            p = prow[stage]
            limit = int((limits_mib or {}).get(stage, p["worker_gib"] * 1024) * MIB) // 4096 * 4096  # whole pages, as the kernel keeps it
            params = {}
            if p["shards"]:  # a dedup stage reads the previous stage's output: its documents are that row's
                params["num_shards"] = sim_shards(res["stages"][-1]["docs_out"], p["shards"], plan_docs)
            for h in hosts:
                lab.limit_memory(h, limit)
                lab.memory(h, reset=True)
            dst = str(out / stage)
            cmd = entrypoint(stage, json.dumps(params), src, dst, nodes, 0)
            log(f"[nodes] {stage}: limit {limit / MIB:,.0f} MiB a host, {params or 'no shards'}: {cmd}")
            t = time.time()
            sid = jobs.submit(cmd, runtime_env={"env_vars": job_env} if job_env else None)
            info = jobs.follow(sid, sys.stderr, timeout=7200)
            row = {"stage": stage, "status": info.status, "seconds": round(time.time() - t, 1), "limit_mib": limit / MIB, "limit_bytes": limit,
                   "plan_shards": p["shards"], "shards": params.get("num_shards", 0),
                   "hosts": {h: lab.memory(h) for h in hosts}}
            if info.status == "SUCCEEDED":
                meta = check_output(dst, 0, stage)
                t_ = meta["totals"]
                row.update(docs_in=t_["docs_in"], docs_out=t_["docs_out"], files=t_["files"],
                           worker_peak_mib=t_.get("worker_peak_rss_mib"), driver_peak_mib=t_.get("driver_peak_rss_mib"),
                           phase_peaks={k: v.get("worker_peak_rss_mib") for k, v in meta.get("phases", {}).items()})
                dpf = t_["docs_in"] / max(1, t_["files"])
                # the model scales a worker's batch memory from files of tens of thousands of documents; in
                # smaller files the stage's libraries dominate and it does not apply (no bound then)
                row["bound_mib"] = (sizing.worker_mib(stage, t_["docs_in"], dpf, shards=row["shards"]) * (1 + WORKER_SLACK)
                                    if dpf >= MIN_DOCS_PER_FILE else None)
                row["shard_docs"] = t_["docs_in"] / row["shards"] if row["shards"] else None
                row["plan_shard_docs"] = plan_docs / p["shards"] if p["shards"] else None
            else:
                row["message"] = info.message
            res["stages"].append(row)
            log(f"[nodes] {stage}: {info.status} in {row['seconds']} s; worker peak {row.get('worker_peak_mib')} MiB, "
                f"OOM kills {sum(m['oom_kills'] for m in row['hosts'].values())}")
            if info.status != "SUCCEEDED":
                break
            src = dst
    finally:
        lab.down()
    res["violations"] = violations(res)
    return res


def violations(res: dict) -> list[str]:
    out = []
    for r in res["stages"]:
        if r["status"] != "SUCCEEDED":
            out.append(f"{r['stage']}: the job ended {r['status']}: {r.get('message', '')[-500:]}")
            continue
        kills = {h: m["oom_kills"] for h, m in r["hosts"].items() if m["oom_kills"]}
        if kills:
            out.append(f"{r['stage']}: the kernel OOM-killed processes on {kills} (limit {r['limit_mib']:,.0f} MiB)")
        w = r.get("worker_peak_mib") or 0
        if w > r["limit_mib"]:
            out.append(f"{r['stage']}: a worker's peak {w:,.0f} MiB is over the plan's {r['limit_mib']:,.0f} MiB")
        if r["bound_mib"] and w > r["bound_mib"]:
            out.append(f"{r['stage']}: a worker's peak {w:,.0f} MiB is over its bound {r['bound_mib']:,.0f} MiB")
    return out


def table(res: dict) -> str:
    p = res["plan"]
    lines = [f"\nthe plan for {p['docs']:,.0f} documents ({p['workers']:,} workers) on {res['nodes']} lab hosts, one CPU each, "
             f"memory limited to the plan's per worker (a node's own Ray processes: {res.get('node_idle_mib', 0):.0f} MiB)",
             "| stage | docs in | shards (plan at 10B) | docs a shard (plan's) | limit MiB | worker peak MiB | bound MiB "
             "| largest host MiB (with page cache) | OOM kills | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["stages"]:
        if r["status"] != "SUCCEEDED":
            lines.append(f"| {r['stage']} | {r['status']} | | | {r['limit_mib']:,.0f} | | | | "
                         f"{sum(m['oom_kills'] for m in r['hosts'].values())} | {r['seconds']:,.0f} |")
            continue
        shard = (f"{r['shard_docs']:,.0f} ({r['plan_shard_docs']:,.0f})" if r["shards"] else "—")
        host = max((m["peak_bytes"] or 0) for m in r["hosts"].values()) / MIB
        bound = f"{r['bound_mib']:,.0f}" if r["bound_mib"] else "—"
        lines.append(f"| {r['stage']} | {r['docs_in']:,} | {r['shards'] or '—'} ({r['plan_shards'] or '—'}) | {shard} | "
                     f"{r['limit_mib']:,.0f} | {r['worker_peak_mib'] or 0:,.1f} | {bound} | {host:,.0f} | "
                     f"{sum(m['oom_kills'] for m in r['hosts'].values())} | {r['seconds']:,.0f} |")
        peaks = ", ".join(f"{k} {v:,.1f}" for k, v in r["phase_peaks"].items() if v)
        lines.append(f"|  ↳ worker peak by phase | {peaks} | | | | | | | | |")
    lines.append("\nwithin the plan's memory" if not res["violations"] else "\nVIOLATIONS:\n" + "\n".join(res["violations"]))
    return "\n".join(lines)
