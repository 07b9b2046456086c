"""The shipped recipes (pipelines/specs/*.yaml other than super) run end to end, locally, on the
sample in the form they are made for: fineweb on the sample as a web crawl (WARC)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_the_fineweb_recipe_runs_on_the_web_sample(tmp_path):
    env = dict(os.environ, PREPLINE_LOCAL_CLUSTERS=str(tmp_path / "clusters"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "prepline.cli", *args], capture_output=True, text=True, env=env, timeout=1200)

    r = cli("sample", "--output", str(tmp_path / "web"), "--format", "warc", "--docs", "600")
    assert r.returncode == 0, r.stderr
    r = cli("pipeline", "run", "fineweb", "--local", "--input", str(tmp_path / "web"), "--work-root", str(tmp_path / "w"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = [p for p in (tmp_path / "w" / "stages").iterdir() if p.is_dir()]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["pipeline"] == "fineweb" and plan["input"]["format"] == "warc"
    assert [(e["stage"], e["branch"]) for e in plan["entries"] if e["runs"]] == [
        ("ingest", ""), ("doc_id", ""), ("url_filter", ""), ("lang_id", ""), ("c4_clean", "en"), ("doc_quality", "en"),
        ("filter", "en"), ("fuzzy_dedup", "en"), ("pii_redactor", "en")]
    meta = {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json") if "_prepline" not in p.parts}
    # FineWeb's settings reached the stages
    assert meta["lang_id"]["parameters"]["min_score"] == 0.65
    c4 = meta["lang=en/c4_clean"]["parameters"]
    assert c4["terminal_punct"] is False and c4["filter_bad_words"] is False
    assert meta["lang=en/pii_redactor"]["parameters"]["entities"] == ["EMAIL_ADDRESS", "IP_ADDRESS"]
    assert meta["ingest"]["totals"]["docs_out"] > 550  # a page per non-empty document
    # what comes out passed every rule, has its URL, and no e-mail address is left
    files = [p for p in (run / "lang=en" / "pii_redactor").rglob("*.parquet") if "_removed" not in p.parts and "_prepline" not in p.parts]
    t = pa.concat_tables([pq.read_table(p) for p in files])
    assert t.num_rows > 20 and t.num_rows == meta["lang=en/pii_redactor"]["totals"]["docs_out"]
    assert all(t["dq_gopher_pass"].to_pylist()) and all(t["dq_fineweb_pass"].to_pylist())
    assert all(u.startswith("https://") for u in t["url"].to_pylist())
    assert not any(EMAIL.search(x) for x in t["contents"].to_pylist())
    assert meta["lang=en/filter"]["totals"]["removed"]  # the rules removed something on this sample
    cons = json.loads((run / "conservation.json").read_text())
    assert cons["holds"] and cons["input"] == meta["ingest"]["totals"]["docs_out"]
    assert sorted(p.stem for p in (tmp_path / "clusters").glob("*.json")) == []  # no cluster left
