"""The public API for plugins: what a detector or a parser needs, and nothing else.

Import from here only; every other gradwatch module is private and may change between versions.
`README.md`, section "Writing a detector", walks through `examples/plugins/` with it.

Records
    A detector receives a `Batch`: `batch.records` is a pandas DataFrame with the columns
    `COLUMNS` (`step`, the canonical `METRICS`, `ts`, `line`, `nonfinite`) in line order, then the
    extra metrics that registered parsers declared (`Parser.extra_metrics`). A metric a line did
    not log is NaN; a value printed as nan/inf is NaN too and named in `nonfinite`. DeepSpeed's
    cumulative `step=N, skipped=K` counters come as columns too: `batch.skip_counts` (`line`,
    `step`, `skipped`, numpy arrays in line order).

Detectors
    Subclass `Detector`: a snake_case `id` (also its config section `detectors.<id>`), a one-line
    `description`, a `Config` that is a frozen `DetectorConfig` dataclass with a default for every
    field (its YAML section is validated against it), and `update(batch) -> list[Alert]`, which
    builds alerts with `self.alert(...)`. Keep state in plain attributes: `gradwatch scan`
    pickles it between runs. Feeding a file in one batch or in many must give the same alerts;
    `prev_window_median` and `Incident` carry windows and incidents across batch edges.

Parsers
    Subclass `Parser`: a `name` (for `--format`), a `description`, a `scan` regex that finds a
    keyword of every line it reads (None: it sees every line, slower), and `parse(text, line, ts,
    out) -> bool`, which writes records with `out.record(self.name, step, line, ts, metrics)` and
    returns True for its own lines only. `collecting`/`flush` serve multi-line records. A file's
    format is the main parser that wrote the most records: that count is the sniff score.

Registration
    An installed package names its classes under the entry point groups `gradwatch.detectors` and
    `gradwatch.parsers`; a one-file plugin listed under `plugins:` in the config calls
    `register_detector`/`register_parser` (usable as decorators). Both check the class at once and
    raise `PluginError` naming the plugin and what does not fit.
"""

from gradwatch.alerts import Alert, Severity
from gradwatch.detectors import register as register_detector
from gradwatch.detectors.base import Detector, DetectorConfig, Incident, prev_window_median
from gradwatch.errors import PluginError
from gradwatch.parsers import register as register_parser
from gradwatch.parsers.base import ParseOutput, Parser
from gradwatch.parsers.stream import Batch
from gradwatch.records import COLUMNS, METRICS

__all__ = [
    "COLUMNS",
    "METRICS",
    "Alert",
    "Batch",
    "Detector",
    "DetectorConfig",
    "Incident",
    "ParseOutput",
    "Parser",
    "PluginError",
    "Severity",
    "prev_window_median",
    "register_detector",
    "register_parser",
]
