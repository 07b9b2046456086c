"""``prepline run`` starts the pool's processes as it begins: forked while the driver has one thread,
taken by the run's executor, stopped when the run never needs them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import make_corpus, tree_bytes
from prepline.engine import RunOptions, run_transform

SCRIPT = textwrap.dedent("""
    import json, multiprocessing as mp, sys, threading
    from prepline import cli
    from prepline.runtime import local, procs

    taken = []
    original = procs.take_prestarted
    def spy(size):
        got = original(size)
        if got is not None:
            taken.append(got[0]._mp_context.get_start_method())
        return got
    local.take_prestarted = spy

    src, out = sys.argv[1], sys.argv[2]
    codes = [cli.main(["run", "doc_id", "--input", src, "--output", out, "--workers", "2", "--no-progress"]) for _ in range(2)]
    import time
    deadline = time.time() + 30  # killed processes are gone a moment later (a loaded machine schedules them late)
    while mp.active_children() and time.time() < deadline:
        time.sleep(0.05)
    print(json.dumps({"codes": codes, "taken": taken, "left": procs._early is not None,
                      "children": [p.pid for p in mp.active_children()]}))
""")


def test_the_run_takes_the_forked_pool_and_a_resumed_run_leaves_no_process(tmp_path):
    src = make_corpus(tmp_path / "in", files=6)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(src), str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # the first run took the prestarted pool (forked: the driver had one thread); the second found
    # the output complete (resumed), never used its prestarted processes, and they were stopped
    assert got["codes"] == [0, 0] and got["taken"] == ["fork"]
    assert not got["left"] and got["children"] == []
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_a_driver_with_threads_prestarts_by_spawning(tmp_path):
    script = textwrap.dedent("""
        import threading, time
        from prepline.runtime import procs
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        procs.prestart(2, "doc_id")
        method = procs._early[0]._mp_context.get_start_method()
        procs.drop_prestarted()
        print(method, procs._early)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["spawn", "None"]


SPY = textwrap.dedent("""
    import json, multiprocessing as mp, sys
    from prepline import cli
    from prepline.runtime import procs

    started = []
    original = procs.new_pool
    def spy(size, *a, **k):
        started.append(size)
        return original(size, *a, **k)
    procs.new_pool = spy
    code = cli.main(["run", *sys.argv[1:]])
    import time
    deadline = time.time() + 30
    while mp.active_children() and time.time() < deadline:
        time.sleep(0.05)
    print(json.dumps({"code": code, "started": started, "children": [p.pid for p in mp.active_children()]}))
""")


def _spy_run(*args: str, env: dict | None = None, transform: str = "doc_id") -> tuple[dict, str]:
    import os

    r = subprocess.run([sys.executable, "-c", SPY, transform, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_workers_are_bounded_by_cpus_and_checked_with_the_input_before_any_process_starts(tmp_path):
    """Issue 30 finding 7: `--workers 100` on a missing input started 101 processes before "does not exist"."""
    from prepline.runtime.options import MAX_WORKERS_PER_CPU, usable_cpus

    cpus = usable_cpus()
    missing, out = str(tmp_path / "missing"), str(tmp_path / "out")
    # more workers than CPUs: a usage error naming the bound and the override, and no process
    got, err = _spy_run("--input", missing, "--output", out, "--workers", "100")
    assert got == {"code": 2, "started": [], "children": []}, err
    assert f"more than the {cpus} CPU(s)" in err and "fix:" in err and "--workers-over-cpus" in err
    # the override raises the bound to MAX_WORKERS_PER_CPU per CPU, no further
    got, err = _spy_run("--input", missing, "--output", out, "--workers", str(cpus * MAX_WORKERS_PER_CPU + 1), "--workers-over-cpus")
    assert got == {"code": 2, "started": [], "children": []}, err
    # within the bound but the input is missing: the input error, and still no process started
    got, err = _spy_run("--input", missing, "--output", out, "--workers", "2", "--workers-over-cpus")
    assert got == {"code": 6, "started": [], "children": []}, err
    assert "does not exist" in err
    # the environment variable is the same override
    got, err = _spy_run("--input", missing, "--output", out, "--workers", str(cpus + 1), env={"PREPLINE_WORKERS_OVER_CPUS": "1"})
    assert got["code"] == 6 and got["started"] == [], err
    # an unknown transform: the usage error, and no process either
    got, err = _spy_run("--input", str(tmp_path), "--output", out, "--workers", "2", "--workers-over-cpus", transform="nope")
    assert got == {"code": 2, "started": [], "children": []}, err
    # a good command still prestarts its pool (the run takes it)
    src = make_corpus(tmp_path / "in", files=3)
    got, err = _spy_run("--input", str(src), "--output", out, "--workers", "2", "--workers-over-cpus", "--no-progress")
    assert got["code"] == 0 and got["started"] == [1] and got["children"] == [], err


def test_an_early_process_warms_the_transforms_compiled_passes():
    """A pool process started early runs the transform's warm-up while the driver plans: for
    quality_classifier its compiled pass is loaded (numba's dispatcher has its signature) before any
    task; a transform without a warm-up gets the base class's, which does nothing."""
    import subprocess
    import sys

    code = ("from prepline.runtime import procs; import sys; "
            "procs._warm('quality_classifier'); from prepline import fasttext_np; "
            "print(len(fasttext_np._sums.signatures)); procs._warm('doc_id'); procs._warm('no_such_stage')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 1, out.stdout
