"""Figures of a comparison, each written as PNG and SVG.

- ``learning_curves``: global test accuracy per round, one panel per swept value, one line
  per algorithm: the mean over seeds, with a band (min to max over seeds, or mean +- std).
- ``worst10_curves``: when the runs report it, the mean accuracy of the worst 10% of clients on
  their own test splits (``local_accuracy_worst10``) per round, laid out as the learning curves.
- ``client_accuracy``: when runs wrote ``clients.csv``, the empirical CDF over clients of each
  client's accuracy on its own test split at the run's last evaluated round, one line per
  algorithm, the clients of its completed seeds pooled (each seed's clients counted once each).
- ``drift_curves``: when the runs logged drift diagnostics (``eval.drift``), the logit KL and
  feature L2 distance of the local models to the global model per round (FedCSD Fig. 1).
- ``partition_plots``: the client x class bubble plot (``partition_plot.bubble_plot``) of
  each distinct partition, from the first seed's run.
- t-SNE of the final global model's features: :mod:`fedrift.report.tsne`.

Everything draws on bare :class:`~matplotlib.figure.Figure` objects with the Agg canvas,
never pyplot: no window, no global figure registry, the caller's backend untouched.
"""

from __future__ import annotations

import csv
import json
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedrift.report.table import Group, Run, short_names
from fedrift.safe_files import atomic_file, make_dir

DRIFT_KEYS = {"drift_logit_kl": "logit KL(global || local)", "drift_feature_l2": "feature L2 ||h_local - h_global||"}


@dataclass
class Plot:
    """A written figure: what the report shows and where its files are."""

    title: str
    caption: str
    png: Path
    svg: Path


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


# Where an axes' legend may sit inside its axes, in the order tried: the upper left first (the
# room accuracy curves leave as they climb), then the other corners, then the edges' middles.
INSIDE = ("upper left", "upper right", "lower right", "lower left", "center left", "center right",
          "upper center", "lower center")


def covers_data(ax: Any, box: Any, pad: float = 3.0) -> bool:
    """True when ``box`` (a display-coordinate Bbox, as a legend's ``get_window_extent``) covers
    anything ``ax`` plots: a line's segments or markers, a band's area, a scatter's points, a
    bar. ``pad``: pixels round ``box`` for line widths and markers."""
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.path import Path as MplPath

    box = box.padded(pad)
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        finite = np.isfinite(xy).all(axis=1)
        for run in np.split(xy, np.flatnonzero(~finite)):  # a NaN breaks a line: each piece alone
            run = run[np.isfinite(run).all(axis=1)]
            if len(run) == 1 and box.contains(*run[0]):
                return True
            if len(run) > 1 and MplPath(run).intersects_bbox(box, filled=False):
                return True
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):  # scatter: markers at the offsets
            points = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float))
            radius = float(np.sqrt(np.max(coll.get_sizes(), initial=36.0))) / 2 * ax.figure.dpi / 72
            grown = box.padded(radius)
            if any(grown.contains(x, y) for x, y in points if np.isfinite(x) and np.isfinite(y)):
                return True
            continue
        to_display = coll.get_transform()
        for path in coll.get_paths():
            if to_display.transform_path(path).intersects_bbox(box, filled=isinstance(coll, PolyCollection)):
                return True
    return any(patch.get_visible() and patch.get_transform().transform_path(patch.get_path()).intersects_bbox(box)
               for patch in ax.patches)


