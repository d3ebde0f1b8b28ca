"""Human output of a report (rich tables): one set, or two side by side (--compare)."""

from __future__ import annotations

from rich.table import Table

from traceforge.base.tables import Fit, print_fitted, print_prose
from traceforge.config import sizes_text, spec_label
from traceforge.machine.gpus import capacity_text
from traceforge.simulate.view import _span
from traceforge.traffic.dimensions import DimTraffic

TEST_ROWS_SHOWN = 16
NODE_MATRIX_SHOWN = 8


def fmt_bytes(value: float) -> str:
    if value == 0:
        return "0"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            v = value / scale
            return f"{v:.4g} {unit}" if v < 1000 else f"{v:,.0f} {unit}"
    return f"{value:.0f} B"


def fmt_count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


SHORT = {"AllReduce": "AR", "AllGather": "AG", "ReduceScatter": "RS", "AllToAll": "A2A"}


def _range(values: list[float], fmt) -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def _groups(d: DimTraffic) -> str:
    sizes = "/".join(map(str, sorted(d.group_sizes)))
    noun = "pairs" if d.kinds == {"p2p"} else "groups"
    return f"{len(d.groups)} {noun} of {sizes}, {len(d.crossing)} cross"


def _sizes(d: DimTraffic) -> str:
    top = sorted(d.histogram.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{fmt_bytes(k)}+: {fmt_count(v)}" for k, v in top)


def _label(report, s: dict) -> str:
    """The spec's name as generate's summary gives it (config.spec_label): the manifest's spec."""
    spec = (getattr(report.traces, "manifest", None) or {}).get("spec")
    return spec_label(spec) if isinstance(spec, dict) else str(s["preset"])


def _layout_sizes(report, s: dict) -> str:
    """The parallel sizes as generate's summary gives them (config.sizes_text: ep and cp too)."""
    spec = (getattr(report.traces, "manifest", None) or {}).get("spec")
    return sizes_text(spec if isinstance(spec, dict) else s)


def _header(report) -> str:
    src = report.source()
    text = f"{src['directory']} ({src['prefix']}.<rank>.et, {report.world} ranks, {src['steps']} step(s)"
    if "spec" in src:
        s = src["spec"]
        text += f"; {_label(report, s)}: {_layout_sizes(report, s)}, order {src.get('order')}"
        if s.get("pp", 1) > 1 and s.get("schedule"):
            v = s.get("virtual_stages") or 1
            text += f", schedule {s['schedule']}" + (f" v={v}" if v > 1 else "")
    return text + f") on {report.nodes} node(s) of {report.gpus_per_node} GPUs"


def dimension_table(report) -> Table:
    t = Table(title="Traffic per dimension, per step (ranges over ranks; wire bytes under ring algorithms; "
                    "scale-up/out summed over ranks)", title_justify="left")
    for col in ("dim", "groups (cross = span nodes)", "ops/rank", "bytes/rank by type", "wire/rank", "scale-up",
                "scale-out", "ops by size (all ranks)"):
        t.add_column(col, justify="left" if col[0] in "dgbo" else "right")
    for d in report.dims:
        by_type = "\n".join(f"{SHORT.get(ty, ty)} {_range(d.type_bytes(ty), fmt_bytes)}" for ty in d.types())
        t.add_row(d.dim + ("*" if d.inferred else ""), _groups(d), _range(d.per_rank("ops"), fmt_count),
                  by_type, _range(d.per_rank("wire"), fmt_bytes), fmt_bytes(d.intra_total), fmt_bytes(d.inter_total), _sizes(d))
    intra = sum(d.intra_total for d in report.dims)
    inter = sum(d.inter_total for d in report.dims)
    t.add_row("all", "", "", "", "", fmt_bytes(intra), fmt_bytes(inter), "", style="bold")
    return t


def node_table(report) -> Table | None:
    if report.nodes > NODE_MATRIX_SHOWN or report.nodes < 2:  # before building it: dense, nodes^2
        return None
    m = report.node_matrix()
    t = Table(title="Node x node wire bytes per step", caption="row sends to column; the diagonal stays inside the node",
              title_justify="left", caption_justify="left")
    t.add_column("src \\ dst")
    for j in range(m.shape[1]):
        t.add_column(f"node {j}", justify="right")
    for i, row in enumerate(m):
        t.add_row(f"node {i}", *(fmt_bytes(v) for v in row))
    return t


def members_text(ranks) -> str:
    """A group's ranks as a table shows them, short enough never to be split across lines: up to
    four whole, a longer even run by its ends and step ({24,…,31}, {0,4,…,28}), anything else by
    its first four and an ellipsis (test_matrix.csv/json hold every member)."""
    ranks = [int(r) for r in ranks]
    if len(ranks) <= 4:
        return "{" + ",".join(map(str, ranks)) + "}"
    step = ranks[1] - ranks[0]
    if step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:], strict=False)):
        return f"{{{ranks[0]},…,{ranks[-1]}}}" if step == 1 else f"{{{ranks[0]},{ranks[1]},…,{ranks[-1]}}}"
    return "{" + ",".join(map(str, ranks[:4])) + ",…}"


