"""One machine description (traceforge.machine.cluster.Cluster) behind `generate --astra-sim` and `report`:
the same flags parse to the same object, its units survive the trip through ASTRA-sim's network
file, bad values are one line, and report's alpha-beta times follow the cluster's values."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import yaml
from cli_runner import invoke, one_line_error
from mutate import encode

from traceforge.base.errors import UserError
from traceforge.chakra._proto import traceforge_et_pb2 as pb
from traceforge.cli import generate as generate_cli
from traceforge.cli import report as report_cli
from traceforge.machine import astra as astra_files
from traceforge.machine import cluster as cluster_mod
from traceforge.machine.astra import load_network, machine_of
from traceforge.machine.cluster import ALPHA_BETA, FIELDS, Cluster
from traceforge.report.build import build_report
from traceforge.write import astra

# A machine unlike the defaults in every field; values in the flags' units (GB/s = 10^9 B/s, ns).
MACHINE = {"gpus_per_node": 4, "scale_up_bw": 300.0, "scale_up_latency": 700.0, "scale_out_bw": 25.0,
           "scale_out_latency": 2500.0, "nics_per_node": 2}
REPORT_FIELDS = [f for f in FIELDS if f.report]


def flags(values: dict) -> list[str]:
    return [arg for name, value in values.items() for arg in ("--" + name.replace("_", "-"), str(value))]


def approx_cluster(values: dict):
    return {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in values.items()}


def test_both_commands_parse_the_same_flags_to_the_same_cluster(tmp_path, monkeypatch):
    """The bundle is written from, and report times with, one object: the Cluster of the flags."""
    from traceforge.report import build as report_build

    seen: dict[str, Cluster] = {}
    real_write, real_machine, real_build = astra.write_astra_bundle, report_cli.machine_for, report_build.build_report

    def record_write(out_dir, manifest, cluster=None, options=None):
        seen["generate"] = cluster
        return real_write(out_dir, manifest, cluster, options)

    def record_machine(directory, cluster, given, astra_model, *mode):
        seen["report"] = cluster
        return real_machine(directory, cluster, given, astra_model, *mode)

    def record_build(*args, link=None, **kwargs):
        seen["timed"] = link
        return real_build(*args, link=link, **kwargs)

    monkeypatch.setattr(generate_cli, "write_astra_bundle", record_write)  # where generate looks it up
    monkeypatch.setattr(report_cli, "machine_for", record_machine)
    monkeypatch.setattr(report_build, "build_report", record_build)  # report imports it when it runs
    out = tmp_path / "set"
    assert invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", out, *flags(MACHINE)).exit_code == 0
    res = invoke("report", out, "--json", "--alpha-beta", *flags(MACHINE))
    assert res.exit_code == 0, res.output
    assert seen["generate"] == seen["report"] == seen["timed"] == Cluster(**MACHINE)
    assert type(seen["timed"]) is Cluster
    # and report's alpha-beta model is that cluster, in the replay's microseconds
    link = json.loads(res.stdout)["timeline"]["link_model"]
    assert link == {"intra_gbps": MACHINE["scale_up_bw"], "inter_gbps": MACHINE["scale_out_bw"],
                    "intra_latency_us": MACHINE["scale_up_latency"] / 1e3,
                    "inter_latency_us": MACHINE["scale_out_latency"] / 1e3}


def test_every_report_machine_flag_is_a_generate_flag_with_the_same_help():
    from traceforge.cli.machine import machine_parameters

    gen = {p.name: p.default for p in machine_parameters("generate")}
    rep = {p.name: p.default for p in machine_parameters("report")}
    assert set(rep) == {f.name for f in REPORT_FIELDS} and set(rep) <= set(gen)
    for name in rep:
        assert rep[name].help == gen[name].help
        assert "--" + name.replace("_", "-") in rep[name].param_decls


@pytest.mark.parametrize("gpn, shape", [(4, 2), (8, 1)])
def test_cluster_survives_the_astra_network_file(make_set, gpn, shape):
    """Cluster -> astra_network.yml (ASTRA-sim's 2^30-byte GB/s) -> report's reader -> the same values."""
    cluster = Cluster(**{**MACHINE, "gpus_per_node": gpn}, scale_up_topology="ring",
                      scale_out_topology="fullyconnected")
    _, out, doc = make_set()
    astra.write_astra_bundle(out, doc, cluster)
    raw = yaml.safe_load((out / astra_files.NETWORK_FILE).read_text())
    assert len(raw["npus_count"]) == shape
    # ASTRA-sim multiplies the file's value by 2^30 bytes/s (NetworkFunction.cpp): that must be our 10^9 GB/s
    assert raw["bandwidth"][0] * 2**30 == pytest.approx(cluster.scale_up_bw * 1e9, rel=1e-12)
    back = machine_of(load_network(out))
    if shape == 2:
        # every field but the NICs, which ASTRA-sim's network file has no place for
        expect = {f.name: getattr(cluster, f.name) for f in FIELDS if f.name != "nics_per_node"}
    else:  # one dimension of 8 NPUs (one node): every message rides the scale-up links
        expect = {f"{s}_{k}": getattr(cluster, f"scale_up_{k}") for s in ("scale_up", "scale_out")
                  for k in ("bw", "latency", "topology")}
    assert back == approx_cluster(expect)


@pytest.mark.parametrize("flag, value", [
    ("--scale-up-bw", "nan"), ("--scale-out-bw", "inf"), ("--scale-out-bw", "0"), ("--scale-up-bw", "1e-300"),
    ("--scale-up-bw", "1e300"), ("--scale-up-latency", "-1"), ("--scale-out-latency", "1e308"),
    ("--scale-out-latency", "nan"), ("--gpus-per-node", "0"), ("--gpus-per-node", "100000"),
])
def test_bad_values_are_one_line_in_both_commands(tmp_path, make_set, flag, value):
    _, out, _ = make_set()
    one_line_error(invoke("report", out, flag, value), flag[2:])
    gen = invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", tmp_path / "new", flag, value)
    one_line_error(gen, flag[2:])
    assert not (tmp_path / "new").exists()


def test_bad_topology_is_one_line(tmp_path):
    one_line_error(invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", tmp_path / "x",
                          "--scale-up-topology", "torus"), "scale-up-topology")
    with pytest.raises(UserError, match="scale-out-topology"):
        Cluster(scale_out_topology="mesh")


def test_bounds_keep_every_estimate_finite(make_set):
    """The extremes the flags allow still give a finite JSON estimate."""
    _, out, _ = make_set()
    worst = {"scale_up_bw": cluster_mod.MIN_BW_GBPS, "scale_out_bw": cluster_mod.MIN_BW_GBPS,
             "scale_up_latency": cluster_mod.MAX_LATENCY_NS, "scale_out_latency": cluster_mod.MAX_LATENCY_NS}
    res = invoke("report", out, "--json", *flags(worst))
    assert res.exit_code == 0, res.output
    total = json.loads(res.stdout)["timeline"]
    assert "Infinity" not in res.stdout and "NaN" not in res.stdout and total is not None


def test_old_report_flags_are_deprecated_aliases(make_set):
    _, out, _ = make_set()
    old = invoke("report", out, "--json", "--intra-bw", "360", "--inter-bw", "45", "--latency", "5")
    new = invoke("report", out, "--json", "--scale-up-bw", "360", "--scale-out-bw", "45",
                 "--scale-up-latency", "5000", "--scale-out-latency", "5000")
    assert old.exit_code == new.exit_code == 0
    assert json.loads(old.stdout)["timeline"] == json.loads(new.stdout)["timeline"]
    notes = [line for line in old.stderr.splitlines() if line.startswith("note: --")]
    assert len(notes) == 3
    assert any("--latency" in n and "--scale-up-latency and --scale-out-latency 5000" in n and "5 us" in n
               for n in notes)
    assert any("--inter-bw" in n and "--scale-out-bw 45" in n for n in notes)
    assert "--intra-bw" not in invoke("report", "--help").stdout  # hidden
    one_line_error(invoke("report", out, "--latency", "5", "--scale-up-latency", "5000"),
                   "--latency", "--scale-up-latency")
    one_line_error(invoke("report", out, "--latency", "1e308"), "--latency", "scale-up-latency")


def test_report_flags_and_bundle_cannot_disagree(tmp_path):
    out = tmp_path / "set"
    assert invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", out, *flags(MACHINE)).exit_code == 0
    line = one_line_error(invoke("report", out, "--scale-out-bw", "50"),
                          "--scale-out-bw", "astra_network.yml", "--alpha-beta")
    assert "25 GB/s" in line and "50 GB/s" in line
    one_line_error(invoke("report", out, "-g", "8"), "--gpus-per-node")
    one_line_error(invoke("report", out, "--latency", "1"), "scale-up-latency")  # an old flag converts, then disagrees
    # flags equal to the bundle are fine; the bundle also gives GPUs per node when -g is not given
    agree = invoke("report", out, "--json", *flags(MACHINE))
    bare = invoke("report", out, "--json")
    assert agree.exit_code == bare.exit_code == 0
    gpn = [json.loads(r.stdout)["gpus_per_node"] for r in (agree, bare)]
    assert gpn == [MACHINE["gpus_per_node"]] * 2
    assert json.loads(agree.stdout)["timeline"] == json.loads(bare.stdout)["timeline"]
    # --alpha-beta: the flags decide, the bundle is not read
    ab = invoke("report", out, "--json", "--alpha-beta", "--scale-out-bw", "50", "-g", "8")
    assert ab.exit_code == 0
    doc = json.loads(ab.stdout)
    assert doc["gpus_per_node"] == 8 and doc["timeline"]["link_model"]["inter_gbps"] == 50


def node(nid, ntype, deps=(), dur=0, **attrs):
    n = pb.Node(id=nid, name=f"n{nid}", type=ntype, duration_micros=dur)
    n.data_deps.extend(deps)
    for key, value in attrs.items():
        n.attr.add(name=key).int64_val = value
    return n


@pytest.mark.parametrize("gpus_per_node", [1, 8])
def test_default_estimate_follows_the_default_cluster(tmp_path, gpus_per_node):
    """A send of S bytes then an AllReduce of S bytes on 2 ranks, timed from Cluster()'s values:
    scale-up when both ranks share a node, scale-out otherwise."""
    size = 4_000_000
    r0 = [node(0, pb.COMM_SEND_NODE, comm_src=0, comm_dst=1, comm_size=size, comm_tag=1),
          node(1, pb.COMM_COLL_NODE, [0], comm_type=0, comm_size=size)]
    r1 = [node(0, pb.COMM_RECV_NODE, comm_src=0, comm_dst=1, comm_size=size, comm_tag=1),
          node(1, pb.COMM_COLL_NODE, [0], comm_type=0, comm_size=size)]
    d = tmp_path / "s"
    d.mkdir()
    for rank, nodes in enumerate((r0, r1)):
        (d / f"et.{rank}.et").write_bytes(encode(nodes, pb.GlobalMetadata(version="0.0.4")))
    (d / "comm_group.json").write_text(json.dumps({"1": [0, 1]}))
    c = Cluster()
    bw, lat = (c.scale_out_bw, c.scale_out_latency) if gpus_per_node == 1 else (c.scale_up_bw, c.scale_up_latency)
    us = lambda wire: lat / 1e3 + wire / (bw * 1e9) * 1e6  # noqa: E731
    wire = 2 * (2 - 1) / 2 * size  # ring AllReduce on 2 ranks
    report = build_report(d, gpus_per_node=gpus_per_node, jobs=1)
    assert report.replay.makespan == pytest.approx(us(size) + us(wire), rel=1e-12)
    assert math.isfinite(report.replay.makespan)


def test_flags_are_refused_beside_a_bundle_they_cannot_describe(tmp_path):
    out = tmp_path / "set"
    assert invoke("generate", "-p", "demo", "-q", "--astra-sim", "-o", out, "--gpus-per-node", "2").exit_code == 0
    # a hand-written three-dimension network of the same 8 NPUs (2 x 2 x 2)
    (out / astra_files.NETWORK_FILE).write_text("topology: [ Ring, Switch, Switch ]\nnpus_count: [ 2, 2, 2 ]\n"
                                          "bandwidth: [ 100.0, 50.0, 25.0 ]\nlatency: [ 500.0, 500.0, 500.0 ]\n")
    assert invoke("report", out, "--json").exit_code == 0
    one_line_error(invoke("report", out, "--scale-out-bw", "25"), "--scale-out-bw", "3 dimensions", "--alpha-beta")
    assert invoke("report", out, "--json", "--alpha-beta", "--scale-out-bw", "25").exit_code == 0


def test_one_object_holds_the_flags_values_and_times_transfers_in_us():
    """Fields in the flags' units; the replay's us derived once: 700 ns is 0.7 us, and 300 GB/s
    moves 300,000 bytes in 1 us (25 GB/s: 25,000 bytes)."""
    c = Cluster(**MACHINE)
    assert (c.scale_up_latency, c.scale_up_latency_us, c.scale_out_latency_us) == (700.0, 700.0 / 1e3, 2500.0 / 1e3)
    assert c.micros(300_000, inter=False) == pytest.approx(0.7 + 1.0, rel=1e-12)
    assert c.micros(25_000, inter=True) == pytest.approx(2.5 + 1.0, rel=1e-12)
    assert c.floor_send(25_000, None) == pytest.approx(0.7 + 25_000 / 300_000, rel=1e-12)  # the cheaper class
    # the us follow a replace and take no part in equality
    slower = replace(c, scale_up_latency=1400.0)
    assert slower.scale_up_latency_us == 1.4 and slower != c and replace(slower, scale_up_latency=700.0) == c


def test_the_gpu_picks_nccls_model_and_is_not_a_machine_flag():
    assert "gpu" not in {f.name for f in FIELDS}
    assert Cluster.from_options(gpu="h100", gpus_per_node=4).gpu is None  # only the machine flags
    # None: the set's GPU (report fills it in); alpha-beta; a GPU without NCCL's tables: no NCCL model
    assert Cluster().nccl is None and Cluster(gpu=ALPHA_BETA).nccl is None and Cluster(gpu="custom").nccl is None
    m = Cluster(**MACHINE, gpu="a100").nccl
    assert m is not None and m.generation == "ampere" and m.shared_nics
    assert (m.gpus_per_node, m.scale_up_bw, m.nics_per_node) == (4, 300.0, 2)
    assert m.nic_bw == 25.0 * 4 / 2  # the node's 4 x 25 GB/s over its 2 NICs
