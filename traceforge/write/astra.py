"""An ASTRA-sim bundle beside a trace set: network, system and remote-memory configs plus a
`run_astra_sim.sh` that prints and runs the exact command, for the analytical, ns-3 or htsim
network backend (--astra-sim-backend; ns-3 and htsim inputs in astra_ns3.py, astra_htsim.py).

The cluster is `world_size / gpus_per_node` nodes. ASTRA-sim's analytical network numbers NPUs
dimension by dimension, innermost first, so NPU r sits at position r % gpus_per_node of node
r // gpus_per_node: dimension 0 is scale-up (inside a node), dimension 1 scale-out. Keys and
values follow ASTRA-sim's documented inputs (examples/network/analytical, inputs/system).

A caveat of ASTRA-sim's analytical backend, not of the bundle: a send/recv travels on the first
(innermost) dimension in which the two NPUs' addresses differ, so a message between different
positions of different nodes is charged at scale-up bandwidth.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, fields
from pathlib import Path

from traceforge import __version__
from traceforge.base.errors import UserError
from traceforge.machine.astra import (
    ASTRA_BINARY,
    ASTRA_NO_FILE,
    ASTRA_REPO,
    LOG_DIR,
    NETWORK_FILE,
    REMOTE_MEMORY_FILE,
    RUN_SCRIPT,
    SYSTEM_FILE,
    TOPOLOGIES,
    astra_gbps,
)
from traceforge.machine.cluster import Cluster
from traceforge.machine.fabric import Fabric
from traceforge.machine.gpus import GPUS
from traceforge.write import astra_htsim, astra_ns3
from traceforge.write.astra_fabric import job_dimensions

__all__ = ["AstraOptions", "write_astra_bundle"]

BACKENDS = ("analytical", "ns3", "htsim")

@dataclass(frozen=True)
class Backend:
    binary: str
    build: str  # how ASTRA-sim's repository builds it, and where the binary lands


BACKEND_INFO = {
    "analytical": Backend(ASTRA_BINARY, "./build/astra_analytical/build.sh, then "
                          f"build/astra_analytical/build/bin/{ASTRA_BINARY}"),
    "ns3": Backend("ns3.*-AstraSimNetwork-default", "./build/astra_ns3/build.sh, then "
                   "extern/network_backend/ns-3/build/scratch/ns3.*-AstraSimNetwork-default "
                   "(* is ns-3's version)"),
    "htsim": Backend("AstraSim_HTSim", "./build/astra_htsim/build.sh, then build/astra_htsim/build/bin/AstraSim_HTSim"),
}


@dataclass(frozen=True)
class AstraOptions:
    """How the bundle is written, beside the machine (traceforge.machine.cluster.Cluster) it describes."""

    astra_sim_backend: str = "analytical"
    scale_out_fabric: str = "fat-tree"  # ns-3's physical scale-out: fat-tree or rail-optimized
    astra_sim_trace: bool = False  # the system's trace-enabled: ASTRA-sim logs every node it issues
    fabric: Fabric | None = None  # --fabric: every backend's network from this description (write/astra_fabric.py)

    @classmethod
    def from_options(cls, **options) -> AstraOptions:
        """AstraOptions from CLI options named like its fields; None means the default."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in known and v is not None})


# Help lines for the bundle's own CLI flags; the machine's flags come from traceforge.machine.cluster.FIELDS.
OPTIONS_HELP = {
    "astra_sim_backend": "ASTRA-sim network backend the bundle is for: analytical (default), ns3 or htsim.",
    "scale_out_fabric": "ns-3 scale-out fabric: fat-tree (default) or rail-optimized.",
    "astra_sim_trace": "Set the system's trace-enabled: ASTRA-sim logs every node it issues and completes "
                       "(in its log folder's log.log).",
}


@dataclass(frozen=True)
class Dimension:
    topology: str  # ASTRA-sim's spelling
    npus: int
    bandwidth: float
    latency: float
    role: str  # scale-up | scale-out, or the fabric level (nvlink, leaf, spine, core)


def _topology(name: str) -> str:
    """ASTRA-sim's spelling of a Cluster topology (already checked by Cluster)."""
    return TOPOLOGIES[name]


