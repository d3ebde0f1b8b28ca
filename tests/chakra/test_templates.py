"""The template engine (chakra/templates.py) on its own: a file matches another's template exactly
when the two differ only inside their rank-specific values (pg_name, comm_src, comm_dst, each of
the same width); a different node count, a changed size or dependency, a truncated file, a value
of another width, a split role or a changed pinned value is no match. Whatever matches parses,
node for node, like the template's file but for those values, which the match reports.

Files are built here with protobuf's own serializer, as any Chakra writer would; expected values
are the ones written."""

from __future__ import annotations

import random

import pytest

from traceforge.chakra import schema as S
from traceforge.chakra import templates as T
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import parse_node
from traceforge.chakra.frame import frames, read_file
from traceforge.chakra.wire import varint

RANK_SPECIFIC = (S.PG_NAME, S.COMM_SRC, S.COMM_DST)


def comm(node_id: int, node_type: int, *, deps=(), size=4096, pg=None, src=None, dst=None) -> pb.Node:
    node = pb.Node(id=node_id, name=f"node{node_id}", type=node_type)
    node.data_deps.extend(deps)
    node.attr.add(name=S.COMM_SIZE, int64_val=size)
    if pg is not None:
        node.attr.add(name=S.PG_NAME, string_val=pg)
    if src is not None:
        node.attr.add(name=S.COMM_SRC, int32_val=src)
    if dst is not None:
        node.attr.add(name=S.COMM_DST, int32_val=dst)
    return node


def rank_nodes(group="12", other="34", me=0, peer=1, *, size=4096, dep=0) -> list[pb.Node]:
    """A rank's program: compute, two collectives on one group, one on another, a Send and a Recv."""
    return [
        pb.Node(id=0, name="gemm", type=pb.COMP_NODE, duration_micros=7),
        comm(1, pb.COMM_COLL_NODE, deps=(dep,), pg=group, size=size),
        comm(2, pb.COMM_COLL_NODE, deps=(1,), pg=other),
        comm(3, pb.COMM_COLL_NODE, deps=(2,), pg=group),
        comm(4, pb.COMM_SEND_NODE, deps=(3,), src=me, dst=peer),
        comm(5, pb.COMM_RECV_NODE, deps=(4,), src=peer, dst=me),
    ]


def encode(nodes: list[pb.Node]) -> bytes:
    messages = [pb.GlobalMetadata(version="0.0.4").SerializeToString()] + [n.SerializeToString() for n in nodes]
    return b"".join(varint(len(m)) + m for m in messages)


def role_of(place: T.Place, node: pb.Node, values: dict) -> tuple:
    """Groups and peers by the value they hold (as check reads them), the rank's own number as one role."""
    value = values[place.start]
    if place.name == S.PG_NAME:
        return ("group", value)
    own = S.COMM_SRC if node.type == pb.COMM_SEND_NODE else S.COMM_DST
    return ("self",) if place.name == own else ("peer", value)


def roles_of(data: bytes, payloads: T.PayloadTemplates) -> list[list[tuple[T.Place, tuple]]]:
    """Each node's values with their roles."""
    found = T.places(data, frames(data), payloads)
    assert found is not None
    nodes = [parse_node(p) for _, p in list(frames(data))[1:]]
    values = {p.start: T.span_value(data, p.start, p.stop, p.text) for node in found for p in node}
    return [[(p, role_of(p, node, values)) for p in node_places] for node_places, node in zip(found, nodes, strict=True)]


def template_of(data: bytes, payloads: T.PayloadTemplates, *, pin=(), text=T.ASCII, roles=True):
    pairs = [(p, role if roles else None) for node in roles_of(data, payloads) for p, role in node]
    template = T.file_template(data, pairs, pin, "own", text)
    assert template is not None
    return template


def learnt(data: bytes) -> T.PayloadTemplates:
    """Payload templates proven on every payload of data (as a reader's full pass leaves them)."""
    payloads: T.PayloadTemplates[str] = T.PayloadTemplates(100)
    for _, payload in list(frames(data))[1:]:
        spans, key, _ = payloads.find(payload)
        if spans:
            payloads.learn(payload, spans, key, parse_node(payload), "record")
    return payloads


BASE = encode(rank_nodes())


def test_values_are_found_where_protobuf_wrote_them():
    found = T.places(BASE, frames(BASE), learnt(BASE))
    assert found is not None
    assert [[p.name for p in node] for node in found] == [
        [], [S.PG_NAME], [S.PG_NAME], [S.PG_NAME], [S.COMM_SRC, S.COMM_DST], [S.COMM_SRC, S.COMM_DST]]
    texts = [BASE[p.start:p.stop] for node in found for p in node if p.text]
    assert texts == [b"12", b"34", b"12"]


