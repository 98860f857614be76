"""Log content is untrusted: strip what could drive a terminal before it is shown."""

from __future__ import annotations

import re

#: C0/C1 controls, and the bidirectional overrides and isolates that reorder what follows them
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe_text(text: str) -> str:
    """Remove control characters (escape sequences, bells, carriage returns, bidi overrides)
    from log text."""
    return _CONTROL.sub("", text)
