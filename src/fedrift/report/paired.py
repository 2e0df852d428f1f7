"""Paired differences to a reference method, with a t confidence interval over seeds.

Every method of a grid sees, for a given seed, the same partition, client samples and batch
order, so a seed's noise is shared: the difference of two methods on the *same* seed is far
less noisy than two independent means. Per setting, against the reference setting with the
same swept values (``report.reference``, default ``fedavg`` when the grid has it):

- the pairs are the seeds at which both runs completed;
- per pair, d = this setting's accuracy - the reference's (best, final and, with a
  validation split, at best validation);
- ``*_diff_mean`` is the mean of the d's; ``*_diff_ci95`` the half-width of the 95% Student t
  interval, ``t(0.975, n - 1) * sd(d, ddof=1) / sqrt(n)``; ``*_diff_low``/``*_diff_high`` its
  ends; ``*_diff_significant`` whether it excludes 0; ``*_diff_n`` the pairs. One pair gives a
  difference and no interval (None, shown ``-``); none gives nothing.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError

# summary keys compared, and their names in the tables
METRICS = (("best_accuracy", "best"), ("final_accuracy", "final"), ("test_accuracy_at_best_val", "at best val"))
LEVEL = 0.95


def interval(diffs: Sequence[float], level: float = LEVEL) -> tuple[float | None, float | None]:
    """(mean, half-width of the ``level`` t interval) of paired differences; half-width
    None for one difference, both None for none."""
    d = [float(x) for x in diffs]
    if not d:
        return None, None
    mean = statistics.fmean(d)
    if len(d) < 2:
        return mean, None
    from scipy.stats import t  # scipy is slow to import: only when there is an interval to take

    return mean, float(t.ppf(0.5 + level / 2, len(d) - 1)) * statistics.stdev(d) / math.sqrt(len(d))


def resolve_reference(spec: str | None, algorithms: Sequence[str]) -> str | None:
    """The reference setting's algorithm label: ``spec`` as a label of the grid, or the name
    of exactly one of its algorithms (``fedadc`` for ``fedadc:variant=nesterov``); ``auto``:
    ``fedavg`` when the grid has it, else none; None or ``none``: no paired differences."""
    if spec is None or spec.strip().lower() in ("none", "off", ""):
        return None
    names = list(dict.fromkeys(algorithms))
    if spec == "auto":
        return "fedavg" if "fedavg" in names else None
    if spec in names:
        return spec
    same = [a for a in names if a.split(":", 1)[0] == spec]
    if len(same) == 1:
        return same[0]
    allowed = ", ".join(names) + ", none"
    if same:
        raise ConfigError(f"report.reference: {spec!r} names {len(same)} settings ({', '.join(same)}); allowed: one of {allowed}")
    raise ConfigError(f"report.reference: {spec!r} is not an algorithm of the grid; allowed: {allowed}")


def add_paired(groups: Sequence[Any], rows: Sequence[dict[str, Any]], reference: str | None) -> None:
    """Add the paired-difference keys (module docstring) to each row of a setting that has a
    reference at its swept values; ``rows[i]`` is ``groups[i]``'s. The reference's own row
    and rows with no reference get ``reference`` only (the differences stay absent)."""
    if reference is None:
        return
    present = [key for key, _ in METRICS if any(key in r.summary for g in groups for r in g.runs)]
    for g, row in zip(groups, rows):
        row["reference"] = reference
        ref = next((h for h in groups if h.algorithm == reference and h.sweep == g.sweep), None)
        if ref is None or ref is g:
            continue
        row.update(differences(g, ref, present))


def differences(g: Any, ref: Any, keys: Sequence[str]) -> dict[str, Any]:
    """Setting ``g`` against setting ``ref`` on the seeds at which both completed, per summary
    key: ``KEY_diff_mean``, ``_ci95``, ``_n``, ``_low``, ``_high`` and ``_significant``."""
    theirs = {r.seed: r for r in ref.done() if r.seed is not None}
    pairs = [(r, theirs[r.seed]) for r in g.done() if r.seed in theirs]
    out: dict[str, Any] = {}
    for key in keys:
        diffs = [a.summary[key] - b.summary[key] for a, b in pairs
                 if _number(a.summary.get(key)) and _number(b.summary.get(key))]
        mean, half = interval(diffs)
        low, high = (mean - half, mean + half) if mean is not None and half is not None else (None, None)
        out[f"{key}_diff_mean"], out[f"{key}_diff_ci95"], out[f"{key}_diff_n"] = mean, half, len(diffs)
        out[f"{key}_diff_low"], out[f"{key}_diff_high"] = low, high
        out[f"{key}_diff_significant"] = None if low is None or high is None else (low > 0 or high < 0)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def headers(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(summary key, column header) of the paired columns the rows have."""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    if ref is None:
        return []
    return [(key, f"{name} vs {ref}") for key, name in METRICS if any(f"{key}_diff_n" in r for r in rows)]


def cell(row: Mapping[str, Any], key: str, pm: str = "+-") -> str:
    """``+2.0 +- 2.5*`` in percentage points (``*``: the interval excludes 0), ``+2.0 +- -``
    for one seed, ``ref`` on the reference's row, ``-`` when nothing pairs."""
    if row.get("algorithm") == row.get("reference"):
        return "ref"
    return fmt_diff(row.get(f"{key}_diff_mean"), row.get(f"{key}_diff_ci95"), row.get(f"{key}_diff_significant"), pm)


def fmt_diff(mean: float | None, half: float | None, significant: bool | None, pm: str = "+-") -> str:
    """A paired difference in percentage points: ``+2.0 +- 2.5*``, ``+2.0 +- -``, ``-``."""
    if mean is None:
        return "-"
    if half is None:
        return f"{100 * mean:+.1f} {pm} -"
    return f"{100 * mean:+.1f} {pm} {100 * half:.1f}" + ("*" if significant else "")


NOTE = ("'vs {ref}': paired differences in percentage points, the mean over seeds of (setting - {ref}) on the same "
        "seed and swept values, {pm} the half-width of the 95% Student t interval (ddof=1); * when the interval "
        "excludes 0; '{pm} -' with one seed (no interval).")


def note(rows: Sequence[Mapping[str, Any]], pm: str = "+-") -> str | None:
    """The tables' footnote on the paired columns, or None without them."""
    if not headers(rows):
        return None
    return NOTE.format(ref=next(r["reference"] for r in rows if r.get("reference")), pm=pm)


__all__ = ["METRICS", "add_paired", "cell", "differences", "fmt_diff", "headers", "interval", "note", "resolve_reference"]