def test_a_file_of_its_metadata_alone_has_no_places_and_templates_as_fixed_bytes():
    """A rank file that holds its GlobalMetadata and no node (diff compares such files when both
    sets have them) has nothing rank-specific: no places, and its template matches itself only."""
    data = encode([])
    assert len(list(frames(data))) == 1
    assert T.places(data, frames(data), T.PayloadTemplates(8)) == []
    template = T.file_template(data, [], (), "value")
    assert template is not None and template.match(data) == []
    assert template.match(encode([]).replace(b"0.0.4", b"0.0.5")) is None


def test_a_file_differing_only_in_its_values_matches_with_its_values():
    template = template_of(BASE, learnt(BASE))
    assert template.roles == (("group", b"12"), ("group", b"34"), ("self",), ("peer", 1))
    assert template.match(BASE) == [b"12", b"34", 0, 1]
    assert template.match(encode(rank_nodes("56", "78", me=9, peer=3))) == [b"56", b"78", 9, 3]


@pytest.mark.parametrize("case, nodes", [
    ("a node more", rank_nodes() + [pb.Node(id=6, name="gemm", type=pb.COMP_NODE)]),
    ("a node fewer", rank_nodes()[:-1]),
    ("a changed size", rank_nodes(size=4097)),
    ("a changed dependency", rank_nodes(dep=2)),
    ("a group name of another width", rank_nodes(group="123")),
    ("a peer of another varint width", rank_nodes(peer=200)),
    ("one group's nodes split into two groups", rank_nodes()[:3] + [comm(3, pb.COMM_COLL_NODE, deps=(2,), pg="99")]
     + rank_nodes()[4:]),
])
def test_anything_but_the_values_is_no_match(case, nodes):
    template = template_of(BASE, learnt(BASE))
    assert template.match(encode(nodes)) is None, case


def test_a_truncated_or_extended_file_is_no_match():
    template = template_of(BASE, learnt(BASE))
    assert template.match(BASE[:-1]) is None
    assert template.match(BASE + b"\x00") is None


def test_a_node_count_changed_at_the_same_length_is_no_match():
    """One node fewer, its bytes given to another node's name: the length is equal, the nodes are not."""
    nodes = rank_nodes()
    dropped = len(varint(len(nodes[-1].SerializeToString()))) + len(nodes[-1].SerializeToString())
    nodes[0].name += "x" * dropped
    other = encode(nodes[:-1])
    assert len(other) == len(BASE)
    assert template_of(BASE, learnt(BASE)).match(other) is None


def test_text_values_must_lie_in_the_readers_range():
    same_width = BASE.replace(b"\x0234", b"\x02a4")
    assert len(same_width) == len(BASE) and same_width != BASE
    assert template_of(BASE, learnt(BASE), text=T.ASCII).match(same_width) == [b"12", b"a4", 0, 1]
    assert template_of(BASE, learnt(BASE), text=T.DIGITS).match(same_width) is None
    not_ascii = BASE.replace(b"\x0234", b"\x02\xc3\xa9")  # "é": valid UTF-8, outside ASCII
    assert template_of(BASE, learnt(BASE), text=T.ASCII).match(not_ascii) is None


def test_a_pinned_role_keeps_the_templates_value():
    pinned = ("group", b"34")
    template = template_of(BASE, learnt(BASE), pin={pinned})
    assert template.roles == (("group", b"12"), ("self",), ("peer", 1))
    assert template.match(encode(rank_nodes("56", "34"))) == [b"56", 0, 1]
    assert template.match(encode(rank_nodes("56", "78"))) is None


def test_values_without_a_role_may_change_freely():
    template = template_of(BASE, learnt(BASE), roles=False)
    assert template.roles == ()
    split = rank_nodes()[:3] + [comm(3, pb.COMM_COLL_NODE, deps=(2,), pg="99")] + rank_nodes()[4:]
    assert template.match(encode(split)) == []


def test_a_role_written_in_two_widths_gets_no_template():
    data = encode(rank_nodes()[:3] + [comm(3, pb.COMM_COLL_NODE, deps=(2,), pg="012")] + rank_nodes()[4:])
    found = T.places(data, frames(data), learnt(data))
    assert found is not None
    pairs = [(p, ("group",) if p.text else None) for node in found for p in node]  # one role for every group
    assert T.file_template(data, pairs, (), "own") is None


