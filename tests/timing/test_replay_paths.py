"""The planner's fast paths for building and replaying a candidate equal their plain definitions.

program/ops.py labels ops from a cached prefix and sorts deps with a fast path; the replay indexes
each program once (a numpy transpose of the deps) and runs compute nodes inline in its event
loop. Each is checked here against the definition it replaces, written the plain way, or
against what the replay's timing model says from first principles (benchmarks/bench_replay.py
has the speed figures).
"""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest

from traceforge.config import build_spec
from traceforge.ir.enums import COLL, COMP, RECV, SEND, NodeType
from traceforge.ir.program import RankProgram
from traceforge.ir.programset import ProgramSet
from traceforge.machine.cluster import Cluster
from traceforge.parallel.layout import Layout
from traceforge.program.ops import Context, ProgramBuilder, _sorted_unique
from traceforge.program.programset import program_set
from traceforge.program.stage import build_program
from traceforge.search.estimate import estimate
from traceforge.timing.engine import ASTRA_SIM, HARDWARE, _ProgramIndex, gc_paused
from traceforge.timing.replay import replay
from traceforge.timing.timeline import step_estimate

SPECS = [
    ("demo", {}),
    ("demo", {"schedule": "interleaved", "virtual_stages": 2, "pp": 4, "dp": 1, "layers": 8, "order": "megatron"}),
    ("demo", {"schedule": "zbv", "virtual_stages": 2, "dp": 1, "cp": 2, "dp_mode": "zero3", "recompute": "full",
              "order": "megatron"}),
    ("demo", {"schedule": "dualpipev", "virtual_stages": 2, "pp": 2, "tp": 1, "dp": 4, "sequence_parallel": False,
              "dp_mode": "dist-opt", "overlap_grad_reduce": True, "overlap_param_gather": True, "steps": 2,
              "global_batch": 16}),
    ("mixtral-8x7b", {"global_batch": 16, "layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8, "kv_heads": 8,
                      "seq_len": 256, "vocab": 1024, "tp": 2, "pp": 2, "dp": 4, "ep": 4, "sequence_parallel": True,
                      "schedule": "zb-h1", "order": "megatron"}),
]


def _spec(i: int):
    preset, flags = SPECS[i]
    return build_spec(preset, None, flags)


def test_sorted_unique_is_sorted_set_for_every_small_tuple() -> None:
    for n in range(5):
        for deps in itertools.product(range(4), repeat=n):
            assert _sorted_unique(deps) == tuple(sorted(set(deps))), deps


def test_op_labels_follow_the_plain_formula() -> None:
    """An op's label: "s{step}/" after the first step, then the non-empty parts among phase,
    mb{microbatch}, L{layer} and the name, joined by "/" (what generate writes as node names)."""
    b = ProgramBuilder(0, {})
    expected = []
    for step, phase, mb, layer, name in itertools.product((0, 2), ("fwd", ""), (None, 0, 3), (None, 0, 5),
                                                          ("gemm", "")):
        b.ctx = Context(phase, step, mb, layer)
        b.send(name, "next", 1, 0)  # named "send_<name>"
        parts = (phase, "" if mb is None else f"mb{mb}", "" if layer is None else f"L{layer}", f"send_{name}")
        label = "/".join(p for p in parts if p)
        expected.append(f"s{step}/{label}" if step else label)
    assert [op.name for op in b.program.ops] == expected


def test_ops_compare_and_hash_by_value() -> None:
    """Ops were frozen dataclasses: equal fields mean equal and same hash (e.g. as dict keys)."""
    a, b = ProgramBuilder(0, {}), ProgramBuilder(0, {})
    for builder in (a, b):
        builder.send("x", "next", 8, 3)
    assert a.program.ops[0] == b.program.ops[0]
    assert hash(a.program.ops[0]) == hash(b.program.ops[0])
    assert len({a.program.ops[0], b.program.ops[0]}) == 1


