"""The command line: thin wiring from options to the pipeline; no logic lives here.

Heavy modules (pandas, numpy, rich tables) are imported inside the commands so that `--help`,
`--version` and usage errors answer instantly.
"""

from __future__ import annotations

import errno
import gc
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gradwatch import __version__
from gradwatch.errors import ExitCode, GradwatchError, InputError
from gradwatch.plugins import failures as plugin_failures
from gradwatch.sinks.safe import safe_text

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from gradwatch.config import Settings
    from gradwatch.plots.series import RunSeries
    from gradwatch.sinks.report import Report
    from gradwatch.sinks.snapshot import SnapshotWriter

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML file overriding the defaults key by key. Without it: $GRADWATCH_CONFIG, else gradwatch.yaml "
    "or [tool.gradwatch] in pyproject.toml here or in a parent folder (up to the repository's root), else "
    "~/.config/gradwatch/config.yaml; `gradwatch config show` says which.",
)
SNAPSHOT_OPTION = click.option(
    "--snapshot-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Write one JSON file of evidence per warning or critical alert into DIR (created if missing): "
    "recent records, the raw lines around it, the detector's settings, recent events. Limits: the "
    "`snapshots:` config section.",
)
PREVIOUS_OPTION = click.option(
    "--previous",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="OLD_LOG",
    help="The log of the job before (one log file per job): the first start of each file is audited as "
    "a restart of the run OLD_LOG left (precision, optimizer state, LR, consumed samples, seed, data).",
)
#: `--output` formats for CI (sinks/ci.py), for check and scan.
CI_OUTPUTS = ("junit", "github", "markdown")
CI_OUTPUTS_HELP = (
    "junit: JUnit XML; github: GitHub Actions annotations; "
    "markdown: tables, also appended to $GITHUB_STEP_SUMMARY when set."
)
RUN_OPTION = click.option(
    "--run",
    "run_name",
    default=None,
    metavar="NAME",
    help="The files are one run named NAME (rank files, per-node outputs, successive jobs): an alert "
    "that several of them print for the same step is one alert naming them, and incidents are the run's.",
)


class Seconds(click.FloatRange):
    """A duration option: a finite number in its range (`--lock-wait nan` would wait forever,
    and `inf` is no time)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


#: Log paths: files are offered when completing them in a shell.
PATHS_ARGUMENT = click.argument("paths", nargs=-1, required=True, type=click.Path())
EXCLUDE_OPTION = click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Leave out files whose name, a folder on their path (from the directory or glob given on) or the "
    "end of their path matches GLOB (repeatable), e.g. --exclude '*.txt' --exclude old.",
)


def _complete_detectors(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of the last name in a comma-separated list of detector ids."""
    from gradwatch.detectors import DETECTORS

    done, _, last = incomplete.rpartition(",")
    return [f"{done},{d}" if done else d for d in DETECTORS if d.startswith(last)]


SELECT_OPTION = click.option(
    "--select",
    multiple=True,
    metavar="DETECTOR,...",
    shell_complete=_complete_detectors,
    help="Run only these detectors (comma-separated or repeated; ids from `gradwatch detectors`), "
    "whatever `enabled:` says in the config.",
)
IGNORE_OPTION = click.option(
    "--ignore",
    multiple=True,
    metavar="DETECTOR,...",
    shell_complete=_complete_detectors,
    help="Leave out these detectors (comma-separated or repeated), e.g. --ignore loss_plateau,stall.",
)


