"""Bytes each rank puts on the wire for one collective, and to whom, under ring algorithms.

comm_size follows ASTRA-sim: AllReduce and AllToAll the full buffer S, ReduceScatter its full
input S, AllGather the shard each rank contributes. Per rank, for a group of n:
  AllReduce 2(n-1)/n*S, ReduceScatter (n-1)/n*S, AllGather (n-1)*shard, AllToAll (n-1)/n*S
  (spread over the other members), Broadcast/Reduce S (a pipelined ring forwards the buffer
  once), Gather/Scatter (n-1)/n*S, Barrier 0. Send S (the receiver adds nothing).
A ring sends everything to the next member in group order.
"""

from __future__ import annotations

from traceforge.ir.enums import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    GATHER,
    REDUCE,
    REDUCE_SCATTER,
    REDUCE_SCATTER_BLOCK,
    SCATTER,
)

COLL_NAMES = {
    ALL_REDUCE: "AllReduce", REDUCE: "Reduce", ALL_GATHER: "AllGather", GATHER: "Gather", SCATTER: "Scatter",
    BROADCAST: "Broadcast", ALL_TO_ALL: "AllToAll", REDUCE_SCATTER: "ReduceScatter",
    REDUCE_SCATTER_BLOCK: "ReduceScatterBlock", BARRIER: "Barrier",
}
SEND_NAME, RECV_NAME = "Send", "Recv"

# nccl-tests binary for each collective, and the size it is given (its -b/-e "size" is the
# whole buffer: AllGather's gathered output, ReduceScatter's input).
NCCL_TESTS = {
    ALL_REDUCE: "all_reduce_perf", ALL_GATHER: "all_gather_perf", REDUCE_SCATTER: "reduce_scatter_perf",
    REDUCE_SCATTER_BLOCK: "reduce_scatter_perf", ALL_TO_ALL: "alltoall_perf", BROADCAST: "broadcast_perf",
    REDUCE: "reduce_perf", GATHER: "gather_perf", SCATTER: "scatter_perf",
}


def coll_name(ctype: int) -> str:
    return COLL_NAMES.get(ctype, f"Collective{ctype}")


def wire_bytes(ctype: int, size: int, n: int) -> float:
    """Bytes one member sends for one collective of comm_size `size` in a group of n."""
    if n < 2:
        return 0.0
    if ctype == ALL_REDUCE:
        return 2 * (n - 1) * size / n
    if ctype == ALL_GATHER:
        return float((n - 1) * size)
    if ctype in (BROADCAST, REDUCE):
        return float(size)
    if ctype == BARRIER:
        return 0.0
    return (n - 1) * size / n  # ReduceScatter, AllToAll, Gather, Scatter


def nccl_test_size(ctype: int, size: int, n: int) -> int:
    return size * n if ctype == ALL_GATHER else size


def destinations(ctype: int, members: tuple[int, ...], position: int) -> list[tuple[int, float]]:
    """(destination rank, share of this member's wire bytes) for one collective."""
    n = len(members)
    if n < 2:
        return []
    if ctype == ALL_TO_ALL:
        return [(m, 1 / (n - 1)) for i, m in enumerate(members) if i != position]
    return [(members[(position + 1) % n], 1.0)]
