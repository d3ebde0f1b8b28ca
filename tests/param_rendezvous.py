"""A PARAM export replayed under rendezvous semantics, without torch: what gloo and NCCL do.

Each rank walks its rank-<r>.json in order: posting an op never blocks; a `wait` blocks until its
op is complete. A collective completes once every member of its group has posted it (members
post a group's collectives in one order); a Send or Recv once both ends have posted it (matched
in order per (src, dst) pair, as PARAM's untagged p2p is). Returns what each rank could not get
past: empty when the replay completes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def stuck_ranks(directory: Path, ranks: int) -> dict[int, int]:
    """rank -> the index of the record it is blocked at, for every rank that cannot finish."""
    records, groups = [], {}
    for rank in range(ranks):
        doc = json.loads((Path(directory) / f"rank-{rank}.json").read_text())
        mine = []
        for node in doc["nodes"]:
            if node["name"] == "## process_group:init ##":
                groups = {g["pg_name"]: g["ranks"] for g in json.loads(node["inputs"]["values"][0])}
            elif node["name"] == "record_param_comms":
                a = {x["name"]: x["value"] for x in node["attrs"]}
                seq, peer = node["inputs"]["values"][0], node["inputs"]["values"][2]
                mine.append((a["collective_name"], a["pg_name"], tuple(seq), peer))
        records.append(mine)
    at = [0] * ranks
    posted: dict[tuple, tuple] = {}  # (rank, pg, seq) -> what completes it
    members_posted: dict[tuple[str, int], int] = defaultdict(int)  # (pg, n-th collective) -> members posted
    next_coll: dict[tuple[int, str], int] = defaultdict(int)
    pair_posts: dict[tuple[int, int, str], int] = defaultdict(int)  # (src, dst, send|recv) -> posted

    def complete(rank: int, key: tuple) -> bool:
        kind, info = posted[(rank, *key)]
        if kind == "coll":
            return members_posted[info] == len(groups[info[0]])
        src, dst, other, index = info
        return pair_posts[(src, dst, other)] > index

    moved = True
    while moved:
        moved = False
        for rank in range(ranks):
            while at[rank] < len(records[rank]):
                name, pg, seq, peer = records[rank][at[rank]]
                if name == "wait":
                    if not complete(rank, (pg, seq)):
                        break
                elif name in ("send", "recv"):
                    other = groups[pg][peer]
                    src, dst = (rank, other) if name == "send" else (other, rank)
                    posted[(rank, pg, seq)] = ("p2p", (src, dst, "recv" if name == "send" else "send",
                                                       pair_posts[(src, dst, name)]))
                    pair_posts[(src, dst, name)] += 1
                else:
                    n = next_coll[(rank, pg)]
                    next_coll[(rank, pg)] += 1
                    members_posted[(pg, n)] += 1
                    posted[(rank, pg, seq)] = ("coll", (pg, n))
                at[rank] += 1
                moved = True
    return {rank: at[rank] for rank in range(ranks) if at[rank] < len(records[rank])}
