"""Pipeline sends and receives as Megatron and torch post them, and check's rendezvous replay.

NCCL and gloo complete a send only once the peer has posted its receive. Megatron posts a
step's sends and the next step's receives as one batch and waits for all of them
(p2p_communication._communicate); torch.distributed.pipelining never waits on a send before
the step ends. Every schedule must therefore finish when a Send and its Recv complete only
together, and check's default replay must find a set that would hang on real hardware.
"""

from __future__ import annotations

import dataclasses
from itertools import combinations

import pytest
from cli_runner import invoke
from mutate import recv, send, write_set
from oracle import ancestors, depends_on, load_set, unfinished

from traceforge.check.run import check_trace_set
from traceforge.config import build_spec
from traceforge.config import schedules as rules
from traceforge.config.schedules import MEGATRON_SCHEDULES
from traceforge.program import stage as planner

COMP, SEND, RECV = 4, 5, 6
P, M = 4, 8
TINY = dict(tp=1, pp=P, dp=2, layers=8, num_microbatches=M)
SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1), ("interleaved-zb", 2), ("zbv", 2),
             ("dualpipev", 2)]
V_SHAPED = ("zbv", "dualpipev")


def pipeline_p2p(ts) -> tuple[list, list]:
    sends = [(r, n) for r, nodes in ts.nodes.items() for n in nodes if n.type == SEND and n.dim == "pp"]
    recvs = [(r, n) for r, nodes in ts.nodes.items() for n in nodes if n.type == RECV and n.dim == "pp"]
    return sends, recvs


