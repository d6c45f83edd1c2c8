"""Files of a dataset hub read over HTTP(S) with the standard library: no `datasets`, no `huggingface_hub`.

Two ways in, both resumable after a dropped connection:

- `stream(url, cfg)`: the whole file front to back in chunks (a JSONL file is read line by line from it). When the
  connection drops, the next request asks for `Range: bytes=<received>-` and the stream goes on where it stopped; a
  server that ignores ranges (200 instead of 206) is read from the start again and the bytes already delivered are
  skipped. `Streamed.sha256` is the content hash of exactly what was delivered.
- `RemoteFile(url, cfg)`: a seekable read-only file whose every read is one range request, so pyarrow reads a
  parquet file's footer and then only the row groups and columns it is asked for (ingest goes one row group at a
  time), never the whole file. A read cut short is restarted from the byte where it stopped.

Every answer is checked against what was announced: the total size (Content-Range / Content-Length) must stay the
same across requests, a 206 must start at the byte asked for, and a body shorter than announced is a truncation,
retried `retries` times and then an error. Errors are `DataError` (exit 2) naming the URL and the HTTP status or
what was short; 401/403/404 are never retried (asking again does not change the answer).

Authentication: when `token_env` names a set environment variable, its value is sent as `Authorization: Bearer`
(a gated Hugging Face dataset), as an unredirected header: a redirect to a CDN does not carry the token."""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Iterator

from align.exceptions import DataError

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_NETWORK_ERRORS = (http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError, urllib.error.URLError)
_FINAL_STATUS = {401: "unauthorised (set the token variable named by http.token_env?)", 403: "forbidden",
                 404: "not found", 410: "gone"}


@dataclass(frozen=True)
class HttpConfig:
    """[sources.<name>.http]: how a `url` source is fetched."""

    timeout_s: float = 60.0  # per socket operation (connect, each read)
    retries: int = 5  # restarts after a dropped or short answer, per request, before the source fails
    backoff_s: float = 0.5  # sleep before restart k: backoff_s * 2**k, at most 30 s
    chunk_bytes: int = 1 << 20  # bytes per read of a streamed file
    token_env: str = ""  # environment variable holding a bearer token ("" : anonymous)

    def __post_init__(self):
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.chunk_bytes < 1:
            raise ValueError("http: timeout_s > 0, retries >= 0, backoff_s >= 0 and chunk_bytes >= 1 are required")


class _Short(Exception):
    """An answer ended before the bytes it announced: restart the request from where it stopped."""


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _request(url: str, cfg: HttpConfig, start: int, end: int | None):
    """Open a GET for bytes [start, end] (end None: to the end of the file; start 0 and end None: no Range)."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": "identity", "User-Agent": "align-hub/1"})
    if start or end is not None:
        req.add_header("Range", f"bytes={start}-{'' if end is None else end}")
    token = os.environ.get(cfg.token_env, "") if cfg.token_env else ""
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")
    try:
        return urllib.request.urlopen(req, timeout=cfg.timeout_s)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code in _FINAL_STATUS:
            raise DataError(f"{url}: HTTP {exc.code} {_FINAL_STATUS[exc.code]}") from None
        if exc.code == 416:
            raise DataError(f"{url}: HTTP 416 range not satisfiable at byte {start} (the file is shorter than "
                            "the server announced: truncated)") from None
        if exc.code >= 500 or exc.code == 429:
            raise _Short(f"HTTP {exc.code}") from None
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}") from None


def _total_of(resp, url: str) -> int | None:
    """The whole file's size as this answer announces it (None: not announced)."""
    if resp.status == 206:
        m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
        if not m:
            raise DataError(f"{url}: HTTP 206 without a valid Content-Range header "
                            f"({resp.headers.get('Content-Range')!r})")
        return None if m.group(3) == "*" else int(m.group(3))
    length = resp.headers.get("Content-Length")
    return int(length) if length is not None else None


def _start_of(resp, url: str, asked: int) -> int:
    """The byte this answer's body starts at: `asked` for a matching 206, 0 for a 200 (a server ignoring ranges)."""
    if resp.status == 200:
        return 0
    if resp.status != 206:
        raise DataError(f"{url}: unexpected HTTP {resp.status} {resp.reason}")
    start = int(_CONTENT_RANGE.fullmatch(resp.headers["Content-Range"].strip()).group(1))
    if start != asked:
        raise DataError(f"{url}: asked for bytes from {asked}, the server answered from {start}")
    return start