def _settings(config_path: str | None, select: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> Settings:
    """The configuration of a command (`--config`, else the one found: `gradwatch.config_discovery`),
    with the detectors `--select` and `--ignore` chose."""
    from gradwatch.config import choose_detectors
    from gradwatch.config_discovery import load_settings

    return choose_detectors(load_settings(config_path), _names(select), _names(ignore))


def _names(values: tuple[str, ...]) -> list[str]:
    """The names of a repeatable, comma-separated option."""
    return [name for value in values for name in _split(value) or ()]


def _note(message: str) -> None:
    click.echo(f"note: {safe_text(message)}", err=True)


_EXAMPLES = "\b\nExamples:"


class _Command(click.Command):
    """Help that ends with the docstring's Examples block, after the options: where the eye lands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        text = inspect.cleandoc(self.help or "")
        if _EXAMPLES in text and not self.epilog:
            head, examples = text.split(_EXAMPLES, 1)
            self.help, self.epilog = head.rstrip(), _EXAMPLES + examples

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first sentence whole: a group's command list wraps it rather than cut it to `...`."""
        return super().get_short_help_str(limit=sys.maxsize)


class _Group(_Command, click.Group):
    command_class = _Command
    group_class = type  # subgroups are _Group too

    def main(self, *args: Any, **kwargs: Any) -> Any:  # one place turns our errors into exit codes
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except SystemExit as e:
            sys.exit(_with_plugin_failures(e.code))
        except GradwatchError as e:
            click.echo(f"error: {safe_text(str(e))}", err=True)
            sys.exit(int(e.exit_code))
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            e.show()
            sys.exit(int(ExitCode.USAGE))
        except BrokenPipeError:
            # output piped into `head` that closed early: not a crash (pytest does the same)
            _drop_stdout()
            sys.exit(1)
        except OSError as e:  # stdout on a full disk; files read or written have messages of their own
            if e.filename is None and e.errno in _OUTPUT_FULL:
                _drop_stdout()  # or the exit's flush of what it still holds fails again, with a traceback
                where = "cannot write the output: "
            else:
                where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {safe_text(where)}{e.strerror or e}", err=True)
            sys.exit(int(ExitCode.USAGE))
        except KeyboardInterrupt:
            sys.exit(130)
        if plugin_failures.any_failed():
            sys.exit(int(ExitCode.USAGE))
        return result


#: errors of a write with no file named: the output's (stdout's) disk or quota is full
_OUTPUT_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the exit's flush of what it still holds fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _report_output_option(help_text: str) -> Callable[[F], F]:
    """`--output` of the commands that end with a report (check, scan)."""
    return click.option(
        "--output",
        type=click.Choice(["text", "json", *CI_OUTPUTS]),
        default="text",
        show_default=True,
        help=help_text + CI_OUTPUTS_HELP,
    )


def _complete_formats(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`--format` completes to the names of the formats, built in and installed as plugins."""
    from click.shell_completion import CompletionItem

    from gradwatch.parsers import PARSERS
    from gradwatch.plugins import loader

    loader.load_installed()
    return [CompletionItem(name, help=cls.description) for name, cls in PARSERS.items() if name.startswith(incomplete)]


def _text_output_options(command: F) -> F:
    """`--color` and `--width` of the commands that print text; set for the console as they
    parse (`commands/text_output.py`), not passed to the command."""

    def chosen(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        from gradwatch.commands import text_output

        text_output.configure(**{str(param.name): value})
        return value

    color = click.option(
        "--color",
        type=click.Choice(["auto", "always", "never"]),
        default="auto",
        show_default=True,
        expose_value=False,
        callback=chosen,
        help="auto: colour on a terminal unless NO_COLOR is set (FORCE_COLOR: in pipes too); "
        "always: also into pipes and files (CI logs); never.",
    )
    width = click.option(
        "--width",
        type=click.IntRange(min=20),
        default=None,
        metavar="N",
        expose_value=False,
        callback=chosen,
        help="Lay text out N columns wide (default: the terminal's width; "
        "when stdout is not a terminal, lines are never wrapped).",
    )
    return color(width(command))


QUIET_OPTION = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Text output: only the alerts (errors go to stderr); nothing at all when there is none.",
)


def _format_option(help_text: str) -> Callable[[F], F]:
    """`--format NAME`: no sniffing; completed from the registered formats."""
    return click.option(
        "--format", "fmt", default=None, metavar="NAME", shell_complete=_complete_formats, help=help_text
    )


def _fail_on_option(help_text: str) -> Callable[[F], F]:
    """`--fail-on`: the lowest alert severity that makes the exit code 1."""
    return click.option(
        "--fail-on", type=click.Choice(["warning", "critical"]), default="warning", show_default=True, help=help_text
    )


def _with_plugin_failures(code: Any) -> Any:
    """A plugin that failed (reported on stderr as it happened) makes a 0 or 1 exit code 2."""
    return int(ExitCode.USAGE) if plugin_failures.any_failed() and code in (None, 0, 1) else code


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="gradwatch")
def cli() -> None:
    """Watch training logs for grad-norm spikes, fp16 loss-scale collapse, NaNs and logit drift.

    \b
    Shell completion:
      eval "$(_GRADWATCH_COMPLETE=bash_source gradwatch)"   # in ~/.bashrc
      eval "$(_GRADWATCH_COMPLETE=zsh_source gradwatch)"    # in ~/.zshrc
      _GRADWATCH_COMPLETE=fish_source gradwatch > ~/.config/fish/completions/gradwatch.fish

    \b
    Examples:
      gradwatch check examples/logs/megatron-ds-fp16-resume-collapse.log
      python train.py 2>&1 | tee -p train.log | gradwatch tail -
      gradwatch check logs/ --output json --fail-on critical
    """


@cli.command()
@PATHS_ARGUMENT
@CONFIG_OPTION
@EXCLUDE_OPTION
@SELECT_OPTION
@IGNORE_OPTION
@_format_option("Skip format sniffing and read every file as NAME (see `gradwatch formats`).")
@_report_output_option("text: a report per file; json: one JSON object on stdout; ")
@_fail_on_option("Lowest alert severity that makes the exit code 1.")
@SNAPSHOT_OPTION
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Worker processes that parse a large (64 MB+) uncompressed log "
    "(default: one per core, at most 8; 1: everything in this process).",
)
@PREVIOUS_OPTION
@RUN_OPTION
@QUIET_OPTION
@_text_output_options
def check(
    paths: tuple[str, ...],
    config_path: str | None,
    exclude: tuple[str, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fmt: str | None,
    output: str,
    fail_on: str,
    snapshot_dir: str | None,
    jobs: int | None,
    previous: str | None,
    run_name: str | None,
    quiet: bool,
) -> None:
    """Check archived logs and report what went wrong, where, and what to do.

    PATHS are log files (plain or .gz) or directories, searched recursively for
    *.log *.txt *.out *.jsonl (and .gz); `-` reads standard input to its end, and
    a named pipe is read alike (it waits for a writer, as `cat` does).

    \b
    Exit codes:
      0  no alert at or above --fail-on
      1  alerts at or above --fail-on
      2  usage error, missing/unreadable file, invalid config, no known format in a file,
         or a plugin that failed

    \b
    Examples:
      gradwatch check examples/logs/megatron-ds-fp16-resume-collapse.log
      ssh login1 cat /scratch/run42/main_log.txt | gradwatch check - --snapshot-dir evidence/
      gradwatch check logs/ --quiet --color always        # a CI log: the alerts alone, coloured
    """
    from gradwatch import workers

    if snapshot_dir is None:  # (evidence is written by a read in this process)
        workers.start_early(paths, jobs)  # before the imports below, which it then does beside them

    from gradwatch.alerts import Severity
    from gradwatch.commands.check import run_check
    from gradwatch.sources.exclude import Excludes

    settings = _settings(config_path, select, ignore)
    snapshots = _snapshot_writer(snapshot_dir, settings)
    report = run_check(
        list(paths),
        settings,
        fmt,
        Severity.parse(fail_on),
        snapshots=snapshots,
        jobs=jobs,
        previous=previous,
        run=run_name,
        exclude=Excludes(exclude),
        note=None if quiet else _note,
    )
    _emit(report, output, quiet)
    sys.exit(int(report.exit_code))


def _snapshot_writer(directory: str | None, settings: Settings) -> SnapshotWriter | None:
    """The `--snapshot-dir` writer of check and scan (None without the option); warnings go to stderr."""
    if directory is None:
        return None
    from gradwatch.sinks.snapshot import SnapshotWriter

    return SnapshotWriter.open(
        directory, settings.snapshots, lambda m: click.echo(f"warning: {safe_text(m)}", err=True)
    )


def _emit(report: Report, output: str, quiet: bool) -> None:
    """The report on stdout as `--output` says (with `--quiet`, text is the alerts alone); the
    files that could not be read on stderr too, whatever the output."""
    for error in report.input_errors():
        click.echo(f"error: {safe_text(error)}", err=True)
    if output == "json":
        click.echo(report.dumps())
        return
    if output in CI_OUTPUTS:
        from gradwatch.sinks.ci import emit

        click.echo(emit(report, output, warn=lambda m: click.echo(f"warning: {safe_text(m)}", err=True)), nl=False)
        return
    from gradwatch.commands.console import stdout_console

    shown = report.alerts_only() if quiet else report
    if shown is not None:
        stdout_console().print(shown)


@cli.command()
@PATHS_ARGUMENT
@click.option(
    "--state",
    "state_path",
    required=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Where this scan left off (offsets, detector state, notified incidents). Created 0600; "
    "it decides what is read and notified, so it is refused if anyone but its owner can write it.",
)
@CONFIG_OPTION
@click.option(
    "--notify-cmd",
    default=None,
    metavar="CMD",
    help="Run CMD when an incident at or above --fail-on opens, escalates and ends (split like a shell, "
    "run without one): its alert's JSON with event and headline on stdin, GRADWATCH_* environment "
    "variables; killed at --notify-timeout.",
)
@click.option("--webhook", default=None, metavar="URL", help="POST incident updates as JSON to URL.")
@click.option(
    "--webhook-format",
    type=click.Choice(["generic", "slack"]),
    default="generic",
    show_default=True,
    help='generic: {"alerts": [...]}; slack: {"text": ...} for Slack-compatible incoming webhooks.',
)
@click.option(
    "--notify-timeout",
    type=Seconds(min=0.1, max=3600),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Most time one scan spends notifying, every command, POST and retry included (a server that "
    "drips its answer too); what is not delivered by then is kept for the next scan.",
)
@click.option(
    "--textfile",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="Write DIR/gradwatch.prom for node_exporter's textfile collector.",
)
@_report_output_option("text: a report per file; json: check's JSON plus new_bytes per file and notifications; ")
@_fail_on_option("Lowest severity that makes the exit code 1 and is notified.")
@click.option(
    "--lock-wait",
    type=Seconds(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for another scan of the same --state before giving up (exit 3).",
)
@SNAPSHOT_OPTION
@RUN_OPTION
@QUIET_OPTION
@_text_output_options
@EXCLUDE_OPTION
@SELECT_OPTION
@IGNORE_OPTION
def scan(
    paths: tuple[str, ...],
    state_path: str,
    config_path: str | None,
    notify_cmd: str | None,
    webhook: str | None,
    webhook_format: str,
    notify_timeout: float,
    textfile: str | None,
    output: str,
    fail_on: str,
    lock_wait: float,
    snapshot_dir: str | None,
    run_name: str | None,
    quiet: bool,
    exclude: tuple[str, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
) -> None:
    """Scan logs once, reading only what was appended since the last scan (for cron).

    PATHS are log files, directories or quoted globs, as for check (a named pipe
    is refused: scan reads files again where it left off). A rotated or
    truncated log is read again from its start. Alerts are grouped into incidents;
    each is notified when it opens, escalates and ends, once each; a failed
    notification is retried by the next scan.
    A run with no new step for longer than its stall limit (wall clock) alerts once.

    \b
    Exit codes:
      0  no new alert at or above --fail-on
      1  new alerts at or above --fail-on
      2  usage error, missing/unreadable file, invalid config, unsafe state file
      3  another scan held the --state file for all of --lock-wait

    \b
    Examples:
      */5 * * * * gradwatch scan '/scratch/*/train.log' --state ~/gw.json --webhook-format slack --webhook "$SLACK_URL"
      gradwatch scan 'runs/*.log' --state scan.json --textfile /var/lib/node_exporter/textfile --output json
      gradwatch scan 'runs/*.log' --state scan.json --quiet   # cron mails only when there is news
    """
    from gradwatch.commands.scan import run_scan, scan_options
    from gradwatch.sources.exclude import Excludes

    settings = _settings(config_path, select, ignore)
    snapshots = _snapshot_writer(snapshot_dir, settings)
    options = scan_options(
        state_path,
        fail_on,
        notify_cmd,
        webhook,
        webhook_format,
        textfile,
        lock_wait,
        snapshots,
        run_name,
        notify_timeout_s=notify_timeout,
    )
    report = run_scan(
        list(paths),
        settings,
        options,
        warn=lambda m: click.echo(f"warning: {safe_text(m)}", err=True),
        exclude=Excludes(exclude),
        note=None if quiet else _note,
    )
    _emit(report, output, quiet)
    sys.exit(int(report.exit_code))


@cli.command()
@PATHS_ARGUMENT
@CONFIG_OPTION
@_format_option("Read every file as format NAME.")
@click.option(
    "--poll",
    type=Seconds(min=0.01),
    default=None,
    metavar="SECONDS",
    help="Look every SECONDS instead of waiting for inotify events "
    "(automatic, every 0.25 s, on NFS, Lustre, GPFS, CIFS/SMB, Ceph and FUSE).",
)
@click.option("--from-end", is_flag=True, help="Skip what the files hold now (detectors then start cold).")
@click.option(
    "--rotate-wait",
    type=Seconds(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Read a file renamed away or deleted on (a `tee -a` may still append to it) until it has been "
    "quiet this long once the new file holds lines.",
)
@click.option(
    "--output",
    type=click.Choice(["live", "text", "jsonl"]),
    default=None,
    help="live: a full-screen view (default on a terminal); text: a line per alert (default otherwise); "
    "jsonl: a JSON object per alert, notice and status.",
)
@click.option(
    "--on-alert",
    default=None,
    metavar="CMD",
    help="Run CMD while following when an incident reaches --on-alert-severity, again when it escalates "
    "and once when it ends (split like a shell, run without one): its alert's JSON with event and "
    "headline on stdin, GRADWATCH_* environment variables.",
)
@click.option(
    "--on-alert-severity",
    type=click.Choice(["info", "warning", "critical"]),
    default="critical",
    show_default=True,
    help="Lowest severity that runs --on-alert.",
)
@click.option(
    "--on-alert-timeout",
    type=Seconds(min=0.1),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Kill an --on-alert command that runs longer (reported; following goes on).",
)
@click.option(
    "--exit-on",
    type=click.Choice(["info", "warning", "critical"]),
    default=None,
    help="Exit with code 1 at the first alert of this severity or worse.",
)
@click.option(
    "--status-every",
    type=Seconds(min=0.1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="A status line (text, jsonl) this often.",
)
@SNAPSHOT_OPTION
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="N",
    help="Serve scan --textfile's gauges at http://ADDR:N/metrics for Prometheus (0: any free port, "
    "printed as a notice); needs pip install 'gradwatch[prometheus]'.",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="Address --metrics-port listens on (0.0.0.0: every interface).",
)
@PREVIOUS_OPTION
@RUN_OPTION
@QUIET_OPTION
@_text_output_options
@SELECT_OPTION
@IGNORE_OPTION
@EXCLUDE_OPTION
def tail(
    paths: tuple[str, ...],
    config_path: str | None,
    fmt: str | None,
    poll: float | None,
    from_end: bool,
    rotate_wait: float,
    output: str | None,
    on_alert: str | None,
    on_alert_severity: str,
    on_alert_timeout: float,
    exit_on: str | None,
    status_every: float,
    snapshot_dir: str | None,
    metrics_port: int | None,
    metrics_addr: str,
    previous: str | None,
    run_name: str | None,
    quiet: bool,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    exclude: tuple[str, ...],
) -> None:
    """Follow live logs and alert as problems appear, through rotation and truncation.

    PATHS are log files (waited for if they do not exist yet), directories, or quoted
    globs (new matching files, e.g. per-rank logs, are picked up). What the files
    hold is read first so that baselines are warm, then new lines as they come.
    Ctrl-C or SIGTERM stops with a summary. `-` alone reads standard input (a pipe
    from the training command) and stops with the summary at its end; `tee -p`
    keeps the training alive if gradwatch exits first (--exit-on). A named pipe
    alone is read alike, from when a writer opens it.

    \b
    Exit codes:
      0  no alert at or above --exit-on (warning if not given)
      1  alerts at or above it (with --exit-on: at the first one)
      2  usage error, invalid config, a plugin that failed, or output that cannot be written

    \b
    Examples:
      gradwatch tail '/scratch/runs/*/train.log' --metrics-port 9464 --snapshot-dir evidence/
      gradwatch tail train.log --on-alert 'scancel 123456' --on-alert-severity critical
      python train.py 2>&1 | tee -p train.log | gradwatch tail -
    """
    from gradwatch.commands.tail import TailOptions, run_tail

    options = TailOptions(
        paths=paths,
        fmt=fmt,
        poll=poll,
        from_end=from_end,
        rotate_wait=rotate_wait,
        output=output,
        on_alert=on_alert,
        on_alert_severity=on_alert_severity,
        on_alert_timeout=on_alert_timeout,
        exit_on=exit_on,
        status_every=status_every,
        snapshot_dir=snapshot_dir,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        previous=previous,
        run=run_name,
        quiet=quiet,
        exclude=exclude,
    )
    sys.exit(int(run_tail(options, _settings(config_path, select, ignore))))


@cli.group()
def config() -> None:
    """Show or write the configuration (thresholds of every detector).

    \b
    Examples:
      gradwatch config show --config my.yaml
      gradwatch config init my.yaml
    """


@config.command("show")
@CONFIG_OPTION
def config_show(config_path: str | None) -> None:
    """Print the effective configuration: the defaults merged with --config, or with the file
    found without it; the first line says which file that is.

    \b
    Examples:
      gradwatch config show
      gradwatch config show --config my.yaml
      GRADWATCH_CONFIG=~/thresholds.yaml gradwatch config show | head -1
    """
    from gradwatch import config as cfg
    from gradwatch import config_discovery

    source = config_discovery.find(config_path)
    settings = config_discovery.load(source)
    click.echo(f"# configuration: {source.describe()}")
    click.echo(cfg.effective_yaml(settings), nl=False)


@config.command("init")
@click.argument("path", default="gradwatch.yaml")
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def config_init(path: str, force: bool) -> None:
    """Write an editable copy of the default configuration to PATH (gradwatch.yaml).

    \b
    Examples:
      gradwatch config init
      gradwatch config init configs/my-run.yaml --force
    """
    from gradwatch import config as cfg
    from gradwatch import config_discovery
    from gradwatch.errors import UsageError

    if os.path.exists(path) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(cfg.default_text())
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    if os.path.basename(path) == config_discovery.PROJECT_FILE:
        click.echo(f"wrote {path}; commands run in its folder or below use it (`gradwatch config show` says so)")
    else:
        click.echo(f"wrote {path}; pass it with --config {path}, or set GRADWATCH_CONFIG={path}")


@cli.command()
@CONFIG_OPTION
def formats(config_path: str | None) -> None:
    """List the log formats gradwatch can read, one per line; plugins say where they come from.

    \b
    Examples:
      gradwatch formats
      gradwatch formats --config my.yaml
      gradwatch check run.log --format megatron
    """
    from gradwatch.parsers import PARSERS

    _settings(config_path)  # loads the plugins
    width = max(map(len, PARSERS))
    for name, cls in PARSERS.items():
        kind = (
            " (last: reads files no other format reads)"
            if cls.fallback
            else " (also inside other formats)"
            if cls.auxiliary
            else ""
        )
        click.echo(f"{name:<{width}}  {cls.description}{kind}{_plugin_origin('parser', name)}")


@cli.command()
@CONFIG_OPTION
def detectors(config_path: str | None) -> None:
    """List the detectors, one per line, with their config section name; plugins say where they come from.

    \b
    Examples:
      gradwatch detectors
      gradwatch detectors --config my.yaml
      gradwatch config show | grep -A12 grad_norm_spike
    """
    from gradwatch.detectors import DETECTORS

    _settings(config_path)  # loads the plugins
    width = max(map(len, DETECTORS))
    for det_id, cls in DETECTORS.items():
        click.echo(f"{det_id:<{width}}  {cls.description}{_plugin_origin('detector', det_id)}")


def _plugin_origin(kind: str, name: str) -> str:
    from gradwatch.plugins.registry import BUILTIN, origin_of

    origin = origin_of(kind, name)
    return "" if origin == BUILTIN else f"  [plugin: {origin}]"


@cli.command()
@click.argument("path", type=click.Path())
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output file: .csv, .jsonl or .parquet.",
)
@CONFIG_OPTION
@_format_option("Read PATH as format NAME.")
@click.option(
    "--configs",
    is_flag=True,
    help="Write what the run was told at each start (its configuration blocks) as JSON lines, not the records.",
)
def export(path: str, out_path: str, config_path: str | None, fmt: str | None, configs: bool) -> None:
    """Export the parsed records of one log to CSV, JSON lines or Parquet.

    \b
    Examples:
      gradwatch export main_log.txt --out records.csv
      gradwatch export main_log.txt.gz --out records.parquet
      gradwatch export main_log.txt --configs --out configs.jsonl
    """
    from gradwatch.commands.export import run_export

    n, how = run_export(path, out_path, _settings(config_path), fmt, configs)
    what = "config" if configs else "record"
    click.echo(f"wrote {n:,} {what}{'s' if n != 1 else ''} to {out_path}, read as {how}")


OUT_OPTION = click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output file: .html (one self-contained page) or .png (needs: pip install 'gradwatch[plot]').",
)


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@cli.command()
@PATHS_ARGUMENT
@OUT_OPTION
@CONFIG_OPTION
@click.option(
    "--metrics",
    default=None,
    metavar="LIST",
    help="Comma-separated metrics or panels to draw (default: every one the log has): "
    "loss, grad_norm, loss_scale, lr, logit_norm, z_loss, throughput.",
)
@EXCLUDE_OPTION
def report(
    paths: tuple[str, ...], out_path: str, config_path: str | None, metrics: str | None, exclude: tuple[str, ...]
) -> None:
    """Draw logs as panels with every alert marked: loss, grad norm, loss scale, lr, logit norm, throughput.

    PATHS are log files or directories, as for `check`. Alerts are check's alerts, listed with
    their hints below the panels; the file, format, steps and spike score are at the top.

    \b
    Exit codes:
      0  report written (alerts do not change it: gate CI with `check`); logs that could
         not be read are listed on stderr and on the page, every other one is drawn
      2  usage error, no log could be drawn, or .png without matplotlib;
         a file read only in part (a damaged gzip) is drawn up to the damage, then exit 2

    \b
    Examples:
      gradwatch report examples/logs/megatron-ds-fp16-resume-collapse.log --out report.html
      gradwatch report run1/main_log.txt.gz --out run1.png --metrics loss,grad_norm,loss_scale
      gradwatch report logs/ --out all-runs.html --config my.yaml
    """
    from gradwatch import workers

    workers.start_early(paths, None)  # a large log is read by workers, as `check` reads it

    from gradwatch.commands.report import run_report
    from gradwatch.sources.exclude import Excludes

    drawn = run_report(list(paths), out_path, _settings(config_path), _split(metrics), Excludes(exclude), _note)
    for message in drawn.unread:
        click.echo(f"not drawn: {message}", err=True)
    alerts = sum(len(run.alerts) for run, _ in drawn.runs)
    logs = len(drawn.runs)
    click.echo(f"wrote {out_path}: {logs} log{'s' if logs != 1 else ''}, {alerts} alerts")
    _fail_if_read_in_part(run for run, _ in drawn.runs)


@cli.command()
@PATHS_ARGUMENT
@OUT_OPTION
@CONFIG_OPTION
@click.option(
    "--metrics",
    default=None,
    metavar="LIST",
    help="Comma-separated metrics to overlay (default: loss, grad_norm, logit_norm, z_loss, where logged).",
)
@click.option(
    "--labels", default=None, metavar="LIST", help="Comma-separated run names, one per log (default: file names)."
)
@click.option(
    "--x", "x_axis", type=click.Choice(["step", "tokens"]), default="step", show_default=True, help="Shared x axis."
)
@click.option(
    "--window",
    type=click.IntRange(min=2),
    default=1000,
    show_default=True,
    metavar="N",
    help="Growth and slope are measured over each run's last N steps.",
)
@_text_output_options
def compare(
    paths: tuple[str, ...],
    out_path: str,
    config_path: str | None,
    metrics: str | None,
    labels: str | None,
    x_axis: str,
    window: int,
) -> None:
    """Overlay runs on shared axes; mark a run whose metric grows while the others stay flat.

    Prints, per run and metric, the last value, the growth over the last N steps (median of the
    window's last tenth over its first tenth) and the slope of ln(value) per 1,000 steps. A run
    growing 1.2x or more while every other run stays under 1.1x is marked. Then the configuration
    keys (precision, lr, batch, world size, reduce dtype, ...) whose latest values differ between
    the runs, one row per key.

    \b
    Examples:
      gradwatch compare nodes4.log nodes32.log --metrics logit_norm,loss --out compare.html
      gradwatch compare bf16/log.txt fp32/log.txt --labels bf16-reduce,fp32-reduce --out compare.png
      gradwatch compare a.log b.log c.log --x tokens --window 5000 --out abc.html
    """
    from gradwatch.commands.compare import config_table, run_compare, run_labels, trend_table
    from gradwatch.commands.console import stdout_console

    names = run_labels(list(paths), _split(labels))
    rows, runs = run_compare(list(paths), out_path, _settings(config_path), _split(metrics), names, x_axis, window)
    console = stdout_console()
    console.print(trend_table(rows, window))
    console.print(config_table(runs, names))
    click.echo(f"wrote {out_path}")
    _fail_if_read_in_part(runs)


def _fail_if_read_in_part(runs: Iterable[RunSeries]) -> None:
    """A log read only in part (a damaged gzip, a worker that failed) fails the command, as it
    fails `check`: what was drawn is only what came before the damage."""
    errors = [run.summary.error for run in runs if run.summary.error]
    for error in errors[:-1]:
        click.echo(f"error: {safe_text(error)}", err=True)
    if errors:
        raise InputError(errors[-1])


def main() -> None:
    """The console script (and `python -m gradwatch`): one command, then the process ends.

    The objects left at the end are frozen out of the garbage collector first: the collections
    of the interpreter's shutdown would walk the modules imported (pandas' and pyarrow's, where a
    command needs them), up to a tenth of a second, to free memory that the process's exit frees
    anyway. Exit handlers, threads and output flushing are as usual.
    """
    _as_package_main()
    try:
        # fixed names: the same under `python -m gradwatch`, and what completion scripts register
        cli(prog_name="gradwatch", complete_var="_GRADWATCH_COMPLETE")
    finally:
        gc.freeze()


def _as_package_main() -> None:
    """Make the console script's process one of `python -m gradwatch` for multiprocessing: it
    starts each worker by running the main script again, unless that is a package's `__main__`,
    and the console script's run imports the CLI in every worker (0.04 s each, for nothing: a
    worker runs `gradwatch.segments`). Not for a script of one's own that defines something (a
    parser it registers): the workers need it."""
    main_module = sys.modules.get("__main__")
    if main_module is None or getattr(main_module, "__spec__", None) is not None:
        return
    if not any(getattr(value, "__module__", None) == "__main__" for value in vars(main_module).values()):
        main_module.__spec__ = importlib.util.find_spec("gradwatch.__main__")
