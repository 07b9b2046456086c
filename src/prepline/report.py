"""The run report: one self-contained HTML file (inline SVG charts from :mod:`prepline.charts`, a few
lines of inline script, no network fetch) that sums a pipeline run up from what its stages wrote:

- the documents through every stage and branch (in and out),
- what was removed, by stage and reason (a filter's reasons by their SQL or label),
- the language mix (lang_id's split or counts),
- time and throughput per stage: the work apart from the start-up (connecting to Ray, workers),
- the training loss per step (``fine_tune/metrics.jsonl``),
- every stage's headline numbers and a link to its ``metadata.json``,
- the accounting of every document (``conservation.json``), when the run has one.

It reads a run folder ``<work_root>/<run id>/`` (a local path or an ``s3://`` URI): each
``[lang=<code>/]<stage>/metadata.json`` and ``fine_tune/metrics.json(l)``. ``prepline report``
writes it for a run folder, ``prepline pipeline run --local`` at the end of every run, and the
``run_report`` KFP component as the super pipeline's last step (an HTML artifact).
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path

from prepline import charts
from prepline.data_access import Location, open_location
from prepline.runs import METADATA, StageRun, as_location, stage_metadata, training

REPORT_FILE = "report.html"


# ----------------------------------------------------------------------------------------------
# the numbers of each chart (tested against metadata.json without a browser)


def funnel(stages: list[StageRun]) -> list[tuple[str, dict[str, float]]]:
    return [(s.row, {"in": s.meta["totals"]["docs_in"], "out": s.meta["totals"]["docs_out"]}) for s in stages]


def removals(stages: list[StageRun]) -> tuple[list[tuple[str, dict[str, float]]], list[str]]:
    """Rows of removed documents by reason (named as people read them) and the reasons in order."""
    rows, reasons = [], []
    for s in stages:
        labels = s.meta.get("labels") or {}
        got = {labels.get(k, k): v for k, v in s.meta["totals"]["removed"].items() if v}
        if got:
            rows.append((s.row, got))
            reasons += [r for r in got if r not in reasons]
    return rows, reasons


def languages(stages: list[StageRun]) -> list[tuple[str, dict[str, float]]]:
    """Documents per language from lang_id: its split folders, else its counters."""
    lid = next((s for s in stages if s.meta.get("transform") == "lang_id" and not s.branch), None)
    if lid is None:
        return []
    t = lid.meta["totals"]
    counts = {k.split("=", 1)[1]: v for k, v in (t.get("parts") or {}).items() if "=" in k}
    if not counts:
        counts = {k.removeprefix("lang_"): v for k, v in (t.get("counters") or {}).items() if k.startswith("lang_")}
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(k, {"documents": v}) for k, v in ranked]  # every language: none summed away


def timing(stages: list[StageRun]) -> tuple[list[tuple[str, dict[str, float]]], dict[str, str]]:
    """Seconds of work and of start-up per stage, and each row's throughput (of the work)."""
    rows, notes = [], {}
    for s in stages:
        t = s.meta["totals"]
        work = t.get("work_seconds", t.get("seconds", 0))
        rows.append((s.row, {"work": round(work, 3), "start-up": round(t.get("startup_seconds", 0), 3)}))
        rate = t.get("docs_per_second")
        notes[s.row] = f"{charts.fmt(round(t.get('seconds', 0), 1))} s" + (f", {charts.fmt(round(rate))} docs/s" if rate else "")
    return rows, notes


def loss_points(steps: list[dict]) -> list[tuple[float, float]]:
    return [(r["step"], float(r["loss"])) for r in sorted(steps, key=lambda r: r["step"])]