def test_payloads_share_a_template_when_only_their_values_differ():
    payloads: T.PayloadTemplates[str] = T.PayloadTemplates(100)
    first = comm(4, pb.COMM_SEND_NODE, src=0, dst=1).SerializeToString()
    spans, key, template = payloads.find(first)
    assert [name for _, name, _, _ in spans] == [S.COMM_SRC, S.COMM_DST] and template is None
    payloads.learn(first, spans, key, parse_node(first), "send record")
    assert payloads.find(comm(4, pb.COMM_SEND_NODE, src=7, dst=5).SerializeToString())[2] == "send record"
    assert payloads.find(comm(4, pb.COMM_SEND_NODE, src=7, dst=5, size=1).SerializeToString())[2] is None
    assert payloads.find(pb.Node(id=0, type=pb.COMP_NODE).SerializeToString()) == ([], None, None)


def test_a_payload_whose_values_are_not_its_only_attributes_is_not_proven():
    """A second pg_name: protobuf keeps both, and readers take the first; its bytes are no template."""
    node = comm(1, pb.COMM_COLL_NODE, pg="12")
    node.attr.add(name=S.PG_NAME, string_val="34")
    payload = node.SerializeToString()
    payloads: T.PayloadTemplates[str] = T.PayloadTemplates(100)
    spans, key, _ = payloads.find(payload)
    assert spans and not payloads.proven(payload, spans)
    payloads.learn(payload, spans, key, parse_node(payload), "record")
    assert payloads.find(payload)[2] is None
    data = encode(rank_nodes()[:1] + [node])
    assert T.places(data, frames(data), payloads) is None


def test_a_non_ascii_value_does_not_match_a_payload_template():
    payloads: T.PayloadTemplates[str] = T.PayloadTemplates(100)
    payload = comm(1, pb.COMM_COLL_NODE, pg="12").SerializeToString()
    spans, key, _ = payloads.find(payload)
    payloads.learn(payload, spans, key, parse_node(payload), "record")
    assert payloads.find(comm(1, pb.COMM_COLL_NODE, pg="34").SerializeToString())[2] == "record"
    assert payloads.find(comm(1, pb.COMM_COLL_NODE, pg="\u00e9").SerializeToString())[2] is None  # 2 bytes, like "12"


def _without_values(node: pb.Node) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    for attr in out.attr:
        if attr.name in RANK_SPECIFIC:
            attr.ClearField(attr.WhichOneof("value"))
    return out


def test_whatever_matches_parses_like_the_template_but_for_the_values_it_reports(make_set):
    """Random byte changes to a generated rank file, half of them to one role's values: every file the
    template accepts has the template's nodes, attribute for attribute, but for the
    rank-specific values, and those are the values the match reports per role; every change
    outside a value is refused."""
    _, out, _ = make_set(tp=2, pp=2, dp=2)
    data = read_file(out / "workload.1.et")
    payloads = learnt(data)
    template = template_of(data, payloads)
    roles = roles_of(data, payloads)
    want = [_without_values(parse_node(p)) for _, p in list(frames(data))[1:]]
    inside = sorted({at for node in T.places(data, frames(data), payloads) or [] for p in node
                     for at in range(p.start, p.stop)})
    assert inside
    rng = random.Random(11)
    matched = 0
    by_role: dict[tuple, list[T.Place]] = {}
    for node in roles:
        for place, role in node:
            by_role.setdefault(role, []).append(place)
    for trial in range(300):
        changed = bytearray(data)
        byte = rng.choice((0x00, 0x30, 0x35, 0x39, 0x7F, 0x80, 0x81, 0xC3, 0xFF, rng.randrange(256)))
        if trial % 2:  # one byte of one role's value, in every node that holds it (as another rank would)
            places = by_role[rng.choice(list(by_role))]
            offset = rng.randrange(places[0].stop - places[0].start)
            for place in places:
                changed[place.start + offset] = byte
        else:
            at = rng.randrange(len(data))
            changed[at] = byte
        values = template.match(bytes(changed))
        if trial % 2 == 0 and at not in inside and changed[at] != data[at]:
            assert values is None, trial
        if values is None:
            continue
        matched += 1
        nodes = [parse_node(p) for _, p in list(frames(bytes(changed)))[1:]]
        assert [_without_values(n) for n in nodes] == want, trial
        reported = dict(zip(template.roles, values, strict=True))
        for node, node_roles in zip(nodes, roles, strict=True):
            for place, role in node_roles:
                attr = next(a for a in node.attr if a.name == place.name)
                value = attr.string_val.encode() if place.text else attr.int32_val
                assert value == reported[role], trial
    assert matched > 50
