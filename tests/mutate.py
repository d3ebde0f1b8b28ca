"""Damage trace sets for the `traceforge check` mutation suite, and build tiny sets by hand.

Edits go through protobuf (decode a rank, change nodes, re-encode), so every damage is exactly
the one named; removing a node hands its dependencies to its children so that nothing else
(e.g. a dangling dependency) changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from traceforge.chakra import schema as S
from traceforge.chakra import wire
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.read.reader import attrs, read_trace

PREFIX = "workload"


def rank_path(directory: Path, rank: int, prefix: str = PREFIX) -> Path:
    return Path(directory) / f"{prefix}.{rank}.et"


def encode(nodes: Iterable[pb.Node], meta: pb.GlobalMetadata | None = None) -> bytes:
    meta = meta if meta is not None else pb.GlobalMetadata(version=S.SCHEMA_VERSION)
    out = bytearray()
    for message in (meta, *nodes):
        payload = message.SerializeToString()
        out += wire.varint(len(payload)) + payload
    return bytes(out)


def read_nodes(directory: Path, rank: int) -> list[pb.Node]:
    return read_trace(rank_path(directory, rank)).nodes


def write_nodes(directory: Path, rank: int, nodes: list[pb.Node]) -> None:
    rank_path(directory, rank).write_bytes(encode(nodes))


def edit(directory: Path, rank: int, change: Callable[[list[pb.Node]], list[pb.Node] | None]) -> None:
    """Apply change to the rank's node list (in place or returning a new list) and rewrite it."""
    nodes = read_nodes(directory, rank)
    result = change(nodes)
    write_nodes(directory, rank, nodes if result is None else result)


def attr(node: pb.Node, name: str):
    return attrs(node).get(name)


def set_int(node: pb.Node, name: str, value: int) -> None:
    """Set an integer attribute in the member it has (or the one we write), int64_val when the
    value does not fit there (e.g. a negative tensor_size)."""
    for a in node.attr:
        if a.name == name:
            break
    else:
        a = node.attr.add(name=name)
    member = a.WhichOneof("value") or S.ATTR_MEMBER.get(name, "int64_val")
    try:
        setattr(a, member, value)
    except ValueError:
        a.int64_val = value


def swap_collectives(a_id: int, b_id: int) -> Callable[[list[pb.Node]], None]:
    """An edit that swaps the size and type of two collectives (a rank posting them out of order)."""
    def swap(nodes: list[pb.Node]) -> None:
        x, y = (next(n for n in nodes if n.id == i) for i in (a_id, b_id))
        for name in (S.COMM_SIZE, S.COMM_TYPE):
            vx, vy = attr(x, name), attr(y, name)
            set_int(x, name, vy)
            set_int(y, name, vx)
    return swap


def set_str(node: pb.Node, name: str, value: str) -> None:
    for a in node.attr:
        if a.name == name:
            a.string_val = value
            return
    node.attr.add(name=name, string_val=value)


def of_type(nodes: list[pb.Node], node_type: int, **match) -> list[pb.Node]:
    """Nodes of a type whose attributes equal every given value (e.g. pg_name="1")."""
    return [n for n in nodes if n.type == node_type and all(attr(n, k) == v for k, v in match.items())]


def drop(nodes: list[pb.Node], node_id: int) -> list[pb.Node]:
    """Remove a node; its children inherit its dependencies."""
    gone = next(n for n in nodes if n.id == node_id)
    inherited = list(gone.data_deps) + list(gone.ctrl_deps)
    kept = [n for n in nodes if n.id != node_id]
    for n in kept:
        if node_id in n.data_deps:
            deps = [d for d in n.data_deps if d != node_id]
            deps += [d for d in inherited if d not in deps]
            del n.data_deps[:]
            n.data_deps.extend(deps)
    return kept


def groups(directory: Path) -> dict[int, list[int]]:
    return {int(k): v for k, v in json.loads((Path(directory) / "comm_group.json").read_text()).items()}


def write_groups(directory: Path, groups_: dict[int, list[int]]) -> None:
    (Path(directory) / "comm_group.json").write_text(json.dumps({str(k): v for k, v in groups_.items()}))


# -- hand-built sets ---------------------------------------------------------------------------

def comp(node_id: int, deps: Iterable[int] = ()) -> pb.Node:
    n = pb.Node(id=node_id, name=f"comp{node_id}", type=pb.COMP_NODE, duration_micros=5, data_deps=list(deps))
    n.attr.add(name=S.IS_CPU_OP, bool_val=False)
    n.attr.add(name=S.NUM_OPS, int64_val=1000)
    n.attr.add(name=S.TENSOR_SIZE, uint64_val=100)
    return n


def coll(node_id: int, group: int, size: int, deps: Iterable[int] = (), comm_type: int = pb.ALL_REDUCE) -> pb.Node:
    n = pb.Node(id=node_id, name=f"coll{node_id}", type=pb.COMM_COLL_NODE, data_deps=list(deps))
    n.attr.add(name=S.COMM_TYPE, int64_val=comm_type)
    n.attr.add(name=S.COMM_SIZE, int64_val=size)
    n.attr.add(name=S.PG_NAME, string_val=str(group))
    return n


def p2p(node_id: int, kind: int, src: int, dst: int, tag: int, size: int, deps: Iterable[int] = ()) -> pb.Node:
    n = pb.Node(id=node_id, name=f"{'send' if kind == pb.COMM_SEND_NODE else 'recv'}{node_id}", type=kind,
                data_deps=list(deps))
    for name, value in ((S.COMM_SRC, src), (S.COMM_DST, dst), (S.COMM_TAG, tag), (S.COMM_SIZE, size)):
        n.attr.add(name=name, **{S.ATTR_MEMBER[name] if -2**31 <= value < 2**31 else "int64_val": value})
    return n


def send(node_id: int, src: int, dst: int, tag: int, size: int = 64, deps: Iterable[int] = ()) -> pb.Node:
    return p2p(node_id, pb.COMM_SEND_NODE, src, dst, tag, size, deps)


def recv(node_id: int, src: int, dst: int, tag: int, size: int = 64, deps: Iterable[int] = ()) -> pb.Node:
    return p2p(node_id, pb.COMM_RECV_NODE, src, dst, tag, size, deps)


def write_set(directory: Path, ranks: dict[int, list[pb.Node]], groups_: dict[int, list[int]] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for rank, nodes in ranks.items():
        write_nodes(directory, rank, nodes)
    if groups_ is not None:
        write_groups(directory, groups_)
    return directory
