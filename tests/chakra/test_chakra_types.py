"""Attributes in exactly the AttributeProto members Chakra writes and reads.

Chakra's v1 feeder (mlcommons/chakra src/feeder/et_feeder_node.cpp, the ETFeederNode
constructor; what ASTRA-sim read until early 2025) reads each attribute through one typed
accessor, and protobuf answers 0 for a oneof member that is not the one set. The table below is
copied by hand from that constructor, independently of traceforge.chakra.schema; the producers' side is
taken from Chakra's own code (mlc-chakra's generator and PyTorch converter) at run time.
"""

from __future__ import annotations

import oracle as traffic
import pytest
from mutate import edit

from traceforge.chakra import fields as F
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.check.run import check_trace_set
from traceforge.config import build_spec
from traceforge.program import ops
from traceforge.program.stage import build_program
from traceforge.read.reader import attr_value, find_rank_files, read_trace

# et_feeder_node.cpp: attr_name -> the accessor its constructor calls.
V1_FEEDER = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_priority": "int32_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "pg_name": "string_val",
}


def v1_read(node: pb.Node) -> dict[str, object]:
    """A node's attributes as the v1 feeder sees them: each through its typed accessor, so a
    value in another member reads as protobuf's default (0, false, empty)."""
    return {a.name: getattr(a, V1_FEEDER[a.name]) for a in node.attr if a.name in V1_FEEDER}


def test_table_is_the_v1_feeders():
    for name in S.V1_READ:
        assert S.ATTR_MEMBER[name] == V1_FEEDER[name], name
    # every attribute we write is in the table, and every integer member is one protobuf has
    assert set(S.ATTR_MEMBER) >= S.V1_READ
    assert all(member in F.MEMBER_FIELD for member in S.ATTR_MEMBER.values())


def _members(nodes) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in nodes:
        for a in node.attr:
            out.setdefault(a.name, set()).add(a.WhichOneof("value"))
    return out


def test_our_members_match_chakras_own_producers(tmp_path, monkeypatch, make_set):
    generator = pytest.importorskip("chakra.src.generator.generator")
    converter_module = pytest.importorskip("chakra.src.converter.pytorch_converter")
    from chakra.schema.protobuf import et_def_pb2 as chakra_pb
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    monkeypatch.chdir(tmp_path)
    generator.one_comp_node(2, 5)
    generator.one_remote_mem_load_node(2, 1024)
    generator.one_comm_coll_node_allreduce(2, 65536)
    generator.one_comm_send_node(2, 1024)
    theirs: list = []
    for prefix in ("one_comp_node", "one_remote_mem_load_node", "ALL_REDUCE", "one_comm_send_node"):
        handle = openFileRd(str(tmp_path / f"{prefix}.0.et"))
        decodeMessage(handle, chakra_pb.GlobalMetadata())
        node = chakra_pb.Node()
        while decodeMessage(handle, node):
            theirs.append(node)
            node = chakra_pb.Node()
        handle.close()
    # The PyTorch converter on a minimal host+device trace: one NCCL AllReduce kernel.
    attrs = [{"name": n, "type": "uint64", "value": 0} for n in ("rf_id", "fw_parent", "seq_id", "scope", "tid",
                                                                  "fw_tid")] + [{"name": "op_schema", "type": "string",
                                                                                 "value": ""}]
    tensor = {"values": [[10, 11, 0, 1024, 4, "cuda:0"]], "shapes": [[1024]], "types": ["Tensor(float)"]}
    empty = {"values": [], "shapes": [], "types": []}
    trace = {"schema": "1.0.2-chakra.0.0.4", "pid": 1, "time": "t", "start_ts": 0, "finish_ts": 10, "nodes": [
        {"id": 1, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": None, "inputs": empty,
         "outputs": empty, "attrs": attrs},
        {"id": 2, "name": "nccl:all_reduce", "ctrl_deps": 1, "inputs": tensor, "outputs": tensor, "attrs": attrs},
        {"id": 3, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ctrl_deps": 2, "cat": "kernel",
         "pg_name": "7", "exclusive_dur": 5, "inputs": tensor, "outputs": tensor, "attrs": attrs},
    ]}
    converter = converter_module.PyTorchConverter()
    _, json_nodes = converter.parse_json_trace(trace)
    json_nodes = converter.establish_parent_child_relationships(json_nodes, [])
    converted: dict = {}
    converter.convert_json_to_protobuf_nodes(json_nodes, converted)
    assert any(n.type == chakra_pb.COMM_COLL_NODE for n in converted.values())
    theirs += converted.values()
    chakra = _members(theirs)
    assert {"is_cpu_op", "tensor_size", "comm_type", "comm_size", "pg_name"} <= set(chakra)

    _, out, _ = make_set("demo", cp=2, dp=1, order="megatron")
    _, files = find_rank_files(out)
    ours = _members(read_trace(files[0]).nodes)
    shared = set(chakra) & set(ours)
    assert shared >= {"is_cpu_op", "tensor_size", "comm_type", "comm_size", "pg_name"}
    for name in shared:
        assert ours[name] == chakra[name], name  # one member each, Chakra's


