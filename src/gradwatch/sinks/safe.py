"""Log content is untrusted: strip what could drive a terminal before it is shown."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe_text(text: str) -> str:
    """Remove control characters (escape sequences, bells, carriage returns) from log text."""
    return _CONTROL.sub("", text)
