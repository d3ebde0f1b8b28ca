"""Interoperability with MLCommons Chakra, and the splicing encoder against the reference one.

Chakra's own schema (chakra.schema.protobuf.et_def_pb2) and reader (protolib.openFileRd /
decodeMessage) come from `pip install --no-deps mlc-chakra`, as the README's test command
installs them; they must decode every file to exactly what our reader sees.
"""

from __future__ import annotations

import oracle as traffic
import pytest
from chakra.schema.protobuf import et_def_pb2 as chakra_pb
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
from google.protobuf.json_format import MessageToDict

from traceforge.chakra._proto import traceforge_et_pb2 as our_pb
from traceforge.config import build_spec
from traceforge.parallel.layout import Layout
from traceforge.program.binding import role_ranks, role_values
from traceforge.program.stage import stage_program
from traceforge.read.reader import find_rank_files, read_trace
from traceforge.write.reference import encode_rank
from traceforge.write.splice import StageEncoder
from traceforge.write.writer import write_trace_set


def as_dict(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True)


# -- the schema ------------------------------------------------------------------------------

def _field_signature(field) -> tuple:
    return (
        field.name, field.number, field.type, field.is_repeated, field.has_presence,
        field.message_type.name if field.message_type else None,
        field.enum_type.name if field.enum_type else None,
        field.containing_oneof.name if field.containing_oneof else None,
        field.is_packed,
    )


def test_schema_is_wire_identical_to_chakra():
    ours, theirs = our_pb.DESCRIPTOR, chakra_pb.DESCRIPTOR
    assert set(ours.message_types_by_name) <= set(theirs.message_types_by_name)
    for name, message in ours.message_types_by_name.items():
        mine = sorted(_field_signature(f) for f in message.fields)
        chakra = sorted(_field_signature(f) for f in theirs.message_types_by_name[name].fields)
        assert set(mine) <= set(chakra), name
    for name, enum in ours.enum_types_by_name.items():
        assert {v.name: v.number for v in enum.values} == {
            v.name: v.number for v in theirs.enum_types_by_name[name].values
        }, name


def test_test_constants_are_chakras_enums():
    node_type = {v.name: v.number for v in chakra_pb.NodeType.DESCRIPTOR.values}
    for number, name in traffic.NODE_TYPES.items():
        assert node_type[name] == number
    coll = {v.name: v.number for v in chakra_pb.CollectiveCommType.DESCRIPTOR.values}
    for number, name in traffic.COLL_TYPES.items():
        assert coll[name] == number


# -- every file decodes with Chakra's reader to what ours sees ------------------------------------

DECODE_SETS = {
    "demo": dict(),
    "sp-zero1": dict(sequence_parallel=True, dp_mode="zero1"),
    "zero3-megatron": dict(dp_mode="zero3", order="megatron"),
    "llama-untied": dict(arch="llama", hidden=512, heads=8, kv_heads=4, ffn_hidden=1536, vocab=1000,
                         tied_embeddings=False),
    "t4p3d2-L7-steps2": dict(tp=4, pp=3, dp=2, layers=7, steps=2, num_microbatches=4),
}


def chakra_read(path) -> tuple[dict, list]:
    handle = openFileRd(str(path))
    try:
        meta = chakra_pb.GlobalMetadata()
        assert decodeMessage(handle, meta), f"{path}: Chakra reads no GlobalMetadata"
        nodes = []
        while True:
            node = chakra_pb.Node()
            if not decodeMessage(handle, node):
                break
            nodes.append(node)
        assert handle.read(1) == b"", f"{path}: Chakra stopped before the end of the file"
    finally:
        handle.close()
    return meta, nodes


