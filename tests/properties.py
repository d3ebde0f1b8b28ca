"""Legal specs drawn across every parallel axis, and what every set written from one must show.

Shared by tests/suites/test_property.py (a bounded, derandomized sample in CI) and
benchmarks/bench_property.py (thousands of examples). A draw goes through build_spec, the
validation `traceforge generate` runs; an illegal one is discarded with `assume`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import assume
from hypothesis import strategies as st
from oracle import consistency_problems, load_set, unfinished

from traceforge.base.errors import SpecError
from traceforge.check.run import check_trace_set
from traceforge.config import Spec, build_spec

SEND = 5
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "interleaved-zb", "zbv", "dualpipev")
V_SHAPED = ("zbv", "dualpipev")
# A Llama-style model small enough that a set of 16 ranks writes and checks in well under a second.
TINY = dict(arch="llama", hidden=64, ffn_hidden=128, heads=4, kv_heads=2, vocab=256, seq_len=64,
            tied_embeddings=False, micro_batch=1, order="megatron", gpu="h100")


@st.composite
def legal_specs(draw) -> Spec:
    schedule = draw(st.sampled_from(SCHEDULES))
    # Megatron's interleaving needs p > 2; the others are plain 1F1B at p = 1.
    stages = (3, 4) if schedule == "interleaved" else (1, 2, 3, 4) if schedule in ("1f1b", "gpipe") else (2, 3, 4)
    tp, cp, pp, dp = (draw(st.sampled_from(choices)) for choices in ((1, 2), (1, 1, 2), stages, (1, 2, 4)))
    assume(tp * cp * pp * dp <= 16)
    v = draw(st.sampled_from((2, 3))) if schedule in ("interleaved", "interleaved-zb") else 1
    chunks = 2 if schedule in V_SHAPED else v
    # Half the draws fit the schedules' divisibility rules (layers by p*v, micro-batches by p or
    # at least 2p), half are free and left to the spec's validation.
    layers = pp * chunks * draw(st.integers(1, 2)) if draw(st.booleans()) else draw(st.integers(1, 8))
    m = pp * draw(st.integers(1, 3)) if draw(st.booleans()) else draw(st.integers(1, 8))
    o: dict = dict(TINY, tp=tp, cp=cp, pp=pp, dp=dp, schedule=schedule, layers=layers,
                   num_microbatches=m, steps=draw(st.sampled_from((1, 1, 2))), virtual_stages=v,
                   overlap_p2p_comm=draw(st.booleans()), recompute=draw(st.sampled_from(("none", "selective", "full"))),
                   dp_mode=draw(st.sampled_from(("ddp", "zero1", "zero2", "dist-opt", "zero3", "hsdp"))))
    if schedule in V_SHAPED:
        o["virtual_stages"] = 2
    elif schedule not in ("interleaved", "interleaved-zb"):
        del o["virtual_stages"]
    if o["dp_mode"] == "hsdp":
        o["shard_size"] = draw(st.sampled_from([k for k in (1, 2, 4) if dp % k == 0]))
    if tp > 1:
        o["sequence_parallel"] = draw(st.booleans())
    if cp > 1:
        o["cp_comm_type"] = draw(st.sampled_from(("p2p", "p2p", "all-gather", "a2a")))
    if draw(st.booleans()):  # mixture of experts
        o |= dict(experts=draw(st.sampled_from((2, 4))), top_k=draw(st.sampled_from((1, 2))),
                  ep=draw(st.sampled_from((1, 2, 2, 4))), moe_layer_freq=draw(st.sampled_from((1, 2))))
        if o["ep"] > 1:
            o["moe_routing"] = draw(st.sampled_from(("balanced", "zipf:1.2")))
    split = draw(st.sampled_from(("even", "first-last", "account", "per-stage")))
    if split == "first-last" and pp > 2:
        o |= dict(decoder_first_pipeline_num_layers=draw(st.integers(0, layers)),
                  decoder_last_pipeline_num_layers=draw(st.integers(0, layers)))
    elif split == "account":
        o |= dict(account_for_embedding_in_pipeline_split=draw(st.booleans()),
                  account_for_loss_in_pipeline_split=True)
    elif split == "per-stage" and pp > 1:
        o["layers_per_stage"] = draw(st.lists(st.integers(0, 4), min_size=pp, max_size=pp))
        o["layers"] = sum(o["layers_per_stage"])
    try:
        return build_spec("demo", overrides=o)
    except SpecError:
        assume(False)
        raise  # unreachable: assume(False) discards the draw


def _replica(doc: dict) -> dict[int, tuple[int, int, int]]:
    """Rank -> its (tp, cp, dp) coordinates from manifest.json: ranks that share them form one
    pipeline."""
    return {r["rank"]: (r["tp"], r["cp"], r["dp"]) for r in doc["ranks"]}


def problems(spec: Spec, directory: Path) -> list[str]:
    """What a set written from spec gets wrong; empty when it passes every property."""
    result = check_trace_set(directory, jobs=1)
    out = [f"check ({result.p2p}): {f.kind} rank {f.rank} node {f.node_id}: {f.message}" for f in result.findings]
    ts = load_set(directory)
    out += consistency_problems(ts)[:5]
    out += [f"rank {r} node {n} never finishes under rendezvous" for r, n in unfinished(ts, rendezvous=True)[:5]]
    stage = {r["rank"]: r["pp"] for r in ts.manifest["ranks"]}
    replica = _replica(ts.manifest)
    out += _pipeline_traffic(spec, ts, stage, replica)
    out += _layer_placement(spec, ts, stage, replica)
    out += _cp_ring(spec, ts)
    return out


def _pipeline_traffic(spec: Spec, ts, stage: dict[int, int], replica: dict[int, tuple]) -> list[str]:
    """Per rank and step, from first principles: each model chunk sends one activation forward
    and one gradient back per micro-batch, except at the model's two ends and, in a V, at its
    bottom (the last stage's two chunks meet locally); each to the same replica's neighbouring
    stage, of b*(s/cp)*h*e bytes (/t with sequence parallelism)."""
    p, m, v = spec.pp, spec.num_microbatches, spec.virtual_stages
    size = spec.micro_batch * spec.seq_len // spec.cp * spec.hidden * 2 // (spec.tp if spec.sequence_parallel else 1)
    at = {(replica[r], stage[r]): r for r in ts.nodes}
    out = []
    for r, nodes in ts.nodes.items():
        s = stage[r]
        if p == 1:
            per_direction = 0
        elif spec.schedule in V_SHAPED:
            per_direction = (s < p - 1) + (s > 0)
        else:
            per_direction = -1  # forward: v - [s last]; backward: v - [s first]
        want = Counter()
        for step in range(spec.steps):
            if per_direction >= 0:
                want[(step, "fwd")] = want[(step, "bwd")] = m * per_direction
            else:
                want[(step, "fwd")], want[(step, "bwd")] = m * (v - (s == p - 1)), m * (v - (s == 0))
        neighbours = {at[(replica[r], (s + d) % p)] for d in (1, -1)} if p > 1 else set()
        got = Counter()
        for n in nodes:
            if n.type == SEND and n.dim == "pp":
                got[(n.step, n.phase)] += 1
                if n.size != size or n.get("comm_dst") not in neighbours:
                    out.append(f"rank {r}: {n.name} sends {n.size} bytes to {n.get('comm_dst')}, expected {size} "
                               f"to one of {sorted(neighbours)}")
        if +want != got:
            out.append(f"rank {r} (stage {s}): pipeline sends per (step, phase) {dict(got)}, expected {dict(+want)}")
    return out


def _layers_of(nodes) -> set[int]:
    return {n.get("layer") for n in nodes if n.type == 4 and n.get("layer") is not None}


def _layer_placement(spec: Spec, ts, stage: dict[int, int], replica: dict[int, tuple]) -> list[str]:
    """Every layer on exactly one stage of each pipeline; --layers-per-stage counts honoured."""
    out = []
    for rep in set(replica.values()):
        held = {stage[r]: _layers_of(ts.nodes[r]) for r in ts.nodes if replica[r] == rep}
        everything = [layer for layers in held.values() for layer in layers]
        if sorted(everything) != list(range(spec.layers)):
            out.append(f"replica {rep}: layers placed {sorted(everything)}, expected each of 0..{spec.layers - 1} once")
        if spec.layers_per_stage and [len(held[s]) for s in range(spec.pp)] != list(spec.layers_per_stage):
            out.append(f"replica {rep}: layers per stage {[len(held[s]) for s in range(spec.pp)]}, "
                       f"expected {list(spec.layers_per_stage)}")
    return out


def _cp_ring(spec: Spec, ts) -> list[str]:
    """Ring attention: per layer and micro-batch, c-1 K,V sends forward (again when the forward
    is recomputed, selectively or in full) and c sends backward."""
    if spec.cp == 1 or spec.cp_comm_type != "p2p":
        return []
    per_layer = (spec.cp - 1) * (2 if spec.recompute != "none" else 1) + spec.cp
    out = []
    for r, nodes in ts.nodes.items():
        got = sum(1 for n in nodes if n.type == SEND and n.dim == "cp")
        want = spec.steps * spec.num_microbatches * len(_layers_of(nodes)) * per_layer
        if got != want:
            out.append(f"rank {r}: {got} context-parallel sends, expected {want}")
    return out