def network_dimensions(world_size: int, cluster: Cluster, fabric: Fabric | None = None) -> list[Dimension]:
    """[scale-up, scale-out], or the single dimension that has more than one NPU; with a fabric,
    one Switch dimension per level the job spans (write/astra_fabric.py).

    ASTRA-sim wants every dimension to hold more than one NPU and their product to be the
    world size. The cluster's values were checked when it was made (traceforge.machine.cluster)."""
    if fabric is not None:
        return [Dimension("Switch", d.npus, d.level.gbps, float(d.level.latency_ns), d.level.name)
                for d in job_dimensions(fabric, world_size, cluster.scale_up_latency, cluster.scale_out_latency)]
    gpn = cluster.gpus_per_node
    up_topo, out_topo = _topology(cluster.scale_up_topology), _topology(cluster.scale_out_topology)
    if world_size < 2:
        raise UserError(f"ASTRA-sim needs at least 2 NPUs, this trace set has {world_size}: drop --astra-sim or use more GPUs")
    up = Dimension(up_topo, min(gpn, world_size), float(cluster.scale_up_bw), float(cluster.scale_up_latency), "scale-up")
    if world_size <= gpn:
        return [up]
    if world_size % gpn:
        raise UserError(
            f"world size {world_size} is not a multiple of --gpus-per-node {gpn}: ASTRA-sim's network needs whole nodes; "
            f"choose --gpus-per-node from the divisors of {world_size}"
        )
    out = Dimension(out_topo, world_size // gpn, float(cluster.scale_out_bw), float(cluster.scale_out_latency), "scale-out")
    return [out] if gpn == 1 else [up, out]


def backend(options: AstraOptions) -> str:
    name = str(options.astra_sim_backend).strip().lower().replace("-", "")
    if name not in BACKENDS:
        raise UserError(f"--astra-sim-backend {options.astra_sim_backend!r} is not known: use analytical, ns3 or htsim")
    return name


def check_bundle(out_dir: Path, world_size: int, cluster: Cluster, options: AstraOptions = AstraOptions()) -> list[Dimension]:
    """Everything that could refuse the bundle, checked before any trace is written."""
    where = os.path.abspath(out_dir)
    if ASTRA_NO_FILE in where:
        raise UserError(
            f"output path {where} contains {ASTRA_NO_FILE!r}: ASTRA-sim skips any comm-group file whose path "
            f"contains it, and every collective would fail to find its group; choose another -o/--out"
        )
    name = backend(options)
    if options.fabric is not None:
        return _check_fabric(name, world_size, cluster, options)
    dims = network_dimensions(world_size, cluster)
    if name == "ns3":
        astra_ns3.check(_topology(cluster.scale_up_topology), _topology(cluster.scale_out_topology),
                        options.scale_out_fabric)
    elif options.scale_out_fabric != AstraOptions.scale_out_fabric:
        raise UserError("--scale-out-fabric shapes the ns-3 backend's network: add --astra-sim-backend ns3, or drop it")
    return dims


def _check_fabric(name: str, world_size: int, cluster: Cluster, options: AstraOptions) -> list[Dimension]:
    assert options.fabric is not None
    if options.scale_out_fabric != AstraOptions.scale_out_fabric:
        raise UserError("--scale-out-fabric is the ns-3 bundle's own fabric and --fabric describes it: drop one")
    if name == "htsim":  # one logical dimension, as without a fabric (htsim has no scale-up network)
        astra_htsim.fabric_topology_text(options.fabric, world_size, cluster.scale_out_latency)
        return [Dimension("Switch", world_size, options.fabric.nic_gbps, float(cluster.scale_out_latency), "job")]
    if name == "ns3":
        astra_ns3.fabric_network(options.fabric, world_size, cluster.scale_up_latency, cluster.scale_out_latency)
        return _logical_dimensions(world_size, cluster, options.fabric)
    return network_dimensions(world_size, cluster, options.fabric)


def fabric_summary(world_size: int, cluster: Cluster, options: AstraOptions) -> str:
    """One line: how the bundle maps its fabric (what generate prints under the bundle's path)."""
    assert options.fabric is not None
    name = backend(options)
    dims = _check_fabric(name, world_size, cluster, options)
    shape = " x ".join(f"{d.npus} ({d.role})" for d in dims)
    if name == "ns3":
        net = astra_ns3.fabric_network(options.fabric, world_size, cluster.scale_up_latency, cluster.scale_out_latency)
        return f"ns-3 network of fabric {options.fabric.name}: {len(net.switches)} switches, {len(net.links)} links; logical {shape}"
    if name == "htsim":
        head = astra_htsim.fabric_topology_text(options.fabric, world_size, cluster.scale_out_latency).split("\n")[0]
        return f"htsim fat tree of fabric {options.fabric.name}: {head.lstrip('# ')}"
    return (f"analytical network of fabric {options.fabric.name}: {shape} NPUs at "
            + ", ".join(f"{d.bandwidth:g}" for d in dims) + " GB/s, " + ", ".join(f"{d.latency:g}" for d in dims) + " ns")


def _logical_dimensions(world_size: int, cluster: Cluster, fabric: Fabric) -> list[Dimension]:
    """ns-3's logical dimensions on a fabric: the analytical backend's where the placement is a
    product of equal dimensions, else one dimension of every NPU (ns-3 routes any placement)."""
    try:
        return network_dimensions(world_size, cluster, fabric)
    except UserError:
        if world_size < 2:
            raise
        return [Dimension("Switch", world_size, fabric.nic_gbps, float(cluster.scale_out_latency), "job")]


PREFERRED_DATASET_SPLITS = 4  # system json: chunks per collective (ASTRA-sim divides by it)


def check_messages(programs, options: AstraOptions) -> None:
    """Message-size limits of the chosen backend, from the stage programs about to be written."""
    if backend(options) != "ns3":
        return
    p2p = max((op.comm_size for prog in programs for op in prog.ops if op.peer), default=0)
    coll = max((op.comm_size for prog in programs for op in prog.ops if op.group), default=0)
    astra_ns3.check_messages(p2p, coll, PREFERRED_DATASET_SPLITS)


def bundle_files(options: AstraOptions) -> tuple[str, ...]:
    """The files a bundle for this backend holds."""
    name = backend(options)
    common = (SYSTEM_FILE, REMOTE_MEMORY_FILE, RUN_SCRIPT)
    if name == "ns3":
        return common + astra_ns3.FILES
    if name == "htsim":
        return (NETWORK_FILE, *common, astra_htsim.TOPOLOGY_FILE)
    return (NETWORK_FILE, *common)


def _num(x: float) -> str:
    return repr(float(x))


def network_yaml(dims: list[Dimension], world_size: int) -> str:
    shape = " x ".join(f"{d.npus} ({d.role})" for d in dims)
    asked = ", ".join(f"{_num(d.bandwidth)}" for d in dims)
    row = lambda values: "[ " + ", ".join(values) + " ]"  # noqa: E731
    return (
        f"# ASTRA-sim analytical network for {world_size} NPUs: {shape}.\n"
        "# One entry per dimension, innermost first: NPU r is r % npus_count[0] in dimension 0.\n"
        f"# Bandwidth: ASTRA-sim multiplies these by 2^30 bytes/s, so they are {asked} x 10^9 bytes/s / 2^30.\n"
        f"topology: {row(d.topology for d in dims)}\n"
        f"npus_count: {row(str(d.npus) for d in dims)}\n"
        f"bandwidth: {row(_num(astra_gbps(d.bandwidth)) for d in dims)}  # 2^30 B/s per link, per direction\n"
        f"latency: {row(_num(d.latency) for d in dims)}  # ns\n"
    )


def system_config(dims: list[Dimension], spec: dict, trace: bool = False) -> dict:
    """ASTRA-sim's system input. Compute nodes carry their own duration, so the roofline stays
    off; its peak FLOP/s and memory bandwidth are the achieved figures our durations assume
    (datasheet x --gpu-efficiency), so turning it on models compute the same way."""
    per_dim = ["ring"] * len(dims)
    doc = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": 10,
        "active-chunks-per-dimension": 1,
        # Chunks per collective; ASTRA-sim divides by it, so it must be >= 1.
        "preferred-dataset-splits": PREFERRED_DATASET_SPLITS,
        "all-reduce-implementation": per_dim,
        "all-gather-implementation": per_dim,
        "reduce-scatter-implementation": per_dim,
        "all-to-all-implementation": per_dim,
        "collective-optimization": "localBWAware",
        "local-reduction-delay": 1,
        "roofline-enabled": 0,
        "boost-mode": 0,
    }
    if trace:
        doc["trace-enabled"] = 1
    tflops, hbm = spec.get("gpu_tflops"), spec.get("gpu_hbm_gbps")
    if tflops and hbm:
        # The per-kernel model's GEMM and HBM fractions, unless a flat --gpu-efficiency overrides it.
        cal = getattr(GPUS.get(spec.get("gpu", "")), "calibration", None)
        flat = spec.get("gpu_efficiency")
        flops_eff, mem_eff = (flat, flat) if flat or cal is None else (cal.gemm, cal.memory)
        doc["peak-perf"] = round(tflops * (flops_eff or 1.0), 3)  # TFLOP/s
        doc["local-mem-bw"] = round(hbm * (mem_eff or 1.0), 3)  # GB/s
    return doc


