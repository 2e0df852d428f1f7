"""The page of a ``fedrift tune``: per algorithm entry, the best values, the best trial's
curves (validation and test accuracy per round), the score against each hyper-parameter, and
the trials table. ``tune.html`` is self-contained like ``report.html`` (figures inline);
``tune.md`` holds the same tables."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any, Mapping

from fedrift.report.html import CSS, _e, _img
from fedrift.report.plots import new_figure, save
from fedrift.report.table import read_metrics


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


def render_tune_page(root: Path, results: Mapping[str, Mapping[str, Any]], figures: bool = True) -> tuple[Path, str]:
    """Write ``tune.html`` (and figures) in ``root``; returns its path and the Markdown tables."""
    from fedrift import __version__

    md = ["# fedrift tune", "", "| algorithm | best values | val accuracy | trial | finished / tried |", "|---|---|---|---|---|"]
    for r in results.values():
        b = r["best"]
        done = sum(t["state"] in ("complete", "pruned") for t in r["trials"])
        values = " ".join(f"{k}={_fmt(v)}" for k, v in b["params"].items()) if b else "-"
        md.append(f"| {r['entry']} | {values} | {_fmt(b['val_accuracy']) if b else '-'} | {b['trial'] if b else '-'} "
                  f"| {done} / {len(r['trials'])} |")
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>fedrift tune: {_e(root.resolve().name)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        f"<h1>fedrift tune: {_e(root.resolve().name)}</h1>",
        f'<p class="meta">fedrift {_e(__version__)}, generated {_e(datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))}; '
        "trials scored by their best validation accuracy (the test set is shown, never used to choose)</p>",
    ]
    for name, r in results.items():
        parts += [f"<h2>{_e(r['entry'])}</h2>", '<table class="kv"><tbody>',
                  *(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in r["space"].items()), "</tbody></table>"]
        png = _figure(root, name, r) if figures else None
        if png is not None:
            parts += ["<figure>", _img(png, f"tune of {r['entry']}"), "</figure>"]
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
    out.write_text("\n".join(parts))
    return out, "\n".join(md) + "\n"
