"""What a run was told at its start: trainers' configuration blocks as `config` events.

Block shapes read (each from its first line to its end, one event per block):

    ------------------------ arguments ------------------------     Megatron (all forks)
      fp16 ............................................ True
    -------------------- end of arguments ---------------------
    [...] [INFO] [config.py:904:print] DeepSpeedEngine configuration:       DeepSpeed's engine
    [...] [INFO] [config.py:904:print]   fp16_enabled ................. True
    [...] [INFO] [config.py:906:print]   json = {                            and the user's JSON
        "fp16": {
            "initial_scale_power": 12, ...
    }
    Training/evaluation parameters TrainingArguments(output_dir=..., fp16=True, ...)   Hugging Face
    TrainingArguments(                                                     (or one `key=value,`
    _n_gpu=1,                                                               a line, up to `)`)
    ... train:89  INFO  TrainConfig(run_name='x', ..., fsdp=FSDPConfig(precision='pure'), ...)  OLMo
    ExperimentConfig(                                                  OLMo-core's rich.print(config)
        train_module=TransformerTrainModuleConfig(
            dp_config=TransformerDataParallelConfig(reduce_dtype=<DType.float32: 'float32'>, ...
    ... - root - INFO - Running with args: {'job': {...}, 'training': {...}, ...}      torchtitan
    ... torch.distributed.launcher.api: [INFO] Starting elastic_operator with launch configs:
    ... torch.distributed.launcher.api: [INFO]   max_nodes        : 32          torchrun (nodes)
    [NeMo I 2023-01-18 07:39:41 megatron_gpt_pretraining:36]                 NeMo's YAML
        ************** Experiment configuration ***********
    [NeMo I 2023-01-18 07:39:41 megatron_gpt_pretraining:37]
        trainer:
          num_nodes: 4

An entry is `key .... value` (Megatron pads keys with dots; DeepSpeed too, or with two spaces
where the key is long), a JSON member, or `key=value`. Lines may carry launcher prefixes (`clean`
strips them) and logger headers (stripped here); OLMo's and torchtitan's one-line reprs are
flattened to dotted keys (`_config_repr`), NeMo's YAML keyed by its nesting; torchrun's `key : value`
lines and NeMo's YAML end at the first line not theirs. A value that goes on over several lines (an
open `{`/`[`, a long path hard-wrapped by a terminal) is joined. Lines of other processes printed in
between are left to the other parsers; a block ends at its end line, at the next block's first, at
a line of which another parser made a record or an event, or after `_MAX_OTHER` lines not its own
in a row (a block the log cut short); the lines outside blocks cost nothing but the stream's
keyword search. (A block cut short is written when it ends: where the stream hands on what it read
between its last line and the line that ended it, the events of those lines come in a batch before
its own.) Several ranks printing the same block before any record is one start: a copy whose
canonical keys agree with the latest event's of its shape is not reported again.
"""

from __future__ import annotations

import re
from typing import Any

from gradwatch.events import EventKind
from gradwatch.parsers._config_keys import canonical
from gradwatch.parsers._config_repr import flat_repr
from gradwatch.parsers.base import ParseOutput, Parser