REMOTE_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}


def run_args(name: str, prefix: str, comm_group_file: str) -> list[str]:
    """The backend's command-line options (all relative to the bundle's directory)."""
    args = [
        f"--workload-configuration={prefix}",
        f"--comm-group-configuration={comm_group_file}",
        f"--system-configuration={SYSTEM_FILE}",
        f"--remote-memory-configuration={REMOTE_MEMORY_FILE}",
    ]
    if name == "ns3":  # ns-3's own CommandLine: no logging folder (logs go to ./log)
        return args + [f"--network-configuration={astra_ns3.CONFIG_FILE}",
                       f"--logical-topology-configuration={astra_ns3.LOGICAL_FILE}"]
    return args + [f"--network-configuration={NETWORK_FILE}"]


def run_script(prefix: str, comm_group_file: str, world_size: int, dims: list[Dimension],
               name: str = "analytical") -> str:
    """A bash script that works from any directory: it cds into its own and uses relative paths."""
    info = BACKEND_INFO[name]
    quoted = "\n    ".join(shlex.quote(a) for a in run_args(name, prefix, comm_group_file))
    shape = " x ".join(str(d.npus) for d in dims)
    extra = {
        "analytical": '    --logging-folder="$log"',
        "ns3": "",
        # htsim's options follow --htsim_opts; its simulated time ends at 4 s (HTSimProtoTcp.cc).
        "htsim": f'    --logging-folder="$log"\n    --htsim_opts -topo {astra_htsim.TOPOLOGY_FILE} -o "$log/htsim.dat"',
    }[name]
    prepare = f'mkdir -p "$log" {astra_ns3.OUTPUT_DIR}' if name == "ns3" else 'mkdir -p "$log"'
    return f"""#!/usr/bin/env bash
# Simulate this trace set with ASTRA-sim's {name} network backend ({world_size} NPUs, logical network {shape}).
# Written by traceforge {__version__}.
#
# usage: ./{RUN_SCRIPT} [path/to/{info.binary}]   (or set $ASTRA_SIM)
# Output and logs go to ${{ASTRA_LOG_DIR:-{LOG_DIR}}}/ beside this script. ASTRA-sim exits 0 even when ranks
# stall, so this script checks that every rank printed "sys[i] finished" and exits 1 otherwise.
set -euo pipefail
cd "$(dirname "${{BASH_SOURCE[0]}}")"

bin="${{1:-${{ASTRA_SIM:-}}}}"
log="${{ASTRA_LOG_DIR:-{LOG_DIR}}}"
args=(
    {quoted}
{extra}
)

echo "cd $(printf %q "$PWD") && ${{bin:-\\$ASTRA_SIM}} ${{args[*]}}"
if [ -z "$bin" ] || ! command -v "$bin" >/dev/null 2>&1; then
    echo "ASTRA-sim binary not found${{bin:+: $bin}}." >&2
    echo "Get it: git clone --recursive {ASTRA_REPO} && cd astra-sim && {info.build}," >&2
    echo "and pass that binary as the first argument or set ASTRA_SIM." >&2
    exit 127
fi

{prepare}
status=0
"$bin" "${{args[@]}}" >"$log/stdout.txt" 2>&1 || status=$?
grep 'sys\\[[0-9]*\\] finished' "$log/stdout.txt" | head -n 16 || true
finished=$(grep -c 'sys\\[[0-9]*\\] finished' "$log/stdout.txt" || true)
if [ "$status" -ne 0 ] || [ "$finished" -ne {world_size} ]; then
    tail -n 20 "$log/stdout.txt" >&2
    echo "{RUN_SCRIPT}: only $finished of {world_size} ranks finished (exit code $status); full output in $log/stdout.txt" >&2
    exit 1
fi
echo "{RUN_SCRIPT}: all {world_size} ranks finished; full output in $log/stdout.txt"
"""


