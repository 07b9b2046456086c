"""The fine-tune's data loading from S3: the share of step time spent waiting for batches, epoch 1
against epoch 2, with the node cache and without (``scripts/bench.py --train-loading``).

The token data is a real tokenization output (the sample, tokenized by the stage), stored on a local
S3 server (moto) reached through a proxy that delays every request by ``--latency-ms`` (a remote
object store's first-byte time; the machine's own moto answers in about a millisecond). One training
run of two epochs per mode, the same seed and model; ``data_wait_s`` of each step (metrics.jsonl)
summed per epoch over the steps' seconds.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' moto starter, as scripts/faults.py uses it

from conftest import _free_port, start_moto  # noqa: E402


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 that holds each chunk the client sends for ``latency`` seconds before
    passing it on (a request is one chunk: each request pays the latency once)."""

    def __init__(self, target_port: int, latency: float):
        self.target, self.latency, self.port = target_port, latency, _free_port()
        self.requests = 0  # chunks sent upstream: a small request (a GET, a LIST) is one
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)

    async def _serve(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader, writer) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def pipe(src, dst, upstream: bool) -> None:
            try:
                while data := await src.read(65536):
                    if upstream:
                        self.requests += 1
                        if self.latency:  # read each time: a caller may change it between phases
                            await asyncio.sleep(self.latency)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))


def _shares(lines: list[dict], steps_per_epoch: int) -> list[dict]:
    out = []
    for e in range(2):
        recs = lines[e * steps_per_epoch:(e + 1) * steps_per_epoch]
        wait, secs = sum(r["data_wait_s"] for r in recs), sum(r["seconds"] for r in recs)
        out.append({"epoch": e + 1, "steps": len(recs), "data_wait_s": round(wait, 3), "step_s": round(secs, 3),
                    "share": round(wait / secs, 4) if secs else None})
    return out


def run(latency_ms: float = 30.0, docs: int = 400, block_mb: float = 0.03125, log=print) -> dict:
    from prepline.data_access import open_location, s3_client
    from prepline.engine import RunOptions, run_transform
    from prepline.sample import build_sample
    from prepline.train import train

    work = Path(tempfile.mkdtemp(prefix="prepline-train-loading-"))
    proc, endpoint = start_moto()
    proxy = LatencyProxy(int(endpoint.rsplit(":", 1)[1]), latency_ms / 1000)
    env = {"PREPLINE_S3_ENDPOINT": f"http://127.0.0.1:{proxy.port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "PREPLINE_TOKEN_BLOCK_MB": str(block_mb),
           # two blocks in memory: the token data (a few hundred kB here) must not fit, as a real corpus would not
           "PREPLINE_TOKEN_RECENT_MB": str(2 * block_mb)}
    try:
        with mock.patch.dict(os.environ, env):  # restored on the way out, the cache settings of the loop too
            build_sample(str(work / "sample"), docs=docs, files=2)
            run_transform("tokenization", {"vocab_size": 512, "tokens_column": ""},
                          RunOptions(input=str(work / "sample"), output=str(work / "tok"), workers=1, progress=False))
            s3_client().create_bucket(Bucket="bench")
            dst = open_location("s3://bench/tok")
            for p in (work / "tok" / "tokens").rglob("*"):
                if p.is_file():
                    dst.write_bytes(f"tokens/{p.relative_to(work / 'tok' / 'tokens').as_posix()}", p.read_bytes())
            index = json.loads((work / "tok" / "tokens" / "index.json").read_text())
            seq, batch = 128, 16
            windows = (index["num_tokens"] - 1) // seq
            per_epoch = windows // batch
            cfg = {"threads": 1, "model_dim": 64, "batch_size": batch, "lr": 0.01, "warmup_steps": 5, "log_every": 1000,
                   "seq_len": seq, "steps": 2 * per_epoch, "checkpoint_every": 0}
            rows = []
            for mode, gb in (("node cache", "20"), ("no cache", "0")):
                os.environ["PREPLINE_TOKEN_CACHE"] = str(work / f"cache-{gb}")
                os.environ["PREPLINE_TOKEN_CACHE_GB"] = gb
                out = work / f"ft-{gb}"
                t0 = time.perf_counter()
                s = train([dst.uri], str(out), cfg, out=io.StringIO())
                lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
                row = {"mode": mode, "seconds": round(time.perf_counter() - t0, 2), "epochs": _shares(lines, per_epoch),
                       "reads": s["data_reads"], "final_loss": s["final_loss"]}
                rows.append(row)
                log(f"[train-loading] {mode:10s} epoch 1 waits {row['epochs'][0]['share']:.1%} of step time, epoch 2 "
                    f"{row['epochs'][1]['share']:.1%}; {s['data_reads']['gets']} GETs, cache hits {s['data_reads']['cache_hits']}")
            return {"latency_ms": latency_ms, "block_mb": block_mb, "tokens": index["num_tokens"], "bin_mb": round(index["num_tokens"] * 2 / 2**20, 2),
                    "windows": windows, "steps_per_epoch": per_epoch, "rows": rows}
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def table(res: dict) -> str:
    lines = [f"train loading from S3 ({res['latency_ms']:g} ms per request, {res['block_mb']:g} MiB blocks, "
             f"{res['tokens']:,} tokens, {res['steps_per_epoch']} steps per epoch)",
             "| mode | epoch 1 data wait / step time | epoch 2 | GETs | cache hits | seconds |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        e1, e2 = r["epochs"]
        lines.append(f"| {r['mode']} | {e1['share']:.1%} ({e1['data_wait_s']:.2f} of {e1['step_s']:.2f} s) | "
                     f"{e2['share']:.1%} ({e2['data_wait_s']:.2f} of {e2['step_s']:.2f} s) | {r['reads']['gets']} | "
                     f"{r['reads']['cache_hits']} | {r['seconds']} |")
    return "\n".join(lines)
