"""Specs a hostile user can type: each is refused in one line before anything is planned or
written, or (derived defaults) gives what --help promises."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.config import build_spec
from traceforge.parallel.layout import Layout
from traceforge.parallel.partition import stage_layer_ranges
from traceforge.program.stage import StagePlanner

REFUSED = {
    "bucket 1e308": (["--bucket-mb", "1e308"], ["bucket_mb"]),
    "tflops 5e-324": (["--gpu-tflops", "5e-324"], ["gpu_tflops"]),
    "tflops 1e-300": (["--gpu-tflops", "1e-300"], ["gpu_tflops", "0.001"]),
    "hbm 5e-324": (["--gpu-hbm-gbps", "5e-324"], ["gpu_hbm_gbps"]),
    "efficiency 5e-324": (["--gpu-efficiency", "5e-324"], ["gpu_efficiency"]),
    "world 2**42": (["--world-size", str(2**42)], ["world_size"]),
    "world above the limit": (["--world-size", str(2**23), "--tp", "1"], ["world_size", "4,194,304"]),
    "tp 2**40": (["--tp", str(2**40)], ["tp"]),
    "layers 10**12": (["--layers", str(10**12)], ["layers", "at most"]),
    "layers 100000": (["--layers", "100000"], ["nodes per rank", "--layers"]),
    "micro-batches 100000": (["--num-microbatches", "100000"], ["nodes per rank", "micro-batches"]),
    "steps 1000000": (["--steps", "1000000"], ["nodes per rank", "steps"]),
    "vocab 10**12": (["--vocab", str(10**12)], ["vocab"]),
    "jitter 1e6": (["--compute-jitter", "1e6"], ["compute_jitter", "10"]),
    "straggler 1e300": (["--straggler", "1:1e300"], ["straggler", "1000"]),
    "empty preset": (["-p", ""], ["preset"]),
    "blank preset": (["-p", " "], ["preset"]),
}


def _must_not_plan(*_args, **_kwargs):
    raise AssertionError("planned a spec that should have been refused from its numbers")


@pytest.mark.parametrize("case", REFUSED)
def test_refused_before_planning(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    # Refused from the numbers: neither the layout (numpy over every rank) nor a program is built.
    monkeypatch.setattr(Layout, "from_spec", _must_not_plan)
    monkeypatch.setattr(StagePlanner, "__init__", _must_not_plan)
    args, words = REFUSED[case]
    one_line_error(invoke("generate", "-o", "out", *args), *words)
    assert not Path("out").exists() and list(tmp_path.iterdir()) == []


def test_memory_past_the_gpu_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ("generate", "-q", "-o", "out", "--vocab", "2000000000", "--hidden", "512")
    one_line_error(invoke(*args), "stage", "GB per GPU", "h100", "--allow-oom")  # refused before writing
    assert not Path("out").exists()
    done = invoke(*args, "--allow-oom")
    assert done.exit_code == 0, done.stderr
    assert "writing anyway (--allow-oom)" in done.stderr and "h100" in done.stderr and Path("out/manifest.json").exists()


def test_pipeline_stages_are_linear_in_pp():
    spec = build_spec("demo", overrides=dict(pp=50_000, layers=50_001, tp=1, dp=1, global_batch=1))
    started = time.perf_counter()
    ranges = stage_layer_ranges(spec)
    # A hang guard, not a speed goal: linear takes milliseconds, the old cubic loop never ended.
    assert time.perf_counter() - started < 30
    # 49,999 stages give up a layer, outer ones first (last, first, second-last, ...): the one
    # keeping two is the last in that order, stage 24,999.
    assert [i for i, r in enumerate(ranges) if len(r) == 2] == [24_999] and sum(len(r) for r in ranges) == 50_001
    assert ranges[-1].stop == 50_001 and all(a.stop == b.start for a, b in zip(ranges, ranges[1:], strict=False))


# -- the derived-default trap ------------------------------------------------------------------

def test_derived_defaults_follow_the_flags_given():
    spec = build_spec(None, overrides={"hidden": 1024, "heads": 16})
    assert spec.ffn_hidden == 4 * 1024 and spec.kv_heads == 16  # not demo's 2048 and 8
    spec = build_spec("llama3-8b", overrides={"heads": 16, "kv_heads": 4, "tp": 2})
    assert spec.kv_heads == 4 and spec.ffn_hidden == 14336  # given / untouched stay


def test_summary_names_every_value_the_preset_decided(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = invoke("generate", "--hidden", "1024", "-o", "out")
    assert done.exit_code == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "from preset demo" in x)
    for value in ("layers=4", "vocab=1024", "seq_len=512", "tp=2"):
        assert value in line
    assert "hidden=" not in line and "ffn_hidden" not in line  # given, and derived from it


# -- spec files that hang, blow up or mislead ---------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "tp: *i\n"


@pytest.mark.parametrize("name,text,words", [
    ("bomb.yaml", BOMB, ["aliases"]),
    ("dup.yaml", "tp: 2\ntp: 4\n", ["tp", "twice"]),
    ("dup.json", '{"tp": 2, "tp": 4}', ["tp", "twice"]),
    ("dup.toml", "tp = 2\ntp = 4\n", ["dup.toml"]),
])
def test_spec_file_refused(tmp_path, monkeypatch, name, text, words):
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(text)
    line = one_line_error(invoke("generate", "-c", name, "-o", "out"), name, *words)
    assert len(line) < 600  # the message quotes none of the expansion


def test_huge_spec_file_is_refused_by_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("big.yaml", "w") as f:
        f.write("tp: 2\n")
        f.seek(100 * 2**20)
        f.write("\n")
    one_line_error(invoke("generate", "-c", "big.yaml", "-o", "out"), "big.yaml", "bytes")  # refused by size, unparsed


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "loop", "missing", "dir"])
def test_spec_path_that_is_not_a_regular_file(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    if kind == "fifo":
        os.mkfifo("spec.yaml")
        path, word = "spec.yaml", "FIFO"
    elif kind == "dev-zero":
        Path("spec.yaml").symlink_to("/dev/zero")
        path, word = "spec.yaml", "device"
    elif kind == "loop":
        Path("spec.yaml").symlink_to("spec.yaml")
        path, word = "spec.yaml", "cannot be opened"
    elif kind == "missing":
        path, word = "spec.yaml", "does not exist"
    else:
        Path("spec.yaml").mkdir()
        path, word = "spec.yaml", "directory"
    one_line_error(invoke("generate", "-c", path, "-o", "out"), word)


def test_json_spec_still_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.json").write_text(json.dumps({"tp": 2, "pp": 1, "dp": 1, "layers": 2}))
    assert invoke("generate", "-q", "-c", "s.json", "-o", "out").exit_code == 0


# -- an option's old and new spelling together: refused, for every renamed option -------------

def _renamed():
    from traceforge.cli import RENAMED_OPTIONS

    return [(command, old, new) for command, names in RENAMED_OPTIONS.items() for old, new in names.items()]


@pytest.mark.parametrize(("command", "old", "new"), _renamed())
def test_an_option_and_its_old_spelling_together_are_refused(tmp_path, monkeypatch, command, old, new):
    """`--context-gb 1 --overhead-gb 2` used 2 and `plan --limit 10 --top 3` used 3 (10 being the
    default, the command could not tell it was given): whichever came last won, silently."""
    monkeypatch.chdir(tmp_path)
    where = ["set"] if command in ("check", "report") else []
    for first, second in ((new, old), (old, new)):
        line = one_line_error(invoke(command, *where, first, "3", second, "2"), old, new, "give only")
        assert line.startswith("traceforge: error:")
    line = one_line_error(invoke(command, *where, f"{old}=2", f"{new}=3") if old.startswith("--") and new.startswith("--")
                          else invoke(command, *where, old, "2", new, "3"), old)
    assert "give only" in line


def test_the_old_spelling_alone_still_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke("memory", "--overhead-gb", "2", "--json").exit_code == 0


# -- silent accepts and unclear refusals ------------------------------------------------------

@pytest.mark.parametrize("attention", ["flash", "flash1"])
def test_flash_attention_in_fp32_is_refused(attention):
    """FlashAttention has no fp32 kernels: the spec was accepted and timed as if it had."""
    line = one_line_error(invoke("memory", "--attention", attention, "--dtype", "fp32", "--gpu", "a100"),
                          f"--attention {attention}", "fp32", "unfused")
    assert line.startswith("traceforge: error:")
    assert invoke("memory", "--attention", "unfused", "--dtype", "fp32", "--json").exit_code == 0


def test_nics_per_node_under_the_astra_sim_estimate_is_a_note(make_set):
    _, directory, _ = make_set("demo")
    done = invoke("report", directory, "-q", "--no-timeline", "--estimate", "astra-sim", "--nics-per-node", "4")
    assert done.exit_code == 0
    notes = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and notes[0].startswith("note: --nics-per-node has no effect"), done.stderr
    hardware = invoke("report", directory, "-q", "--no-timeline", "--estimate", "hardware", "--nics-per-node", "4")
    assert hardware.exit_code == 0 and "--nics-per-node" not in hardware.stderr


@pytest.mark.parametrize(("flag", "value"), [("--gpu-memory-gb", "100000.001"), ("--allocator-reserve-pct", "100.0001"),
                                             ("--context-gb", "1000.5"), ("--gpu-efficiency", "1.000001")])
def test_a_refusal_quotes_the_value_as_given(flag, value):
    """"at most 100,000, got 100000" read as a legal value refused: the value is quoted whole."""
    line = one_line_error(invoke("memory", flag, value), flag.lstrip("-").replace("-", "_") if flag == "--gpu-efficiency"
                          else flag)
    assert line.endswith(f"got {value}"), line


def test_a_tiny_gpu_memory_is_blamed_on_the_memory(tmp_path):
    """--gpu-memory-gb 0.001 was "over 1000x the h100's memory: check --vocab, --hidden...": the
    model is fine, the figure given is not."""
    line = one_line_error(invoke("generate", "--gpu-memory-gb", "0.001", "-o", tmp_path / "out"), "--gpu-memory-gb", "0.001")
    assert "--vocab" not in line and "h100 holds 85.5 GB" in line
    assert not (tmp_path / "out").exists()
    # a model that is absurd for the GPU's own memory is still blamed on the model
    big = invoke("generate", "-p", "llama3-70b", "--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "1",
                 "--layers", "800", "-o", tmp_path / "out")
    assert big.exit_code == 2 and "--gpu-memory-gb" not in big.stderr
