"""The PARAM export (PARAM's comm replay input), read back without torch or PARAM: the documents
PARAM's parser needs, element counts from bytes and dtype by hand, peers local to their group,
and a wait wherever the trace makes a later node depend on an op. The replay itself on gloo
processes is tests/export/test_replay_param.py (optional: torch and PARAM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import invoke
from mutate import edit
from param_rendezvous import stuck_ranks

from traceforge.read.reader import attrs, read_trace

COMP, SEND, RECV, COLL = 4, 5, 6, 7


def load(directory: Path, rank: int) -> tuple[dict, list[dict], dict[str, dict]]:
    """(document, its record_param_comms nodes as {name: value} plus "inputs", groups by pg_name)."""
    doc = json.loads((directory / f"rank-{rank}.json").read_text())
    init = [n for n in doc["nodes"] if n["name"] == "## process_group:init ##"]
    assert len(init) == 1
    groups = {g["pg_name"]: g for g in json.loads(init[0]["inputs"]["values"][0])}
    records = []
    for n in doc["nodes"]:
        if n["name"] == "record_param_comms":
            r = {a["name"]: a["value"] for a in n["attrs"]}
            r["inputs"] = n["inputs"]["values"]
            records.append(r)
    return doc, records, groups


def export(src: Path, dst: Path, *more: str):
    return invoke("export", src, "--format", "param", "-o", dst, *more)


def test_demo_documents_counts_and_peers(make_set, tmp_path):
    spec, out, doc = make_set()  # t=2 p=2 d=2, bf16 activations, fp32 gradients
    done = export(out, tmp_path / "p")
    assert done.exit_code == 0, done.output
    assert "8 rank files" in done.output
    groups_file = json.loads((out / "comm_group.json").read_text())
    b, s, h, t = spec.micro_batch, spec.seq_len, spec.hidden, spec.tp
    for rank in range(8):
        document, records, groups = load(tmp_path / "p", rank)
        assert document["schema"] == "1.1.0-chakra.0.0.4"
        # every group of comm_group.json, with its members, plus the pipeline pairs
        for gid, members in groups_file.items():
            assert groups[gid]["ranks"] == members and groups[gid]["group_size"] == len(members)
        ops = [r for r in records if r["collective_name"] != "wait"]
        nodes = [n for n in read_trace(out / f"workload.{rank}.et").nodes if n.type != COMP]
        assert len(ops) == len(nodes)
        for r, n in zip(ops, nodes, strict=True):
            a = attrs(n)
            assert r["pg_name"].isdecimal() and r["pg_name"] in groups
            members = groups[r["pg_name"]]["ranks"]
            name = n.name.rsplit("/", 1)[-1]
            if n.type in (SEND, RECV):
                # the peer is a rank of the op's group, counted in that group's member order
                peer = a["comm_dst"] if n.type == SEND else a["comm_src"]
                assert members[r["inputs"][2]] == peer and rank in members
                assert r["collective_name"] == ("send" if n.type == SEND else "recv")
                # the pipeline's activation (and its gradient): b * s * h bf16 elements
                assert (r["dtype"], r["in_msg_nelems"]) == ("bfloat16", b * s * h)
                assert groups[r["pg_name"]]["pg_desc"] == "pp"
                row = doc["ranks"][rank]
                assert members == sorted(x["rank"] for x in doc["ranks"]
                                         if all(x[k] == row[k] for k in ("tp", "cp", "ep", "dp")))
            elif name.endswith("tp_ar_fc2") or name.endswith("tp_ar_proj"):
                # a row-parallel output: b * s * h bf16 elements, reduced whole
                assert (r["collective_name"], r["dtype"]) == ("allreduce", "bfloat16")
                assert r["in_msg_nelems"] == r["out_msg_nelems"] == b * s * h
            elif name == "tp_ag_bcast_tokens":
                # Megatron's batch broadcast as an AllGather: b * s int64 tokens, 1/t each
                assert (r["collective_name"], r["dtype"]) == ("_allgather_base", "long")
                assert (r["in_msg_nelems"], r["out_msg_nelems"]) == (b * s // t, b * s)
            elif a["dim"] == "dp" and a["comm_size"] > 8:
                # the gradient bucket in fp32 main grads: its bytes / 4 elements
                assert (r["collective_name"], r["dtype"]) == ("allreduce", "float")
                assert r["in_msg_nelems"] * 4 == a["comm_size"]
            assert r["inputs"][1] == [r["pg_name"], groups[r["pg_name"]]["pg_desc"]]


def test_sequence_parallel_and_zero3_shards(make_set, tmp_path):
    """AllGather in = the shard, out = shard x group; ReduceScatter in = the whole input, out / group."""
    spec, out, _ = make_set(sequence_parallel=True, dp_mode="zero3")
    assert export(out, tmp_path / "p").exit_code == 0
    _, records, groups = load(tmp_path / "p", 0)
    b, s, h, t = spec.micro_batch, spec.seq_len, spec.hidden, spec.tp
    seen = set()
    for r in records:
        g = groups[r["pg_name"]]["group_size"] if r["collective_name"] != "wait" else 0
        if r["collective_name"] == "_allgather_base":
            assert r["out_msg_nelems"] == r["in_msg_nelems"] * g
            seen.add("ag")
        elif r["collective_name"] == "_reduce_scatter_base":
            assert r["in_msg_nelems"] == r["out_msg_nelems"] * g
            seen.add("rs")
        if r["collective_name"] == "_allgather_base" and r["dtype"] == "bfloat16" and \
                groups[r["pg_name"]]["pg_desc"] == "tp" and r["in_msg_nelems"] == b * s * h // t:
            seen.add("sp-gather")  # the sequence-parallel input of a column-parallel GEMM: b*s/t*h
    assert seen == {"ag", "rs", "sp-gather"}


def positions(records: list[dict]) -> tuple[dict, dict]:
    """(key -> issue index, key -> wait index), key = (pg, seq, is_p2p)."""
    issue, wait = {}, {}
    for i, r in enumerate(records):
        key = (r["pg_name"], *r["inputs"][0])
        if r["collective_name"] == "wait":
            assert key in issue and key not in wait  # one wait per op, after it
            wait[key] = i
        else:
            assert key not in issue  # keys are unique: a wait finds its op
            issue[key] = i
    assert issue.keys() == wait.keys()
    return issue, wait


def test_waits_follow_the_dependencies(make_set, tmp_path):
    """An op waits, before it is issued, for every op of another group it depends on, directly or
    through compute (PARAM drops compute); ops of one collective group keep their order."""
    _, out, _ = make_set(pp=2, tp=2, dp=2, layers=8, num_microbatches=4, overlap_grad_reduce=True, bucket_mb=1)
    assert export(out, tmp_path / "p").exit_code == 0
    for rank in (0, 3, 6):
        _, records, _ = load(tmp_path / "p", rank)
        issue, wait = positions(records)
        nodes = read_trace(out / f"workload.{rank}.et").nodes
        ops = [r for r in records if r["collective_name"] != "wait"]
        # trace node -> its op's key: ops keep the trace's order per group and per pair
        by_group: dict[tuple, list] = {}
        for r in ops:
            by_group.setdefault((r["pg_name"], r["inputs"][0][1]), []).append((r["pg_name"], *r["inputs"][0]))
        key_of = {}
        for n in nodes:
            if n.type == COMP:
                continue
            a = attrs(n)
            pg = a.get("pg_name") or next(r["pg_name"] for r in ops if r["collective_name"] in ("send", "recv")
                                          and r["pg_desc"] == a["dim"])
            key_of[n.id] = by_group[(pg, n.type != COLL)].pop(0)
        comm_deps: dict[int, set] = {}  # node -> the ops it waits for (through compute too)
        for n in nodes:
            got = set()
            for d in n.data_deps:
                got |= {d} if d in key_of else comm_deps.get(d, set())
            comm_deps[n.id] = got if n.type == COMP else set()
            if n.type == COMP:
                continue
            for d in n.data_deps:
                for c in ({d} if d in key_of else comm_deps.get(d, set())):
                    if n.type == COLL and key_of[c][0] == key_of[n.id][0] and not key_of[c][2] and d == c:
                        continue  # a collective after another of its group: the group orders them
                    assert wait[key_of[c]] < issue[key_of[n.id]], (rank, n.name, c)
        # concurrency kept: a gradient bucket (dp) is in flight while the backward's TP collectives
        # of earlier layers are issued (Megatron's overlapped gradient reduction)
        desc = {(r["pg_name"], *r["inputs"][0]): r["pg_desc"] for r in ops}
        assert any(issue[k] < issue[j] < wait[k] for k in issue if desc[k] == "dp" for j in issue if desc[j] == "tp")


PIPE = dict(hidden=64, ffn_hidden=256, heads=4, seq_len=64, vocab=256, tied_embeddings=False, tp=1, pp=4, dp=2,
            layers=8, num_microbatches=8)


TINY = {k: PIPE[k] for k in ("hidden", "ffn_hidden", "heads", "seq_len", "vocab", "tied_embeddings")}
RENDEZVOUS_SETS = [dict(PIPE, schedule=s, overlap_p2p_comm=o, **({"virtual_stages": 2} if "interleaved" in s else {}))
                   for s in ("1f1b", "gpipe", "zb-h1", "interleaved", "interleaved-zb", "zbv", "dualpipev")
                   for o in (False, True)] + [
    dict(TINY, tp=2, cp=2, pp=1, dp=2, layers=2),
    dict(TINY, arch="llama", tp=1, pp=2, dp=4, ep=4, experts=4, top_k=2, moe_routing="zipf:1.2", layers=4,
         num_microbatches=2, order="megatron"),
    dict(TINY, tp=2, pp=2, dp=2, layers=4, num_microbatches=4, dp_mode="zero3"),
]


@pytest.mark.parametrize("overrides", RENDEZVOUS_SETS,
                         ids=lambda o: o.get("schedule", "") + ("-overlap" if o.get("overlap_p2p_comm") else "")
                         + (f"-cp{o['cp']}" if o.get("cp") else "") + (f"-ep{o['ep']}" if o.get("ep") else "")
                         + ("-zero3" if o.get("dp_mode") else ""))
def test_export_completes_under_rendezvous(make_set, tmp_path, overrides):
    """Replayed as gloo runs it (a Send done once its Recv is posted, a wait blocking), the export
    of every schedule (with and without --overlap-p2p-comm), ring attention, MoE exchanges and
    ZeRO-3 reaches its end on every rank: the waits and the order the export writes add no cycle
    (e.g. a step's closing collectives never move ahead of a final Send)."""
    _, out, _ = make_set(**overrides)
    assert export(out, tmp_path / "p").exit_code == 0
    assert stuck_ranks(tmp_path / "p", 8) == {}


def test_rendezvous_model_finds_a_cycle(tmp_path):
    """The model can fail: two ranks each waiting on a Send before posting the Recv the other needs."""
    group = json.dumps([{"pg_name": "1", "pg_desc": "pp", "ranks": [0, 1], "group_size": 2, "group_count": 1}])
    for rank in (0, 1):
        peer = 1 - rank
        nodes = [{"name": "## process_group:init ##", "inputs": {"values": [group]}}]
        for name, seq in (("send", 0), ("wait", 0), ("recv", 1), ("wait", 1)):
            nodes.append({"name": "record_param_comms", "inputs": {"values": [[seq, True], ["1", "pp"], peer]},
                          "attrs": [{"name": "collective_name", "value": name}, {"name": "pg_name", "value": "1"}]})
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps({"nodes": nodes}))
    assert stuck_ranks(tmp_path, 2) == {0: 1, 1: 1}


