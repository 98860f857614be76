"""Plugins: the public API, entry points in a fresh venv, one-file plugins, and broken plugins.

The installed-plugin tests build gradwatch and `examples/plugins` into a new virtual environment
with pip, offline: the environment sees the running venv's third-party packages through a `.pth`
file, but neither its gradwatch nor anything else of this checkout, so what it finds comes from
what pip installed there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import gradwatch.api as api
from gradwatch import records
from gradwatch.detectors import DETECTORS
from gradwatch.errors import PluginError
from gradwatch.parsers import PARSERS
from gradwatch.plugins import failures, loader, registry
from tests.conftest import EXAMPLES, REPO, run_cli

PLUGIN_SRC = REPO / "examples" / "plugins"
PLUGIN_LOG = PLUGIN_SRC / "attnlab-run.log"
#: `attnlab-run.log`: the max attention logit doubles every log from step 1010 (2x), so 1020
#: (4x its median, over the 3x ratio) is the first step the example detector must alert at.
GROWTH_STEP, GROWTH_LINE = 1020, 105
RESUME_LOG = EXAMPLES / "megatron-ds-fp16-resume-collapse.log"


# ---- the API ------------------------------------------------------------------------------------
def test_api_exports_exactly_the_plugin_surface() -> None:
    """`gradwatch.api.__all__` is pinned, and the module has no other public name."""
    assert api.__all__ == [
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
    assert {name for name in vars(api) if not name.startswith("_")} == set(api.__all__)
    assert all(getattr(api, name).__doc__ for name in api.__all__ if name not in ("COLUMNS", "METRICS"))


# ---- registration checks (pluggy-style: at registration, one error naming who and what) --------
@pytest.fixture
def clean_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registries, origins and extra columns as they were before the test."""
    monkeypatch.setattr(registry, "_origins", dict(registry._origins))
    monkeypatch.setattr(records, "EXTRA_METRICS", list(records.EXTRA_METRICS))
    detectors, parsers = dict(DETECTORS), dict(PARSERS)
    yield
    DETECTORS.clear()
    DETECTORS.update(detectors)
    PARSERS.clear()
    PARSERS.update(parsers)


@dataclass(frozen=True, kw_only=True)
class _LimitConfig(api.DetectorConfig):
    limit: float = 1.0


_LEFT_OUT = object()


def _detector(**attrs: Any) -> type[api.Detector]:
    """A detector class that fits the contract, but for `attrs` (`_LEFT_OUT`: not defined)."""
    body: dict[str, Any] = {"id": "limit", "description": "a test detector", "Config": _LimitConfig}
    body["update"] = lambda self, batch: []
    return type("Limit", (api.Detector,), {k: v for k, v in {**body, **attrs}.items() if v is not _LEFT_OUT})


def _parser(**attrs: Any) -> type[api.Parser]:
    body: dict[str, Any] = {"name": "tiny", "description": "a test parser", "scan": "T step "}
    body["parse"] = lambda self, text, line, ts, out: False
    return type("Tiny", (api.Parser,), {k: v for k, v in {**body, **attrs}.items() if v is not _LEFT_OUT})


@pytest.mark.usefixtures("clean_registries")
@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (int, "detector int: is not a subclass of gradwatch.api.Detector"),
        (_detector(id=None), "needs `id`: a snake_case str"),
        (_detector(id="Has Space"), "needs `id`"),
        (_detector(description=None), "needs `description`"),
        (_detector(Config=dict), "`Config` must subclass gradwatch.api.DetectorConfig"),
        (_detector(Config=type("Plain", (api.DetectorConfig,), {"__annotations__": {"x": int}})), "@dataclass"),
        (_detector(update=_LEFT_OUT), "does not implement update"),
        (_detector(id="grad_norm_spike"), "id 'grad_norm_spike' is already registered by built-in"),
    ],
)
def test_a_detector_that_breaks_the_contract_is_refused_when_registered(cls: Any, match: str) -> None:
    """Each mismatch is one PluginError that says what is wrong; nothing is registered."""
    with pytest.raises(PluginError, match=match):
        api.register_detector(cls)
    assert DETECTORS.get("limit") is None


