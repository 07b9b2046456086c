"""metadata.json: what a stage did, written last and atomically.

Counts are conserved for every file and in total: ``docs_in == docs_out + Σ removed_<reason>``,
and for a stage that adds documents (synthesize) ``docs_in + Σ generated_<kind> == docs_out + Σ
removed_<reason>``.
A stage whose counts do not add up fails instead of writing a success.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
from collections import Counter
from typing import Any, Callable

from prepline.errors import RunFailed
from prepline.runtime import allocator

SCHEMA_VERSION = 1
#: a run over more input files than this keeps their per-file detail out of metadata.json, in FILES_DETAIL
#: (one JSON object a line; hidden from the next stage's input listing): a 100k-file metadata.json is not
#: a file a person opens
FILES_INLINE = 1000
FILES_DETAIL = "_files.jsonl"


def split_files(meta: dict) -> tuple[dict, bytes | None]:
    """(metadata.json's document, the per-file detail file's bytes or None): with more than
    FILES_INLINE files, ``files`` becomes {} and ``files_detail`` says where the detail is."""
    import json

    files = meta.get("files") or {}
    if len(files) <= FILES_INLINE:
        return meta, None
    doc = {**meta, "files": {}, "files_detail": {"path": FILES_DETAIL, "files": len(files)}}
    body = "".join(json.dumps({"file": rel, **detail}, default=list, allow_nan=False) + "\n" for rel, detail in files.items())
    return doc, body.encode()


def join_files(loc, meta: dict | None) -> dict | None:
    """A metadata.json document with its per-file detail read back from ``files_detail`` (if any)."""
    import json

    detail = (meta or {}).get("files_detail")
    if not detail or meta.get("files"):
        return meta
    files = {}
    for line in (loc.read_text(detail["path"]) or "").splitlines():
        if line.strip():
            d = json.loads(line)
            files[d.pop("file")] = d
    return {**meta, "files": files}
_PACKAGES = ("prepline", "pyarrow", "numpy", "duckdb", "ray", "s3fs", "boto3")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES + extra:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def conserved(stats: dict) -> bool:
    """``docs_in + Σ generated == docs_out + Σ removed`` for one file's stats or a stage's totals."""
    return stats["docs_in"] + sum(stats.get("generated", {}).values()) == stats["docs_out"] + sum(stats.get("removed", {}).values())


def check_file_counts(rel: str, stats: dict) -> None:
    removed = sum(stats.get("removed", {}).values())
    if not conserved(stats):
        gen = sum(stats.get("generated", {}).values())
        raise RunFailed(
            f"{rel}: counts do not add up: docs_in={stats['docs_in']}" + (f" + generated={gen}" if gen else "")
            + f" != docs_out={stats['docs_out']} + removed={removed} ({stats.get('removed')})",
            "this is a bug in the transform: report it with this metadata",
        )


#: the totals that measure how a run went (time, memory, temporary space), not what it computed: two
#: runs of the same input and parameters agree on every other total
MEASURED_TOTALS = ("seconds", "work_seconds", "startup_seconds", "docs_per_second", "mb_per_second",
                   "driver_peak_rss_mib", "worker_peak_rss_mib", "work_bytes", "work_files")


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, MiB: ``VmHWM`` (Linux; unlike ``ru_maxrss`` it is
    not the RSS of the process a worker was forked from), else ``ru_maxrss``; None where neither is."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    try:
        import resource
        import sys

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(r / (2**20 if sys.platform == "darwin" else 1024), 1)
    except (ImportError, OSError):
        return None


def totals(files: dict[str, dict]) -> dict[str, Any]:
    """Sum per-file stats; removed and counters by key, parts by sub-folder."""
    t: dict[str, Any] = {"files": len(files), "docs_in": 0, "docs_out": 0, "bytes_in": 0, "bytes_out": 0}
    removed: Counter = Counter()
    counters: Counter = Counter()
    parts: Counter = Counter()
    sampled: Counter = Counter()
    generated: Counter = Counter()
    for s in files.values():
        for k in ("docs_in", "docs_out", "bytes_in", "bytes_out"):
            t[k] += s[k]
        removed.update(s.get("removed", {}))
        counters.update(s.get("counters", {}))
        parts.update(s.get("parts", {}))
        sampled.update(s.get("removed_sampled", {}))
        generated.update(s.get("generated", {}))
    t["removed"] = dict(sorted(removed.items()))
    if generated:
        t["generated"] = dict(sorted(generated.items()))
    t["removed_total"] = sum(removed.values())
    t["counters"] = dict(sorted(counters.items()))
    if set(parts) != {""}:
        t["parts"] = dict(sorted(parts.items()))
    if sampled:
        t["removed_sampled"] = dict(sorted(sampled.items()))
    if not conserved(t):
        raise RunFailed(
            f"total counts do not add up: docs_in={t['docs_in']} + generated={sum(generated.values())} != "
            f"docs_out={t['docs_out']} + removed={t['removed_total']}",
            "this is a bug in the transform: report it with this metadata",
        )
    return t


#: where a headline entry looks: ``counters`` by default
_HEADLINE_SOURCES = ("counters", "removed", "generated", "plan", "finish")


def headline(meta: dict, patterns: tuple[str, ...], label: Callable[[str], str] = str) -> list[dict]:
    """A transform's headline numbers from its metadata: ``[{"key", "label", "value"}]`` in the order
    declared (matches of a pattern sorted by name); only numbers, only what the run has."""
    from fnmatch import fnmatchcase

    sources = {"counters": meta.get("totals", {}).get("counters") or {}, "removed": meta.get("totals", {}).get("removed") or {},
               "generated": meta.get("totals", {}).get("generated") or {}, "plan": meta.get("plan") or {}, "finish": meta.get("finish") or {}}
    out, seen = [], set()
    for p in patterns:
        src, _, pat = p.partition(".") if p.split(".", 1)[0] in _HEADLINE_SOURCES and "." in p else ("counters", "", p)
        for k in sorted(sources[src]):
            v = sources[src][k]
            key = f"{src}.{k}"
            if fnmatchcase(k, pat) and key not in seen and isinstance(v, (int, float)) and not isinstance(v, bool):
                seen.add(key)
                out.append({"key": key, "label": label(k) if src in ("counters", "removed") else (f"generated {k}" if src == "generated" else k),
                            "value": v})
    return out


def build(
    *,
    transform: str,
    parameters: dict,
    options: dict,
    fingerprint: str,
    files: dict[str, dict],
    failures: dict[str, dict],
    skipped_files: list[str],
    started: str,
    seconds: float,
    startup_seconds: float = 0.0,
    phases: dict[str, dict],
    status: str,
    state_summary: dict | None = None,
) -> dict[str, Any]:
    t = totals(files)
    t["files_failed"] = len(failures)
    # documents of the failed (tolerated) input files, from their Parquet footers where readable:
    # never in docs_in, never lost silently
    known = [f["docs"] for f in failures.values() if isinstance(f.get("docs"), int)]
    t["docs_in_failed_files"] = sum(known)
    t["failed_files_docs_unknown"] = len(failures) - len(known)
    # throughput is of the work: the start-up (connecting to Ray, starting the workers) is shown apart
    work = max(seconds - startup_seconds, 0.0)
    t["seconds"] = round(seconds, 3)
    t["startup_seconds"] = round(min(startup_seconds, seconds), 3)
    t["work_seconds"] = round(work, 3)
    t["docs_per_second"] = round(t["docs_in"] / work, 1) if work > 0 else None
    t["mb_per_second"] = round(t["bytes_in"] / 1e6 / work, 2) if work > 0 else None
    return {
        "schema_version": SCHEMA_VERSION,
        "transform": transform,
        "status": status,
        "parameters": parameters,
        "options": options,
        "fingerprint": fingerprint,
        "versions": {**package_versions(), "allocator": allocator.current()},  # the driver's (and its local pool's)
        "started": started,
        "ended": now_iso(),
        "totals": t,
        "phases": phases,
        "plan": state_summary or {},
        "failures": failures,
        "resumed_files": skipped_files,
        "files": files,
    }
