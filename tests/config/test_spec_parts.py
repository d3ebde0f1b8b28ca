"""The spec's parts (config/views.py) and the memos keyed on them.

A memo is right when its key holds everything its function reads and fast when it holds nothing
more. Each planner memo takes parts and plain values, never a Spec (checked on every lru_cache of
the planner's packages); a part compares on all its fields and its class; and for every memo, a
spec changed in a field outside the memo's parts (to a value nothing could use) is served the same
answer from the memo without recomputing it, while a spec changed in a field inside is recomputed
to a different answer."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pickle
import pkgutil
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from properties import legal_specs

import traceforge
from traceforge.base.errors import SpecError
from traceforge.config import (
    DataParallelConfig,
    Layer,
    LayerRun,
    MachineConfig,
    ModelConfig,
    PipelineConfig,
    Placement,
    ShardingConfig,
    Spec,
    Staged,
    TraceConfig,
    TrainingConfig,
    build_spec,
)
from traceforge.config.fields import OMITTED_AT_DEFAULT, SPEC_KEYS
from traceforge.config.views import PARTS, View, field_names, view
from traceforge.machine.cluster import Cluster
from traceforge.memory import report
from traceforge.memory.report import memory_report, stages_activation_peaks, stages_states
from traceforge.model import activations, anatomy, params
from traceforge.model.activations import layer_activations, routing_imbalance
from traceforge.model.anatomy import layer_anatomy, layer_structure
from traceforge.model.params import layer_param_list, layer_params
from traceforge.parallel import partition
from traceforge.parallel.layout import LayoutKey
from traceforge.parallel.partition import model_chunks, stage_params
from traceforge.search import bound, dp_bound, ring_floor
from traceforge.search.bound import _pieces, _pipeline, _record_pieces, pipeline_links
from traceforge.search.dp_bound import spans, unit_gathers
from traceforge.search.ring_floor import ring_blocks

LINK = Cluster(scale_up_bw=400.0, scale_out_bw=50.0, gpus_per_node=4)
DENSE = dict(arch="llama", layers=8, hidden=512, ffn_hidden=1536, heads=8, kv_heads=4, vocab=1000, seq_len=256,
             tied_embeddings=False, global_batch=16, world_size=16, tp=2, cp=2, pp=2, order="megatron",
             sequence_parallel=True, dp_mode="zero3", cp_comm_type="p2p")
MOE = dict(DENSE, cp=1, world_size=8, dp_mode="dist-opt", experts=4, top_k=2, moe_ffn_hidden=512, ep=2,
           moe_routing="zipf:1.2")


def fields(*parts: type, plus: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(name for part in parts for name in field_names(part)) | frozenset(plus)


# What LayoutKey reads: the sizes, the order, the mode (for HSDP's shard) and the routing groups.
LAYOUT = frozenset({"tp", "cp", "ep", "pp", "dp", "order", "dp_mode", "shard_size", "moe_router_num_groups"})

# (name, the answer as the planner asks for it, the memo behind it, the fields of the parts it keys on)
MEMOS = [
    ("layer_structure", lambda s: layer_structure(s, s.experts > 0), anatomy._structure, fields(Layer)),
    ("layer_anatomy", lambda s: layer_anatomy(s, s.experts > 0), anatomy._anatomy, fields(Layer, plus=("micro_batch",))),
    ("layer_params", lambda s: layer_params(s, s.layers - 1), params._layer_params, fields(Layer)),
    ("layer_param_list", lambda s: layer_param_list(s, s.layers - 1), params._layer_param_tuple, fields(Layer)),
    ("model_chunks", lambda s: model_chunks(s, s.pp - 1), partition.chunks_of, fields(PipelineConfig, plus=("layers",))),
    ("stage_params", lambda s: stage_params(s, s.pp - 1), partition._stage_params, fields(Staged)),
    ("routing_imbalance", routing_imbalance, activations._routing_imbalance, fields(LayerRun)),
    ("layer_activations", lambda s: layer_activations(s, s.experts > 0), activations._layer_activations, fields(LayerRun)),
    ("stages_states", stages_states, report._stages_states, fields(Placement)),
    ("stages_activation_peaks", stages_activation_peaks, report._activation_peaks, fields(LayerRun, PipelineConfig)),
    ("spans", lambda s: spans(s, 4), dp_bound._spans, LAYOUT),
    ("pipeline_links", lambda s: pipeline_links(s, 4), bound._links, LAYOUT),
    ("unit_gathers", lambda s: unit_gathers(s, LINK), dp_bound._unit_gathers, fields(Placement) | LAYOUT),
    ("dp_floor_parts", lambda s: dp_bound._stage_parts(s.placement, LayoutKey.of(s), LINK), dp_bound._stage_parts,
     fields(Placement) | LAYOUT),
    ("layer_pieces", lambda s: _pieces(s, LINK), bound._layer_pieces, fields(LayerRun)),
    ("pipeline", lambda s: _pipeline(s.run, s.pipeline, LINK, unit_gathers(s, LINK), pipeline_links(s, 4)), bound._pipeline,
     fields(LayerRun, Placement) | LAYOUT),
    ("ring_blocks", ring_blocks, ring_floor._ring_blocks, fields(Layer, plus=("micro_batch",))),
]


class Junk:
    """A value no function could use: reading it, hashing aside, fails or differs."""

    def __repr__(self) -> str:
        return "JUNK"


def _planner_memos():
    for package in (traceforge.model, traceforge.parallel, traceforge.memory, traceforge.search):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if hasattr(obj, "cache_info") and hasattr(obj, "__wrapped__") and obj.__module__ == module.__name__:
                    yield f"{module.__name__}.{name}", obj


def test_the_parts_cut_the_spec_and_rebuild_it():
    names = [name for part in PARTS for name in field_names(part)]
    assert sorted(names) == sorted(SPEC_KEYS) == sorted(f.name for f in dataclasses.fields(Spec))
    assert len(names) == len(set(names))  # each field in one part
    assert fields(Layer) == fields(ModelConfig, ShardingConfig, MachineConfig)
    assert fields(LayerRun) == fields(Layer, TrainingConfig)
    assert fields(Placement) == fields(Layer, PipelineConfig, DataParallelConfig)
    spec = build_spec("demo", overrides=MOE)
    parts = (spec.model, spec.sharding, spec.machine, spec.pipeline, spec.data, spec.training, spec.trace)
    assert [type(p) for p in parts] == list(PARTS)
    rebuilt = Spec(**{name: getattr(part, name) for part in parts for name in field_names(type(part))})
    assert rebuilt == spec and rebuilt.to_dict() == spec.to_dict()
    # A key added later is left out at its default (the documents of older specs keep their
    # bytes) and kept, in its place, otherwise; either document builds the spec back.
    assert list(spec.to_dict()) == [k for k in SPEC_KEYS if k not in OMITTED_AT_DEFAULT]
    assert all(getattr(spec, k) == v for k, v in OMITTED_AT_DEFAULT.items())
    on = build_spec("demo", overrides={"pipeline_scatter_gather": "megatron"})
    assert list(on.to_dict()) == list(SPEC_KEYS)
    for s in (spec, on):
        doc = s.to_dict()
        preset = doc.pop("preset")
        assert build_spec(preset, overrides={k: v for k, v in doc.items() if k != "world_size"}) == s


@pytest.mark.parametrize("part", [*PARTS, Layer, LayerRun, Staged, Placement])
def test_a_part_is_equal_on_every_field_and_its_class(part):
    spec = build_spec("demo")
    view = getattr(spec, {ModelConfig: "model", ShardingConfig: "sharding", MachineConfig: "machine",
                          PipelineConfig: "pipeline", DataParallelConfig: "data", TrainingConfig: "training",
                          TraceConfig: "trace", Layer: "layer", LayerRun: "run", Staged: "staged",
                          Placement: "placement"}[part])
    assert type(view) is part and view == dataclasses.replace(view) and hash(view) == hash(dataclasses.replace(view))
    for name in field_names(part):
        changed = dataclasses.replace(view, **{name: Junk()})
        assert changed != view, name
    assert view != spec and spec != view  # a part never equals the spec it came from
    again = pickle.loads(pickle.dumps(view))
    assert set(again.__dict__) == set(field_names(part))  # pickled as its fields alone (no hash of another process)
    assert again == view


def test_a_spec_pickles_as_its_fields_alone():
    spec = build_spec("demo")
    assert spec.layer.layer is spec.layer  # the part alone is its own part
    again = pickle.loads(pickle.dumps(spec))
    assert set(again.__dict__) == set(SPEC_KEYS) and again == spec


@pytest.mark.parametrize("name,memo", list(_planner_memos()), ids=lambda x: x if isinstance(x, str) else "")
def test_no_planner_memo_takes_a_whole_spec(name, memo):
    """A memo of a Spec keys on every field, read or not: the planner's never hit."""
    hints = typing.get_type_hints(memo.__wrapped__)
    parameters = [p for p in inspect.signature(memo.__wrapped__).parameters]
    assert all(p in hints for p in parameters), f"{name}: every parameter annotated"
    for parameter in parameters:
        kind = hints[parameter]
        assert kind is not Spec and not (isinstance(kind, type) and issubclass(kind, Spec)), (name, parameter)
        if isinstance(kind, type) and issubclass(kind, View):
            assert kind in (*PARTS, Layer, LayerRun, Staged, Placement), (name, parameter)


