"""`traceforge plan` as a user meets it: the table piped whole, --write-top's folder, --sweep's
table, plot and sweep.csv, the help, and one line and exit 2 for every input it cannot answer."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest
from cli_runner import invoke, one_line_error

from traceforge.search.proof import Proof

# demo on 16 GPUs of 8 per node: data parallelism crosses nodes, so the scale-out link matters.
QUERY = ("plan", "-p", "demo", "--dp-mode", "ddp", "--recompute", "none", "-q", "-j", "1")


def _table_rows(text: str) -> list[list[str]]:
    """The cells of a rich table's rows (header included), from its box-drawing lines."""
    return [[c.strip() for c in line.strip().strip("┃│").split("┃" if "┃" in line else "│")]
            for line in text.splitlines() if line.lstrip().startswith(("┃", "│"))]


def _close(cell: str, value: float, digits: int = 3) -> bool:
    """A table cell shows value to its printed precision (3 significant digits, or whole)."""
    shown = float(cell.replace(",", "").rstrip("xMkG"))
    return abs(shown - value) <= max(abs(value) * 10 ** (1 - digits), 0.5 if "." not in cell else 0)


def test_piped_table_shows_every_column_whole():
    """Without a terminal (a pipe, a file) no column is cut: the table is as wide as it needs,
    even past the 160 columns rich assumes, and each cell shows what --json says."""
    table = invoke(*QUERY, "--gpus", 16, "-n", 5)
    doc = json.loads(invoke(*QUERY, "--gpus", 16, "-n", 5, "--json").stdout)
    assert table.exit_code == 0, table.stderr
    assert "…" not in table.stdout
    lines = [line for line in table.stdout.splitlines() if line.lstrip().startswith(("┏", "┃", "│", "└"))]
    assert len({len(line) for line in lines}) == 1 and len(lines[0]) > 160  # one width, wider than rich's cut
    header, *rows = _table_rows(table.stdout)
    for name in ("tp", "cp", "pp", "dp", "ep", "vp", "mb", "#mb", "schedule", "recompute", "dp mode", "step ms",
                 "tokens/s", "TFLOP/s", "MFU %", "compute ms", "x-dp ms", "idle ms", "peak GB", "free GB"):
        assert name in header, name
    col = {name: header.index(name) for name in header}
    # a row "a-b" stands for ranks a to b, alike but in one layout cell, shown as "x/y" (merge_ties)
    ranks = [(int(r[col["#"]].partition("-")[0]), int(r[col["#"]].rpartition("-")[2]), r) for r in rows]
    expanded = [row for first, last, row in ranks for _ in range(first, last + 1)]
    assert [first for first, _, _ in ranks] == [1] + [last + 1 for _, last, _ in ranks[:-1]]
    assert len(expanded) == len(doc["candidates"]) == 5
    for row, c in zip(expanded, doc["candidates"], strict=True):
        cells = [row[col[k]].split("/") for k in ("tp", "cp", "pp", "dp", "ep", "vp", "mb", "#mb")]
        values = [c[k] for k in ("tp", "cp", "pp", "dp", "ep", "vp", "micro_batch", "num_microbatches")]
        assert all(str(v) in cell for cell, v in zip(cells, values, strict=True))
        for k, key in (("schedule", "schedule"), ("recompute", "recompute"), ("dp mode", "dp_mode")):
            assert c[key] in row[col[k]].split("/")
        assert _close(row[col["step ms"]], c["step_ms"])
        assert _close(row[col["MFU %"]], 100 * c["mfu"], 2)
        assert _close(row[col["peak GB"]], c["peak_bytes"] / 1e9, 2)
    assert f"best: traceforge generate {doc['candidates'][0]['flags']}" in table.stdout