def batches(nodes) -> dict[int, list]:
    """The pipeline Sends and Recvs between two computes of the passes, keyed by the compute
    after them (the step's end, which waits for everything, is not a pass)."""
    comps = sorted(n.id for n in nodes if n.type == COMP and n.phase != "step")
    out: dict[int, list] = {}
    for n in nodes:
        if n.type in (SEND, RECV) and n.dim == "pp":
            after = next((c for c in comps if c > n.id), None)
            if after is not None:
                out.setdefault(after, []).append(n)
    return out


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap-p2p"])
@pytest.mark.parametrize("schedule, v", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_every_schedule_finishes_with_rendezvous_sends(make_set, schedule, v, overlap):
    spec, out, _ = make_set("demo", **TINY, schedule=schedule, virtual_stages=v, overlap_p2p_comm=overlap)
    result = check_trace_set(out, jobs=1)
    assert result.p2p == "rendezvous"
    assert result.findings == [], [(f.kind, f.rank, f.message) for f in result.findings][:3]
    ts = load_set(out)
    assert unfinished(ts, rendezvous=True) == []
    # From first principles: p*v virtual stages in a row have p*v - 1 boundaries, each crossing
    # to another rank, except the bottom of a V (2p virtual stages, the last stage's two chunks
    # meet locally). Each boundary carries one activation and one gradient per micro-batch, in
    # each of the world/p pipelines.
    boundaries = 2 * P - 2 if schedule in V_SHAPED else P * v - 1
    sends, recvs = pipeline_p2p(ts)
    assert len(sends) == len(recvs) == 2 * M * boundaries * (spec.world_size // P)
    for r in ts.nodes:
        # Per micro-batch each chunk sends its activation on and its gradient back, except
        # toward the model's ends (virtual stages 0 and p*v-1) and, in a V, the local bottom:
        # stage 0 holds both ends and stage p-1 the bottom, so each sends 2, the others 4.
        s = ts.stage(r)
        expected = (2 if s in (0, P - 1) else 4) if schedule in V_SHAPED else 2 * v - (s == 0) - (s == P - 1)
        assert sum(1 for q, _ in sends if q == r) == M * expected, (schedule, r)


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap-p2p"])
@pytest.mark.parametrize("schedule, v", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_a_steps_sends_and_receives_post_as_one_batch(make_set, schedule, v, overlap):
    """Between two computes no pipeline Send or Recv waits for another; the compute after them
    waits for every Recv, and, under Megatron's schedules without --overlap-p2p-comm, for every
    Send too (its batch_isend_irecv requests all waited); otherwise for none of the Sends."""
    _, out, _ = make_set("demo", **TINY, schedule=schedule, virtual_stages=v, overlap_p2p_comm=overlap)
    ts = load_set(out)
    blocking = schedule in MEGATRON_SCHEDULES and not overlap
    for rank in sorted({min(r for r in ts.nodes if ts.stage(r) == s) for s in range(P)}):
        nodes = ts.nodes[rank]
        anc = ancestors(nodes)
        found = batches(nodes)
        assert found
        if schedule == "gpipe":  # ScheduleGPipe waits for its forward sends before any backward
            first_backward = min(n.id for n in nodes if n.type == COMP and n.phase == "bwd")
            forward_sends = [n.id for n in nodes if n.type == SEND and n.dim == "pp" and n.phase == "fwd"]
            assert all(depends_on(anc, first_backward, s) for s in forward_sends), rank
            found.pop(first_backward, None)
        for after, ops in found.items():
            for a, b in combinations(ops, 2):
                assert not depends_on(anc, b.id, a.id) and not depends_on(anc, a.id, b.id), (rank, a.name, b.name)
            for op in ops:
                waited = depends_on(anc, after, op.id)
                assert waited == (op.type == RECV or blocking), (schedule, rank, op.name)
            if schedule in MEGATRON_SCHEDULES and overlap:
                # Unbatched, Megatron posts in parity order (_p2p_ops): even stages send first,
                # odd ones receive first, so two neighbours' ops on one communicator pair up.
                sends = [n.id for n in ops if n.type == SEND]
                recvs = [n.id for n in ops if n.type == RECV]
                if sends and recvs:
                    first, then = (recvs, sends) if ts.stage(rank) % 2 else (sends, recvs)
                    assert max(first) < min(then), (schedule, rank, [n.name for n in ops])
        if schedule == "interleaved" and blocking:
            # Megatron's send_forward_backward_recv_forward_backward: some batch receives both
            # the next forward's activation and the next backward's gradient.
            assert any({n.name.split("/")[-1] for n in ops if n.type == RECV} == {"recv_act", "recv_grad"}
                       for ops in found.values()), rank


@pytest.mark.parametrize("overrides", [
    dict(cp=2, dp=1, order="megatron", schedule="interleaved", virtual_stages=2),
    dict(experts=4, top_k=2, ep=2, order="megatron", schedule="interleaved", virtual_stages=2),
    dict(experts=4, top_k=2, ep=2, dp=2, order="megatron", moe_routing="zipf:1.2", schedule="zbv"),
    dict(dp_mode="zero3", schedule="dualpipev"),
], ids=["cp", "ep-moe", "ep-imbalanced", "zero3"])
def test_cp_ep_and_zero3_sets_finish_with_rendezvous_sends(make_set, overrides):
    _, out, _ = make_set("demo", **{**TINY, **overrides})
    result = check_trace_set(out, jobs=1)
    assert result.findings == [], [(f.kind, f.rank, f.message) for f in result.findings][:3]


def head_to_head(tmp_path):
    """Two ranks each send to the other, then receive: each Recv depends on its rank's Send."""
    return write_set(tmp_path / "head-to-head", {
        0: [send(0, 0, 1, tag=1), recv(1, 1, 0, tag=2, deps=[0])],
        1: [send(0, 1, 0, tag=2), recv(1, 0, 1, tag=1, deps=[0])],
    })


def test_check_catches_a_receive_posted_after_a_send_on_both_ends(tmp_path):
    out = head_to_head(tmp_path)
    result = check_trace_set(out, jobs=1)
    assert result.exit_code == 1
    stuck = {f.rank: f for f in result.findings if f.kind == "deadlock" and "stuck at" in f.message}
    assert set(stuck) == {0, 1} and all(f.node_id == 0 and f.message.startswith("stuck at Send")
                                        for f in stuck.values())
    assert "rank 1 has the matching Recv but never issues it" in stuck[0].message
    cycle = next(f for f in result.findings if "wait-for cycle" in f.message)
    assert "rank 0 (node 0) -> rank 1 (node 0) -> rank 0 (node 0)" in cycle.message
    # An eager network (ASTRA-sim's) buffers the sends: the same set runs to its end there.
    assert check_trace_set(out, jobs=1, p2p="eager").findings == []
    assert check_trace_set(out, jobs=1, model="astra-sim").findings == []


def test_check_cli_p2p_option(tmp_path):
    out = head_to_head(tmp_path)
    found = invoke("check", out, "-j", "1")
    assert found.exit_code == 1 and "wait-for cycle" in found.output and "rendezvous p2p" in found.output
    assert invoke("check", out, "-j", "1", "--p2p", "eager").exit_code == 0
    for bad in (("--p2p", "lazy"), ("--model", "astra-sim", "--p2p", "rendezvous")):
        wrong = invoke("check", out, "-j", "1", *bad)
        assert wrong.exit_code == 2 and "--p2p" in wrong.output and "Traceback" not in wrong.output


def test_blocking_sends_outside_a_batch_deadlock_the_v_schedules(tmp_path, monkeypatch):
    """The order this project wrote before: ZB-V's sends blocking the next compute, as if
    Megatron posted them, though torch's runtime never waits on a send before the step's end.
    Under rendezvous two neighbouring stages each wait on a send the other has not yet posted
    a receive for; an eager replay finds nothing."""
    from traceforge.write.writer import write_trace_set

    spec = build_spec("demo", overrides=dict(TINY, schedule="zbv"))
    monkeypatch.setitem(rules.SCHEDULES, "zbv", dataclasses.replace(rules.SCHEDULES["zbv"], framework="megatron"))
    planner._cached.cache_clear()
    try:
        write_trace_set(spec, tmp_path, jobs=1)
    finally:
        planner._cached.cache_clear()
    result = check_trace_set(tmp_path, jobs=1)
    cycle = [f for f in result.findings if "wait-for cycle" in f.message]
    assert cycle and result.exit_code == 1
    stuck = [f for f in result.findings if f.kind == "deadlock" and f.rank is not None and f.node_id is not None]
    assert any(f.message.startswith("stuck at Send") for f in stuck)
    assert unfinished(load_set(tmp_path), rendezvous=True)
    assert check_trace_set(tmp_path, jobs=1, p2p="eager").findings == []
