"""One Chakra Node payload -> the compact record `traceforge check` works on, with every problem
ASTRA-sim would trip over in that node alone.

Records depend only on the payload bytes (never on the rank), so a worker caches them by
payload: ranks of one stage share most node bytes, and a cache hit skips protobuf entirely.
What ASTRA-sim requires is read from its Chakra feeder (FeederV3) and Workload.cc:
- integer attributes accept any integer (or bool) field, never float, string or lists;
- required: comm_type/comm_size on collectives; comm_dst, comm_size, comm_tag on sends
  (comm_src defaults to self and must equal it); comm_src, comm_size, comm_tag on receives
  (comm_dst defaults to self and must equal it); tensor_size on memory nodes;
- pg_name is a string (empty or "0" means all ranks), its number a key of the group file;
- a warning when an attribute is not in the member Chakra's v1 feeder reads (schema.ATTR_MEMBER):
  ASTRA-sim before 2025 would read it as 0;
- tags are taken modulo 5e8 (NATIVE tag range), so a larger tag can collide;
- INVALID/METADATA nodes are not simulated; other unknown types abort.
"""

from __future__ import annotations

from typing import NamedTuple

from traceforge.chakra import fields as F
from traceforge.chakra import schema as S
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.chakra.decode import node_attributes, parse_node
from traceforge.ir.enums import COLL, COMP, RECV, SEND

INVALID, METADATA, MEM_LOAD, MEM_STORE = pb.INVALID_NODE, pb.METADATA_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE
COMM_TYPES = frozenset((SEND, RECV, COLL))
TYPE_NAMES = F.NODE_TYPE_NAMES
COLL_NAMES = F.COLL_TYPE_NAMES
SIMULATED_COLLS = frozenset((0, 2, 6, 7))  # ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER
BROADCAST = 5
TAG_LIMIT = S.TAG_LIMIT  # ASTRA-sim's NATIVE send/recv tags live in [0, 5e8)
UINT32 = 1 << 32
MAX_COMM_SIZE = (1 << 62) - 1  # bytes; the limit report reads (read/records.py) and int64 arrays hold
MAX_DURATION = S.MAX_STEP_MICROS + 1  # µs; the limit generate keeps to (schema.py): x1000 in ns stays < 2^63
WORLD = 0  # group id of "all ranks" (pg_name absent, empty or "0")

INTEGER_FIELDS = frozenset((
    "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
    "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val", "bool_val",
))
STRING_FIELDS = frozenset(("string_val", "bytes_val"))

ERROR, WARNING = "error", "warning"

# A problem found in one node: (severity, kind, message).
Problem = tuple[str, str, str]


class CheckRecord(NamedTuple):
    id: int
    type: int
    deps: tuple[int, ...]  # data_deps then ctrl_deps, duplicates removed
    # COLL: (comm_type, comm_size, group id or None when unusable);
    # SEND/RECV: (src or None = self, dst or None = self, tag, size), fields None when unusable
    comm: tuple | None
    problems: tuple[Problem, ...]
    name: str


def decode_node(payload: bytes) -> CheckRecord:
    """Raises CorruptNode when the payload is not a Node."""
    return node_record(parse_node(payload))


def node_record(node: pb.Node) -> CheckRecord:
    """A parsed node's record."""
    deps = tuple(dict.fromkeys((*node.data_deps, *node.ctrl_deps)))
    attrs = node_attributes(node)
    problems: list[Problem] = []
    if node.duration_micros >= MAX_DURATION:
        problems.append((ERROR, "attribute", f"duration_micros {node.duration_micros:,} overflows ASTRA-sim's nanosecond "
                                             "clock (x1000 reaches 2^63; over 292 years): write the real duration"))
    comm = _validate(node.type, attrs, problems)
    return CheckRecord(node.id, node.type, deps, comm, tuple(problems), node.name)


