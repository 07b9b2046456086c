"""What every fault case shares: the corpus, reference outputs, the CLI as a user runs it, the
document accounting (lost / duplicated against an uninterrupted run) and the table row.

A case injects one fault, runs prepline as a user would (``python -m prepline.cli ...`` in its own
process, unless the fault needs the driver's process), then checks the outcome: the expected exit
code, ``error:`` and ``fix:`` and no traceback, what ``metadata.json`` says, and the documents
(multisets of ``doc_id`` against an uninterrupted run's output, and byte-identical files after
the rerun that recovers).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
#: the S3 cases that recover run with prepline's default retry budget (docs/storage.md: retries for up to
#: PREPLINE_S3_RETRY_SECONDS = 60 s per request). Only the cases whose fault outlasts any budget (a store
#: gone, frozen, a dead port) shorten it, so that their clear error comes in seconds, not minutes:
S3_SHORT_BUDGET = {"PREPLINE_S3_CONNECT_TIMEOUT": "1", "PREPLINE_S3_READ_TIMEOUT": "2", "PREPLINE_S3_RETRY_SECONDS": "6",
                   "PREPLINE_S3_CALL_RETRIES": "2"}
#: the longest one call can take with it: CALL_RETRIES x (RETRY_SECONDS + the attempt under way, connect + read
#: timeout) (docs/reliability.md)
S3_WORST_CASE = 2 * (6 + 1 + 2)


@dataclass
class Row:
    """One line of the fault table."""

    fault: str
    expected: str
    observed: str = ""
    lost: int | None = None  # None: no document at stake (refused before any was written)
    duplicated: int | None = None
    seconds: float = 0.0
    ok: bool = False
    problems: list[str] = field(default_factory=list)

    def check(self, cond: bool, problem: str) -> None:
        if not cond:
            self.problems.append(problem)

    def done(self, observed: str) -> "Row":
        self.observed = observed
        if self.lost:
            self.problems.append(f"{self.lost} document(s) lost")
        if self.duplicated:
            self.problems.append(f"{self.duplicated} document(s) duplicated")
        self.ok = not self.problems
        return self


@dataclass
class Case:
    id: str
    fault: str
    expected: str
    fn: Callable[["Env", Row], Row]
    marks: tuple[str, ...] = ()


CASES: dict[str, Case] = {}


def case(id: str, fault: str, expected: str, marks: tuple[str, ...] = ()):
    def deco(fn):
        CASES[id] = Case(id, fault, expected, fn, marks)
        return fn
    return deco


def run_case(c: Case, env: "Env") -> Row:
    row = Row(c.fault, c.expected)
    t0 = time.perf_counter()
    try:
        c.fn(env, row)
    except Exception as e:  # noqa: BLE001 - a case that breaks is a failed row, not a crashed suite
        import traceback

        row.problems.append(f"the case itself failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
        row.observed = row.observed or "case error"
    if not row.seconds:
        row.seconds = time.perf_counter() - t0
    row.ok = not row.problems
    return row


@dataclass
class Result:
    rc: int
    out: str
    err: str
    seconds: float


class Env:
    """Shared resources of one suite run: a work folder, the corpus, references, an S3 server."""

    def __init__(self, root: Path, s3_endpoint: str | None = None, docs: int = 0):
        #: documents of the corpus (0: make_corpus's ~1,500, for the tests; scripts/faults.py: 20,000)
        self.docs = docs
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._s3 = s3_endpoint
        self._moto: subprocess.Popen | None = None
        self._refs: dict = {}
        self._ray = None

    # -- data ----------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        p = self.root / f"{name}-{uuid.uuid4().hex[:6]}"
        return p

    @property
    def corpus(self) -> Path:
        """8 Parquet files of skewed sizes (~15% duplicates) with doc_id's ids."""
        ids = self.root / "corpus"
        if not (ids / "metadata.json").exists():
            from prepline.engine import RunOptions, run_transform

            raw = make_docs(self.root / "raw", self.docs) if self.docs else _small_corpus(self.root / "raw")
            run_transform("doc_id", {}, RunOptions(str(raw), str(ids), workers=1, progress=False))
        return ids

    @property
    def doc_count(self) -> int:
        return sum(ids(self.corpus).values())

    @property
    def raw(self) -> Path:
        """The same corpus before doc_id (no id column)."""
        self.corpus  # noqa: B018 - builds it
        return self.root / "raw"

    def reference(self, transform: str, params: dict | None = None, src: Path | None = None) -> Path:
        """The output of an uninterrupted run (one local worker)."""
        from prepline.engine import RunOptions, run_transform

        src = src or self.corpus
        key = (transform, repr(sorted((params or {}).items())), str(src))
        if key not in self._refs:
            out = self.path(f"ref-{transform}")
            run_transform(transform, dict(params or {}), RunOptions(str(src), str(out), workers=1, progress=False))
            self._refs[key] = out
        return self._refs[key]

    # -- running prepline ----------------------------------------------------------------------
    def env(self, extra: dict | None = None, drop: tuple[str, ...] = ()) -> dict:
        e = {k: v for k, v in os.environ.items() if k not in drop}
        e.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
        e.update(extra or {})
        return e

    def start(self, args: list[str], extra: dict | None = None, drop: tuple[str, ...] = (), prefix: list[str] | None = None) -> subprocess.Popen:
        """``prepline <args>`` in its own process group (so a test can signal it alone)."""
        cmd = (prefix or []) + [PY, "-m", "prepline.cli", *args]
        return subprocess.Popen(cmd, env=self.env(extra, drop), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=ROOT)

    def cli(self, args: list[str], extra: dict | None = None, drop: tuple[str, ...] = (), timeout: float = 240,
            prefix: list[str] | None = None) -> Result:
        t0 = time.perf_counter()
        p = self.start(args, extra, drop, prefix)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            err += f"\n[fault suite] TIMEOUT after {timeout}s"
        return Result(p.returncode, out, err, time.perf_counter() - t0)

    # -- S3 ----------------------------------------------------------------------------------------
    def s3(self) -> str:
        if self._s3 is None:
            from conftest import start_moto

            self._moto, self._s3 = start_moto()
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        return self._s3

    def client(self, endpoint: str | None = None):
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.s3(), region_name="us-east-1")

    def bucket(self) -> str:
        name = f"f-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, src: Path, bucket: str, prefix: str) -> str:
        c = self.client()
        for p in sorted(Path(src).rglob("*.parquet")):
            if "_prepline" not in p.parts:
                c.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(src)}", Body=p.read_bytes())
        return f"s3://{bucket}/{prefix}"

    def download(self, uri: str) -> Path:
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        c, dst = self.client(), self.path("dl")
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for o in page.get("Contents", []):
                p = dst / o["Key"][len(prefix) + 1:]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
        return dst

    def s3_env(self, endpoint: str, short: bool = False) -> dict:
        """The environment of a run against ``endpoint``: the default retry budget (``short``: S3_SHORT_BUDGET)."""
        budget = S3_SHORT_BUDGET if short else {k: "" for k in S3_SHORT_BUDGET}  # "": the default, whatever the caller's environment
        return {"PREPLINE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", **budget}

    # -- Ray -----------------------------------------------------------------------------------
    def ray(self):
        """One local Ray in this process for the in-process Ray cases (executors join it)."""
        import ray

        if not ray.is_initialized():
            ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 * 1024,
                     configure_logging=False, _node_ip_address="127.0.0.1")  # never another process's Ray
        return ray

    def close(self) -> None:
        if self._moto is not None:
            self._moto.terminate()
            self._moto.wait(10)