def test_table(report) -> Table:
    rows = report.tests
    where = getattr(report, "written_to", None)
    full = f"full memberships in {where}/test_matrix.csv and .json" if where else "--out DIR writes full memberships"
    t = Table(title=f"Collective test matrix ({len(rows)} rows; {full})", title_justify="left")
    fabric = getattr(report, "fabric", None)
    cols = ("dim", "op", "size", "group", "groups", "x/step", "cross") + (("tiers",) if fabric is not None else ()) \
        + ("first memberships",)
    for col in cols:
        t.add_column(col, justify="left" if col in ("dim", "op", "first memberships", "tiers") else "right")
    for i, r in enumerate(rows[:TEST_ROWS_SHOWN]):
        shown = " ".join(members_text(m) for m in r.memberships[:3])
        if len(r.memberships) > 3:
            shown += " ..."
        tiers = (" ".join(f"{k} {n}" for k, n in fabric.row_tiers(i).items()),) if fabric is not None else ()
        t.add_row(r.dim, r.collective, fmt_bytes(r.comm_size), str(r.group_size), str(r.groups), fmt_count(r.per_step),
                  str(r.groups_crossing_nodes), *tiers, shown)
    if len(rows) > TEST_ROWS_SHOWN:
        t.caption = f"... {len(rows) - TEST_ROWS_SHOWN} more rows"
    return t


def fabric_tables(report) -> list:
    """report --fabric: the fabric, bytes per tier and dimension, the hottest links, ECMP."""
    ft = getattr(report, "fabric", None)
    if ft is None:
        return []
    f = ft.fabric
    job = ft.to_json()["job"]
    head = (f"Fabric {f.describe()}\n  the job: {job['nodes']:,} nodes on slots {job['slots']}, {ft.leaves:,} "
            f"{f.tiers[0].name} switches" + (f", {ft.pods} pod(s)" if len(f.tiers) > 1 else "")
            + f"; {job['groups']:,} groups, {job['network_flows']:,} network flows")
    dims = ft.groups.dims
    t = Table(title="Bytes per tier per step, by dimension (a tier's up links; at line rate: all of them busy)",
              title_justify="left")
    for col in ("tier", "up links", "GB/s each", "bytes", *dims, "at line rate", "hottest link", "its time"):
        t.add_column(col, justify="left" if col in ("tier", "hottest link") else "right")
    seconds = ft.link_seconds()
    for tier in ft.tiers:
        hot = tier.hottest
        t.add_row(tier.name, f"{tier.up_links:,}", f"{tier.gbps:g}", fmt_bytes(tier.bytes),
                  *(fmt_bytes(tier.by_dim.get(d, 0.0)) for d in dims), fmt_seconds(tier.seconds),
                  ft.routed.name(hot) if hot is not None else "-", fmt_seconds(seconds[hot]) if hot is not None else "-")
    h = Table(title="Hottest links (bytes per step over the link's speed)", title_justify="left")
    for col in ("link", "tier", "bytes", "flows", "at line rate", "by dimension", "largest groups on it"):
        h.add_column(col, justify="left" if col in ("link", "tier", "by dimension", "largest groups on it") else "right")
    for link in ft.hottest():
        doc = ft.link_json(link)
        riders = "; ".join(f"{g['dim']} {_members(g['members'], g['ranks'])} {fmt_bytes(g['bytes_per_step'])}"
                           for g in doc["groups"]) or "-"
        h.add_row(doc["link"], doc["tier"], fmt_bytes(doc["bytes_per_step"]), str(doc["flows"]),
                  fmt_seconds(doc["seconds_at_line_rate"]),
                  " ".join(f"{d} {fmt_bytes(v)}" for d, v in doc["by_dim"].items()), riders)
    lines = []
    for e in ft.ecmp:
        lines.append(f"ECMP over {e.tier}: {e.flows:,} flows from {e.sets:,} sets of {e.ports} links; "
                     f"{e.collided:,} sets put more than an even share on a link; worst: {e.worst_link} carries "
                     f"{e.worst_flows} of {e.worst_switch}'s {e.worst_set_flows} flows (even share {e.even})")
    slowed = ft.slowdown_by_dim()
    if getattr(report, "estimate_mode", "") == "hardware" and getattr(report, "estimate", None) is not None:
        lines.append("Time on the fabric (the hardware estimate's network part x the worst factor of each group's "
                     "class; docs/fabric.md): " + ", ".join(
                         f"{d} x{v['worst']:.3g} ({v['slowed']} of {v['groups']} groups slowed)" for d, v in slowed.items()))
        if ft.healthy_step_us is not None:
            step = report.estimate.critical.total
            whole = ft.healthy_step_us
            lines.append(f"With {', '.join(n for n in _failures(f))}: step {step / 1e3:,.3f} ms against "
                         f"{whole / 1e3:,.3f} ms on the whole fabric ({100 * (step - whole) / whole:+.2f}%)")
    elif slowed:
        lines.append("Time on the fabric: the --estimate hardware replay charges each group's link sharing; this "
                     "estimate does not")
    return [head, t, h, *lines]