def clear_legends(fig: Figure) -> None:
    """Every axes legend of ``fig`` moved where it covers nothing plotted (issue 72 item 6): inside
    its axes at the first place of :data:`INSIDE` that covers no curve, band or point, measured
    on the drawn figure; where none is clear, beside the axes on the right, the figure widened
    by the legend's width and laid out again (then the others are measured again). ``save``
    calls this, so every figure the report and the docs draw gets it."""
    legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_visible() and ax.get_legend() is not None]
    beside: set[int] = set()
    for _ in range(4):
        fig.draw_without_rendering()  # limits, layout and text sizes as they will be saved
        renderer = fig.canvas.get_renderer()
        moved = []
        for ax, leg in legends:
            if id(leg) in beside:
                continue
            for loc in INSIDE:
                leg.set_bbox_to_anchor(None)
                leg.set_loc(loc)
                if not covers_data(ax, leg.get_window_extent(renderer)):
                    break
            else:
                leg.set_loc("upper left")
                leg.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
                beside.add(id(leg))
                moved.append((ax, leg))
        if not moved:
            return
        widths: dict[float, float] = {}  # per column of panels: the widest legend moved beside it
        for ax, leg in moved:
            column = round(ax.get_position().x0, 3)
            widths[column] = max(widths.get(column, 0.0), leg.get_window_extent(renderer).width / fig.dpi + 0.15)
        fig.set_figwidth(fig.get_figwidth() + sum(widths.values()))
        fig.tight_layout()
    for ax, leg in legends:  # laid out four times and still moving: every legend beside its axes
        leg.set_loc("upper left")
        leg.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
    fig.tight_layout()


def save(fig: Figure, base: Path) -> tuple[Path, Path]:
    """``base.png`` and ``base.svg``, every legend first moved off what is plotted
    (:func:`clear_legends`)."""
    clear_legends(fig)
    make_dir(base.parent)
    png, svg = base.with_suffix(".png"), base.with_suffix(".svg")
    for path, kind in ((png, "png"), (svg, "svg")):
        with atomic_file(path) as f:
            fig.savefig(f, format=kind, bbox_inches="tight")  # legends placed beside panels included
    return png, svg


def panels_of(groups: Sequence[Group]) -> list[tuple[str, list[Group]]]:
    """Groups split by their swept values, in the grid's order; titles from the swept keys."""
    keys = list(dict.fromkeys(k for g in groups for k in g.sweep))
    short = short_names(keys)
    out: dict[str, list[Group]] = {}
    titles: dict[str, str] = {}
    for g in groups:
        k = json.dumps(g.sweep, sort_keys=True, default=str)
        out.setdefault(k, []).append(g)
        titles[k] = ", ".join(f"{short[a]}={_fmt(v)}" for a, v in g.sweep.items())
    return [(titles[k], out[k]) for k in out]


def _fmt(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _colours(groups: Sequence[Group]) -> dict[str, Any]:
    from matplotlib import colormaps

    algs = list(dict.fromkeys(g.algorithm for g in groups))
    cmap = colormaps["tab10" if len(algs) <= 10 else "tab20"]
    return {a: cmap(i % cmap.N) for i, a in enumerate(algs)}


def _plotted_runs(g: Group) -> list[Run]:
    return [r for r in g.runs if r.status in ("completed", "diverged") and r.metrics]


def curve_stats(curves: Sequence[Sequence[tuple[int, float]]], band: str = "minmax") -> tuple[np.ndarray, ...]:
    """Rounds, mean, low, high over the curves (each round over the curves that have it)."""
    by_round: dict[int, list[float]] = {}
    for c in curves:
        for t, v in c:
            if v is not None and np.isfinite(v):
                by_round.setdefault(int(t), []).append(float(v))
    rounds = np.array(sorted(by_round), dtype=float)
    vals = [np.array(by_round[int(t)]) for t in rounds]
    mean = np.array([v.mean() for v in vals])
    if band == "std":
        sd = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in vals])
        low, high = mean - sd, mean + sd
    else:
        low, high = np.array([v.min() for v in vals]), np.array([v.max() for v in vals])
    return rounds, mean, low, high


def wrap_title(title: str, width: int = 48) -> str:
    """A panel title on as many lines as it needs (swept settings can be long)."""
    return textwrap.fill(title, width)


def _grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def _curve_panels(groups: Sequence[Group], base: Path, band: str, curve: Callable[[Run], list[tuple[int, float]]],
                  ylabel: str, suptitle: str) -> tuple[Path, Path] | None:
    """One panel per swept value, one line per algorithm: ``curve`` of each run, the mean over
    seeds with a band over them (``band``); None when no run has a curve."""
    panels = [(t, gs) for t, gs in panels_of(groups) if any(curve(r) for g in gs for r in _plotted_runs(g))]
    if not panels:
        return None
    colours = _colours(groups)
    rows, cols = _grid_shape(len(panels))
    fig = new_figure(max(6.0, 4.6 * cols), 3.6 * rows + 0.4)  # save widens it for a legend beside a panel
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, gs) in zip(axes.flat, panels):
        for g in gs:
            curves = [c for c in (curve(r) for r in _plotted_runs(g)) if c]
            if not curves:
                continue
            rounds, mean, low, high = curve_stats(curves, band)
            c = colours[g.algorithm]
            ax.plot(rounds, 100 * mean, color=c, lw=1.6, label=f"{g.algorithm} (n={len(curves)})",
                    marker="o" if len(rounds) <= 12 else None, ms=3)
            if len(curves) > 1:
                ax.fill_between(rounds, 100 * low, 100 * high, color=c, alpha=0.18, lw=0)
        ax.set_title(wrap_title(title), fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7 if len(gs) > 6 else 8)  # placed by save: on no curve (clear_legends)
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    return save(fig, base)


def _band_words(band: str) -> str:
    return "min to max" if band == "minmax" else "mean +- std"


def learning_curves(groups: Sequence[Group], base: Path, band: str = "minmax") -> Plot | None:
    what = _band_words(band)
    saved = _curve_panels(groups, base, band, lambda r: r.accuracy_curve(), "test accuracy (%)",
                          f"Global test accuracy: mean over seeds, band {what}")
    if saved is None:
        return None
    return Plot("Learning curves", f"Global test accuracy per round; line: mean over seeds, band: {what} over seeds.",
                *saved)


WORST10 = "local_accuracy_worst10"


def worst10_curves(groups: Sequence[Group], base: Path, band: str = "minmax") -> Plot | None:
    """The worst 10% of clients' mean local accuracy per round (``local_accuracy_worst10``), one
    panel per swept value, one line per algorithm: the mean over seeds, a band over them; None
    when no run reports it."""
    def curve(run: Run) -> list[tuple[int, float]]:
        return [(int(m["round"]), float(m[WORST10])) for m in run.metrics
                if isinstance(m.get(WORST10), (int, float)) and not isinstance(m.get(WORST10), bool)]

    what = _band_words(band)
    saved = _curve_panels(groups, base, band, curve, "worst 10% local accuracy (%)",
                          f"Worst 10% of clients, on their own test splits: mean over seeds, band {what}")
    if saved is None:
        return None
    return Plot("Worst 10% of clients: learning curves",
                "Per round, the mean accuracy of the worst 10% of the evaluated clients (ceil(n/10), at least one) on "
                f"their own test splits (local_accuracy_worst10: the global model's, or each client's own model where "
                f"the method has one); line: mean over seeds, band: {what} over seeds.", *saved)


def read_client_accuracies(run: Run) -> tuple[str, list[float]] | None:
    """The run's ``clients.csv`` at its last evaluated round: which model (``personal`` where the
    run scored clients' own models, else ``global``) and each client's accuracy (``correct /
    n_test``); None without the file or a usable row. A damaged or foreign row is skipped."""
    path = Path(run.dir) / "clients.csv"
    if not path.is_file():
        return None
    last: dict[str, list[float]] = {}
    last_round = -1
    try:
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            for row in csv.DictReader(f):
                try:
                    rnd, n, right = int(row["round"]), int(row["n_test"]), int(row["correct"])
                except (KeyError, TypeError, ValueError):
                    continue
                model = row.get("model")
                if n <= 0 or not 0 <= right <= n or model not in ("global", "personal"):
                    continue
                if rnd > last_round:
                    last_round, last = rnd, {}
                if rnd == last_round:
                    last.setdefault(model, []).append(right / n)
    except (OSError, csv.Error):
        return None
    for model in ("personal", "global"):  # the model local_accuracy is of: the client's own where it has one
        if last.get(model):
            return model, last[model]
    return None


