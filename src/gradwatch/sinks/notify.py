"""Run a user's command for an alert: `tail --on-alert CMD` and `scan --notify-cmd CMD`.

The contract: CMD is split with shlex by the caller and run directly, never through a shell (log
content reaches it, so no quoting can go wrong); the alert is one JSON object on stdin (the
fields of `check --output json`); the same facts are in `GRADWATCH_*` environment variables for
one-line commands; the command has `timeout` seconds, after which it and everything it started
(its own session) are killed. Its stdout is discarded; the last line of its stderr explains a
failure. A failure is returned, never raised: a broken pager must not stop the watching.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from gradwatch.alerts import Alert

__all__ = ["alert_env", "run_command"]


def alert_env(alert: Alert) -> dict[str, str]:
    """GRADWATCH_DETECTOR, _SEVERITY, _STEP, _LINE, _PATH, _METRIC, _VALUE, _MESSAGE, _HINT, _SNAPSHOT.

    A field without a value is an empty string.
    """
    fields = alert.to_json()
    names = ("detector", "severity", "step", "line", "path", "metric", "value", "message", "hint", "snapshot")
    return {f"GRADWATCH_{n.upper()}": "" if fields[n] is None else str(fields[n]).replace("\0", "") for n in names}


def run_command(argv: list[str], alert: Alert, timeout: float) -> str | None:
    """Run `argv` (not empty) for `alert`; returns None on success, else why it failed (one line)."""
    payload = json.dumps(alert.to_json()).encode()
    env = {**os.environ, **alert_env(alert)}
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
        lines = err.decode("utf-8", errors="replace").strip().splitlines()
        why = f": {lines[-1][:200]}" if lines else ""
        return f"{name} exited with status {proc.returncode}{why}"
    return None
