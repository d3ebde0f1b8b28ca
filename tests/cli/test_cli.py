"""The command line as a user runs it: one real `python -m traceforge` process (the smoke test),
the rest in process through typer's CliRunner (tests/cli_runner.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke

from traceforge.config import FIELDS
from traceforge.config.presets import PRESETS

ENV = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb")


def run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceforge", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def test_quick_start_writes_demo_to_traces(tmp_path):
    done = run(["generate"], tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "traces"
    assert sorted(p.name for p in out.glob("workload.*.et")) == sorted(f"workload.{r}.et" for r in range(8))
    assert (out / "comm_group.json").is_file() and (out / "manifest.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["spec"]["tp"], manifest["spec"]["pp"], manifest["spec"]["dp"]) == (2, 2, 2)
    assert "8 ranks" in done.stdout and "Traceback" not in done.stderr


def test_generate_help_mentions_every_flag():
    done = invoke("generate", "--help")
    assert done.exit_code == 0, done.stderr
    for field in FIELDS:
        flags = field.bool_flags or ("--" + field.name.replace("_", "-"),)
        for flag in flags:
            assert flag in done.stdout, flag
    for flag in ("--preset", "--config", "--out", "--force", "--jobs"):
        assert flag in done.stdout


def test_presets_lists_every_preset():
    done = invoke("presets")
    assert done.exit_code == 0, done.stderr
    for name in PRESETS:
        assert name in done.stdout, name
    for name in ("demo", "gpt3-175b", "llama3-70b"):  # the ones README and docs/design.md name
        assert name in done.stdout
    # docs/design.md, "Parameters": GPT-3 175B has 174.6 B parameters.
    row = next(line for line in done.stdout.splitlines() if "gpt3-175b" in line)
    assert "174.6B" in row


# -- bad input: one line naming the field, non-zero exit, no traceback, nothing written -----------

BAD_CONFIGS = {
    "unknown.yaml": "tp: 2\ntpp: 2\n",
    "broken.yaml": "tp: [2, 4\npp: 2\n",
}

BAD = {
    "heads % tp": (["--tp", "3"], ["heads", "tp"]),
    "kv_heads % tp": (["--tp", "4", "--kv-heads", "2"], ["kv_heads"]),
    "layers < pp": (["--layers", "1"], ["layers", "pp"]),
    "global batch vs micro-batch x dp": (["--global-batch", "7"], ["global_batch"]),
    "world size vs tp*pp*dp": (["--world-size", "12", "--dp", "2"], ["world_size"]),
    "world size not a multiple of tp*pp": (["--world-size", "10"], ["world_size"]),
    "unknown preset": (["-p", "gpt5"], ["preset", "gpt5"]),
    "unknown order letter": (["--order", "tp-pp-xp"], ["order", "xp"]),
    "zero tp": (["--tp", "0"], ["tp"]),
    "negative layers": (["--layers", "-1"], ["layers"]),
    "zero hidden": (["--hidden", "0"], ["hidden"]),
    "zero micro-batch": (["--micro-batch", "0"], ["micro_batch"]),
    "zero steps": (["--steps", "0"], ["steps"]),
    "negative bucket": (["--bucket-mb", "-1"], ["bucket_mb"]),
    "unknown config key": (["-c", "unknown.yaml"], ["tpp"]),
    "malformed YAML": (["-c", "broken.yaml"], ["broken.yaml"]),
    "missing config file": (["-c", "missing.yaml"], ["missing.yaml"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    for name, text in BAD_CONFIGS.items():
        Path(name).write_text(text)
    args, words = BAD[case]
    done = invoke("generate", "-o", "out", *args)
    assert done.exit_code != 0, (case, done.stdout)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0] or word.replace("_", "-") in lines[0], (word, lines[0])
    assert not Path("out").exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


# -- config files ------------------------------------------------------------------------------

CONFIG_TEXT = {
    "spec.yaml": "tp: 2\npp: 1\ndp: 4\nlayers: 2\ndp_mode: zero1\nsequence_parallel: true\nnum_microbatches: 2\n",
    "spec.toml": 'tp = 2\npp = 1\ndp = 4\nlayers = 2\ndp_mode = "zero1"\nsequence_parallel = true\nnum_microbatches = 2\n',
    "spec.json": json.dumps(dict(tp=2, pp=1, dp=4, layers=2, dp_mode="zero1", sequence_parallel=True, num_microbatches=2)),
}


@pytest.mark.parametrize("name", CONFIG_TEXT)
def test_config_file_and_flag_override(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(CONFIG_TEXT[name])
    done = invoke("generate", "-q", "-c", name, "--dp", "2", "-o", "out")
    assert done.exit_code == 0, done.stderr
    spec = json.loads((tmp_path / "out" / "manifest.json").read_text())["spec"]
    assert (spec["tp"], spec["pp"], spec["dp"], spec["layers"]) == (2, 1, 2, 2)  # --dp 2 beats the file's 4
    assert spec["dp_mode"] == "zero1" and spec["sequence_parallel"] is True and spec["num_microbatches"] == 2
    assert len(list((tmp_path / "out").glob("workload.*.et"))) == 4


def test_config_file_may_name_a_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text("preset: llama3-8b\nlayers: 4\ntp: 2\npp: 2\ndp: 1\nglobal_batch: 4\n")
    done = invoke("generate", "-q", "-c", "spec.yaml", "-o", "out")
    assert done.exit_code == 0, done.stderr
    spec = json.loads((tmp_path / "out" / "manifest.json").read_text())["spec"]
    assert spec["preset"] == "llama3-8b" and spec["arch"] == "llama" and spec["hidden"] == 4096
    assert (spec["layers"], spec["tp"], spec["pp"], spec["dp"], spec["num_microbatches"]) == (4, 2, 2, 1, 4)


# -- one convention: -h everywhere, one metavar style, one name per idea, sorted whole command list ---

def test_command_list_is_sorted_and_whole():
    done = invoke("-h")
    assert done.exit_code == 0, done.stderr
    section = done.stdout.split("Commands:\n", 1)[1]
    names = [line.split()[0] for line in section.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert len(names) >= 13 and names == sorted(names), names
    assert not [line for line in section.splitlines() if line.endswith("...")]  # click cut each at ~45 characters


def test_every_command_takes_h_and_names_values_one_way():
    from traceforge.cli import app

    for command in app.registered_commands:
        done = invoke(command.name, "-h")
        assert done.exit_code == 0, (command.name, done.stderr)
        assert done.stdout.startswith("Usage: ") and f" {command.name} " in done.stdout.splitlines()[0], command.name
        # typer's own names for values (help text may show placeholders such as <prefix>.<rank>.et)
        typer_style = re.findall(r"<(?:int|str|float|path|bool|list\[\w+\])>|\{[a-z_]+\}", done.stdout)
        assert not typer_style, (command.name, typer_style)


@pytest.mark.parametrize("command", ["generate", "plan", "report", "check", "simulate"])
def test_every_command_that_draws_progress_takes_quiet(command):
    assert "-q, --quiet" in invoke(command, "-h").stdout


def test_one_name_for_how_many_rows():
    for command in ("plan", "check", "diff"):
        assert "-n, --limit N" in invoke(command, "-h").stdout, command
    old = invoke("plan", "-p", "demo", "--gpus", "2", "--budget", "1", "-q", "-k", "1", "--json")
    assert old.exit_code == 0 and len(json.loads(old.stdout)["candidates"]) == 1
    assert "--top/-k is deprecated: use --limit 1" in old.stderr


def test_report_names_the_test_matrix_files_only_when_it_wrote_them(make_set, tmp_path):
    """The test matrix said "full memberships in test_matrix.csv/json" with no -o, when no file
    was written; with -o it names the files it wrote."""
    from cli_runner import invoke

    _, directory, _ = make_set("demo")
    shown = invoke("report", directory, "-q", "--no-timeline")
    assert shown.exit_code == 0 and "--out DIR writes full memberships" in shown.stdout
    assert "test_matrix.csv" not in shown.stdout
    written = invoke("report", directory, "-q", "--no-timeline", "-o", tmp_path / "rep")
    assert f"full memberships in {tmp_path / 'rep'}/test_matrix.csv and .json" in " ".join(written.stdout.split())
    assert (tmp_path / "rep" / "test_matrix.csv").is_file() and (tmp_path / "rep" / "test_matrix.json").is_file()


def test_the_summary_lists_every_value_the_flags_changed(tmp_path):
    """--world-size on a preset raised dp and so cut the micro-batches per step; the summary
    named only the dp change (llama3-70b at 1,024 GPUs: 32 -> 4 micro-batches, silently)."""
    from cli_runner import invoke

    done = invoke("generate", "-p", "llama3-8b", "--layers", 2, "--world-size", 64, "-o", tmp_path / "w")
    assert done.exit_code == 0, done.stderr
    changed = next(line for line in done.stdout.splitlines() if "values the flags changed" in line)
    assert "dp=8 (preset: 4)" in changed and "num_microbatches=8 (preset: 16)" in changed, changed
    assert "world_size" not in changed  # given, not changed by other flags
