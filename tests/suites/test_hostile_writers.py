"""Every command that writes obeys one output rule (docs/output-contract.md): shards never
replace another tool's files, never land in cwd or home, never mix two specs; combine writes
only inside OUT and refuses sets it cannot renumber; export --force replaces its own export;
a run refused early still cleans what a killed run left."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_runner import dead_pid, invoke, one_line_error
from mutate import attr, edit, set_int, set_str

from traceforge.base.output import _temp_stem
from traceforge.chakra._proto import traceforge_et_pb2 as pb

SMALL = ("--layers", "2", "-q")


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


# -- generate --shard ---------------------------------------------------------------------------


def test_shard_never_replaces_another_tools_rank_file(home, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "workload.0.et").write_bytes(b"another tool's trace")
    for force in ((), ("--force",)):
        one_line_error(invoke("generate", *SMALL, "--shard", "0/2", "-o", out, *force), "did not write")
    assert (out / "workload.0.et").read_bytes() == b"another tool's trace"
    assert sorted(p.name for p in out.iterdir()) == ["workload.0.et"]


@pytest.mark.parametrize("where", ["cwd", "home"])
def test_shard_never_writes_into_cwd_or_home(home, where):
    target = Path(".") if where == "cwd" else home
    one_line_error(invoke("generate", *SMALL, "--shard", "0/2", "-o", target), "directory")
    assert list(target.iterdir()) == []


def test_forced_shard_never_mixes_into_another_specs_set(home, tmp_path):
    out = tmp_path / "set"
    assert invoke("generate", *SMALL, "-o", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one_line_error(invoke("generate", "--layers", "4", "-q", "--shard", "0/2", "--force", "-o", out), "another spec")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_forced_shard_of_the_same_spec_rewrites_its_own_files(home, tmp_path):
    out = tmp_path / "d"
    for k in (0, 1):
        assert invoke("generate", *SMALL, "--shard", f"{k}/2", "-o", out).exit_code == 0
    one_line_error(invoke("generate", *SMALL, "--shard", "0/2", "-o", out), "--force")
    assert invoke("generate", *SMALL, "--shard", "0/2", "--force", "-o", out).exit_code == 0
    assert invoke("merge", out).exit_code == 0
    assert invoke("check", out).exit_code == 0


# -- combine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["../x", "/abs/path", "", "sub/x", ".hidden"])
def test_combine_prefix_is_a_plain_name(make_set, tmp_path, prefix):
    _, a, _ = make_set("demo")
    out = tmp_path / "out" / "c"
    one_line_error(invoke("combine", a, a, "-o", out, "--prefix", prefix), "--prefix")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("x.*"))


def test_combine_refuses_a_folder_of_unmerged_shards(make_set, tmp_path):
    _, a, _ = make_set("demo")
    shards = tmp_path / "shards"
    assert invoke("generate", *SMALL, "--shard", "0/1", "-o", shards).exit_code == 0
    one_line_error(invoke("combine", a, shards, "-o", tmp_path / "c"), "merge")
    assert not (tmp_path / "c").exists()


def test_combine_refuses_a_set_without_comm_groups(make_set, tmp_path):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo")
    (b / "comm_group.json").unlink()
    one_line_error(invoke("combine", a, b, "-o", tmp_path / "c"), "comm_group.json")


@pytest.mark.parametrize("peer", [8, 10**6, "seven"])
def test_combine_refuses_a_send_to_a_rank_outside_its_job(make_set, tmp_path, peer):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo")

    def forge(nodes):
        send = next(n for n in nodes if n.type == pb.COMM_SEND_NODE)
        if isinstance(peer, str):
            for x in send.attr:
                if x.name == "comm_dst":
                    x.ClearField("int32_val")
            set_str(send, "comm_dst", peer)
        else:
            set_int(send, "comm_dst", peer)
        assert attr(send, "comm_dst") == peer

    edit(b, 0, forge)
    one_line_error(invoke("combine", a, b, "-o", tmp_path / "c"), "comm_dst", "workload.0.et")
    assert not (tmp_path / "c").exists()


def test_combine_placement_file_nested_100000_deep(make_set, tmp_path):
    _, a, _ = make_set("demo")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(invoke("combine", a, a, "-o", tmp_path / "c", "--placement", deep), "nested too deeply")


def test_combine_placement_fifo_does_not_hang(make_set, tmp_path):
    _, a, _ = make_set("demo")
    fifo = tmp_path / "place.json"
    os.mkfifo(fifo)
    one_line_error(invoke("combine", a, a, "-o", tmp_path / "c", "--placement", fifo), "FIFO")


# -- export and early refusals ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "goal", "simai"])
def test_export_force_replaces_its_own_earlier_export(make_set, tmp_path, fmt):
    _, a, _ = make_set("demo")
    out = tmp_path / "exp"
    assert invoke("export", a, "--format", fmt, "-o", out).exit_code == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    one_line_error(invoke("export", a, "--format", fmt, "-o", out), "--force")
    res = invoke("export", a, "--format", fmt, "-o", out, "--force")
    assert res.exit_code == 0, res.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # deterministic, and complete


def test_export_force_still_refuses_a_users_lone_file(make_set, tmp_path):
    _, a, _ = make_set("demo")
    out = tmp_path / "exp"
    out.mkdir()
    (out / "thesis.txt").write_text("mine")
    one_line_error(invoke("export", a, "--format", "goal", "-o", out, "--force"), "did not write")
    assert (out / "thesis.txt").read_text() == "mine"


def test_a_run_refused_early_still_removes_a_killed_runs_partial_output(home, tmp_path):
    out = tmp_path / "out"
    assert invoke("generate", *SMALL, "-o", out).exit_code == 0
    stale = tmp_path / f"{_temp_stem(out.resolve())}.partial-{dead_pid()}"
    stale.mkdir()
    (stale / "workload.0.et").write_bytes(b"x" * 1000)
    one_line_error(invoke("generate", *SMALL, "-o", out), "not empty")  # no --force: refused early
    assert not stale.exists()
    assert json.loads((out / "manifest.json").read_text())["tool"] == "traceforge"


# -- absurd numbers -----------------------------------------------------------------------------


def test_jitter_past_the_simulators_clock_is_refused_not_written(tmp_path):
    out = tmp_path / "j"
    # exp(10 z) over 100 micro-batches of draws reaches ~1e16 µs: 1000x past ASTRA-sim's ns clock
    res = invoke("generate", "-q", "-o", out, "--compute-jitter", "10", "--num-microbatches", "100")
    one_line_error(res, "µs per step", "--compute-jitter")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tf-")]


def test_check_and_generate_share_the_clock_limit(make_set, tmp_path):
    from traceforge.chakra.schema import MAX_STEP_MICROS, NS_CLOCK_LIMIT

    assert MAX_STEP_MICROS * 1000 < NS_CLOCK_LIMIT <= (MAX_STEP_MICROS + 1) * 1000
    _, a, _ = make_set("demo")

    def stretch(nodes):
        comp = next(n for n in nodes if n.type == pb.COMP_NODE)
        comp.duration_micros = MAX_STEP_MICROS + 1  # x1000 reaches 2^63 ns: below the old 2^62 µs limit
    edit(a, 0, stretch)
    res = invoke("check", a)
    assert res.exit_code == 1 and "overflows ASTRA-sim's nanosecond clock" in res.output, res.output


@pytest.mark.parametrize("value, dtype, words", [
    (1e300, "float64", ["token count 1e+300"]),
    (1 << 63, "uint64", ["token count 9.22337e+18"]),
    (-1, "int64", ["negative token count -1"]),
])
def test_routing_counts_that_do_not_fit_are_named_truly(tmp_path, value, dtype, words):
    import warnings

    import numpy as np

    from traceforge.base.errors import SpecError
    from traceforge.config import build_spec

    small = dict(arch="llama", layers=2, hidden=128, ffn_hidden=256, heads=4, kv_heads=4, vocab=512, seq_len=64,
                 tied_embeddings=False, experts=8, top_k=2, tp=1, pp=1, dp=4, ep=4, order="megatron",
                 num_microbatches=2)
    path = tmp_path / "counts.npy"
    np.save(path, np.full((2, 2, 4, 4), value, dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's cast warning is a failure
        with pytest.raises(SpecError) as info:
            build_spec("demo", overrides=dict(small, moe_routing=f"trace:{path}"))
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.slow
def test_error_path_needs_no_open_when_every_open_fails(tmp_path):
    """From the 3rd output file on every open() fails (an audit hook refuses it): the error is
    still one line, not an ImportError from a lazily imported module on the way out."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(f'''
