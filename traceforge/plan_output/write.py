"""What `plan --write-top K -o DIR` writes: each chosen layout's trace set in its own folder with
its spec file, plan.csv (every ranked candidate) and a plot of step time and MFU per candidate,
grouped by layout family (PNG with matplotlib, the `plot` extra; SVG written by hand without);
and what `plan --sweep -o DIR` writes: sweep.csv and the plot of the best layout per value.
The whole DIR is written all-or-nothing (base/output.py), and --force replaces only such a DIR."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from traceforge.base.output import is_traceforge_output
from traceforge.config import Spec
from traceforge.plan_output.rows import family

CSV_COLUMNS = ("rank", "tp", "cp", "pp", "dp", "ep", "vp", "micro_batch", "num_microbatches", "schedule", "recompute",
               "dp_mode", "shard_size", "layer_split", "step_ms", "tokens_per_s", "tflops_per_gpu", "mfu", "compute_ms",
               "bubble_ms", "peak_bytes", "headroom_bytes", "allocated_bytes", "reserved_bytes", "verdict", "flags")
SPEC_FILE = "spec.json"
SWEEP_COLUMNS = ("GPUs", "step_ms", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_bytes", "tp", "cp", "pp", "dp",
                 "ep", "vp", "micro_batch", "num_microbatches", "schedule", "recompute", "dp_mode", "flags")


def is_plan_output(directory: Path) -> bool:
    """What --force may replace: a plan's --write-top or --sweep DIR, or any other output of ours."""
    names = {p.name for p in directory.iterdir()}
    plot = bool(names & {"plan.png", "plan.svg", "sweep.png", "sweep.svg"})
    return plot and ({"plan.csv", "plan.json"} <= names or "sweep.csv" in names) or is_traceforge_output(directory)


def folder_name(rank: int, r: Mapping[str, Any]) -> str:
    return (f"{rank:02d}-t{r['tp']}-c{r['cp']}-p{r['pp']}-d{r['dp']}-e{r['ep']}-v{r['vp']}-b{r['micro_batch']}-"
            f"{r['schedule']}-{r['recompute']}-{r['dp_mode']}")


def plan_csv(ranked: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    dims = sorted({d for r in ranked for d in r["exposed_ms"]})
    w.writerow([*CSV_COLUMNS, *(f"exposed_{d}_ms" for d in dims)])
    for i, r in enumerate(ranked, 1):
        w.writerow([i, *(r[c] for c in CSV_COLUMNS[1:]), *(r["exposed_ms"].get(d, 0.0) for d in dims)])
    return buf.getvalue()


def spec_file(spec: Spec) -> str:
    """The spec as `generate -c` reads it back (flat keys, every value explicit)."""
    doc = {k: v for k, v in spec.to_dict().items() if v is not None}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# -- the plot -------------------------------------------------------------------------------

def _bars(ranked: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, float, float]]:
    """(label, family, step ms, MFU %) per candidate, in rank order: the best first, as the table
    reads (colour says the family; grouping by colour put the 7th before the 2nd)."""
    return [(f"#{i}", family(r), r["step_ms"], 100 * r["mfu"]) for i, r in enumerate(ranked, 1)]


