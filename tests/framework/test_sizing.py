"""prepline.sizing / `prepline plan`: the plan meets its deadline with the fewest workers, keeps every
worker within its memory, scales with the corpus, names the benchmark of every constant, and is the
table docs/scale.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prepline import sizing
from prepline.cli import main as cli_main
from prepline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("docs,bytes_per_doc,hours,mem", [(10e9, 3000, 24, 8), (1e9, 2000, 12, 4), (1e6, 1450, 1, 2)])
def test_the_fewest_workers_that_meet_the_deadline_within_memory(docs, bytes_per_doc, hours, mem):
    p = sizing.plan(docs, bytes_per_doc, hours, worker_memory_gib=mem)
    # the CPU and the dedup shuffles' reads (fewer shard tasks per worker as workers are added) meet the deadline
    assert p.wall_hours <= hours + 1e-9 and "over the" not in p.verdict
    if p.workers > 1:  # one worker fewer misses it
        fewer = sizing.plan(docs, bytes_per_doc, hours, worker_memory_gib=mem, workers=p.workers - 1)
        assert fewer.wall_hours > hours and "over the" in fewer.verdict
    for r in p.rows:
        assert r["worker_gib"] <= mem, r
        if r["state_gib"]:
            assert r["shards"] >= p.workers and r["shards"] & (r["shards"] - 1) == 0
            assert r["state_gib"] / r["shards"] + 0.15 <= mem


def test_core_hours_scale_with_documents_and_bytes():
    a, b, c = sizing.plan(1e9, 1000, 24), sizing.plan(2e9, 1000, 24), sizing.plan(1e9, 3000, 24)
    for ra, rb, rc in zip(a.rows, b.rows, c.rows):
        assert rb["core_h"] == pytest.approx(2 * ra["core_h"]) and rc["core_h"] == pytest.approx(3 * ra["core_h"])


def test_every_constant_names_a_section_of_the_performance_doc():
    perf = (ROOT / "docs" / "performance.md").read_text()
    for s in sizing.STAGES + sizing.OPTIONAL:
        titles = [part.split("'")[1] for part in s.source.split("docs/performance.md, ")[1:]]
        assert titles, s
        for t in titles:
            assert t in perf, (s.name, t)


def test_docs_scale_md_is_the_commands_table():
    text = (ROOT / "docs" / "scale.md").read_text()
    assert sizing.render_scale_doc(text) == text  # scripts/gen_docs.py writes it
    assert sizing.table_markdown(sizing.plan(**sizing.DOC_COMMAND)) in text


def test_the_command(capsys):
    assert cli_main(["plan", "--docs", "10e9", "--bytes-per-doc", "3000", "--hours", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == sizing.plan(**sizing.DOC_COMMAND).workers and len(out["stages"]) == len(sizing.STAGES)
    assert cli_main(["plan", "--docs", "1e6", "--add", "url_filter,decontaminate"]) == 0
    printed = capsys.readouterr().out
    assert "| url_filter |" in printed and "| decontaminate |" in printed


@pytest.mark.parametrize("kw,says", [
    (dict(docs=1e9, hours=0.1), "leaves no time"),
    (dict(docs=0), "docs >= 1"),
    (dict(docs=1e9, extra=("nope",)), "no measured cost for nope"),
    (dict(docs=10e9, worker_memory_gib=0.5), "more than --worker-memory-gib"),
])
def test_bad_plans_are_clear_errors(kw, says):
    with pytest.raises(ConfigError, match=says):
        sizing.plan(**kw)


def test_the_shuffle_reads_are_counted_and_set_the_time_at_ten_billion():
    p = sizing.plan(10e9, 3000, 24)
    fuzzy = next(r for r in p.rows if r["stage"] == "fuzzy_dedup")
    producers = p.files * 3  # 185,161 documents a file: three 64k-row batches
    assert fuzzy["get"] >= 2 * 3 * producers * fuzzy["shards"]  # ids, bands, candidates: a footer and a range each
    assert fuzzy["read_h"] > fuzzy["core_h"] / p.workers  # the requests, not the CPU, set its time
    assert any(n.startswith("fuzzy_dedup: ") and "the requests set its time" in n for n in p.notes)
    cpu_only = sizing.plan(10e9, 3000, 24, workers=344)  # the workers the CPU alone needs: the reads miss the deadline
    assert cpu_only.wall_hours > 24 and "over the 24 h deadline" in cpu_only.verdict and p.workers > 344
    small = sizing.plan(1e7, 1450, 24)  # at ten million the shuffle is a few thousand GETs: no such note
    assert not any("the requests set its time" in n for n in small.notes) and "over the" not in small.verdict


def test_the_plan_reads_partitions_as_many_at_once_as_a_shard_task_does():
    from prepline import sharded

    assert sizing.PARTITION_READERS == sharded.PARTITION_READERS
