"""Notify-once: incident notes owed to notification sinks, kept until each sink has taken them.

Each change of an incident (opened, escalated, ended: `gradwatch.incidents.Note`) is owed once to
every sink configured when it happened. A delivery removes the sinks that took it; what is still
owed is saved in the state file and offered again by the next
scan, so nothing is lost and nothing is sent twice. The caller saves the owed list *before*
delivering: a scan killed mid-delivery then re-sends at most what was in flight, instead of
forgetting it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gradwatch.incidents import Note
from gradwatch.sinks.notify import run_command
from gradwatch.sinks.webhook import generic_payload, post_json, slack_payload

__all__ = ["CommandSink", "Delivery", "Owed", "Sink", "WebhookSink", "deliver", "note_key"]


def note_key(note: Note) -> str:
    """What makes a note the same one again (a log read anew after a config change): its incident,
    what happened to it, and the severity it reached."""
    return f"{note.incident} {note.event} {note.severity}"


@dataclass
class Owed:
    """A note and the names of the sinks that have not taken it yet."""

    note: Note
    sinks: set[str]


class Sink(Protocol):
    name: str

    def deliver(self, notes: list[Note]) -> list[str | None]:
        """Try to hand over `notes`; one outcome per note: None when taken, else why not."""
        ...


class CommandSink:
    """`--notify-cmd`: the command runs once per note.

    After a failure the remaining notes are not tried in this run: a pager that is down or hangs
    would otherwise cost a timeout per note. They stay owed.
    """

    name = "command"

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.argv, self.timeout = argv, timeout

    def deliver(self, notes: list[Note]) -> list[str | None]:
        outcomes: list[str | None] = []
        for note in notes:
            error = run_command(self.argv, note, self.timeout)
            outcomes.append(error)
            if error is not None:
                skipped = "not tried after the failure above"
                return outcomes + [skipped] * (len(notes) - len(outcomes))
        return outcomes


class WebhookSink:
    """`--webhook URL`: all notes in one POST."""

    name = "webhook"

    def __init__(self, url: str, fmt: str) -> None:
        self.url, self.fmt = url, fmt

    def deliver(self, notes: list[Note]) -> list[str | None]:
        payload = slack_payload(notes) if self.fmt == "slack" else generic_payload(notes)
        return [post_json(self.url, payload)] * len(notes)


@dataclass
class Delivery:
    """What one round of delivery did."""

    sent: int = 0  #: (note, sink) pairs handed over
    errors: list[str] = field(default_factory=list)  #: one message per failing sink


def deliver(owed: list[Owed], sinks: list[Sink]) -> Delivery:
    """Offer every owed note to the configured sinks that still owe it; drop what is done.

    Notes owed to a sink that is not configured in this run stay owed until one is.
    """
    result = Delivery()
    for sink in sinks:
        todo = [o for o in owed if sink.name in o.sinks]
        if not todo:
            continue
        outcomes = sink.deliver([o.note for o in todo])
        for o, error in zip(todo, outcomes, strict=True):
            if error is None:
                o.sinks.discard(sink.name)
                result.sent += 1
        first_error = next((e for e in outcomes if e is not None), None)
        if first_error is not None:
            failed = sum(e is not None for e in outcomes)
            kept = f"{failed} notification{'s' if failed != 1 else ''} kept for the next scan"
            result.errors.append(f"{sink.name}: {first_error} ({kept})")
    owed[:] = [o for o in owed if o.sinks]
    return result