class _Retrying:
    """Retry bookkeeping shared by both readers: the total size seen first, a restart count per request."""

    def __init__(self, url: str, cfg: HttpConfig):
        self.url, self.cfg, self.total = url, cfg, None

    def check_total(self, total: int | None) -> None:
        if total is None:
            return
        if self.total is not None and total != self.total:
            raise DataError(f"{self.url}: the file changed while it was read (size {self.total}, now {total} bytes)")
        self.total = total

    def pause(self, attempt: int, why: str, got: int) -> None:
        if attempt >= self.cfg.retries:
            expected = f"of {self.total} " if self.total is not None else ""
            raise DataError(f"{self.url}: truncated: got {got} {expected}bytes, {why}; gave up after "
                            f"{self.cfg.retries} restarts (http.retries)")
        time.sleep(min(30.0, self.cfg.backoff_s * 2 ** attempt))


class Streamed:
    """The bytes of a whole file, in chunks, resumed by range after a drop; sha256 of what was delivered."""

    def __init__(self, url: str, cfg: HttpConfig):
        self.url, self.cfg = url, cfg
        self._hash = hashlib.sha256()
        self.bytes_read = 0
        self.requests = 0

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def __iter__(self) -> Iterator[bytes]:
        state, attempt = _Retrying(self.url, self.cfg), 0
        while True:
            try:
                yield from self._from(self.bytes_read, state)
                return
            except (_Short, *_NETWORK_ERRORS) as exc:
                state.pause(attempt, f"the connection ended early ({exc or type(exc).__name__})", self.bytes_read)
                attempt += 1

    def _from(self, offset: int, state: _Retrying) -> Iterator[bytes]:
        self.requests += 1
        with _request(self.url, self.cfg, offset, None) as resp:
            state.check_total(_total_of(resp, self.url))
            skip = offset - _start_of(resp, self.url, offset)  # > 0 only when the server ignored the range
            while True:
                chunk = resp.read(self.cfg.chunk_bytes)
                if not chunk:
                    break
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                    if not chunk:
                        continue
                self._hash.update(chunk)
                self.bytes_read += len(chunk)
                yield chunk
        if state.total is not None and self.bytes_read < state.total:
            raise _Short(f"the body ended at byte {self.bytes_read}")
        if state.total is not None and self.bytes_read > state.total:
            raise DataError(f"{self.url}: the server sent {self.bytes_read} bytes, more than the {state.total} "
                            "it announced")


def stream(url: str, cfg: HttpConfig = HttpConfig()) -> Streamed:
    return Streamed(url, cfg)


def iter_lines(streamed: Streamed) -> Iterator[bytes]:
    """The lines of a streamed file (without their line ending; a last line without one included)."""
    tail = b""
    for chunk in streamed:
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        yield from (line.rstrip(b"\r") for line in lines)
    if tail:
        yield tail.rstrip(b"\r")


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: every `readinto` is one range request (restarted after a
    drop). The size comes from a first 1-byte range request, which also proves the server honours ranges."""

    def __init__(self, url: str, cfg: HttpConfig = HttpConfig()):
        super().__init__()
        self.url, self.cfg = url, cfg
        self._state = _Retrying(url, cfg)
        self._pos = 0
        self.requests: list[tuple[int, int]] = []  # (start, length) of every range asked for
        self.size = self._probe_size()

    def _probe_size(self) -> int:
        for attempt in range(self.cfg.retries + 1):
            try:
                with _request(self.url, self.cfg, 0, 0) as resp:
                    if resp.status != 206:
                        raise DataError(f"{self.url}: the server ignores range requests (HTTP {resp.status} to "
                                        "'Range: bytes=0-0'); a parquet file is read by row groups, which needs "
                                        "them (a .jsonl file is streamed and does not)")
                    total = _total_of(resp, self.url)
                    if total is None:
                        raise DataError(f"{self.url}: the server does not announce the file's size")
                    self._state.check_total(total)
                    return total
            except (_Short, *_NETWORK_ERRORS) as exc:
                self._state.pause(attempt, f"the size probe failed ({exc})", 0)
        raise AssertionError("unreachable")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.url}: seek to a negative position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self.size - self._pos))
        got, attempt = 0, 0
        while got < want:
            try:
                got += self._fill(view[got:want], self._pos + got)
            except (_Short, *_NETWORK_ERRORS) as exc:
                self._state.pause(attempt, f"a range read at byte {self._pos + got} ended early ({exc})",
                                  self._pos + got)
                attempt += 1
        self._pos += got
        return got

    def _fill(self, view: memoryview, start: int) -> int:
        """Read into `view` from byte `start` until it is full or the answer ends; the bytes read."""
        self.requests.append((start, len(view)))
        with _request(self.url, self.cfg, start, start + len(view) - 1) as resp:
            self._state.check_total(_total_of(resp, self.url))
            if _start_of(resp, self.url, start) != start:
                raise DataError(f"{self.url}: the server stopped honouring range requests (HTTP {resp.status})")
            n = 0
            while n < len(view):
                k = resp.readinto(view[n:])
                if not k:
                    break
                n += k
        if n < len(view):
            if n == 0:
                raise _Short(f"no bytes at {start}")
            return n  # progress: the caller asks again for the rest
        return n