def _failures(f) -> list[str]:
    return ([f"{n} failed" for n in f.failed_links] + [f"{n} at {x:g} of its speed" for n, x in f.degraded_links])


def _members(members: list, ranks: int) -> str:
    shown = [m for m in members if m != "..."][:4]
    return "{" + ",".join(map(str, shown)) + (",..." if ranks > len(shown) else "") + "}" + (f" ({ranks})" if ranks > 4 else "")


def fmt_seconds(value: float) -> str:
    if value == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"


def memory_lines(report) -> list[str]:
    """Peak memory per GPU by pipeline stage, from the manifest's spec (traceforge memory's model)."""
    m = getattr(report, "memory", None)
    if m is None:
        return []
    worst = m.worst
    by_stage = " ".join(f"{s.peak / 1e9:.1f}" for s in m.stages)
    verdict = {"fits": "fits", "tight": "tight (fits without the allocator's reserve)"}.get(m.verdict, "does NOT fit")
    return [f"Memory per GPU (the manifest's spec; 'traceforge memory' for the breakdown): peak {worst.peak / 1e9:,.1f} GB "
            f"on stage {worst.stage} ({worst.peak_when}) of the {m.gpu}'s {capacity_text(m.gpu_memory_bytes)}: {verdict}; "
            f"by stage {by_stage} GB"]


def estimate_lines(report) -> list[str]:
    e = report.estimate
    if e is None:
        return []
    c, m = e.critical, e.mean
    link = report.link

    def pct(x: float, total: float) -> str:
        return f"{100 * x / total:.0f}%" if total else "-"

    net = getattr(report, "network", None)
    mode = getattr(report, "estimate_mode", "astra-sim")
    shape = " x ".join(f"{d.npus} {d.topology}" for d in net.dims) if net is not None else ""
    links = (f"scale-up {link.scale_up_bw:g} GB/s and {link.scale_up_latency:g} ns, scale-out {link.scale_out_bw:g} GB/s "
             f"and {link.scale_out_latency:g} ns (once per collective or send)")
    if mode == "hardware" and link.nccl is not None:
        model = (f"  hardware mode: an analytical replay, not a simulation: collectives and sends as NCCL's cost model "
                 f"times them ({link.nccl.generation}: NCCL's algorithms, protocols and latencies; scale-up "
                 f"{link.scale_up_bw:g} GB/s line rate, {link.nics_per_node} NICs per node sharing "
                 f"{link.scale_out_bw * link.gpus_per_node:g} GB/s); one NCCL stream per group and per send peer, "
                 f"concurrent transfers share a tier's bandwidth (--estimate astra-sim: ASTRA-sim's one "
                 f"send/collective in flight per rank)")
    elif mode == "hardware":
        model = (f"  hardware mode: an analytical alpha-beta replay, not a simulation: {links}; one NCCL stream per group "
                 f"and per send peer, concurrent transfers share a tier's bandwidth (--estimate astra-sim: ASTRA-sim's "
                 f"one send/collective in flight per rank)")
    elif net is not None:
        model = (f"  astra-sim mode: ASTRA-sim's analytical arithmetic (chunks, ring steps, per-hop latency) on {shape} "
                 f"from astra_network.yml; not a simulation")
    else:
        model = (f"  astra-sim mode: an analytical alpha-beta replay, not a simulation: {links}, one send/collective "
                 f"in flight per rank as ASTRA-sim (--estimate hardware: one stream per group)")
    return [
        f"Step time estimate ({mode} mode) {c.total / 1e3:,.3f} ms (critical rank {e.critical_rank}): compute {c.compute / 1e3:,.2f} ms "
        f"({pct(c.compute, c.total)}), exposed communication {c.exposed_comm / 1e3:,.2f} ms ({pct(c.exposed_comm, c.total)}), "
        f"idle {c.idle / 1e3:,.2f} ms ({pct(c.idle, c.total)})",
        f"  mean over ranks: compute {pct(m.compute, m.total)}, exposed communication {pct(m.exposed_comm, m.total)}, "
        f"idle {pct(m.idle, m.total)} (the pipeline bubble and other waits); "
        f"{e.classes} distinct rank behaviours replayed",
        model,
    ]


