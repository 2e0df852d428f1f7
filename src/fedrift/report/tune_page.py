"""The page of a ``fedrift tune``: a summary table first (per algorithm entry: the best
values, flagged where one lies at the edge of its range, the score, the trials), the base
the tune ran on, then per entry the best trial's curves (validation and test accuracy per
round), the score against each hyper-parameter, and the trials table. ``tune.html`` is
self-contained like ``report.html`` (figures inline); ``tune.md`` holds the same tables.

The curves' names: *validation* and *test* are the global model on the clients' validation
samples and on the test set; *own validation* and *own test* (personal-model methods such as
FedProto) are each client's own model on that client's own validation samples or local test
split, averaged over the clients. The score is the best validation accuracy over the rounds
(own validation for personal models); the test set is shown, never used to choose."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from fedrift.report.html import _e, _img, fit_table, page_head
from fedrift.report.table import read_metrics
from fedrift.safe_files import write_atomic


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _figure(root: Path, name: str, study: Mapping[str, Any]) -> Path | None:
    """Two panels and more: the best trial's curves, then the score against each key."""
    trials = [t for t in study["trials"] if t["val_accuracy"] is not None]
    keys = list(study["space"])
    if not trials:
        return None
    n = 1 + len(keys)
    from fedrift.report.plots import new_figure, save  # matplotlib: only where a figure is drawn

    fig = new_figure(3.6 * n, 3.0)
    ax = fig.add_subplot(1, n, 1)
    best = study["best"]
    if best is not None:
        rows = read_metrics(Path(best["dir"]) / "metrics.jsonl")
        for key, label in (("val_accuracy", "validation"), ("test_accuracy", "test"),
                           ("val_local_accuracy", "own validation (the score)"), ("local_accuracy", "own test")):
            pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=label)
        ax.legend(fontsize=8)
    ax.set_title(f"best trial ({best['trial']})" if best else "no finished trial", fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    for i, key in enumerate(keys, start=2):
        ax = fig.add_subplot(1, n, i)
        for status, marker in (("completed", "o"), ("pruned", "x"), ("diverged", "v")):
            pts = [(t["params"][key], t["val_accuracy"]) for t in trials if t["status"] == status and key in t["params"]
                   and isinstance(t["params"][key], (int, float))]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=status, s=18)
        if study["space"][key].startswith("log:"):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_title("validation accuracy (best round)", fontsize=9)
        ax.legend(fontsize=7)
    png, _ = save(fig, root / "figures" / f"tune-{name}")
    return png


EXPLAIN = ("Each trial is one run of the tune's config at the trial's values, scored by its best validation accuracy "
           "over the rounds: the global model on the clients' validation samples. For a personal-model method "
           "(FedProto) the score is its own validation accuracy: each client's own model on that client's "
           "validation samples, averaged over the clients; its curve beside it, own test, is the same on each "
           "client's own test split. A run that fine-tunes each client's model after training (eval.personalize) "
           "scores those fine-tuned models on their clients' validation samples, once (personalized_val_accuracy). "
           "The test curve (the global model on the test set) is shown, never used to choose.")
EDGE_NOTE = ("edge: a best value within 5% of an end of its range (of its logarithm for log:), or the least or "
             "greatest of a list of three or more: the best may lie beyond the range searched; widen it "
             "(space.KEY=...) and tune again.")
BASE_KEYS = ("data.name", "model.name", "partition.name", "partition.alpha", "partition.num_clients",
             "partition.val_share", "train.rounds", "train.clients_per_round", "train.local_epochs", "train.batch_size")


def _values(r: Mapping[str, Any]) -> str:
    b = r["best"]
    if not b:
        return "-"
    edges = r.get("edges") or {}
    return " ".join(f"{k}={_fmt(v)}" + (f" ({edges[k]} edge)" if k in edges else "") for k, v in b["params"].items())


