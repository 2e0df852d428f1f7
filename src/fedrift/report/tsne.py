"""t-SNE of the final global model's features on the test set, coloured by class (FedGKD Fig. 2).

The model is rebuilt from the run's ``config.yaml`` (``build_model`` with the run's seed and
model options), its ``final_model.pt`` loaded, and ``features(x)`` taken on a seeded random
subsample of the test set; features wider than 50 are reduced to 50 by PCA first (the usual
t-SNE practice), then :class:`sklearn.manifold.TSNE` (PCA initialisation, seeded) maps them to 2-D.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fedrift.report.plots import Plot, new_figure, run_dataset, save, wrap_title
from fedrift.report.table import Run


def run_features(run: Run, points: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features of ``points`` test samples under the run's final global model, and their labels."""
    import torch

    from fedrift.config import load_config, validate_options
    from fedrift.models import MODELS, build_model

    cfg_doc = run.config
    ds = run_dataset(cfg_doc)
    cfg = load_config({"seed": cfg_doc.get("seed", 0), "model": cfg_doc.get("model") or {},
                       "plugins": cfg_doc.get("plugins") or []})
    options = validate_options("model", MODELS.get(cfg.model.name, "model.name").params, cfg.model.options_dict)
    model = build_model(cfg.model.name, options, ds.input_shape, ds.num_classes, cfg.seed)
    state = torch.load(run.dir / "final_model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    model.eval()
    n = len(ds.y_test)
    idx = np.sort(np.random.default_rng(seed).choice(n, size=min(points, n), replace=False))
    x = ds.x_test[torch.as_tensor(idx)]
    with torch.no_grad():
        h = torch.cat([model(ds.inputs(x[i : i + 512]), mode="features") for i in range(0, len(x), 512)])
    return h.reshape(len(h), -1).double().numpy(), ds.y_test[torch.as_tensor(idx)].numpy()


def embed(features: np.ndarray, seed: int = 0) -> np.ndarray:
    """2-D t-SNE of the rows of ``features`` (PCA to 50 dimensions first when wider)."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    x = np.asarray(features, dtype=np.float64)
    if x.shape[1] > 50 and x.shape[0] > 50:
        x = PCA(n_components=50, random_state=seed).fit_transform(x)
    perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3.0)))
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", learning_rate="auto", random_state=seed)
    return tsne.fit_transform(x)


def tsne_plot(entries: Sequence[tuple[str, Run]], base: Path, points: int = 1000, seed: int = 0,
              why: str = "") -> Plot | None:
    """One panel per ``(title, run)``; a shared class legend; ``why``: the caption's account
    of which runs were chosen."""
    from matplotlib import colormaps

    done = []
    for title, run in entries:
        h, y = run_features(run, points, seed)
        done.append((title, embed(h, seed), y))
    if not done:
        return None
    classes = int(max(y.max() for _, _, y in done)) + 1
    cmap = colormaps["tab10" if classes <= 10 else "tab20"]
    cols = min(len(done), 3)
    rows = (len(done) + cols - 1) // cols
    fig = new_figure(4.4 * cols + 1.0, 4.2 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(done):]:
        ax.set_visible(False)
    for ax, (title, xy, y) in zip(axes.flat, done):
        ax.scatter(xy[:, 0], xy[:, 1], c=[cmap(int(c) % cmap.N) for c in y], s=6, alpha=0.8, linewidths=0)
        ax.set_title(wrap_title(title, 40), fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    if classes <= 20:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="o", ls="", color=cmap(c % cmap.N), label=str(c)) for c in range(classes)]
        fig.legend(handles=handles, title="class", loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 1 - 0.9 / fig.get_figwidth(), 1))
    else:
        fig.tight_layout()
    png, svg = save(fig, base)
    n = len(done[0][2])
    return Plot("t-SNE of the global model's features",
                f"t-SNE of the final global model's features on {n} test samples (seeded subsample), "
                "coloured by true class." + (f" {why}" if why else ""), png, svg)


DEFAULT_WHY = ("Panels (report.tsne's default): {first} ({role}) and {best}, the setting with the highest mean "
               "{metric} at the first swept values; report.tsne=A,B,... embeds others, report.tsne=none none.")


def default_algorithms(groups: Sequence[Any], rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """``report.tsne``'s default and the caption's account of it: the reference method (or
    the grid's first, without one) beside the best other setting at the first swept values,
    by mean test accuracy at best validation when the runs have it, else mean best accuracy:
    the feature space of the method a reader weighs against the baseline's."""
    names = list(dict.fromkeys(g.algorithm for g in groups))
    if not names:
        return [], ""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    first, role = (ref, "the reference") if ref in names else (names[0], "the grid's first")
    sweep = groups[0].sweep
    here = [r for g, r in zip(groups, rows) if g.sweep == sweep and g.algorithm != first]
    key = ("test_accuracy_at_best_val_mean" if any(r.get("test_accuracy_at_best_val_mean") is not None for r in here)
           else "best_accuracy_mean")
    scored = [r for r in here if r.get(key) is not None]
    if not scored:
        return [first], ""
    best = max(scored, key=lambda r: r[key])["algorithm"]
    metric = "test accuracy at best validation" if key.startswith("test_accuracy_at_best_val") else "best accuracy"
    return [first, best], DEFAULT_WHY.format(first=first, role=role, best=best, metric=metric)


def choose_runs(groups: Sequence[Any], algorithms: Sequence[str] | None) -> list[tuple[str, Run]]:
    """The runs to embed: for each named algorithm (None: the grid's first two; the report
    passes :func:`default_algorithms`), its setting at the first swept values, the lowest
    seed that completed with a saved model."""
    if algorithms is None:
        algorithms = list(dict.fromkeys(g.algorithm for g in groups))[:2]
    if not groups:
        return []
    first = groups[0].sweep
    out = []
    for alg in algorithms:
        cands = [g for g in groups if g.algorithm == alg and g.sweep == first] or [g for g in groups if g.algorithm == alg]
        for g in cands[:1]:
            runs = [r for r in g.done() if (r.dir / "final_model.pt").is_file()]
            if runs:
                r = runs[0]
                out.append((f"{g.label}, seed {r.seed}", r))
    return out


__all__ = ["choose_runs", "default_algorithms", "embed", "run_features", "tsne_plot"]
