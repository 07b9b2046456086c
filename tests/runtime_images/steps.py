"""The entry points of every step, per image and mode, run for real by test_image_contents.py in a
subprocess (against the fakes whose URLs it is given). Each imports only what its step imports in
its container: the component body (as kfp's executor calls it) or the module its command runs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path


def _meta(folder: Path) -> None:
    """The metadata.json a finished Ray job leaves (the fake head runs no transform)."""
    folder.mkdir(parents=True, exist_ok=True)
    totals = {"docs_in": 2, "docs_out": 2, "removed": {}, "files": 1, "files_failed": 0, "seconds": 0.1, "bytes_in": 1, "bytes_out": 1}
    (folder / "metadata.json").write_text(json.dumps({"status": "success", "totals": totals}))


def required_params(folder: str) -> dict[str, dict]:
    """The parameters transforms cannot run without (filter's criteria, decontaminate's evaluation
    sets, quality_classifier's and synthesize's models), as a user passes them. The launcher steps only validate them:
    the (fake) Ray head runs no transform, so the model is named, never loaded."""
    evals = Path(folder) / "evals.jsonl"
    evals.parent.mkdir(parents=True, exist_ok=True)
    evals.write_text(json.dumps({"question": "what is the capital of France?"}) + "\n")
    return {"filter": {"criteria": ["length(contents) > 0"]}, "decontaminate": {"eval_sets": [f"mmlu={evals}:question"]},
            "quality_classifier": {"model_path": str(Path(folder) / "quality_model")},
            "synthesize": {"model_path": str(Path(folder) / "lm")}}


def stage_kuberay(a: dict) -> None:
    """prepare_args (every transform), start_ray_cluster, execute_ray_job, stop_ray_cluster on KubeRay."""
    import kfp.dsl.executor_main  # noqa: F401 - the components' container command

    from prepline import registry
    from prepline.components.ray_stage import execute_ray_job, prepare_args, start_ray_cluster, stop_ray_cluster

    need = required_params(a["work"])
    for t in registry.names():
        prepared = prepare_args.python_func(transform=t, params_json=json.dumps(need.get(t, {})), overrides_json="{}", work_root=a["work"],
                                            run_id="r", stage=t, branch="", input_path="/in", input_stage="", input_from_split=False,
                                            cluster_json="{}")
        assert prepared != "skip", t
    prepared = prepare_args.python_func(transform="doc_id", params_json="{}", overrides_json="{}", work_root=a["work"], run_id="r",
                                        stage="doc_id", branch="", input_path="/in", input_stage="", input_from_split=False, cluster_json="{}")
    where = dict(provider="kuberay", provider_json=json.dumps(a["provider"]))
    start_ray_cluster.python_func(prepared=prepared, **where, timeout_seconds=60, ray_image="img", s3_secret_name="prepline-s3")
    _meta(Path(json.loads(prepared)["output_path"]))

    class Art:
        path = str(Path(a["work"]) / "summary.md")

        def log_metric(self, *x):
            pass

    execute_ray_job.python_func(prepared=prepared, **where, max_failed_files=0, timeout_seconds=60, summary=Art(), metrics=Art())
    stop_ray_cluster.python_func(**where, cluster_json="{}", overrides_json="{}", run_id="r", stage="doc_id", branch="")


def elyra_stage(a: dict) -> None:
    """The Elyra catalog's one-step stage: python -m prepline.elyra run ... (provider kuberay)."""
    from prepline.elyra import _cli

    _meta(Path(a["work"]) / "r" / "doc_id")
    rc = _cli(["run", "doc_id", "--input-path", "/in", "--work-root", a["work"], "--run-id", "r", "--provider", "kuberay",
               "--provider-json", json.dumps(a["provider"]), "--s3-credentials", a["creds"]])
    assert rc == 0, rc


def run_pipeline(a: dict) -> None:
    """The chained pipeline's step: start an uploaded pipeline as a child run and wait."""
    import kfp.dsl.executor_main  # noqa: F401

    from prepline.components.run_pipeline import run_pipeline as rp

    rp.python_func(pipeline_name="doc_id", parameters={"input_path": "/i", "work_root": "/w"}, host=a["kfp"], poll_seconds=0)


def run_report(a: dict) -> None:
    """The super pipeline's last step: the run's HTML report from the stages' metadata.json."""
    import kfp.dsl.executor_main  # noqa: F401

    from prepline.components.pipeline_steps import run_report as rr

    _meta(Path(a["work"]) / "r" / "doc_id")

    class Html:
        path = str(Path(a["work"]) / "report-artifact.html")

    rr.python_func(work_root=a["work"], run_id="r", report=Html())
    assert "chart-funnel" in Path(Html.path).read_text()


def fine_tune(a: dict) -> None:
    """fine_tune in mode local (trains in the step: `python -m prepline.train`) or cluster (a TrainJob)."""
    import kfp.dsl.executor_main  # noqa: F401

    from prepline.train.step import fine_tune as ft

    trainjob = {"kubeconfig": a.get("kubeconfig", ""), "poll_seconds": 0.05}
    ft(a["mode"], a["work"], "r", ["en"], [], json.dumps({"steps": 2, "batch_size": 2, "model_dim": 16, "threads": 1}),
       json.dumps(trainjob), "prepline-s3", 600, out=io.StringIO(), image="img")


def batch(a: dict) -> None:
    """Run containers' commands one after another in this one process, as each container would run
    its own (tests/runtime_images/generated.py makes them from compiled/ and elyra_templates/):
    ``python -m <module> ...`` through runpy, a KFP component's ``sh -ec <script> <source> ...``
    as its script does (the source into ephemeral_component.py, then kfp.dsl.executor_main). One
    process per image: a module the image lacks stays hidden for every command. Writes each
    command's outcome (exit code, exception, stderr tail) to a["results"]."""
    import contextlib
    import os
    import runpy
    import tempfile
    import traceback

    from generated import KFP_ENTRY

    os.environ["_KFP_RUNTIME"] = "true"  # what the KFP script sets
    results = []
    for c in a["commands"]:
        argv = c["argv"]
        if argv[:2] == ["sh", "-ec"]:
            assert KFP_ENTRY in argv[2], argv[2]
            folder = tempfile.mkdtemp(dir=a["tmp"])
            Path(folder, "ephemeral_component.py").write_text(argv[3])
            module, sys.argv = "kfp.dsl.executor_main", ["executor_main", "--component_module_path",
                                                        str(Path(folder, "ephemeral_component.py")), *argv[4:]]
        else:
            assert argv[1] == "-m", argv
            module, sys.argv = argv[2], [argv[2], *argv[3:]]
        err, code, exc = io.StringIO(), 0, ""
        try:
            with contextlib.redirect_stderr(err):
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - reported to the test, which decides
            code, exc = 1, f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e))[-3000:]
        results.append({"name": c["name"], "code": code, "exception": exc, "stderr": err.getvalue()[-3000:]})
        sys.stdout.flush()
    Path(a["results"]).write_text(json.dumps(results))


if __name__ == "__main__":
    globals()[sys.argv[1]](json.loads(sys.argv[2]))
