"""The Chakra ET attribute contract, named once.

ASTRA-sim reads the first group by name; the annotations are ours, for people and analysis.
"""

from __future__ import annotations

from traceforge._proto import traceforge_et_pb2 as pb

# The files of a trace set beside <prefix>.<rank>.et (the output contract).
COMM_GROUP_FILE = "comm_group.json"
MANIFEST_FILE = "manifest.json"

# Chakra schema version string written in GlobalMetadata (what Chakra's converters write).
SCHEMA_VERSION = "0.0.4"

# Read by ASTRA-sim.
IS_CPU_OP = "is_cpu_op"
NUM_OPS = "num_ops"
TENSOR_SIZE = "tensor_size"
COMM_TYPE = "comm_type"
COMM_SIZE = "comm_size"
COMM_SRC = "comm_src"
COMM_DST = "comm_dst"
COMM_TAG = "comm_tag"
PG_NAME = "pg_name"

# traceforge annotations.
PHASE = "phase"
DIM = "dim"
STEP = "step"
MICROBATCH = "microbatch"
LAYER = "layer"

NODE_TYPE_NAMES = {v.number: v.name for v in pb.NodeType.DESCRIPTOR.values}
COLL_TYPE_NAMES = {v.number: v.name for v in pb.CollectiveCommType.DESCRIPTOR.values}
