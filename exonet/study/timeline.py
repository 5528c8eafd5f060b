"""``exonet timeline``: a replay drawn as a Gantt chart, and the same picture as text for a terminal.

Per node: compute, exposed communication and idle time (the spans of ``SimResult.timelines``,
which tile the run), and beneath them the collectives it issued asynchronously while they were
in flight (the overlap a strategy buys). Below the nodes: the busiest links' utilisation over
time (``SimResult.link_series``). matplotlib is imported only to draw the image.
"""

from __future__ import annotations

import os
from pathlib import Path

from exonet.files import output_path
from exonet.netsim.result import SimResult
from exonet.netsim.spans import COMM, COMPUTE, IDLE
from exonet.units import plural

COLORS = {COMPUTE: "#4c72b0", COMM: "#dd8452", IDLE: "#d9d9d9"}
ASYNC_COLOR = "#55a868"
GLYPHS = {COMPUTE: "#", COMM: "=", IDLE: "."}
LEVELS = " .:-=+*#%@"  # a link's utilisation in tenths, for the text picture


def spans(result: SimResult, rank: int) -> dict[int, list[tuple[float, float]]]:
    """``rank``'s (start, length) spans in seconds by kind (compute / comm / idle), up to the run's end."""
    line = result.timelines[rank]
    out: dict[int, list[tuple[float, float]]] = {COMPUTE: [], COMM: [], IDLE: []}
    for i, kind in enumerate(line.kinds):
        start, end = line.times[2 * i], line.times[2 * i + 1]
        out[kind].append((start, end - start))
    if result.wall_clock_s > line.end:
        out[IDLE].append((line.end, result.wall_clock_s - line.end))
    return out


def async_spans(result: SimResult, rank: int) -> list[tuple[float, float]]:
    """(start, length) of each collective ``rank`` issued asynchronously, while it was in flight."""
    return [(c.start_s, c.end_s - c.start_s) for c in result.collectives if c.async_op and rank in c.group]


def text(result: SimResult, *, width: int = 64, links: int = 3) -> str:
    """The timeline as text: a row per node (the kind that filled most of each column), its async
    collectives in flight, and the busiest links' utilisation per column."""
    wall = result.wall_clock_s
    rows = [f"timeline: scenario {result.scenario_name or '(unnamed)'}, {len(result.per_node)} nodes, "
            f"{result.num_steps} steps, simulated wall-clock {wall:.4g} s; one column = {wall / width:.3g} s"]
    if wall <= 0:
        return rows[0]
    cell = wall / width
    top = [link for link in result.busiest_links(links) if link.bytes > 0]
    label = max([8, *(len(link.name) for link in top)])
    for rank, node in enumerate(result.per_node):
        fill = [[0.0, 0.0, 0.0] for _ in range(width)]
        for kind, items in spans(result, rank).items():
            for start, length in items:
                _spread(fill, kind, start, length, cell)
        bar = "".join(GLYPHS[max(range(3), key=column.__getitem__)] for column in fill)
        rows.append(f"{f'node {rank}':<{label}} {bar}  compute {node.compute_s / wall:4.0%} "
                    f"comm {node.comm_s / wall:4.0%} "
                    f"idle {node.idle_s / wall:4.0%}")
        overlap = async_spans(result, rank)
        if overlap:
            busy = [[0.0] for _ in range(width)]
            for start, length in overlap:
                _spread(busy, 0, start, length, cell)
            rows.append(f"{'  async':<{label}} {''.join('~' if b[0] > cell / 2 else ' ' for b in busy)}")
    if top:
        index = {id(link): i for i, link in enumerate(result.links)}
        _, series = result.link_series(width, [index[id(link)] for link in top])
        for link, row in zip(top, series):
            spark = "".join(LEVELS[min(len(LEVELS) - 1, int(round(u * (len(LEVELS) - 1))))] for u in row)
            rows.append(f"{link.name:<{label}} {spark}  utilization {link.utilization:4.0%} "
                        f"busy {link.busy_fraction:4.0%}")
    rows.append(f"legend: {GLYPHS[COMPUTE]} compute  {GLYPHS[COMM]} comm  {GLYPHS[IDLE]} idle  ~ async collective "
                f"in flight  link: utilisation {LEVELS[1]} (low) .. {LEVELS[-1]} (full)")
    return "\n".join(rows)


def _spread(fill: list[list[float]], kind: int, start: float, length: float, cell: float) -> None:
    """Add the span [start, start + length) to the columns it covers, by the time it spends in each."""
    end = start + length
    first, last = int(start // cell), min(len(fill) - 1, int(end // cell))
    for col in range(max(0, first), last + 1):
        lo, hi = max(start, col * cell), min(end, (col + 1) * cell)
        if hi > lo:
            fill[col][kind] += hi - lo


def draw(result: SimResult, path: str | os.PathLike, *, links: int = 3, title: str | None = None) -> Path:
    """Draw ``result`` as a Gantt chart at ``path`` (PNG, SVG, PDF: by the suffix) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = len(result.timelines)
    top = [link for link in result.busiest_links(links) if link.bytes > 0]
    ratios = [max(2.0, 0.45 * n), 1.4] if top else [max(2.0, 0.45 * n)]
    fig, axes = plt.subplots(len(ratios), 1, sharex=True, squeeze=False, figsize=(11, sum(ratios) + 1.2),
                             gridspec_kw={"height_ratios": ratios})
    ax = axes[0][0]
    any_async = False
    for rank in range(n):
        for kind, items in spans(result, rank).items():
            ax.broken_barh(items, (rank - 0.3, 0.6), facecolors=COLORS[kind], linewidth=0)
        overlap = async_spans(result, rank)
        if overlap:
            any_async = True
            ax.broken_barh(overlap, (rank + 0.32, 0.14), facecolors=ASYNC_COLOR, linewidth=0)
    ax.set_yticks(range(n), [f"node {r}" for r in range(n)])
    ax.set_ylim(n - 0.5, -0.6)
    legend = [Patch(color=COLORS[COMPUTE], label="compute"), Patch(color=COLORS[COMM], label="exposed comm"),
              Patch(color=COLORS[IDLE], label="idle")]
    if any_async:
        legend.append(Patch(color=ASYNC_COLOR, label="async collective in flight"))
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=len(legend), fontsize=8,
              frameon=False, borderaxespad=-1.8)
    ax.set_title(title or f"{result.scenario_name or 'simulation'}: {plural(n, 'node')}, "
                          f"{plural(result.num_steps, 'step')}, {result.wall_clock_s:.4g} s simulated", pad=24)
    if top:
        lx = axes[1][0]
        index = {id(link): i for i, link in enumerate(result.links)}
        edges, series = result.link_series(200, [index[id(link)] for link in top])
        for link, row in zip(top, series):
            lx.stairs(row * 100, edges, label=f"{link.name} ({link.utilization:.0%} avg)")
        lx.set_ylabel("link use %")
        lx.set_ylim(0, 105)
        lx.legend(loc="upper right", fontsize=8)
    axes[-1][0].set_xlabel("simulated time (s)")
    axes[-1][0].set_xlim(0, result.wall_clock_s or 1.0)
    fig.tight_layout()
    path = output_path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