@pytest.mark.slow
def test_write_top_folder(tmp_path):
    """K sets (more than -k ranks is fine), each its own folder with a spec.json that generate reads
    back into the same spec; plan.csv ranks what plan.json lists; the plot; --force replaces it."""
    from traceforge.config import build_spec

    out = tmp_path / "top"
    result = invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "-n", 1, "--write-top", 2, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}: 2 trace set(s)" in result.stdout
    doc = json.loads((out / "plan.json").read_text())
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == len(doc["candidates"]) == 2
    for folder, c in zip(folders, doc["candidates"], strict=True):
        assert folder.name.startswith(f"{folders.index(folder) + 1:02d}-t{c['tp']}-c{c['cp']}-p{c['pp']}-d{c['dp']}")
        written = json.loads((folder / "spec.json").read_text())
        manifest = json.loads((folder / "manifest.json").read_text())
        assert build_spec(None, written).to_dict() == manifest["spec"]  # the spec file is the set's spec
        assert [manifest["spec"][k] for k in ("tp", "cp", "pp", "dp", "micro_batch", "schedule")] == \
            [c[k] for k in ("tp", "cp", "pp", "dp", "micro_batch", "schedule")]
        by_file = invoke("memory", "-c", folder / "spec.json", "--json")
        by_flags = invoke("memory", *c["flags"].split(), "--json")  # the flags and the spec file agree
        assert json.loads(by_file.stdout)["peak_bytes"] == json.loads(by_flags.stdout)["peak_bytes"] == c["peak_bytes"]
        assert invoke("check", folder).exit_code == 0
    rows = list(csv.DictReader(io.StringIO((out / "plan.csv").read_text())))
    assert [(int(r["rank"]), float(r["step_ms"]), r["flags"]) for r in rows] == \
        [(i, c["step_ms"], c["flags"]) for i, c in enumerate(doc["candidates"], 1)]
    assert (out / "plan.png").is_file() or (out / "plan.svg").is_file()
    again = invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "--write-top", 1, "-o", out)
    one_line_error(again, "not empty", "--force")
    fewer = invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "--micro-batch", 8, "--tp", 8, "--write-top", 3,
                   "-o", tmp_path / "fewer")  # tp 8 leaves dp 1: one micro-batch of 8, one layout
    assert f"wrote {tmp_path / 'fewer'}: 1 trace set(s), all 1 that fit," in fewer.stdout, fewer.stderr
    assert len([p for p in (tmp_path / "fewer").iterdir() if p.is_dir()]) == 1
    assert invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "--write-top", 1, "-o", out, "--force").exit_code == 0
    assert len([p for p in out.iterdir() if p.is_dir()]) == 1


