"""`gradwatch compare` sets the runs' configurations side by side: the keys that differ, one row each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import run_cli


def arguments(**args: Any) -> list[str]:
    """Megatron's `arguments` block (keys padded with dots, as every fork prints them)."""
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {key} {'.' * (48 - len(key))} {value}" for key, value in sorted(args.items())]
    return [*lines, "-------------------- end of arguments ---------------------"]


def iterations(first: int, last: int, lr: float) -> list[str]:
    """Megatron-LM `iteration N/M` lines."""
    return [
        f" iteration {step:8d}/  100000 | consumed samples: {step * 512:12d} | "
        f"elapsed time per iteration (ms): 812.4 | learning rate: {lr:.3E} | global batch size:   512 | "
        f"lm loss: {2.1 + (step % 7) / 100:.6E} | loss scale: 1.0 | grad norm: {0.2 + (step % 5) / 100:.3f} | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |"
        for step in range(first, last + 1)
    ]


BF16 = {"bf16": True, "fp16": False, "lr": 6e-5, "seed": 1234, "global_batch_size": 512, "micro_batch_size": 4}


def write(path: Path, *parts: list[str]) -> str:
    path.write_text("\n".join(line for part in parts for line in part) + "\n")
    return str(path)


def compare(tmp_path: Path, *logs: str, env: dict[str, str] | None = None) -> list[str]:
    p = run_cli("compare", *logs, "--out", str(tmp_path / "compare.html"), env=env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return p.stdout.splitlines()


def config_rows(lines: list[str]) -> dict[str, list[str]]:
    """The configuration table's rows after its header (`config  a.log  b.log`): key -> cells."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["config"])
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("wrote "):
            break
        key, *cells = line.split()
        rows[key] = cells
    return rows


def test_the_keys_that_differ_are_one_row_each_with_every_runs_value(tmp_path: Path) -> None:
    a = write(tmp_path / "bf16.log", arguments(**BF16), iterations(1, 60, 6e-5))
    b = write(
        tmp_path / "fp16.log", arguments(**{**BF16, "bf16": False, "fp16": True, "lr": 3e-4}), iterations(1, 60, 3e-4)
    )
    lines = compare(tmp_path, a, b)
    header = next(line for line in lines if line.split()[:1] == ["config"])
    assert header.split() == ["config", "bf16.log", "fp16.log"]
    assert config_rows(lines) == {"precision": ["bf16", "fp16"], "lr": ["6e-05", "0.0003"]}
    # aligned: each run's values start where its name does
    for key in ("precision", "lr"):
        row = next(line for line in lines if line.startswith(key + " "))
        assert row.index(config_rows(lines)[key][1]) == header.index("fp16.log")


def test_a_key_one_run_did_not_print_is_a_dash_and_runs_keep_their_labels(tmp_path: Path) -> None:
    a = write(tmp_path / "a.log", arguments(**BF16), iterations(1, 60, 6e-5))
    b = write(tmp_path / "b.log", arguments(**{k: v for k, v in BF16.items() if k != "seed"}), iterations(1, 60, 6e-5))
    p = run_cli("compare", a, b, "--labels", "first,second", "--out", str(tmp_path / "c.html"))
    assert p.returncode == 0, p.stderr
    assert config_rows(p.stdout.splitlines()) == {"seed": ["1234", "-"]}


def test_the_latest_start_is_what_a_run_was_told(tmp_path: Path) -> None:
    """A run restarted in fp16 is an fp16 run now: it agrees with one that was fp16 from the start."""
    fp16 = {**BF16, "bf16": False, "fp16": True}
    a = write(
        tmp_path / "a.log", arguments(**BF16), iterations(1, 60, 6e-5), arguments(**fp16), iterations(61, 90, 6e-5)
    )
    b = write(tmp_path / "b.log", arguments(**fp16), iterations(1, 60, 6e-5))
    assert compare(tmp_path, a, b)[-2:] == [
        "configuration: the same in every run",
        f"wrote {tmp_path / 'compare.html'}",
    ]


def test_runs_told_the_same_say_so_in_one_line(tmp_path: Path) -> None:
    a = write(tmp_path / "a.log", arguments(**BF16), iterations(1, 60, 6e-5))
    b = write(tmp_path / "b.log", arguments(**BF16), iterations(1, 80, 6e-5))
    lines = compare(tmp_path, a, b)
    assert "configuration: the same in every run" in lines
    assert not any(line.split()[:1] == ["config"] for line in lines)


def test_logs_without_configuration(tmp_path: Path) -> None:
    bare = write(tmp_path / "bare.log", iterations(1, 60, 6e-5))
    other = write(tmp_path / "other.log", iterations(1, 60, 6e-5))
    told = write(tmp_path / "told.log", arguments(**BF16), iterations(1, 60, 6e-5))
    fp16 = write(tmp_path / "fp16.log", arguments(**{**BF16, "bf16": False, "fp16": True}), iterations(1, 60, 6e-5))
    assert "configuration: no run printed its configuration" in compare(tmp_path, bare, other)
    assert "configuration: only told.log printed its configuration" in compare(tmp_path, bare, told)
    lines = compare(tmp_path, told, bare, fp16)
    assert "bare.log printed none" in "\n".join(lines)
    assert config_rows(lines) == {"precision": ["bf16", "fp16"]}


def test_piped_output_is_plain_text_without_no_color(tmp_path: Path) -> None:
    a = write(tmp_path / "a.log", arguments(**BF16), iterations(1, 60, 6e-5))
    b = write(tmp_path / "b.log", arguments(**{**BF16, "lr": 1e-4}), iterations(1, 60, 1e-4))
    p = run_cli("compare", a, b, "--out", str(tmp_path / "c.html"), env={"NO_COLOR": ""})  # rich: unset
    assert p.returncode == 0, p.stderr
    assert "\x1b[" not in p.stdout and config_rows(p.stdout.splitlines()) == {"lr": ["6e-05", "0.0001"]}
