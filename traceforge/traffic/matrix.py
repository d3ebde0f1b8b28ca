"""Who sends how many bytes to whom per step: rank x rank and node x node traffic matrices.

Collectives put each member's wire bytes on the link to its ring neighbour (the next member in
group order; AllToAll spreads them over all other members); send/recv pairs are exact. The
node matrix sums the rank matrix by node; its diagonal is scale-up (intra-node) traffic.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from traceforge.machine.cluster import node_of
from traceforge.machine.collectives import destinations, wire_bytes
from traceforge.read.traceset import TraceSet

# A dense rank x rank matrix above this many ranks is too big to be useful (or to fit).
MAX_DENSE_RANKS = 2048
PLOT_INSTALL_HINT = "PNG heatmaps need matplotlib: pip install 'traceforge[plot]'"


class PlotUnavailable(Exception):
    pass


def traffic_edges(ts: TraceSet) -> dict[tuple[str, int, int], float]:
    """(dim, src rank, dst rank) -> wire bytes per step."""
    edges: dict[tuple[str, int, int], float] = defaultdict(float)
    positions: dict[str, dict[int, int]] = {}
    for scan in ts.scans:
        rank = scan.rank
        for (dim, kind, ctype, size, target), count in scan.traffic.items():
            per_step = count / ts.program_set.steps
            if kind == "send":
                edges[(ts.p2p_dim(dim), rank, target)] += size * per_step
            elif kind == "coll":
                members = ts.program_set.groups[target]
                if target not in positions:
                    positions[target] = {r: i for i, r in enumerate(members)}
                wire = wire_bytes(ctype, size, len(members)) * per_step
                for dst, share in destinations(ctype, members, positions[target][rank]):
                    edges[(ts.coll_dim(dim, target), rank, dst)] += wire * share
    return dict(edges)


def rank_matrix(edges: dict[tuple[str, int, int], float], world: int, dim: str | None = None) -> np.ndarray:
    m = np.zeros((world, world))
    for (d, src, dst), value in edges.items():
        if dim is None or d == dim:
            m[src, dst] += value
    return m


def node_matrix(edges: dict[tuple[str, int, int], float], world: int, gpus_per_node: int, dim: str | None = None) -> np.ndarray:
    nodes = -(-world // gpus_per_node)
    m = np.zeros((nodes, nodes))
    for (d, src, dst), value in edges.items():
        if dim is None or d == dim:
            m[node_of(src, gpus_per_node), node_of(dst, gpus_per_node)] += value
    return m


def write_matrix_csv(matrix: np.ndarray, path: Path, label: str) -> None:
    """Square matrix with a header row and column of indices; bytes per step, row = sender."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"{label} (src \\ dst)"] + list(range(matrix.shape[1])))
        for i, row in enumerate(matrix):  # as csv.writer writes numbers, each distinct value formatted once
            values, which = np.unique(row, return_inverse=True)
            texts = [str(_num(v)) for v in values.tolist()]
            f.write(f"{i}," + ",".join([texts[j] for j in which.tolist()]) + "\r\n" if len(row) else f"{i}\r\n")


def write_links_csv(edges: dict[tuple[str, int, int], float], path: Path, gpus_per_node: int) -> None:
    """The sparse form, per dimension: one line per (dim, src, dst) with traffic."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dim", "src_rank", "dst_rank", "src_node", "dst_node", "bytes_per_step"])
        for (dim, src, dst), value in sorted(edges.items()):
            w.writerow([dim, src, dst, node_of(src, gpus_per_node), node_of(dst, gpus_per_node), _num(value)])


def _num(value: float):
    return int(value) if float(value).is_integer() else round(float(value), 3)


def write_heatmap(matrices: list[tuple[str, np.ndarray, int]], path: Path) -> None:
    """One heatmap per (title, matrix, block), log colour scale, lines every `block` rows (node
    boundaries; 0 for none). Raises PlotUnavailable without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotUnavailable(PLOT_INSTALL_HINT) from None
    fig, axes = plt.subplots(1, len(matrices), figsize=(6.5 * len(matrices), 5.5), squeeze=False)
    for ax, (title, m, block) in zip(axes[0], matrices, strict=False):
        positive = m[m > 0]
        norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size and positive.min() < positive.max() else None
        shown = np.ma.masked_where(m <= 0, m)
        image = ax.imshow(shown, cmap="viridis", norm=norm, interpolation="nearest")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if block and 1 < m.shape[0] // block <= 64:
            for edge in range(block, m.shape[0], block):
                ax.axhline(edge - 0.5, color="0.6", linewidth=0.6)
                ax.axvline(edge - 0.5, color="0.6", linewidth=0.6)
        ax.set_title(title)
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        fig.colorbar(image, ax=ax, label="bytes per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