@pytest.mark.usefixtures("clean_registries")
@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (_parser(name=None), "needs `name`"),
        (_parser(parse=_LEFT_OUT), "does not implement parse"),
        (_parser(scan="(unclosed"), "`scan` must be None or a regex"),
        (_parser(extra_metrics=["attn"]), "`extra_metrics` must be a tuple"),
        (_parser(extra_metrics=("loss",)), r"\['loss'\] are canonical columns already"),
        (_parser(name="megatron"), "name 'megatron' is already registered by built-in"),
    ],
)
def test_a_parser_that_breaks_the_contract_is_refused_when_registered(cls: Any, match: str) -> None:
    with pytest.raises(PluginError, match=match):
        api.register_parser(cls)


@pytest.mark.usefixtures("clean_registries")
def test_registration_errors_name_the_plugin_and_a_good_class_records_its_origin() -> None:
    with registry.loading("/srv/plugins/mine.py"), pytest.raises(PluginError, match=r"^plugin /srv/plugins/mine.py: "):
        api.register_detector(_detector(id="loss_spike"))
    tiny = _parser(extra_metrics=("attn_logit_max",))
    with registry.loading("/srv/plugins/mine.py"):
        assert api.register_parser(tiny) is tiny
        api.register_parser(tiny)  # the same class again: no-op
    assert registry.origin_of("parser", "tiny") == "/srv/plugins/mine.py"
    assert registry.origin_of("parser", "megatron") == registry.BUILTIN
    assert records.EXTRA_METRICS == ["attn_logit_max"]


def test_extra_metrics_are_columns_of_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A declared metric is a column after COLUMNS: kept when logged, NaN in bulk-path chunks."""
    monkeypatch.setattr(records, "EXTRA_METRICS", ["attn_logit_max"])
    builder = records.RecordBuilder()
    builder.add(10, 1, None, {"loss": 2.0, "attn_logit_max": 31.5, "not_declared": 1.0})
    assert list(builder.take().columns) == [*records.COLUMNS, "attn_logit_max"]
    builder.add(10, 1, None, {"loss": 2.0, "attn_logit_max": 31.5})
    assert builder.take()["attn_logit_max"].tolist() == [31.5]
    assert list(records.RecordBuilder.empty().columns) == [*records.COLUMNS, "attn_logit_max"]


def test_an_entry_point_that_fails_is_reported_and_the_others_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = [
        EntryPoint("gone", "gradwatch_no_such_module:Detector", "gradwatch.detectors"),
        EntryPoint("not_a_detector", "builtins:int", "gradwatch.detectors"),
    ]
    monkeypatch.setattr(loader, "entry_points", lambda group: broken if group == "gradwatch.detectors" else [])
    monkeypatch.setattr(loader, "_installed_loaded", False)
    monkeypatch.setattr(failures, "_reported", [])
    loader.load_installed()
    gone, not_a_detector = sorted(capsys.readouterr().err.splitlines(), reverse=True)
    assert failures.any_failed()
    assert gone.startswith("error: plugin gradwatch_no_such_module:Detector (entry point gone) failed to load: ")
    assert "ModuleNotFoundError" in gone and gone.endswith("running without it")
    assert "(entry point not_a_detector): detector int: is not a subclass" in not_a_detector


# ---- an installed plugin package, found through its entry points ------------------------------
@dataclass
class PluginVenv:
    root: Path
    plugin: Path  # the copy of examples/plugins that was installed

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.root / "bin" / "gradwatch"), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={"NO_COLOR": "1", "COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> PluginVenv:
    """A new venv with gradwatch and the example plugin installed by pip (no index, no isolation)."""
    tmp = tmp_path_factory.mktemp("plugin-venv")
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = str(env / "bin" / "python")
    # Dependencies (and pip, setuptools, wheel, pytest): the running venv's, minus its gradwatch.
    deps = tmp / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("gradwatch", "__editable__")):
            (deps / entry.name).symlink_to(entry)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "gradwatch-test-deps.pth").write_text(f"{deps}\n")
    # Build from copies: a build writes build/ and *.egg-info next to the sources.
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".pytest_cache")
    project, plugin = tmp / "gradwatch", tmp / "attnlogit"
    shutil.copytree(REPO / "src", project / "src", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(PLUGIN_SRC, plugin, ignore=skip)
    pip = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*pip, str(project), str(plugin)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return PluginVenv(env, plugin)


def test_installed_plugin_is_sniffed_alerts_at_the_growth_step_and_is_listed(plugin_venv: PluginVenv) -> None:
    p = plugin_venv.run("check", "--output", "json", str(PLUGIN_LOG))
    assert p.stderr == "" and p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    assert report["files"][0]["format"] == "attnlab" and report["files"][0]["records"] == 106
    (alert,) = report["alerts"]
    assert (alert["detector"], alert["severity"], alert["step"], alert["line"]) == (
        "attn_logit_growth",
        "warning",
        GROWTH_STEP,
        GROWTH_LINE,
    )
    assert alert["metric"] == "attn_logit_max" and alert["value"] == 120.0

    origin = "[plugin: gradwatch-attnlogit 0.1.0 (entry point {})]"
    detectors = plugin_venv.run("detectors").stdout.splitlines()
    assert detectors[-1].startswith("attn_logit_growth ") and detectors[-1].endswith(origin.format("attn_logit_growth"))
    assert not any("[plugin" in line for line in detectors[:-1])
    formats = plugin_venv.run("formats").stdout.splitlines()
    assert [line.split()[0] for line in formats if "[plugin" in line] == ["attnlab"]
    assert next(line for line in formats if line.startswith("attnlab ")).endswith(origin.format("attnlab"))
    # ... and the venv running these tests, where the plugin is not installed, knows neither
    assert "attn_logit_growth" not in run_cli("detectors").stdout


def test_the_custom_metric_reaches_the_records(plugin_venv: PluginVenv, tmp_path: Path) -> None:
    out = tmp_path / "records.csv"
    assert plugin_venv.run("export", str(PLUGIN_LOG), "--out", str(out)).returncode == 0
    header, first, *_ = out.read_text().splitlines()
    assert header.split(",")[-1] == "attn_logit_max" and first.split(",")[-1] == "30.3"


_SPLIT_CHECK = """
import json
import sys

