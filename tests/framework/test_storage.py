"""The storage layer's own guarantees: schemes, multipart writes that are whole or absent, errors
a retry may cure told apart from bad input, settings from the environment.

S3 is the real S3-protocol server of the ``s3_server`` fixture (moto_server on 127.0.0.1); the
failing endpoints are real sockets on 127.0.0.1 (a closed port, a server answering 503 SlowDown).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.data_access import (
    LocalLocation,
    RemoteLocation,
    S3Location,
    S3Settings,
    StorageError,
    TransientStorageError,
    is_transient,
    open_location,
    s3_client,
)
from prepline.errors import ConfigError, InputError


class Sent:
    """Operation names the location's own S3 client sends (botocore event hooks)."""

    def __init__(self, client):
        self.client, self.ops = client, []
        client.meta.events.register("before-send.s3.*", self._hook)

    def _hook(self, event_name, **kwargs):
        self.ops.append(event_name.rsplit(".", 1)[-1])

    def close(self):
        self.client.meta.events.unregister("before-send.s3.*", self._hook)


def test_schemes_and_clear_errors(tmp_path, monkeypatch):
    assert isinstance(open_location(f"file://{tmp_path}"), LocalLocation)
    assert open_location(f"file://{tmp_path}/x").uri == str(tmp_path / "x")
    assert isinstance(open_location("S3://bkt/x"), S3Location)
    assert open_location("s3a://bkt/x").uri == "s3://bkt/x"
    with pytest.raises(ConfigError, match="scheme 'ftp://' is not supported") as ei:
        open_location("ftp://host/x")
    assert "s3://" in ei.value.fix
    # gcsfs and adlfs are optional extras, not installed by `all`: a clear error, not a local path
    for uri, package, extra in (("gs://bkt/x", "gcsfs", "gcs"), ("az://container/x", "adlfs", "azure")):
        try:
            __import__(package)
            continue  # installed here: nothing to refuse
        except ImportError:
            pass
        with pytest.raises(ConfigError, match=f"needs the Python package {package}") as ei:
            open_location(uri)
        assert f"prepline[{extra}]" in ei.value.fix
    # hf:// goes through huggingface_hub's fsspec filesystem (installed with tokenizers)
    hf = open_location("hf://datasets/org/name/data")
    assert isinstance(hf, RemoteLocation) and hf.uri == "hf://datasets/org/name/data"