_MEGATRON_START = re.compile(r"-{3,} arguments -{3,}")
_MEGATRON_END = re.compile(r"-{3,} end of arguments -{3,}")
_DEEPSPEED_START = "DeepSpeedEngine configuration"
_DEEPSPEED_JSON = re.compile(r"^\s*json = \{\s*$")
_HF_START = "TrainingArguments("
#: OLMo's `log.info(cfg)`: the dataclass repr (`TrainConfig(run_name=...`; OLMo-core's scripts'
#: `ExperimentConfig(`) as a message (at the line's start, after `INFO` or its rich handler's
#: `[train:89, rank=0] `), not code that builds one
_OLMO_START = re.compile(r"(?:^|\bINFO\s+|\] )(?:Train|Experiment)Config\((?=\w+=)")
#: the same repr pretty-printed over many lines (OLMo-core's `rich.print(config)`): the class alone
_OLMO_MULTILINE = re.compile(r"^(?:Train|Experiment)Config\($")
#: torchtitan's `Running with args: {job_config.to_dict()}` (`--job.print_args`)
_TITAN_START = re.compile(r"Running with args: \{")
#: source, where its repr's body begins, a word to look for first, the repr's closing bracket
_ONE_LINE_REPRS = (
    ("olmo-config", _OLMO_START, "Config(", ")"),
    ("torchtitan-config", _TITAN_START, "Running with args", "}"),
)
_TORCHRUN_START = "Starting elastic_operator with launch configs"
#: NeMo's `logging.info("\n\n************** Experiment configuration ***********")` before its YAML
_NEMO_START = re.compile(r"\*{5,} Experiment configuration \*{5,}")
#: a YAML line as `OmegaConf.to_yaml` prints it: `  key: value`, `  key:` (a mapping or list follows)
#: or `  - item`
_YAML_LINE = re.compile(r"^( *)(?:- (.*?)|([^\s:][^:]*?):(?: (.*?))?)\s*$")
#: torchrun's `  min_nodes        : 2` (after its logger header, if each line has one)
_COLON_ENTRY = re.compile(r"(?:^|[\]:])\s+([a-z_]+) +: (.*?)\s*$")
#: a line of code, not a message: `args = TrainingArguments(` (a traceback's source line)
_CODE = re.compile(r"[=(,.]\s*\w*$")
#: a logger's header: `[2021-06-10 20:47:51,885] [INFO] [config.py:904:print] ` (its first bracket
#: may be cut: `10 20:47:51,886] [INFO] ...`), Python's `INFO:__main__:`, an ISO time stamp
_HEADER = re.compile(
    r"^(?:(?:[^\[\]]*\] ?)?(?:\[[^\[\]]*\] ?)+|[A-Z]+:[\w.]+:|\d{4}-\d\d-\d\d[T ][\d:.,]+Z? (?:- [A-Z]+ - [\w.]+ - )?)"
)
#: `  key ..... value`, `key ....` (empty value), and `  long_key  value` where the key leaves no
#: room for dots (Megatron pads to 48 characters, DeepSpeed to 29: no record's word is that long)
_DOTTED = re.compile(r"^\s*([A-Za-z_]\w*) (?:\.+ ?|(?<=\w{24} ) (?=\S))(.*?)\s*$")
_JSON_MEMBER = re.compile(r'^"([^"]+)":\s*(.*?),?$')
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*?),?$")
#: where each `key=` of a one-line `TrainingArguments(...)` begins
_INLINE_KEY = re.compile(r"(?:^|, )([A-Za-z_]\w*)=")
#: lines of other processes in a row after which a block is taken as ended (the log cut it short)
_MAX_OTHER = 20
#: lines after which a block ends whatever they are (Megatron prints some 500 arguments)
_MAX_LINES = 5000
#: a line at least this long may have been hard-wrapped onto the next
_WRAP_WIDTH = 60


def _depth(text: str) -> int:
    return sum(text.count(c) for c in "{[(") - sum(text.count(c) for c in "}])")


def _payload(text: str) -> tuple[str, bool]:
    """The text after a logger's header, and whether there was one."""
    m = _HEADER.match(text)
    return (text[m.end() :], True) if m and m.end() else (text, False)


class _Block:
    """One block being read: its entries as printed, keyed as the block names them."""

    def __init__(self, source: str, line: int, step: int | None, ts: float | None) -> None:
        self.source = source
        self.line, self.step, self.ts = line, step, ts
        self.raw: dict[str, str] = {}
        self.lines = 0
        self.other = 0  # lines of other processes in a row
        self._key: str | None = None  # the latest entry, whose value may go on
        self._depth = 0  # brackets its value left open
        self._last_len = 0  # length of the block's latest line

    def read(self, text: str) -> bool | None:
        """Read one line: True, the block's; False, another process's; None, the block's last."""
        self.lines += 1
        taken = self._entry(text)
        if taken is False:
            self.other += 1
        else:
            self.other = 0
            self._last_len = len(text)
        return taken

    @property
    def worn_out(self) -> bool:
        """Whether the block is taken as ended: the log cut it short, or it was none."""
        return self.other > _MAX_OTHER or self.lines > _MAX_LINES

    def _entry(self, text: str) -> bool | None:
        raise NotImplementedError

    def _add(self, key: str, value: str) -> None:
        self.raw[key] = value
        self._key, self._depth = key, _depth(value)

    def _goes_on(self, text: str, headed: bool) -> bool:
        """Whether `text` goes on with the latest entry's value (and join it): an open bracket, or
        a piece without spaces after a line long enough to have been wrapped (a long path)."""
        piece = text.strip()
        if self._key is None or headed or not piece:
            return False
        wrapped = self._last_len >= _WRAP_WIDTH and " " not in piece and any(c.isalnum() for c in piece)
        if self._depth <= 0 and not wrapped:
            return False
        joined = self.raw[self._key]
        self.raw[self._key] = f"{joined} {piece}" if self._depth > 0 else joined + piece
        self._depth += _depth(piece)
        return True