import sys
seen = [0]
def hook(event, args):
    if event == "open":
        if ".partial-" in str(args[0]):
            seen[0] += 1
        if seen[0] >= 3:
            raise PermissionError(13, "Permission denied (injected)", str(args[0]))
from traceforge.cli import main
sys.argv = ["traceforge", "generate", "-q", "-j", "1", "-o", {str(tmp_path / "out")!r}]
sys.addaudithook(hook)
main()
''')
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Permission denied (injected)" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bw, written", [(0.001, None), (0.3, None), (25, 200), (12.5, 100)])
def test_htsim_bandwidth_is_whole_gbps_or_refused(tmp_path, bw, written):
    out = tmp_path / "h"
    res = invoke("generate", *SMALL, "-o", out, "--astra-sim", "--astra-sim-backend", "htsim", "--scale-out-bw", bw)
    if written is None:
        one_line_error(res, "whole Gb/s", "--scale-out-bw")
        assert not out.exists()
    else:
        assert res.exit_code == 0, res.output
        assert f"Downlink_speed_Gbps {written}\n" in (out / "astra_htsim.topo").read_text()  # GB/s x 8


# -- older commands: side files we wrote are input once on disk ---------------------------------


@pytest.mark.parametrize("forge, field", [
    (lambda d: d["spec"].update(tp="two"), "spec.tp"),
    (lambda d: d["spec"].update(pp=None), "spec.pp"),
    (lambda d: d.update(world_size="8x"), "world_size"),
    (lambda d: d["spec"].update(compute_jitter=float("inf")), "Infinity"),
    (lambda d: d.update(spec=[1, 2]), "spec"),
])
@pytest.mark.parametrize("command", ["report", "diff"])
def test_forged_manifest_field_is_one_line(make_set, tmp_path, forge, field, command):
    _, a, _ = make_set("demo")
    _, b, _ = make_set("demo")
    doc = json.loads((b / "manifest.json").read_text())
    forge(doc)
    (b / "manifest.json").write_text(json.dumps(doc))
    args = {"report": ("report", b, "--no-timeline"), "diff": ("diff", a, b)}[command]
    one_line_error(invoke(*args), "manifest.json", field)


def test_show_survives_a_forged_manifest_spec(make_set):
    _, a, _ = make_set("demo")
    doc = json.loads((a / "manifest.json").read_text())
    doc["spec"]["tp"] = "two"
    (a / "manifest.json").write_text(json.dumps(doc))
    res = invoke("show", a, "--rank", "1", "--range", "0:2")
    assert res.exit_code == 0 and res.output.startswith("# rank 1: "), res.output  # only the coordinates go


@pytest.mark.parametrize("content", ["metadata only", "one zero byte"])
@pytest.mark.parametrize("as_json", [False, True])
def test_report_reads_a_rank_file_without_nodes(make_set, content, as_json):
    from traceforge.chakra.frame import frames
    from traceforge.chakra.wire import varint

    _, a, _ = make_set("demo")
    path = a / "workload.3.et"
    if content == "metadata only":
        _, meta = next(frames(path.read_bytes()))
        path.write_bytes(varint(len(meta)) + bytes(meta))
    else:
        path.write_bytes(b"\x00")
    res = invoke("report", a, "--no-timeline", *(("--json",) if as_json else ()))
    assert res.exit_code == 0, res.output  # no traceback; check names the empty rank
    check = invoke("check", a)
    assert check.exit_code != 0 and "workload.3.et" in check.output


def test_show_json_prints_a_list_valued_attribute_as_a_list(make_set):
    _, a, _ = make_set("demo")

    def listify(nodes):
        coll = next(n for n in nodes if n.type == pb.COMM_COLL_NODE)
        for x in coll.attr:
            if x.name == "comm_size":
                coll.attr.remove(x)
                break
        coll.attr.add(name="comm_size", int64_list=pb.Int64List(values=[1, 2, 3]))
        for x in coll.attr:
            if x.name == "comm_type":
                coll.attr.remove(x)
                break
        coll.attr.add(name="comm_type", int64_list=pb.Int64List(values=[0]))
    edit(a, 1, listify)
    res = invoke("show", a, "--rank", "1", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert rows[0]["comm_size"] == [1, 2, 3] and rows[0]["comm_type"] == "[0]"


@pytest.mark.slow
@pytest.mark.parametrize("args", [("show", "{d}"), ("export", "{d}", "--rank", "0"), ("check", "{d}", "--json"), ("presets",),
                                  ("report", "{d}", "--json", "--no-timeline")])
def test_stdout_answer_with_stdout_closed_is_an_error(make_set, args):
    import subprocess
    import sys

    _, a, _ = make_set("demo")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "traceforge", *(x.format(d=a) for x in args)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)},
                          pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(1))
    assert done.returncode == 2 and "stdout is closed" in done.stderr, done.stderr


def test_straggler_on_jitter_is_refused_without_a_numpy_cast_warning(tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value encountered in cast" would be a traceback
        res = invoke("generate", "-q", "-o", tmp_path / "s", "--straggler", "1:1000", "--compute-jitter", "10",
                     "--num-microbatches", "100")
    one_line_error(res, "µs per step")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("target", ["manifest.json", "missing/x.csv"])
def test_calibrate_refuses_its_output_before_measuring(make_set, tmp_path, target):
    _, a, _ = make_set("demo")
    path = a / target
    before = path.read_bytes() if path.exists() else None
    res = invoke("calibrate", "-o", path)  # refused before PyTorch is even looked for
    one_line_error(res, "-o/--out")
    assert "PyTorch" not in res.stderr
    assert (path.read_bytes() if path.exists() else None) == before


@pytest.mark.parametrize("name", ["comm_group.json", "manifest.json"])
def test_merge_never_replaces_another_tools_side_file(home, tmp_path, name):
    out = tmp_path / "d"
    for k in (0, 1):
        assert invoke("generate", *SMALL, "--shard", f"{k}/2", "-o", out).exit_code == 0
    (out / name).write_text('{"theirs": true}')
    one_line_error(invoke("merge", out), "did not write")
    assert (out / name).read_text() == '{"theirs": true}'


# -- plan --merge (a command added since): its shard files are side files too ---------------------


@pytest.fixture(scope="module")
def plan_shards(tmp_path_factory) -> Path:
    """Both shards of one plan, written once: each test forges its own copy."""
    out = tmp_path_factory.mktemp("plan") / "s"
    for k in (0, 1):
        assert invoke("plan", "--gpus", "8", "--dp-mode", "ddp", "--recompute", "none", "--shard", f"{k}/2",
                      "-o", out, "-q").exit_code == 0
    assert invoke("plan", "--merge", out, "-q").exit_code == 0  # unforged, they merge
    return out


@pytest.mark.parametrize("forge, field", [
    (lambda d: d["rows"][0].update(bound_ms="x"), "rows[0].bound_ms"),
    (lambda d: d["rows"][0].update(tp=-3), "rows[0].tp"),
    (lambda d: d["rows"].__setitem__(0, {}), "rows[0].tp"),
    (lambda d: d["rows"][0].update(exposed_ms=[1]), "rows[0].exposed_ms"),
    (lambda d: d["rows"][0].update(step_ms=float("inf")), "Infinity"),
])
def test_forged_plan_shard_row_is_one_line(plan_shards, tmp_path, forge, field):
    out = tmp_path / "s"
    shutil.copytree(plan_shards, out)
    path = out / "plan-shard-0-of-2.json"
    doc = json.loads(path.read_text())
    forge(doc)
    path.write_text(json.dumps(doc))
    one_line_error(invoke("plan", "--merge", out, "-q"), "plan-shard-0-of-2.json", field)


def test_plan_shard_nested_100000_deep_is_one_line(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "plan-shard-0-of-1.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(invoke("plan", "--merge", out, "-q"), "nested too deeply")
