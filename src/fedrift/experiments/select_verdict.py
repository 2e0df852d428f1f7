"""What a select's confirmation lets one say: the recommendation and its words, from the
confirmation's rows (paired test gains over FedAvg, their intervals and tests). Plain data
in, plain data out: ``recommendation.yaml`` and the page read it."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError
from fedrift.overrides import parse_algorithm
from fedrift.report.table import short_names

REFERENCE = "fedavg"
SIGN_FLIP_SEEDS = 6  # the fewest paired seeds whose exact sign-flip test can give p < 0.05 (2^(1-n))


def recommend(plan: Any, rows: Sequence[Mapping[str, Any]], picked: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The confirmed entry with the best mean validation accuracy, and what its paired test
    gain over FedAvg lets one say (plain data: the page and ``recommendation.yaml`` read it)."""
    by_entry = {str(r["algorithm"]): r for r in rows}
    ref_entry = next(t["entry"] for t in picked if parse_algorithm(t["entry"])[0] == REFERENCE)
    val = {e: r.get("best_val_accuracy_mean") for e, r in by_entry.items()}
    ranked = sorted((e for e in by_entry if val.get(e) is not None), key=lambda e: val[e], reverse=True)
    if not ranked:
        raise ConfigError("select: no confirmation run finished; nothing to recommend")
    best = ranked[0]
    values = {t["entry"]: t["values"] for t in picked}
    ref_text = ("FedAvg" if ref_entry == REFERENCE else ref_entry) + " at " + (  # its options said, if any
        values_text(values.get(ref_entry, {})) or "its config's values")
    out: dict[str, Any] = {"validation_order": ranked, "reference": ref_entry}
    if best == ref_entry:
        runner = ranked[1] if len(ranked) > 1 else None
        r = by_entry.get(runner) if runner else None
        gain = _gain(r)
        out.update(choice=ref_entry, verdict="fedavg",
                   text=f"{ref_text} is as good as any on this data: it has the best validation accuracy of the "
                        f"confirmed entries" + (f"; the next, {runner}, is {gain} on test accuracy" if r else ""))
        return out
    r = by_entry[best]
    n = int(r.get("test_accuracy_at_best_val_diff_n") or 0)
    low, high = r.get("test_accuracy_at_best_val_diff_low"), r.get("test_accuracy_at_best_val_diff_high")
    significant = bool(r.get("test_accuracy_at_best_val_diff_significant"))
    excludes = low is not None and high is not None and low > 0
    if significant:
        out.update(choice=best, verdict="significant",
                   text=f"{best} beats {ref_text}: {_gain(r)} on test accuracy (significant: sign-flip p < 0.05 and "
                        f"the interval excludes 0, {n} seeds)")
    elif excludes and n < SIGN_FLIP_SEEDS:
        out.update(choice=best, verdict="ahead, not tested",
                   text=f"{best} is ahead of {ref_text}: {_gain(r)} on test accuracy, the interval excludes 0, but "
                        f"not significant: {n} seeds cannot pass the sign-flip test ({SIGN_FLIP_SEEDS} needed); run "
                        f"seeds= with {SIGN_FLIP_SEEDS} or more to test it")
    elif excludes:
        p = r.get("test_accuracy_at_best_val_diff_p")
        p = "-" if p is None else f"{p:.3g}"
        out.update(choice=best, verdict="ahead, not significant",
                   text=f"{best} is ahead of {ref_text}: {_gain(r)} on test accuracy, the interval excludes 0, but "
                        f"the sign-flip test does not pass (p = {p} over {n} seeds; significant: p < 0.05): "
                        "its gain is not consistent across seeds")
    else:
        out.update(choice=ref_entry, verdict="fedavg",
                   text=f"no candidate beats FedAvg significantly: {ref_text} is as good as any on this data "
                        f"(the best by validation, {best}, is {_gain(r)} on test accuracy)")
    return out


def values_text(values: Mapping[str, Any]) -> str:
    """``{"train.lr": 0.0124, "algorithm.mu": 0.1}`` -> ``lr 0.0124, mu 0.1``."""
    names = short_names(list(values))  # the table's rule: the last part unless two keys share it
    return ", ".join(f"{names[k]} {v:.3g}" if isinstance(v, float) else f"{names[k]} {v}" for k, v in values.items())


def _gain(row: Mapping[str, Any] | None) -> str:
    if not row or row.get("test_accuracy_at_best_val_diff_mean") is None:
        return "not paired"
    mean, ci = row["test_accuracy_at_best_val_diff_mean"], row.get("test_accuracy_at_best_val_diff_ci95")
    n = int(row.get("test_accuracy_at_best_val_diff_n") or 0)
    # the rows hold fractions; the tables (and this line) show percentage points
    if ci is not None and math.isfinite(ci):
        return f"{100 * mean:+.1f} +- {100 * ci:.1f} points ({n} seeds)"
    return f"{100 * mean:+.1f} points ({n} seed)"


def wrap(text: str, width: int = 96) -> list[str]:
    out, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return out + ([cur] if cur else [])


__all__ = ["REFERENCE", "SIGN_FLIP_SEEDS", "recommend", "values_text", "wrap"]