class _DottedBlock(_Block):
    """Megatron's arguments and DeepSpeed's engine configuration: `key .... value` lines."""

    def __init__(self, source: str, line: int, step: int | None, ts: float | None, end: re.Pattern[str] | None):
        super().__init__(source, line, step, ts)
        self._end = end

    def _entry(self, text: str) -> bool | None:
        if self._end is not None and self._end.search(text):
            return None
        payload, headed = _payload(text)
        m = _DOTTED.match(payload)
        # (inside an open value only a headed or dotted line is a new entry, not `  "a"  1`)
        if m and (headed or self._depth <= 0 or payload[m.end(1) + 1 : m.end(1) + 2] == "."):
            self._add(m.group(1), m.group(2))
            return True
        return self._goes_on(payload, headed)


class _JsonBlock(_Block):
    """DeepSpeed's `json = {` config, as `json.dumps(indent=4)` prints it: members keyed by
    their dotted path (`fp16.initial_scale_power`); arrays kept as text."""

    def __init__(self, source: str, line: int, step: int | None, ts: float | None) -> None:
        super().__init__(source, line, step, ts)
        self._path: list[str] = []

    def _entry(self, text: str) -> bool | None:
        payload, headed = _payload(text)
        if headed:  # a logged line inside the JSON is another process's
            return False
        if self._depth > 0:  # an array's elements
            return self._goes_on(payload, headed)
        piece = payload.strip()
        m = _JSON_MEMBER.match(piece)
        if m:
            key, value = m.group(1), m.group(2).strip()
            if value == "{":
                self._path.append(key)
            else:
                self._add(".".join([*self._path, key]), value.strip('"'))
            return True
        if piece in ("}", "},"):
            if not self._path:
                return None
            self._path.pop()
            return True
        return False


class _ColonBlock(_Block):
    """torchrun's launch configs: `  key  : value` lines, up to the first line that is none."""

    @property
    def worn_out(self) -> bool:
        return super().worn_out or self.other > 0

    def _entry(self, text: str) -> bool | None:
        m = _COLON_ENTRY.search(text)
        if m is None:
            return False
        self._add(m.group(1), m.group(2))
        return True


class _YamlBlock(_Block):
    """NeMo's experiment configuration: `OmegaConf.to_yaml(cfg)` logged as one message, its lines
    indented under the logger's header; keys are dotted by their nesting (`trainer.num_nodes`), list
    items joined into their key's value. It ends at the next message (a line not indented)."""

    def __init__(self, source: str, line: int, step: int | None, ts: float | None) -> None:
        super().__init__(source, line, step, ts)
        self._path: list[tuple[int, str]] = []  # (indent, key) of the mappings the next line is in
        self._items: list[str] = []  # the open list's items

    @property
    def worn_out(self) -> bool:
        return super().worn_out or self.other > 0

    def _entry(self, text: str) -> bool | None:
        if not text[:1].isspace():  # the YAML message's own header (empty), else the next message
            return not self.raw and not _payload(text)[0].strip()
        m = _YAML_LINE.match(text.rstrip())
        if m is None:
            return not text.strip()
        indent, item, key, value = len(m.group(1)), m.group(2), m.group(3), m.group(4)
        if item is not None:
            if self._path:
                self._items.append(item)
                self.raw[self._dotted()] = f"[{', '.join(self._items)}]"
            return True
        while self._path and self._path[-1][0] >= indent:
            self._path.pop()
        self._path.append((indent, key.strip()))
        self._items = []
        if value:
            self.raw[self._dotted()] = value
            self._path.pop()
        return True

    def _dotted(self) -> str:
        return ".".join(key for _, key in self._path)