def test_settings_from_env(monkeypatch):
    for k in ("PREPLINE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    s = S3Settings.from_env()
    assert (s.endpoint, s.connect_timeout, s.read_timeout, s.max_attempts, s.call_retries, s.part_mb, s.retry_seconds) == \
        (None, 10.0, 30.0, 40, 2, 16, 60.0)
    assert "s3" not in s.botocore_config()  # AWS itself: virtual-hosted addressing
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("PREPLINE_S3_READ_TIMEOUT", "7.5")
    monkeypatch.setenv("PREPLINE_S3_MAX_ATTEMPTS", "3")
    s = S3Settings.from_env()
    cfg = s.botocore_config()
    assert s.endpoint == "http://minio:9000" and cfg["read_timeout"] == 7.5
    # botocore's own retries are off: prepline's RetryBudget retries (at most MAX_ATTEMPTS requests, within RETRY_SECONDS)
    assert cfg["retries"] == {"total_max_attempts": 1, "mode": "standard"} and cfg["s3"] == {"addressing_style": "path"}
    fs = open_location("s3://bkt/x").fs
    assert fs.retries == 2 and fs.config_kwargs["read_timeout"] == 7.5
    monkeypatch.setenv("PREPLINE_S3_PART_MB", "2")
    with pytest.raises(ConfigError, match="5 MiB to 5 GiB"):
        S3Settings.from_env()
    monkeypatch.setenv("PREPLINE_S3_PART_MB", "lots")
    with pytest.raises(ConfigError, match="PREPLINE_S3_PART_MB='lots' is not a number"):
        S3Settings.from_env()


def _big_table(rows: int) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(1)
    return pa.table({"b": pa.array([rng.bytes(1000) for _ in range(rows)], pa.binary())})


@pytest.mark.s3
def test_s3_streaming_write_is_multipart_and_whole_or_absent(s3_bucket, monkeypatch):
    monkeypatch.setenv("PREPLINE_S3_PART_MB", "5")
    loc = open_location(f"s3://{s3_bucket}/out")
    sent = Sent(loc.client)
    chunk = _big_table(4000)  # ~4 MB of incompressible bytes per write
    with loc.parquet_writer("big.parquet", chunk.schema) as w:
        for _ in range(4):
            w.write(chunk)
        assert loc.list_all() == []  # nothing visible before the writer finishes
    assert sent.ops.count("CreateMultipartUpload") == 1 and sent.ops.count("UploadPart") >= 3
    assert sent.ops.count("CompleteMultipartUpload") == 1 and "PutObject" not in sent.ops
    assert loc.list_files() == [type(loc.list_files()[0])("big.parquet", w.bytes_written)]
    pf = loc.parquet_file("big.parquet")
    assert pf.metadata.num_rows == 16000 and pf.metadata.num_row_groups == 4

    # a writer failing half-way: the upload is aborted, no object, no upload left pending
    sent.ops.clear()
    with pytest.raises(RuntimeError, match="transform failed"):
        with loc.parquet_writer("broken.parquet", chunk.schema) as w:
            w.write(chunk)
            w.write(chunk)
            raise RuntimeError("transform failed")
    assert "UploadPart" in sent.ops and "AbortMultipartUpload" in sent.ops and "CompleteMultipartUpload" not in sent.ops
    assert [f.rel for f in loc.list_all()] == ["big.parquet"]
    assert s3_client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    # a small file is one PutObject at the end
    sent.ops.clear()
    loc.write_parquet("small.parquet", pa.table({"x": [1, 2]}))
    assert sent.ops == ["PutObject"]
    sent.close()


@pytest.mark.s3
def test_single_object_size_and_parent(s3_bucket, tmp_path):
    loc = open_location(f"s3://{s3_bucket}/in")
    n = loc.write_parquet("sub/a.parquet", pa.table({"x": [1]}))
    one = open_location(f"s3://{s3_bucket}/in/sub/a.parquet")
    assert one.file_size() == n and not one.exists()
    parent, name = one.parent_and_name()
    assert (parent.uri, name) == (f"s3://{s3_bucket}/in/sub", "a.parquet")
    assert loc.file_size("sub") is None and loc.file_size("nope") is None
    local = LocalLocation(str(tmp_path / "f.parquet"))
    pq.write_table(pa.table({"x": [1]}), local.root)
    assert local.file_size() == (tmp_path / "f.parquet").stat().st_size
    assert local.parent_and_name()[0].uri == str(tmp_path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SlowDown(http.server.BaseHTTPRequestHandler):
    """Answers every request 503 SlowDown, as S3 does when throttling (AWS S3 error responses)."""

    hits = 0
    log: list = []

    def _answer(self):
        type(self).hits += 1
        type(self).log.append(self.command)
        body = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>'
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *a):
        pass


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("PREPLINE_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("PREPLINE_S3_CALL_RETRIES", "1")
    monkeypatch.setenv("PREPLINE_S3_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("PREPLINE_S3_READ_TIMEOUT", "2")
    monkeypatch.setenv("PREPLINE_S3_RETRY_SECONDS", "10")


def test_unreachable_endpoint_is_transient_not_bad_input(fast_retries, monkeypatch):
    monkeypatch.setenv("PREPLINE_S3_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    loc = open_location("s3://bkt/in")
    for call in (loc.list_all, lambda: loc.read_bytes("a.json"), lambda: loc.write_bytes("a.json", b"{}"),
                 lambda: loc.parquet_file("a.parquet", 100).schema_arrow):
        with pytest.raises(TransientStorageError, match="s3://bkt/in") as ei:
            call()
        assert is_transient(ei.value) and "PREPLINE_S3_RETRY_SECONDS" in ei.value.fix
        assert not isinstance(ei.value, (InputError, OSError))  # never taken for a bad file


def test_throttling_is_transient_and_retried_a_bounded_number_of_times(fast_retries, monkeypatch):
    _SlowDown.hits = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowDown)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        monkeypatch.setenv("PREPLINE_S3_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        loc = open_location("s3://bkt/in")
        with pytest.raises(TransientStorageError, match="503|SlowDown") as ei:
            loc.read_bytes("a.json")
        assert is_transient(ei.value) and is_transient(ei.value.cause)
        assert _SlowDown.hits == 2, _SlowDown.log  # PREPLINE_S3_MAX_ATTEMPTS requests, then the error
    finally:
        server.shutdown()
        server.server_close()


class _Brownout(http.server.BaseHTTPRequestHandler):
    """503 ServiceUnavailable to every request until ``until`` (monotonic; set by the first request
    plus ``seconds``), then S3's answer to GetObject of a small object."""

    seconds, until, errors, body = 30.0, None, 0, b'{"ok": 1}'

    def do_GET(self):
        cls = type(self)
        now = time.monotonic()
        if cls.until is None:
            cls.until = now + cls.seconds
        if now < cls.until:
            cls.errors += 1
            err = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code><Message>Please try again.</Message></Error>'
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(err)))
            self.end_headers()
            self.wfile.write(err)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(cls.body)))
        self.send_header("ETag", '"0"')
        self.end_headers()
        self.wfile.write(cls.body)

    def log_message(self, *a):
        pass