def test_every_memo_of_the_table_is_a_planner_memo():
    found = {memo for _, memo in _planner_memos()}
    assert all(memo in found for _, _, memo, _ in MEMOS)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(spec=legal_specs(), pick=st.integers(0, 10**6))
def test_a_memo_serves_every_spec_that_differs_outside_its_parts(spec, pick):
    """For each memo, a field outside its parts is set to a value nothing could use: the answer is
    the same object, served from the memo (no miss); the memo never looked at that field."""
    for name, ask, memo, inside in MEMOS:
        outside = [key for key in SPEC_KEYS if key not in inside]
        field = outside[pick % len(outside)]
        try:
            answer = ask(spec)
        except (SpecError, ValueError):
            continue
        misses = memo.cache_info().misses
        assert ask(dataclasses.replace(spec, **{field: Junk()})) == answer, (name, field)
        assert memo.cache_info().misses == misses, f"{name} recomputed for {field}, which it does not read"


# A spec, a change inside some memos' parts, and the memos whose answer it must change.
INSIDE = [
    (DENSE, dict(hidden=768, ffn_hidden=2048), ["layer_structure", "layer_anatomy", "layer_params", "layer_param_list",
                                               "stage_params", "layer_activations", "stages_states",
                                               "stages_activation_peaks", "unit_gathers", "dp_floor_parts", "layer_pieces",
                                               "pipeline"]),
    (DENSE, dict(micro_batch=2), ["layer_anatomy", "layer_activations", "stages_activation_peaks", "layer_pieces",
                                  "pipeline"]),
    (DENSE, dict(seq_len=8192, max_position_embeddings=8192), ["ring_blocks", "layer_anatomy", "layer_pieces"]),
    (MOE, dict(seed=3), ["routing_imbalance", "layer_activations", "stages_activation_peaks"]),
    (DENSE, dict(dp_mode="zero1"), ["stages_states", "unit_gathers", "dp_floor_parts"]),
    (DENSE, dict(schedule="gpipe"), ["stages_activation_peaks", "pipeline"]),
    (DENSE, dict(layers_per_stage=(6, 2)), ["model_chunks", "stage_params", "stages_states", "pipeline"]),
    (DENSE, dict(order="tp-pp-cp-dp", order_unchecked=True), ["spans", "pipeline_links"]),
]


