"""Notify-once: incident notes owed to notification sinks, kept until each sink has taken them.

Each change of an incident (opened, escalated, ended: `gradwatch.incidents.Note`) is owed once to
every sink configured when it happened. What is owed is saved in the state file *before* any
delivery and offered again by the next scan until taken, so nothing is lost. Each note a sink
takes is written to the journal (`gradwatch.sinks.journal`) at once, and a note the journal lists
is never offered to that sink again, whatever the state says: a scan killed mid-delivery sends
again at most the one note that was in flight, and a lost state sends nothing again.

One round of delivery has one deadline for every sink, note and retry (`--notify-timeout`), so
the state lock is never held across network I/O for longer; a sink that fails is not tried
again in this round (a pager that is down would cost a timeout per note). What is left stays owed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from gradwatch.incidents import Note
from gradwatch.sinks.journal import Journal, idempotency_key, note_key
from gradwatch.sinks.notify import run_command
from gradwatch.sinks.webhook import generic_payload, post_json, slack_payload

__all__ = ["CommandSink", "Delivery", "Owed", "Sink", "WebhookSink", "deliver", "note_key"]


@dataclass
class Owed:
    """A note and the names of the sinks that have not taken it yet."""

    note: Note
    sinks: set[str]


class Sink(Protocol):
    name: str

    def send(self, note: Note, timeout: float) -> str | None:
        """Hand `note` over within `timeout` seconds; None when taken, else why not (one line)."""
        ...


class CommandSink:
    """`--notify-cmd`: the command runs once per note."""

    name = "command"

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    def send(self, note: Note, timeout: float) -> str | None:
        return run_command(self.argv, note, timeout)


class WebhookSink:
    """`--webhook URL`: one POST per note, with its idempotency key."""

    name = "webhook"

    def __init__(self, url: str, fmt: str) -> None:
        self.url, self.fmt = url, fmt

    def send(self, note: Note, timeout: float) -> str | None:
        payload = slack_payload(note) if self.fmt == "slack" else generic_payload(note)
        return post_json(self.url, payload, timeout, key=idempotency_key(note))


@dataclass
class Delivery:
    """What one round of delivery did."""

    sent: int = 0  #: (note, sink) pairs handed over
    errors: list[str] = field(default_factory=list)  #: one message per failing sink


def deliver(owed: list[Owed], sinks: list[Sink], journal: Journal, timeout: float) -> Delivery:
    """Offer every owed note to the configured sinks that still owe it, within `timeout` seconds
    in all; drop what is done. Notes owed to a sink that is not configured in this run stay owed
    until one is."""
    result = Delivery()
    end = time.monotonic() + timeout
    for sink in sinks:
        failure, kept = None, 0
        for o in [o for o in owed if sink.name in o.sinks]:
            if journal.took(o.note, sink.name):
                o.sinks.discard(sink.name)  # taken before a crash that kept it from the state
                continue
            if failure is None:
                left = end - time.monotonic()
                failure = sink.send(o.note, left) if left > 0 else f"not tried: the {timeout:g} s deadline had passed"
                if failure is None:
                    o.sinks.discard(sink.name)
                    result.sent += 1
                    _record(journal, o.note, sink.name, result)
                    continue
            kept += 1
        if failure is not None:
            result.errors.append(
                f"{sink.name}: {failure} ({kept} notification{'s' if kept != 1 else ''} kept for the next scan)"
            )
    owed[:] = [o for o in owed if o.sinks]
    return result


def _record(journal: Journal, note: Note, sink: str, result: Delivery) -> None:
    """Journal a delivery; one that cannot be journaled is still done (the state says so), but a
    lost state would send it again: say so once."""
    try:
        journal.record(note, sink)
    except OSError as e:
        problem = f"journal: cannot append to {journal.path}: {e.strerror or e} (a lost state would send again)"
        if problem not in result.errors:
            result.errors.append(problem)
