"""A share K/N of some work, as --shard names it: generate's ranks, plan's layouts."""

from __future__ import annotations

import re

from traceforge.base.errors import UserError
from traceforge.base.limits import MAX_WORLD_SIZE

_SHARD_ARG = re.compile(r"^\s*([0-9]+)\s*/\s*([0-9]+)\s*$", re.ASCII)


def parse_shard(text: str) -> tuple[int, int]:
    match = _SHARD_ARG.match(text)
    if not match:
        raise UserError(f"--shard {text!r} must look like K/N, e.g. 0/8 for the first of 8 shards")
    k, n = int(match[1]), int(match[2])
    if n < 1 or not 0 <= k < n:
        raise UserError(f"--shard {text!r}: K must be in 0..N-1 and N at least 1 (shards are numbered from 0)")
    if n > MAX_WORLD_SIZE:
        raise UserError(f"--shard {text!r}: N must be at most the number of ranks (and {MAX_WORLD_SIZE:,})")
    return k, n