@pytest.mark.parametrize("name", DECODE_SETS)
def test_chakra_reader_decodes_every_file_identically(tmp_path, name):
    out = tmp_path / name
    write_trace_set(build_spec("demo", overrides=DECODE_SETS[name]), out, jobs=1)
    _, files = find_rank_files(out)
    assert files
    allowed = {"COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE"}
    for rank, path in files.items():
        ours = read_trace(path)
        meta, nodes = chakra_read(path)
        assert as_dict(meta) == as_dict(ours.metadata), rank
        assert len(nodes) == len(ours.nodes) > 0, rank
        for theirs, mine in zip(nodes, ours.nodes, strict=True):
            assert as_dict(theirs) == as_dict(mine), (rank, mine.id)
            # Chakra sees the same kinds and collective types, by its own enum names
            assert chakra_pb.NodeType.Name(theirs.type) in allowed
            attrs = {a.name: a for a in theirs.attr}
            if theirs.type == chakra_pb.COMM_COLL_NODE:
                assert attrs["comm_type"].WhichOneof("value") == "int64_val"
                assert chakra_pb.CollectiveCommType.Name(attrs["comm_type"].int64_val) in traffic.COLL_TYPES.values()
                assert attrs["pg_name"].WhichOneof("value") == "string_val"
            # the members Chakra's v1 feeder reads (et_feeder_node.cpp; see test_chakra_types)
            for key, member in (("comm_size", "int64_val"), ("comm_src", "int32_val"), ("comm_dst", "int32_val"),
                                ("comm_tag", "int32_val"), ("num_ops", "int64_val"), ("tensor_size", "uint64_val")):
                if key in attrs:
                    assert attrs[key].WhichOneof("value") == member, (rank, theirs.id, key)
            # re-encoding with Chakra's schema gives the bytes back: nothing unknown, nothing lost
            assert theirs.SerializeToString(deterministic=True) == mine.SerializeToString(deterministic=True)


# -- the splicing encoder equals the reference encoder, byte for byte ------------------------------

SPLICE_SPECS = {
    "demo": dict(),
    "sp": dict(sequence_parallel=True),
    "zero3-gpipe-steps2": dict(dp_mode="zero3", schedule="gpipe", steps=2),
    "megatron-zero1": dict(order="megatron", dp_mode="zero1"),
    "untied-pp1": dict(tied_embeddings=False, pp=1),
    "t4p3d2-L7": dict(tp=4, pp=3, dp=2, layers=7, num_microbatches=3),
    # world > 128: rank varints take 1 or 2 bytes
    "t2p2d40": dict(tp=2, pp=2, dp=40, num_microbatches=2),
    # 112 TP groups in each stage: pg_name takes 1, 2 and 3 digits (9 -> 10, 99 -> 100)
    "t2p2d56-megatron": dict(tp=2, pp=2, dp=56, num_microbatches=1, order="megatron"),
    "t2p2d56": dict(tp=2, pp=2, dp=56, num_microbatches=1),
}


@pytest.mark.parametrize("name", SPLICE_SPECS)
def test_splice_encoder_equals_reference(name):
    spec = build_spec("demo", overrides=SPLICE_SPECS[name])
    layout = Layout.from_spec(spec)
    roles = role_ranks(layout, False)
    widths = set()
    for stage in range(spec.pp):
        program = stage_program(spec, stage)
        encoder = StageEncoder(program)
        for rank in layout.stage_ranks(stage).tolist():
            values = role_values(roles, rank)
            data, count = encoder.encode(values)
            assert count == len(program.ops)
            assert bytes(data) == encode_rank(program, values), f"{name}: rank {rank} (stage {stage})"
            widths.add(tuple(len(str(values[k])) for k in sorted(values)))
    if name.startswith("t2p2d56"):
        tp_ids = {role_values(roles, r)["tp"] for r in range(spec.world_size)}
        assert {9, 10, 99, 100} <= tp_ids
        assert len(widths) > 3, "the matrix must exercise several width signatures"


def test_written_files_equal_reference_encoding(tmp_path):
    spec = build_spec("demo", overrides=dict(tp=2, pp=2, dp=40, num_microbatches=2))
    write_trace_set(spec, tmp_path / "out", jobs=2)
    layout = Layout.from_spec(spec)
    roles = role_ranks(layout, False)
    _, files = find_rank_files(tmp_path / "out")
    assert sorted(files) == list(range(spec.world_size))
    for rank, path in files.items():
        program = stage_program(spec, int(layout.coordinate(rank)["pp"]))
        assert path.read_bytes() == encode_rank(program, role_values(roles, rank)), rank