def simulation_lines(report) -> list[str]:
    v = getattr(report, "sim_view", None)
    if v is None:
        return []
    lines = [f"Simulated step {v.step_time_us / 1e3:,.3f} ms ({report.simulation.simulator.get('name', 'ASTRA-sim')}; "
             f"{v.finished}/{v.world} ranks finished)"]
    if report.estimate is not None and v.step_time_us:
        est = report.estimate.critical.total
        lines.append(f"  estimate {est / 1e3:,.3f} ms, {100 * (est / v.step_time_us - 1):+.1f}% against the simulation")
    how = "from per-node times" if v.exact else "from ASTRA-sim's totals: waiting counts as exposed communication"
    lines.append(f"  per rank class ({how}):")
    for ranks, s in v.classes[:24]:
        def pct(x: float, total: float = s.total) -> str:
            return f"{100 * x / total:.0f}%" if total else "-"
        lines.append(f"    ranks {_span_text(ranks)}: compute {s.compute / 1e3:,.3f} ms ({pct(s.compute)}), "
                     f"exposed communication {s.exposed_comm / 1e3:,.3f} ms ({pct(s.exposed_comm)}), "
                     f"idle {s.idle / 1e3:,.3f} ms ({pct(s.idle)})")
    if len(v.classes) > 24:
        lines.append(f"    ... {len(v.classes) - 24} more classes in report.json")
    if v.exposed_by_dim:
        lines.append("  exposed communication per dimension (mean per rank): " + ", ".join(
            f"{d} {us / 1e3:,.3f} ms" for d, us in sorted(v.exposed_by_dim.items(), key=lambda x: -x[1])))
    return lines


def _span_text(ranks: list[int]) -> str:
    return _span(ranks)
def job_table(report) -> Table | None:
    """A combined set: each job's wire bytes per step (all its ranks), by dimension."""
    jobs = report.job_traffic()
    if not jobs:
        return None
    dims = sorted({d for j in jobs for d in j["by_dim"]}, key=lambda d: [x.dim for x in report.dims].index(d))
    t = Table(title="Traffic per job, per step (wire bytes, all its ranks)", title_justify="left")
    for col in ("job", "source", "ranks", *dims, "scale-up", "scale-out"):
        t.add_column(col, justify="left" if col in ("job", "source") else "right")
    for j in jobs:
        t.add_row(str(j["job"]), str(j["source"]), str(j["ranks"]), *(fmt_bytes(j["by_dim"].get(d, 0.0)) for d in dims),
                  fmt_bytes(j["scale_up"]), fmt_bytes(j["scale_out"]))
    return t


EXPERT_GROUPS_SHOWN = 8


def expert_table(report) -> Table | None:
    """EP groups, hottest first: the link that carries the most and how uneven receiving is."""
    groups = sorted(report.expert_groups, key=lambda g: (-g.hottest[2], g.ranks))
    if not groups:
        return None
    t = Table(title=f"Expert-parallel groups, per step ({len(groups)}; the {min(len(groups), EXPERT_GROUPS_SHOWN)} "
                    "with the hottest links)", title_justify="left")
    for col in ("ranks", "hottest link", "bytes", "x mean link", "imbalance (max/mean received)"):
        t.add_column(col, justify="left" if col in ("ranks", "hottest link") else "right")
    for g in groups[:EXPERT_GROUPS_SHOWN]:
        src, dst, value = g.hottest
        ranks = ",".join(map(str, g.ranks)) if len(g.ranks) <= 8 else f"{g.ranks[0]}..{g.ranks[-1]} ({len(g.ranks)})"
        t.add_row(ranks, f"{src} -> {dst}", fmt_bytes(value), f"{value / g.mean_link:.2f}", f"{g.imbalance:.2f}")
    return t


