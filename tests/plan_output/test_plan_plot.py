"""plan's plot reads as its table does: bars in rank order (the best first), MFU in percent, and a
legend that covers no bar."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from traceforge.plan_output.write import plot_figure, plot_svg  # noqa: E402

# Seven candidates of three families, the families interleaved in rank order (so grouping bars
# by colour would move the second after the whole family of the first); MFU as plan's JSON has it, a fraction.
RANKED = [dict(tp=t, cp=1, pp=p, ep=1, step_ms=100.0 + 10 * i, mfu=0.50 - 0.03 * i)
          for i, (t, p) in enumerate([(8, 4), (4, 8), (8, 4), (2, 16), (4, 8), (8, 4), (2, 16)])]


def test_bars_are_in_rank_order_and_mfu_is_a_percent():
    fig = plot_figure(RANKED, "plan")
    ax, twin = fig.axes
    bars = sorted(ax.patches, key=lambda b: b.get_x())
    assert [round(b.get_height(), 6) for b in bars] == [100.0 + 10 * i for i in range(7)]  # step times, the best first
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"#{i}" for i in range(1, 8)]
    (dots,) = twin.get_lines()
    assert list(dots.get_ydata()) == pytest.approx([100 * (0.50 - 0.03 * i) for i in range(7)])  # 50 %, 47 %, ...
    assert "%" in twin.get_ylabel()


def test_the_legend_covers_no_bar():
    fig = plot_figure(RANKED, "plan")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    for bar in ax.patches:
        assert not legend.overlaps(bar.get_window_extent(renderer)), bar
    assert not legend.overlaps(ax.get_window_extent(renderer))  # outside the plot area altogether


def test_the_svg_has_the_same_order_and_unit():
    svg = plot_svg(RANKED, "plan")
    titles = [line.split("<title>")[1].split("</title>")[0] for line in svg.splitlines() if "<title>" in line]
    assert [t.split()[0] for t in titles] == [f"#{i}" for i in range(1, 8)]
    assert titles[0].endswith("MFU 50.0 %") and "MFU %" in svg
