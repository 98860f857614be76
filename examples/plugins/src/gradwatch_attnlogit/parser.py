"""The log format of "attnlab", a made-up trainer that also logs its largest attention logit.

    2024-05-01 12:00:05 attnlab INFO it 10/2000 | loss 4.1234 | gnorm 1.234 | lr 3.00e-05 | attn_max 30.12

`attn_max` has no canonical name, so the parser declares it in `extra_metrics`: batches then carry
an `attn_logit_max` column for the detector in `detector.py`.
"""

from __future__ import annotations

import math
import re

from gradwatch.api import ParseOutput, Parser

#: attnlab's field names -> gradwatch's metric names
FIELDS = {"loss": "loss", "gnorm": "grad_norm", "lr": "lr", "attn_max": "attn_logit_max"}

_RECORD = re.compile(r"attnlab \w+ it (\d+)/\d+ \| (.*)")


class AttnlabParser(Parser):
    name = "attnlab"
    description = "attnlab `it N/M | loss X | gnorm G | lr L | attn_max A` lines (example plugin)"
    scan = r"attnlab "  # a keyword in every line this parser reads: the others are skipped unseen
    extra_metrics = ("attn_logit_max",)

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        m = _RECORD.search(text)
        if m is None:
            return False
        metrics: dict[str, float] = {}
        for field in m.group(2).split(" | "):
            key, _, value = field.partition(" ")
            if key in FIELDS:
                try:
                    metrics[FIELDS[key]] = float(value)
                except ValueError:  # a line cut short: keep the fields that are whole
                    continue
        nonfinite = [name for name, v in metrics.items() if not math.isfinite(v)]
        out.record(self.name, int(m.group(1)), line, ts, metrics, nonfinite)
        return True