# Narrow windows: long headers shorten, text cells wrap, then the columns other figures restate go.
DIMENSION_FIT = Fit(short={"groups (cross = span nodes)": "groups", "bytes/rank by type": "bytes/rank",
                           "ops by size (all ranks)": "ops by size"},
                    wrap={"groups (cross = span nodes)": 12, "bytes/rank by type": 16, "ops by size (all ranks)": 14},
                    drop=("ops by size (all ranks)", "ops/rank", "wire/rank"))
TEST_FIT = Fit(wrap={"first memberships": 20, "tiers": 12}, drop=("first memberships", "cross", "groups"))
FABRIC_FIT = Fit(wrap={"largest groups on it": 24, "by dimension": 14, "hottest link": 16},
                 drop=("largest groups on it", "hottest link", "its time", "GB/s each"))
EXPERT_FIT = Fit(short={"imbalance (max/mean received)": "imbalance"}, drop=("x mean link",))


def _prose(console, text: str) -> None:
    """A line of prose: broken at words on a terminal, whole off one (a pipe has no window)."""
    print_prose(console, text)


def render_report(report, console) -> None:
    _prose(console, _header(report))
    print_fitted(console, dimension_table(report), DIMENSION_FIT, "--out DIR")
    if any(d.inferred for d in report.dims):
        _prose(console, "* inferred from group membership (no dim annotation): sizeN-strideS names the group shape")
    nodes = node_table(report)
    if nodes is not None:
        print_fitted(console, nodes, Fit(), "--out DIR")
    print_fitted(console, test_table(report), TEST_FIT, "--out DIR")
    for item in fabric_tables(report):
        if isinstance(item, str):
            console.print(item, markup=False)
        else:
            print_fitted(console, item, FABRIC_FIT, "--json")
    experts = expert_table(report)
    if experts is not None:
        print_fitted(console, experts, EXPERT_FIT, "--json")
    jobs = job_table(report)
    if jobs is not None:
        print_fitted(console, jobs, Fit(wrap={"source": 20}), "--json")
    for line in estimate_lines(report):
        _prose(console, line)
    for line in memory_lines(report):
        _prose(console, line)
    for line in simulation_lines(report):
        _prose(console, line)
    for note in report.notes:
        _prose(console, f"note: {note}")


def render_comparison(a, b, console) -> None:
    """Two sets side by side: where each dimension's wire bytes land, and the step estimates."""
    console.print(f"A: {_header(a)}", markup=False)
    console.print(f"B: {_header(b)}", markup=False)
    t = Table(title="Scale-up vs scale-out wire bytes per step, all ranks", title_justify="left")
    for col in ("dim", "A groups crossing", "A scale-up", "A scale-out", "B groups crossing", "B scale-up", "B scale-out",
                "scale-out B-A"):
        t.add_column(col, justify="left" if col == "dim" else "right")
    names = list(dict.fromkeys([d.dim for d in a.dims] + [d.dim for d in b.dims]))
    for name in names:
        da, db = a.dim(name), b.dim(name)

        def cells(d):
            if d is None:
                return ("-", "-", "-")
            return (f"{len(d.crossing)}/{len(d.groups)}", fmt_bytes(d.intra_total), fmt_bytes(d.inter_total))

        delta = (db.inter_total if db else 0.0) - (da.inter_total if da else 0.0)
        t.add_row(name, *cells(da), *cells(db), ("+" if delta > 0 else "") + fmt_bytes(delta) if delta else "0")
    totals = [sum(d.intra_total for d in r.dims) for r in (a, b)], [sum(d.inter_total for d in r.dims) for r in (a, b)]
    t.add_row("all", "", fmt_bytes(totals[0][0]), fmt_bytes(totals[1][0]), "", fmt_bytes(totals[0][1]),
              fmt_bytes(totals[1][1]), fmt_bytes(totals[1][1] - totals[1][0]), style="bold")
    console.print(t)
    for label, r in (("A", a), ("B", b)):
        lines = estimate_lines(r)
        if lines:
            console.print(f"{label}: {lines[0]}", markup=False)
