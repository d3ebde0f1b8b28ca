"""`traceforge report`: what each parallel dimension puts on which links, from any trace set.

build_report(directory, ...) scans the set once and assembles the per-dimension traffic, the
traffic matrices, the collective test matrix and (optionally) the replayed step-time estimate.
Report.render(console) prints it; Report.to_json() is the machine form; Report.write(out_dir)
writes the CSV / JSON / PNG artifacts (all or nothing).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from traceforge.base.errors import UserError
from traceforge.base.output import atomic_output_dir
from traceforge.config import spec_defaults
from traceforge.ir.enums import COMP
from traceforge.machine.astra import NETWORK_FILE, AstraNetwork, load_network
from traceforge.machine.cluster import Cluster, node_of
from traceforge.machine.fabric import Fabric
from traceforge.machine.gpus import GPUS, gpu_names
from traceforge.machine.nccl import NCCL_VERSION
from traceforge.memory.manifest import manifest_memory, manifest_spec
from traceforge.memory.timeline import counter_events, memory_counter
from traceforge.parallel.layout import Layout
from traceforge.read.traceset import TraceSet, load_trace_set
from traceforge.report.render import render_report
from traceforge.simulate.result import trace_set_identity
from traceforge.simulate.view import simulated_chrome_trace, simulated_view
from traceforge.timing.engine import ASTRA_SIM, HARDWARE, MODES, ReplayResult, ReplayTooBig
from traceforge.timing.replay import replay
from traceforge.timing.timeline import CLASSES, RANK_PID, StepEstimate, chrome_trace, step_estimate, timeline_ranks, write_chrome_trace
from traceforge.traffic.dimensions import DimTraffic, dimension_traffic
from traceforge.traffic.experts import ExpertGroup, expert_groups
from traceforge.traffic.fabric import FabricTraffic, fabric_traffic
from traceforge.traffic.matrix import (
    MAX_DENSE_RANKS,
    PlotUnavailable,
    node_matrix,
    rank_matrix,
    traffic_edges,
    write_heatmap,
    write_links_csv,
    write_matrix_csv,
)
from traceforge.traffic.testmatrix import MatrixRow, collective_test_matrix, write_test_matrix
from traceforge.write.combine import job_of_rank

# The node matrix goes into report.json up to this many nodes (always into its CSV).
JSON_NODE_MATRIX_LIMIT = 256


@dataclass
class Report:
    traces: TraceSet
    gpus_per_node: int
    dims: list[DimTraffic]
    edges: dict[tuple[str, int, int], float]
    tests: list[MatrixRow]
    link: Cluster
    replay: ReplayResult | None = None
    estimate: StepEstimate | None = None
    track_ranks: int | str = CLASSES  # timeline tracks: "classes", "all" or a count of ranks
    network: AstraNetwork | None = None  # the estimate follows ASTRA-sim's analytical backend
    estimate_mode: str = ASTRA_SIM  # the replay's resource model (timing.engine.MODES)
    simulation: Any = None  # a Simulation read back (simulation.json or an ASTRA-sim log)
    sim_view: Any = None
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    memory: Any = None  # memory.MemoryReport of the manifest's spec (our sets only)
    fabric: FabricTraffic | None = None  # the step routed onto --fabric's links
    written_to: Path | None = None  # where write() put the artifacts (the tables say where to find them)

    # -- views ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.traces.program_set.world

    @property
    def nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)

    @property
    def expert_groups(self) -> list[ExpertGroup]:
        """Per EP group: hottest link and imbalance factor (empty without expert traffic)."""
        return expert_groups(self.edges)

    def job_traffic(self) -> list[dict]:
        """A combined set (traceforge combine): each job's wire bytes per step, by dimension and
        split into scale-up and scale-out. Empty for a single job."""
        manifest = self.traces.manifest
        owner = job_of_rank(manifest)
        if not owner or manifest is None:
            return []
        jobs = [{"job": j, "source": job.get("source"), "ranks": len(job.get("ranks", [])), "wire_bytes_per_step": 0.0,
                 "scale_up": 0.0, "scale_out": 0.0, "by_dim": {}} for j, job in enumerate(manifest["jobs"])]
        for d in self.dims:
            for rank, row in d.rows.items():
                job = jobs[owner[rank]]
                job["wire_bytes_per_step"] += row.wire
                job["scale_up"] += row.wire_intra
                job["scale_out"] += row.wire_inter
                job["by_dim"][d.dim] = job["by_dim"].get(d.dim, 0.0) + row.wire
        return jobs

    def dim(self, name: str) -> DimTraffic | None:
        return next((d for d in self.dims if d.dim == name), None)

    def node_matrix(self, dim: str | None = None) -> np.ndarray:
        return node_matrix(self.edges, self.world, self.gpus_per_node, dim)

    def rank_matrix(self, dim: str | None = None) -> np.ndarray:
        if self.world > MAX_DENSE_RANKS:
            raise UserError(f"a rank x rank matrix of {self.world} ranks is too large; use the node matrix or links.csv")
        return rank_matrix(self.edges, self.world, dim)

    def source(self) -> dict:
        ts, ps = self.traces, self.traces.program_set
        out = {"directory": str(ts.directory), "prefix": ts.prefix, "world_size": ps.world, "steps": ps.steps,
               "annotated": ps.annotated, "groups": len(ps.groups)}
        m = ts.manifest or {}
        spec = m.get("spec") if isinstance(m.get("spec"), dict) else None
        if spec:
            shown: dict[str, object] = {k: spec.get(k) for k in ("preset", "tp", "pp", "dp", "num_microbatches",
                                                                 "schedule", "virtual_stages", "dp_mode", "sequence_parallel")}
            defaults = spec_defaults(spec)
            if defaults:  # the defaults that are not the preset's, and where they came from
                shown["defaults"] = defaults
            out["spec"] = shown
            out["order"] = m.get("order")
        return out

    def _timeline_meta(self, ranks: list[int]) -> dict:
        shown: object = ranks if len(ranks) <= 1024 else f"{len(ranks):,} ranks"
        return {"traceforge": "analytical replay, an estimate, not a simulation", "estimate_mode": self.estimate_mode,
                "link_model": self.link_json(),
                "tracks": self.track_ranks, "ranks_shown": shown,
                "step_estimate": self.estimate.to_json() if self.estimate else None}

    def chrome_trace(self) -> dict | None:
        """The timeline as one document in memory (small sets; write_timeline streams it)."""
        if self.replay is None:
            return None
        ranks = timeline_ranks(self.replay, self.track_ranks)
        return chrome_trace(self.replay, ranks, self.gpus_per_node, self._timeline_meta(ranks), self._memory_track())

    def write_timeline(self, path: Path) -> int:
        """Stream timeline.json to path; return the events written (0 and no file without a replay)."""
        if self.replay is None:
            return 0
        ranks = timeline_ranks(self.replay, self.track_ranks)
        with open(path, "w", encoding="utf-8") as stream:
            return write_chrome_trace(self.replay, ranks, self.gpus_per_node, stream, self._timeline_meta(ranks),
                                      self._memory_track())

    def _memory_track(self):
        """The timeline's memory counter per rank class, for sets whose manifest holds the spec
        (ours); None otherwise."""
        if self.replay is None or self.memory is None:
            return None
        spec = manifest_spec(self.traces.manifest)
        if spec is None or spec.world_size != self.world:
            return None
        pp = Layout.from_spec(spec).coords["pp"]
        return memory_track(self.replay, spec, lambda rank: int(pp[rank]))

    def link_json(self) -> dict:
        if self.network is not None:
            return {"model": "ASTRA-sim analytical (congestion-unaware), from " + NETWORK_FILE,
                    "dimensions": [{"topology": d.topology, "npus": d.npus, "bandwidth_gib_per_s": d.bandwidth,
                                    "latency_ns": d.latency} for d in self.network.dims],
                    "preferred_dataset_splits": self.network.splits, "local_mem_bw_gbps": self.network.local_mem_gbps}
        doc: dict[str, Any] = {"intra_gbps": self.link.scale_up_bw, "inter_gbps": self.link.scale_out_bw,
                               "intra_latency_us": self.link.scale_up_latency_us, "inter_latency_us": self.link.scale_out_latency_us}
        if self.estimate_mode == HARDWARE and self.link.nccl is not None:
            doc.update(model=f"NCCL {NCCL_VERSION} cost model ({self.link.nccl.generation})",
                       nics_per_node=self.link.nics_per_node)
        return doc

    def to_json(self) -> dict:
        wire = sum(sum(d.per_rank("wire")) for d in self.dims)
        intra = sum(d.intra_total for d in self.dims)
        doc = {
            "traceforge_report": 1,
            "source": self.source(),
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.nodes,
            "units": "bytes and operations per training step; wire bytes under ring algorithms",
            "dimensions": [dict(d.to_json(), concurrent_groups=max((r.groups for r in self.tests if r.dim == d.dim), default=0))
                           for d in self.dims],
            "totals": {"wire_bytes_per_step": wire, "scale_up_wire_bytes_per_step": intra,
                       "scale_out_wire_bytes_per_step": wire - intra},
            "test_matrix": self.test_matrix_json(),
            "expert_parallel": [g.to_json() for g in self.expert_groups],
            "jobs": self.job_traffic(),
            "timeline": None if self.estimate is None else {
                **self.estimate.to_json(), "estimate_mode": self.estimate_mode, "link_model": self.link_json(),
                **({"estimate": "analytical replay with ASTRA-sim's network arithmetic, not a simulation"}
                   if self.network is not None else {})},
            "simulation": self.simulation_json(),
            "memory": None if self.memory is None else self.memory.to_json(),
            "notes": self.notes,
        }
        if self.nodes <= JSON_NODE_MATRIX_LIMIT:
            doc["node_matrix_bytes_per_step"] = self.node_matrix().tolist()
        if self.fabric is not None:
            doc["fabric"] = self.fabric.to_json()
        return doc

    def test_matrix_json(self) -> list[dict]:
        """The test matrix's rows; with a fabric, each with how many of its groups reach each tier."""
        if self.fabric is None:
            return [r.to_json() for r in self.tests]
        return [dict(r.to_json(), fabric_tiers=self.fabric.row_tiers(i)) for i, r in enumerate(self.tests)]

    def attach_simulation(self, sim) -> None:
        """Show a simulation of this set beside the estimate; refuse one of another set."""
        if not sim.trace_set:  # read from a bare log: tie it to this set, after checking the ranks
            sim.trace_set = trace_set_identity(self.traces.directory, self.world)
            beyond = [r for r in sim.ranks if r >= self.world]
            if beyond:
                raise UserError(f"the ASTRA-sim log has rank {beyond[0]} but {self.traces.directory} has "
                                f"{self.world} ranks; "
                                f"pass the log of a run of this set")
        sim.check_matches(self.traces.directory, self.world)
        self.simulation = sim
        self.sim_view = simulated_view(sim, self.traces.program_set, self.replay.color if self.replay is not None else None)

    def simulation_json(self) -> dict | None:
        if self.simulation is None:
            return None
        doc = self.simulation.summary_json()
        doc["view"] = self.sim_view.to_json()
        if self.estimate is not None and self.sim_view.step_time_us:
            est = self.estimate.critical.total
            doc["estimate_vs_simulation"] = {"estimate_us": est, "simulated_us": self.sim_view.step_time_us,
                                             "error": est / self.sim_view.step_time_us - 1}
        return doc

    # -- output --------------------------------------------------------------------------
    def render(self, console) -> None:
        render_report(self, console)

    def write(self, out_dir: Path, force: bool = False, inputs: Iterable[Path] = ()) -> list[str]:
        """Write every artifact into out_dir (new or empty unless force); return notes (e.g. no PNG).
        ``inputs``: other directories the command reads (e.g. --compare), never replaced."""
        notes: list[str] = []
        self.written_to = Path(out_dir)
        with atomic_output_dir(Path(out_dir), force, inputs=[self.traces.directory, *inputs]) as tmp:
            with open(tmp / "report.json", "w") as stream:  # streamed: the text of json.dumps, not its copy in memory
                json.dump(self.to_json(), stream, indent=1)
                stream.write("\n")
            self._write_dimension_csv(tmp / "traffic_by_dimension.csv")
            self._write_rank_csv(tmp / "traffic_per_rank.csv")
            write_links_csv(self.edges, tmp / "links.csv", self.gpus_per_node)
            if self.nodes <= MAX_DENSE_RANKS:
                nodes = self.node_matrix()
                write_matrix_csv(nodes, tmp / "matrix_nodes.csv", "node")
                heatmaps = [(f"node x node ({self.gpus_per_node} GPUs/node)", nodes, 0)]
            else:  # a dense node matrix would be nodes^2 (2 GB at 16,384 nodes): plot blocks of nodes
                per_block = -(-self.nodes // MAX_DENSE_RANKS)
                blocks = node_matrix(self.edges, self.world, self.gpus_per_node * per_block)
                heatmaps = [(f"node blocks x node blocks ({per_block} nodes each)", blocks, 0)]
                notes.append(f"no matrix_nodes.csv above {MAX_DENSE_RANKS} nodes; links.csv has every rank pair "
                             "with its nodes")
            if self.world <= MAX_DENSE_RANKS:
                ranks = self.rank_matrix()
                write_matrix_csv(ranks, tmp / "matrix_ranks.csv", "rank")
                heatmaps.insert(0, ("rank x rank (lines: node boundaries)", ranks, self.gpus_per_node))
            else:
                notes.append(f"no matrix_ranks.csv above {MAX_DENSE_RANKS} ranks; links.csv has every rank pair")
            if self.fabric is None:
                write_test_matrix(self.tests, tmp / "test_matrix.csv", tmp / "test_matrix.json")
            else:
                tiers = [self.fabric.row_tiers(i) for i in range(len(self.tests))]
                write_test_matrix(self.tests, tmp / "test_matrix.csv", tmp / "test_matrix.json", tiers)
                self.fabric.write(tmp)
            self.write_timeline(tmp / "timeline.json")
            if self.simulation is not None:
                shown = timeline_ranks(self.replay, self.track_ranks) if self.replay is not None \
                    else list(range(min(self.world, 32)))
                sim_trace = simulated_chrome_trace(self.simulation, self.traces.program_set, self.link, shown)
                if sim_trace is not None:
                    (tmp / "timeline_simulated.json").write_text(json.dumps(sim_trace) + "\n")
            try:
                write_heatmap(heatmaps, tmp / "traffic_heatmap.png")
            except PlotUnavailable as exc:
                notes.append(str(exc))
        return notes

    def _write_dimension_csv(self, path: Path) -> None:
        types = sorted({t for d in self.dims for t in d.types()})
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["dim", "inferred", "kinds", "groups", "group_sizes", "groups_crossing_nodes", "ranks",
                        "ops_per_rank_min", "ops_per_rank_max"] + [f"bytes_{t}_per_rank_max" for t in types]
                       + ["wire_per_rank_min", "wire_per_rank_max", "scale_up_wire_total", "scale_out_wire_total",
                          "size_histogram"])
            for d in self.dims:
                ops, wire = d.per_rank("ops"), d.per_rank("wire")
                w.writerow([d.dim, d.inferred, "+".join(sorted(d.kinds)), len(d.groups),
                            " ".join(map(str, sorted(d.group_sizes))), len(d.crossing), len(d.rows), _n(min(ops)), _n(max(ops))]
                           + [_n(max(d.type_bytes(t))) for t in types]
                           + [_n(min(wire)), _n(max(wire)), _n(d.intra_total), _n(d.inter_total),
                              ";".join(f"{k}:{_n(v)}" for k, v in sorted(d.histogram.items()))])

    def _write_rank_csv(self, path: Path) -> None:
        types = sorted({t for d in self.dims for t in d.types()})
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["rank", "node", "dim", "ops"] + [f"bytes_{t}" for t in types] + ["wire", "wire_scale_up", "wire_scale_out"])
            rows = sorted((r for d in self.dims for r in d.rows.values()), key=lambda r: r.rank)
            for r in rows:
                w.writerow([r.rank, node_of(r.rank, self.gpus_per_node), r.dim, _n(r.ops)]
                           + [_n(r.bytes_by_type.get(t, 0.0)) for t in types] + [_n(r.wire), _n(r.wire_intra), _n(r.wire_inter)])