def test_plots_are_svg_without_matplotlib(tmp_path, monkeypatch):
    """Without the plot extra both plots are SVG: one bar per ranked candidate, one per swept value."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    top = tmp_path / "top"
    assert invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "-n", 3, "--write-top", 1, "-o", top).exit_code == 0
    svg = "{http://www.w3.org/2000/svg}"
    bars = [r for r in ET.parse(top / "plan.svg").getroot().iter(f"{svg}rect") if r.find(f"{svg}title") is not None]
    assert len(bars) == 3 and not (top / "plan.png").exists()
    sweep = tmp_path / "sweep"
    assert invoke(*QUERY, "--gpus", 16, "--schedule", "1f1b", "--sweep", "--scale-out-bw", "25,50,100",
                  "-o", sweep).exit_code == 0
    bars = [r for r in ET.parse(sweep / "sweep.svg").getroot().iter(f"{svg}rect") if r.find(f"{svg}title") is not None]
    assert len(bars) == 3 and sorted(p.name for p in sweep.iterdir()) == ["sweep.csv", "sweep.svg"]


@pytest.mark.slow
def test_sweep_one_table_one_plot(tmp_path):
    """--sweep: a row per value with its best layout, the speedup over the first value (its best
    step over this one's), the same in --json and sweep.csv; more bandwidth never slows the best."""
    args = (*QUERY, "--gpus", 16, "--schedule", "1f1b", "--sweep", "--scale-out-bw", "12.5,25,100")
    doc = json.loads(invoke(*args, "--json").stdout)
    assert doc["sweep"] == "--scale-out-bw" and [p["value"] for p in doc["points"]] == [12.5, 25.0, 100.0]
    best = [p["candidates"][0] for p in doc["points"]]
    assert all(p["gpus"] == 16 and len(p["candidates"]) == 1 for p in doc["points"])
    steps = [c["step_ms"] for c in best]
    assert steps[0] > steps[-1] and steps == sorted(steps, reverse=True)  # dp crosses nodes: bandwidth helps
    out = tmp_path / "sweep"
    table = invoke(*args, "-o", out)
    assert table.exit_code == 0, table.stderr
    header, *rows = _table_rows(table.stdout)
    assert header == ["--scale-out-bw GB/s", "best layout", "step ms", "tokens/s", "TFLOP/s", "MFU %", "peak GB",
                      "speedup vs 12.5"]
    assert [r[0] for r in rows] == ["12.5", "25", "100"]
    for row, c in zip(rows, best, strict=True):
        assert row[1].startswith(f"tp{c['tp']} cp{c['cp']} pp{c['pp']} dp{c['dp']} ")
        assert _close(row[2], c["step_ms"])
        assert row[-1] == f"{steps[0] / c['step_ms']:.2f}x"
    assert rows[0][-1] == "1.00x"
    lines = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert [(float(r["scale-out-bw"]), float(r["step_ms"]), r["flags"]) for r in lines] == \
        [(p["value"], c["step_ms"], c["flags"]) for p, c in zip(doc["points"], best, strict=True)]
    assert (out / "sweep.png").is_file() or (out / "sweep.svg").is_file()


def test_sweep_over_gpus():
    doc = json.loads(invoke(*QUERY, "--schedule", "1f1b", "--sweep", "--gpus", "4,8", "--json").stdout)
    assert doc["sweep"] == "--gpus" and [(p["value"], p["gpus"]) for p in doc["points"]] == [(4, 4), (8, 8)]
    assert all(c["tp"] * c["cp"] * c["pp"] * c["dp"] == p["gpus"] for p in doc["points"] for c in p["candidates"])


@pytest.mark.parametrize("args, words", [
    (("--gpus", "8", "--sweep", "--scale-out-bw", "25,abc"), ("--scale-out-bw", "25,abc")),
    (("--gpus", "0,8", "--sweep"), ("--gpus 0",)),
    (("--gpus", "8,0", "--sweep"), ("--gpus 0",)),  # refused before the first value is searched
    (("--gpus", "8", "--sweep", "--scale-out-bw", "50,-1"), ("--scale-out-bw", "-1")),
    (("--gpus", "8,16", "--sweep", "--scale-out-bw", "25,50"), ("one value at a time", "--gpus", "--scale-out-bw")),
    (("--gpus", "8", "--sweep", "--scale-out-bw", "25,25"), ("repeats",)),
    (("--gpus", "8", "--sweep", "--scale-out-bw", "25,,50"), ("empty item",)),
    (("--gpus", "8", "--sweep", "--scale-out-bw", "25"), ("several comma-separated values",)),
    (("--gpus", "8", "--scale-out-bw", "25,50"), ("add --sweep",)),
    (("--gpus", "8,7", "--sweep"), ("--gpus 7", "none of the", "legal", "seq_len")),  # a value with no legal layout
    (("--gpus", "8", "--sweep", "--scale-up-topology", "switch,ring"), ("--scale-up-topology", "ASTRA-sim bundle")),
])
def test_bad_sweep_one_line_nothing_written(tmp_path, args, words):
    out = tmp_path / "out"
    one_line_error(invoke(*QUERY, *args, "-o", out), *words)
    assert list(tmp_path.iterdir()) == []  # no DIR, no partial sibling


@pytest.mark.parametrize("args, words", [
    # 7 GPUs: tp 1 (7 is no divisor of a node); cp 1 leaves dp 7, which divides no global batch of 8:
    # no micro-batch; cp 7: dp 1, micro-batch 1, 2, 4, 8, schedule 1f1b or gpipe: 8 layouts, each
    # refused because 2 x cp does not divide seq_len 512.
    (("--gpus", "7"), ("none of the 8 layouts for 7 GPUs is legal", "all of them", "seq_len", "cp 7")),
    (("--gpus", "8", "--tp", "3"), ("--tp 3", "divide the GPUs")),  # a fixed value no layout has
    (("--gpus", "8", "--pp", "8"), ("pp 8", "layers (4) must be at least pp", "lower --pp")),
    (("--gpus", "8", "--global-batch", "3", "--micro-batch", "2"), ("global_batch", "divisible")),
    (("--gpus", "8", "--gpu-memory-gb", "0.5"), ("none of the", "fits in GPU memory", "0.5 GB", "smallest needs",
                                                 "drop --dp-mode ddp, --recompute none")),  # the axes QUERY fixed
    (("--gpus", "0"), ("--gpus 0",)),
    (("--gpus", "x"), ("--gpus",)),
    (("--gpus", "8", "--dp", "2"), ("--dp is what plan decides",)),
    (("--gpus", "8", "--limit", "0"), ("--limit",)),
    (("--gpus", "8", "--top", "0"), ("--top",)),  # the deprecated spelling names itself
    (("--gpus", "8", "-k", "2", "--limit", "3"), ("--top", "--limit")),
    (("--gpus", "8", "--write-top", "2"), ("needs -o DIR",)),
    (("--gpus", "8", "--write-top", "0", "-o", "x"), ("--write-top must be at least 1",)),
    (("--gpus", "8", "-o", "x"), ("-o DIR",)),
    (("--gpus", "8", "--astra-sim"), ("--write-top",)),
    (("--gpus", "8", "--scale-up-topology", "torus"), ("--scale-up-topology", "torus")),
    (("--gpus", "8", "--shard", "0/2", "--write-top", "1", "-o", "x"), ("--shard", "--merge")),
    (("--gpus", "8", "--gpus-per-node", "3", "--write-top", "1", "--astra-sim", "-o", "x"), ("whole nodes",)),
    (("--gpus", "1", "--write-top", "1", "--astra-sim", "-o", "x"), ("at least 2 NPUs",)),
])
def test_bad_input_one_line_exit_2(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke(*QUERY, *args), *words)
    assert list(tmp_path.iterdir()) == []


def test_output_dir_refused_before_searching(tmp_path):
    """A DIR plan may not write is refused at once, not after the search."""
    (tmp_path / "mine.txt").write_text("a user's file")
    one_line_error(invoke(*QUERY, "--gpus", 8, "--write-top", 1, "-o", tmp_path, "--force"), "did not write")
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_help_every_option_explained():
    """Every option plan shows has help text; what plan decides itself is hidden; the machine flags
    say they take a list (for --sweep)."""
    import typer

    from traceforge.cli import app

    command = typer.main.get_command(app).commands["plan"]  # type: ignore[attr-defined]
    shown = [p for p in command.params if not getattr(p, "hidden", False)]
    assert all(p.help and len(p.help) > 10 for p in shown), [p.name for p in shown if not p.help]
    names = {p.name for p in shown}
    assert {"gpus", "top", "write_top", "sweep", "shard", "merge", "scale_out_bw", "tp", "schedule"} <= names
    assert not names & {"dp", "world_size", "num_microbatches", "layers_per_stage"}
    text = invoke("plan", "--help").stdout
    assert "--scale-out-bw X[,...]" in text and "--gpus N[,N...]" in text and "--write-top K" in text
    assert "Searched unless given" in text and "fixes its axis" in text


def test_write_top_astra_sim_bundle_is_generates(tmp_path):
    """--astra-sim beside a written set: the same bundle `generate --astra-sim` writes from the
    candidate's flags and the same machine flags."""
    machine = ("--scale-out-bw", "100", "--gpus-per-node", "4")
    out = tmp_path / "top"
    result = invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "-n", 1, "--write-top", 1, "--astra-sim", "-o", out,
                    *machine, "--json")
    assert result.exit_code == 0, result.stderr
    flags = json.loads(result.stdout)["candidates"][0]["flags"].split()
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    again = tmp_path / "again"
    assert invoke("generate", *flags, *machine, "--astra-sim", "-o", again, "-q", "-j", 1).exit_code == 0
    bundle = sorted(p.name for p in again.iterdir() if p.name.startswith(("astra_", "run_astra")))
    assert len(bundle) >= 3
    for name in bundle:
        assert (folder / name).read_bytes() == (again / name).read_bytes(), name
    assert invoke("check", folder).exit_code == 0