def summary_rows(results: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The summary table: per entry its best values (edges flagged), score, trial, trials."""
    headers = ["algorithm", "best values", "score", "metric", "trial", "finished / tried", "at the edge"]
    cells = []
    for r in results.values():
        b = r["best"]
        done = sum(t["state"] in ("complete", "pruned") for t in r["trials"])
        edges = r.get("edges") or {}
        cells.append([r["entry"], _values(r), _fmt(b["val_accuracy"]) if b else "-",
                      (b["metric"] if b else "-"), str(b["trial"]) if b else "-", f"{done} / {len(r['trials'])}",
                      ", ".join(f"{k} ({side})" for k, side in edges.items()) or "-"])
    return headers, cells


def base_line(results: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The base the choices were made on (the main keys; best.yaml holds them all), once
    when every entry shares it."""
    bases = [r.get("base") for r in results.values() if r.get("base")]
    if not bases:
        return None
    keys = [k for k in BASE_KEYS if any(k in b for b in bases)]
    shown = []
    for k in keys:
        vals = list(dict.fromkeys(_fmt(b.get(k)) for b in bases))
        shown.append(f"{k}={'/'.join(vals)}")
    return ("Tuned on " + ", ".join(shown) + " (best.yaml holds every data, model, partition and train key of the "
            "base; fedrift compare ... tuned=DIR warns when its runs differ from it).")


def render_tune_page(root: Path, results: Mapping[str, Mapping[str, Any]], figures: bool = True) -> tuple[Path, str]:
    """Write ``tune.html`` (and figures) in ``root``; returns its path and the Markdown tables."""
    from fedrift.report.table import markdown_lines

    headers, cells = summary_rows(results)
    base = base_line(results)
    md = ["# fedrift tune", "", *markdown_lines(headers, cells), "", EDGE_NOTE]
    md += ["", base] if base else []
    md += ["", EXPLAIN]
    parts = [
        *page_head(f"fedrift tune: {root.resolve().name}",
                   "; trials scored by their best validation accuracy (the test set is shown, never used to choose)"),
        "<h2>Summary</h2>",
        *fit_table("summary", headers, cells),
        f'<p class="note">score: the best trial\'s best validation accuracy (metric: which one). {_e(EDGE_NOTE)}</p>',
        *([f'<p class="note" id="base">{_e(base)}</p>'] if base else []),
        *(f'<p class="warn">{_e(r["entry"])}: {_e(k)} at the {_e(side)} edge of its range {_e(r["space"].get(k, ""))}: '
          f"the best may lie beyond it.</p>" for r in results.values() for k, side in (r.get("edges") or {}).items()),
        f'<p class="note" id="explain">{_e(EXPLAIN)}</p>',
    ]
    for name, r in results.items():
        parts += [f"<h2>{_e(r['entry'])}</h2>", '<table class="kv"><tbody>',
                  *(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in r["space"].items()), "</tbody></table>"]
        png = _figure(root, name, r) if figures else None
        if png is not None:
            parts += ["<figure>", _img(png, f"tune of {r['entry']}"),
                      "<figcaption>Left: the best trial's accuracy per round (validation, test; own validation and "
                      "own test for a personal-model method). Then the score of every trial against each value "
                      "searched.</figcaption>", "</figure>"]
        keys = list(r["space"])
        parts += ['<div class="scroll"><table id="trials-' + _e(name) + '">', "<thead><tr>"
                  + "".join(f"<th>{_e(h)}</th>" for h in ["trial", "status", "val accuracy", "rounds", *keys]) + "</tr></thead>",
                  "<tbody>"]
        for t in sorted(r["trials"], key=lambda t: -(t["val_accuracy"] if t["val_accuracy"] is not None else -1)):
            cells = [t["trial"], t["status"], _fmt(t["val_accuracy"]), t["rounds"], *(_fmt(t["params"].get(k)) for k in keys)]
            parts.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
        parts += ["</tbody></table></div>"]
    parts += ["</body>", "</html>", ""]
    out = root / "tune.html"
    write_atomic(out, "\n".join(parts))
    return out, "\n".join(md) + "\n"