def _small_corpus(root: Path) -> Path:
    from conftest import make_corpus  # tests/ is on sys.path (pytest rootdir, scripts/faults.py)

    return make_corpus(root, files=8)


def make_docs(root: Path, docs: int, files: int = 8, seed: int = 7) -> Path:
    """``docs`` documents in ``files`` Parquet files of skewed sizes (1:2:3:5:8:13:21:34), ~15% of them
    duplicates (some only after normalisation), some near-duplicates (a word changed), laid out like
    conftest.make_corpus (``f00.parquet``, ``part=x/f01.parquet``, ...)."""
    import random

    from conftest import WORDS, write_parquet

    rng = random.Random(seed)
    weights = [1, 2, 3, 5, 8, 13, 21, 34][:files]
    sizes = [max(1, docs * w // sum(weights)) for w in weights]
    sizes[-1] += docs - sum(sizes)
    pool: list[str] = []
    for i, n in enumerate(sizes):
        texts = []
        for _ in range(n):
            r = rng.random()
            if pool and r < 0.15:
                d = rng.choice(pool)
                d = d.upper() if rng.random() < 0.3 else d + "  "
            elif pool and r < 0.2:
                w = rng.choice(pool).split() or ["x"]
                w[rng.randrange(len(w))] = rng.choice(WORDS)
                d = " ".join(w)
            else:
                d = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
                pool.append(d)
            texts.append(d)
        sub = "" if i % 3 else "part=x/"
        write_parquet(root, f"{sub}f{i:02d}.parquet", {"contents": texts, "len": [len(d) for d in texts]})
    return root


# -- checks ------------------------------------------------------------------------------------------
def ids(root: Path) -> collections.Counter:
    """doc_id multiset of every data file under root."""
    c: collections.Counter = collections.Counter()
    for p in sorted(Path(root).rglob("*.parquet")):
        if "_prepline" in p.parts or any(part.startswith(".") for part in p.parts):
            continue
        c.update(pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist())
    return c


def tree_bytes(root: Path) -> dict[str, bytes]:
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.parquet")) if "_prepline" not in p.parts}


def account(row: Row, out: Path, ref: Path) -> bool:
    """Documents lost / duplicated in ``out`` against ``ref``; True when byte-identical too."""
    got, want = ids(out), ids(ref)
    row.lost = sum((want - got).values())
    row.duplicated = sum((got - want).values())
    same = tree_bytes(out) == tree_bytes(ref)
    row.check(same, "output not byte-identical to an uninterrupted run")
    return same


def clear_error(row: Row, r: Result, code: int, *needles: str) -> None:
    """The run failed with ``code``, ``error:`` + ``fix:``, no traceback, and says ``needles``."""
    row.check(r.rc == code, f"exit code {r.rc}, expected {code}: {r.err[-600:]}")
    row.check("error:" in r.err and "fix:" in r.err, f"no error:/fix: on stderr: {r.err[-600:]}")
    row.check("Traceback" not in r.err, f"a traceback reached the user: {r.err[-800:]}")
    for n in needles:
        row.check(n.lower() in r.err.lower(), f"stderr does not say {n!r}: {r.err[-600:]}")


def first_error(r: Result, width: int = 120) -> str:
    """The error line, with the suite's temporary paths, buckets and ports shortened (for the table)."""
    import re

    lines = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    text = lines[-1][len("error: "):] if lines else ""
    text = re.sub(r"(?<![:/\w])/[^\s:]*/([\w.=-]+)", r"…/\1", text)
    text = re.sub(r"s3://f-[0-9a-f]+/", "s3://…/", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:…", text)
    return text if len(text) <= width else text[: width - 1] + "…"


def meta(out: Path) -> dict:
    import json

    return json.loads((Path(out) / "metadata.json").read_text())


def wait_for(pred: Callable[[], bool], timeout: float = 120, step: float = 0.01) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def markers(out: Path, phase: str) -> int:
    d = Path(out) / "_prepline" / "markers" / phase
    return len(list(d.glob("*.json"))) if d.exists() else 0


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries PREPLINE_FAULT_TAG=tag (zombies do not count)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"PREPLINE_FAULT_TAG={tag}".encode() in (d / "environ").read_bytes():
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(d.name))
        except OSError:
            pass
    return out


def fresh(p: Path) -> Path:
    shutil.rmtree(p, ignore_errors=True)
    return p
