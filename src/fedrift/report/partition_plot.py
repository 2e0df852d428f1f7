"""Looking at a partition: a client x class count table, summary numbers, a bubble plot.

The plot draws on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, never
pyplot, so it opens no window, keeps no figure registry and leaves the caller's
backend as it was (safe in notebooks and worker processes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fedrift.safe_files import atomic_file


def _as_counts(counts: np.ndarray) -> np.ndarray:
    out = np.asarray(counts)
    if out.ndim != 2:
        raise ValueError(f"counts must be a clients x classes matrix, got shape {out.shape}")
    return out.astype(np.int64, copy=False)


def count_table(counts: np.ndarray, max_rows: int = 50) -> str:
    """Plain-text table: a row per client, a column per class, totals right and below.

    Past ``max_rows`` clients the middle rows are replaced by one '...' line, so a 1,000
    client partition still prints in a terminal.
    """
    counts = _as_counts(counts)
    k, c = counts.shape
    head = ["client", *[str(j) for j in range(c)], "total"]
    rows = [[str(i), *map(str, counts[i]), str(counts[i].sum())] for i in range(k)]
    total = ["total", *map(str, counts.sum(axis=0)), str(counts.sum())]
    width = [max(len(r[j]) for r in [head, total, *rows]) for j in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) for cell, w in zip(cells, width)).rstrip()

    shown = [line(r) for r in rows]
    if k > max(max_rows, 1):
        top = max(max_rows, 1) // 2 + max(max_rows, 1) % 2
        bottom = max(max_rows, 1) - top
        shown = [*shown[:top], "...", *(shown[k - bottom :] if bottom else [])]
    rule = "-" * len(line(head))
    return "\n".join([line(head), rule, *shown, rule, line(total)])


def heterogeneity(counts: np.ndarray) -> dict[str, float]:
    """Summary numbers of a partition's client x class counts.

    ``mean_tv`` is the mean total-variation distance between each client's label
    distribution and the global one: 0 for IID, near 1 when clients hold disjoint classes
    of a balanced set. Clients with no samples are left out of the per-client means.
    """
    counts = _as_counts(counts)
    sizes = counts.sum(axis=1)
    held = sizes > 0
    total = counts.sum()
    glob = counts.sum(axis=0) / max(total, 1)
    dist = counts[held] / sizes[held][:, None]
    tv = 0.5 * np.abs(dist - glob[None, :]).sum(axis=1)
    return {
        "num_clients": int(counts.shape[0]),
        "num_classes": int(counts.shape[1]),
        "num_samples": int(total),
        "mean_size": float(sizes.mean()) if sizes.size else 0.0,
        "min_size": int(sizes.min()) if sizes.size else 0,
        "max_size": int(sizes.max()) if sizes.size else 0,
        "mean_classes_per_client": float((counts[held] > 0).sum(axis=1).mean()) if held.any() else 0.0,
        "mean_tv": float(tv.mean()) if tv.size else 0.0,
    }


def bubble_plot(counts: np.ndarray, path: Path, title: str) -> None:
    """Client x class bubbles, area proportional to the count (as FedGKD's Figure 3).

    Always writes a PNG (``path`` itself, or ``path`` with a .png suffix); when ``path``
    ends with .svg the SVG is written there too.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib: only where a plot is drawn
    from matplotlib.figure import Figure

    counts = _as_counts(counts)
    k, c = counts.shape
    path = Path(path)
    fig = Figure(figsize=(min(max(4.0, 0.25 * k + 1.5), 24.0), min(max(3.0, 0.3 * c + 1.2), 16.0)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    client, cls = np.nonzero(counts)
    if client.size:
        # The largest bubble fills about one grid cell, whatever the figure's size.
        width_pt, height_pt = fig.get_figwidth() * 72 * 0.8, fig.get_figheight() * 72 * 0.75
        cell = min(width_pt / max(k, 1), height_pt / max(c, 1))
        area = counts[client, cls] / counts.max() * max(cell, 2.0) ** 2
        ax.scatter(client, cls, s=area, c="tab:red", alpha=0.6, edgecolors="none")
    ax.set_xlim(-0.5, k - 0.5)
    ax.set_ylim(-0.5, c - 0.5)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    if c <= 30:
        ax.set_yticks(range(c))
    if k <= 40:
        ax.set_xticks(range(k))
    ax.set_title(title)
    ax.grid(True, alpha=0.2)
    fig.tight_layout()
    png = path if path.suffix.lower() == ".png" else path.with_suffix(".png")
    with atomic_file(png) as f:
        fig.savefig(f, format="png")
    if path.suffix.lower() == ".svg":
        with atomic_file(path) as f:
            fig.savefig(f, format="svg")


__all__ = ["bubble_plot", "count_table", "heterogeneity"]