# ----------------------------------------------------------------------------------------------
# the page

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1000px;color:#1f2328;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px}.muted{color:#59636e}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}.card{border:1px solid #d1d9e0;border-radius:6px;padding:8px 12px}
.card b{display:block;font-size:18px}svg.chart{max-width:100%;height:auto;font-size:11px}
svg .grid{stroke:#e6e9ec}svg .tick,svg .unit{fill:#59636e}svg .row-label{fill:#1f2328}svg .value{fill:#1f2328;font-size:10px}
svg .legend-item{cursor:pointer}svg .legend-item.off{opacity:.35}svg .off-series{display:none}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #e6e9ec;padding:4px 6px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}td.t{white-space:nowrap}.bad{color:#cf222e;font-weight:600}code{font-size:12px}
#accounting pre{white-space:pre-wrap;overflow-wrap:anywhere}
"""

#: a click on a legend entry hides or shows that series (the page works without it)
_JS = """
document.querySelectorAll('svg.chart .legend-item').forEach(function (item) {
  item.addEventListener('click', function () {
    var svg = item.closest('svg'), s = item.getAttribute('data-series'), off = item.classList.toggle('off');
    svg.querySelectorAll('[data-series]').forEach(function (el) {
      if (el !== item && !el.classList.contains('legend-item') && el.getAttribute('data-series') === s) {
        el.classList.toggle('off-series', off);
      }
    });
  });
});
document.body.setAttribute('data-charts', String(document.querySelectorAll('svg.chart').length));
"""


def _href(run_uri: str, rel: str, relative: bool) -> str:
    return f"{rel}/{METADATA}" if relative else f"{run_uri.rstrip('/')}/{rel}/{METADATA}"


def _stage_table(stages: list[StageRun], run_uri: str, relative: bool) -> str:
    from prepline.tables import headline_text, removed_cell, time_text

    head = "".join(f"<th>{h}</th>" for h in ("stage", "branch", "status", "in", "out", "removed", "counts", "time", "docs/s", "metadata"))
    rows = []
    for s in stages:
        t, status = s.meta["totals"], s.meta.get("status", "?")
        rate = t.get("docs_per_second")
        rows.append(
            f"<tr data-stage=\"{escape(s.rel)}\"><td>{escape(s.stage)}</td><td>{escape(s.branch)}</td>"
            f"<td class=\"{'' if status == 'success' else 'bad'}\">{escape(status)}</td>"
            f"<td class=\"n\">{t['docs_in']:,}</td><td class=\"n\">{t['docs_out']:,}</td><td>{escape(removed_cell(s.meta))}</td>"
            f"<td>{escape(headline_text(s.meta))}</td><td class=\"t\">{escape(time_text(t))}</td><td class=\"n\">{charts.fmt(round(rate)) if rate else ''}</td>"
            f"<td><a href=\"{escape(_href(run_uri, s.rel, relative))}\">metadata.json</a></td></tr>")
    return f"<table id=\"stages\"><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _cards(stages: list[StageRun], train: dict | None) -> str:
    first = stages[0].meta["totals"]["docs_in"] if stages else 0
    last = [s for s in stages if s.stage == stages[-1].stage] if stages else []
    cards = [("documents in", f"{first:,}"), ("stages", f"{len(stages)}"),
             ("documents out", f"{sum(s.meta['totals']['docs_out'] for s in last):,}" + (f" ({last[0].stage})" if last else ""))]
    # the .bin's count (end-of-document tokens included, as Megatron counts): the stages' tokens_with_eod
    tokens = sum(int((s.meta.get("finish") or {}).get("tokens_with_eod", 0)) for s in stages)
    if tokens:
        cards.append(("tokens written (with EOD)", f"{tokens:,}"))
    if train:
        cards.append(("training loss", f"{train.get('initial_loss', 0):.3f} → {train.get('final_loss', 0):.3f}"))
    return "<div class=\"cards\">" + "".join(f"<div class=\"card\"><span class=\"muted\">{escape(k)}</span><b>{escape(v)}</b></div>"
                                             for k, v in cards) + "</div>"


def _accounting(loc: Location) -> str:
    """The run's accounting of every document (a spec pipeline's check_documents step), if it has one."""
    from prepline.tables import accounting_lines

    lines = accounting_lines(loc)
    return (f"<section id=\"accounting\"><h2>Every document accounted for</h2><pre>{escape(chr(10).join(lines))}</pre></section>"
            if lines else "")


def run_identity(loc: Location, stages: list[StageRun]) -> tuple[str, str]:
    """(pipeline name, input) of a run: from its plan.json, else the first stage's input."""
    from prepline.runs import PLAN, _json

    plan = _json(loc, PLAN) or {}
    source = (plan.get("input") or {}).get("path") if isinstance(plan.get("input"), dict) else None
    if not source and stages:
        source = (stages[0].meta.get("options") or {}).get("input")
    return str(plan.get("pipeline") or ""), str(source or "")


