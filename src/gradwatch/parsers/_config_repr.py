"""A configuration printed as one Python repr into flat `dotted.key -> value as text` entries.

The FSDP trainers log their whole configuration on one line: OLMo `log.info(cfg)` prints its
dataclass (`TrainConfig(seed=6198, ..., fsdp=FSDPConfig(precision='pure', ...), ...)`), torchtitan
`Running with args: {job_config.to_dict()}` a dict of dicts (`{'training': {'mixed_precision_reduce':
'float32', ...}, ...}`). Nested configs become dotted keys (`fsdp.precision`,
`training.mixed_precision_reduce`), the way the trainers' own command lines name them; lists and
other values stay as printed. Not `ast`: a dataclass repr holds enum members (`<ShardingStrategy.
FULL_SHARD: 1>`) that are no Python, and a line cut short must still give what it holds.
"""

from __future__ import annotations

import re

#: what a top-level split needs to see: escapes, quotes, brackets and commas
_TOKEN = re.compile(r"\\.|['\"()\[\]{}<>,]")
_OPEN, _CLOSE = "([{<", ")]}>"
#: `name=value` (a dataclass) or `'name': value` (a dict)
_ENTRY = re.compile(r"^(?:([A-Za-z_]\w*)=|'([^']*)':\s*|\"([^\"]*)\":\s*)(.*)$", re.S)
#: a nested config: `Name(...)` or `{...}` (the closing bracket may be cut off with the line)
_NESTED = re.compile(r"^(?:[A-Za-z_][\w.]*\(|\{)(.*?)[)}]?$", re.S)
#: nesting deeper than this is kept as text (no config nests so deep; a garbled line may)
_MAX_DEPTH = 8


def _split(body: str) -> list[str]:
    """`body`'s items: split at the commas outside quotes and brackets."""
    items: list[str] = []
    depth, quote, start = 0, "", 0
    for m in _TOKEN.finditer(body):
        c = m.group()
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif c == "," and depth <= 0:
            items.append(body[start : m.start()])
            start = m.end()
    items.append(body[start:])
    return [item.strip() for item in items if item.strip()]


def flat_repr(body: str, prefix: str = "", depth: int = 0) -> dict[str, str]:
    """The entries of a repr's body (what is inside its outer brackets), nested ones dotted."""
    flat: dict[str, str] = {}
    for item in _split(body):
        m = _ENTRY.match(item)
        if m is None:
            continue
        key = prefix + next(k for k in m.groups()[:3] if k is not None)
        value = m.group(4).strip()
        nested = _NESTED.match(value) if depth < _MAX_DEPTH else None
        inner = flat_repr(nested.group(1), f"{key}.", depth + 1) if nested else {}
        if inner:
            flat.update(inner)
        elif value not in ("{}", "{"):  # (an empty dict says nothing)
            flat[key] = value
    return flat
