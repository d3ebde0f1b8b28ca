"""Memory in the trace (docs/memory.md): the compute nodes that start and end each pass carry
its activation bytes, mem_alloc_bytes and mem_free_bytes. Replayed along each rank's node
order they climb to exactly the memory model's activation peak for the rank's stage and return
to zero by the end of every step; ASTRA-sim reads the same set as before (same step time with
the new attributes stripped), and no other field of any node moved."""

from __future__ import annotations

import pytest
from cli_runner import invoke
from mutate import read_nodes
from oracle import COMP, load_set

from traceforge.chakra import schema as S
from traceforge.memory import memory_report
from traceforge.memory.manifest import manifest_spec
from traceforge.program.stage import StagePlanner, _cached
from traceforge.report.build import build_report

MEMORY = (S.MEM_ALLOC_BYTES, S.MEM_FREE_BYTES)
SCHEDULES = [
    ["--pp", "4", "--num-microbatches", "6"],  # 1F1B: stage i holds p - i micro-batches
    ["--pp", "4", "--num-microbatches", "6", "--schedule", "gpipe"],
    ["--schedule", "interleaved", "--virtual-stages", "2", "--pp", "4", "--layers", "8", "--dp", "1"],
    ["--schedule", "zbv"],
    ["--schedule", "zb-h1"],
    ["--schedule", "interleaved-zb", "--virtual-stages", "2", "--pp", "4", "--layers", "8", "--dp", "1"],
    ["--schedule", "dualpipev", "--num-microbatches", "8"],
    # 6 layers + embedding + loss over 4 x 2 chunks: the first holds only the embedding, the last only the loss
    ["--schedule", "interleaved", "--virtual-stages", "2", "--pp", "4", "--layers", "6", "--dp", "1",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
    ["--schedule", "interleaved-zb", "--virtual-stages", "2", "--pp", "4", "--layers", "6", "--dp", "1",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
    # 2 layers + embedding + loss on 4 stages: the first stage holds only the embedding, the last only the loss
    ["--pp", "4", "--layers", "2", "--dp", "1", "--num-microbatches", "4",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
    # in a V, stage 0 holds both: the embedding's chunk and the loss's, no layer
    ["--schedule", "zbv", "--pp", "4", "--layers", "6", "--dp", "1", "--num-microbatches", "8",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
    ["--schedule", "dualpipev", "--pp", "4", "--layers", "6", "--dp", "1", "--num-microbatches", "8",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
    ["--recompute", "selective", "--attention", "unfused", "--sequence-parallel"],
    ["--recompute", "full", "--steps", "2"],
]


def _replay(nodes) -> tuple[int, list[int]]:
    """(running maximum, level at each step's end) of a rank's allocations in node order: a
    compute node allocates as it starts and frees as it ends."""
    level = top = 0
    ends: dict[int, int] = {}
    for n in nodes:
        if n.type != COMP:
            assert not any(k in n.attrs for k in MEMORY), n.name  # only compute carries memory
            continue
        level += n.get(S.MEM_ALLOC_BYTES, 0)
        top = max(top, level)
        level -= n.get(S.MEM_FREE_BYTES, 0)
        assert level >= 0, f"{n.name} frees what was never allocated"
        ends[n.step] = level
    return top, [ends[s] for s in sorted(ends)]


@pytest.mark.parametrize("flags", SCHEDULES, ids=lambda f: " ".join(f))
def test_replayed_allocation_peaks_at_the_memory_model(tmp_path, flags):
    out = tmp_path / "set"
    assert invoke("generate", "-q", "-o", out, *flags).exit_code == 0
    decoded = load_set(out)
    spec = manifest_spec(decoded.manifest)
    memory = memory_report(spec)
    for rank, nodes in decoded.nodes.items():
        top, ends = _replay(nodes)
        stage = decoded.stage(rank)
        assert top == memory.stages[stage].activations, (rank, stage)
        assert ends == [0] * spec.steps, rank  # every allocation freed by each step's end
        # one allocation per forward, one free per backward (or W): per chunk and micro-batch
        allocs = sum(1 for n in nodes if n.get(S.MEM_ALLOC_BYTES))
        assert allocs >= spec.num_microbatches * spec.virtual_stages * spec.steps


def _strip(nodes) -> int:
    """Remove the memory attributes in place; how many there were."""
    removed = 0
    for n in nodes:
        keep = [a for a in n.attr if a.name not in MEMORY]
        removed += len(n.attr) - len(keep)
        del n.attr[:]
        n.attr.extend(keep)
    return removed


def test_astra_sim_reads_the_same_and_other_fields_are_unchanged(tmp_path, monkeypatch):
    new, bare = tmp_path / "new", tmp_path / "bare"
    flags = ["-j", "1", "--pp", "2", "--tp", "2", "--dp", "2", "--num-microbatches", "4", "--schedule", "zbv"]
    assert invoke("generate", "-q", "-o", new, *flags).exit_code == 0
    assert invoke("check", new).exit_code == 0
    # The set as it was before memory reached the trace: the planner without its marks.
    monkeypatch.setattr(StagePlanner, "_carry_activations", lambda *args: None)
    _cached.cache_clear()
    try:
        assert invoke("generate", "-q", "-o", bare, *flags).exit_code == 0
    finally:
        _cached.cache_clear()
    ranks = load_set(new).nodes
    carried = 0
    for rank in ranks:
        nodes = read_nodes(new, rank)
        carried += _strip(nodes)
        assert list(nodes) == list(read_nodes(bare, rank)), rank  # every other field as before
    assert carried >= 2 * len(ranks)
    # ASTRA-sim's view of both sets: the same step time, rank by rank.
    a = build_report(new, gpus_per_node=2, jobs=1, estimate="astra-sim").estimate
    b = build_report(bare, gpus_per_node=2, jobs=1, estimate="astra-sim").estimate
    assert a.critical.total == b.critical.total
    assert a == b