@pytest.mark.parametrize("base,change,changed", INSIDE, ids=lambda x: "-".join(x) if isinstance(x, dict) and "arch" not in x
                         else "")
def test_a_memo_recomputes_when_a_field_it_reads_changes(base, change, changed):
    """With the memo warm on one spec, a spec changed inside the memo's parts gets another answer:
    the key holds the changed field (a key without it would have served the first answer)."""
    first = build_spec("demo", overrides=base)
    other = build_spec("demo", overrides={**base, **change})
    for name, ask, _, inside in MEMOS:
        if name in changed:
            assert set(change) & inside, name
            assert ask(other) != ask(first), (name, change)


@pytest.mark.parametrize("overrides", [
    dict(MOE, moe_routing="balanced"), dict(DENSE, dp_mode="ddp"),
    dict(DENSE, cp=1, world_size=8, fp8="hybrid", tp_comm_overlap=True),
    dict(MOE, cp=2, world_size=16, order="megatron", micro_batch=2, dp_mode="zero1", ep=4, moe_router_num_groups=2,
         moe_router_group_topk=1, moe_routing="balanced"),
])
def test_a_layer_recorded_in_a_step_of_one_micro_batch_floors_as_in_its_own(overrides):
    """The bound records a layer (dense, or MoE with balanced routing) as a step of one micro-batch
    runs it (its only reads of the count are p2p tags and imbalanced routing's draws), so one
    recording serves every micro-batch count: the pieces must equal the recording at the spec's own
    count (FP8, CP and TP-overlap rings, expert parallelism, node-limited dispatch included)."""
    seen = set()
    for world in (8, 16, 32):
        try:
            spec = build_spec("demo", overrides={**overrides, "world_size": world * overrides.get("cp", 1)})
        except SpecError:
            continue
        assert _pieces(spec, LINK) == _record_pieces(spec, LINK), (world, spec.num_microbatches)
        seen.add(spec.num_microbatches)
    assert len(seen) > 1  # the case builds at more than one size, and the counts did vary


