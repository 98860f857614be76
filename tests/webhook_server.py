"""A webhook receiver for the notification tests: a real HTTP server on 127.0.0.1, in a thread.

It answers each POST as its `mode` says (the ways a real receiver or the network fails):

    ok           200
    301 302 303  a redirect to /moved (where a GET or a POST would get 200)
    307 308      a redirect to /moved, which takes the POST again
    drip         200, one byte of the answer every `drip_s` seconds
    slow         200 after `slow_s` seconds
    500          500
    reset        the connection reset (RST) once the request is read
    retry-after  429 with `Retry-After: retry_after_s`

Only the first `times` requests get the mode's answer when `times` is set; the others get 200.
`posts` lists every request body it read in full, with its path, `Idempotency-Key` header,
method and time: what a receiver got, whatever the answer. `delay_s` pauses before each answer
(to give a killer time to land mid-delivery).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("ok", "301", "302", "303", "307", "308", "drip", "slow", "500", "reset", "retry-after")


@dataclass
class Post:
    method: str
    path: str
    key: str | None
    body: Any
    at: float = field(default_factory=time.monotonic)


@dataclass
class Receiver:
    mode: str = "ok"
    drip_s: float = 5.0
    slow_s: float = 5.0
    retry_after_s: str = "1"
    delay_s: float = 0.0
    times: int | None = None
    posts: list[Post] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append(Post("POST", self.path, self.headers.get("Idempotency-Key"), _json(body)))
                receiver.answer(self)

            def do_GET(self) -> None:  # noqa: N802 - what a followed 301/302/303 would send
                receiver.posts.append(Post("GET", self.path, self.headers.get("Idempotency-Key"), None))
                self._status(200)

            def _status(self, code: int, **headers: str) -> None:
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.handler = Handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # (a client killed mid-request)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, h: Any) -> None:
        time.sleep(self.delay_s)
        if self.times is not None:
            self.times -= 1
        mode = "ok" if h.path == "/moved" or (self.times is not None and self.times < 0) else self.mode
        if mode in ("301", "302", "303", "307", "308"):
            h._status(int(mode), Location="/moved")
        elif mode == "drip":
            _drip(h, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", self.drip_s)
        elif mode == "slow":
            time.sleep(self.slow_s)
            h._status(200)
        elif mode == "500":
            h._status(500)
        elif mode == "reset":
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            h.close_connection = True
        elif mode == "retry-after":
            h._status(429, Retry_After=self.retry_after_s)
        else:
            h._status(200)

    def received_keys(self, path: str | None = None) -> list[str | None]:
        """The idempotency keys of the POSTs received (at `path` only, when given)."""
        return [p.key for p in self.posts if p.method == "POST" and (path is None or p.path == path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _drip(h: Any, answer: bytes, every_s: float) -> None:
    for i in range(len(answer)):
        try:
            h.wfile.write(answer[i : i + 1])
            h.wfile.flush()
        except OSError:  # the client gave up
            break
        time.sleep(every_s)
    h.close_connection = True


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None