class _ReprBlock(_Block):
    """A dataclass repr pretty-printed one field a line, nested fields indented (rich's pretty
    printer), up to the bracket that closes it: flattened as its one-line form is (`flat_repr`)."""

    def __init__(self, source: str, line: int, step: int | None, ts: float | None) -> None:
        super().__init__(source, line, step, ts)
        self._body: list[str] = []
        self._open = 1  # brackets open: the class's own

    def _entry(self, text: str) -> bool | None:
        payload, headed = _payload(text)
        if headed:  # a logged line printed into the repr is another process's
            return False
        piece = payload.strip()
        self._open += _depth(piece)
        if self._open <= 0:
            piece = piece.removesuffix(")")
        self._body.append(piece)
        if self._open <= 1:  # a top-level field is complete: the entries so far
            self.raw = flat_repr(" ".join(self._body))
        return None if self._open <= 0 else True


class _CallBlock(_Block):
    """The Hugging Face `TrainingArguments(` repr printed one `key=value,` a line, up to `)`."""

    @property
    def worn_out(self) -> bool:
        """Also when the line after `TrainingArguments(` is no `key=value,` (code in a traceback)."""
        return super().worn_out or (self.other > 0 and not self.raw)

    def _entry(self, text: str) -> bool | None:
        payload, headed = _payload(text)
        piece = payload.strip()
        if piece == ")" and self._depth <= 0:
            return None
        m = None if headed else _ASSIGN.match(piece)
        if m and self._depth <= 0:
            self._add(m.group(1), m.group(2))
            return True
        return self._goes_on(payload, headed)


def inline_arguments(text: str) -> dict[str, str]:
    """`key=value, key=value, ...)` as printed on one line (values may hold `, ` themselves)."""
    keys = list(_INLINE_KEY.finditer(text))
    raw: dict[str, str] = {}
    for m, after in zip(keys, [*keys[1:], None], strict=False):
        value = text[m.end() : after.start() if after is not None else len(text)].strip()
        if after is None and value.endswith(")"):
            value = value[:-1]
        raw[m.group(1)] = value
    return raw


