"""The page of a ``fedrift select``: the recommendation first, the budget it cost, then per
entry of the field where its trials were stopped (the rung, the score there), the best
trials' validation curves, the entries left out and why, and the confirmation's table (its
full report beside, in ``confirm/report.html``). ``select.html`` is self-contained like
``report.html``; ``select.md`` holds the same tables. Takes plain data: the trials as
:func:`fedrift.experiments.select` collects them (entry, values, the best validation score
so far at each round, status)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedrift.report.html import _e, _img, fit_table, page_head
from fedrift.report.plots import new_figure, save
from fedrift.report.table import markdown_lines


RUNG_NOTE = ("val % at N rounds: the best validation accuracy of the entry's trials that reached N rounds (how many "
             "did); furthest: the most rounds any of its trials ran, and how they ended (pruned: stopped by successive "
             "halving; budget: by the budget; completed: the full rounds).")


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.1f}"


def duration_text(seconds: float | None) -> str:
    """``5400`` -> ``1h30m``, ``300`` -> ``5 min``, ``40`` -> ``40 s``; None -> ``-``."""
    if seconds is None:
        return "-"
    m = int(round(seconds / 60))
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m} min" if m else f"{seconds:.0f} s"


def rung_rows(page: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Per entry: trials, how many reached each rung, its best score at each rung (%), the
    furthest rung any of its trials reached, and whether it was confirmed."""
    rungs: Sequence[int] = page["rungs"]
    picked = {t["entry"] for t in page["picked"]}
    headers = ["entry", "trials", *(f"val % at {r} rounds (trials)" for r in rungs), "furthest", "confirmed"]
    rows = []
    for entry in page["entries"]:
        own = [t for t in page["trials"] if t["entry"] == entry]
        cells: list[Any] = [entry, len(own)]
        for r in rungs:
            at = [t["curve"][r] for t in own if r in t["curve"]]
            cells.append(f"{_pct(max(at))} ({len(at)})" if at else "-")
        furthest = max((t["rounds"] for t in own), default=0)
        statuses = sorted({t["status"] for t in own if t["rounds"] == furthest}) if own else []
        cells += [f"{furthest} ({', '.join(statuses)})" if own else "no trial", "yes" if entry in picked else ""]
        rows.append([str(c) for c in cells])
    rows.sort(key=lambda c: (c[-1] != "yes", -int(str(c[-2]).split()[0]) if str(c[-2])[0].isdigit() else 0))
    return headers, rows


def _figure(root: Path, page: Mapping[str, Any]) -> Path | None:
    """The validation curves (best so far, per round) of each confirmed entry's best trial,
    and of every other entry's best trial, thinner: where the others were stopped."""
    trials = [t for t in page["trials"] if t["curve"]]
    if not trials:
        return None
    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    picked = {t["trial"] for t in page["picked"]}
    best: dict[str, Mapping[str, Any]] = {}
    for t in trials:
        if t["entry"] not in best or (t["rounds"], t["score"] or 0) > (best[t["entry"]]["rounds"], best[t["entry"]]["score"] or 0):
            best[t["entry"]] = t
    for entry, t in sorted(best.items(), key=lambda kv: kv[1]["trial"] in picked):
        xs, ys = zip(*sorted(t["curve"].items()))
        if t["trial"] in picked:
            ax.plot(xs, ys, linewidth=2, label=entry)
        else:
            ax.plot(xs, ys, linewidth=0.8, color="#999", alpha=0.7)
    for r in page["rungs"][:-1]:
        ax.axvline(r, color="#ccc", linestyle=":", linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel("best validation accuracy so far")
    ax.legend(fontsize=8, loc="lower right")
    png, _ = save(fig, root / "figures" / "select_curves")
    return png


def render_select_page(root: Path, page: Mapping[str, Any], figures: bool = True) -> Path:
    """Write ``select.html``, ``select.md`` (and the figure) in ``root``; returns the page's path."""
    rec = page["recommendation"]
    budget = page["budget"]
    spent = (f"{duration_text(budget['spent_seconds'])} of " + (duration_text(budget["seconds"]) if budget["seconds"] else "no time limit")
             + f"; {budget['spent_rounds']} rounds" + (f" of {budget['rounds']}" if budget["rounds"] else "")
             + f" (search and confirmation; the confirmation {len(page['picked'])} entries x {len(page['seeds'])} seeds "
             f"x {page['rounds']} rounds)")
    headers, rows = rung_rows(page)
    confirm_md = Path(page["confirm"]) / "results.md"
    left = [f"{k}: {v}" for k, v in page["left_out"].items()]
    md = ["# fedrift select", "", f"**{rec['text']}**", "", f"Budget spent: {spent}.", "",
          "## The search", "", *markdown_lines(headers, rows), "",
          RUNG_NOTE, ""]
    md += ["## Left out", "", *(f"- {line}" for line in left), ""] if left else []
    md += ["## The confirmation", "", confirm_md.read_text() if confirm_md.is_file() else "(no table)", ""]
    (root / "select.md").write_text("\n".join(md))
    png = _figure(root, page) if figures else None
    parts = [
        *page_head(f"fedrift select: {root.resolve().name}",
                   "; the search scores validation accuracy only; the test set is read by the confirmation's report"),
        f'<p id="recommendation"><strong>{_e(rec["text"])}</strong></p>',
        f'<p class="note">recommendation.yaml holds it as a config (fedrift run -c recommendation.yaml). Budget spent: {_e(spent)}.</p>',
        "<h2>The search</h2>",
        *fit_table("rungs", headers, rows),
        f'<p class="note">{_e(RUNG_NOTE)}</p>',
    ]
    if png is not None:
        parts += ["<figure>", _img(png, "validation curves"), "<figcaption>The best validation accuracy so far, per "
                  "round, of each entry's best trial: the confirmed entries in colour, the others in grey (where they "
                  "stopped); dotted lines mark the rungs.</figcaption>", "</figure>"]
    if left:
        parts += ["<h2>Left out</h2>", "<ul>", *(f"<li>{_e(line)}</li>" for line in left), "</ul>"]
    parts += ["<h2>The confirmation</h2>",
              f'<p class="note">Each confirmed entry at its best trial\'s values, over seeds {_e(",".join(map(str, page["seeds"])))} '
              "(not the search's), against FedAvg at its own best: the full report is confirm/report.html.</p>"]
    if confirm_md.is_file():
        lines = [ln for ln in confirm_md.read_text().splitlines() if ln.startswith("|")]
        if len(lines) > 2:
            head = [c.strip() for c in lines[0].strip("|").split("|")]
            body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
            parts += fit_table("confirmation", head, body)
    parts += ["</body>", "</html>", ""]
    out = root / "select.html"
    out.write_text("\n".join(parts))
    return out


__all__ = ["duration_text", "render_select_page", "rung_rows"]
