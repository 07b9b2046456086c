"""A dedup shuffle's reads from S3: one shard task reading its batch of every partitioned file, one
file at a time against PARTITION_READERS at once (``scripts/bench.py --shuffle-reads``).

The files are real partitioned files (``prepline.sharded.write_partitioned``: a producer's rows by
shard, as exact_dedup's hash phase writes them) on a local S3 server (moto) behind the loading
benchmark's proxy, which delays every request by ``--latency-ms`` (a remote object store's
first-byte time). The same shard is read with each setting, and the rows must be equal.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from train_loading import LatencyProxy, start_moto  # noqa: E402


def run(latency_ms: float = 30.0, producers: int = 200, shards: int = 16, rows: int = 4000, log=print) -> dict:
    import numpy as np
    import pyarrow as pa

    from prepline import sharded
    from prepline.data_access import open_location, s3_client

    proc, endpoint = start_moto()
    proxy = LatencyProxy(int(endpoint.rsplit(":", 1)[1]), latency_ms / 1000)
    env = {"PREPLINE_S3_ENDPOINT": f"http://127.0.0.1:{proxy.port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        with mock.patch.dict(os.environ, env):
            s3_client().create_bucket(Bucket="bench")
            loc = open_location("s3://bench/work")
            rng = np.random.default_rng(7)
            t0 = time.perf_counter()
            for p in range(producers):  # (key, id) rows as exact_dedup's hash phase sends them
                keys = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
                t = pa.table({"l": pa.array(keys), "id": pa.array(np.arange(rows, dtype=np.int64) + p * rows)})
                sharded.write_partitioned(loc, f"distinct/f{p:05d}/000000.arrow", t, sharded.shard_of_keys(keys, shards))
            log(f"[shuffle-reads] {producers} partitioned files of {rows:,} rows written in {time.perf_counter() - t0:.1f}s")
            out, want = [], None
            for readers in (1, sharded.PARTITION_READERS):
                with mock.patch.object(sharded, "PARTITION_READERS", readers):
                    t0 = time.perf_counter()
                    got = sharded.read_partition(loc, "distinct", 3)
                    secs = time.perf_counter() - t0
                want = got if want is None else want
                assert got.equals(want), "the shard's rows differ between the two settings"
                out.append({"readers": readers, "seconds": round(secs, 2), "rows": got.num_rows})
                log(f"[shuffle-reads] {readers:>2} at once: {secs:.2f}s for shard 3 of {shards} ({got.num_rows:,} rows)")
            return {"latency_ms": latency_ms, "producers": producers, "shards": shards, "rows": out}
    finally:
        proc.terminate()
        proc.wait(30)


def table(res: dict) -> str:
    base = res["rows"][0]["seconds"]
    lines = [f"\none shard task's reads of {res['producers']} partitioned files on S3 with {res['latency_ms']:.0f} ms a request",
             "| files read at once | seconds | per file ms | speed-up |", "|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['readers']} | {r['seconds']:.2f} | {r['seconds'] / res['producers'] * 1000:.1f} | {base / r['seconds']:.1f}× |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run()))