@pytest.mark.slow
def test_a_30s_brownout_is_ridden_out_with_the_default_budget(monkeypatch):
    """Finding 6 of issue 30: a 10 s 503 brownout failed a run. With the default budget (a time,
    not a count of jittered retries) a 30 s one is ridden out, and a warning names it after 30 s."""
    for k in ("PREPLINE_S3_MAX_ATTEMPTS", "PREPLINE_S3_CALL_RETRIES", "PREPLINE_S3_RETRY_SECONDS", "PREPLINE_S3_READ_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _Brownout.until, _Brownout.errors = None, 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Brownout)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        monkeypatch.setenv("PREPLINE_S3_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        t0 = time.monotonic()
        assert open_location("s3://bkt/in").read_bytes("a.json") == _Brownout.body
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - t0 >= 30 and _Brownout.errors >= 3  # the brownout happened, and lasted


def test_the_retry_budget_is_a_time_not_a_count(monkeypatch, caplog):
    """A request is retried while it is younger than PREPLINE_S3_RETRY_SECONDS, whatever the jitter;
    one failing for 30 s is named in a warning, once."""
    from botocore.exceptions import EndpointConnectionError

    from prepline import objstore

    monkeypatch.setenv("PREPLINE_S3_RETRY_SECONDS", "60")
    budget = objstore.RetryBudget(S3Settings.from_env())
    clock = [1000.0]
    monkeypatch.setattr(objstore.time, "monotonic", lambda: clock[0])
    ctx: dict = {}
    budget.before_call(context=ctx)

    import botocore.session

    op = botocore.session.get_session().get_service_model("s3").operation_model("GetObject")

    def ask(attempts: int):
        return budget.needs_retry(response=None, caught_exception=EndpointConnectionError(endpoint_url="http://x"),
                                  attempts=attempts, operation=op, request_dict={"context": ctx})

    delays = []
    for n in range(1, 40):
        d = ask(n)
        if d is None:
            break
        delays.append(d)
        clock[0] += d
    assert 40 <= clock[0] - 1000 < 60 and all(d <= 20 for d in delays)  # retried until the budget, never past it
    assert caplog.text.count("has not answered GetObject for") == 1 and "EndpointConnectionError" in caplog.text


@pytest.mark.s3
def test_missing_things_are_not_transient(s3_bucket):
    loc = open_location(f"s3://{s3_bucket}/in")
    with pytest.raises(FileNotFoundError) as ei:
        loc.read_bytes("nope.json")
    assert not is_transient(ei.value)
    with pytest.raises(StorageError, match="no-such-bucket-3b1") as ei2:
        open_location("s3://no-such-bucket-3b1/x").read_bytes("a")
    assert isinstance(ei2.value, InputError) and not is_transient(ei2.value)
    assert not is_transient(ValueError("x"))
