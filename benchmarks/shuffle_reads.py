"""A dedup shuffle's reads from S3: one shard task reading its batch of every partitioned file, one
file at a time against PARTITION_READERS at once, in today's format (a tail index: the tail, then
the batch) and in Arrow's file format that came before it (``scripts/bench.py --shuffle-reads``).

The files are real partitioned files (``prepline.sharded.write_partitioned``: a producer's rows by
shard, as exact_dedup's hash phase writes them; the old format written here as it was) on a local
S3 server (moto) behind the loading benchmark's proxy, which delays every request by
``--latency-ms`` (a remote object store's first-byte time) and counts them. The same shard is read
with each setting, and the rows must be equal.
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


def run(latency_ms: float = 30.0, producers: int = 200, shards: int = 16, rows: int = 65_536, log=print) -> dict:
    """``rows`` per producer: 65,536, one row group of the plan's input files (a map task's batch at scale)."""
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
            proxy.latency = 0.0  # the files are written without the latency: only the reads are timed
            t0 = time.perf_counter()
            for p in range(producers):  # (key, id) rows as exact_dedup's hash phase sends them
                keys = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
                t = pa.table({"l": pa.array(keys), "id": pa.array(np.arange(rows, dtype=np.int64) + p * rows)})
                sharded.write_partitioned(loc, f"tail/f{p:05d}/000000.arrow", t, sharded.shard_of_keys(keys, shards))
                _write_arrow_file_format(loc, f"ipcfile/f{p:05d}/000000.arrow", t, sharded.shard_of_keys(keys, shards))
            log(f"[shuffle-reads] {producers} partitioned files of {rows:,} rows written in each format in {time.perf_counter() - t0:.1f}s")
            out, want = [], None
            proxy.latency = latency_ms / 1000
            for fmt, prefix in (("Arrow file format (before)", "ipcfile"), ("tail index", "tail")):
                for readers in (1, sharded.PARTITION_READERS):
                    with mock.patch.object(sharded, "PARTITION_READERS", readers):
                        proxy.requests = 0
                        t0 = time.perf_counter()
                        got = sharded.read_partition(loc, prefix, 3)
                        secs = time.perf_counter() - t0
                    want = got if want is None else want
                    assert got.equals(want), "the shard's rows differ between the settings"
                    out.append({"format": fmt, "readers": readers, "seconds": round(secs, 2), "rows": got.num_rows,
                                "requests": proxy.requests})
                    log(f"[shuffle-reads] {fmt}, {readers:>2} at once: {secs:.2f}s, {proxy.requests:,} requests for shard 3 of "
                        f"{shards} ({got.num_rows:,} rows)")
            return {"latency_ms": latency_ms, "producers": producers, "shards": shards, "rows": out}
    finally:
        proc.terminate()
        proc.wait(30)


def _write_arrow_file_format(loc, rel: str, table, shard) -> None:
    """A partitioned file as prepline wrote it before the tail index: Arrow's IPC file format, the
    shard -> batch index in the schema metadata (``sharded`` still reads these, for resumed runs)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    order = np.argsort(shard, kind="stable")
    present = np.unique(shard)
    schema = table.schema.with_metadata({b"prepline.shards": json.dumps({str(int(s)): i for i, s in enumerate(present)}).encode()})
    with loc.open_output(rel) as f, ipc.new_file(f, schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
        for s in present:
            w.write_table(table.take(pa.array(order[shard[order] == s])).replace_schema_metadata(schema.metadata))


def table(res: dict) -> str:
    base = res["rows"][0]["seconds"]
    lines = [f"\none shard task's reads of {res['producers']} partitioned files on S3 with {res['latency_ms']:.0f} ms a request",
             "| format | files read at once | seconds | per file ms | requests per file | speed-up |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['format']} | {r['readers']} | {r['seconds']:.2f} | {r['seconds'] / res['producers'] * 1000:.1f} | "
                     f"{r['requests'] / res['producers']:.2f} | {base / r['seconds']:.1f}× |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run()))
