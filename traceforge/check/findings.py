"""What `traceforge check` reports: a Finding names a kind, a rank and (when there is one) the
node, with a message that says what is wrong and what ASTRA-sim would do about it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR, WARNING = "error", "warning"

# File-level kinds: the rank's file cannot be used at all (exit code 2).
FILE_KINDS = ("missing-rank", "extra-rank", "empty", "truncated", "corrupt", "no-metadata", "unreadable")
# Per rank: graph and attribute contract.
RANK_KINDS = ("node-id", "dependency", "cycle", "node-type", "attribute", "group")
# Across ranks.
CROSS_KINDS = ("collective", "p2p", "order", "deadlock")
# A file that frames and decodes but differs from what manifest.json recorded (cut at a node
# boundary, edited): an error, yet the rest of the check still runs on what the file holds.
MANIFEST_KINDS = ("manifest",)
KINDS = FILE_KINDS + MANIFEST_KINDS + RANK_KINDS + CROSS_KINDS
# Errors of these kinds make ASTRA-sim abort before communication could stall: no replay.
REPLAY_BLOCKING = frozenset(FILE_KINDS + RANK_KINDS)


@dataclass
class Finding:
    kind: str
    rank: int | None
    node_id: int | None
    node_name: str | None
    message: str
    severity: str = ERROR
    peer: int | None = None  # the other rank involved (p2p partner, rank waited for)
    group: int | None = None  # the communicator group involved
    priority: int = 0  # within a kind, lower first (e.g. a deadlock's root before its ripples); not exported

    def to_dict(self) -> dict:
        doc = asdict(self)
        del doc["priority"]
        return doc

    def sort_key(self) -> tuple:
        return (self.severity != ERROR, KINDS.index(self.kind) if self.kind in KINDS else len(KINDS), self.priority,
                -1 if self.rank is None else self.rank, -1 if self.node_id is None else self.node_id)


class Tally:
    """Collapses repeats of one problem on one rank into a single finding with a count,
    so a systematically broken foreign trace gives one row per rank, not one per node."""

    def __init__(self, rank: int | None):
        self.rank = rank
        self._seen: dict[tuple[str, str, str], list] = {}

    def add(self, severity: str, kind: str, message: str, node_id: int | None = None,
            node_name: str | None = None, **extra) -> None:
        key = (severity, kind, message)
        entry = self._seen.get(key)
        if entry is None:
            self._seen[key] = [Finding(kind, self.rank, node_id, node_name, message, severity, **extra), 1]
        else:
            entry[1] += 1

    def findings(self) -> list[Finding]:
        out = []
        for finding, count in self._seen.values():
            if count > 1:
                finding.message += f" (and {count - 1:,} more node{'s' if count > 2 else ''} on this rank)"
            out.append(finding)
        return out
