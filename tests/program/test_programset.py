"""The ProgramSet program/ builds in memory (what plan replays) is the one read/ loads from the set
generate writes for the same spec: per rank the same program (digest, names, dims), the same
group ids and peer ranks for its roles, the same groups with the same members and dimensions, the
same steps. Over specs of every layer kind, context-parallel kind, schedule and data-parallel
mode, recomputation, FP8 with TP overlap, both rank orders and imbalanced expert routing (one
program per EP rank); and the bindings of the demo set worked out by hand.
"""

from __future__ import annotations

import pytest

from traceforge.config import build_spec
from traceforge.ir.enums import COLL, RECV, SEND
from traceforge.ir.programset import ProgramSet
from traceforge.parallel.layout import Layout
from traceforge.program.programset import program_set
from traceforge.read.traceset import load_trace_set
from traceforge.write.writer import write_trace_set

LLAMA = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=3584, vocab=32000, seq_len=1024)
MOE = dict(LLAMA)
MLA = dict(layers=4, moe_first_dense_layers=1, hidden=1024, heads=16, kv_heads=16, ffn_hidden=3584, moe_ffn_hidden=512,
           vocab=32000, seq_len=1024, experts=16, shared_experts=1, top_k=4, moe_router_num_groups=1,
           moe_router_group_topk=1, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16,
           v_head_dim=32, world_size=16, tp=1, pp=2, ep=8, global_batch=32)
PP4 = dict(tp=1, pp=4, dp=2, num_microbatches=8)

SPECS: dict[str, tuple[str, dict]] = {
    "dense": ("demo", {}),
    "dense-megatron": ("demo", {"order": "megatron"}),
    "sp-steps": ("demo", {"sequence_parallel": True, "steps": 2}),
    "gqa": ("llama3-8b", dict(LLAMA, world_size=16, tp=2, pp=2, global_batch=32)),
    "gqa-unfused-fp16-no-sync": ("llama3-8b", dict(LLAMA, world_size=8, tp=2, pp=2, global_batch=8, dtype="fp16",
                                                   attention="unfused", bias_fusion=False, sync_collectives=False)),
    "fp8-tp-overlap": ("llama3-8b", dict(LLAMA, world_size=16, tp=4, pp=2, global_batch=16, sequence_parallel=True,
                                         fp8="hybrid", tp_comm_overlap=True)),
    "cp-p2p": ("llama3-8b", dict(LLAMA, world_size=16, tp=2, cp=2, pp=2, global_batch=16, order="megatron")),
    "cp-all-gather": ("llama3-8b", dict(LLAMA, world_size=16, tp=2, cp=2, pp=2, global_batch=16,
                                        cp_comm_type="all-gather", order="megatron")),
    "cp-a2a-zero3": ("llama3-8b", dict(LLAMA, world_size=16, tp=2, cp=2, pp=2, global_batch=16, cp_comm_type="a2a",
                                       dp_mode="zero3", order="megatron")),
    "moe-balanced": ("mixtral-8x7b", dict(MOE, world_size=16, tp=1, pp=2, ep=4, experts=8, global_batch=32)),
    "moe-dist-opt": ("mixtral-8x7b", dict(MOE, world_size=16, tp=1, pp=2, ep=4, experts=8, global_batch=32,
                                          dp_mode="dist-opt", overlap_grad_reduce=True)),
    "moe-zipf": ("mixtral-8x7b", dict(MOE, world_size=16, tp=2, pp=2, ep=2, experts=4, global_batch=16,
                                      sequence_parallel=True, moe_routing="zipf:1.1", seed=3)),
    "moe-zipf-ep4-megatron": ("mixtral-8x7b", dict(MOE, world_size=16, tp=1, pp=2, ep=4, experts=8, global_batch=32,
                                                   moe_routing="zipf:1.2", seed=5, order="megatron")),
    "mla-moe": ("deepseek-v3", MLA),
    "mla-node-limited": ("deepseek-v3", dict(MLA, moe_router_num_groups=2, moe_router_group_topk=1)),
    "gpipe": ("demo", dict(PP4, schedule="gpipe")),
    "1f1b-pp4": ("demo", dict(PP4, schedule="1f1b")),
    "1f1b-overlap-p2p": ("demo", dict(PP4, overlap_p2p_comm=True)),
    "interleaved": ("demo", dict(PP4, layers=8, schedule="interleaved", virtual_stages=2)),
    "interleaved-overlap-megatron": ("demo", dict(PP4, layers=8, schedule="interleaved", virtual_stages=2,
                                                  overlap_p2p_comm=True, order="megatron")),
    "zb-h1": ("demo", dict(PP4, schedule="zb-h1")),
    "interleaved-zb": ("demo", dict(tp=1, pp=2, dp=4, layers=8, num_microbatches=4, schedule="interleaved-zb",
                                    virtual_stages=2)),
    "zbv": ("demo", dict(PP4, layers=8, schedule="zbv")),
    "dualpipev": ("demo", dict(PP4, layers=8, schedule="dualpipev")),
    "zero1": ("demo", {"dp_mode": "zero1"}),
    "zero2": ("demo", {"dp_mode": "zero2"}),
    "dist-opt-overlap": ("demo", {"dp_mode": "dist-opt", "overlap_grad_reduce": True, "overlap_param_gather": True}),
    "ddp-overlap-buckets": ("demo", {"overlap_grad_reduce": True, "bucket_mb": 4}),
    "zero3": ("demo", {"dp_mode": "zero3"}),
    "hsdp": ("demo", {"tp": 1, "pp": 1, "dp": 8, "dp_mode": "hsdp", "shard_size": 4}),
    "recompute-full": ("demo", {"recompute": "full", "sequence_parallel": True}),
    "recompute-selective": ("demo", {"recompute": "selective"}),
    "layers-per-stage": ("demo", dict(PP4, layers=10, layers_per_stage=[2, 3, 3, 2], tied_embeddings=False)),
    "scatter-gather-megatron": ("demo", dict(tp=2, pp=4, dp=1, layers=8, num_microbatches=8, schedule="interleaved",
                                             virtual_stages=2, pipeline_scatter_gather="megatron")),
    "scatter-gather-deepspeed": ("demo", dict(tp=2, pp=4, dp=1, num_microbatches=8, recompute="full",
                                              pipeline_scatter_gather="deepspeed")),
}


