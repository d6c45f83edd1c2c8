"""A loopback HTTP file server for the hub tests, started by the test itself: range requests (or not), dropped
connections, a lying Content-Length, 404 and a bearer-token 401. Every request is logged (path, Range header)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    ranges: bool = True  # honour Range headers (206); False: always 200 with the whole file
    drops: int = 0  # the first `drops` GETs of the file send half their body, then close the connection
    extra_length: int = 0  # announce this many bytes more than the file has (a server lying about the length)
    token: str | None = None  # required bearer token; missing or wrong: 401
    fail_status: int | None = None  # answer every request with this status
    redirect_to: str | None = None  # answer 302 to this path (a hub's resolve URL pointing at its CDN)


@dataclass
class Served:
    data: bytes
    behaviour: Behaviour = field(default_factory=Behaviour)
    gets: int = 0


class LoopbackServer:
    def __init__(self):
        self.files: dict[str, Served] = {}
        self.log: list[tuple[str, str | None]] = []  # (path, Range header) of every request
        self.authorised: list[tuple[str, bool]] = []  # (path, whether an Authorization header came with it)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def serve(self, path: str, data: bytes, **behaviour) -> str:
        self.files[path] = Served(data, Behaviour(**behaviour))
        return self.url(path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def ranges_of(self, path: str) -> list[str | None]:
        return [r for p, r in self.log if p == path]

    def __enter__(self) -> "LoopbackServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(server: LoopbackServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a drop is a closed socket

        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            with server._lock:
                server.log.append((self.path, self.headers.get("Range")))
                server.authorised.append((self.path, self.headers.get("Authorization") is not None))
                served = server.files.get(self.path)
                if served is not None:
                    served.gets += 1
            if served is None:
                return self._status(404)
            b = served.behaviour
            if b.fail_status is not None:
                return self._status(b.fail_status)
            if b.redirect_to is not None:
                self.send_response(302)
                self.send_header("Location", b.redirect_to)
                self.send_header("Content-Length", "0")
                return self.end_headers()
            if b.token is not None and self.headers.get("Authorization") != f"Bearer {b.token}":
                return self._status(401)
            announced = len(served.data) + b.extra_length
            start, end, status = 0, announced - 1, 200
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if m and b.ranges:
                start = int(m.group(1))
                end = min(int(m.group(2)), announced - 1) if m.group(2) else announced - 1
                if start >= len(served.data):
                    return self._status(416)
                status = 206
            body = served.data[start:end + 1]
            self.send_response(status)
            self.send_header("Content-Length", str(end + 1 - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{announced}")
            self.end_headers()
            if served.gets <= b.drops:
                body = body[:max(1, len(body) // 2)]
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True

        def _status(self, code: int):
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler
