"""Shared fixtures: Parquet folders, a local S3 server (moto, real HTTP on 127.0.0.1), one Ray."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Ray listeners on loopback only (see GUIDE §6), for every Ray started by the tests.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def write_parquet(root: Path, rel: str, columns: dict) -> Path:
    p = Path(root) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), p)
    return p


def tree_bytes(root: Path, suffix: str = ".parquet") -> dict[str, bytes]:
    """Every data file under root (relative path -> bytes), for byte-for-byte comparisons."""
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob(f"*{suffix}")) if "_prepline" not in p.parts}


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def make_corpus(root: Path, files: int = 7, seed: int = 3) -> Path:
    """Files of skewed sizes from a small vocabulary, ~15% duplicates (some only after normalisation)."""
    import random

    rng = random.Random(seed)
    pool: list[str] = []
    for i in range(files):
        docs = []
        for _ in range(rng.randint(5, 400)):  # skewed file sizes
            if pool and rng.random() < 0.15:
                d = rng.choice(pool)
                d = d.upper() if rng.random() < 0.3 else d + "  "  # duplicates after normalisation
            else:
                d = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 60)))
                pool.append(d)
            docs.append(d)
        sub = "" if i % 3 else "part=x/"
        write_parquet(root, f"{sub}f{i:02d}.parquet", {"contents": docs, "len": [len(d) for d in docs]})
    return root


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def descends_from(pid: int, ancestor: int) -> bool:
    """True when ``ancestor`` is ``pid``'s parent, grandparent, ... (this machine is shared: a test
    must never signal another user's Ray workers, which carry the same names)."""
    for _ in range(64):
        pid = parent_of(pid)
        if pid in (0, 1):
            return False
        if pid == ancestor:
            return True
    return False


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and parent_of(int(d.name)) == pid]


def pool_workers(pid: int) -> list[int]:
    """The live pool processes of a local run whose driver is ``pid``: spawned (multiprocessing's
    command line, not its resource tracker) or forked by ``prepline run`` (the driver's command line)."""
    try:
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for child in children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"multiprocessing" in cmd and b"resource_tracker" not in cmd) or cmd == own:
            found.append(child)
    return found


def dup_ngram_chars_ref(tokens: list, n: int, length=len) -> int:
    """Characters (``length`` of each token) of the tokens covered by a later occurrence of an
    n-gram of ``tokens``: the plain-Python reference of ``textstats.dup_ngram_chars``."""
    seen, covered = set(), set()
    for i in range(len(tokens) - n + 1):
        g = tuple(tokens[i : i + n])
        if g in seen:
            covered.update(range(i, i + n))
        seen.add(g)
    return sum(length(tokens[i]) for i in covered)


def has_open_under(pid: int, folder: Path) -> bool:
    """Whether the process has a file of ``folder`` open (e.g. a pool worker reading an input)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(folder)):
                return True
        except OSError:
            continue
    return False


def kill_when(proc: subprocess.Popen, marker_dir: Path, n: int, timeout: float = 120) -> int:
    """SIGKILL the run (its process group) once ``n`` completion markers exist in ``marker_dir``;
    returns how many there were. Fails the test if the run ends first or makes no progress."""
    import signal

    deadline = time.time() + timeout
    while time.time() < deadline:
        found = len(list(marker_dir.rglob("*.json"))) if marker_dir.exists() else 0
        if found >= n:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return found
        if proc.poll() is not None:
            pytest.fail(f"run finished before it could be killed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.005)
    proc.kill()
    pytest.fail("no progress to kill")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small corpus in two files and a sub-folder, with duplicates in and across files."""
    d = tmp_path / "in"
    write_parquet(d, "a.parquet", {"contents": ["Hello world", "hello   WORLD ", "Another doc", "x"], "n": [0, 1, 2, 3]})
    write_parquet(d, "lang=en/b.parquet", {"contents": ["", "Another doc", "third one", "Hello world"], "n": [4, 5, 6, 7]})
    write_parquet(d, "c.parquet", {"contents": ["unique text here", ""], "n": [8, 9]})
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    """moto's standalone S3 server on a free port of 127.0.0.1: (process, endpoint)."""
    port = _free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto_server did not start")


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server (moto's standalone server) on 127.0.0.1 for the whole session."""
    proc, endpoint = start_moto()
    env = {
        "PREPLINE_S3_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield endpoint
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:  # a loaded machine, or a connection a fault case left hanging
        proc.kill()
        proc.wait(10)


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A fresh bucket; returns its name."""
    from prepline.data_access import s3_client

    name = f"b-{uuid.uuid4().hex[:12]}"
    s3_client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every Ray test in the session (its executors join it, never stop it)."""
    import ray

    # address="local": a Ray of this process, never one another test process (or user) started here
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 * 1024, configure_logging=False)
    yield ray
    ray.shutdown()


#: the test file that takes minutes: first, so that with two pytest-xdist workers
#: (scripts/test.sh) the other worker shares out the rest of the suite meanwhile instead of
#: waiting for it at the end
LONGEST_FIRST = ("pipelines/test_super_local.py",)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = str(item.path)
        return next((i for i, f in enumerate(LONGEST_FIRST) if path.endswith(f)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the collection order otherwise
