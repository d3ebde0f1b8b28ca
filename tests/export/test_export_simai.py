"""The SimAI export: SimAI's own line format (checked against Chakra's reader of the same layer
format), every nanosecond and byte of the chosen stage accounted for, and refusals of what the
format cannot carry."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceforge.cli import app, load_commands
from traceforge.read.reader import attrs, read_trace

KEYS = ("model_parallel_NPU_group:", "ep:", "pp:", "vpp:", "ga:", "all_gpus:", "checkpoints:", "checkpoint_initiates:")
COMMS = {f"{base}{suffix}" for base in ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL")
         for suffix in ("", "_EP", "_DP_EP")} | {"NONE"}


def parse(path: Path) -> tuple[dict, list[list[str]]]:
    lines = path.read_text().splitlines()
    tokens = lines[0].split()
    assert tokens[0] == "HYBRID_TRANSFORMER_FWD_IN_BCKWD"
    header = {}
    i = 1
    while i < len(tokens):  # `key: value` pairs, then pp_comm
        key = tokens[i]
        assert key in KEYS or key == "pp_comm", key
        header[key.rstrip(":")] = int(tokens[i + 1])
        i += 2
    count = int(lines[1])
    rows = [ln.split() for ln in lines[2:]]
    assert len(rows) == count
    for row in rows:
        assert len(row) == 12 and row[1] == "-1"
        assert row[3] in COMMS and row[6] in COMMS and row[9] in COMMS
        assert all(int(row[k]) >= 0 for k in (2, 4, 5, 7, 8, 10, 11))
    return header, rows


def export(out: Path, target: Path, *args: str):
    load_commands()
    return CliRunner().invoke(app, ["export", str(out), "--format", "simai", "-o", str(target), *args])


def stage_rank(doc: dict, stage: int) -> int:
    return next(r["rank"] for r in doc["ranks"] if r["pp"] == stage and r["tp"] == r["dp"] == r["cp"] == r["ep"] == 0)


SETS = {
    "demo": dict(),
    "sp-zero1": dict(sequence_parallel=True, dp_mode="zero1"),
    "moe": dict(arch="llama", layers=4, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
                tied_embeddings=False, experts=8, tp=2, sequence_parallel=True, dp=4, ep=2, order="megatron",
                num_microbatches=2, moe_layer_freq=2),
    "interleaved": dict(tp=1, pp=4, dp=2, layers=8, num_microbatches=4, schedule="interleaved", virtual_stages=2),
}


@pytest.mark.parametrize("name", SETS)
def test_simai_workload_accounts_for_the_stage(make_set, tmp_path, name):
    spec, out, doc = make_set(**SETS[name])
    done = export(out, tmp_path / "s", "--stage", "0")
    assert done.exit_code == 0, done.output
    header, rows = parse(tmp_path / "s" / "workload.simai.txt")
    assert (header["model_parallel_NPU_group"], header["pp"], header["ep"], header["vpp"], header["ga"],
            header["all_gpus"]) == (spec.tp, spec.pp, spec.ep, spec.virtual_stages, spec.num_microbatches,
                                    spec.world_size)
    # the pipeline's activation message: b * s * h * e bytes, / t with sequence parallelism
    act = spec.micro_batch * spec.seq_len * spec.hidden * 2 // (spec.tp if spec.sequence_parallel else 1)
    assert header["pp_comm"] == (act if spec.pp > 1 else 0)
    # Chakra's reader of this layer format (its text converter) reads every line
    text_converter = pytest.importorskip("chakra.src.converter.text_converter")
    for row in rows:
        text_converter.Layer(" ".join(row))
    # every nanosecond of compute and every byte of collective traffic of stage 0's rank
    nodes = read_trace(out / f"workload.{stage_rank(doc, 0)}.et").nodes
    import json

    groups = json.loads((out / "comm_group.json").read_text())
    compute = sum(1000 * n.duration_micros for n in nodes if n.type == 4)
    assert sum(int(r[2]) + int(r[5]) + int(r[8]) for r in rows) == compute
    want: dict[tuple[str, str], int] = {}
    for n in nodes:
        if n.type == 7:
            a = attrs(n)
            if a["dim"] in ("emb", "mp", "world", "tpep", "tpepp"):  # left out, with a note
                continue
            size = a["comm_size"] * (len(groups[a["pg_name"]]) if a["comm_type"] == 2 else 1)
            group = {"tp": "TP", "ep": "EP", "dp": "DP", "edp": "DP_EP"}[a["dim"]]
            want[group, {0: "ALLREDUCE", 2: "ALLGATHER", 6: "ALLTOALL", 7: "REDUCESCATTER"}[a["comm_type"]]] = \
                want.get((group, {0: "ALLREDUCE", 2: "ALLGATHER", 6: "ALLTOALL", 7: "REDUCESCATTER"}[a["comm_type"]]),
                         0) + size
    got: dict[tuple[str, str], int] = {}
    for r in rows:
        for col, plain in ((3, "TP"), (6, "TP"), (9, "DP")):
            kind = r[col]
            if kind == "NONE":
                continue
            base, _, suffix = kind.partition("_")
            group = {"": plain, "EP": "EP", "DP_EP": "DP_EP"}[suffix]
            got[group, base] = got.get((group, base), 0) + int(r[col + 1])
    assert got == want


def test_default_stage_is_the_one_with_most_compute(make_set, tmp_path):
    _, out, doc = make_set()
    done = export(out, tmp_path / "s")
    assert done.exit_code == 0
    totals = {s: sum(n.duration_micros for n in read_trace(out / f"workload.{stage_rank(doc, s)}.et").nodes
                     if n.type == 4) for s in range(2)}
    best = max(totals, key=lambda s: (totals[s], -s))
    assert f"stage {best} (rank {stage_rank(doc, best)})" in done.output
    _, rows = parse(tmp_path / "s" / "workload.simai.txt")
    assert sum(int(r[2]) + int(r[5]) + int(r[8]) for r in rows) == 1000 * totals[best]


@pytest.mark.parametrize("overrides, args, message", [
    (dict(cp=2, dp=1, order="megatron"), [], "no context parallelism"),
    (dict(dp_mode="zero3"), [], "ZeRO-3"),
    (dict(), ["--stage", "2"], "--stage 2 is not a pipeline stage"),
    (dict(), ["--collective-algorithm", "ring", "--time-unit", "ps"], "add --format goal"),
])
def test_refusals_are_one_line_and_write_nothing(make_set, tmp_path, overrides, args, message):
    _, out, _ = make_set(**overrides)
    done = export(out, tmp_path / "s", *args)
    assert done.exit_code == 2 and message in done.output, done.output
    assert len(done.output.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s*"))


def test_foreign_set_without_manifest_is_refused(make_set, tmp_path):
    _, out, _ = make_set()
    (out / "manifest.json").unlink()
    done = export(out, tmp_path / "s")
    assert done.exit_code == 2 and "manifest.json" in done.output and not (tmp_path / "s").exists()


BIN = os.environ.get("SIMAI_BIN")


@pytest.mark.simulator
@pytest.mark.skipif(not BIN or not Path(BIN).is_file(), reason="set SIMAI_BIN to SimAI's SimAI_analytical")
@pytest.mark.parametrize("name", ["demo", "moe", "interleaved"])
def test_simai_analytical_runs_the_workload(make_set, tmp_path, name):
    spec, out, _ = make_set(**SETS[name])
    assert export(out, tmp_path / "s").exit_code == 0
    root = next(p for p in Path(BIN).resolve().parents if (p / "astra-sim-alibabacloud").is_dir())
    (root / "results").mkdir(exist_ok=True)  # SimAI reads its busbw tables relative to its checkout
    tag = f"traceforge-{name}-{os.getpid()}-"
    done = subprocess.run([BIN, "-w", str(tmp_path / "s" / "workload.simai.txt"), "-g", str(spec.world_size),
                           "-g_p_s", "8", "-nv", "360", "-nic", "48.5", "-n_p_s", "8", "-r", tag],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:]
    result = (root / "results" / f"{tag}EndToEnd.csv").read_text().splitlines()
    assert float(result[1].split(",")[-1]) > 0


def test_lines_are_named_after_what_they_hold_and_step_work_is_not_bubble(make_set, tmp_path):
    """Each micro-batch line is named after the forward collective that ends it; the end-of-step
    lines (DP reductions, optimizer) are named embedding_layer, the one name SimAI's report
    (Layer.cc) leaves out of its pipeline-bubble estimate."""
    _, out, doc = make_set()
    done = export(out, tmp_path / "s", "--stage", "1")
    assert done.exit_code == 0, done.output
    _, rows = parse(tmp_path / "s" / "workload.simai.txt")
    nodes = read_trace(out / f"workload.{stage_rank(doc, 1)}.et").nodes
    for mb in range(4):
        forward = [n.name.split("/", 2)[2].replace("/", "_") for n in nodes
                   if n.type == 7 and n.name.startswith(f"fwd/mb{mb}/")]
        named = [r[0][len(f"mb{mb}_"):] for r in rows if r[0].startswith(f"mb{mb}_") and r[3] != "NONE"]
        assert named == forward and forward, mb
    step = [r for r in rows if r[0] == "embedding_layer"]
    optimizer = next(n for n in nodes if n.name == "step/optimizer")
    assert step == rows[:len(step)] and all(not r[0].startswith("embedding") for r in rows[len(step):])
    assert any(1000 * optimizer.duration_micros in (int(r[5]), int(r[8])) for r in step)
    assert sum(int(r[10]) for r in step) == sum(int(r[10]) for r in rows)  # all DP work is step work


def test_pipeline_message_past_stoi_is_refused(make_set, tmp_path):
    """SimAI parses pp_comm with std::stoi: b*s*h*2 = 131072*8192*2 = 2^31 bytes does not fit."""
    _, out, _ = make_set(layers=2, hidden=8192, ffn_hidden=8192, heads=64, kv_heads=64, vocab=1024, seq_len=131072,
                         tp=1, pp=2, dp=1, global_batch=1)
    done = export(out, tmp_path / "s")
    assert done.exit_code == 2 and "2,147,483,648 bytes" in done.output and "std::stoi" in done.output, done.output
    assert not (tmp_path / "s").exists()
