"""The tables the command line prints: one stage's summary, a pipeline run's documents per stage
and where its time went. All of them read metadata.json (or kfp.local's task times), nothing else."""

from __future__ import annotations

from pathlib import Path


def _console():
    from rich.console import Console

    return Console(highlight=False)


def reason_label(meta: dict, key: str) -> str:
    """A removal reason or counter as people read it (a filter's SQL or label), from metadata.json."""
    return (meta.get("labels") or {}).get(key, key)


def headline_items(meta: dict) -> list[dict]:
    """The transform's headline numbers but its removals (always shown on their own)."""
    return [h for h in meta.get("headline") or [] if not h["key"].startswith("removed.")]


def headline_text(meta: dict) -> str:
    """The transform's headline numbers in one line, e.g. ``pii_docs 12, pii_EMAIL_ADDRESS 3``."""
    return ", ".join(f"{h['label']} {_num(h['value'])}" for h in headline_items(meta))


def _num(v) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"


def time_text(t: dict) -> str:
    """``12.3 s (work 10.1 s, start-up 2.2 s)``: throughput is of the work; the start-up apart."""
    secs = t.get("seconds") or 0
    if "work_seconds" not in t:
        return f"{secs:,.1f} s"
    return f"{secs:,.1f} s (work {t['work_seconds']:,.1f} s, start-up {t.get('startup_seconds', 0):,.1f} s)"


def print_summary(meta: dict) -> None:
    """One stage's result in a few lines (a pipe or a KFP log reads it as well as a terminal)."""
    from rich.table import Table

    t = meta["totals"]
    table = Table(title=f"{meta['transform']}: {meta['status']}", title_justify="left", show_header=False, box=None, padding=(0, 1))
    table.add_column("measure", style="bold")
    table.add_column("value")
    rows = [
        ("files", f"{t['files']}" + (f" (+{t['files_failed']} failed)" if t.get("files_failed") else "")),
        ("docs", f"{t['docs_in']:,} in → {t['docs_out']:,} out"),
    ]
    rows += [(f"removed: {reason_label(meta, k)}", f"{n:,}") for k, n in t["removed"].items()]
    if t.get("parts"):
        rows.append(("out", ", ".join(f"{k} {v:,}" for k, v in t["parts"].items())))
    if headline_items(meta):
        rows.append(("counts", headline_text(meta)))
    rows += [("MB", f"{t['bytes_in'] / 1e6:,.1f} in → {t['bytes_out'] / 1e6:,.1f} out"), ("time", time_text(t))]
    if t.get("docs_per_second"):
        rows.append(("rate", f"{t['docs_per_second']:,.0f} docs/s, {t.get('mb_per_second') or 0:,.2f} MB/s"))
    if t.get("driver_peak_rss_mib"):
        workers = f", workers {t['worker_peak_rss_mib']:,.0f} MiB" if t.get("worker_peak_rss_mib") else ""
        rows.append(("peak memory", f"driver {t['driver_peak_rss_mib']:,.0f} MiB{workers}"))
    if t.get("work_bytes", 0) >= 100_000:  # a global stage's shard files (a map's markers alone are not worth a line)
        rows.append(("temporary files", f"{t['work_bytes'] / 1e6:,.1f} MB in {t.get('work_files', 0):,} files (deleted)"))
    for k, v in rows:
        table.add_row(k, v)
    _console().print(table)


def newest_run_dir(stages_root: Path, since: float) -> Path | None:
    """The run folder (``<work_root>/<run id>``) written since ``since`` (this process's run), if any."""
    dirs = [d for d in stages_root.iterdir() if d.is_dir() and d.stat().st_mtime >= since - 1] if stages_root.exists() else []
    return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None


def removed_cell(meta: dict) -> str:
    """Removed documents by reason (as people read them), lang_id's split, failed files."""
    tot = meta.get("totals", {})
    # "<reason>: N removed": a reason named like a flag (a filter's `dq_gopher_pass`) must not read as N passed
    parts = [", ".join(f"{reason_label(meta, k)}: {v:,} removed" for k, v in sorted(tot.get("removed", {}).items()))]
    if not parts[0] and tot.get("parts"):
        ranked = sorted(tot["parts"].items(), key=lambda kv: (-kv[1], kv[0]))  # every part: none hidden behind "…"
        parts = ["split into " + ", ".join(f"{k.split('=')[-1]} {v:,}" for k, v in ranked)]
    failed = sorted(meta.get("failures") or {})
    if failed:  # a failed stage's files, or files tolerated by --max-failed-files
        parts.append(f"failed file(s): {', '.join(failed[:3])}" + (" …" if len(failed) > 3 else ""))
    return ", ".join(p for p in parts if p)


def print_run_counts(stages_root: Path, since: float = 0.0) -> Path | None:
    """The documents of every stage of the run written since ``since``: in, out, removed by reason,
    in pipeline order and per branch, from their metadata.json; the accounting of every document
    (conservation.json); then the training result. Returns the run folder."""
    from rich.table import Table

    from prepline.runs import stage_metadata, training

    run_dir = newest_run_dir(stages_root, since)
    if run_dir is None:
        return None
    rows = stage_metadata(run_dir)
    if not rows:
        return run_dir
    t = Table(title="documents per stage", title_justify="left")
    for col in ("stage", "branch", "in", "out", "removed", "seconds"):
        t.add_column(col, justify="right" if col in ("in", "out", "seconds") else "left")
    for s in rows:
        tot, status = s.meta.get("totals", {}), s.meta.get("status", "success")
        t.add_row(s.stage if status == "success" else f"{s.stage} ({status.upper()})", s.branch, f"{tot.get('docs_in', 0):,}",
                  f"{tot.get('docs_out', 0):,}", removed_cell(s.meta), f"{tot.get('seconds', 0):.1f}")
    _console().print(t)
    _console().print(f"(from the metadata.json of each stage under {run_dir})")
    for line in accounting_lines(run_dir):
        _console().print(line, soft_wrap=True)
    mt = training(run_dir)[0]
    if mt:
        _console().print(f"fine_tune: {mt.get('steps')} steps, loss {mt.get('initial_loss', 0):.2f} → {mt.get('final_loss', 0):.2f}, "
                         f"{mt.get('tokens_seen', 0):,} tokens at {mt.get('tokens_per_s', 0):,.0f}/s; model in {mt.get('output', run_dir / 'fine_tune')}")
    return run_dir


def accounting_lines(run) -> list[str]:
    """The run's accounting of every document in a few lines (``conservation.json``), if it has one."""
    from prepline.runs import conservation

    result = conservation(run)
    if not result:
        return []
    from prepline.pipelines.conservation import summary_lines

    return summary_lines(result)


def print_task_times(times, secs: float) -> None:
    """Where a local pipeline run's time went, per task kind."""
    from rich.table import Table

    kinds = times.by_kind()
    if not kinds:
        return
    t = Table(title=f"tasks ({secs:,.0f}s in all)", title_justify="left")
    for col in ("task", "runs", "mean s", "min s", "max s", "total s"):
        t.add_column(col, justify="left" if col == "task" else "right")
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["total"]):
        t.add_row(kind, str(k["n"]), f"{k['mean']:.1f}", f"{k['min']:.1f}", f"{k['max']:.1f}", f"{k['total']:.1f}")
    _console().print(t)
    over = times.stage_overhead()
    if over is not None:
        _console().print(f"per-stage overhead (prepare + start cluster + stop cluster, mean): {over:.1f}s")
