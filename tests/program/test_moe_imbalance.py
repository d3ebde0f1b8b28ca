"""Routing imbalance: per-peer token counts written as Send/Recv pairs, checked from the counts
themselves (a hand-made trace file), conservation, determinism, the report's hottest link and
imbalance factor, and refusals of bad routing input."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from cli_runner import invoke, one_line_error
from moe_specs import EP, LAYERS, SEQ, SMALL, H, K, M
from oracle import COMP, RECV, SEND, TAG_LIMIT, load_set

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.config.routing import Routing
from traceforge.model.activations import routing_imbalance

TOKEN_BYTES = H * 2  # bf16


def hand_counts() -> np.ndarray:
    """[m, moe layers, ep, ep]: every row sums to T*k = 128 copies, some pairs carry none."""
    rng = np.random.default_rng(7)
    counts = np.zeros((M, LAYERS, EP, EP), dtype=np.int64)
    for idx in np.ndindex(M, LAYERS, EP):
        weights = rng.random(EP) * (rng.random(EP) > 0.3)
        weights[idx[2]] += 0.1
        row = np.floor(weights / weights.sum() * SEQ * K).astype(np.int64)
        row[idx[2]] += SEQ * K - row.sum()
        counts[idx] = row
    return counts


def ep_sends(nodes, kind: int):
    return [n for n in nodes if n.type == kind and n.dim == "ep"]


def test_per_peer_sizes_follow_the_routing_counts(make_set, tmp_path):
    counts = hand_counts()
    path = tmp_path / "routing.npy"
    np.save(path, counts)
    _, out, doc = make_set("demo", **SMALL, moe_routing=f"trace:{path}")
    ts = load_set(out)
    ep_of = {r["rank"]: r["ep"] for r in doc["ranks"]}
    _, bal_out, _ = make_set("demo", **SMALL)
    balanced_ops = {n.name: n.get("num_ops") for n in load_set(bal_out).nodes[0] if n.type == COMP}
    for rank, nodes in ts.nodes.items():
        me = ep_of[rank]
        for mb in range(M):
            for layer in range(LAYERS):
                c = counts[mb, layer]
                here = [n for n in nodes if n.mb == mb and n.get("layer") == layer and n.phase == "fwd"]
                sent = {ep_of[n.get("comm_dst")]: n.size for n in here if n.type == SEND and "dispatch" in n.name
                        and "probs" not in n.name}
                got = {ep_of[n.get("comm_src")]: n.size for n in here if n.type == RECV and "dispatch" in n.name
                       and "probs" not in n.name}
                assert sent == {p: int(c[me, p]) * TOKEN_BYTES for p in range(EP) if p != me and c[me, p]}
                assert got == {p: int(c[p, me]) * TOKEN_BYTES for p in range(EP) if p != me and c[p, me]}
                back = {ep_of[n.get("comm_dst")]: n.size for n in here if n.type == SEND and "combine" in n.name}
                assert back == {p: int(c[p, me]) * TOKEN_BYTES for p in range(EP) if p != me and c[p, me]}
                # the experts compute what they received: the balanced cost scaled by received / (T*k)
                (experts,) = [n for n in here if n.type == COMP and n.name.endswith("/experts")]
                balanced = balanced_ops[experts.name]
                assert experts.get("num_ops") == round(balanced * int(c[:, me].sum()) / (SEQ * K))


def test_zipf_routing_conserves_tokens_and_is_deterministic(make_set):
    spec, out, _ = make_set("demo", **SMALL, moe_routing="zipf:1.5", seed=11)
    ts = load_set(out)
    sent, received = Counter(), Counter()
    pairs = set()
    for nodes in ts.nodes.values():
        for n in ep_sends(nodes, SEND):
            sent[(n.mb, n.get("layer"), n.phase, n.name.split("/")[-1])] += n.size
            pair = (n.get("comm_src"), n.get("comm_dst"), n.get("comm_tag"))
            assert pair not in pairs and 0 < pair[2] < TAG_LIMIT  # tags unique per (src, dst)
            pairs.add(pair)
        for n in ep_sends(nodes, RECV):
            received[(n.mb, n.get("layer"), n.phase, n.name.split("/")[-1].replace("recv_", "send_"))] += n.size
    assert sent and sent == received  # every exchange: bytes sent = bytes received
    # a rank dispatches at most its T*k copies to the others (the rest stay local)
    per_rank = defaultdict(int)
    for rank, nodes in ts.nodes.items():
        for n in ep_sends(nodes, SEND):
            if n.name.endswith("send_dispatch") and n.phase == "fwd":
                per_rank[(rank, n.mb, n.get("layer"))] += n.size
    assert max(per_rank.values()) <= SEQ * K * TOKEN_BYTES
    # uneven: some rank pair carries more than the balanced share
    assert max(per_rank.values()) > SEQ * K * TOKEN_BYTES * (EP - 1) / EP
    _, again, _ = make_set("demo", **SMALL, moe_routing="zipf:1.5", seed=11)
    _, other, _ = make_set("demo", **SMALL, moe_routing="zipf:1.5", seed=12)
    files = sorted(p.name for p in out.glob("*.et"))
    assert all((out / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert any((out / f).read_bytes() != (other / f).read_bytes() for f in files)
    del spec


def test_report_hottest_link_and_imbalance(make_set):
    from traceforge.report.build import build_report

    _, bal, _ = make_set("demo", **SMALL)
    _, zipf, _ = make_set("demo", **SMALL, moe_routing="zipf:1.5", seed=3)
    b = build_report(bal, gpus_per_node=4, timeline=False).expert_groups
    z = build_report(zipf, gpus_per_node=4, timeline=False).expert_groups
    assert [g.ranks for g in b] == [g.ranks for g in z] == [(0, 1, 2, 3)]
    assert b[0].imbalance == pytest.approx(1.0)
    assert z[0].imbalance > 1.0
    assert z[0].hottest[2] > b[0].hottest[2]


@pytest.mark.parametrize("counts, match", [
    (np.zeros((M, LAYERS, EP, EP + 1), dtype=np.int64), r"has shape \[2, 2, 4, 5\]; this spec needs \[2, 2, 4, 4\]"),
    (np.full((M, LAYERS, EP, EP), -1), "negative token count"),
])
def test_bad_routing_files_are_refused(tmp_path, counts, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(counts.tolist()))
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides=dict(SMALL, moe_routing=f"trace:{path}"))


@pytest.mark.parametrize("routing, match", [
    ("zipf:-1", "positive exponent"),
    ("uniform", "not one of balanced"),
    ("trace:/nonexistent/x.npy", "does not exist"),
])
def test_bad_routing_values_are_refused(routing, match):
    with pytest.raises(SpecError, match=match):
        build_spec("demo", overrides=dict(SMALL, moe_routing=routing))


def test_cli_refuses_a_bad_routing_file_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.npy"
    np.save(path, np.full((M, LAYERS, EP, EP), -3))
    out = tmp_path / "out"
    args = ["generate", "-o", out, "--moe-routing", f"trace:{path}"]
    for key, value in SMALL.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--untied-embeddings")
        else:
            args += [flag, str(value)]
    one_line_error(invoke(*args), "negative token count")
    assert not out.exists()


@pytest.mark.parametrize("model", ["general", "astra-sim"])
def test_imbalanced_and_node_limited_sets_pass_both_replay_models(make_set, model):
    from test_moe_frontier import FRONTIER

    from traceforge.check.run import check_trace_set

    for overrides in (dict(SMALL, moe_routing="zipf:1.2", recompute="full"), FRONTIER):
        _, out, _ = make_set("demo", **overrides)
        assert check_trace_set(out, model=model).findings == []


def test_memory_sizes_the_experts_by_the_routing_the_trace_carries():
    """With TP (and SP) a rank routes its sequence shard, s/t tokens, k copies each: the memory
    model's busiest EP rank is the one of the routing drawn for that many copies (the trace's),
    not of a draw for the whole micro-batch."""
    spec = build_spec(overrides={**SMALL, "tp": 2, "sequence_parallel": True, "moe_routing": "zipf:1.2", "seed": 3})

    def busiest_over_mean(copies: int) -> float:
        routing = Routing("zipf:1.2", 3, 8, EP, copies, spec.steps, M, LAYERS)
        received = np.stack([routing.counts(0, 0, layer).sum(axis=0) for layer in range(LAYERS)])
        return float(received.max() / received.mean())

    shard = busiest_over_mean(SEQ // 2 * K)
    assert shard != busiest_over_mean(SEQ * K)  # the two draws differ, so the test can tell them apart
    assert routing_imbalance(spec) == shard
