"""`generate --astra-sim --fabric`: the ASTRA-sim analytical and ns-3 bundles read the fabric
description, checked against hand arithmetic on small fabrics.

Analytical: one Switch dimension per level the job spans (NVLink domain, leaf group, pod, core),
npus from the fabric's shape, bandwidth per NPU with a k:1 tier dividing the next dimension by k
(astra-network-analytical reads `topology`, `npus_count`, `bandwidth`, `latency` as one entry
per dimension, innermost first). ns-3: the switches and links the job uses, counted by hand.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cli_runner import invoke, one_line_error

from traceforge.base.errors import UserError
from traceforge.machine.astra import NETWORK_FILE, from_astra_gbps, load_network
from traceforge.machine.cluster import Cluster
from traceforge.machine.fabric import Fabric, Tier
from traceforge.write import astra_htsim, astra_ns3
from traceforge.write.astra import AstraOptions, network_dimensions, write_astra_bundle

CLUSTER = Cluster(scale_up_latency=100.0, scale_out_latency=1000.0)


def rail(gpn: int, leaf: Tier, spine: Tier | None = None, core: Tier | None = None, **kw) -> Fabric:
    tiers = tuple(t for t in (leaf, spine, core) if t is not None)
    return Fabric(gpus_per_node=gpn, nvlink_domain=gpn, nics_per_node=gpn, nvlink_gbps=450.0, nic_gbps=50.0,
                  tiers=tiers, **kw)


def dims(fabric: Fabric, world: int) -> list[tuple[str, int, float, float]]:
    return [(d.role, d.npus, d.bandwidth, d.latency) for d in network_dimensions(world, CLUSTER, fabric)]


# -- the analytical backend ------------------------------------------------------------------------
def test_three_tier_fabric_gives_the_hand_computed_dimensions():
    # 8 GPUs and 8 rails per node; leaves of 8 ports at 1:1: 4 down (4 nodes per leaf group), 4 up;
    # spines of 16 ports, all down: 16 / 8 rails = 2 leaf groups per pod. 64 GPUs = 8 nodes:
    # 8 GPUs per NVLink domain x 4 domains per leaf group x 2 leaf groups.
    f = rail(8, Tier("leaf", 8, 50.0), Tier("spine", 16, 50.0, latency_ns=600.0))
    assert dims(f, 64) == [("nvlink", 8, 450.0, 100.0), ("leaf", 4, 50.0, 1000.0), ("spine", 2, 50.0, 600.0)]


def test_the_three_tier_bundle_file_reads_back_as_those_dimensions(tmp_path):
    out = tmp_path / "job"
    result = invoke("generate", "--tp", 2, "--pp", 2, "--dp", 4, "--world-size", 16, "-o", out, "-q", "--astra-sim",
                    "--gpus-per-node", 2, "--nics-per-node", 2, "--fabric", "rail-optimized", "--fabric-leaf", 4,
                    "--fabric-spine", "radix=8,latency=700")
    assert result.exit_code == 0, result.stderr
    # leaf 4 ports: 2 down (2 nodes per leaf group), 2 up; spine 8 down: 8 / 2 rails = 4 groups.
    doc = yaml.safe_load((out / NETWORK_FILE).read_text())
    assert doc["topology"] == ["Switch"] * 3 and doc["npus_count"] == [2, 2, 4]
    assert [round(from_astra_gbps(b), 9) for b in doc["bandwidth"]] == [450.0, 50.0, 50.0]
    assert doc["latency"] == [936.25, 1000.0, 700.0]  # --scale-up/-out-latency defaults where the fabric is silent
    assert load_network(out).world == 16


@pytest.mark.parametrize("k", [2, 4])
def test_a_k_to_1_leaf_divides_exactly_the_spine_dimension_by_k(k):
    # Leaves of 8 down ports: radix 16 at 1:1 (8 up), radix 8 + 8 / k at k:1 (8 / k up).
    one = rail(8, Tier("leaf", 16, 50.0), Tier("spine", 16, 50.0))
    over = rail(8, Tier("leaf", 8 + 8 // k, 50.0, oversubscription=float(k)), Tier("spine", 16, 50.0))
    assert over.ports[0] == (8, 8 // k)
    a, b = dims(one, 128), dims(over, 128)
    assert [d[1] for d in a] == [d[1] for d in b] == [8, 8, 2]
    assert a[:2] == b[:2]  # NVLink and leaf dimensions untouched
    assert b[2][2] == a[2][2] / k == 50.0 / k


def test_a_four_level_fabric_drops_the_levels_the_job_does_not_span():
    # tor, 2 GPUs and 2 NICs per node; leaf 4 ports: 2 down = one node; spine 4 ports: 2 down, 2 up
    # (2 leaves per pod); core 2 ports: 2 pods. 4 nodes: NVLink 2, one domain per leaf (dropped),
    # 2 leaves per pod, 2 pods.
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="tor",
               tiers=(Tier("leaf", 4), Tier("spine", 4), Tier("core", 2)))
    assert [(d[0], d[1]) for d in dims(f, 8)] == [("nvlink", 2), ("spine", 2), ("core", 2)]


def test_gpus_sharing_a_nic_get_their_share_of_it():
    f = Fabric(gpus_per_node=8, nvlink_domain=8, nics_per_node=4, nic_gbps=50.0,
               tiers=(Tier("leaf", 16, 50.0), Tier("spine", 16, 50.0)))
    assert dims(f, 32)[1][:3] == ("leaf", 4, 25.0)  # 4 NICs x 50 GB/s over 8 GPUs


@pytest.mark.parametrize(("placement", "why"), [
    ((0, 1, 2, 4, 5, 8), "puts 1 and 3"),  # 3 nodes in one leaf group, 2 and 1 in others
    ((4, 5, 0, 1), "slot order"),          # a clean shape, but rank order is not the fabric's
])
def test_a_placement_that_is_not_a_product_is_refused_in_one_line_naming_ns3(placement, why):
    # leaf groups of 4 nodes, 24 / 8 rails = 3 of them
    f = rail(8, Tier("leaf", 8, 50.0), Tier("spine", 24, 50.0), placement=placement)
    with pytest.raises(UserError, match=why) as err:
        network_dimensions(8 * len(placement), CLUSTER, f)
    assert "ns3" in str(err.value) and "\n" not in str(err.value)
    # ns-3 builds it link by link
    astra_ns3.fabric_network(f, 8 * len(placement), 100.0, 1000.0)


# -- the ns-3 backend ----------------------------------------------------------------------------
def links_between(net: astra_ns3.Fabric, a: set[int], b: set[int]) -> list[astra_ns3.Link]:
    return [x for x in net.links if (x.a in a and x.b in b) or (x.a in b and x.b in a)]


def test_ns3_rail_optimized_switches_and_links_by_hand():
    # 4 GPUs, 4 rails; leaf 8 ports at 1:1: 4 nodes per leaf group, 4 up; spine 16 down: 4 groups.
    # 8 nodes (32 GPUs): 8 NVLink switches, 2 groups x 4 rails = 8 leaves, 4 spines (a leaf's up
    # links); links: 32 GPU-NVLink, 32 GPU-leaf (8 per rail), 8 leaves x 4 = 32 leaf-spine.
    f = rail(4, Tier("leaf", 8, 50.0), Tier("spine", 16, 50.0))
    net = astra_ns3.fabric_network(f, 32, 100.0, 1000.0)
    gpus = set(range(32))
    degree = Counter(e for x in net.links for e in (x.a, x.b))
    nvs = {s for s in net.switches if degree[s] == 4 and all(x.bits_per_second == 3_600_000_000_000
                                                              for x in net.links if s in (x.a, x.b))}
    leaves = {x.b for x in net.links if x.a in gpus} - nvs
    spines = set(net.switches) - nvs - leaves
    assert (len(net.switches), len(nvs), len(leaves), len(spines)) == (20, 8, 8, 4)
    assert len(net.links) == 96
    to_leaf = links_between(net, gpus, leaves)
    assert len(to_leaf) == 32 and len(links_between(net, leaves, spines)) == 32
    for leaf in leaves:  # every leaf holds one rail: the same GPU position of 4 nodes
        down = [x.a for x in to_leaf if x.b == leaf]
        assert len(down) == 4 and len({g % 4 for g in down}) == 1
    per_rail = Counter(x.a % 4 for x in to_leaf)
    assert per_rail == {0: 8, 1: 8, 2: 8, 3: 8}
    assert {x.bits_per_second for x in to_leaf} == {400_000_000_000}  # 50 GB/s


def test_ns3_tor_switches_and_links_by_hand():
    # 4 GPUs, 4 NICs; tor leaf 16 ports at 1:1: 8 down = 2 nodes, 8 up; spine 8 down: 8 leaves.
    # 8 nodes: 8 NVLink switches, 4 leaves, 8 spines; links: 32 GPU-NVLink, 8 node-leaf (one per
    # node at 4 x 50 GB/s), 4 leaves x 8 = 32 leaf-spine.
    f = Fabric(gpus_per_node=4, nvlink_domain=4, nics_per_node=4, wiring="tor",
               tiers=(Tier("leaf", 16, 50.0), Tier("spine", 8, 50.0)))
    net = astra_ns3.fabric_network(f, 32, 100.0, 1000.0)
    gpus = set(range(32))
    nvs = {x.b for x in net.links if x.a in gpus}
    node_up = [x for x in net.links if x.a in nvs]
    leaves = {x.b for x in node_up}
    spines = set(net.switches) - nvs - leaves
    assert (len(nvs), len(leaves), len(spines), len(net.switches)) == (8, 4, 8, 20)
    assert len(node_up) == 8 and {x.bits_per_second for x in node_up} == {1_600_000_000_000}
    assert Counter(x.b for x in node_up) == {leaf: 2 for leaf in leaves}
    assert len(links_between(net, leaves, spines)) == 32 and len(net.links) == 72


def test_ns3_three_tiers_build_cores_only_across_pods():
    # tor, 2 GPUs, 2 NICs; leaf 4 ports: 1 node, 2 up; spine 4 ports: 2 down, 2 up; core 2 ports.
    # 4 nodes in 2 pods: 4 NVLink, 4 leaves, 2 pods x 2 spines, 2 x 2 cores (u, v);
    # links 8 + 4 + 4 x 2 + 4 x 2 = 28. Two nodes (one pod): no core.
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="tor",
               tiers=(Tier("leaf", 4), Tier("spine", 4), Tier("core", 2, latency_ns=2500.0)))
    net = astra_ns3.fabric_network(f, 8, 100.0, 1000.0)
    assert (len(net.switches), len(net.links)) == (16, 28)
    assert sum(x.latency_ns == 2500.0 for x in net.links) == 8
    small = astra_ns3.fabric_network(f, 4, 100.0, 1000.0)
    assert (len(small.switches), len(small.links)) == (2 + 2 + 2, 4 + 2 + 4)


def test_ns3_bundle_from_the_cli_writes_the_fabric_topology(tmp_path):
    out = tmp_path / "job"
    result = invoke("generate", "--tp", 2, "--pp", 2, "--dp", 4, "--world-size", 16, "-o", out, "-q", "--astra-sim",
                    "--astra-sim-backend", "ns3", "--gpus-per-node", 2, "--nics-per-node", 2, "--fabric",
                    "rail-optimized", "--fabric-leaf", 4, "--fabric-spine", 8)
    assert result.exit_code == 0, result.stderr
    head = (out / astra_ns3.TOPOLOGY_FILE).read_text().split("\n")[0].split()
    # 8 NVLink switches, 4 groups x 2 rails = 8 leaves, 2 spines; 16 + 16 + 8 x 2 links
    assert [int(x) for x in head] == [16 + 18, 18, 48]
    assert (out / astra_ns3.LOGICAL_FILE).read_text().strip() == '{"logical-dims": ["2", "2", "4"]}'


def test_ns3_refuses_rail_only_across_domains_in_one_line():
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="rail-only",
               tiers=(Tier("leaf", 4), Tier("spine", 8)))
    with pytest.raises(UserError, match="rail-only") as err:
        astra_ns3.fabric_network(f, 8, 100.0, 1000.0)
    assert "\n" not in str(err.value)


# -- the command line ----------------------------------------------------------------------------
BAD = [
    ("--fabric-leaf", "0"),              # radix 0
    ("--fabric-leaf", "radix=8,over=0.5"),  # oversubscription below 1
    ("--fabric-spine", "2"),              # 16 nodes on leaves of 2 ports down and a 2-port spine
    ("--fabric-placement", "0,0"),         # a slot twice
]


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_generate_refuses_a_bad_fabric_with_reports_line_and_writes_nothing(tmp_path, make_set, flag, value):
    _, traces, _ = make_set(tp=2, pp=2, dp=4, world_size=16)
    fabric = ("--fabric", "rail-optimized", "--fabric-leaf", 4, flag, value)
    report = one_line_error(invoke("report", traces, "-g", 2, "--nics-per-node", 2, *fabric, "-q", "--no-timeline"))
    out = tmp_path / "job"
    gen = one_line_error(invoke("generate", "--tp", 2, "--pp", 2, "--dp", 4, "--world-size", 16, "-o", out, "-q",
                                "--astra-sim", "--gpus-per-node", 2, "--nics-per-node", 2, *fabric))
    assert gen == report
    assert not out.exists()


def test_a_fabric_flag_without_fabric_or_astra_sim_is_one_line(tmp_path):
    one_line_error(invoke("generate", "-o", tmp_path / "a", "--astra-sim", "--fabric-leaf", 8), "--fabric-leaf",
                   "add --fabric")
    one_line_error(invoke("generate", "-o", tmp_path / "b", "--fabric", "tor"), "--fabric", "--astra-sim")
    one_line_error(invoke("generate", "-o", tmp_path / "c", "--astra-sim", "--fabric", "tor", "--scale-out-bw", 25),
                   "--scale-out-bw", "--fabric")
    one_line_error(invoke("generate", "-o", tmp_path / "d", "--astra-sim", "--astra-sim-backend", "htsim",
                          "--fabric", "rail-optimized"), "htsim", "ns3")
    assert not any(Path(tmp_path).iterdir())


def test_generate_and_report_take_the_same_fabric_flags():
    import typer.main

    from traceforge.cli import app

    def flags(name: str) -> dict[str, tuple]:
        command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
        return {p.name: (tuple(p.opts), tuple(p.secondary_opts)) for p in command.params
                if p.name and (p.name.startswith("fabric") or p.name in ("nvlink_domain", "pxn"))}

    report, generate = flags("report"), flags("generate")
    assert len(report) == 11 and report == generate


def test_without_a_fabric_every_level_is_the_two_dimension_machine():
    assert math.prod(d.npus for d in network_dimensions(16, Cluster(gpus_per_node=8))) == 16
    assert [d.role for d in network_dimensions(16, Cluster(gpus_per_node=8))] == ["scale-up", "scale-out"]


def test_write_astra_bundle_with_a_fabric_writes_its_dimensions(tmp_path, make_set):
    _, out, doc = make_set(tp=2, pp=2, dp=4, world_size=16)
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, tiers=(Tier("leaf", 4), Tier("spine", 8)))
    write_astra_bundle(out, doc, Cluster(gpus_per_node=2), AstraOptions(fabric=f))
    assert [d.npus for d in load_network(out).dims] == [2, 2, 4]


# -- the htsim backend ---------------------------------------------------------------------------
def htsim_fat_tree(text: str) -> tuple[dict, dict[int, dict]]:
    header: dict = {}
    tiers: dict[int, dict] = {}
    current = None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if not key or key.startswith("#"):
            continue
        if key.lower() == "tier":
            current = tiers.setdefault(int(value), {})
        else:
            (header if current is None else current)[key.lower()] = int(value)
    return header, tiers


def htsim_switches(header: dict, tiers: dict[int, dict]) -> tuple[int, int, int]:
    """(ToRs, aggregation switches, cores) as csg-htsim's FatTreeTopology::set_custom_params
    computes them, with each of its exits restated as an assert."""
    n, pod = header["nodes"], header["podsize"]
    t0, t1 = tiers[0], tiers[1]
    assert n % pod == 0 and pod % t0["radix_down"] == 0
    pods = n // pod
    k0, k1 = t0.get("oversubscribed", 1), t1.get("oversubscribed", 1)
    assert (n * t0["downlink_speed_gbps"]) % (t1["downlink_speed_gbps"] * k0) == 0
    tor_up = n * t0["downlink_speed_gbps"] // (t1["downlink_speed_gbps"] * k0)
    assert t0["radix_down"] // t0["radix_up"] == k0
    assert tor_up % (pods * t1["radix_down"]) == 0
    agg = tor_up // (pods * t1["radix_down"])
    assert agg * t1.get("bundle", 1) == t0["radix_up"]
    cores = 0
    if header["tiers"] == 3:
        t2 = tiers[2]
        assert (tor_up * t1["downlink_speed_gbps"]) % (t2["downlink_speed_gbps"] * k1) == 0
        agg_up = tor_up * t1["downlink_speed_gbps"] // (t2["downlink_speed_gbps"] * k1)
        assert agg_up % t2["radix_down"] == 0
        cores = agg_up // t2["radix_down"]
        assert cores % agg == 0 and cores * t2.get("bundle", 1) // agg == t1["radix_up"]
    return pods * pod // t0["radix_down"], agg * pods, cores


def test_htsim_tor_fabric_by_hand():
    # tor, 2 GPUs and 2 NICs per node; leaf 8 ports: 4 down = 2 nodes (4 hosts), 4 up; spine 8.
    # 8 nodes: 4 ToRs of 4 hosts, 4 aggregation switches (a leaf's up links), 50 GB/s = 400 Gb/s.
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="tor", tiers=(Tier("leaf", 8), Tier("spine", 8)))
    header, tiers = htsim_fat_tree(astra_htsim.fabric_topology_text(f, 16, 1000.0))
    assert (header["nodes"], header["tiers"], tiers[0]["radix_down"], tiers[0]["radix_up"]) == (16, 2, 4, 4)
    assert tiers[0]["downlink_speed_gbps"] == tiers[1]["downlink_speed_gbps"] == 400
    assert htsim_switches(header, tiers) == (4, 4, 0)


def test_htsim_three_tiers_with_a_2_to_1_spine_by_hand():
    # tor, 2 GPUs, 2 NICs; leaf 4 ports: 1 node, 2 up; spine 4 ports at 2:1: 2 down, 1 up; core 2.
    # 4 nodes, 2 pods of 2 ToRs of 2 hosts; 2 spines per pod; 2 x 1 cores; the spine's 2 x 400
    # Gb/s down over 1 x 400 up is htsim's Oversubscribed 2.
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="tor",
               tiers=(Tier("leaf", 4), Tier("spine", 4, oversubscription=2.0, down=2), Tier("core", 2, latency_ns=2500.0)))
    header, tiers = htsim_fat_tree(astra_htsim.fabric_topology_text(f, 8, 1000.0))
    assert header["tiers"] == 3 and tiers[1]["oversubscribed"] == 2 and tiers[2]["downlink_latency_ns"] == 2500
    assert htsim_switches(header, tiers) == (4, 4, 2)


def test_htsim_refuses_rail_wiring_in_one_line_naming_the_others():
    f = rail(4, Tier("leaf", 8, 50.0), Tier("spine", 16, 50.0))
    with pytest.raises(UserError, match="ns3 or analytical") as err:
        astra_htsim.fabric_topology_text(f, 32, 1000.0)
    assert "\n" not in str(err.value)


def test_an_htsim_bundle_with_a_fabric_writes_the_fabrics_tree(make_set):
    _, out, doc = make_set(tp=2, pp=2, dp=4, world_size=16)
    f = Fabric(gpus_per_node=2, nvlink_domain=2, nics_per_node=2, wiring="tor", tiers=(Tier("leaf", 8), Tier("spine", 8)))
    write_astra_bundle(out, doc, Cluster(gpus_per_node=2), AstraOptions(astra_sim_backend="htsim", fabric=f))
    assert (out / astra_htsim.TOPOLOGY_FILE).read_text() == astra_htsim.fabric_topology_text(f, 16, 1000.0)
    assert [d.npus for d in load_network(out).dims] == [16]


def test_todays_rail_optimized_ns3_network_is_the_fabric_of_the_same_shape():
    # --scale-out-fabric rail-optimized on 4 nodes of 4 GPUs: a leaf per rail with the 4 nodes'
    # GPUs, 4 spines, every link at 50 GB/s or NVLink's 400. The fabric: 4 rails, leaves of 4 down
    # and 4 up, one pod; the same switches and links (built in another order).
    cluster = Cluster(gpus_per_node=4, scale_up_bw=400.0)
    today = astra_ns3.build_fabric(16, 4, "Switch", cluster, "rail-optimized")
    f = Fabric(gpus_per_node=4, nvlink_domain=4, nvlink_gbps=400.0, nics_per_node=4, nic_gbps=50.0,
               tiers=(Tier("leaf", 8, 50.0), Tier("spine", 16, 50.0)))
    described = astra_ns3.fabric_network(f, 16, cluster.scale_up_latency, cluster.scale_out_latency)

    def shape(net: astra_ns3.Fabric) -> Counter:
        # a switch by what it links to: hosts (sorted), or the count of its switch links
        kind = {s: tuple(sorted(x.a for x in net.links if x.b == s and x.a < net.hosts)) or
                len([x for x in net.links if s in (x.a, x.b)]) for s in net.switches}
        return Counter((kind.get(x.a, x.a), kind.get(x.b, x.b), x.bits_per_second, x.latency_ns) for x in net.links)

    assert len(today.switches) == len(described.switches) == 4 + 4 + 4
    assert shape(today) == shape(described)


def test_report_reads_a_fabric_bundles_innermost_dimension_as_the_node(tmp_path):
    # A three-dimension bundle (NVLink 2 x leaf 4 x spine 2): report's node is the NVLink domain
    # of 2 GPUs (it said 8 GPUs, the flag default, before); -g 2 agrees, -g 4 and a scale-out
    # flag (no one dimension is scale-out) are refused in one line.
    out = tmp_path / "job"
    assert invoke("generate", "--tp", 2, "--pp", 2, "--dp", 4, "--world-size", 16, "-o", out, "-q", "--astra-sim",
                  "--gpus-per-node", 2, "--nics-per-node", 2, "--fabric", "rail-optimized", "--fabric-leaf",
                  "radix=6,over=2", "--fabric-spine", 8).exit_code == 0
    assert [d.npus for d in load_network(out).dims] == [2, 4, 2]
    for args in ((), ("-g", 2)):
        result = invoke("report", out, "-q", "--no-timeline", *args)
        assert result.exit_code == 0 and "on 8 node(s) of 2 GPUs" in result.stdout
    one_line_error(invoke("report", out, "-q", "--no-timeline", "-g", 4), "--gpus-per-node", "disagrees")
    one_line_error(invoke("report", out, "-q", "--no-timeline", "--scale-out-bw", 25), "--scale-out-bw", "--alpha-beta")


@pytest.mark.parametrize(("args", "flag"), [(("--fabric-qps", 2), "--fabric-qps"), (("--no-pxn",), "--no-pxn"),
                                            (("--nvlink-domain", 8), "--nvlink-domain")])
def test_report_names_the_fabric_flag_given_without_fabric_as_typed(make_set, args, flag):
    # (it said --qps-per-connection, which is no flag, and --pxn for --no-pxn)
    _, traces, _ = make_set()
    line = one_line_error(invoke("report", traces, "-q", "--no-timeline", *args), "add --fabric")
    assert line.split()[2] == flag


def test_failed_links_are_named_as_left_out_of_the_bundle(tmp_path):
    fabric = tmp_path / "f.yaml"
    fabric.write_text("gpus_per_node: 2\nnics_per_node: 2\ntiers: [{radix: 4}, {radix: 8}]\n"
                      "failed_links: [leaf2>spine0.0]\n")
    result = invoke("generate", "--tp", 2, "--pp", 2, "--dp", 4, "--world-size", 16, "-o", tmp_path / "job", "-q",
                    "--astra-sim", "--fabric", fabric)
    assert result.exit_code == 0 and "1 failed link(s) are not in the ASTRA-sim bundle" in result.stderr