from gradwatch import segments, workers
from gradwatch.sources import archive

if __name__ == "__main__":
    from gradwatch.cli import main

    workers.MIN_PARALLEL_BYTES = 0  # (a large log in real use)
    archive.CHUNK_BYTES = segments.HEAD_BYTES = segments.WARMUP_BYTES = 512
    segments.SEGMENT_BYTES = 2048
    sys.argv = ["gradwatch", "check", "--output", "json", "--jobs", sys.argv[2], *sys.argv[3:], sys.argv[1]]
    main()
"""


def _split_check(
    tmp_path: Path, log: Path, jobs: str, *args: str, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """`check --output json` of `log` with small segments, so that workers read it (`_SPLIT_CHECK`)."""
    script = tmp_path / "split_check.py"
    script.write_text(_SPLIT_CHECK)
    return subprocess.run([python, str(script), str(log), jobs, *args], capture_output=True, text=True, timeout=120)


def test_the_custom_metric_reaches_the_detectors_when_workers_read(plugin_venv: PluginVenv, tmp_path: Path) -> None:
    """A plugin parser's own metric is a column of the batches workers read too (it was dropped:
    workers load no plugins, and their batches had the canonical columns only; found by review)."""
    python = str(plugin_venv.root / "bin" / "python")
    reports = []
    for jobs in ("1", "2"):
        p = _split_check(tmp_path, PLUGIN_LOG, jobs, python=python)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        reports.append(json.loads(p.stdout))
    assert reports[1]["alerts"] == reports[0]["alerts"]
    assert [(a["detector"], a["step"]) for a in reports[1]["alerts"]] == [("attn_logit_growth", GROWTH_STEP)]


def test_example_plugin_tests_pass_where_it_is_installed(plugin_venv: PluginVenv) -> None:
    p = subprocess.run(
        [str(plugin_venv.root / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=plugin_venv.plugin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr


# ---- a one-file plugin under `plugins:` ---------------------------------------------------------
ONE_FILE_PLUGIN = '''
    """A one-file plugin: the `tinylog` format, and a loss over a fixed limit."""
    import re
    from dataclasses import dataclass

    from gradwatch.api import Detector, DetectorConfig, Parser, Severity, register_detector, register_parser


    @register_parser
    class TinyLog(Parser):
        name = "tinylog"
        description = "tinylog `T step N loss X` lines"
        scan = "T step "

        def parse(self, text, line, ts, out):
            m = re.match(r"T step (\\d+) loss (\\S+)", text)
            if m is None:
                return False
            out.record(self.name, int(m[1]), line, ts, {"loss": float(m[2])})
            return True


    @dataclass(frozen=True, kw_only=True)
    class LossLimitConfig(DetectorConfig):
        limit: float = 100.0


    @register_detector
    class LossLimit(Detector):
        id = "loss_limit"
        description = "loss over a fixed limit"
        Config = LossLimitConfig

        def __init__(self, config=None, path=""):
            super().__init__(config, path)
            self.records = 0  # plain state: `scan` saves it

        def update(self, batch):
            rec = batch.records
            self.records += len(rec)
            over = rec[rec["loss"] > self.config.limit]
            return [
                self.alert(Severity.CRITICAL, r.step, r.line, "loss", r.loss, None, self.config.limit,
                           f"loss {r.loss:g} is over {self.config.limit:g}", "stop the run")
                for r in over.itertuples()
            ]
'''


def _write_plugin(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / "plugins" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf" / "gradwatch.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_one_file_plugin_from_the_config(tmp_path: Path) -> None:
    plugin = _write_plugin(tmp_path, "tiny.py", ONE_FILE_PLUGIN).resolve()
    log = tmp_path / "run.log"
    log.write_text("".join(f"T step {s} loss {9.0 if s == 7 else 3.0}\n" for s in range(1, 40)))
    conf = _config(tmp_path, "plugins: [../plugins/tiny.py]\ndetectors:\n  loss_limit:\n    limit: 5\n")

    p = run_cli("check", "--output", "json", "--config", str(conf), str(log))
    assert p.stderr == "" and p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    assert report["files"][0]["format"] == "tinylog"
    found = {(a["detector"], a["step"], a["line"]) for a in report["alerts"] if a["severity"] != "info"}
    assert found == {("loss_limit", 7, 7), ("loss_spike", 7, 7)}  # the plugin's, and a built-in one

    listed = run_cli("detectors", "--config", str(conf)).stdout.splitlines()
    assert listed[-1].startswith("loss_limit ") and listed[-1].endswith(f"[plugin: {plugin}]")
    assert f"[plugin: {plugin}]" in run_cli("formats", "--config", str(conf)).stdout
    assert f"- {plugin}" in run_cli("config", "show", "--config", str(conf)).stdout

    # `scan` saves the plugin's state (plain data) and finds its classes again in the next process
    state = tmp_path / "scan.json"
    for _ in range(2):
        p = run_cli("scan", str(log), "--state", str(state), "--config", str(conf))
        assert p.stderr == "", p.stderr


def test_one_file_plugin_when_workers_read(tmp_path: Path) -> None:
    """Workers import the config's plugin files: its parser reaches them pickled in the stream,
    and unpickling looks its class up in that file's module (ModuleNotFoundError before). What
    the plugin prints as it loads is printed once, by the main process, as with one process."""
    _write_plugin(tmp_path, "tiny.py", "print('tiny plugin loaded')\n" + textwrap.dedent(ONE_FILE_PLUGIN))
    log = tmp_path / "run.log"
    log.write_text("".join(f"T step {s} loss {9.0 if s == 700 else 3.0}\n" for s in range(1, 1000)))
    conf = _config(tmp_path, "plugins: [../plugins/tiny.py]\ndetectors:\n  loss_limit:\n    limit: 5\n")
    reports = []
    for jobs in ("1", "2"):
        p = _split_check(tmp_path, log, jobs, "--config", str(conf))
        assert p.returncode == 1 and p.stderr == "", p.stderr
        printed, report = p.stdout.split("\n", 1)
        assert printed == "tiny plugin loaded"
        reports.append(json.loads(report))
    assert reports[1] == reports[0]
    assert reports[1]["files"][0]["format"] == "tinylog" and reports[1]["files"][0]["records"] == 999
    assert ("loss_limit", 700) in {(a["detector"], a["step"]) for a in reports[1]["alerts"]}


UNCHECKED = "the rest of the file went unchecked; try --jobs 1"


def test_a_plugin_file_that_fails_only_in_workers_is_reported_and_fails_the_check(tmp_path: Path) -> None:
    """The plugin's own failure is printed once, and the file's error says what the worker met:
    one line each, exit 2, no traceback."""
    refuses = "import multiprocessing\nif multiprocessing.parent_process() is not None:\n    raise RuntimeError('no')\n"
    plugin = _write_plugin(tmp_path, "fussy.py", refuses + textwrap.dedent(ONE_FILE_PLUGIN))
    log = tmp_path / "run.log"
    log.write_text("".join(f"T step {s} loss 3.0\n" for s in range(1, 1000)))
    conf = _config(tmp_path, "plugins: [../plugins/fussy.py]\n")

    p = _split_check(tmp_path, log, "2", "--config", str(conf))
    assert p.returncode == 2
    error = json.loads(p.stdout)["files"][0]["error"]
    assert p.stderr.splitlines() == [
        f"error: plugin {plugin.resolve()} failed to load: RuntimeError: no; running without it",
        f"error: {error}",  # (the file's error is also said on stderr, whatever the output)
    ]
    failed = f"{log}: a worker process failed: ModuleNotFoundError: No module named 'gradwatch_plugin_fussy_"
    assert error.startswith(failed) and error.endswith(f"; {UNCHECKED}")


#: a plugin file that breaks the workers' reading of segments (not of the head)
SABOTAGE = """
    import multiprocessing

    from gradwatch import segments

    if multiprocessing.parent_process() is not None:
        def _warmup(fh, start, size):
            raise {error}

        segments._warmup = _warmup