def test_json_document_keys_exactly_the_issues():
    doc = json.loads(invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "-n", 2, "--json").stdout)
    assert list(doc) == ["gpus", "considered", "legal", "feasible", "seconds", "exact", "floor_ms", "proven_gap",
                         "layouts_not_validated", "candidates_not_replayed", "layouts_could_rank", "candidates_could_rank",
                         "replayed", "too_big", "budget", "budget_spent", "timeout_s", "timed_out", "reproducible",
                         "limit", "fewer_rows", "candidates"]
    assert [list(c) for c in doc["candidates"]] == [["tp", "pp", "dp", "cp", "ep", "vp", "micro_batch",
                                                     "num_microbatches", "schedule", "recompute", "dp_mode",
                                                     "step_ms", "tflops_per_gpu", "mfu", "peak_bytes",
                                                     "allocated_bytes", "reserved_bytes", "verdict", "flags"]] * 2
    assert doc["considered"] >= doc["legal"] >= doc["feasible"] >= 2 and doc["gpus"] == 8


def test_every_feasible_layout_beyond_the_replay_limit(monkeypatch):
    """When the replay refuses every feasible candidate (too many nodes), plan says so in one line
    instead of printing an empty table; one refused among others is counted in a note."""
    from traceforge.search import candidates as search
    from traceforge.timing.engine import ReplayTooBig

    real = search.estimate

    def too_big(spec, link):
        raise ReplayTooBig("stand-in: over the node limit")

    monkeypatch.setattr(search, "estimate", too_big)
    one_line_error(invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b"), "feasible layouts have more nodes", "--global-batch")

    def some_too_big(spec, link):
        if spec.micro_batch == 1:
            raise ReplayTooBig("stand-in")
        return real(spec, link)

    monkeypatch.setattr(search, "estimate", some_too_big)
    result = invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "--all")
    assert result.exit_code == 0, result.stderr
    header, *rows = _table_rows(result.stdout)
    assert rows and all(row[header.index("mb")] != "1" for row in rows)
    feasible = int(re.search(r"([0-9,]+) fit in memory", result.stdout).group(1).replace(",", ""))
    not_ranked = int(re.search(r"note: ([0-9,]+) feasible candidates .* not ranked", result.stdout).group(1))
    assert not_ranked > 0 and len(rows) + not_ranked == feasible


