"""The Chakra ET attribute contract, named once.

ASTRA-sim reads the first group by name; the annotations are ours, for people and analysis.
"""

from __future__ import annotations

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

# ASTRA-sim's NATIVE send/recv tags live in [0, TAG_LIMIT) and are folded modulo it, so every
# p2p tag we write stays below it (unique per (src, dst) pair).
TAG_LIMIT = 500_000_000

# ASTRA-sim counts time in nanoseconds in a uint64 that parts of it read as signed: a duration in
# µs, times 1000, plus the time of the step around it must stay below 2^63. One limit for what
# generate writes (write/durations.py) and what check accepts (check/nodes.py).
NS_CLOCK_LIMIT = 1 << 63
MAX_STEP_MICROS = (NS_CLOCK_LIMIT - 1) // 1000  # ~9.2e15 µs, 292 years

# traceforge annotations.
PHASE = "phase"
DIM = "dim"
STEP = "step"
MICROBATCH = "microbatch"
LAYER = "layer"
# Activation memory (docs/memory.md "Memory in the trace"): on a pass's first compute node, the
# bytes allocated as it starts; on its last, the bytes freed as it ends. From model/activations.
MEM_ALLOC_BYTES = "mem_alloc_bytes"
MEM_FREE_BYTES = "mem_free_bytes"
# On every Send, Recv and collective: the element type of what it moves, as torch names it
# (torch.<dtype>), so a replay (PARAM's comm replay) sizes its tensors in elements of the type the
# framework sends. comm_size is always a whole number of these elements but for Megatron's batch
# broadcast of int64 tokens under a TP size that does not divide their bytes.
DTYPE = "dtype"
BFLOAT16, FLOAT16, FLOAT32, INT32, INT64, BOOL = "bfloat16", "float16", "float32", "int32", "int64", "bool"
FP8_E4M3, FP8_E5M2 = "float8_e4m3fn", "float8_e5m2"  # TransformerEngine's FP8 gathers (--fp8)
ELEMENT_BYTES: dict[str, int] = {BFLOAT16: 2, FLOAT16: 2, FLOAT32: 4, INT32: 4, INT64: 8, BOOL: 1, FP8_E4M3: 1, FP8_E5M2: 1}
# The spec's --dtype / --grad-dtype names, as torch names them.
TORCH_DTYPE = {"bf16": BFLOAT16, "fp16": FLOAT16, "fp32": FLOAT32}

# The AttributeProto member each attribute is written in. For those ASTRA-sim reads it is the
# member Chakra's v1 feeder reads (mlcommons/chakra src/feeder/et_feeder_node.cpp:28-50, the
# ETFeederNode constructor; ASTRA-sim used it until early 2025): a oneof read through another
# member returns 0, so a Send written with int64_val comm_dst goes to rank 0. Chakra's own
# producers agree where they write the attribute: src/generator/generator.py (is_cpu_op
# bool_val, tensor_size uint64_val, comm_type/comm_size int64_val) and
# src/converter/pytorch_converter.py:244-263 (comm_type/comm_size int64_val, pg_name string_val).
# Newer feeders (FeederV3) accept any integer member, so these types cost nothing there.
ATTR_MEMBER: dict[str, str] = {
    IS_CPU_OP: "bool_val",
    NUM_OPS: "int64_val",      # et_feeder_node.cpp:32 attr.int64_val()
    TENSOR_SIZE: "uint64_val",  # :34 attr.uint64_val()
    COMM_TYPE: "int64_val",    # :36-37
    COMM_SIZE: "int64_val",    # :41
    COMM_SRC: "int32_val",     # :43
    COMM_DST: "int32_val",     # :45
    COMM_TAG: "int32_val",     # :47
    PG_NAME: "string_val",     # :49
    PHASE: "string_val",
    DIM: "string_val",
    STEP: "int64_val",
    MICROBATCH: "int64_val",
    LAYER: "int64_val",
    MEM_ALLOC_BYTES: "uint64_val",  # a byte count, as tensor_size
    MEM_FREE_BYTES: "uint64_val",
    DTYPE: "string_val",
}
# The attributes whose member matters to the v1 feeder (the rest it ignores or keeps as is).
V1_READ = frozenset((IS_CPU_OP, NUM_OPS, TENSOR_SIZE, COMM_TYPE, COMM_SIZE, COMM_SRC, COMM_DST, COMM_TAG, PG_NAME))
