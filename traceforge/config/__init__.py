"""The training spec: one validated, immutable description of model, layout and step.

A spec is assembled from three layers, later ones winning: a preset (default ``demo``), an
optional config file (YAML, TOML or JSON; flat keys named like the CLI flags in snake_case),
and CLI flags. ``build_spec`` merges them, fills every default explicitly and refuses every
impossible combination with one line naming the field and the fix.

The package, by job: ``fields`` (the key table and the Spec record), ``views`` (the spec's parts,
what functions and memos take), ``files`` (reading spec files), ``build`` (the merge), one module
per domain's check (``architecture``, ``parallelism``, ``batch``, ``experts``, ``schedule``,
``data_parallel``, ``machine``), the rule tables (``schedules``, ``dp_modes``) and ``limits``. The
names below are the ones the rest of traceforge uses: import them from here.
"""

from __future__ import annotations

from traceforge.base.errors import SpecError
from traceforge.config.build import (
    DERIVED_DEFAULTS,
    arch_values,
    build_spec,
    preset_values,
    spec_builder,
    spec_defaults,
    spec_label,
)
from traceforge.config.dp_modes import DP_MODE_ALIASES, DP_MODES, DpModeRule
from traceforge.config.experts import moe_layer_count
from traceforge.config.fields import DTYPE_BYTES, FIELD_BY_NAME, FIELDS, Field, Spec, spec_fields
from traceforge.config.files import load_config_file
from traceforge.config.limits import (
    EP_TAG_KINDS,
    MAX_NODES_PER_RANK,
    MAX_STRAGGLER_FACTOR,
    MAX_TAG,
    RING_KINDS,
    ep_tag_base,
    estimated_nodes_per_rank,
    overlap_tags,
)
from traceforge.config.parallelism import (
    KNOWN_DIMS,
    MEGATRON_ORDER,
    ORDER_ALIASES,
    REQUIRED_DIMS,
    complete_order,
    normalize_order,
    requested_order,
    sizes_text,
)
from traceforge.config.schedules import V_SHAPED
from traceforge.config.views import (
    DataParallelConfig,
    Layer,
    LayerRun,
    MachineConfig,
    ModelConfig,
    PipelineConfig,
    Placement,
    ShardingConfig,
    Staged,
    TraceConfig,
    TrainingConfig,
)

__all__ = [
    "DataParallelConfig", "Layer", "LayerRun", "MachineConfig", "ModelConfig", "PipelineConfig", "Placement",
    "ShardingConfig", "Staged", "TraceConfig", "TrainingConfig",
    "DERIVED_DEFAULTS", "DP_MODES", "DP_MODE_ALIASES", "DpModeRule", "DTYPE_BYTES", "EP_TAG_KINDS", "FIELDS", "FIELD_BY_NAME", "Field",
    "KNOWN_DIMS", "MAX_NODES_PER_RANK", "MAX_STRAGGLER_FACTOR", "MAX_TAG", "MEGATRON_ORDER",
    "ORDER_ALIASES", "REQUIRED_DIMS", "RING_KINDS", "Spec", "SpecError", "V_SHAPED",
    "arch_values", "build_spec", "complete_order", "ep_tag_base", "estimated_nodes_per_rank", "load_config_file",
    "moe_layer_count", "normalize_order", "overlap_tags", "preset_values", "requested_order", "sizes_text", "spec_builder", "spec_defaults", "spec_fields",
    "spec_label",
]