"""


def test_a_worker_that_fails_after_the_head_fails_the_check(tmp_path: Path) -> None:
    """The records read before the failure are checked, and the check fails (exit 2): the rest of
    the file went unchecked (it passed with exit 0 or 1 on what the head held)."""
    _write_plugin(tmp_path, "sabotage.py", SABOTAGE.format(error="MemoryError('out of it')"))
    conf = _config(tmp_path, "plugins: [../plugins/sabotage.py]\n")
    p = _split_check(tmp_path, RESUME_LOG, "2", "--config", str(conf))
    report = json.loads(p.stdout)
    first = report["files"][0]
    assert p.returncode == 2 and p.stderr == f"error: {first['error']}\n", p.stderr
    assert first["error"] == f"{RESUME_LOG}: a worker process failed: MemoryError: out of it; {UNCHECKED}"
    assert first["records"] > 0 and report["summary"]["exit_code"] == 2


def test_a_file_that_fails_to_read_in_a_worker_is_reported_as_in_one_process(tmp_path: Path) -> None:
    """The file's own error (gone while read) is reported as it is, not as a worker's failure."""
    _write_plugin(tmp_path, "sabotage.py", SABOTAGE.format(error="FileNotFoundError(2, 'No such file or directory')"))
    conf = _config(tmp_path, "plugins: [../plugins/sabotage.py]\n")
    p = _split_check(tmp_path, RESUME_LOG, "2", "--config", str(conf))
    first = json.loads(p.stdout)["files"][0]
    assert p.stderr == f"error: {first['error']}\n", p.stderr
    assert first["error"] == f"{RESUME_LOG}: read failed: No such file or directory" and first["records"] > 0


def test_a_plugin_section_is_validated_like_a_built_in_one(tmp_path: Path) -> None:
    _write_plugin(tmp_path, "tiny.py", ONE_FILE_PLUGIN)
    conf = _config(tmp_path, "plugins: [../plugins/tiny.py]\ndetectors:\n  loss_limit:\n    limt: 5\n")
    p = run_cli("check", "--config", str(conf), str(RESUME_LOG))
    assert p.returncode == 2
    assert p.stderr.strip() == f"error: {conf}: unknown key 'detectors.loss_limit.limt' (known here: enabled, limit)"


# ---- broken plugins ----------------------------------------------------------------------------
BROKEN_IMPORT = """
    import gradwatch_no_such_module  # a dependency that is not installed