def test_p2p_groups_of_cp_and_ep(make_set, tmp_path):
    """Ring attention's Send/Recv go in the CP ring's group; imbalanced MoE exchanges in the EP group."""
    spec, out, doc = make_set(arch="llama", layers=2, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000,
                              seq_len=256, tied_embeddings=False, tp=1, cp=2, pp=1, dp=4, experts=4, ep=4, top_k=2,
                              moe_routing="zipf:1.2", num_microbatches=2, order="megatron")
    assert export(out, tmp_path / "p").exit_code == 0
    seen = set()
    for rank in range(spec.world_size):
        _, records, groups = load(tmp_path / "p", rank)
        for r in records:
            if r["collective_name"] in ("send", "recv"):
                g = groups[r["pg_name"]]
                seen.add(g["pg_desc"])
                assert rank in g["ranks"] and g["group_size"] == {"cp": spec.cp, "ep": spec.ep}[g["pg_desc"]]
                assert r["inputs"][2] != g["ranks"].index(rank)  # never itself
    assert seen == {"cp", "ep"}


def test_bad_input_is_one_line_and_writes_nothing(make_set, tmp_path):
    _, out, _ = make_set()
    (out / "comm_group.json").unlink()
    done = export(out, tmp_path / "p")
    assert done.exit_code != 0 and "comm_group.json" in done.output and len(done.output.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()

    _, out, _ = make_set()

    def strip_dtype(nodes):
        for n in nodes:
            keep = [a for a in n.attr if a.name != "dtype"]
            del n.attr[:]
            n.attr.extend(keep)

    edit(out, 3, strip_dtype)
    done = export(out, tmp_path / "p")
    assert done.exit_code != 0 and "dtype" in done.output and len(done.output.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_force_replaces_its_own_export(make_set, tmp_path):
    _, out, _ = make_set()
    assert export(out, tmp_path / "p").exit_code == 0
    assert export(out, tmp_path / "p").exit_code != 0  # not empty
    assert export(out, tmp_path / "p", "--force").exit_code == 0


@pytest.mark.parametrize("gone", [0, 3, 7], ids=["first", "middle", "last"])
def test_a_set_missing_any_rank_is_refused_in_one_line(make_set, tmp_path, gone):
    """The manifest says 8 ranks: a missing last rank is as missing as a middle one."""
    _, out, _ = make_set()
    (out / f"workload.{gone}.et").unlink()
    done = export(out, tmp_path / "p")
    assert done.exit_code == 2 and f"no workload.{gone}.et" in done.output
    assert len(done.output.strip().splitlines()) == 1 and not (tmp_path / "p").exists()
