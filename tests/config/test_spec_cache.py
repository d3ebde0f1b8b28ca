"""spec_cache.ignoring: a memo keyed on all but some spec fields is only right if the function
never reads those fields. Each use is run uncached on a spy spec that records every field read,
over specs covering the schedules, data-parallel modes, recompute and MoE."""

from __future__ import annotations

import dataclasses

import pytest

from traceforge.base.errors import SpecError
from traceforge.config import Spec, build_spec
from traceforge.config.cache import ignoring
from traceforge.machine.cluster import Cluster
from traceforge.memory.report import memory_report, stages_activation_peaks, stages_states
from traceforge.model.activations import layer_activations
from traceforge.model.anatomy import layer_anatomy, layer_structure
from traceforge.model.params import _layer_param_tuple, _layer_params
from traceforge.parallel.partition import _model_chunks, stage_params
from traceforge.search.bound import _layer_pieces, _pieces, _pipeline, _record_pieces, pipeline_links
from traceforge.search.dp_bound import _stage_parts, spans, unit_gathers
from traceforge.search.ring_floor import ring_blocks

LINK = Cluster(scale_up_bw=400.0, scale_out_bw=50.0, gpus_per_node=4)


class _Spy(Spec):
    """A spec that notes which fields are read (identity hash and equality, so memos inside the
    function under test key on the object and never read the fields to hash them)."""

    def __getattribute__(self, name: str):
        if name in FIELDS:
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return super().__getattribute__(name)

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


FIELDS = {f.name for f in dataclasses.fields(Spec)}


def spy(spec: Spec) -> _Spy:
    return _Spy(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(Spec)})


def reads(spec: _Spy) -> set[str]:
    return set(object.__getattribute__(spec, "__dict__").get("_read", set()))


DENSE = dict(arch="llama", layers=8, hidden=512, ffn_hidden=1536, heads=8, kv_heads=4, vocab=1000, seq_len=256,
             tied_embeddings=False, global_batch=16)