@pytest.mark.parametrize("key, value", [("num_microbatches", 4), ("layers_per_stage", "2,2"),
                                        ("account_for_loss_in_pipeline_split", True)])
def test_spec_file_may_not_set_what_plan_decides(tmp_path, key, value):
    """As the flags: a spec file that fixes the micro-batch count or the layer split is refused by
    name (it would change every candidate's global batch or pipeline, silently)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"preset": "demo", "dp": 2, key: value}))
    one_line_error(invoke(*QUERY, "-c", spec, "--gpus", 8), str(spec), key, "plan decides")
    spec.write_text(json.dumps({"preset": "demo", "dp": 2, "world_size": 4}))  # these a candidate overrides
    assert invoke(*QUERY, "-c", spec, "--gpus", 8, "--schedule", "1f1b", "-n", 1).exit_code == 0


def test_default_gpu_memory_is_memorys():
    """Without --gpu-memory-gb plan sizes against the GPU's memory as `traceforge memory` does: each
    candidate fits there, with the same peak, and the table's headroom is memory's GPU less the peak."""
    args = (*QUERY, "--gpus", 8, "--schedule", "1f1b", "--gpu", "a100", "-n", 3)
    doc = json.loads(invoke(*args, "--json").stdout)
    header, *rows = _table_rows(invoke(*args).stdout)
    for c, row in zip(doc["candidates"], rows, strict=True):
        mem = json.loads(invoke("memory", *c["flags"].split(), "--gpu", "a100", "--json").stdout)
        assert mem["fits"] and mem["peak_bytes"] == c["peak_bytes"]
        assert _close(row[header.index("free GB")], (mem["gpu_memory_bytes"] - c["peak_bytes"]) / 1e9, 3)


def test_flags_reproduce_from_a_spec_file_with_a_space(tmp_path):
    """The printed flags are shell words: a spec file whose path has a space stays one word, and
    generate run with them writes the candidate."""
    import shlex

    spec = tmp_path / "my specs" / "demo.yaml"
    spec.parent.mkdir()
    spec.write_text("preset: demo\nseq_len: 256\n")
    doc = json.loads(invoke(*QUERY, "-c", spec, "--gpus", 4, "--schedule", "1f1b", "-n", 1, "--json").stdout)
    words = shlex.split(doc["candidates"][0]["flags"])
    assert words[words.index("-c") + 1] == str(spec)
    out = tmp_path / "set"
    assert invoke("generate", *words, "-o", out, "-q", "-j", 1).exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["spec"]["seq_len"] == 256


def test_table_shows_every_group_left_exposed(tmp_path):
    """hsdp's data parallelism runs on its shard and replica groups: the table shows them (x-dps,
    x-dpr), with plan.csv's figures, and every group any row leaves exposed has its column."""
    out = tmp_path / "top"
    result = invoke(*QUERY[:3], "--recompute", "none", "--dp-mode", "hsdp", "-q", "-j", 1, "--gpus", 16, "-n", 3,
                    "--schedule", "1f1b", "--write-top", 1, "-o", out)
    assert result.exit_code == 0, result.stderr
    header, *rows = _table_rows(result.stdout)
    ranked = list(csv.DictReader(io.StringIO((out / "plan.csv").read_text())))
    groups = [k[len("exposed_"):-len("_ms")] for k in ranked[0]
              if k.startswith("exposed_") and any(float(r[k]) > 0 for r in ranked)]
    assert {"dps", "dpr"} <= set(groups)
    assert {h for h in header if h.startswith("x-")} == {f"x-{g} ms" for g in groups}
    for row, r in zip(rows, ranked, strict=True):
        for g in groups:
            assert _close(row[header.index(f"x-{g} ms")], float(r[f"exposed_{g}_ms"]))