def _plain_index(p: RankProgram) -> tuple[list[list[int]], list[int], dict, dict, list[int]]:
    """The replay's lookups built node by node, as the replay first did."""
    n = len(p)
    ptr, idx = p.dep_ptr.tolist(), p.dep_idx.tolist()
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for d in idx[ptr[i]:ptr[i + 1]]:
            children[d].append(i)
    coll: dict[int, list[int]] = {}
    p2p: dict[tuple, list[int]] = {}
    position = [0] * n
    for i, t in enumerate(p.types.tolist()):
        if t == COLL:
            lst = coll.setdefault(int(p.roles[i]), [])
        elif t in (SEND, RECV):
            lst = p2p.setdefault((t, int(p.roles[i]), int(p.tags[i]), int(p.sizes[i])), [])
        else:
            continue
        position[i] = len(lst)
        lst.append(i)
    return children, [ptr[i + 1] - ptr[i] for i in range(n)], coll, p2p, position


def _check_index(p: RankProgram) -> None:
    index = _ProgramIndex(p)
    children, indeg, coll, p2p, position = _plain_index(p)
    assert index.children == children
    assert index.indeg == indeg
    assert dict(index.coll_lists) == coll
    assert dict(index.p2p_lists) == p2p
    assert index.position == position


@pytest.mark.parametrize("case", range(len(SPECS)))
def test_program_index_equals_the_node_by_node_one(case: int) -> None:
    for program in program_set(_spec(case)).programs.values():
        _check_index(program)


def test_program_index_keeps_repeated_deps_and_edges() -> None:
    """A file may list a dependency twice (the node is then its child twice) or have no node."""
    def program(types: list[int], deps: list[list[int]]) -> RankProgram:
        n = len(types)
        ptr = np.zeros(n + 1, np.int64)
        ptr[1:] = np.cumsum([len(d) for d in deps])
        z = np.zeros(n, np.int64)
        return RankProgram(np.array(types, np.int8), z, np.full(n, -1, np.int16), z, np.zeros(n, np.int32), z,
                           np.zeros(n, np.int32), ptr, np.array([d for ds in deps for d in ds], np.int64), [], [])

    _check_index(program([], []))
    _check_index(program([COMP, SEND, COMP, RECV, COMP], [[], [0], [1, 0, 0], [], [3, 2, 2]]))
    index = _ProgramIndex(program([COMP, COMP, COMP], [[], [0, 0], [1, 0]]))
    assert index.children == [[1, 1, 2], [2], []]


def _check_compute(result) -> None:
    """A compute node runs for its duration, after every dependency finished, one at a time
    per rank, and the rank's compute never idles while one is ready (each starts when its last
    dependency finished or when the previous compute ended, whichever is later); of the nodes
    ready when the compute frees, the lowest id runs first (as ASTRA-sim issues)."""
    assert not result.stalled
    for c, p in enumerate(result.programs):
        start, finish = result.start[c], result.finish[c]
        types, durations = p.types.tolist(), p.durations.tolist()
        ptr, idx = p.dep_ptr.tolist(), p.dep_idx.tolist()
        ready = [max((finish[d] for d in idx[ptr[i]:ptr[i + 1]]), default=0.0) for i in range(len(types))]
        compute = sorted((start[i], i) for i, t in enumerate(types) if t == COMP)
        free = 0.0
        for s, i in compute:
            assert finish[i] == s + durations[i]
            assert s == max(ready[i], free), (c, i)
            free = finish[i]
        for (sa, a), (_, b) in itertools.combinations(compute, 2):  # a ran before b
            assert not (b < a and ready[b] <= sa), (c, a, b)


@pytest.mark.parametrize("mode", [HARDWARE, ASTRA_SIM])
@pytest.mark.parametrize("case", range(len(SPECS)))
def test_compute_runs_as_the_timing_model_says(case: int, mode: str) -> None:
    """The event loop's inlined compute path on the planner's programs (their compute is one
    chain: never two compute nodes ready at once)."""
    _check_compute(replay(program_set(_spec(case)), Cluster(), mode=mode))


