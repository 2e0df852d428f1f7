"""The page of a ``fedrift select``, written whatever the outcome (recommended, provisional,
no recommendation, stopped, refused): the outcome first and why, the recommendation's words
(:mod:`fedrift.experiments.select_verdict`: the verdict, each entry's tuning and
communication), the budget plan, what ran (the budget spent; per entry of the field where
its trials were stopped, the rung, the score there; the best trials' validation curves), what
is missing, the entries left out and why, and the confirmation's table (its full report
beside, in ``confirm/report.html``). ``select.html`` is self-contained like ``report.html``;
``select.md`` says the same. Takes plain data, any key of which may be absent or empty (a
select refused before any trial has no trials, picks, confirmation or budget spent): the
trials as :func:`fedrift.experiments.select` collects them (entry, values, the best
validation score so far at each round, status)."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedrift.report.html import _e, _img, fit_table, page_head
from fedrift.report.table import markdown_lines
from fedrift.safe_files import make_dir, write_atomic


RUNG_NOTE = ("trials: the entry's trials, not counting those the budget stopped (+k budget: they are not its tuning); "
             "val % at N rounds: the best validation accuracy of the entry's trials that reached N rounds (how many "
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


OUTCOMES = {  # page["outcome"] -> its words
    "recommended": "recommended",
    "provisional": "a provisional recommendation",
    "no recommendation": "no recommendation",
    "stopped": "stopped before it ended",
    "refused": "refused: nothing ran",
}


def rounds_text(n: Any) -> str:
    """``1 round``, ``12 rounds``."""
    return f"{n} round" if n == 1 else f"{n} rounds"


def _curve(trial: Mapping[str, Any]) -> dict[int, float]:
    """A trial's curve with round numbers as ints (plain data read back from JSON has strings)."""
    return {int(k): v for k, v in (trial.get("curve") or {}).items()}


