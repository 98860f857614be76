"""The run's configuration as its latest `config` events said it, key by key (`run_config.KEYS`).

Hints that name a setting (`fsdp_reduce_dtype`, DeepSpeed's loss-scale settings) read it here. It is
taken as of an alert's line, so that a config event later in the same batch never changes what an
alert says: a file read in one batch or in many gives the same hints.
"""

from __future__ import annotations

from typing import Any

from gradwatch.events import Event, EventKind


class LatestConfig:
    """Canonical keys of the config events seen so far, the latest value of each."""

    def __init__(self) -> None:
        self.told: dict[str, Any] = {}  # the events of earlier batches, folded
        self._batch: list[Event] = []  # this batch's config events, in line order

    def read(self, events: list[Event]) -> None:
        """A new batch's events: the last batch's config events are folded in, this one's kept apart."""
        for ev in self._batch:
            self.told.update(config_of(ev))
        self._batch = [ev for ev in events if ev.kind is EventKind.CONFIG]

    def at(self, line: int | None) -> dict[str, Any]:
        """The configuration as the log had said it by `line` (None: by the end of the batch)."""
        told = dict(self.told)
        for ev in self._batch:
            if line is None or ev.line <= line:
                told.update(config_of(ev))
        return told


def config_of(ev: Event) -> dict[str, Any]:
    """The canonical keys of a config event (an event without them, from a plugin: none)."""
    config = ev.data.get("config")
    return config if isinstance(config, dict) else {}