def test_v1_feeder_reads_true_peers_tags_and_sizes_on_pp_cp(make_set):
    spec, out, _ = make_set("demo", cp=2, dp=1, order="megatron")
    ts = traffic.load_set(out)
    order = spec.order
    sizes = {"tp": spec.tp, "cp": spec.cp, "ep": 1, "dp": spec.dp, "pp": spec.pp}
    _, files = find_rank_files(out)
    sends, recvs = [], []
    seen_dims = set()
    for rank, path in files.items():
        for node, oracle in zip(read_trace(path).nodes, ts.nodes[rank], strict=True):
            v1 = v1_read(node)
            true = {a.name: attr_value(a) for a in node.attr if a.name in V1_FEEDER}
            assert v1 == true, (rank, node.name)  # nothing reads as 0 through the typed accessor
            if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                src, dst, tag, size = v1["comm_src"], v1["comm_dst"], v1["comm_tag"], v1["comm_size"]
                me, other = (src, dst) if node.type == pb.COMM_SEND_NODE else (dst, src)
                assert me == rank and size > 0
                dim = oracle.dim
                seen_dims.add(dim)
                n = sizes[dim]
                ring = dim == "cp"  # ring attention wraps; the pipeline does not
                c = traffic.coord_of(rank, order, sizes)[dim]
                neighbours = {traffic.rank_of({**traffic.coord_of(rank, order, sizes), dim: (c + d) % n}, order, sizes)
                              for d in (-1, 1) if ring or 0 <= c + d < n}
                assert other in neighbours, (rank, node.name, other)
                (sends if node.type == pb.COMM_SEND_NODE else recvs).append((src, dst, tag, size))
            elif node.type == pb.COMP_NODE:
                assert v1["tensor_size"] > 0 and v1["num_ops"] > 0
    assert seen_dims == {"pp", "cp"}
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)


def _as_int64(nodes: list[pb.Node]) -> None:
    """Rewrite every integer attribute as int64_val (what traceforge wrote before)."""
    for node in nodes:
        for a in node.attr:
            which = a.WhichOneof("value")
            if which in ("int32_val", "uint64_val"):
                a.int64_val = getattr(a, which)


def test_check_warns_where_the_v1_feeder_reads_zero(make_set):
    _, out, _ = make_set("demo")
    assert check_trace_set(out, jobs=1).findings == []
    edit(out, 3, _as_int64)
    (out / "manifest.json").unlink()  # as another tool's set: no manifest whose sha256 the edit breaks
    sends = [n for n in read_trace(out / "workload.3.et").nodes if n.type == pb.COMM_SEND_NODE]
    assert sends and v1_read(sends[0])["comm_dst"] == 0 != attr_value(next(a for a in sends[0].attr
                                                                              if a.name == "comm_dst"))
    result = check_trace_set(out, jobs=1)
    assert result.ok and result.exit_code == 0  # warnings only: current ASTRA-sim reads any integer
    warned = {(f.rank, f.message.split(" ")[0]) for f in result.warnings}
    assert warned >= {(3, "comm_dst"), (3, "comm_src"), (3, "comm_tag"), (3, "tensor_size")}
    assert all(f.rank == 3 and f.node_id is not None and f.kind == "attribute" for f in result.warnings)


def test_durations_carry_rounding_so_each_stage_sums_to_the_model(monkeypatch):
    """Every prefix of a stage's compute sums to the model's exact time within half a microsecond,
    though many of its kernels are far shorter than one."""
    exact: list[float] = []
    original = ops.ProgramBuilder.compute

    def record(self, name, cost):
        exact.append(cost.micros)
        return original(self, name, cost)

    monkeypatch.setattr(ops.ProgramBuilder, "compute", record)
    for overrides in (dict(), dict(gpu="b200", hidden=128, ffn_hidden=256, heads=4, kv_heads=4, seq_len=32, micro_batch=1,
                                              gpu_efficiency=0.5)):  # the flat roofline: no launch floor
        spec = build_spec("demo", overrides=overrides)
        for stage in range(spec.pp):
            exact.clear()
            program = build_program(spec, stage)  # uncached: the recorder must see it built
            durations = [op.duration_micros for op in program.ops if op.type == ops.NodeType.COMP]
            assert len(durations) == len(exact) > 10
            total = written = 0.0
            for d, e in zip(durations, exact, strict=True):
                total += e
                written += d
                assert abs(written - total) <= 0.5 + 1e-6
            assert abs(sum(durations) - sum(exact)) <= 1
            if overrides:
                assert sum(e < 0.5 for e in exact) > 10  # the case per-kernel rounding gets wrong
