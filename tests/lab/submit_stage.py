"""Run one stage on a lab Ray cluster as the execute step does: the job's command from
prepline.stages.entrypoint, submitted to the head's job API (RayJobClient), its log followed, then
the output checked (prepline.stages.check_output). Runs on the lab's launcher host.

usage: python submit_stage.py DASHBOARD_URL TRANSFORM INPUT OUTPUT WORKERS [PARAMS_JSON]
LAB_JOB_ENV (a JSON object), when set, is the job's runtime_env env_vars (e.g. a shorter S3 retry budget).
Prints one JSON line at the end: {"submission_id", "status", "message", "meta"}.
"""

import json
import os
import sys

from prepline.clusters.ray_jobs import RayJobClient
from prepline.errors import PreplineError
from prepline.stages import check_output, entrypoint


def main() -> int:
    url, transform, src, dst, workers = sys.argv[1:6]
    params = sys.argv[6] if len(sys.argv) > 6 else "{}"
    jobs = RayJobClient(url)
    cmd = entrypoint(transform, params, src, dst, int(workers), 0)
    env = json.loads(os.environ.get("LAB_JOB_ENV") or "{}")
    sid = jobs.submit(cmd, runtime_env={"env_vars": env} if env else None)
    print(f"submitted {sid}: {cmd}", file=sys.stderr, flush=True)
    info = jobs.follow(sid, sys.stderr, timeout=900)
    result = {"submission_id": sid, "status": info.status, "message": info.message, "meta": None}
    if info.status == "SUCCEEDED":
        try:
            result["meta"] = check_output(dst, 0, transform)
        except PreplineError as e:
            result["status"], result["message"] = "CHECK_FAILED", f"{e.message} / {e.fix}"
    print(json.dumps(result, default=str), flush=True)
    return 0 if result["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