def rung_rows(page: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Per entry: trials (those the budget stopped apart: ``2 (+1 budget)``; they are not its
    tuning), how many reached each rung, its best score at each rung (%), the furthest rung any
    of its trials reached, and whether it was confirmed."""
    rungs: Sequence[int] = page.get("rungs") or []
    trials = page.get("trials") or []
    picked = {t["entry"] for t in page.get("picked") or []}
    headers = ["entry", "trials", *(f"val % at {rounds_text(r)} (trials)" for r in rungs), "furthest", "confirmed"]
    rows = []
    for entry in page.get("entries") or list(dict.fromkeys(t["entry"] for t in trials)):
        own = [t for t in trials if t["entry"] == entry]
        cut = sum(t.get("status") == "budget" for t in own)
        cells: list[Any] = [entry, f"{len(own) - cut}" + (f" (+{cut} budget)" if cut else "")]
        for r in rungs:
            at = [_curve(t)[r] for t in own if r in _curve(t) and _curve(t)[r] is not None]
            cells.append(f"{_pct(max(at))} ({len(at)})" if at else "-")
        furthest = max((t.get("rounds") or 0 for t in own), default=0)
        statuses = sorted({str(t.get("status")) for t in own if (t.get("rounds") or 0) == furthest}) if own else []
        cells += [f"{furthest} ({', '.join(statuses)})" if own else "no trial", "yes" if entry in picked else ""]
        rows.append([str(c) for c in cells])
    rows.sort(key=lambda c: (c[-1] != "yes", -int(str(c[-2]).split()[0]) if str(c[-2])[0].isdigit() else 0))
    return headers, rows


def _figure(root: Path, page: Mapping[str, Any]) -> Path | None:
    """The validation curves (best so far, per round) of each confirmed entry's best trial,
    and of every other entry's best trial, thinner: where the others were stopped."""
    trials = [t for t in page.get("trials") or [] if t.get("curve")]
    if not trials:
        return None
    from fedrift.report.plots import new_figure, save  # matplotlib: only where a figure is drawn

    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    picked = {t["trial"] for t in page.get("picked") or []}
    best: dict[str, Mapping[str, Any]] = {}
    for t in trials:
        if t["entry"] not in best or (t["rounds"], t["score"] or 0) > (best[t["entry"]]["rounds"], best[t["entry"]]["score"] or 0):
            best[t["entry"]] = t
    for entry, t in sorted(best.items(), key=lambda kv: kv[1]["trial"] in picked):
        xs, ys = zip(*sorted(_curve(t).items()))
        if t["trial"] in picked:
            ax.plot(xs, ys, linewidth=2, label=entry)
        else:
            ax.plot(xs, ys, linewidth=0.8, color="#999", alpha=0.7)
    for r in (page.get("rungs") or [])[:-1]:
        ax.axvline(r, color="#ccc", linestyle=":", linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel("best validation accuracy so far")
    if picked & {t["trial"] for t in best.values()}:
        ax.legend(fontsize=8, loc="lower right")
    png, _ = save(fig, root / "figures" / "select_curves")
    return png


def spent_text(page: Mapping[str, Any]) -> str | None:
    """The budget and what was spent of it, or None when the page has no budget."""
    budget = page.get("budget") or {}
    if not budget:
        return None
    seconds, rounds = budget.get("seconds"), budget.get("rounds")
    spent_s, spent_r = budget.get("spent_seconds"), budget.get("spent_rounds")
    text = (f"{duration_text(spent_s) if spent_s is not None else 'nothing'} of "
            + (duration_text(seconds) if seconds else "no time limit"))
    if spent_r is not None or rounds:
        text += f"; {rounds_text(spent_r or 0)}" + (f" of {rounds}" if rounds else "")
    picked, seeds = page.get("picked") or [], page.get("seeds") or []
    if picked and seeds and page.get("rounds"):
        entries = f"{len(picked)} entr{'y' if len(picked) == 1 else 'ies'}"
        text += (f" (search and confirmation; the confirmation {entries} x {len(seeds)} seed{'s' * (len(seeds) != 1)} "
                 f"x {rounds_text(page['rounds'])})")
    return text


def _outcome(page: Mapping[str, Any]) -> str:
    rec = page.get("recommendation") or {}
    outcome = page.get("outcome") or ("recommended" if rec.get("tested") else "provisional" if rec else "no recommendation")
    words = OUTCOMES.get(str(outcome), str(outcome))
    reason = page.get("reason")
    return f"Outcome: {words}" + (f": {reason}" if reason else "")


def _missing(page: Mapping[str, Any]) -> list[str]:
    rec = page.get("recommendation") or {}
    out = [str(m) for m in page.get("missing") or []]
    out += [f"confirmation: {m}" for m in rec.get("missing") or [] if f"confirmation: {m}" not in out]
    return out


def _rec_lines(page: Mapping[str, Any]) -> tuple[str | None, list[str], str | None]:
    """The verdict's headline, its other lines (tuning, communication...), and the command to
    run next (6 seeds, or a larger budget), from ``recommend``'s dict."""
    rec = page.get("recommendation") or {}
    if not rec:
        return None, [], None
    lines = list(rec.get("lines") or [rec.get("text", "")])
    text = rec.get("text") or (lines[0] if lines else None)
    rest = [ln for ln in lines if ln != text and not ln.startswith("partial confirmation: ")]
    return text, rest, rec.get("command")


def _confirm_table(page: Mapping[str, Any]) -> Path | None:
    confirm = page.get("confirm")
    if not confirm:
        return None
    path = Path(confirm) / "results.md"
    return path if path.is_file() else None


def render_select_page(root: Path, page: Mapping[str, Any], figures: bool = True) -> Path:
    """Write ``select.html``, ``select.md`` (and the figure) in ``root``, whatever the outcome;
    returns the page's path. The page says when it was written (seconds and time zone): at the
    select's end."""
    root = Path(root)
    make_dir(root)
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    outcome = _outcome(page)
    text, rest, command = _rec_lines(page)
    plan_lines = [str(x) for x in ((page.get("plan") or {}).get("lines") or [])]
    spent = spent_text(page)
    missing = _missing(page)
    trials = page.get("trials") or []
    headers, rows = rung_rows(page) if trials or page.get("entries") else ([], [])
    confirm_md = _confirm_table(page)
    left = [f"{k}: {v}" for k, v in (page.get("left_out") or {}).items()]
    seeds = page.get("seeds") or []

    setting = str(page.get("setting") or "")  # the base config's data and partition
    title = f"fedrift select on {setting}" if setting else f"fedrift select: {root.resolve().name}"
    md = [f"# {title}" if setting else "# fedrift select", "", f"**{outcome}**", ""]
    if text:
        md += [text, "", *(f"- {ln}" for ln in rest), *([""] if rest else [])]
        md += ["Next:", "", f"    {command}", ""] if command else []
    md += ["## The plan", "", *(f"- {ln}" for ln in plan_lines), ""] if plan_lines else ["## The plan", "", "(no plan)", ""]
    md += ["## What ran", "", f"Budget spent: {spent}." if spent else "Nothing ran.", ""]
    if rows:
        md += [*markdown_lines(headers, rows), "", RUNG_NOTE, ""]
    else:
        md += ["No trial ran.", ""]
    md += ["## What is missing", "", *(f"- {m}" for m in missing), ""] if missing else []
    md += ["## Left out", "", *(f"- {line}" for line in left), ""] if left else []
    md += ["## The confirmation", "", confirm_md.read_text() if confirm_md else "(no confirmation table)", ""]
    md += [f"Page written {generated}, when the select ended.", ""]
    write_atomic(root / "select.md", "\n".join(md))

    png = _figure(root, page) if figures and trials else None
    kind = "warn" if str(page.get("outcome") or "") in ("no recommendation", "stopped", "refused") else "meta"
    parts = [
        *page_head(title,
                   ", when the select ended; the search scores validation accuracy only; the test set is read by the "
                   "confirmation's report", generated=generated),
        f'<p id="outcome" class="{kind}"><strong>{_e(outcome)}</strong></p>',
    ]
    if text:
        parts.append(f'<p id="recommendation"><strong>{_e(text)}</strong></p>')
        if rest:
            parts += ['<ul id="verdict-details">', *(f"<li>{_e(ln)}</li>" for ln in rest), "</ul>"]
        if command:
            parts += ['<p class="note">Next:</p>', f'<pre id="next">{_e(command)}</pre>']
        if (page.get("recommendation") or {}).get("choice") and (root / "recommendation.yaml").is_file():
            parts.append('<p class="note">recommendation.yaml holds it as a config (fedrift run -c '
                         "recommendation.yaml).</p>")
    parts += ["<h2>The plan</h2>"]
    parts += ['<ul id="plan">', *(f"<li>{_e(ln)}</li>" for ln in plan_lines), "</ul>"] if plan_lines else [
        '<p class="note">(no plan)</p>']
    parts += ["<h2>What ran</h2>", f'<p class="note" id="spent">{_e(f"Budget spent: {spent}." if spent else "Nothing ran.")}</p>']
    if rows:
        parts += [*fit_table("rungs", headers, rows), f'<p class="note">{_e(RUNG_NOTE)}</p>']
    else:
        parts.append('<p class="note">No trial ran.</p>')
    if png is not None:
        parts += ["<figure>", _img(png, "validation curves"), "<figcaption>The best validation accuracy so far, per "
                  "round, of each entry's best trial: the confirmed entries in colour, the others in grey (where they "
                  "stopped); dotted lines mark the rungs.</figcaption>", "</figure>"]
    if missing:
        parts += ["<h2>What is missing</h2>", '<ul id="missing">', *(f"<li>{_e(m)}</li>" for m in missing), "</ul>"]
    if left:
        parts += ["<h2>Left out</h2>", "<ul>", *(f"<li>{_e(line)}</li>" for line in left), "</ul>"]
    parts += ["<h2>The confirmation</h2>"]
    if seeds and page.get("picked"):
        parts.append(f'<p class="note">Each confirmed entry at its best trial\'s values, over seeds '
                     f'{_e(",".join(map(str, seeds)))} (not the search\'s), against FedAvg at its own best: the full '
                     "report is confirm/report.html.</p>")
    body = []
    if confirm_md:
        lines = [ln for ln in confirm_md.read_text().splitlines() if ln.startswith("|")]
        if len(lines) > 2:
            head = [c.strip() for c in lines[0].strip("|").split("|")]
            body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
            parts += fit_table("confirmation", head, body)
    if not body:
        parts.append('<p class="note">No confirmation table: no confirmation run finished.</p>')
    parts += ["</body>", "</html>", ""]
    out = root / "select.html"
    write_atomic(out, "\n".join(parts))
    return out


__all__ = ["OUTCOMES", "duration_text", "render_select_page", "rounds_text", "rung_rows", "spent_text"]
