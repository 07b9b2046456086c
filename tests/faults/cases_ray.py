"""Ray faults: an actor killed in exact_dedup's reduce phase (finding 2), with and without retries, and
nodes lost on a real multi-node Ray (Ray's own ``ray.cluster_utils.Cluster``: a head and two raylets
on this machine), one mid-stage (the stage finishes on the other) and then all of them (a clear error)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import descends_from
from faults.harness import ROOT, Env, Row, account, case, markers, meta, wait_for

RAY = ("ray",)
PARAMS = {"num_shards": 64}


def _kill_actor_in(out: Path, phase: str, stop: threading.Event, killed: list) -> None:
    """SIGKILL one prepline Ray actor once ``phase`` has finished 2 tasks (so it dies mid-phase)."""
    if not wait_for(lambda: markers(out, phase) >= 2 or stop.is_set(), 120, 0.002) or stop.is_set():
        return
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "cmdline").read_bytes().startswith(b"ray::_RayWorker") and descends_from(int(d.name), os.getpid()):
                os.kill(int(d.name), signal.SIGKILL)
                killed.append(int(d.name))
                return
        except OSError:
            continue


def _ray_run(env: Env, out: Path, **opts):
    from prepline.engine import RunOptions, run_transform

    env.ray()
    stop, killed = threading.Event(), []
    t = threading.Thread(target=_kill_actor_in, args=(out, "reduce", stop, killed), daemon=True)
    t.start()
    t0 = time.perf_counter()
    try:
        return run_transform("exact_dedup", PARAMS, RunOptions(str(env.corpus), str(out), runtime="ray", workers=2, progress=False,
                                                               **opts)), killed, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the case looks at it
        return e, killed, time.perf_counter() - t0
    finally:
        stop.set()
        t.join(5)


@case("ray_actor_killed_reduce", "a Ray actor SIGKILLed in exact_dedup's reduce phase, --max-failed-files 1 (finding 2)",
      "the shard runs again on a new actor; success, 0 files failed, byte-identical (no duplicate kept)", RAY)
def ray_actor_killed_reduce(env: Env, row: Row) -> Row:
    ref, out = env.reference("exact_dedup", PARAMS), env.path("raykill")
    res, killed, secs = _ray_run(env, out, max_failed_files=1)
    row.check(bool(killed), "no actor was seen to kill")
    row.check(not isinstance(res, Exception), f"failed: {res}")
    if not isinstance(res, Exception):
        m = res.metadata
        row.check(m["phases"]["reduce"]["retried"] >= 1 and not m["failures"], f"reduce: {m['phases']['reduce']}, failures {list(m['failures'])}")
        account(row, out, ref)
    row.seconds = secs
    return row.done("shard retried on a new actor; success, identical")


@case("ray_actor_lost_no_retries", "the same kill with --task-retries 0 and --max-failed-files 1, then the command again",
      "the shard is never tolerated: RunFailed (exit 1), metadata.json error kind worker_lost, 0 files failed; rerun identical", RAY)
def ray_actor_lost_no_retries(env: Env, row: Row) -> Row:
    from prepline.engine import RunOptions, run_transform
    from prepline.errors import RunFailed, exit_code

    ref, out = env.reference("exact_dedup", PARAMS), env.path("raykill0")
    res, killed, secs = _ray_run(env, out, max_failed_files=1, task_retries=0)
    row.check(bool(killed), "no actor was seen to kill")
    row.check(isinstance(res, RunFailed) and exit_code(res) == 1 and "lost" in str(res), f"got {res!r}")
    m = meta(out)
    row.check(m["status"] == "failed" and m.get("error", {}).get("kind") == "worker_lost" and not m["failures"], f"metadata: {m.get('error')}")
    run_transform("exact_dedup", PARAMS, RunOptions(str(env.corpus), str(out), runtime="ray", workers=2, progress=False))
    account(row, out, ref)
    row.seconds = secs
    return row.done(f"RunFailed: {str(res).splitlines()[0][:70]}...; rerun identical")


# -- node loss on a multi-node Ray -----------------------------------------------------------------
def node_loss_main(src: str, work: str) -> dict:
    """In a fresh process: a Ray of a CPU-less head and two 1-CPU raylets. Run 1: kill one raylet once the
    stage's first file is hashed. Run 2: kill the other (none left): a clear error within PREPLINE_RAY_WORKER_WAIT;
    then a node comes back and the same run is done again."""
    import ray
    from ray.cluster_utils import Cluster

    from prepline.engine import RunOptions, run_transform

    fast = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3,
            "health_check_timeout_ms": 500}
    mem = 80 * 1024 * 1024
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                                                      "_system_config": fast, "object_store_memory": mem})
    nodes = [c.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=mem) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    report: dict = {}
    try:
        def kill_mid_stage(out: str, node, key: str) -> None:
            # once the stage's first file is hashed and the node's actor runs a task (killed late in the reduce
            # phase, whose shards take milliseconds, or before its actor started, the node had nothing to lose).
            # A lost node loses its workers too: remove_node kills the raylet only (ray/cluster_utils.py), and an
            # actor whose raylet is gone can still finish its task; so its workers are killed first.
            raylet = node.all_processes["raylet"][0].process.pid

            def under() -> list[int]:
                return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and descends_from(int(d.name), raylet)]

            def busy() -> bool:
                for pid in under():
                    try:
                        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_RayWorker.run"):
                            return True
                    except OSError:
                        pass
                return False

            if wait_for(lambda: markers(Path(out), "hash") >= 1 and busy(), 180, 0.002):
                report[key] = time.perf_counter()
                workers = under()
                for pid in workers:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                c.remove_node(node, allow_graceful=False)
                report[key + "_workers_killed"] = len(workers)

        opts = dict(runtime="ray", workers=2, progress=False, ray_address=c.address)
        out1 = f"{work}/one-node-lost"
        threading.Thread(target=kill_mid_stage, args=(out1, nodes[0], "t1"), daemon=True).start()
        m = run_transform("exact_dedup", PARAMS, RunOptions(src, out1, **opts)).metadata
        report["run1"] = {"status": m["status"], "retried": sum(ph.get("retried", 0) for ph in m["phases"].values()),
                          "s": time.perf_counter() - report["t1"]}
        out2 = f"{work}/all-nodes-lost"
        threading.Thread(target=kill_mid_stage, args=(out2, nodes[1], "t2"), daemon=True).start()
        try:
            run_transform("exact_dedup", PARAMS, RunOptions(src, out2, **opts))
            report["run2"] = {"status": "success?!"}
        except Exception as e:  # noqa: BLE001
            from prepline.errors import exit_code, user_message

            report["run2"] = {"error": user_message(e), "exit": exit_code(e), "s": time.perf_counter() - report["t2"]}
        c.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=mem)
        c.wait_for_nodes()
        m = run_transform("exact_dedup", PARAMS, RunOptions(src, out2, **opts)).metadata
        report["rerun2"] = {"status": m["status"]}
    finally:
        ray.shutdown()
        c.shutdown()
    return report


@case("ray_node_lost", "multi-node Ray (head + 2 raylets): one node killed mid-stage (after its first file); then the last one; "
      "then a node back",
      "the stage finishes on the other node, byte-identical; with no node left: exit 1 'every Ray worker was lost' within "
      "PREPLINE_RAY_WORKER_WAIT (10 s here); once a node is back the rerun is identical", RAY)
def ray_node_lost(env: Env, row: Row) -> Row:
    ref, work = env.reference("exact_dedup", PARAMS), env.path("nodes")
    work.mkdir()
    code = ("import json, sys; sys.path.insert(0, 'tests'); from faults.cases_ray import node_loss_main; "
            f"print('REPORT ' + json.dumps(node_loss_main({str(env.corpus)!r}, {str(work)!r})))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=400,
                       env={**env.env(), "PREPLINE_RAY_WORKER_WAIT": "10"})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("REPORT ")]
    row.check(p.returncode == 0 and lines, f"exit {p.returncode}: {p.stderr[-1500:]}")
    if not lines:
        return row.done("the multi-node run did not report")
    rep = json.loads(lines[-1][len("REPORT "):])
    r1, r2 = rep.get("run1", {}), rep.get("run2", {})
    row.check(rep.get("t1_workers_killed", 0) >= 1, f"the lost node had no worker to lose: {rep}")
    row.check(r1.get("status") == "success" and r1.get("retried", 0) >= 1, f"run 1: {r1}")
    row.check(r2.get("exit") == 1 and "every Ray worker was lost" in r2.get("error", "") and "fix:" in r2.get("error", ""), f"run 2: {r2}")
    row.check(r2.get("s", 99) <= 10 + 15, f"run 2 took {r2.get('s')}s to fail")
    row.check(rep.get("rerun2", {}).get("status") == "success", f"rerun: {rep.get('rerun2')}")
    account(row, work / "one-node-lost", ref)
    lost2 = Row("", "")
    account(lost2, work / "all-nodes-lost", ref)
    row.lost, row.duplicated = (row.lost or 0) + (lost2.lost or 0), (row.duplicated or 0) + (lost2.duplicated or 0)
    row.problems += lost2.problems
    row.seconds = r1.get("s", 0)
    return row.done(f"node lost: task retried, success {r1.get('s', 0):.1f}s after the kill, identical; no node left: exit 1 "
                    f"after {r2.get('s', 0):.0f}s; node back: rerun identical")
