"""POST an incident note as JSON to a webhook: a generic object, or Slack-compatible `{"text": ...}`.

One POST per note, with an idempotency key (`idempotency_key`: the same for the same incident
update however often it is sent) in the payload and in an `Idempotency-Key` header, so a receiver
can drop the repeat that a crash between its answer and gradwatch's journal entry causes.

A delivery has one total deadline (`timeout`): connecting, sending, waiting for the answer and
every retry share it, however slowly a server drips its answer (the request runs in a thread; at
the deadline its socket is shut down and the delivery has failed). Transient failures (connection
errors, HTTP 429 and 5xx) are retried with exponential backoff, or after the `Retry-After` the
server asks for, if that fits in what is left of the deadline; other HTTP errors are not (a
wrong URL does not heal in a second). A POST is never redirected (urllib would turn a 301, 302
or 303 into an empty GET and report success): a 3xx is a failure naming its Location, except 307
and 308, which keep method and body by definition and are followed. Webhook URLs are often
secrets (Slack's are): messages name only the scheme and host of the configured URL. A proxy
is used as urllib would (`https_proxy`, `http_proxy`, `no_proxy`).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from gradwatch import __version__
from gradwatch.errors import UsageError
from gradwatch.incidents import Note
from gradwatch.sinks.journal import idempotency_key
from gradwatch.sinks.safe import safe_text

__all__ = ["DEADLINE_S", "check_url", "generic_payload", "post_json", "slack_payload"]

#: Tries per delivery, and the pause before the second one (doubled before each further one).
ATTEMPTS = 3
BACKOFF_S = 0.5
#: The default total deadline of one delivery, retries included.
DEADLINE_S = 30.0
#: 307 and 308 redirects followed per delivery.
MAX_REDIRECTS = 3


def check_url(url: str) -> None:
    """Refuse anything but an http(s) URL with a host, before any file is read."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or _port(parts) == -1:
        shown = "one that does not parse" if parts is None else repr(safe_text(_where(url), "line"))
        raise UsageError(f"--webhook must be an http:// or https:// URL with a host, got {shown}")


def generic_payload(note: Note) -> dict[str, Any]:
    """`alerts`: the note's alert fields (with its incident id) plus `event` and `headline`."""
    return {"source": "gradwatch", "version": 1, "idempotency_key": idempotency_key(note), "alerts": [note.to_json()]}


def slack_payload(note: Note) -> dict[str, Any]:
    """One line: severity, what happened, the detector, where, the headline. Whatever comes from a
    log is an inert inline code span (`safe_text`'s slack target): no formatting, mention or link."""
    a = note.alert
    step = f" step {a.step}" if a.step is not None else ""
    where = " ".join(t for t in (safe_text(a.detector, "slack"), safe_text(a.path or "", "slack")) if t)
    text = f"gradwatch: *{a.severity}* incident {note.event} {where}{step}: {safe_text(note.headline, 'slack')}"
    return {"text": text}


@dataclass
class _Answer:
    """What one request got: an HTTP status (with what the headers say), or why there was none."""

    status: int | None = None
    reason: str = ""
    location: str | None = None
    retry_after: str | None = None
    error: str | None = None


def post_json(url: str, payload: dict[str, Any], timeout: float = DEADLINE_S, key: str | None = None) -> str | None:
    """POST `payload` within `timeout` seconds in all; None once a 2xx answer came, else why not."""
    body = json.dumps(payload, allow_nan=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": f"gradwatch/{__version__}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    end = time.monotonic() + timeout
    attempt, error = 0, ""
    while True:
        attempt += 1
        answer = _post_following(url, body, headers, end, timeout)
        if answer.error is None and answer.status is not None and 200 <= answer.status < 300:
            return None
        error = answer.error or f"HTTP {answer.status} {safe_text(answer.reason, 'line')[:100]}".rstrip()
        transient = answer.status is None or answer.status == 429 or answer.status >= 500
        if not transient or attempt == ATTEMPTS:
            break
        pause = _retry_after(answer.retry_after) if answer.retry_after else BACKOFF_S * 2 ** (attempt - 1)
        if time.monotonic() + pause >= end:
            if answer.retry_after:
                asked = safe_text(answer.retry_after, "line")[:40]
                error += f", Retry-After {asked}: beyond what is left of the {timeout:.3g} s deadline"
            break
        time.sleep(pause)
    return f"webhook {_where(url)}: {error} ({attempt} attempt{'s' if attempt != 1 else ''})"


def _post_following(url: str, body: bytes, headers: dict[str, str], end: float, timeout: float) -> _Answer:
    """One attempt: the POST, and the same POST again where a 307 or 308 sends it."""
    for _ in range(MAX_REDIRECTS + 1):
        answer = _post_once(url, body, headers, end, timeout)
        if answer.status is None or not 300 <= answer.status < 400:
            return answer
        where = safe_text(answer.location or "", "line")[:200] or "nowhere (no Location header)"
        if answer.status not in (307, 308) or not answer.location:
            answer.error = f"HTTP {answer.status} redirect to {where}, not followed for a POST: set --webhook to it"
            return answer
        try:
            url = urllib.parse.urljoin(url, answer.location)
            usable = urllib.parse.urlsplit(url).scheme in ("http", "https")
        except ValueError:  # an unclosed IPv6 bracket
            usable = False
        if not usable:
            answer.error = f"HTTP {answer.status} redirect to {where}: not an http(s) URL"
            return answer
    answer.error = f"more than {MAX_REDIRECTS} redirects"
    return answer


def _post_once(url: str, body: bytes, headers: dict[str, str], end: float, timeout: float) -> _Answer:
    """One request, given up at `end` whatever the server does: it runs in a thread whose socket
    is shut down at the deadline (a socket timeout alone bounds each read, not a drip of bytes)."""
    answers: list[_Answer] = []
    connections: list[http.client.HTTPConnection] = []
    worker = threading.Thread(target=_exchange, args=(url, body, headers, end, connections, answers), daemon=True)
    worker.start()
    worker.join(max(0.0, end - time.monotonic()))
    if answers:
        return answers[0]
    for conn in connections:
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # (already closed)
                sock.shutdown(socket.SHUT_RDWR)
    return _Answer(error=f"no answer within the {timeout:.3g} s deadline")


def _exchange(
    url: str,
    body: bytes,
    headers: dict[str, str],
    end: float,
    connections: list[http.client.HTTPConnection],
    answers: list[_Answer],
) -> None:
    """Connect, send, read the status and headers (the body is not needed); the worker of `_post_once`."""
    try:
        conn, target, headers = _connection(url, headers, max(0.01, end - time.monotonic()))
    except ValueError as e:  # a port out of range where a redirect sent us
        answers.append(_Answer(error=f"cannot POST to {safe_text(url, 'line')[:200]}: {e}"))
        return
    connections.append(conn)
    try:
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        answers.append(
            _Answer(response.status, response.reason, response.getheader("Location"), response.getheader("Retry-After"))
        )
    except (OSError, http.client.HTTPException, ValueError) as e:  # refused, reset, DNS, TLS, a bad answer
        answers.append(_Answer(error=safe_text(str(e) or type(e).__name__, "line")[:200]))
    finally:
        conn.close()


def _connection(
    url: str, headers: dict[str, str], timeout: float
) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The (unopened) connection for `url`, the request target and headers: direct, or as urllib
    does through a proxy (a CONNECT tunnel for https, the absolute URL for http)."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    proxy = _proxy_for(parts.scheme, host)
    if proxy is None:
        return kind(host, port, timeout=timeout), path, headers
    conn = kind(proxy.hostname or "", proxy.port or 80, timeout=timeout)
    auth = _proxy_auth(proxy)
    if not https:
        return conn, url, {**headers, **auth}
    conn.set_tunnel(host, port, headers=auth)
    return conn, path, headers


def _proxy_for(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    """The proxy that `https_proxy`/`http_proxy` (and `no_proxy`) name for this host, as urllib
    would use it; None for a direct connection."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _proxy_auth(proxy: urllib.parse.SplitResult) -> dict[str, str]:
    """Basic credentials of a proxy URL with user:password@, as a Proxy-Authorization header."""
    if proxy.username is None:
        return {}
    user = urllib.parse.unquote(proxy.username)
    password = urllib.parse.unquote(proxy.password or "")
    return {"Proxy-Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _retry_after(value: str) -> float:
    """Retry-After as seconds from now: a number of seconds, or an HTTP date; infinite if unreadable."""
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return math.inf
    return max(0.0, seconds) if math.isfinite(seconds) else math.inf


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = _port(parts)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{port}" if port not in (None, -1) else "")


def _port(parts: urllib.parse.SplitResult) -> int | None:
    """The URL's port, None when absent, -1 when it is not a valid port number."""
    try:
        return parts.port
    except ValueError:
        return -1
