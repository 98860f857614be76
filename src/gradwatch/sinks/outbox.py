"""Notify-once: alerts owed to notification sinks, kept until each sink has taken them.

An incident is owed once to every sink configured when it was found. A delivery removes the
sinks that took it; what is still owed is saved in the state file and offered again by the next
scan, so nothing is lost and nothing is sent twice. The caller saves the owed list *before*
delivering: a scan killed mid-delivery then re-sends at most what was in flight, instead of
forgetting it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gradwatch.alerts import Alert
from gradwatch.sinks.notify import run_command
from gradwatch.sinks.webhook import generic_payload, post_json, slack_payload

__all__ = ["CommandSink", "Delivery", "Owed", "Sink", "WebhookSink", "deliver", "incident_key"]


def incident_key(alert: Alert) -> str:
    """One incident per (detector, step) of a file; the line stands in when there is no step."""
    where = f"step {alert.step}" if alert.step is not None else f"line {alert.line}"
    return f"{alert.detector} {where}"


@dataclass
class Owed:
    """An alert and the names of the sinks that have not taken it yet."""

    alert: Alert
    sinks: set[str]


class Sink(Protocol):
    name: str

    def deliver(self, alerts: list[Alert]) -> list[str | None]:
        """Try to hand over `alerts`; one outcome per alert: None when taken, else why not."""
        ...


class CommandSink:
    """`--notify-cmd`: the command runs once per alert.

    After a failure the remaining alerts are not tried in this run: a pager that is down or hangs
    would otherwise cost a timeout per alert. They stay owed.
    """

    name = "command"

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.argv, self.timeout = argv, timeout

    def deliver(self, alerts: list[Alert]) -> list[str | None]:
        outcomes: list[str | None] = []
        for alert in alerts:
            error = run_command(self.argv, alert, self.timeout)
            outcomes.append(error)
            if error is not None:
                skipped = "not tried after the failure above"
                return outcomes + [skipped] * (len(alerts) - len(outcomes))
        return outcomes


class WebhookSink:
    """`--webhook URL`: all alerts in one POST."""

    name = "webhook"

    def __init__(self, url: str, fmt: str) -> None:
        self.url, self.fmt = url, fmt

    def deliver(self, alerts: list[Alert]) -> list[str | None]:
        payload = slack_payload(alerts) if self.fmt == "slack" else generic_payload(alerts)
        return [post_json(self.url, payload)] * len(alerts)


@dataclass
class Delivery:
    """What one round of delivery did."""

    sent: int = 0  #: (alert, sink) pairs handed over
    errors: list[str] = field(default_factory=list)  #: one message per failing sink


def deliver(owed: list[Owed], sinks: list[Sink]) -> Delivery:
    """Offer every owed alert to the configured sinks that still owe it; drop what is done.

    Alerts owed to a sink that is not configured in this run stay owed until one is.
    """
    result = Delivery()
    for sink in sinks:
        todo = [o for o in owed if sink.name in o.sinks]
        if not todo:
            continue
        outcomes = sink.deliver([o.alert for o in todo])
        for o, error in zip(todo, outcomes, strict=True):
            if error is None:
                o.sinks.discard(sink.name)
                result.sent += 1
        first_error = next((e for e in outcomes if e is not None), None)
        if first_error is not None:
            failed = sum(e is not None for e in outcomes)
            kept = f"{failed} alert{'s' if failed != 1 else ''} kept for the next scan"
            result.errors.append(f"{sink.name}: {first_error} ({kept})")
    owed[:] = [o for o in owed if o.sinks]
    return result