MOE = dict(DENSE, experts=4, top_k=2, moe_ffn_hidden=512)
CASES = [
    dict(DENSE, world_size=8, tp=2, pp=2, schedule="1f1b", dp_mode="zero3", recompute="selective"),
    dict(DENSE, world_size=16, tp=1, pp=4, schedule="interleaved", virtual_stages=2, dp_mode="hsdp", shard_size=2),
    dict(DENSE, world_size=8, tp=2, pp=2, schedule="zbv", dp_mode="zero2", recompute="full", micro_batch=2),
    dict(DENSE, layers=14, world_size=16, tp=2, pp=4, schedule="interleaved-zb", virtual_stages=2, dp_mode="dist-opt",
         account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
    dict(MOE, world_size=8, tp=2, pp=2, ep=2, schedule="dualpipev", dp_mode="zero1", sequence_parallel=True,
         order="megatron"),
    dict(MOE, world_size=16, tp=1, cp=2, pp=2, ep=2, schedule="1f1b", dp_mode="zero1", order="megatron"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['schedule']}-{c['dp_mode']}")
@pytest.mark.parametrize("cached,args", [(stages_states, ()), (stages_activation_peaks, ()), (_layer_pieces, (LINK,)), (ring_blocks, ()),
                                         (_pipeline, (LINK,)), (pipeline_links, (4,)), (_stage_parts, (LINK,)), (spans, (4,)),
                                         (unit_gathers, (LINK,)),
                                         (_model_chunks, (1,)), (stage_params, (1,)), (layer_activations, (False,)),
                                         (layer_activations, (True,)), (layer_anatomy, (True,)), (layer_structure, (True,)),
                                         (_layer_params, (True,)), (_layer_param_tuple, (True,))],
                         ids=["stages_states", "stages_activation_peaks", "bound_pieces", "ring_blocks", "bound_pipeline", "pipeline_links",
                              "dp_floor_parts", "dp_spans", "dp_unit_gathers", "model_chunks",
                              "stage_params", "dense_layer_activations", "moe_layer_activations", "layer_anatomy",
                              "layer_structure", "layer_params", "layer_param_list"])
def test_ignored_fields_are_never_read(case, cached, args):
    spec = spy(build_spec("demo", overrides=case))
    cached.uncached(spec, *args)
    read = reads(spec)
    assert read, "the spy saw no field read at all"
    assert not read & cached.ignored, f"{cached.__name__} reads {sorted(read & cached.ignored)}, which its memo ignores"


@pytest.mark.parametrize("case", CASES
                         + [dict(CASES[0], fp8="hybrid"), dict(CASES[2], cp=2, world_size=16, order="megatron"),
                            dict(CASES[0], tp_comm_overlap=True, sequence_parallel=True),
                            dict(CASES[4], cp=2, world_size=16, schedule="1f1b", ep=4, micro_batch=2),
                            dict(MOE, shared_experts=1, moe_router_num_groups=2, moe_router_group_topk=1, world_size=16,
                                 tp=1, pp=2, ep=4, schedule="1f1b", dp_mode="ddp", sync_collectives=True, order="megatron")],
                         ids=lambda c: f"{c['schedule']}-{c['dp_mode']}-{c.get('fp8', 'bf16')}-cp{c.get('cp', 1)}"
                         f"-e{c.get('experts', 0)}")
def test_a_layer_recorded_at_dp_1_floors_as_at_its_own_dp(case):
    """The bound records a layer (dense, or MoE with balanced routing) with dp and the micro-batch
    count at 1 (their only reads are p2p tags and imbalanced routing's draws), so one recording
    serves every pipeline depth and dp: the pieces must equal the recording at the spec's own sizes
    (FP8, CP and TP-overlap rings, expert parallelism, node-limited dispatch included)."""
    seen = set()
    for world in (8, 16, 32):
        try:
            spec = build_spec("demo", overrides={**case, "world_size": world * case.get("cp", 1)})
        except SpecError:
            continue
        assert _pieces(spec, LINK) == _record_pieces(spec, LINK), (world, spec.dp, spec.num_microbatches)
        seen.add(spec.num_microbatches)
    assert len(seen) > 1  # the case builds at more than one size, and the sizes did vary


def test_memory_report_equals_a_cold_computation_across_the_ignored_fields():
    """The memoized report of a spec equals the one computed with every memo cleared, for specs
    visited in an order where each one's pieces are served from an earlier spec's entry."""
    variants = [dict(CASES[0], micro_batch=mb, recompute=r, dp_mode=d) for mb in (1, 2)
                for r in ("none", "selective", "full") for d in ("ddp", "zero1", "zero3")]
    warm = [memory_report(build_spec("demo", overrides=v)) for v in variants]
    for variant, report in zip(variants, warm, strict=True):
        stages_states.cache_clear()
        stages_activation_peaks.cache_clear()
        assert memory_report(build_spec("demo", overrides=variant)) == report
    assert len({r.peak_bytes for r in warm}) > 3  # the variants do differ in memory


def test_the_memo_keys_on_every_other_field_and_on_the_arguments():
    calls = []

    @ignoring("seed", maxsize=2)
    def layers_plus(spec: Spec, extra: int) -> int:
        calls.append(1)
        return spec.layers + extra

    a = build_spec("demo")
    assert layers_plus(a, 1) == layers_plus(dataclasses.replace(a, seed=a.seed + 1), 1) == a.layers + 1
    assert len(calls) == 1  # the second call differed only in the ignored field
    assert layers_plus(dataclasses.replace(a, layers=a.layers * 2), 1) == 2 * a.layers + 1
    assert layers_plus(a, 2) == a.layers + 2
    assert len(calls) == 3
    layers_plus(a, 1)  # evicted: two entries held, this one the least recently used
    assert len(calls) == 4


def test_unknown_field_names_are_refused():
    with pytest.raises(ValueError, match="not Spec fields"):
        ignoring("no_such_field")
