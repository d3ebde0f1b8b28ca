"""The refusals and summaries a new user met, each one line naming the file, the key and the fix:
a spec key spelt as Megatron spells it, an output on a file system without storage or in a folder
this user may not write, the hidden folder's name kept out of errors, a GPU count the flags
changed without saying so, a preset value the flags changed shown as the preset's, and which
layout `memory` sized."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.base import output
from traceforge.config import FIELD_BY_NAME
from traceforge.config.build import KEY_ALIASES

SMALL = ("--layers", "2")


def test_a_megatron_key_in_a_spec_file_names_the_file_and_our_key(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text("preset: llama3-8b\ntensor_parallel: 4\n")
    line = one_line_error(invoke("memory", "-c", spec))
    assert str(spec) in line and "'tensor_parallel'" in line and "did you mean 'tp'?" in line
    assert "sequence_parallel" not in line  # what spelling alone suggested


def test_every_alias_names_a_key_that_exists():
    assert {v for v in KEY_ALIASES.values() if v not in FIELD_BY_NAME} == set()
    assert not set(KEY_ALIASES) & set(FIELD_BY_NAME)


def test_output_on_a_file_system_without_storage_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(invoke("generate", *SMALL, "-o", "/proc/traceforge-out"))
    assert "/proc" in line and "without storage" in line and "-o/--out" in line and "0.00 GB" not in line


def test_a_folder_this_user_may_not_write_is_refused_before_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = output.os.access
    monkeypatch.setattr(output.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))  # root may write anywhere
    line = one_line_error(invoke("generate", *SMALL, "-o", locked / "x"))
    assert str(locked) in line and "may not write" in line and ".tf-" not in line
    assert list(locked.iterdir()) == []


def test_an_error_inside_the_hidden_folder_names_the_output(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(PermissionError) as caught, output.atomic_output_dir(out, force=False) as hidden:
        raise PermissionError(errno.EACCES, "Permission denied", str(hidden / "workload.3.et"))
    assert caught.value.filename == str(out / "workload.3.et")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


def test_a_gpu_count_the_flags_changed_is_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # llama3-70b is tp 8 x pp 4 x dp 4 = 128 GPUs; --pp 3 keeps tp 8 and dp 4: 8 x 3 x 4 = 96
    done = invoke("generate", "-p", "llama3-70b", "--pp", "3", "--layers", "6", "--global-batch", "8", "-o", "out")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("wrote 96 ranks")
    assert "96 GPUs, not llama3-70b's 128: tp 8 x pp 3 x dp 4" in lines[1] and "--world-size or --dp" in lines[1]
    same = invoke("generate", "-p", "llama3-70b", "--dp", "4", "--layers", "4", "--global-batch", "8", "-o", "out2")
    assert "GPUs, not" not in same.stdout  # nothing changed the count


def test_a_preset_value_the_flags_changed_is_not_shown_as_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # llama3-70b has SP on; SP needs tp > 1, so --tp 1 turns it off
    done = invoke("generate", "-p", "llama3-70b", "--tp", "1", "--pp", "2", "--dp", "1", "--layers", "2",
                  "--global-batch", "2", "-o", "out")
    assert done.exit_code == 0, done.stderr
    from_preset = next(line for line in done.stdout.splitlines() if "from preset llama3-70b:" in line)
    assert "sequence_parallel" not in from_preset
    assert "sequence_parallel=False (preset: True)" in done.stdout


def test_memory_names_the_layout_and_both_units():
    done = invoke("memory", "-p", "llama3-70b")
    assert done.exit_code == 0, done.stderr
    first = done.stdout.splitlines()[0]
    # the preset's layout (tp 8, pp 4, dp 4; 128 / (1 x 4) = 32 micro-batches) and SP on
    assert first.startswith("llama3-70b sized as tp8 pp4 dp4, 32 micro-batches of 1, 1f1b, dist-opt") and "SP on" in first
    # the H100's 81,559 MiB: 81,559 x 2^20 = 85.52e9 bytes = 79.65 GiB
    assert "85.5 GB (79.6 GiB)" in first and "85.5 GB (79.6 GiB)" in done.stdout.splitlines()[-1]
