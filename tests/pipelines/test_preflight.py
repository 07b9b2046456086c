"""The preflight of a pipeline run (issue 25): the name first, then the parameters, then the input's
existence, format and text column or field, from its first rows only; each failure one `error:` and
one `fix:` naming the pipeline parameter to set, its exit code, no traceback, no kfp dump, and
nothing built or started (no sample, no kfp folder, no cluster)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline import preflight as pf
from prepline.errors import ConfigError, InputError
from prepline.pipeline_cli import param_values


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    return subprocess.run([sys.executable, "-m", "prepline.cli", "pipeline", "run", *args, "--local", "--work-root", str(work)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _one_error(p: subprocess.CompletedProcess) -> tuple[str, str]:
    out = p.stdout + p.stderr
    assert "Traceback" not in out and "executor_input" not in out and "\x1b[" not in out, out
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("  fix: "), p.stderr
    return err[0], err[1]


def test_a_typo_in_the_pipeline_name_is_refused_before_the_sample_is_built(tmp_path):
    p = _cli(tmp_path, "supr")  # no --input: the sample would be built first
    error, fix = _one_error(p)
    assert p.returncode == 2 and "unknown pipeline 'supr' (did you mean 'super'?)" in error and "super" in fix
    assert not (tmp_path / "work").exists()


def test_a_missing_input_fails_with_exit_6(tmp_path):
    p = _cli(tmp_path, "super", "--input", str(tmp_path / "nope.jsonl"))
    error, fix = _one_error(p)
    assert p.returncode == 6 and "does not exist" in error and "input_path" in fix
    assert not (tmp_path / "work").exists()


def test_a_wrong_jsonl_text_field_names_the_pipelines_text_field(tmp_path):
    src = _jsonl(tmp_path / "in" / "a.jsonl", [{"content": f"document {i} about the weather", "id": i} for i in range(1002)])
    p = _cli(tmp_path, "super", "--input", str(src.parent))
    error, fix = _one_error(p)
    assert p.returncode == 6 and "has the field 'text' (fields: content, id)" in error
    assert fix.strip() == "fix: set the pipeline's text_field to the field holding the text: --param text_field=content"
    assert not (tmp_path / "work").exists()


def test_a_parquet_input_without_the_text_column_names_text_column_not_content_column(tmp_path):
    pq.write_table(pa.table({"text": ["some words"] * 3}), tmp_path / "a.parquet")
    p = _cli(tmp_path, "super", "--input", str(tmp_path / "a.parquet"))
    error, fix = _one_error(p)
    assert p.returncode == 6 and "no column 'contents' (columns: text)" in error
    assert "--param text_column=text" in fix and "content_column" not in fix


def test_parameters_are_checked_before_the_input(tmp_path):
    missing = ["--input", str(tmp_path / "missing")]  # were the parameters passed, the input would fail (exit 6)
    p = _cli(tmp_path, "super", "--param", "text_fild=x", *missing)
    assert p.returncode == 2 and "has no parameter text_fild (did you mean text_field?)" in _one_error(p)[0]
    p = _cli(tmp_path, "super", "--param", 'overrides_json={"filtre": {}}', *missing)
    assert p.returncode == 2 and "overrides_json names stage 'filtre'" in _one_error(p)[0]
    p = _cli(tmp_path, "super", "--param", 'overrides_json={"exact_dedup": {"params": {"num_shards": 0}}}', *missing)
    assert p.returncode == 2 and "num_shards=0 must be >= 1" in _one_error(p)[0]
    p = _cli(tmp_path, "filter", *missing)
    error, fix = _one_error(p)
    assert p.returncode == 2 and "filter needs criteria" in error and "params_json" in fix
    assert not (tmp_path / "work").exists()


def test_param_values_lists_and_strings():
    v = param_values(["languages=en,fr", "train_languages=[\"en\"]", "text_field=123", "max_failed_files=2", 'overrides_json={"a": 1}'])
    assert v == {"languages": ["en", "fr"], "train_languages": ["en"], "text_field": "123", "max_failed_files": 2, "overrides_json": {"a": 1}}
    with pytest.raises(ConfigError, match="not NAME=VALUE"):
        param_values(["languages"])
    with pytest.raises(ConfigError) as e:
        pf.check_values(pf.resolve("super"), {"languages": 1})
    assert "--param languages=en,fr" in e.value.fix and "pass languages as a list" in e.value.fix


def test_csv_and_hf_shards_are_checked_from_their_header_and_schema(tmp_path):
    target = pf.resolve("super")
    (tmp_path / "c").mkdir()
    with open(tmp_path / "c" / "a.csv", "w", newline="") as f:
        csv.writer(f).writerows([["id", "body"], ["1", "words here"]])
    with pytest.raises(InputError, match=r"no column 'text' in its header \(id, body\)") as e:
        pf.check_input(target, str(tmp_path / "c"), {})
    assert "--param text_field=body" in e.value.fix
    assert pf.check_input(target, str(tmp_path / "c"), {"text_field": "body"})["input"]["format"] == "csv"
    hf = tmp_path / "hf"
    hf.mkdir()
    table = pa.table({"content": ["a text"], "n": [1]})
    with pa.OSFile(str(hf / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(InputError, match=r"no column 'text' \(columns: content, n\)") as e:
        pf.check_input(target, str(hf), {})
    assert "--param text_field=content" in e.value.fix
    plan = pf.check_input(target, str(hf), {"text_field": "content"})
    ingest = next(x for x in plan["entries"] if x["stage"] == "ingest")
    assert ingest["params"]["text_field"] == "content" and ingest["params"]["text_column"] == "contents"


def test_a_stage_pipeline_names_its_params_json(tmp_path):
    pq.write_table(pa.table({"text": ["some words"] * 3}), tmp_path / "a.parquet")
    with pytest.raises(InputError) as e:
        pf.check_input(pf.resolve("doc_id"), str(tmp_path), {})
    assert "contents" in e.value.message and "params_json" in e.value.fix
    pf.check_input(pf.resolve("doc_id"), str(tmp_path), {"params_json": '{"content_column": "text"}'})
    _jsonl(tmp_path / "j" / "a.jsonl", [{"body": "x"}])
    with pytest.raises(InputError) as e:
        pf.check_input(pf.resolve("ingest"), str(tmp_path / "j"), {})
    assert "params_json={\"text_field\": \"body\"}" in e.value.fix


def test_a_broken_first_file_is_left_to_the_run(tmp_path):
    """The preflight reads the first file only to check a column: a file it cannot read is the run's
    to report by name (and --max-failed-files may tolerate it)."""
    import gzip

    d = tmp_path / "in"
    d.mkdir()
    (d / "a.parquet").write_bytes(b"PAR1 not parquet")
    pf.check_input(pf.resolve("doc_id"), str(d), {})
    pf.check_input(pf.resolve("super"), str(d), {})
    j = tmp_path / "j"
    j.mkdir()
    (j / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n' * 50)[:30])
    pf.check_input(pf.resolve("super"), str(j), {})


def test_the_chained_pipeline_needs_a_kfp_server_before_anything_runs(tmp_path, monkeypatch):
    from prepline.pipeline_cli import preflight

    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="super_chained starts every stage as a run on a Kubeflow Pipelines server") as e:
        preflight("super_chained", {}, None, tmp_path)
    assert "--param kfp_host=" in e.value.fix and "'super' locally" in e.value.fix


def test_the_plan_step_checks_the_text_column_too(tmp_path):
    """A run started in the KFP UI (no preflight on the user's machine) fails in its plan step, before
    any cluster, naming the pipeline's parameter."""
    from prepline.pipelines import spec as specs
    from prepline.pipelines.steps import plan_step

    pq.write_table(pa.table({"text": ["some words"] * 3}), tmp_path / "a.parquet")
    args = dict(input_path=str(tmp_path / "a.parquet"), work_root=str(tmp_path / "w"), run_id="r", languages=["en"],
                input_format="auto", overrides_json="{}", cluster_json="{}")
    with pytest.raises(InputError) as e:
        plan_step(specs.shipped().to_json(), text_column="contents", **args)
    assert "--param text_column=text" in e.value.fix and not (tmp_path / "w").exists()
    path, _ = plan_step(specs.shipped().to_json(), text_column="text", **args)
    assert Path(path).exists()


ROOT = Path(__file__).resolve().parents[2]


def test_a_compiled_pipeline_file_is_the_pipeline_it_was_compiled_from():
    """`prepline pipeline run compiled/pipelines/NAME.yaml` runs the YAML users upload: the preflight
    knows which pipeline it is (a stage's by its name, a spec's by its plan step) and checks it the same."""
    stage = pf.resolve(str(ROOT / "compiled" / "pipelines" / "exact_dedup.yaml"))
    assert (stage.name, stage.kind) == ("exact_dedup", "stage") and stage.compiled.endswith("exact_dedup.yaml")
    sup = pf.resolve(str(ROOT / "compiled" / "pipelines" / "super.yaml"))
    assert (sup.name, sup.kind) == ("super", "spec") and sup.spec.name == "super"
    chained = pf.resolve(str(ROOT / "compiled" / "pipelines" / "super_chained.yaml"))
    assert chained.kind == "chained"
    with pytest.raises(ConfigError) as e:
        pf.check_values(sup, {"no_such_param": 1})
    assert "no_such_param" in e.value.message
    # a compiled component is not a pipeline of prepline's
    with pytest.raises(ConfigError) as e:
        pf.resolve(str(ROOT / "compiled" / "components" / "fine_tune.yaml"))
    assert "not one of prepline's" in e.value.message and "kfp run" in e.value.fix


def test_a_compiled_pipeline_file_runs_locally_unchanged(tmp_path):
    """The compiled doc_id pipeline under kfp's local runner, from the file: the same output as the
    pipeline run by name (the compiled file is the code's, compiled: tests/pipelines/test_compiled.py)."""
    outs = {}
    for how, name in (("file", str(ROOT / "compiled" / "pipelines" / "doc_id.yaml")), ("name", "doc_id")):
        work = tmp_path / how
        p = subprocess.run([sys.executable, "-m", "prepline.cli", "pipeline", "run", name, "--local", "--work-root", str(work),
                            "--sample-docs", "200", "--param", "run_id=same"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        outs[how] = {str(f.relative_to(work / "stages")): f.read_bytes() for f in sorted((work / "stages").rglob("*.parquet"))}
    assert outs["file"] and outs["file"] == outs["name"]