def _validate(ntype: int, attrs: dict, problems: list[Problem]) -> tuple | None:
    label = TYPE_NAMES.get(ntype, f"node type {ntype}")
    if ntype in (INVALID, METADATA):
        problems.append((ERROR, "node-type", f"{label}: ASTRA-sim does not simulate it (it stalls or asserts on it); "
                                             "drop the node or give it a real type"))
        return None
    if ntype not in TYPE_NAMES:
        problems.append((ERROR, "node-type", f"unknown node type {ntype}; ASTRA-sim aborts on it"))
        return None
    cpu = _bool(attrs, S.IS_CPU_OP, problems)
    if ntype == COMP:
        for name in (S.NUM_OPS, S.TENSOR_SIZE):
            value = _int(attrs, name, label, problems, required=False)
            if name not in attrs:
                problems.append((WARNING, "attribute", f"{label} has no {name}; ASTRA-sim's roofline mode needs it"))
            elif name == S.TENSOR_SIZE and value is not None and value <= 0:
                problems.append((WARNING, "attribute", f"{label} has tensor_size {value}; ASTRA-sim's roofline mode skips it"))
        return None
    if ntype in (MEM_LOAD, MEM_STORE):
        _int(attrs, S.TENSOR_SIZE, label, problems)
        return None
    if cpu:
        problems.append((ERROR, "attribute", f"{label} has is_cpu_op true; ASTRA-sim refuses communication on the CPU"))
    size = _int(attrs, S.COMM_SIZE, label, problems)
    if size is not None and size <= 0:
        problems.append((ERROR, "attribute", f"{label} has comm_size {size}; it must be a positive byte count"))
        size = None
    elif size is not None and size > MAX_COMM_SIZE:  # a uint64 of 2^63 is a huge count, not a negative one
        problems.append((ERROR, "attribute", f"{label} has comm_size {size:,}, past {MAX_COMM_SIZE:,} bytes (2^62 - 1): "
                                             "ASTRA-sim's 64-bit byte and time arithmetic overflows; write the real size"))
        size = None
    if ntype == COLL:
        ctype = _int(attrs, S.COMM_TYPE, label, problems)
        if ctype is not None and ctype not in SIMULATED_COLLS:
            cname = COLL_NAMES.get(ctype, str(ctype))
            if ctype == BROADCAST:
                problems.append((WARNING, "attribute", "BROADCAST: ASTRA-sim only replays its duration, moving no data"))
            else:
                problems.append((ERROR, "attribute", f"collective type {cname} is not simulated by ASTRA-sim (it aborts); "
                                                     "use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL"))
                ctype = None
        dims = attrs.get("involved_dim")
        if dims is not None and dims[0] != "bool_list":
            problems.append((ERROR, "attribute", f"involved_dim is {dims[0] or 'unset'}; ASTRA-sim needs a bool_list"))
        return (ctype, size, _group(attrs, problems))
    tag = _int(attrs, S.COMM_TAG, label, problems)
    if tag is not None and not 0 <= tag < TAG_LIMIT:
        problems.append((ERROR, "attribute", f"comm_tag {tag} is outside [0, 5e8): ASTRA-sim folds tags modulo 5e8, "
                                             "so it may match another transfer"))
        tag = None
    src = _int(attrs, S.COMM_SRC, label, problems, required=ntype == RECV)
    dst = _int(attrs, S.COMM_DST, label, problems, required=ntype == SEND)
    for name, value in ((S.COMM_SRC, src), (S.COMM_DST, dst)):
        if value is not None and not 0 <= value < UINT32:
            problems.append((ERROR, "attribute", f"{name} {value} is not a rank"))
    src = src if src is None or 0 <= src < UINT32 else -1
    dst = dst if dst is None or 0 <= dst < UINT32 else -1
    return (src, dst, tag, size)


def _int(attrs: dict, name: str, label: str, problems: list[Problem], *, required: bool = True) -> int | None:
    entry = attrs.get(name)
    if entry is None:
        if required:
            problems.append((ERROR, "attribute", f"{label} has no {name} attribute; ASTRA-sim requires it"))
        return None
    which, value = entry
    if which not in INTEGER_FIELDS:
        problems.append((ERROR, "attribute", f"{name} is stored as {which or 'no value'}; ASTRA-sim reads it as an integer "
                                             f"(use {S.ATTR_MEMBER[name]})"))
        return None
    _v1_type(name, which, problems)
    return int(value)


def _v1_type(name: str, which: str, problems: list[Problem]) -> None:
    """Chakra's v1 feeder reads each attribute through one member; another reads as 0 there."""
    member = S.ATTR_MEMBER[name]
    if which != member:
        problems.append((WARNING, "attribute", f"{name} is stored as {which}; Chakra's v1 feeder (ASTRA-sim "
                                               f"before 2025) reads {member} and would see 0 (or false, or empty): "
                                               f"write {member}"))


def _bool(attrs: dict, name: str, problems: list[Problem]) -> bool:
    entry = attrs.get(name)
    if entry is None:
        return False
    which, value = entry
    if which not in INTEGER_FIELDS:
        problems.append((ERROR, "attribute", f"{name} is stored as {which or 'no value'}; ASTRA-sim reads it as a bool"))
        return False
    _v1_type(name, which, problems)
    return bool(value)


def _group(attrs: dict, problems: list[Problem]) -> int | None:
    """The group id a collective names: WORLD when pg_name is absent, empty or "0"."""
    entry = attrs.get(S.PG_NAME)
    if entry is None:
        return WORLD
    which, value = entry
    if which not in STRING_FIELDS:
        problems.append((ERROR, "group", f"pg_name is stored as {which or 'no value'}; ASTRA-sim reads a string "
                                         "(string_val holding the decimal group id)"))
        return None
    _v1_type(S.PG_NAME, which, problems)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if text == "":
        return WORLD
    if not (text.isascii() and text.isdigit()):
        problems.append((ERROR, "group", f"pg_name {text!r} is not a decimal group id; ASTRA-sim parses it as a number "
                                         "to find the group in the comm-group file"))
        return None
    return int(text)


# -- formatting helpers shared by the checks ------------------------------------------------

def coll_label(ctype: int | None, size: int | None) -> str:
    name = COLL_NAMES.get(ctype, f"type {ctype}") if ctype is not None else "unknown type"
    return f"{name} of {size:,} B" if size is not None else name


def p2p_label(kind: int, src: int | None, dst: int | None, tag: int | None, size: int | None) -> str:
    who = f"to rank {dst}" if kind == SEND else f"from rank {src}"
    verb = "Send" if kind == SEND else "Recv"
    return f"{verb} {who} (tag {tag}, {size:,} B)" if size is not None else f"{verb} {who} (tag {tag})"
