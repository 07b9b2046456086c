"""Before a run of a prepline pipeline is posted to KFP, the preflight checks what the plan step would
refuse (issue 25): overrides_json's stages and parameters, a simple pipeline's params_json,
languages; with --check-input, the input read from this machine. Nothing is posted on a failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.kfp import cli as kfp_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_kfp_server import fake, kfp_isolated  # noqa: E402,F401 (fixtures)

pytestmark = pytest.mark.usefixtures("kfp_isolated")

ROOT = Path(__file__).resolve().parents[2]
SUPER = ROOT / "compiled" / "pipelines" / "super.yaml"
DOC_ID = ROOT / "compiled" / "pipelines" / "doc_id.yaml"
REQ = ("--param", "input_path=s3://b/in", "--param", "work_root=s3://b/w")


def kfp(capsys, *args):
    code = kfp_cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("pipeline, args, msg", [
    (SUPER, ["--param", 'overrides_json={"filtre": {}}'], "overrides_json names stage 'filtre', which does not exist"),
    (SUPER, ["--param", 'overrides_json={"exact_dedup": {"params": {"num_shards": 0}}}'], "num_shards=0 must be >= 1"),
    (SUPER, ["--param", "languages=[]"], "languages is empty"),
    (SUPER, ["--param", "input_format=xml"], "input_format='xml' is not one of"),
    (DOC_ID, ["--param", 'params_json={"start_id": -1}'], "start_id=-1 must be >= 0"),
])
def test_bad_stage_settings_are_refused_before_posting(fake, capsys, pipeline, args, msg):
    code, out, err = kfp(capsys, "run", pipeline, *REQ, *args, "--host", fake.url)
    assert code == 2 and msg in err and "fix:" in err and "Traceback" not in err, err
    assert not fake.calls("POST", "/runs")


def test_good_settings_are_posted(fake, capsys):
    code, out, err = kfp(capsys, "run", SUPER, *REQ, "--param", 'overrides_json={"filter": {"allow_empty_output": true}}',
                         "--param", "text_field=content", "--host", fake.url)
    assert code == 0, err
    (post,) = fake.calls("POST", "/runs$")
    assert post["body"]["runtime_config"]["parameters"]["text_field"] == "content"


def test_check_input_reads_the_input_from_here(fake, capsys, tmp_path):
    pq.write_table(pa.table({"text": ["words"] * 2}), tmp_path / "a.parquet")
    code, out, err = kfp(capsys, "run", SUPER, "--param", f"input_path={tmp_path}", "--param", "work_root=s3://b/w",
                         "--check-input", "--host", fake.url)
    assert code == 6 and "no column 'contents' (columns: text)" in err and "--param text_column=text" in err
    code, out, err = kfp(capsys, "run", SUPER, "--param", f"input_path={tmp_path / 'nope'}", "--param", "work_root=s3://b/w",
                         "--check-input", "--host", fake.url)
    assert code == 6 and "does not exist" in err
    assert not fake.calls("POST", "/runs")
    code, out, err = kfp(capsys, "run", SUPER, "--param", f"input_path={tmp_path}", "--param", "work_root=s3://b/w",
                         "--param", "text_column=text", "--check-input", "--host", fake.url)
    assert code == 0, err


def test_a_list_parameter_takes_comma_separated_values(fake, capsys):
    code, out, err = kfp(capsys, "run", SUPER, *REQ, "--param", "languages=en,ja", "--host", fake.url)
    assert code == 0, err
    assert fake.calls("POST", "/runs$")[-1]["body"]["runtime_config"]["parameters"]["languages"] == ["en", "ja"]
    code, out, err = kfp(capsys, "run", SUPER, *REQ, "--param", "languages={}", "--host", fake.url)
    assert code == 2 and "--param languages=a,b" in err
