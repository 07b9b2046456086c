"""A small fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of the local S3 server.

It forwards each request as it is (so the S3 client signs for the proxy's address, and the server
sees the same bytes) and, when told, breaks the next matching ones the way networks and object
stores break: a 5xx answer or throttling (S3's XML error bodies), a connection reset (RST) before
the answer, a body cut short after its headers promised more, a stall (nothing sent for a while),
a 403 that refuses the credentials. ``down()`` makes the endpoint go away (connections refused,
open ones dropped) and ``up()`` brings it back on the same port; ``freeze()`` stalls everything.

Nothing here knows prepline's storage code: it speaks HTTP to whatever client talks to it.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

#: S3's error answers (status, code, message), as in the S3 API reference's error code list
ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "throttle": (503, "SlowDown", "Please reduce your request rate."),
    "auth": (403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."),
}
KINDS = set(ERRORS) | {"reset", "cut", "stall"}


@dataclass
class Fault:
    kind: str
    times: int = 1  # how many matching requests it breaks (-1: all)
    match: str = ""  # regex on "METHOD /path?query"
    seconds: float = 0.0  # stall: how long to hold the request before dropping it


@dataclass
class Stats:
    requests: int = 0
    injected: dict = field(default_factory=dict)


class FaultProxy:
    def __init__(self, upstream: str, port: int = 0):
        m = re.match(r"https?://([^:/]+):(\d+)", upstream)
        assert m, upstream
        self.up_addr = (m.group(1), int(m.group(2)))
        self.faults: list[Fault] = []
        self.stats = Stats()
        self._lock = threading.Lock()
        self._frozen = threading.Event()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control ---------------------------------------------------------------------------------
    def inject(self, kind: str, times: int = 1, match: str = "", seconds: float = 0.0) -> None:
        assert kind in KINDS, kind
        with self._lock:
            self.faults.append(Fault(kind, times, match, seconds))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
        self._frozen.clear()

    def freeze(self) -> None:
        """Every request from now on stalls (a frozen server), until ``clear()``."""
        self._frozen.set()

    def up(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        """The endpoint goes away: new connections are refused, open ones reset."""
        s, self._listener = self._listener, None
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not, on Linux)
            except OSError:
                pass
            s.close()
        for c in list(self._conns):
            _reset(c)

    def close(self) -> None:
        self.clear()
        self.down()

    # -- serving -----------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            self._conns.add(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _take(self, line: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times != 0 and re.search(f.match, line):
                    if f.times > 0:
                        f.times -= 1
                    self.stats.injected[f.kind] = self.stats.injected.get(f.kind, 0) + 1
                    return f
        return None

    def _serve(self, c: socket.socket) -> None:
        up: socket.socket | None = None
        cr = _Reader(c)
        try:
            while True:
                head, body = _read_message(cr, request=True)
                if head is None:
                    return
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, path = line.split(" ")[:2]
                self.stats.requests += 1
                if self._frozen.is_set():
                    while self._frozen.is_set() and self._listener is not None:
                        time.sleep(0.05)
                    return _reset(c)
                fault = self._take(f"{method} {path}")
                if fault and fault.kind in ERRORS:
                    c.sendall(_error_answer(*ERRORS[fault.kind], head_only=method == "HEAD"))
                    continue
                if fault and fault.kind == "reset":
                    return _reset(c)
                if fault and fault.kind == "stall":
                    time.sleep(fault.seconds)
                    return _reset(c)
                if up is None:
                    up = socket.create_connection(self.up_addr, timeout=60)
                up.sendall(head + body)
                ur = _Reader(up)
                rhead, rbody = _read_message(ur, request=False, method=method)
                if rhead is None:
                    return _reset(c)
                if fault and fault.kind == "cut" and len(rbody) > 1:
                    c.sendall(rhead + rbody[: len(rbody) // 2])
                    return _reset(c)
                c.sendall(rhead + rbody)
                if b"connection: close" in rhead.lower():
                    up.close()
                    up = None
        except OSError:
            pass
        finally:
            self._conns.discard(c)
            try:
                c.close()
            except OSError:
                pass
            if up is not None:
                up.close()


class _Reader:
    def __init__(self, s: socket.socket):
        self.s, self.buf = s, b""

    def _fill(self) -> bool:
        d = self.s.recv(65536)
        if not d:
            return False
        self.buf += d
        return True

    def until(self, sep: bytes) -> bytes | None:
        while sep not in self.buf:
            if not self._fill():
                return None
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("closed early")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out


def _read_message(r: _Reader, request: bool, method: str = "") -> tuple[bytes | None, bytes]:
    """One HTTP/1.1 message: (head, body as it came on the wire: Content-Length or chunked)."""
    head = r.until(b"\r\n\r\n")
    if head is None:
        return None, b""
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if request and headers.get("expect", "").lower() == "100-continue":
        # answer the interim 100 ourselves, and forward the request without the Expect header
        r.s.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        head = "\r\n".join(ln for ln in lines if not ln.lower().startswith("expect:")).encode("latin-1")
    if not request:
        status = int(lines[0].split(" ")[1])
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return head, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line = r.until(b"\r\n")
            if size_line is None:
                raise ConnectionError("closed in a chunk")
            body += size_line
            n = int(size_line.split(b";")[0].strip(), 16)
            if n == 0:
                while True:  # trailers, then the empty line
                    t = r.until(b"\r\n")
                    body += t or b""
                    if not t or t == b"\r\n":
                        return head, body
            body += r.exactly(n + 2)
    if "content-length" in headers:
        return head, r.exactly(int(headers["content-length"]))
    return head, (b"" if request else r.rest())


def _error_answer(status: int, code: str, message: str, head_only: bool = False) -> bytes:
    """S3's error answer; to a HEAD request the headers only (RFC 9110: no body), as S3 does."""
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>fault-proxy</RequestId></Error>").encode()
    reason = {500: "Internal Server Error", 503: "Service Unavailable", 403: "Forbidden"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"x-amz-request-id: fault-proxy\r\n\r\n").encode() + (b"" if head_only else body)


def _reset(s: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a dropped connection looks to the client."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass
