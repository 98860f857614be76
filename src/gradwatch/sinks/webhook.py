"""POST incident notes as JSON to a webhook: generic objects, or Slack-compatible `{"text": ...}`.

One POST carries every note of a delivery (an incident opened, escalated or ended), so a delivery
happens or fails as a whole and the caller can remember exactly what is still owed. Transient
failures (connection errors, timeouts, HTTP 429 and 5xx) are retried with exponential backoff;
other HTTP errors are not (a wrong URL does not heal in a second). Webhook URLs are often secrets
(Slack's are): messages name only the scheme and host.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gradwatch import __version__
from gradwatch.errors import UsageError
from gradwatch.incidents import Note

__all__ = ["check_url", "generic_payload", "post_json", "slack_payload"]

#: Tries per delivery, and the pause before the second one (doubled before each further one).
ATTEMPTS = 3
BACKOFF_S = 0.5
TIMEOUT_S = 10.0
#: A Slack message lists this many notes, then says how many more there were.
SLACK_MAX_NOTES = 20


def check_url(url: str) -> None:
    """Refuse anything but an http(s) URL with a host, before any file is read."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or _port(parts) == -1:
        raise UsageError(f"--webhook must be an http:// or https:// URL with a host, got {_where(url)!r}")


def generic_payload(notes: list[Note]) -> dict[str, Any]:
    """`alerts`: per note, its alert's fields (with its incident id) plus `event` and `headline`."""
    return {"source": "gradwatch", "version": 1, "alerts": [n.to_json() for n in notes]}


def slack_payload(notes: list[Note]) -> dict[str, Any]:
    """One message: a line per note (severity, what happened, the incident, where, its headline)."""
    n = len(notes)
    lines = [f"gradwatch: {n} incident update{'s' if n != 1 else ''}"]
    for note in notes[:SLACK_MAX_NOTES]:
        a = note.alert
        step = f" step {a.step}" if a.step is not None else ""
        lines.append(f"• *{a.severity}* incident {note.event} `{a.detector}` {a.path}{step}: {note.headline}")
    if n > SLACK_MAX_NOTES:
        lines.append(f"… and {n - SLACK_MAX_NOTES} more")
    return {"text": _slack_escape("\n".join(lines))}


def _slack_escape(text: str) -> str:
    """Slack reads `<...>` as links and mentions: log-derived text must not create them."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def post_json(url: str, payload: dict[str, Any], timeout: float = TIMEOUT_S) -> str | None:
    """POST `payload`; returns None once a 2xx answer came, else why the last try failed."""
    body = json.dumps(payload, allow_nan=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": f"gradwatch/{__version__}"}
    error = ""
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read(1 << 16)
            return None
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code} {e.reason}"
            if e.code != 429 and e.code < 500:
                break
        except (urllib.error.URLError, OSError) as e:  # refused, DNS, TLS, timeout
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            error = str(reason) or type(reason).__name__
    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
    return f"webhook {_where(url)}: {error} ({tries})"


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