def test_memory_report_equals_a_cold_computation():
    """The memoised report of a spec equals the one computed with every memo cleared, for specs
    visited in an order where each one's pieces are served from an earlier spec's entry."""
    base = dict(DENSE, world_size=8, cp=1)
    variants = [dict(base, micro_batch=mb, recompute=r, dp_mode=d) for mb in (1, 2)
                for r in ("none", "selective", "full") for d in ("ddp", "zero1", "zero3")]
    warm = [memory_report(build_spec("demo", overrides=v)) for v in variants]
    for variant, answer in zip(variants, warm, strict=True):
        for _, memo in _planner_memos():
            memo.cache_clear()
        assert memory_report(build_spec("demo", overrides=variant)) == answer
    assert len({r.peak_bytes for r in warm}) > 3  # the variants do differ in memory


def test_a_memo_given_a_whole_spec_would_miss_every_other_candidate():
    """Why the wrappers hand a memo the part alone: keyed on a Spec, two candidates with one stage
    layout but different micro-batches miss; keyed on the Staged part they share one entry."""
    a = build_spec("demo", overrides={"micro_batch": 1})
    b = build_spec("demo", overrides={"micro_batch": 2})
    assert a != b and a.staged == b.staged and hash(a.staged) == hash(b.staged)
    lookups = functools.lru_cache(maxsize=8)(lambda key: object())
    assert lookups(a.staged) is lookups(b.staged)
    assert lookups(a) is not lookups(b)


def test_a_part_of_few_fields_reads_them_from_a_larger_record():
    """A part made from a larger record fills its fields in on the first reading, whatever its
    size: whether they are filled in is asked of the fields themselves, not of the dict's length
    (which also holds the part's values and hash)."""
    @dataclasses.dataclass(frozen=True, eq=False)
    class Wide(View):
        a: int
        b: int
        c: int

    @dataclasses.dataclass(frozen=True, eq=False)
    class Narrow(View):
        a: int
        b: int

    part = view(Narrow, Wide(1, 2, 3))
    assert (part.a, part.b) == (1, 2)
    assert part == Narrow(1, 2) and hash(part) == hash(Narrow(1, 2))
