"""The run report: its numbers against the stages' metadata.json (no browser), the command, and the
same run's page opened in a real headless Chromium (tests/chromium.py)."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pytest

from prepline import report, runs
from prepline.engine import RunOptions, run_transform

FILTER = {"criteria": ["length(contents) >= 120", "contents NOT LIKE '%http%'"], "criteria_labels": ["long enough", "no links"],
          "removed_sample": 2}
TRAIN = {"threads": 1, "model_dim": 32, "batch_size": 8, "lr": 0.01, "warmup_steps": 2, "log_every": 4, "seq_len": 32, "steps": 12}


def _run(name: str, params: dict, src: Path, out: Path) -> None:
    run_transform(name, params, RunOptions(input=str(src), output=str(out), workers=1, progress=False))


def build_run(root: Path) -> Path:
    """A small real run folder, laid out as a pipeline writes it: global stages, a language split,
    two branches (filter, tokenization) and a short training on one branch's tokens."""
    from prepline.sample import build_sample
    from prepline.train.train import train

    build_sample(str(root / "sample"), docs=300, files=2)
    run = root / "stages" / "run-1"
    _run("doc_id", {}, root / "sample", run / "doc_id")
    _run("exact_dedup", {}, run / "doc_id", run / "exact_dedup")
    _run("lang_id", {"split": True}, run / "exact_dedup", run / "lang_id")
    for lang in ("en", "ja"):
        _run("filter", FILTER, run / "lang_id" / f"lang={lang}", run / f"lang={lang}" / "filter")
        _run("tokenization", {"vocab_size": 300, "tokens_column": ""}, run / f"lang={lang}" / "filter", run / f"lang={lang}" / "tokenization")
    train([str(run / "lang=en" / "tokenization")], str(run / "fine_tune"), TRAIN, out=io.StringIO())
    return run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report"))


