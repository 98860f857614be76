"""The command line: thin wiring from options to the pipeline; no logic lives here.

Heavy modules (pandas, numpy, rich tables) are imported inside the commands so that `--help`,
`--version` and usage errors answer instantly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gradwatch import __version__
from gradwatch.errors import ExitCode, GradwatchError

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML file overriding configs/default.yaml key by key.",
)


class _Group(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:  # one place turns our errors into exit codes
        try:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except GradwatchError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(int(e.exit_code))
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            e.show()
            sys.exit(int(ExitCode.USAGE))
        except BrokenPipeError:
            # output piped into `head` that closed early: not a crash (pytest does the same)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="gradwatch")
def cli() -> None:
    """Watch training logs for grad-norm spikes, fp16 loss-scale collapse, NaNs and logit drift.

    \b
    Examples:
      gradwatch check examples/logs/megatron-ds-fp16-resume-collapse.log
      gradwatch check logs/ --output json --fail-on critical
      gradwatch formats
    """


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@CONFIG_OPTION
@click.option(
    "--format",
    "fmt",
    default=None,
    metavar="NAME",
    help="Skip format sniffing and read every file as NAME (see `gradwatch formats`).",
)
@click.option(
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: a report per file; json: one JSON object on stdout.",
)
@click.option(
    "--fail-on",
    type=click.Choice(["warning", "critical"]),
    default="warning",
    show_default=True,
    help="Lowest alert severity that makes the exit code 1.",
)
def check(paths: tuple[str, ...], config_path: str | None, fmt: str | None, output: str, fail_on: str) -> None:
    """Check archived logs and report what went wrong, where, and what to do.

    PATHS are log files (plain or .gz) or directories, searched recursively for
    *.log *.txt *.out *.jsonl (and .gz).

    \b
    Exit codes:
      0  no alert at or above --fail-on
      1  alerts at or above --fail-on
      2  usage error, missing/unreadable file, invalid config, or no known format in a file

    \b
    Examples:
      gradwatch check examples/logs/megatron-ds-fp16-resume-collapse.log
      gradwatch check run1/main_log.txt.gz run2/ --fail-on critical
      gradwatch check logs/ --output json > report.json
    """
    from gradwatch import config
    from gradwatch.alerts import Severity
    from gradwatch.commands.check import run_check

    settings = config.load(config_path)
    report = run_check(list(paths), settings, fmt, Severity.parse(fail_on), progress=output == "text")
    _emit(report, output)
    sys.exit(int(report.exit_code))


def _emit(report: Any, output: str) -> None:
    if output == "json":
        click.echo(report.dumps())
        return
    from gradwatch.commands.console import stdout_console

    stdout_console().print(report)


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
    """Print the effective configuration: defaults merged with --config.

    \b
    Examples:
      gradwatch config show
      gradwatch config show --config my.yaml
    """
    from gradwatch import config as cfg

    click.echo(cfg.effective_yaml(cfg.load(config_path)), nl=False)


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
    from gradwatch.errors import UsageError

    if os.path.exists(path) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(cfg.default_text())
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    click.echo(f"wrote {path}; pass it with --config {path}")


@cli.command()
def formats() -> None:
    """List the log formats gradwatch can read, one per line.

    \b
    Examples:
      gradwatch formats
      gradwatch check run.log --format megatron
    """
    from gradwatch.parsers import PARSERS

    width = max(map(len, PARSERS))
    for name, cls in PARSERS.items():
        kind = " (also inside other formats)" if cls.auxiliary else ""
        click.echo(f"{name:<{width}}  {cls.description}{kind}")


@cli.command()
def detectors() -> None:
    """List the detectors, one per line, with their config section name.

    \b
    Examples:
      gradwatch detectors
      gradwatch config show | grep -A12 grad_norm_spike
    """
    from gradwatch.detectors import DETECTORS

    width = max(map(len, DETECTORS))
    for det_id, cls in DETECTORS.items():
        click.echo(f"{det_id:<{width}}  {cls.description}")


@cli.command()
@click.argument("path")
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output file: .csv, .jsonl or .parquet (parquet needs pyarrow).",
)
@CONFIG_OPTION
@click.option("--format", "fmt", default=None, metavar="NAME", help="Read PATH as format NAME.")
def export(path: str, out_path: str, config_path: str | None, fmt: str | None) -> None:
    """Export the parsed records of one log to CSV, JSON lines or Parquet.

    \b
    Examples:
      gradwatch export main_log.txt --out records.csv
      gradwatch export main_log.txt.gz --out records.parquet
    """
    from gradwatch import config as cfg
    from gradwatch.commands.export import run_export

    n = run_export(path, out_path, cfg.load(config_path), fmt)
    click.echo(f"wrote {n:,} records to {out_path}")


def main() -> None:
    cli()