def bundle_texts(manifest: dict, cluster: Cluster, options: AstraOptions = AstraOptions()) -> dict[str, str]:
    """File name -> content of every bundle file, for a trace set's manifest."""
    world = int(manifest["world_size"])
    prefix = manifest.get("prefix", "workload")
    comm_groups = manifest.get("files", {}).get("comm_groups", "comm_group.json")
    if ASTRA_NO_FILE in comm_groups:
        raise UserError(f"the comm-group file name {comm_groups!r} contains {ASTRA_NO_FILE!r}, which ASTRA-sim reads as 'no file'")
    name = backend(options)
    fabric = options.fabric
    dims = network_dimensions(world, cluster) if fabric is None else _check_fabric(name, world, cluster, options)
    if name == "htsim" and fabric is None:
        # htsim has no scale-up network (every GPU is a host of one fat tree): one logical
        # dimension of all NPUs, so collectives do not pretend to a hierarchy htsim cannot carry.
        dims = [Dimension("Switch", world, float(cluster.scale_out_bw), float(cluster.scale_out_latency),
                          "scale-out")]
    texts = {
        SYSTEM_FILE: json.dumps(system_config(dims, manifest.get("spec", {}), options.astra_sim_trace),
                                indent=1) + "\n",
        REMOTE_MEMORY_FILE: json.dumps(REMOTE_MEMORY, indent=1) + "\n",
        RUN_SCRIPT: run_script(prefix, comm_groups, world, dims, name),
    }
    if name == "ns3":
        texts.update(astra_ns3.texts(world, [d.npus for d in dims], dims[0].topology if dims[0].role == "scale-up"
                                     else "Switch", cluster, options.scale_out_fabric, options.fabric))
    else:  # htsim sizes its logical topology from the analytical file (npus_count only)
        texts[NETWORK_FILE] = network_yaml(dims, world)
    if name == "htsim" and fabric is not None:
        texts[astra_htsim.TOPOLOGY_FILE] = astra_htsim.fabric_topology_text(fabric, world, cluster.scale_out_latency)
    elif name == "htsim":
        texts[astra_htsim.TOPOLOGY_FILE] = astra_htsim.topology_text(world, cluster.gpus_per_node, cluster.scale_out_bw,
                                                                     cluster.scale_out_latency)
    assert set(texts) == set(bundle_files(options))
    return texts


def write_astra_bundle(out_dir: Path, manifest: dict, cluster: Cluster | None = None,
                       options: AstraOptions | None = None) -> list[Path]:
    """Write the ASTRA-sim bundle into a written trace set's directory; return the files written.

    Call check_bundle before writing the traces so a refusal leaves nothing behind."""
    out_dir = Path(out_dir)
    cluster = cluster or Cluster()
    options = options or AstraOptions()
    check_bundle(out_dir, int(manifest["world_size"]), cluster, options)
    texts = bundle_texts(manifest, cluster, options)
    written = []
    for name, text in texts.items():
        path = out_dir / name
        tmp = out_dir / f".{name}.partial-{os.getpid()}"
        tmp.write_text(text)
        if name == RUN_SCRIPT:
            tmp.chmod(0o755)
        tmp.replace(path)
        written.append(path)
    return written
