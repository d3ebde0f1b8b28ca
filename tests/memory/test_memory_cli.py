"""`traceforge memory` and generate's feasibility gate: the JSON contract, the refusal that
leaves nothing behind, and hostile memory flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke, one_line_error

from traceforge.config import build_spec
from traceforge.config.presets import PRESETS
from traceforge.memory import memory_report


def test_json_is_exactly_the_contract():
    done = invoke("memory", "-p", "llama3-8b", "--json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == ["gpu", "gpu_memory_bytes", "peak_bytes", "fits", "allocated_bytes", "reserved_bytes", "verdict",
                         "stages"]
    assert [list(s) for s in doc["stages"]] == [["stage", "weights", "gradients", "optimizer", "activations", "buffers",
                                                 "overhead", "peak", "fits", "allocated_bytes", "reserved_bytes",
                                                 "verdict"]] * 2
    spec = build_spec("llama3-8b")
    assert doc == memory_report(spec).to_json()
    assert doc["peak_bytes"] == max(s["peak"] for s in doc["stages"])


def test_table_names_every_stage_and_the_verdict():
    done = invoke("memory", "-p", "llama3-70b", "--gpu", "custom", "--gpu-tflops", "500", "--gpu-hbm-gbps", "2000",
                  "--gpu-memory-gb", "30")
    assert done.exit_code == 0, done.stderr
    assert "does NOT fit" in done.stdout and "30.0 GB" in done.stdout
    assert all(f"│     {s} │" in done.stdout for s in range(4))


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "1e300"])
def test_hostile_gpu_memory_is_one_line(value):
    one_line_error(invoke("memory", "--gpu-memory-gb", value), "gpu-memory-gb")
    one_line_error(invoke("memory", "--overhead-gb", value if value != "0" else "-0.5"), "context-gb")
    one_line_error(invoke("memory", "--context-gb", value if value != "0" else "-0.5"), "context-gb")
    one_line_error(invoke("memory", "--allocator-reserve-pct", value if value != "0" else "101"), "allocator-reserve-pct")


def test_non_number_is_one_line_from_the_real_command():
    done = subprocess.run([sys.executable, "-m", "traceforge", "memory", "--gpu-memory-gb", "lots"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "traceforge: error:" in done.stderr, done.stderr


def test_custom_gpu_needs_its_memory():
    one_line_error(invoke("memory", "--gpu", "custom", "--gpu-tflops", "100", "--gpu-hbm-gbps", "1000"), "--gpu-memory-gb")


def test_refusal_leaves_no_output_and_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(invoke("generate", "-p", "llama3-70b", "--seq-len", "131072", "-o", "out"),
                          "stage 0", "GB per GPU", "h100", "--recompute full", "--pp", "--cp", "--allow-oom")
    assert "85.5 GB" in line
    assert list(tmp_path.iterdir()) == []


def test_absurd_tp1_70b_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("generate", "-p", "llama3-70b", "--tp", "1", "--pp", "1", "--dp", "128", "-o", "out"), "stage 0", "h100")
    assert list(tmp_path.iterdir()) == []


def test_generate_writes_a_tight_spec_with_a_warning_and_refuses_one_that_does_not_fit(tmp_path, monkeypatch):
    """Between allocated + context and the peak: written, warned; below: refused, nothing written."""
    monkeypatch.chdir(tmp_path)
    s = memory_report(build_spec("demo"), 10**15).worst
    floor = s.peak - (s.reserved - s.allocated)
    between = (floor + s.peak) / 2 / 1e9
    done = invoke("generate", "--gpu-memory-gb", f"{between:.6f}", "-o", "tight")
    assert done.exit_code == 0, done.stderr
    assert "memory is tight" in done.stderr and Path("tight/manifest.json").exists()
    refused = invoke("generate", "--gpu-memory-gb", f"{(floor - 10**6) / 1e9:.6f}", "-o", "no")
    assert refused.exit_code == 2 and "without the allocator's reserve" in refused.stderr
    assert not Path("no").exists()
    table = invoke("memory", "--gpu-memory-gb", f"{between:.6f}")
    assert ": tight;" in table.stdout and "GiB" in table.stdout


def test_allow_oom_writes_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = invoke("generate", "--gpu-memory-gb", "1", "--allow-oom", "-o", "out")
    assert done.exit_code == 0, done.stderr
    assert "writing anyway (--allow-oom)" in done.stderr and Path("out/manifest.json").exists()


def test_summary_prints_the_peak_per_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = invoke("generate", "-o", "out")
    report = memory_report(build_spec("demo"))
    line = next(x for x in done.stdout.splitlines() if "memory per GPU" in x)
    assert f"peak {report.peak_bytes / 1e9:,.1f} GB" in line
    assert "by stage " + " ".join(f"{s.peak / 1e9:.1f}" for s in report.stages) in line


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_fits_its_gpu(name):
    report = memory_report(build_spec(name))
    assert report.fits, (name, report.peak_bytes / 1e9)