def _read_back(spec, directory) -> ProgramSet:
    write_trace_set(spec, directory, jobs=1)
    return load_trace_set(directory, jobs=1).program_set


@pytest.mark.parametrize("name", SPECS)
def test_program_set_in_memory_is_the_one_read_from_generate(name, tmp_path):
    preset, flags = SPECS[name]
    spec = build_spec(preset, None, flags)
    built, read = program_set(spec), _read_back(spec, tmp_path / "set")
    assert built.world == read.world == spec.world_size
    assert built.shapes == read.shapes  # every rank runs the same program (digest of its columns)
    assert built.programs.keys() == read.programs.keys()
    for shape, program in built.programs.items():
        assert (program.names, program.dims) == (read.programs[shape].names, read.programs[shape].dims)
    assert built.group_roles == read.group_roles
    assert built.peer_roles == read.peer_roles
    assert built.groups == read.groups
    assert built.group_dims == read.group_dims
    assert (built.steps, built.annotated) == (read.steps, read.annotated) == (spec.steps, True)


def test_imbalanced_routing_runs_one_program_per_stage_and_ep_rank():
    """zipf routing: each (stage, EP rank) sends its own token counts, so pp x ep = 4 programs,
    one per (stage, EP rank) whichever other coordinates a rank has, and every rank's peers
    include the other members of its EP group."""
    preset, flags = SPECS["moe-zipf"]
    spec = build_spec(preset, None, flags)
    ps = program_set(spec)
    layout = Layout.from_spec(spec)
    key = list(zip(layout.coords["pp"].tolist(), layout.coords["ep"].tolist(), strict=True))
    assert len(set(key)) == len(set(ps.shapes)) == 2 * 2
    assert all((key[a] == key[b]) == (ps.shapes[a] == ps.shapes[b]) for a in range(16) for b in range(16))
    for rank, peers in enumerate(ps.peer_roles):
        assert set(layout.ep_peers[rank].tolist()) - {rank} <= set(peers)


def test_demo_bindings_by_hand():
    """demo: 8 ranks, tp 2, pp 2, dp 2 in tp-pp-dp order: rank = tp + 2 pp + 4 dp. Group ids
    (parallel/layout.GROUP_KINDS order, 1-based, by first rank): tp {0,1}=1 {2,3}=2 {4,5}=3
    {6,7}=4; pp (no collective) 5-8; dp {0,4}=9 {1,5}=10 {2,6}=11 {3,7}=12; emb 13-16; mp
    (tp x pp) {0,1,2,3}=17 {4,5,6,7}=18; world 19. At pp = 2 the next and the previous stage are
    one rank: every rank has one peer, its pipeline partner at the same tp and dp."""
    ps = program_set(build_spec("demo"))
    assert len(ps.programs) == 2  # one per stage: every rank of a stage binds alike
    assert ps.peer_roles == [(2,), (3,), (0,), (1,), (6,), (7,), (4,), (5,)]
    tp_of = {rank: str(1 + rank // 2) for rank in range(8)}
    dp_of = {rank: str(9 + rank % 4) for rank in range(8)}
    for rank, groups in enumerate(ps.group_roles):
        assert tp_of[rank] in groups and dp_of[rank] in groups and str(17 + rank // 4) in groups and "19" in groups
        members = {g: ps.groups[g] for g in groups}
        assert all(rank in m for m in members.values())
    assert ps.groups["1"] == (0, 1) and ps.groups["12"] == (3, 7) and ps.groups["19"] == tuple(range(8))
    assert {ps.group_dims[g] for g in ("1", "2", "3", "4")} == {"tp"}
    assert {ps.group_dims[g] for g in ("9", "10", "11", "12")} == {"dp"}
    assert set(ps.groups) == {str(g) for g in range(1, 20) if not 5 <= g <= 8}  # pp groups carry no collective
    for program in ps.programs.values():  # one peer role: every transfer's role is 0
        transfers = (program.types == SEND) | (program.types == RECV)
        assert transfers.any() and set(program.roles[transfers].tolist()) == {0}
        assert set(program.roles[program.types == COLL].tolist()) == set(range(len(ps.group_roles[0])))


def test_peers_that_differ_are_two_roles():
    """pp 4 (1f1b, tp 1, dp 2; rank = pp + 4 dp): a middle stage's next and previous stage are two
    ranks, numbered by first use (its first transfer receives from the previous stage); the end
    stages, next and previous wrapping around, differ too."""
    preset, flags = SPECS["1f1b-pp4"]
    ps = program_set(build_spec(preset, None, flags))
    assert ps.peer_roles[1] == (0, 2) and ps.peer_roles[5] == (4, 6)
    assert ps.peer_roles[0] == (1,) and ps.peer_roles[3] == (2,)  # stage 0 only talks to stage 1, stage 3 to 2
    assert ps.shapes[1] == ps.shapes[5] != ps.shapes[2]