@pytest.mark.parametrize("mode", [HARDWARE, ASTRA_SIM])
@pytest.mark.parametrize("seed", range(6))
def test_compute_queue_on_random_dags(seed: int, mode: str) -> None:
    """Trace files from elsewhere may let several compute nodes be ready at once: random DAGs
    of compute nodes on one rank (durations 1 to 9 us, up to 3 dependencies on earlier nodes)."""
    rng = np.random.default_rng(seed)
    n = 80
    deps = [sorted(set(rng.integers(0, i, size=rng.integers(0, 4)).tolist())) if i else [] for i in range(n)]
    ptr = np.zeros(n + 1, np.int64)
    ptr[1:] = np.cumsum([len(d) for d in deps])
    z = np.zeros(n, np.int64)
    program = RankProgram(np.full(n, COMP, np.int8), rng.integers(1, 10, size=n).astype(np.int64),
                          np.full(n, -1, np.int16), z, np.full(n, -1, np.int32), z, np.zeros(n, np.int32), ptr,
                          np.array([d for ds in deps for d in ds], np.int64), [""] * n, [""] * n)
    shape = program.digest()
    ps = ProgramSet(1, {shape: program}, [shape], [()], [()], {}, {}, 1, False)
    _check_compute(replay(ps, Cluster(), mode=mode))


@pytest.mark.parametrize("case", range(len(SPECS)))
def test_in_memory_programs_read_every_op_as_written(case: int) -> None:
    """The in-memory set's programs (read column-wise, shared across rank patterns) hold each
    stage op's fields as the scanner would read them from the written file: node by node."""
    spec = _spec(case)
    ps = program_set(spec)
    by_stage: dict[bytes, int] = {}
    for rank, shape in enumerate(ps.shapes):
        by_stage.setdefault(shape, rank)
    stage_of = Layout.from_spec(spec).coords["pp"].tolist()
    for shape, rank in by_stage.items():
        p, ops = ps.programs[shape], build_program(spec, stage_of[rank]).ops
        assert p.types.tolist() == [int(op.type) for op in ops]
        assert p.durations.tolist() == [op.duration_micros for op in ops]
        assert p.ctypes.tolist() == [-1 if op.comm_type is None else int(op.comm_type) for op in ops]
        assert p.sizes.tolist() == [op.comm_size for op in ops]
        assert p.tags.tolist() == [op.tag for op in ops]
        assert p.steps.tolist() == [op.step for op in ops]
        assert p.names == [op.name for op in ops] and p.dims == [op.dim for op in ops]
        ptr, idx = p.dep_ptr.tolist(), p.dep_idx.tolist()
        assert [tuple(idx[ptr[i]:ptr[i + 1]]) for i in range(len(ops))] == [op.deps for op in ops]
        # roles: a collective's group role numbered by first use, a transfer's peer by its rank's first use
        groups = list(dict.fromkeys(op.group for op in ops if op.type == NodeType.COLL))
        peers = ps.peer_roles[rank]
        for op, role in zip(ops, p.roles.tolist(), strict=True):
            if op.type == NodeType.COLL:
                assert role == groups.index(op.group)
            elif op.peer is not None:
                assert 0 <= role < len(peers)
            else:
                assert role == -1


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError
    assert gc.isenabled()


@pytest.mark.parametrize("case", range(len(SPECS)))
def test_planner_estimate_is_the_reports_critical_split(case: int) -> None:
    """The planner splits only the critical class; the report's step_estimate splits every
    class and picks the critical one: the same numbers."""
    spec, link = _spec(case), Cluster()
    est = estimate(spec, link)
    step = step_estimate(replay(program_set(spec), link, mode=HARDWARE), spec.steps)
    assert (est.step_us, est.compute_us, est.idle_us) == (step.critical.total, step.critical.compute, step.critical.idle)
    assert (est.classes, est.stalled) == (step.classes, step.stalled)
