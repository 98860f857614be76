"""Run a user's command for an incident: `tail --on-alert CMD` and `scan --notify-cmd CMD`.

The contract: CMD is split with shlex by the caller and run directly, never through a shell (log
content reaches it, so no quoting can go wrong); it runs when an incident opens, escalates and
ends (`gradwatch.incidents.Note`), with one JSON object on stdin: the fields of the alert that
opened or escalated it (its lead alert when it ends) as `check --output json` gives them, plus
`event` and `headline` (JSON escapes every control character); the same facts are in
`GRADWATCH_*` environment variables for one-line commands, made inert like everything gradwatch
shows (`safe_text`: a command that echoes GRADWATCH_MESSAGE cannot drive the terminal); the command
has `timeout` seconds, after which it and everything it started (its own session) are killed.
Its stdout is discarded; the last line of its stderr, escaped the same way, explains a failure.
A failure is returned, never raised: a broken pager must not stop the watching.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from gradwatch.incidents import Note
from gradwatch.sinks.safe import safe_text

__all__ = ["note_env", "run_command"]

#: The fields that are also environment variables (GRADWATCH_ and the name in capitals).
ENV_FIELDS = (
    "event",
    "incident",
    "headline",
    "detector",
    "severity",
    "step",
    "line",
    "path",
    "metric",
    "value",
    "message",
    "hint",
    "snapshot",
)


def note_env(note: Note) -> dict[str, str]:
    """GRADWATCH_EVENT, _INCIDENT, _HEADLINE, _DETECTOR, _SEVERITY, _STEP, _LINE, _PATH, _METRIC,
    _VALUE, _MESSAGE, _HINT, _SNAPSHOT, each one line of inert text. A field without a value is an
    empty string."""
    fields = note.to_json()
    return {
        f"GRADWATCH_{n.upper()}": "" if fields[n] is None else safe_text(str(fields[n]), "line") for n in ENV_FIELDS
    }


def run_command(argv: list[str], note: Note, timeout: float) -> str | None:
    """Run `argv` (not empty) for `note`; returns None on success, else why it failed (one line)."""
    payload = json.dumps(note.to_json()).encode()
    env = {**os.environ, **note_env(note)}
    name = argv[0]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except (OSError, ValueError) as e:  # not found, not executable, a NUL byte in an argument
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"cannot run {name}: {reason}"
    try:
        _, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"{name} did not finish within {timeout:g} s and was killed"
    if proc.returncode != 0:
        lines = safe_text(err.decode("utf-8", errors="replace")).strip().splitlines()
        why = f": {lines[-1].strip()[:200]}" if lines else ""
        return f"{name} exited with status {proc.returncode}{why}"
    return None