def test_flags_reproduce_a_candidate_sized_against_given_memory(tmp_path):
    """With --gpu-memory-gb above the GPU's, plan ranks candidates generate's memory gate would refuse
    on the GPU's own memory: the printed flags carry the memory, so generate writes them."""
    big = ("--hidden", 4096, "--heads", 32, "--layers", 32, "--gpus", 1, "--schedule", "1f1b", "-n", 1)
    doc = json.loads(invoke(*QUERY, *big, "--gpu-memory-gb", 200, "--json").stdout)
    c = doc["candidates"][0]
    assert c["peak_bytes"] > 100e9  # more than an h100 has: only the given memory admits it
    assert c["flags"].split()[-2:] == ["--gpu-memory-gb", "200.0"]
    assert invoke("generate", *c["flags"].split(), "-o", tmp_path / "set", "-q", "-j", 1).exit_code == 0
    without = [w for w in c["flags"].split() if w not in ("--gpu-memory-gb", "200.0")]
    one_line_error(invoke("generate", *without, "-o", tmp_path / "no", "-q"), "more than the h100's")


@pytest.mark.slow
def test_plot_of_many_candidates_shows_the_best(tmp_path, monkeypatch):
    """--all can rank thousands: the plot keeps the best PLOT_MAX bars (a PNG that wide would not
    render) and says so; plan.csv keeps them all."""
    from traceforge.plan_output.write import PLOT_MAX

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "top"
    assert invoke(*QUERY, "--gpus", 8, "--schedule", "1f1b", "--all", "--write-top", 1, "-o", out).exit_code == 0
    ranked = list(csv.DictReader(io.StringIO((out / "plan.csv").read_text())))
    assert len(ranked) > PLOT_MAX
    root = ET.parse(out / "plan.svg").getroot()
    svg = "{http://www.w3.org/2000/svg}"
    assert len([r for r in root.iter(f"{svg}rect") if r.find(f"{svg}title") is not None]) == PLOT_MAX
    assert f"the best {PLOT_MAX} of {len(ranked):,}" in ET.tostring(root, encoding="unicode")


@pytest.mark.slow
def test_sweep_says_which_values_the_budget_cut_short(monkeypatch):
    """A value whose search ran out of --budget may not show its best: the sweep says which, and by
    how much at most (its best step over the floor no unreplayed candidate can beat)."""
    args = (*QUERY, "--gpus", 16, "--sweep", "--scale-out-bw", "25,50")
    cut = invoke(*args, "--budget", "1e-9")
    notes = [line for line in cut.stdout.splitlines() if line.startswith("note: at --scale-out-bw")]
    assert [n.split()[3] for n in notes] == ["25", "50"] and all("--budget ran out" in n for n in notes)
    exact = invoke(*args, "--budget", 0)
    assert "note:" not in exact.stdout
    _, *cut_rows = _table_rows(cut.stdout)
    _, *exact_rows = _table_rows(exact.stdout)
    for note, c, e in zip(notes, cut_rows, exact_rows, strict=True):
        within = float(note.split("within ")[1].split(" %")[0])
        cut_ms, exact_ms = float(c[2].replace(",", "")), float(e[2].replace(",", ""))
        assert cut_ms >= exact_ms  # the cut-short best is never better than the exact best
        assert cut_ms / exact_ms - 1 <= within / 100 + 0.01  # and no further off than the note says