def plot_figure(ranked: Sequence[Mapping[str, Any]], title: str) -> Any:
    """The plan plot as a matplotlib figure: bars of step time in rank order coloured by family,
    dots of MFU in percent (as the table), the legend outside the axes (inside, it hid bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = _bars(ranked)
    families = list(dict.fromkeys(b[1] for b in bars))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(bars) + 2) + 1.6, 4.5))
    colors = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    xs = range(len(bars))
    for f in families:
        idx = [i for i, b in enumerate(bars) if b[1] == f]
        ax.bar([xs[i] for i in idx], [bars[i][2] for i in idx], color=colors[f], label=f)
    ax.set_xticks(list(xs), [b[0] for b in bars], rotation=90, fontsize=7)
    ax.set_ylabel("step time (ms, bars)")
    ax.set_title(title)
    mfu = ax.twinx()
    mfu.plot(list(xs), [b[3] for b in bars], "k.", label="MFU %")
    mfu.set_ylabel("MFU % (dots)")
    mfu.set_ylim(0, max([b[3] for b in bars] + [1.0]) * 1.2)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0, title="tp cp pp ep",
              title_fontsize=7)
    fig.tight_layout()
    return fig


def plot_png(path: Path, ranked: Sequence[Mapping[str, Any]], title: str) -> None:
    import matplotlib.pyplot as plt

    fig = plot_figure(ranked, title)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def plot_svg(ranked: Sequence[Mapping[str, Any]], title: str) -> str:
    """The same plot as plain SVG: bars of step time coloured by family, dots of MFU."""
    bars = _bars(ranked)
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
    families = list(dict.fromkeys(b[1] for b in bars))
    w, h, left, bottom, top = max(480, 24 * len(bars) + 160), 360, 60, 60, 40
    plot_h = h - bottom - top
    step_max = max([b[2] for b in bars] + [1e-9]) * 1.1
    mfu_max = max([b[3] for b in bars] + [1.0]) * 1.2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
           f'<text x="{w / 2:.0f}" y="20" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<text x="14" y="{top + plot_h / 2:.0f}" transform="rotate(-90 14 {top + plot_h / 2:.0f})" '
           'text-anchor="middle">step time (ms)</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{w - 90}" y2="{top + plot_h}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>']
    for k in range(5):
        v = step_max * k / 4
        y = top + plot_h - plot_h * k / 4
        out.append(f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">{v:.3g}</text>')
    for i, (label, fam, step, mfu) in enumerate(bars):
        x = left + 8 + 24 * i
        bh = plot_h * step / step_max
        color = palette[families.index(fam) % len(palette)]
        out.append(f'<rect x="{x}" y="{top + plot_h - bh:.1f}" width="16" height="{bh:.1f}" fill="{color}">'
                   f'<title>{escape(label)} {escape(fam)}: {step:.4g} ms, MFU {mfu:.1f} %</title></rect>')
        out.append(f'<circle cx="{x + 8}" cy="{top + plot_h - plot_h * mfu / mfu_max:.1f}" r="3" fill="black"/>')
        out.append(f'<text x="{x + 8}" y="{top + plot_h + 12}" text-anchor="middle">{escape(label)}</text>')
    for j, fam in enumerate(families[:10]):
        y = top + 14 * j
        out.append(f'<rect x="{w - 84}" y="{y}" width="10" height="10" fill="{palette[j % len(palette)]}"/>')
        out.append(f'<text x="{w - 70}" y="{y + 9}">{escape(fam)}</text>')
    out.append(f'<text x="{w - 84}" y="{top + 14 * min(10, len(families)) + 12}">&#9679; MFU % (0-{mfu_max:.0f})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


PLOT_MAX = 60  # bars a plot shows: --all can rank thousands, past what a figure (or a reader) holds


def write_plot(directory: Path, stem: str, ranked: Sequence[Mapping[str, Any]], title: str) -> str:
    """PNG when matplotlib is installed, else SVG, of the best PLOT_MAX; returns the file name written."""
    if len(ranked) > PLOT_MAX:
        title = f"{title}: the best {PLOT_MAX} of {len(ranked):,} (all in plan.csv)"
        ranked = ranked[:PLOT_MAX]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        (directory / f"{stem}.svg").write_text(plot_svg(ranked, title))
        return f"{stem}.svg"
    plot_png(directory / f"{stem}.png", ranked, title)
    return f"{stem}.png"


def write_top(directory: Path, ranked: Sequence[Mapping[str, Any]], k: int, build: Callable[[Mapping[str, Any]], Spec],
              write_set: Callable[[Spec, Path, dict[str, str]], None], title: str) -> list[str]:
    """Into an (already atomic) directory: the k best sets, plan.csv and the plot; the names written."""
    names = []
    for i, r in enumerate(ranked[:k], 1):
        spec = build(r["values"])
        name = folder_name(i, r)
        write_set(spec, directory / name, {SPEC_FILE: spec_file(spec)})
        names.append(name)
    (directory / "plan.csv").write_text(plan_csv(ranked))
    names.append("plan.csv")
    names.append(write_plot(directory, "plan", ranked, title))
    return names


def sweep_csv(flag: str, best: Sequence[tuple[Any, int, Mapping[str, Any]]]) -> str:
    """One row per swept value: the value, then its best candidate."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([flag.lstrip("-"), *SWEEP_COLUMNS])
    for value, world, r in best:
        w.writerow([value, world, *(r[c] for c in SWEEP_COLUMNS[1:])])
    return buf.getvalue()


def sweep_svg(flag: str, points: Sequence[tuple[Any, Mapping[str, Any]]], title: str) -> str:
    """Best step time per swept value, as plain SVG bars."""
    w, h, left, bottom, top = max(420, 70 * len(points) + 120), 320, 60, 50, 40
    plot_h = h - bottom - top
    peak = max([r["step_ms"] for _, r in points] + [1e-9]) * 1.1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
           f'<text x="{w / 2:.0f}" y="20" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{w - 20}" y2="{top + plot_h}" stroke="black"/>',
           f'<text x="{w / 2:.0f}" y="{h - 10}" text-anchor="middle">{escape(flag)}</text>']
    for i, (value, r) in enumerate(points):
        x = left + 20 + 70 * i
        step = r["step_ms"]
        bh = plot_h * step / peak
        out.append(f'<rect x="{x}" y="{top + plot_h - bh:.1f}" width="40" height="{bh:.1f}" fill="#1f77b4">'
                   f'<title>t{r["tp"]} c{r["cp"]} p{r["pp"]} d{r["dp"]}: {step:.4g} ms, MFU {r["mfu"]:.3f}</title></rect>')
        out.append(f'<text x="{x + 20}" y="{top + plot_h - bh - 4:.1f}" text-anchor="middle">{step:.3g} ms</text>')
        out.append(f'<text x="{x + 20}" y="{top + plot_h + 12}" text-anchor="middle">{escape(str(value))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_sweep_plot(directory: Path, flag: str, points: Sequence[tuple[Any, Mapping[str, Any]]], title: str) -> str:
    """sweep.png (matplotlib) or sweep.svg: the best layout's step time per swept value."""
    try:
        import matplotlib
    except ImportError:
        (directory / "sweep.svg").write_text(sweep_svg(flag, points, title))
        return "sweep.svg"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(points) + 2), 4))
    labels = [str(v) for v, _ in points]
    steps = [r["step_ms"] for _, r in points]
    ax.bar(labels, steps, color="#1f77b4")
    for i, (_, r) in enumerate(points):
        ax.annotate(f"tp{r['tp']} cp{r['cp']} pp{r['pp']}\n{r['step_ms']:.3g} ms", (i, steps[i]), ha="center",
                    va="bottom", fontsize=7)
    ax.set_xlabel(flag)
    ax.set_ylabel("best step time (ms)")
    ax.set_ylim(0, max(steps + [1e-9]) * 1.25)  # room for the labels above the bars
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(directory / "sweep.png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return "sweep.png"
