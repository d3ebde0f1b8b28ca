"""A rank's program in the rank-independent columnar form every engine reads (RankProgram): its
nodes in file order, with each collective's group and each transfer's peer as a role number that
a rank binds (ir/programset.ProgramSet)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass
class RankProgram:
    """A rank's nodes in file order (index = position), with group/peer values as role numbers."""

    types: np.ndarray  # NodeType
    durations: np.ndarray  # micros
    ctypes: np.ndarray  # CollectiveCommType, -1 when not a collective
    sizes: np.ndarray  # comm_size bytes
    roles: np.ndarray  # group role (collectives) or peer role (send/recv), -1 otherwise
    tags: np.ndarray
    steps: np.ndarray
    dep_ptr: np.ndarray  # CSR: deps of node i are dep_idx[dep_ptr[i]:dep_ptr[i+1]]
    dep_idx: np.ndarray
    names: list[str]
    dims: list[str]

    def __len__(self) -> int:
        return len(self.types)

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for arr in (self.types, self.durations, self.ctypes, self.sizes, self.roles, self.tags,
                    self.steps, self.dep_ptr, self.dep_idx):
            h.update(arr.tobytes())
        return h.digest()


NO_DIM = ""


WORLD = ""  # the pg_name of a collective that names no group: all ranks