def test_json_says_on_stderr_when_the_budget_ran_out():
    """--json's keys are fixed (docs/plan.md): a spent --budget is a note on stderr, stdout stays the document."""
    cut = invoke(*QUERY, "--gpus", 8, "-n", 2, "--json", "--budget", "1e-9")
    assert cut.exit_code == 0 and json.loads(cut.stdout)["candidates"]
    assert "--budget ran out" in cut.stderr
    assert "--budget" not in invoke(*QUERY, "--gpus", 8, "-n", 2, "--json", "--budget", 0).stderr


def test_the_budget_note_says_exact_when_no_unreplayed_bound_is_below_the_best():
    """The certificate's wording: a floor at or above the best step makes the best exact; below
    it, the best is within best/floor - 1 of the best of the space."""
    from traceforge.cli.plan import _distance

    def cut(best: float, floor: float) -> Proof:
        return Proof(limit=3, shown=3, best_ms=best, floor_ms=floor, kth_ms=200.0, layouts_not_validated=1,
                     candidates_not_replayed=1, layouts_could_rank=0, candidates_could_rank=1, replayed=3, too_big=0,
                     budget=1000, budget_spent=1000, timeout_s=None, stopped_by="budget")

    assert "exact" in _distance(cut(100.0, 100.0)) and "exact" in _distance(cut(100.0, 120.0))
    below = _distance(cut(110.0, 100.0))
    assert "within 10.0 %" in below and "no layout is faster than 100" in below and "exact" not in below
    assert cut(110.0, 100.0).proven_gap == pytest.approx(0.1) and cut(100.0, 120.0).proven_gap == 0.0
    assert not cut(110.0, 100.0).exact and "not known" in _distance(cut(110.0, 0.0))


def test_merge_ties_by_hand():
    from traceforge.cli.plan import merge_ties

    rows = [["a", "x", "1"], ["a", "y", "1"], ["a", "z", "1"],  # one cell differs, the same one: one row
            ["b", "x", "1"], ["b", "x", "2"],  # another run, another cell
            ["c", "x", "1"], ["c", "y", "2"],  # two cells differ: two rows
            ["d", "x", "1"], ["d", "y", "1"], ["d", "x", "2"]]  # the third differs in another cell than the run
    assert merge_ties(rows, range(3)) == [(1, 3, ["a", "x/y/z", "1"]), (4, 5, ["b", "x", "1/2"]), (6, 6, ["c", "x", "1"]),
                                          (7, 7, ["c", "y", "2"]), (8, 9, ["d", "x/y", "1"]), (10, 10, ["d", "x", "2"])]
    # only the given columns may differ (the table's layout cells, never a figure)
    assert merge_ties(rows[3:5], (0, 1)) == [(1, 1, ["b", "x", "1"]), (2, 2, ["b", "x", "2"])]
    assert merge_ties([], range(3)) == []


