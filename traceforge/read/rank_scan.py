"""What scanning one rank file yields (RankScan): read/scan.py makes it, read/file_templates.py
derives it for ranks whose files match a scanned one, read/traceset.py gathers the scans into the
set's ir/programset.ProgramSet (the shape and roles) and keeps the rest (the traffic counters,
the compute total, what the file lacked) beside it for traffic/ and report/."""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.ir.program import RankProgram


@dataclass
class RankScan:
    rank: int
    nodes: int
    compute_micros: int
    max_step: int
    # ((dim, kind, comm_type, comm_size, role), count) in order of first use; kind "coll" (role:
    # index into group_roles), "send"/"recv" (index into peer_roles; comm_type -1). Ranks of a
    # stage share one such tuple (see intern_traffic): memory does not grow per rank with it.
    role_traffic: tuple = ()
    group_roles: tuple[str, ...] = ()  # pg names in order of first use
    peer_roles: tuple[int, ...] = ()  # peer ranks in order of first use
    shape: bytes = b""
    program: RankProgram | None = None  # set only where the caller asked to keep it
    dangling_deps: int = 0
    has_annotations: bool = False

    @property
    def traffic(self) -> dict[tuple, int]:
        """(dim, kind, comm_type, comm_size, target) -> count; target: the pg name of a collective,
        the peer rank of a send or recv. Built on demand from the shared role_traffic."""
        groups, peers = self.group_roles, self.peer_roles
        return {(dim, kind, ctype, size, groups[role] if kind == "coll" else peers[role]): count
                for (dim, kind, ctype, size, role), count in self.role_traffic}


def intern_traffic(scan: RankScan, seen: dict) -> None:
    """Share one role_traffic tuple (and one copy of each pg name) among the scans seen."""
    scan.role_traffic = seen.setdefault(scan.role_traffic, scan.role_traffic)
    scan.group_roles = tuple(seen.setdefault(g, g) for g in scan.group_roles)
