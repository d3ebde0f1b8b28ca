"""Limits stated for the whole tool, checked wherever a number enters: ranks in a set (a spec,
a manifest, a shard count, a simulation file), beyond any cluster yet well within what one
process can index."""

from __future__ import annotations

MAX_WORLD_SIZE = 1 << 22