class ConfigParser(Parser):
    name = "config"
    description = (
        "configuration blocks printed at a start: Megatron arguments, DeepSpeed config and JSON, "
        "HF TrainingArguments, OLMo's TrainConfig, torchtitan's args, torchrun's launch configs, NeMo's YAML "
        "(events only)"
    )
    scan = (
        r"-- arguments --|DeepSpeedEngine configuration|TrainingArguments\(|(?:Train|Experiment)Config\("
        r"|Running with args: \{|elastic_operator with launch configs|Experiment configuration \*"
    )
    auxiliary = True
    segment_safe = True

    def __init__(self) -> None:
        self._block: _Block | None = None
        self._seen: tuple[int, str] | None = None  # the latest line read (the stream may offer it twice)
        #: per source, the latest event's config and the latest record's line when it was written
        self._latest: dict[str, tuple[dict[str, Any], int, int]] = {}

    @property
    def collecting(self) -> bool:
        return self._block is not None

    def carried(self, out: ParseOutput) -> tuple[object, ...] | None:
        """The latest events that a copy printed by another rank before the next record would
        repeat (`_write`): a warm-up may not reach back to them."""
        live = tuple((s, line) for s, (_, rec, line) in self._latest.items() if rec == out.last_record_line)
        return live or None

    def parse(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        if self._seen == (line, text):  # offered again after this parser left it (see LogStream)
            return False
        self._seen = (line, text)
        if self._block is not None and self._others_wrote(self._block, out):
            self._close(out)  # the block ended before the line of that record or event
        return self._read(text, line, ts, out)

    def _read(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool:
        opened = self._open(text, line, ts, out)
        if opened is not None:
            return opened
        block = self._block
        if block is None:
            return False
        if block.source == "deepspeed-config" and _DEEPSPEED_JSON.match(_payload(text)[0]):
            self._close(out)
            self._block = _JsonBlock("deepspeed-json", line, out.last_step, ts)
            return True
        taken = block.read(text)
        if taken is None or block.worn_out:
            self._close(out)
        return taken is not False

    @staticmethod
    def _others_wrote(block: _Block, out: ParseOutput) -> bool:
        """Whether another parser made a record or an event of a line after the block's first
        (records read in bulk before it may be written later: their lines come before it)."""
        return out.last_record_line > block.line or (bool(out.events) and out.events[-1].line > block.line)

    def flush(self, out: ParseOutput) -> None:
        """The log ends inside a block: what it held is still what the run was told."""
        if self._block is not None:
            self._close(out)

    def _open(self, text: str, line: int, ts: float | None, out: ParseOutput) -> bool | None:
        """Begin the block whose first line `text` is, closing one still open: True when it does
        (False: a one-line block that read nothing), None when `text` begins none."""
        if "arguments" in text and _MEGATRON_START.search(text):
            block: _Block = _DottedBlock("megatron-args", line, out.last_step, ts, _MEGATRON_END)
        elif _DEEPSPEED_START in text:
            block = _DottedBlock("deepspeed-config", line, out.last_step, ts, None)
        elif _TORCHRUN_START in text:
            block = _ColonBlock("torchrun-launch", line, out.last_step, ts)
        elif "Experiment configuration" in text and _NEMO_START.search(text):
            block = _YamlBlock("nemo-yaml", line, out.last_step, ts)
        elif "Config(" in text and _OLMO_MULTILINE.match(_payload(text)[0].strip()):
            block = _ReprBlock("olmo-config", line, out.last_step, ts)
        elif _HF_START in text:
            at = text.index(_HF_START)
            rest = text[at + len(_HF_START) :].strip()
            if _CODE.search(text[:at]):
                return None
            block = _CallBlock("hf-training-args", line, out.last_step, ts)
            if rest:  # all on this line (or cut short by another line printed into it)
                return self._one_line(block, inline_arguments(rest), out)
        else:
            one_line = self._one_line_repr(text, line, ts, out)
            if one_line is None:
                return None
            return self._one_line(*one_line, out)
        if self._block is not None:
            self._close(out)
        self._block = block
        return True

    @staticmethod
    def _one_line_repr(
        text: str, line: int, ts: float | None, out: ParseOutput
    ) -> tuple[_Block, dict[str, str]] | None:
        """OLMo's or torchtitan's configuration printed as one repr on `text`, if it is one."""
        for source, start, marker, close in _ONE_LINE_REPRS:
            m = start.search(text) if marker in text else None
            if m is not None:
                body = text[m.end() :].strip().removesuffix(close)
                return _Block(source, line, out.last_step, ts), flat_repr(body)
        return None

    def _one_line(self, block: _Block, raw: dict[str, str], out: ParseOutput) -> bool:
        """Write a block printed on one line: True when it read something."""
        if self._block is not None:
            self._close(out)
        block.raw = raw
        self._write(block, out)
        return bool(raw)

    def _close(self, out: ParseOutput) -> None:
        block, self._block = self._block, None
        if block is not None:
            self._write(block, out)

    def _write(self, block: _Block, out: ParseOutput) -> None:
        """One event for the block, unless it holds nothing or repeats the latest of its source."""
        if not block.raw:
            return
        config = canonical(block.source, block.raw)
        latest = self._latest.get(block.source)
        if latest is not None and latest[1] == out.last_record_line and _agree(latest[0], config):
            return  # another rank's copy of the same start (perhaps cut short by a line printed into it)
        self._latest[block.source] = (config, out.last_record_line, block.line)
        out.event(EventKind.CONFIG, block.line, block.step, block.ts, config=config, raw=block.raw, source=block.source)
        _keep_in_line_order(out)


def _agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two configs say the same of every key both hold."""
    return all(a[key] == b[key] for key in a.keys() & b.keys())


def _keep_in_line_order(out: ParseOutput) -> None:
    """Move the event just written (at its block's first line) before those of later lines that
    other parsers wrote while the block was read."""
    events = out.events
    k = len(events) - 1
    while k > 0 and events[k - 1].line > events[-1].line:
        k -= 1
    if k != len(events) - 1:
        events.insert(k, events.pop())
