"""ASTRA-sim's ns-3 and htsim bundles: the files parse the way those backends read them, describe the
cluster asked for, and are routable; refusals are one line and write nothing.

The format rules below are restated from the backends' parsers (astra-network-ns3
scratch/common.h, csg-htsim sim/datacenter/fat_tree_topology.cpp), not taken from traceforge.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections import deque
from pathlib import Path

import pytest
import yaml
from fake_astra import write_fake_astra
from typer.testing import CliRunner

from traceforge.cli import app, load_commands
from traceforge.machine import astra as astra_files
from traceforge.machine.cluster import Cluster
from traceforge.write import astra, astra_htsim, astra_ns3
from traceforge.write.astra import AstraOptions, write_astra_bundle

# ns-3 config keys ReadConf knows (common.h); anything else is skipped token by token.
NS3_KEYS = {
    "ENABLE_QCN", "USE_DYNAMIC_PFC_THRESHOLD", "CLAMP_TARGET_RATE", "PAUSE_TIME", "DATA_RATE", "LINK_DELAY",
    "PACKET_PAYLOAD_SIZE", "L2_CHUNK_SIZE", "L2_ACK_INTERVAL", "L2_BACK_TO_ZERO", "TOPOLOGY_FILE", "FLOW_FILE",
    "TRACE_FILE", "TRACE_OUTPUT_FILE", "SIMULATOR_STOP_TIME", "ALPHA_RESUME_INTERVAL", "RP_TIMER", "EWMA_GAIN",
    "FAST_RECOVERY_TIMES", "RATE_AI", "RATE_HAI", "ERROR_RATE_PER_LINK", "CC_MODE", "RATE_DECREASE_INTERVAL",
    "MIN_RATE", "FCT_OUTPUT_FILE", "HAS_WIN", "GLOBAL_T", "MI_THRESH", "VAR_WIN", "FAST_REACT", "U_TARGET",
    "INT_MULTI", "RATE_BOUND", "ACK_HIGH_PRIO", "DCTCP_RATE_AI", "NIC_TOTAL_PAUSE_TIME", "PFC_OUTPUT_FILE",
    "LINK_DOWN", "ENABLE_TRACE", "KMAX_MAP", "KMIN_MAP", "PMAX_MAP", "BUFFER_SIZE", "QLEN_MON_FILE",
    "QLEN_MON_START", "QLEN_MON_END", "MULTI_RATE", "SAMPLE_FEEDBACK", "PINT_LOG_BASE", "PINT_PROB",
}
MAPS = ("KMAX_MAP", "KMIN_MAP", "PMAX_MAP")


def read_ns3_config(path: Path) -> dict[str, list[str]]:
    tokens = path.read_text().split()
    conf: dict[str, list[str]] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        assert key in NS3_KEYS, f"{key!r} would be skipped by ns-3 (a comment or a typo)"
        if key in MAPS:
            n = int(tokens[i + 1])
            conf[key] = tokens[i + 1:i + 2 + 2 * n]
            i += 2 + 2 * n
        elif key == "LINK_DOWN":
            conf[key] = tokens[i + 1:i + 4]
            i += 4
        else:
            conf[key] = [tokens[i + 1]]
            i += 2
    return conf


def ns3_rate(text: str) -> int:
    match = re.fullmatch(r"(\d+)bps", text)
    assert match, text
    return int(match[1])


def ns3_ns(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)ns", text)
    assert match, text
    return float(match[1])


def read_ns3_topology(path: Path):
    tokens = path.read_text().split()
    nodes, switches, links = (int(t) for t in tokens[:3])
    switch_ids = [int(t) for t in tokens[3:3 + switches]]
    rows = tokens[3 + switches:]
    assert len(rows) == 5 * links
    edges = [(int(rows[i]), int(rows[i + 1]), ns3_rate(rows[i + 2]), ns3_ns(rows[i + 3]), float(rows[i + 4]))
             for i in range(0, len(rows), 5)]
    return nodes, set(switch_ids), edges


def routes(nodes: int, switches: set[int], edges) -> dict[int, dict[int, int]]:
    """Hop counts from every host, expanding through switches only (ns-3's CalculateRoute)."""
    adj: dict[int, list[int]] = {n: [] for n in range(nodes)}
    for a, b, *_ in edges:
        adj[a].append(b)
        adj[b].append(a)
    out = {}
    for host in range(nodes):
        if host in switches:
            continue
        dist = {host: 0}
        queue = deque([host])
        while queue:
            now = queue.popleft()
            for nxt in adj[now]:
                if nxt not in dist:
                    dist[nxt] = dist[now] + 1
                    if nxt in switches:
                        queue.append(nxt)
        out[host] = dist
    return out


def ns3_bundle(make_set, cluster: Cluster, options: AstraOptions, **overrides):
    spec, out, doc = make_set(**overrides)
    files = write_astra_bundle(out, doc, cluster, options)
    return spec, out, doc, files


@pytest.mark.parametrize("fabric", ["fat-tree", "rail-optimized"])
def test_ns3_bundle_is_what_the_ns3_backend_reads(make_set, fabric):
    gpn = 4
    cluster = Cluster(gpus_per_node=gpn, scale_up_bw=300.0, scale_out_bw=25.0, scale_up_latency=700.0,
                      scale_out_latency=2500.0)
    options = AstraOptions(astra_sim_backend="ns3", scale_out_fabric=fabric)
    spec, out, doc, files = ns3_bundle(make_set, cluster, options, dp=4)
    world = doc["world_size"]
    assert world == 16
    assert sorted(p.name for p in files) == sorted(astra.bundle_files(options))
    logical = json.loads((out / astra_ns3.LOGICAL_FILE).read_text())
    assert all(isinstance(d, str) for d in logical["logical-dims"])
    dims = [int(d) for d in logical["logical-dims"]]
    assert dims == [gpn, world // gpn] and math.prod(dims) == world
    system = json.loads((out / astra_files.SYSTEM_FILE).read_text())
    assert len(system["all-reduce-implementation"]) == len(dims)
    conf = read_ns3_config(out / astra_ns3.CONFIG_FILE)
    for key in ("TOPOLOGY_FILE", "FLOW_FILE", "TRACE_FILE"):
        assert (out / conf[key][0]).is_file(), key
    assert int((out / conf["FLOW_FILE"][0]).read_text().split()[0]) == 0
    assert conf["ENABLE_TRACE"] == ["0"]
    for key in ("TRACE_OUTPUT_FILE", "FCT_OUTPUT_FILE", "PFC_OUTPUT_FILE", "QLEN_MON_FILE"):
        assert not Path(conf[key][0]).is_absolute() and Path(conf[key][0]).parent.name == astra_ns3.OUTPUT_DIR
    nodes, switches, edges = read_ns3_topology(out / conf["TOPOLOGY_FILE"][0])
    hosts = set(range(world))
    assert not hosts & switches and switches == set(range(world, nodes))
    # every link rate has an ECN entry in each map (ns-3 asserts it)
    rates = {e[2] for e in edges}
    for key in MAPS:
        values = conf[key]
        assert int(values[0]) == len(values[1:]) // 2
        assert rates <= {int(r) for r in values[1::2]}, key
    up_bps, out_bps = round(300e9 * 8), round(25e9 * 8)
    dist = routes(nodes, switches, edges)
    for a in hosts:
        links = [e for e in edges if a in e[:2]]
        up = [e for e in links if e[2] == up_bps]
        assert len(up) == 1 and up[0][3] == 700.0  # one port on its node's scale-up switch
        for b in hosts - {a}:
            assert b in dist[a], f"host {a} cannot reach {b}"
            if a // gpn == b // gpn:
                assert dist[a][b] == 2  # inside a node: through the scale-up switch
            else:
                assert dist[a][b] >= 2
    # Same-node pairs have a single shortest route (no ECMP share over the scale-out network): the
    # only switch both hosts touch is their scale-up switch.
    for a in hosts:
        for b in hosts:
            if a < b and a // gpn == b // gpn:
                common = {s for s in switches if any(a in e[:2] and s in e[:2] for e in edges)
                          and any(b in e[:2] and s in e[:2] for e in edges)}
                assert len(common) == 1
    if fabric == "rail-optimized":
        for a in hosts:  # each GPU's NIC goes to a leaf holding only GPUs of its position
            nic = [e for e in edges if a in e[:2] and e[2] == out_bps]
            assert len(nic) == 1
            leaf = (set(nic[0][:2]) - {a}).pop()
            on_leaf = {x for e in edges if leaf in e[:2] for x in e[:2]} & hosts
            assert {x % gpn for x in on_leaf} == {a % gpn}
    else:  # node uplinks carry the node's whole NIC bandwidth
        uplinks = [e for e in edges if e[2] == out_bps * gpn]
        assert len(uplinks) == world // gpn and all(e[3] == 2500.0 for e in uplinks)


@pytest.mark.parametrize("fabric", ["fat-tree", "rail-optimized"])
def test_large_fabrics_are_non_blocking_two_tier_clos(fabric):
    world, gpn = 8 * 80, 8
    cluster = Cluster(gpus_per_node=gpn)
    fabric_ = astra_ns3.build_fabric(world, gpn, "Switch", cluster, fabric)
    switches = set(fabric_.switches)
    edges = [(link.a, link.b, link.bits_per_second, link.latency_ns, 0) for link in fabric_.links]
    nodes = world + len(switches)
    dist = routes(nodes, switches, edges)
    assert all(len([n for n in dist[h] if n < world]) == world for h in (0, 9, world - 1))
    # spines: the switches farthest from any host; leaves: those linked to them. A leaf's uplinks
    # carry all its downlinks can (non-blocking), with at most one link to spare.
    degree = {s: [e for e in edges if s in e[:2]] for s in switches}
    tier = {s: min(dist[h][s] for h in range(world) if s in dist[h]) for s in switches}
    spines = {s for s in switches if tier[s] == max(tier.values())}
    leaves = {s for s in switches - spines if any(spines & set(e[:2]) for e in degree[s])}
    assert spines and leaves
    for leaf in leaves:
        up = sum(e[2] for e in degree[leaf] if spines & set(e[:2]))
        down = sum(e[2] for e in degree[leaf] if not spines & set(e[:2]))
        one = max(e[2] for e in degree[leaf])
        assert down <= up <= down + one
        assert len([e for e in degree[leaf] if not spines & set(e[:2])]) <= astra_ns3.LEAF_DOWNLINKS


def read_htsim(path: Path) -> tuple[dict, dict[int, dict]]:
    header: dict[str, int] = {}
    tiers: dict[int, dict] = {}
    current = None
    for line in path.read_text().splitlines():
        tokens = line.split(" ")
        if not tokens[0] or tokens[0].startswith("#"):
            continue
        key = tokens[0].lower()
        if key == "tier":
            current = int(tokens[1])
            tiers[current] = {}
        elif current is None:
            header[key] = int(tokens[1])
        else:
            assert key not in tiers[current], f"duplicate {key} (htsim exits)"
            tiers[current][key] = int(tokens[1])
    return header, tiers


def test_htsim_topology_passes_htsims_own_checks(make_set):
    cluster = Cluster(gpus_per_node=4, scale_out_bw=50.0, scale_out_latency=1500.0)
    options = AstraOptions(astra_sim_backend="htsim", astra_sim_trace=True)
    spec, out, doc = make_set(dp=4)
    files = write_astra_bundle(out, doc, cluster, options)
    assert sorted(p.name for p in files) == sorted(astra.bundle_files(options))
    header, tiers = read_htsim(out / astra_htsim.TOPOLOGY_FILE)
    n, pod = header["nodes"], header["podsize"]
    net = yaml.safe_load((out / astra_files.NETWORK_FILE).read_text())
    assert n == doc["world_size"] == math.prod(net["npus_count"])  # htsim: "Mismatch between connection matrix"
    # one logical dimension (htsim has no scale-up network), and the system's lists match it
    system = json.loads((out / astra_files.SYSTEM_FILE).read_text())
    assert net["npus_count"] == [n] and len(system["all-reduce-implementation"]) == 1
    assert header["tiers"] == len(tiers) == 2
    t0, t1 = tiers[0], tiers[1]
    for tier in (t0, t1):
        assert {"downlink_speed_gbps", "downlink_latency_ns", "radix_down"} <= set(tier)
        assert tier["downlink_speed_gbps"] == 400 and tier["downlink_latency_ns"] == 1500  # 50 GB/s = 400 Gb/s
        assert "queue_up" not in tier and "queue_down" not in tier
    assert "radix_up" in t0 and "radix_up" not in t1
    # set_custom_params, 2 tiers, oversubscription 1
    assert n % pod == 0 and pod % t0["radix_down"] == 0
    assert t0["radix_down"] // t0["radix_up"] == 1
    pods = n // pod
    tor_uplinks = n * t0["downlink_speed_gbps"] // t1["downlink_speed_gbps"]
    assert tor_uplinks % (pods * t1["radix_down"]) == 0
    assert tor_uplinks // (pods * t1["radix_down"]) * t1.get("bundle", 1) == t0["radix_up"]
    assert json.loads((out / astra_files.SYSTEM_FILE).read_text())["trace-enabled"] == 1


def test_trace_enabled_only_when_asked(make_set):
    _, out, doc = make_set()
    write_astra_bundle(out, doc, Cluster())
    assert "trace-enabled" not in json.loads((out / astra_files.SYSTEM_FILE).read_text())


@pytest.mark.parametrize("backend", ["ns3", "htsim"])
@pytest.mark.parametrize("finished, rc", [(8, 0), (7, 1)])
def test_run_script_requires_every_rank_for_every_backend(make_set, tmp_path, backend, finished, rc):
    _, out, doc = make_set()
    write_astra_bundle(out, doc, Cluster(gpus_per_node=4), AstraOptions(astra_sim_backend=backend))
    fake = write_fake_astra(tmp_path / "fake")
    env = {k: v for k, v in os.environ.items() if k not in ("ASTRA_SIM", "ASTRA_LOG_DIR")}
    done = subprocess.run(["bash", str(out / astra_files.RUN_SCRIPT), str(fake)], capture_output=True, text=True,
                          env={**env, "FAKE_FINISHED": str(finished)}, cwd=tmp_path, timeout=60)
    assert done.returncode == rc, done.stderr
    if backend == "ns3":
        assert (out / astra_ns3.OUTPUT_DIR).is_dir()
    command = done.stdout.splitlines()[0]
    assert (f"--network-configuration={astra_ns3.CONFIG_FILE}" in command) == (backend == "ns3")
    assert (f"-topo {astra_htsim.TOPOLOGY_FILE}" in command) == (backend == "htsim")


@pytest.mark.parametrize("flags, message", [
    (["--astra-sim-backend", "omnet"], "--astra-sim-backend 'omnet' is not known"),
    (["--astra-sim-backend", "ns3", "--scale-up-topology", "ring"], "cannot be routed"),
    (["--astra-sim-backend", "ns3", "--scale-out-topology", "ring"], "--scale-out-fabric"),
    (["--astra-sim-backend", "ns3", "--scale-out-fabric", "dragonfly"], "fat-tree or rail-optimized"),
    (["--scale-out-fabric", "rail-optimized"], "add --astra-sim-backend ns3"),
])
def test_bad_backend_flags_are_one_line_and_write_nothing(tmp_path, flags, message):
    load_commands()
    target = tmp_path / "out"
    result = CliRunner().invoke(app, ["generate", "-o", str(target), "-q", "--astra-sim", *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not target.exists()


def test_ns3_refuses_messages_beyond_its_int(tmp_path):
    """A message above 2^31-1 bytes overflows ns-3's int: gpt3-175b's pipeline activation at 16
    sequences of 8,192 tokens is 16 * 8192 * 12288 * 2 = 3,221,225,472 bytes."""
    load_commands()
    target = tmp_path / "out"
    # --allow-oom: this test is about ns-3's message sizes, not whether the run fits a GPU (it does not).
    big = ["-p", "gpt3-175b", "--seq-len", "8192", "--micro-batch", "16", "--num-microbatches", "16", "--allow-oom"]
    result = CliRunner().invoke(app, ["generate", "-o", str(target), "-q", "--astra-sim", "--astra-sim-backend", "ns3",
                                      *big])
    assert result.exit_code == 2 and "ns-3 backend can count" in result.output, result.output
    assert not target.exists()


def test_backend_flags_need_astra_sim(tmp_path):
    load_commands()
    result = CliRunner().invoke(app, ["generate", "-o", str(tmp_path / "o"), "--astra-sim-backend", "ns3"])
    assert result.exit_code == 2 and "add --astra-sim" in result.output


# -- the real backends, when their binaries are named --------------------------------------------

REAL = [("ns3", os.environ.get("ASTRA_SIM_NS3_BIN")), ("htsim", os.environ.get("ASTRA_SIM_HTSIM_BIN"))]


@pytest.mark.simulator
@pytest.mark.parametrize("backend, binary", REAL)
@pytest.mark.parametrize("overrides", [{}, {"dp_mode": "zero3"}, {"cp": 2, "dp": 1, "order": "megatron"}])
def test_real_backend_finishes_every_rank(make_set, backend, binary, overrides):
    if not binary or not Path(binary).is_file():
        pytest.skip(f"set ASTRA_SIM_{backend.upper()}_BIN to ASTRA-sim's {astra.BACKEND_INFO[backend].binary}")
    spec, out, doc = make_set(**overrides)
    write_astra_bundle(out, doc, Cluster(gpus_per_node=4), AstraOptions(astra_sim_backend=backend))
    done = subprocess.run(["bash", str(out / astra_files.RUN_SCRIPT), binary], capture_output=True, text=True, timeout=1800)
    log = (out / astra_files.LOG_DIR / "stdout.txt").read_text()
    finished = {int(i) for i in re.findall(r"sys\[(\d+)\] finished", log)}
    assert finished == set(range(spec.world_size)), done.stderr[-2000:]
    assert done.returncode == 0
