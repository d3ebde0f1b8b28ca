"""Trace sets as JSON for consumers without protobuf: one document per rank, written node by node.

Each node is protobuf's JSON mapping of the message, as Chakra's jsonizer writes it (camelCase
field names, enum names, fields at their default omitted), with two conveniences: 64-bit
integers are plain JSON numbers and every node has its "id", even 0. `ParseDict` from
`google.protobuf.json_format` rebuilds the exact message. Unlike the jsonizer's concatenated
objects, a rank's file is one valid JSON document:

    {"rank": 0, "global_metadata": {...},
    "nodes": [
    {...},
    {...}
    ]}
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TextIO

from google.protobuf.json_format import MessageToDict

from traceforge.base.errors import UserError
from traceforge.base.output import COMM_GROUP_FILE, atomic_output_dir
from traceforge.base.progress import Progress
from traceforge.read.reader import find_rank_files, open_trace, parse_node

FORMATS = ("json", "goal", "simai", "param")  # goal: export_goal.py, simai: export_simai.py, param: export_param.py


def _dumps(message, node_id: int | None = None) -> str:
    doc = MessageToDict(message, unquote_int64_if_possible=True)
    if node_id is not None:  # the mapping omits a zero id; consumers should not have to know that
        doc = {"id": node_id, **{k: v for k, v in doc.items() if k != "id"}}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def write_rank_json(path: Path, rank: int, stream: TextIO) -> int:
    """Stream one rank's file as a JSON document; returns the number of nodes."""
    meta, payloads = open_trace(path)
    stream.write(f'{{"rank":{rank},"global_metadata":{_dumps(meta)},\n"nodes":[')
    n = 0
    for offset, payload in payloads:
        node = parse_node(payload, offset, str(path))
        stream.write(("\n" if n == 0 else ",\n") + _dumps(node, node.id))
        n += 1
    stream.write("\n]}\n" if n else "]}\n")
    return n


def json_file_name(prefix: str, rank: int) -> str:
    return f"{prefix}.{rank}.json"


def export_json(directory: Path, out: Path, *, prefix: str | None = None, ranks: list[int] | None = None,
                force: bool = False) -> list[Path]:
    """Write <prefix>.<rank>.json for the chosen ranks (default all) and a copy of comm_group.json
    into OUT, all or nothing. Returns the files written, as they are named in OUT."""
    prefix, files = find_rank_files(directory, prefix)
    chosen = sorted(files) if ranks is None else ranks
    missing = [r for r in chosen if r not in files]
    if missing:
        raise UserError(f"{directory}: no trace file for rank {missing[0]} (ranks {min(files)}-{max(files)})")
    written = []
    with atomic_output_dir(Path(out), force, inputs=[directory]) as tmp:
        with Progress("export json: ranks", len(chosen), min_items=2) as counter:
            for rank in chosen:
                name = json_file_name(prefix, rank)
                with open(tmp / name, "w", encoding="utf-8") as f:
                    write_rank_json(files[rank], rank, f)
                written.append(Path(out) / name)
                counter.advance()
        groups = Path(directory) / COMM_GROUP_FILE
        if groups.is_file():
            shutil.copyfile(groups, tmp / COMM_GROUP_FILE)
            written.append(Path(out) / COMM_GROUP_FILE)
    return written