def render(run: str | Path | Location, relative_links: bool = True) -> str:
    """The report of a run folder as one HTML page. ``relative_links``: the page sits in the run
    folder (links to metadata.json are relative); else they are the files' full URIs."""
    loc = as_location(run)
    stages = stage_metadata(loc)
    train, steps = training(loc)
    run_id = loc.uri.rstrip("/").rsplit("/", 1)[-1]
    rem_rows, reasons = removals(stages)
    time_rows, notes = timing(stages)
    lang_rows = languages(stages)
    pts = loss_points(steps)
    sections = [
        ("Documents per stage", charts.hbars("chart-funnel", "documents in and out per stage and branch", funnel(stages), ["in", "out"], "documents")
         if stages else charts.empty("chart-funnel", "documents per stage", "no stage wrote metadata.json in this folder")),
        ("Removed, by stage and reason", charts.hbars("chart-removed", "documents removed by stage and reason", rem_rows, reasons, "documents", stacked=True)
         if rem_rows else charts.empty("chart-removed", "documents removed", "no stage removed documents")),
        ("Language mix", charts.hbars("chart-languages", "documents per language (lang_id)", lang_rows, ["documents"], "documents")
         if lang_rows else charts.empty("chart-languages", "language mix", "no lang_id stage in this run")),
        ("Time per stage", charts.hbars("chart-time", "seconds per stage: work and start-up", time_rows, ["work", "start-up"], "seconds",
                                        stacked=True, notes=notes)
         if time_rows else charts.empty("chart-time", "time per stage", "no stage timings")),
        ("Training loss", charts.line("chart-loss", "training loss per step", pts, "loss", "step", "loss")
         if pts else charts.empty("chart-loss", "training loss", "no fine_tune/metrics.jsonl in this run")),
    ]
    pipeline, source = run_identity(loc, stages)
    body = [f"<h1>prepline run {escape(run_id)}" + (f" of {escape(pipeline)}" if pipeline else "") + "</h1>",
            (f"<div class=\"muted\" id=\"run-input\">input {escape(source)}</div>" if source else ""),
            f"<div class=\"muted\">{escape(loc.uri)} · written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</div>",
            _cards(stages, train), _accounting(loc)]
    for title, svg in sections:
        body.append(f"<section><h2>{escape(title)}</h2>{svg}</section>")
    body.append(f"<section><h2>Stages</h2>{_stage_table(stages, loc.uri, relative_links)}</section>")
    title = f"prepline run {run_id}" + (f" of {pipeline}" if pipeline else "")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>{''.join(body)}"
            f"<script>{_JS}</script></body></html>\n")


def run_folder(work_root: str, run_id: str) -> str:
    """The run folder of a pipeline run: where its stages write (:func:`prepline.stages.stage_output`)."""
    from prepline.stages import run_key

    return f"{work_root.rstrip('/')}/{run_key(run_id)}"


def write_report(run: str | Path | Location, output: str | None = None) -> str:
    """Write the report of run folder ``run`` to ``output`` (default: ``<run>/report.html``); returns where."""
    loc = as_location(run)
    if output is None:
        loc.write_bytes(REPORT_FILE, render(loc, relative_links=True).encode("utf-8"))
        return loc.path(REPORT_FILE)
    same = Path(output).resolve().parent == Path(loc.path("")).resolve() if "://" not in output and "://" not in loc.uri else False
    html = render(loc, relative_links=same)
    if "://" in output:
        parent, name = open_location(output).parent_and_name()
        parent.write_bytes(name, html.encode("utf-8"))
    else:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(html, encoding="utf-8")
    return output
