"""The Python API (prepline.api, docs/python_api.md; its snippets run in tests/test_docs.py)."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepline
from prepline.errors import ConfigError, InputError


def test_import_prepline_imports_nothing_else():
    code = "import sys; before = set(sys.modules); import prepline; print(sorted(set(sys.modules) - before))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(r.stdout.replace("'", '"')) == ["prepline"]


def test_run_and_read_metadata(tmp_path):
    pq.write_table(pa.table({"contents": ["a b", "a b", "c"]}), tmp_path / "in.parquet")
    m = prepline.run("doc_id", str(tmp_path / "in.parquet"), str(tmp_path / "ids"), params={"start_id": 5}, workers=1)
    assert m.ok and not m.resumed and m.parameters["start_id"] == 5
    read = prepline.read_metadata(str(tmp_path / "ids" / "metadata.json"))
    assert read.totals == m.totals and read.totals.docs_out == 3 and read.totals.removed_total == 0
    with pytest.raises(ConfigError, match="unknown parameter"):
        prepline.run("doc_id", str(tmp_path / "in.parquet"), str(tmp_path / "x"), no_such=1)
    with pytest.raises(InputError, match="no metadata.json"):
        prepline.read_metadata(str(tmp_path))


def test_transforms_are_listed_with_their_parameters():
    infos = {t.name: t for t in prepline.list_transforms()}
    assert "doc_id" in infos and infos["doc_id"].plugin is None
    assert infos["exact_dedup"].defaults()["num_shards"] == prepline.describe("exact_dedup").defaults()["num_shards"]


def test_pipeline_specs_load_and_compile(tmp_path):
    from pathlib import Path

    import yaml

    mine = Path(__file__).parents[1] / "pipelines" / "mine.yaml"
    spec = prepline.load_pipeline(str(mine))
    assert spec.name == "mine" and prepline.load_pipeline("super").name == "super"
    written = prepline.compile_pipeline(spec, tmp_path / "c")
    assert tmp_path / "c" / "mine.yaml" in written
    doc = next(yaml.safe_load_all((tmp_path / "c" / "mine.yaml").read_text()))  # the pipeline, then its platform spec
    assert "mine" in doc["pipelineInfo"]["name"] and "lang-id" in json.dumps(doc["root"]["dag"]["tasks"])
    with pytest.raises(ConfigError):
        prepline.load_pipeline({"name": "x", "stages": ["no_such_transform"]})