def _metas(run: Path) -> dict[str, dict]:
    return {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json") if "_prepline" not in p.parts}


def _bars(html: str, chart: str) -> dict[tuple[str, str], float]:
    """(row, series) -> value of every bar of one chart, read from the page's markup."""
    svg = re.search(rf'<svg class="chart" id="{chart}".*?</svg>', html, re.S).group(0)
    return {(r, s): float(v) for s, r, v in re.findall(r'<rect class="bar" data-series="([^"]*)" data-row="([^"]*)" data-value="([^"]*)"', svg)}


@pytest.mark.slow
@pytest.mark.integration
def test_report_numbers_are_the_stages_metadata(run_dir):
    metas = _metas(run_dir)
    html = Path(report.write_report(run_dir)).read_text()
    stages = runs.stage_metadata(run_dir)
    assert [s.rel for s in stages] == ["doc_id", "exact_dedup", "lang_id", "lang=en/filter", "lang=en/tokenization",
                                       "lang=ja/filter", "lang=ja/tokenization"]
    funnel = _bars(html, "chart-funnel")
    for s in stages:
        t = metas[s.rel]["totals"]
        assert funnel[(s.row, "in")] == t["docs_in"] and funnel[(s.row, "out")] == t["docs_out"]
        time_bars = _bars(html, "chart-time")
        assert time_bars[(s.row, "work")] == pytest.approx(t["work_seconds"], abs=1e-3)
        assert time_bars[(s.row, "start-up")] == pytest.approx(t["startup_seconds"], abs=1e-3)
        assert f'href="{s.rel}/metadata.json"' in html
    removed = _bars(html, "chart-removed")
    want = {(s.row, metas[s.rel].get("labels", {}).get(k, k)): v for s in stages for k, v in metas[s.rel]["totals"]["removed"].items() if v}
    assert removed == want and ("filter (en)", "long enough") in removed  # a filter's reasons by their labels
    langs = _bars(html, "chart-languages")
    parts = metas["lang_id"]["totals"]["parts"]
    ranked = sorted(((k.split("=")[1], v) for k, v in parts.items()), key=lambda kv: (-kv[1], kv[0]))
    assert [(r, v) for (r, _), v in langs.items()][:3] == ranked[:3]
    assert sum(langs.values()) == sum(parts.values())  # the top languages and the rest summed
    steps = [json.loads(line) for line in (run_dir / "fine_tune" / "metrics.jsonl").read_text().splitlines()]
    loss = re.search(r'<path class="series" data-series="loss" data-points="(\d+)"', html)
    assert loss and int(loss.group(1)) == len(steps) == TRAIN["steps"]
    assert [float(v) for v in re.findall(r'<circle class="point" data-series="loss" data-value="([^"]*)"', html)] == [s["loss"] for s in steps]
    # self-contained: nothing fetched (the only URL is the SVG namespace)
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html and "@import" not in html


@pytest.mark.slow
@pytest.mark.integration
def test_removed_samples_sit_next_to_the_output(run_dir):
    meta = json.loads((run_dir / "lang=en" / "filter" / "metadata.json").read_text())
    sampled = meta["totals"]["removed_sampled"]
    assert sampled and all(v <= 2 * meta["totals"]["files"] for v in sampled.values())
    import pyarrow.parquet as pq

    for reason, n in sampled.items():
        files = list((run_dir / "lang=en" / "filter" / "_removed" / reason).glob("*.parquet"))
        assert sum(pq.read_metadata(f).num_rows for f in files) == n
        assert all(pq.read_metadata(f).num_rows <= FILTER["removed_sample"] for f in files)
    # the rows are the removed ones: none of them is in the output
    out = run_dir / "lang=en" / "filter"
    out_ids = {i for f in out.glob("*.parquet") for i in pq.read_table(f, columns=["doc_id"]).column(0).to_pylist()}
    short = [t for f in (out / "_removed" / "criterion_1").glob("*.parquet") for t in pq.read_table(f).column("contents").to_pylist()]
    assert short and all(len(t) < 120 for t in short)  # criterion 1 removed them: too short
    sampled_ids = {i for f in (out / "_removed").rglob("*.parquet") for i in pq.read_table(f).column("doc_id").to_pylist()}
    assert sampled_ids and not out_ids & sampled_ids


def test_long_legend_names_wrap_inside_the_chart():
    """A filter's SQL as a series name: the legend wraps to the chart's width, cuts what no line
    holds, keeps the whole name in data-series, and the bars start below it."""
    from prepline import charts

    names = ["exact_duplicate", "length(trim(contents)) >= 20", "dq_gopher_pass", "(lang <> 'en' OR hap_score < 0.9)", "x" * 120]
    svg = charts.hbars("c", "removed", [("filter (en)", {n: 1 for n in names})], names, stacked=True)
    items = re.findall(r'<g class="legend-item" data-series="([^"]*)" transform="translate\((\d+),(\d+)\)".*?<text x="16" y="10">([^<]*)</text>',
                       svg)
    assert [html.unescape(i[0]) for i in items] == names
    for _, x, _, shown in items:
        shown = html.unescape(shown)
        assert int(x) + 28 + 7 * len(shown) - 6 <= charts.WIDTH - charts.LABEL_W
    lines = sorted({int(y) for _, _, y, _ in items})
    assert len(lines) >= 3 and items[-1][3].endswith("…") and len(items[-1][3]) == charts.LEGEND_CHARS
    first_bar = float(re.search(r'<rect class="bar"[^>]* y="([\d.]+)"', svg).group(1))
    assert first_bar > 4 + lines[-1] + 16


def test_report_command_refuses_a_folder_without_stages(tmp_path, capsys):
    from prepline.cli import main

    assert main(["report", str(tmp_path)]) == 2
    assert "holds no stage metadata.json" in capsys.readouterr().err


#: what each chart must show: its series (legend) and row labels that must be there
CHARTS = {
    "chart-funnel": (["in", "out"], ["doc_id", "exact_dedup", "lang_id", "filter (en)", "tokenization (ja)"]),
    "chart-removed": (["exact_duplicate", "long enough", "no links"], ["exact_dedup", "filter (en)"]),
    "chart-languages": (["documents"], ["en", "ja"]),
    "chart-time": (["work", "start-up"], ["doc_id", "filter (ja)"]),
    "chart-loss": (["loss"], []),
}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.browser
def test_report_opens_in_headless_chromium_without_errors(run_dir, tmp_path):
    """The page in Debian's Chromium (tests/chromium.py): no JavaScript or console error, nothing
    fetched, every chart drawn with its series and labels, a legend click hiding its series, a
    screenshot kept in test-artifacts/report.png."""
    from chromium import READ_CHARTS, keep, open_page

    page_file = Path(report.write_report(run_dir))
    with open_page(tmp_path / "profile") as (page, problems):
        page.goto(page_file.as_uri(), wait_until="load")
        charts = {c["id"]: c for c in page.evaluate(READ_CHARTS)}
        assert page.get_attribute("body", "data-charts") == "5"  # the page's own script ran to its end
        # a click on a legend entry hides that series (and only it)
        page.click("#chart-funnel .legend-item[data-series='in']")
        hidden = page.evaluate("() => Array.from(document.querySelectorAll('#chart-funnel rect.bar')).filter(e => "
                               "getComputedStyle(e).display === 'none').map(e => e.getAttribute('data-series'))")
        page.click("#chart-funnel .legend-item[data-series='in']")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    keep(tmp_path / "report.png", "report.png")
    keep(page_file, "report.html")
    assert problems == []
    assert set(charts) == set(CHARTS)
    for cid, (series, rows) in CHARTS.items():
        c = charts[cid]
        assert c["width"] > 300 and c["height"] > 100 and c["outside"] == [], c
        assert c["marks"] > 0 and sorted(c["series"]) == sorted(series) and c["legend"] == series, c
        assert set(rows) <= set(c["rows"]), c
    assert hidden and set(hidden) == {"in"}
    assert (tmp_path / "report.png").stat().st_size > 10_000


def _meta(transform: str, docs_in: int, docs_out: int, removed: dict | None = None, **extra) -> dict:
    return {"transform": transform, "status": "success", "options": {"input": extra.pop("input", "x")},
            "totals": {"docs_in": docs_in, "docs_out": docs_out, "removed": removed or {}, "files": 1, "seconds": 1234.5,
                       "work_seconds": 1200.25, "startup_seconds": 34.25, **extra.pop("totals", {})}, **extra}


@pytest.fixture
def handmade_run(tmp_path) -> Path:
    """A run folder written by hand: a plan naming the pipeline and input, lang_id split into 20
    languages, a filter whose criterion is labelled like a pass flag."""
    run = tmp_path / "stages" / "run-9"
    langs = {f"lang={c}": 10 + i for i, c in enumerate(["en", "ja", "fr", "de", "es", "it", "nl", "pt", "ru", "zh", "ko", "ar", "hi",
                                                          "pl", "sv", "tr", "cs", "fi", "el", "other"])}
    metas = {"doc_id": _meta("doc_id", 1000, 1000, input="/data/raw.jsonl"),
             "lang_id": _meta("lang_id", 1000, 1000, totals={"parts": langs}),
             "lang=en/filter": _meta("filter", 10, 3, {"criterion_1": 7}, labels={"criterion_1": "dq_gopher_pass"})}
    for rel, m in metas.items():
        (run / rel).mkdir(parents=True)
        (run / rel / "metadata.json").write_text(json.dumps(m))
    (run / "plan.json").write_text(json.dumps({"pipeline": "super", "input": {"path": "/data/raw.jsonl", "format": "jsonl"},
                                               "entries": [{"stage": "doc_id"}, {"stage": "lang_id"}, {"stage": "filter"}]}))
    return run


def test_report_reads_plainly(handmade_run):
    """Issue 25 item 9: a removal count says it removed; every language is drawn (no "other
    languages" bar hiding some); the header names the pipeline and its input; the time column
    does not wrap."""
    from prepline.tables import removed_cell

    page = report.render(handmade_run)
    assert "dq_gopher_pass: 7 removed" in page
    assert "dq_gopher_pass: 7 removed" in removed_cell(json.loads((handmade_run / "lang=en/filter/metadata.json").read_text()))
    langs = _bars(page, "chart-languages")
    assert len(langs) == 20 and ("el", "documents") in langs and not any("other languages" in r for r, _ in langs)
    head = page[page.index("<h1>"):page.index("<div class=\"cards\">")]
    assert "super" in head and "/data/raw.jsonl" in head and "run-9" in head
    assert re.search(r'<td class="t">1,234\.5\xa0s', page) or re.search(r'<td class="t">[^<]*1,234\.5 s', page)
    assert "td.t{white-space:nowrap}" in page.replace(" ", "")


def test_report_header_without_a_plan_names_the_first_stage_input(handmade_run):
    (handmade_run / "plan.json").unlink()
    page = report.render(handmade_run)
    head = page[page.index("<h1>"):page.index("<div class=\"cards\">")]
    assert "/data/raw.jsonl" in head