def client_accuracy(groups: Sequence[Group], base: Path) -> Plot | None:
    """The empirical CDF over clients of their accuracy on their own test splits at each run's
    last evaluated round (``clients.csv``), one panel per swept value, one line per algorithm,
    the clients of its completed runs pooled over seeds; None when no run has the file."""
    panels = []
    for title, gs in panels_of(groups):
        lines = []
        for g in gs:
            read = [x for x in (read_client_accuracies(r) for r in g.done()) if x]
            if read:
                models = sorted({m for m, _ in read})
                lines.append((g, len(read), "/".join(models), np.sort(np.concatenate([a for _, a in read]))))
        if lines:
            panels.append((title, lines))
    if not panels:
        return None
    colours = _colours(groups)
    rows, cols = _grid_shape(len(panels))
    fig = new_figure(max(6.0, 4.6 * cols), 3.6 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for g, seeds, model, acc in lines:  # from 0 at the lowest accuracy, up 1/n at each client
            share = np.arange(len(acc) + 1) / len(acc)
            ax.step(100 * np.concatenate([acc[:1], acc]), share, where="post", color=colours[g.algorithm], lw=1.6,
                    label=f"{g.algorithm} ({model}, {len(acc)} clients, {seeds} seed{'s' if seeds > 1 else ''})")
        ax.axhline(0.1, color="0.5", lw=0.8, ls=":")
        ax.set_title(wrap_title(title), fontsize=10)
        ax.set_xlabel("client's accuracy on its own test split (%)")
        ax.set_ylabel("share of clients at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)  # placed by save: on no line (clear_legends)
    fig.suptitle("Per-client accuracy at the last evaluated round (ECDF, seeds pooled)", fontsize=11)
    fig.tight_layout()
    png, svg = save(fig, base)
    return Plot("Per-client accuracy",
                "Empirical CDF over clients of each client's accuracy on its own local test split at the run's last "
                "evaluated round (clients.csv: the global model's, or each client's own model where the method has "
                "one, as named in the legend), the clients of every completed seed pooled, each counted once per seed. "
                "The dotted line is 10% of clients: where a line crosses it is the edge of its worst 10%.", png, svg)


def has_drift(groups: Sequence[Group]) -> bool:
    return any(k in m for g in groups for r in g.runs for m in r.metrics for k in DRIFT_KEYS)


def drift_curves(groups: Sequence[Group], base: Path, band: str = "minmax") -> Plot | None:
    if not has_drift(groups):
        return None
    panels = [(t, gs) for t, gs in panels_of(groups) if any(_plotted_runs(g) for g in gs)]
    colours = _colours(groups)
    cols = len(panels)
    fig = new_figure(max(6.0, 4.6 * cols), 3.3 * len(DRIFT_KEYS) + 0.4)
    axes = fig.subplots(len(DRIFT_KEYS), cols, squeeze=False)
    for j, (title, gs) in enumerate(panels):
        for i, (key, name) in enumerate(DRIFT_KEYS.items()):
            ax = axes[i, j]
            for g in gs:
                runs = [r for r in _plotted_runs(g) if any(key in m for m in r.metrics)]
                if not runs:
                    continue
                curves = [[(m["round"], m[key]) for m in r.metrics if m.get(key) is not None] for r in runs]
                rounds, mean, low, high = curve_stats(curves, band)
                c = colours[g.algorithm]
                ax.plot(rounds, mean, color=c, lw=1.6, label=g.algorithm, marker="o" if len(rounds) <= 12 else None, ms=3)
                if len(runs) > 1:
                    ax.fill_between(rounds, low, high, color=c, alpha=0.18, lw=0)
            ax.set_title(title if i == 0 else "")
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(name, fontsize=9)
            ax.grid(True, alpha=0.3)
            if i == 0:
                ax.legend(fontsize=8)  # placed by save: on no curve (clear_legends)
    fig.suptitle("Client drift: local models vs the global model they started from", fontsize=11)
    fig.tight_layout()
    png, svg = save(fig, base)
    return Plot("Client drift", "Per round, averaged over the round's clients and a fixed probe batch of the test set: "
                "KL(softmax(z_global) || softmax(z_local)) and ||h_local - h_global||; mean over seeds.", png, svg)


@lru_cache(maxsize=4)
def _dataset(data_json: str, plugins_json: str = "[]") -> Any:
    from fedrift.config import load_config, validate_options
    from fedrift.data import DATASETS, load_dataset

    data = json.loads(data_json)
    cfg = load_config({"data": data, "plugins": json.loads(plugins_json)})
    options = validate_options("data", DATASETS.get(cfg.data.name, "data.name").params, cfg.data.options_dict)
    root = Path(cfg.data.root).expanduser() if cfg.data.root else None
    return load_dataset(cfg.data.name, root, options)


def run_dataset(config: dict[str, Any]) -> Any:
    """The dataset a run used, rebuilt from its config.yaml's ``data`` section (cached)."""
    return _dataset(json.dumps(config.get("data") or {}, sort_keys=True), json.dumps(config.get("plugins") or []))


def partition_plots(groups: Sequence[Group], folder: Path, warn: Any = print) -> list[Plot]:
    """One bubble plot per distinct (data, partition) of the grid, from its first run on disk."""
    from fedrift.data.partition_base import Partition
    from fedrift.errors import FedriftError
    from fedrift.report.partition_plot import bubble_plot, heterogeneity

    seen: dict[str, Run] = {}
    for g in groups:
        for r in g.runs:
            # both files: a committed run folder may keep the header alone (benchmarks/results keeps
            # seed 0's index arrays; the config and seed rebuild the others)
            if (r.dir / "partition.json").is_file() and (r.dir / "partition.bin").is_file() and r.config:
                key = json.dumps([r.config.get("data"), r.config.get("partition")], sort_keys=True, default=str)
                seen.setdefault(key, r)
                break
    plots = []
    for i, run in enumerate(seen.values()):
        try:
            ds = run_dataset(run.config)
            part = Partition.load(run.dir / "partition.json")
            counts = part.counts(ds.y_train.numpy(), ds.num_classes)  # an index out of range: IndexError
        except (FedriftError, OSError, ValueError, KeyError, IndexError) as err:
            warn(f"partition plot of {run.dir} skipped: {err}")
            continue
        shown = {k: v for k, v in part.options.items() if k in ("alpha", "classes_per_client")}
        detail = ", ".join(f"{k}={v}" for k, v in shown.items())
        title = f"{ds.name}: {part.name}({detail}), {part.num_clients} clients, seed {run.seed}"
        name = f"partition-{i + 1}"
        base = folder / name
        make_dir(base.parent)
        bubble_plot(counts, base.with_suffix(".svg"), title)
        stats = heterogeneity(counts)
        plots.append(Plot(f"Partition: {part.name}({detail})",
                          f"Client x class training samples (bubble area ~ count). Mean total-variation distance "
                          f"of client label distributions to the global one: {stats['mean_tv']:.3f}; client sizes "
                          f"{stats['min_size']} to {stats['max_size']}.",
                          base.with_suffix(".png"), base.with_suffix(".svg")))
    return plots


__all__ = ["Plot", "clear_legends", "client_accuracy", "covers_data", "curve_stats", "drift_curves", "has_drift",
           "learning_curves", "partition_plots", "read_client_accuracies", "run_dataset", "worst10_curves"]
