"""The README's quick start is what CI runs and what a new user types (no pip install here)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    """The command lines of the first ```sh block under '## Quick start'."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## Quick start")
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```sh")
    assert not any(line.startswith("## ") for line in lines[start + 1:fence]), "the block must sit under Quick start"
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    return [line.strip() for line in lines[fence + 1:end] if line.strip() and not line.strip().startswith("#")]


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    assert "traceforge generate" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_second_command_verbatim():
    second = quick_start_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert second in (line.strip() for line in ci)


def test_first_command_generates_the_demo(tmp_path):
    first = quick_start_commands()[0]
    part = next(p.strip() for p in first.split("&&") if p.strip().startswith("traceforge"))
    argv = shlex.split(part)
    script = Path(sys.executable).parent / "traceforge"
    # The installed entry point when there is one (as after `pip install .`), else the module.
    cmd = [str(script), *argv[1:]] if script.exists() else [sys.executable, "-m", "traceforge", *argv[1:]]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "traces"
    assert sorted(p.name for p in out.glob("*.et")) == sorted(f"workload.{r}.et" for r in range(8))
    assert (out / "comm_group.json").is_file() and (out / "manifest.json").is_file()


def test_entry_point_is_declared():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'traceforge = "traceforge.__main__:main"' in text
    from traceforge.__main__ import main

    assert callable(main)