"""
RAISES_IN_UPDATE = """
    from gradwatch.api import Detector, register_detector


    @register_detector
    class Boom(Detector):
        id = "boom"
        description = "raises on its first batch"

        def update(self, batch):
            return [1 / 0]
"""
RAISES_IN_PARSE = """
    from gradwatch.api import Parser, register_parser


    @register_parser
    class Raiser(Parser):
        name = "raiser"
        description = "raises on the first line it is offered"

        def parse(self, text, line, ts, out):
            raise RuntimeError(f"cannot read {text[:10]!r}")
"""
BAD_CLASS = """
    from gradwatch.api import Detector, register_detector


    @register_detector
    class NoId(Detector):
        description = "forgot its id"

        def update(self, batch):
            return []
"""


def test_a_plugin_that_exits_as_it_loads_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    """`sys.exit(3)` at import ended gradwatch silently with 3, which means "scan lock held" (found by QA)."""
    plugin = _write_plugin(tmp_path, "exits.py", "import sys\nsys.exit(3)\n")
    conf = _config(tmp_path, f"plugins: [{plugin}]\n")
    plain = json.loads(run_cli("check", "--output", "json", str(RESUME_LOG)).stdout)
    p = run_cli("check", "--output", "json", "--config", str(conf), str(RESUME_LOG))
    assert p.returncode == 2
    assert p.stderr == f"error: plugin {plugin} failed to load: SystemExit: 3; running without it\n"
    assert json.loads(p.stdout)["alerts"] == plain["alerts"]


def test_a_plugin_detector_that_exits_as_it_runs_is_turned_off_and_the_run_goes_on(tmp_path: Path) -> None:
    """(`sys.exit(3)` in `update` ended the run silently with 3; found by review.)"""
    source = RAISES_IN_UPDATE.replace("return [1 / 0]", "import sys; sys.exit(3)")
    plugin = _write_plugin(tmp_path, "exits.py", source)
    conf = _config(tmp_path, f"plugins: [{plugin}]\n")
    plain = json.loads(run_cli("check", "--output", "json", str(RESUME_LOG)).stdout)
    p = run_cli("check", "--output", "json", "--config", str(conf), str(RESUME_LOG))
    assert p.returncode == 2 and "SystemExit: 3" in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    assert json.loads(p.stdout)["alerts"] == plain["alerts"]


def test_broken_plugins_are_reported_and_the_built_in_detectors_still_run(tmp_path: Path) -> None:
    """One stderr line per broken plugin (naming it and the error), built-in alerts unchanged, exit 2."""
    files = {
        name: _write_plugin(tmp_path, name, source)
        for name, source in (
            ("gone.py", BROKEN_IMPORT),
            ("boom.py", RAISES_IN_UPDATE),
            ("raiser.py", RAISES_IN_PARSE),
            ("noid.py", BAD_CLASS),
        )
    }
    conf = _config(tmp_path, f"plugins: [{', '.join(str(f) for f in files.values())}]\n")
    plain = json.loads(run_cli("check", "--output", "json", str(RESUME_LOG)).stdout)

    p = run_cli("check", "--output", "json", "--config", str(conf), str(RESUME_LOG))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    report = json.loads(p.stdout)
    assert report["summary"]["exit_code"] == 2
    assert report["alerts"] == plain["alerts"] and any(a["detector"] == "grad_norm_spike" for a in report["alerts"])
    first_line = RESUME_LOG.read_text().splitlines()[0][:10]  # no built-in parser reads it
    assert p.stderr.splitlines() == [
        f"error: plugin {files['gone.py']} failed to load: ModuleNotFoundError: "
        "No module named 'gradwatch_no_such_module'; running without it",
        f"error: plugin {files['noid.py']}: detector NoId: needs `id`: a snake_case str, also its section name "
        "under `detectors:` in the config",
        f"error: plugin parser 'raiser' ({files['raiser.py']}) raised in parse at {RESUME_LOG}:1: "
        f"RuntimeError: cannot read {first_line!r}; it reads no more of this file",
        f"error: plugin detector 'boom' ({files['boom.py']}) raised in update on {RESUME_LOG}: "
        "ZeroDivisionError: division by zero; it is off for the rest of this file",
    ]

    listed = run_cli("detectors", "--config", str(conf))
    assert listed.returncode == 2 and "boom " in listed.stdout and "gone.py" in listed.stderr