def _n(value: float):
    return int(value) if float(value).is_integer() else round(float(value), 3)


def estimate_mode(directory: Path, estimate: str | None) -> str:
    """The estimate's mode: as given, else astra-sim for a set with an ASTRA-sim bundle (it
    predicts what `traceforge simulate` will say) and hardware otherwise."""
    if estimate is None:
        return ASTRA_SIM if (Path(directory) / NETWORK_FILE).is_file() else HARDWARE
    if estimate not in MODES:
        raise UserError(f"--estimate must be {' or '.join(MODES)}, got {estimate!r}")
    return estimate


def build_report(
    directory: Path, prefix: str | None = None, gpus_per_node: int = 8, *, link: Cluster | None = None,
    timeline: bool = True, track_ranks: int | str = CLASSES, jobs: int | None = None,
    astra_model: bool | None = None, estimate: str | None = None, fabric: Fabric | None = None,
) -> Report:
    """Scan a trace set once and assemble its report. Raises UserError on unreadable input.

    estimate: the replay's mode, astra-sim or hardware (None: estimate_mode's default).
    astra_model: time communication as ASTRA-sim's analytical backend does, with the set's
    astra_network.yml / astra_system.json (None: in astra-sim mode, when the set has them).
    fabric: route the step onto this fabric's links (traffic/fabric.py; docs/fabric.md)."""
    if gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    mode = estimate_mode(directory, estimate)
    if mode == HARDWARE:
        if astra_model:
            raise UserError("--estimate hardware times transfers with the alpha-beta link model: drop --astra-model, "
                            "or use --estimate astra-sim")
        astra_model = False
    link = replace(link or Cluster(), gpus_per_node=gpus_per_node)  # Cluster checks its values (traceforge.machine.cluster)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    ts = load_trace_set(Path(directory), prefix, jobs)
    ps = ts.program_set
    seconds["scan"] = time.perf_counter() - t0
    gpu_note = None
    if mode == HARDWARE and link.gpu is None:  # NCCL's tables for the set's GPU, when it names one they cover
        recorded = (ts.manifest or {}).get("spec")  # a forged manifest may hold anything here
        gpu = recorded.get("gpu") if isinstance(recorded, dict) else None
        gpu = gpu if isinstance(gpu, str) else None
        if gpu in GPUS:
            link = replace(link, gpu=gpu)
        else:
            gpu_note = (f"hardware estimate: collectives on the alpha-beta link model, as "
                        f"{'the set names no GPU' if gpu is None else f'NCCL has no tables for GPU {gpu!r}'} "
                        f"(NCCL's model covers {', '.join(gpu_names())})")
    t0 = time.perf_counter()
    dims = dimension_traffic(ts, gpus_per_node)
    edges = traffic_edges(ts)
    tests = collective_test_matrix(ts, gpus_per_node)
    seconds["traffic"] = time.perf_counter() - t0
    routed = healthy = None
    if fabric is not None:
        t0 = time.perf_counter()
        routed = fabric_traffic(tests, ps.world, fabric)
        if mode == HARDWARE:  # the estimate charges the fabric's sharing (docs/fabric.md, "Time on the fabric")
            link = replace(link, sharing=routed.sharing())
            if fabric.failed_links or fabric.degraded_links:  # and the same fabric whole, to show what they cost
                whole = replace(fabric, failed_links=(), degraded_links=())
                healthy = replace(link, sharing=fabric_traffic(tests, ps.world, whole).sharing())
        seconds["fabric"] = time.perf_counter() - t0
    report = Report(ts, gpus_per_node, dims, edges, tests, link, track_ranks=track_ranks, estimate_mode=mode,
                    notes=list(ts.notes), seconds=seconds, fabric=routed)
    if gpu_note and timeline:
        report.notes.append(gpu_note)

    report.memory, why_not = manifest_memory(ts.manifest)
    if why_not:
        report.notes.append(why_not)
    if astra_model is None:
        astra_model = (Path(directory) / NETWORK_FILE).exists()
    if astra_model:
        report.network = load_network(Path(directory))
        if report.network.world != ps.world:
            raise UserError(f"{Path(directory) / NETWORK_FILE} describes {report.network.world} NPUs but the trace set has "
                            f"{ps.world} ranks; rewrite the bundle with 'traceforge generate --astra-sim'")
    if ps.world % gpus_per_node:
        report.notes.append(f"{ps.world} ranks do not fill nodes of {gpus_per_node} GPUs; the last node is partial")
    if timeline:
        t0 = time.perf_counter()
        try:
            net = report.network
            replay_link = link if net is None or len(net.dims) < 2 else replace(
                link, gpus_per_node=net.dims[0].npus)  # rank classes see its links
            report.replay = replay(ps, replay_link, network=net, mode=mode)
        except ReplayTooBig as exc:
            report.notes.append(f"timeline skipped: {exc}")
        else:
            report.estimate = step_estimate(report.replay, ps.steps)
            if healthy is not None and report.fabric is not None:
                whole_replay = replay(ps, healthy, network=net, mode=mode)
                report.fabric.healthy_step_us = step_estimate(whole_replay, ps.steps).critical.total
            if report.replay.stalled:
                report.notes.append(f"replay stalled: {len(report.replay.stalled)} nodes never ran (a collective or "
                                    f"recv without its partner); run 'traceforge check'")
        seconds["replay"] = time.perf_counter() - t0
    return report


def memory_track(result: ReplayResult, spec, stage_of_rank: Callable[[int], int]) -> Callable[[int], list[dict]]:
    """Class c's memory counter events (traceforge.memory.timeline), pid left open; none when
    its program does not match the spec's schedule."""
    def events(c: int) -> list[dict]:
        program = result.programs[c]
        steps = program.steps.tolist()
        first = min(steps, default=0)
        compute = [kind == COMP and step == first for kind, step in zip(program.types.tolist(), steps, strict=True)]
        stage = stage_of_rank(result.reps[c])
        if not 0 <= stage < spec.pp:
            return []
        points = memory_counter(spec, stage, program.names, compute, result.start[c], result.finish[c])
        return counter_events(points, RANK_PID) if points else []

    return events