def test_candidates_that_tie_on_every_figure_are_one_row_and_json_keeps_each():
    # One stage and one micro-batch per step (dp 8 of a global batch of 8): 1F1B and GPipe run the
    # same passes, so the two candidates tie on every figure and print as one row "1-2".
    query = ("plan", "-p", "demo", "--gpus", 8, "--global-batch", 8, "--tp", 1, "--cp", 1, "--pp", 1,
             "--dp-mode", "zero3", "--recompute", "none", "-n", 2)
    doc = json.loads(invoke(*query, "--json").stdout)
    assert [c["schedule"] for c in doc["candidates"]] == ["1f1b", "gpipe"]
    assert doc["candidates"][0]["step_ms"] == doc["candidates"][1]["step_ms"]
    table = invoke(*query)
    assert table.exit_code == 0, table.stderr
    header, *rows = _table_rows(table.stdout)
    assert len(rows) == 1
    assert rows[0][header.index("#")] == "1-2" and rows[0][header.index("schedule")] == "1f1b/gpipe"
    assert "listed once" in table.stdout


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards of a small plan, for --merge."""
    where = tmp_path_factory.mktemp("shards")
    for k in range(2):
        done = invoke(*QUERY, "--gpus", 8, "--micro-batch", 1, "-n", 3, "--shard", f"{k}/2", "-o", where)
        assert done.exit_code == 0, done.stderr
    return where


@pytest.mark.parametrize("args, words", [
    (("--write-top", "1"), ("--write-top has no meaning with --merge",)),
    (("--gpus", "8"), ("--gpus has no meaning with --merge",)),
    (("--seq-len", "1024"), ("--seq-len has no meaning with --merge",)),
    (("--budget", "-1"), ("--budget has no meaning with --merge",)),
    (("--timeout", "5"), ("--timeout has no meaning with --merge",)),
    (("--scale-out-bw", "25"), ("--scale-out-bw has no meaning with --merge",)),
    (("-p", "demo"), ("--preset has no meaning with --merge",)),
    (("--all",), ("--all has no meaning with --merge",)),
    (("-n", "0"), ("--limit must be at least 1, got 0",)),
    (("-n", "4"), ("-n 4", "ranked their best 3")),
])
def test_merge_refuses_what_it_cannot_use(shards, args, words):
    """--merge prints what its shards found: an option it would ignore is refused by name, one line."""
    one_line_error(invoke("plan", "--merge", shards, *args), *words)


def test_merge_takes_how_to_print_it(shards):
    doc = json.loads(invoke("plan", "--merge", shards, "--json", "-q").stdout)
    assert len(doc["candidates"]) == 3 and doc["limit"] == 3 and doc["exact"] and doc["proven_gap"] == 0.0
    two = json.loads(invoke("plan", "--merge", shards, "--json", "-n", 2).stdout)
    assert two["candidates"] == doc["candidates"][:2] and two["limit"] == 2 and two["exact"]


def test_fewer_rows_than_asked_are_said():
    """A budget spent after one replay ranks one row of the five asked: the table says so, and why,
    and the document's fewer_rows names the reason; a space with fewer candidates says that."""
    table = invoke(*QUERY, "--gpus", 8, "-n", 5, "--budget", "0.001k")
    assert table.exit_code == 0, table.stderr
    assert "note: 1 row, not the 5 asked (-n 5): --budget ran out before more were replayed" in table.stdout
    doc = json.loads(invoke(*QUERY, "--gpus", 8, "-n", 5, "--budget", "0.001k", "--json").stdout)
    assert len(doc["candidates"]) == 1 and doc["fewer_rows"] == "budget" and doc["limit"] == 5 and not doc["exact"]
    small = ("plan", "-p", "demo", "--gpus", 8, "--tp", 1, "--cp", 1, "--pp", 1, "--dp-mode", "zero3", "--recompute",
             "none", "--micro-batch", 1, "-q", "-j", 1, "-n", 20)
    every = json.loads(invoke(*small, "--json").stdout)
    assert 0 < len(every["candidates"]) < 20 and every["fewer_rows"] == "space" and every["exact"]
    assert f"note: {len(every['candidates'])} rows, not the 20 asked (-n 20)" in invoke(*small).stdout


def test_free_memory_is_never_negative_zero():
    """A tight candidate a hair over the GPU's memory has headroom -0.04 GB: shown 0.0, not -0.0."""
    from traceforge.cli import out
    from traceforge.cli.plan import _gb, print_table

    assert _gb(-40_000_000) == "0.0" and _gb(-60_000_000) == "-0.1" and _gb(0) == "0.0" and _gb(1.26e9) == "1.3"
    row = {"tp": 1, "cp": 1, "pp": 1, "dp": 8, "ep": 1, "vp": 1, "micro_batch": 1, "num_microbatches": 1,
           "schedule": "1f1b", "recompute": "none", "dp_mode": "ddp", "shard_size": None, "step_ms": 1.0,
           "tokens_per_s": 1e6, "tflops_per_gpu": 100.0, "mfu": 0.1, "compute_ms": 0.9, "exposed_ms": {},
           "bubble_ms": 0.1, "peak_bytes": 85_540_000_000, "headroom_bytes": -40_000_000, "verdict": "tight",
           "flags": "-p demo"}
    proof = Proof(limit=1, shown=1, best_ms=1.0, floor_ms=None, kth_ms=1.0, layouts_not_validated=0,
                  candidates_not_replayed=0, layouts_could_rank=0, candidates_could_rank=0, replayed=1, too_big=0,
                  budget=None, budget_spent=10, timeout_s=None, stopped_by=None)
    with out.capture() as captured:
        print_table("plan", [row], {"considered": 1, "legal": 1, "feasible": 1, "seconds": 0.1, "proof": proof})
    text = captured.get()
    assert "-0.0" not in text and "85.5!" in text
    cells = _table_rows(text)
    assert cells[1][cells[0].index("free GB")] == "0.0"
