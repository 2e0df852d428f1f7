"""What a select's confirmation lets one say: the recommendation and its words, from the
confirmation's rows (paired test gains over FedAvg, their intervals and tests) and the
search's trials. Plain data in, plain data out: ``recommendation.yaml`` and the page read it.

The words say only what the seeds show (docs/concepts/fairness.md, "What select's verdict
says"):

- Below :data:`SIGN_FLIP_SEEDS` (6) paired seeds no difference can pass the exact sign-flip
  test (its smallest p is 2^(1-n)), so the verdict says per seed what happened, "ahead on
  every seed", "behind on every seed" or "mixed (k of n seeds ahead)", then "not tested", and
  the command that confirms over 6 seeds. A candidate ahead on every seed is recommended
  provisionally; otherwise FedAvg is kept, untested.
- From 6 seeds the project's rule decides: significant when the sign-flip p < 0.05 *and* the
  t interval excludes 0.
- "As good as any" is an equivalence: it is said only when every confirmed candidate's 95%
  interval lies inside +-``margin`` (:data:`MARGIN`, 1 point of accuracy unless told) over 6 or
  more seeds, and the margin is said with it. A difference not shown is "not shown", never
  "none".
- ``report.metric`` (``metric=``) says what the confirmed entries are ranked on and the gain
  is judged on: by default (or ``accuracy``) their validation accuracy, and the gain in test
  accuracy at the best validation round; ``local_accuracy`` or ``local_accuracy_worst10``: the
  mean over the confirmation's seeds of ``final_local_accuracy`` (each client's accuracy on its
  own test split, averaged over the clients) or ``final_local_accuracy_worst10`` (the worst 10%
  of clients' mean), and the paired gain on that same key. The search itself always scores
  validation accuracy (it never reads a test split). A given metric is named at the head of
  the verdict.
- When the recommended entry is not FedAvg and its worst 10% of clients score lower than
  FedAvg's on the confirmation's runs (``final_local_accuracy_worst10``, mean over the runs that
  report it), a sentence says so with both numbers: a gain in the mean can hide a loss in the tail.
- Each entry's tuning (the search's trials of it, the furthest rounds one reached; a trial the
  budget stopped is said apart, not counted as tuning) and its communication a round beside
  FedAvg's are said with the verdict: a reference tuned less, or a candidate that sends twice
  the bytes, is part of the answer.
"""

from __future__ import annotations

import math
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError
from fedrift.overrides import parse_algorithm
from fedrift.report.table import RANK_METRICS, WORST10_KEY, check_metric, fmt_bytes, load_groups, short_names

REFERENCE = "fedavg"
SIGN_FLIP_SEEDS = 6  # the fewest paired seeds whose exact sign-flip test can give p < 0.05 (2^(1-n))
MARGIN = 0.01  # the default equivalence margin: 1 point of test accuracy (a fraction, as the rows hold)
KEY = "test_accuracy_at_best_val"  # the confirmation's paired statistic the verdict reads (report.metric: accuracy)


@dataclass(frozen=True)
class Ranking:
    """What a verdict ranks the confirmed entries on and judges the gain on (``report.metric``),
    and its words."""

    metric: str  # accuracy, local_accuracy, local_accuracy_worst10
    rank: str  # the rows' column the confirmed entries are ranked by
    key: str  # the summary key whose paired difference to FedAvg is judged
    best: str  # "validation accuracy": "has the best ... of the confirmed entries"
    by: str  # "validation": "the best by ..."
    gain: str  # "test accuracy": "+3.0 points on ..."
    diff: str  # "test": "its ... difference"
    about: str  # what the metric is, for the verdict's head ("" for the default)


def ranking_of(metric: str | None) -> Ranking:
    """The :class:`Ranking` of ``report.metric`` (None: ``accuracy``, today's verdict)."""
    metric = check_metric(metric) or "accuracy"
    if metric == "accuracy":
        return Ranking("accuracy", "best_val_accuracy_mean", KEY, "validation accuracy", "validation", "test accuracy",
                       "test", "the confirmed entries' validation accuracy, the gain in test accuracy at the best "
                       "validation round")
    name = "worst 10% local accuracy" if metric == "local_accuracy_worst10" else "mean local accuracy"
    what = ("the mean accuracy of the worst 10% of clients" if metric == "local_accuracy_worst10" else
            "the mean over clients of their accuracy")
    return Ranking(metric, f"final_{metric}_mean", f"final_{metric}", name, name, name, name,
                   f"{what} on their own test splits (final_{metric}), the mean over the confirmation's seeds and the "
                   "paired gain on it; the search ranked its trials on validation accuracy")

# ``verdict`` values: what was said, for the page and callers; True where the seeds can settle
# it by the project's rule (``tested`` is also False for "fedavg" below 6 paired seeds)
VERDICTS = {
    "significant": True,  # the candidate beats FedAvg (sign-flip p < 0.05, interval excludes 0)
    "ahead, not significant": True,  # 6+ seeds, interval excludes 0, the sign-flip test does not pass
    "fedavg": True,  # FedAvg kept: best by validation, or no candidate shown better over 6+ seeds
    "ahead, not tested": False,  # < 6 seeds, the candidate ahead on every seed: provisional
    "fedavg, not tested": False,  # < 6 seeds, the best by validation not ahead on every seed
    "not paired": False,  # no seed where the candidate and FedAvg both finished
    "search only": False,  # no confirmation run finished: from the search's validation scores
}


def recommend(plan: Any, rows: Sequence[Mapping[str, Any]], picked: Sequence[Mapping[str, Any]],
              trials: Sequence[Mapping[str, Any]] | None = None, margin: float = MARGIN,
              diffs: Mapping[str, Sequence[float]] | None = None, argv: Sequence[str] | None = None,
              metric: str | None = None) -> dict[str, Any]:
    """The confirmed entry with the best mean validation accuracy (``metric``: on that
    ``report.metric``), and what its paired test gain over FedAvg lets one say (the module
    docstring's rules).

    ``rows``: the confirmation's ``fedrift compare`` rows (may be partial or empty);
    ``picked``: the confirmed entries' best trials (FedAvg's first); ``trials``: every search
    trial (entry, rounds, status), for the tuning each entry got; ``margin``: the equivalence
    margin (a fraction: 0.01 is 1 point); ``diffs``: per entry its per-seed paired test
    differences to FedAvg (default: read from ``plan.root / "confirm"``, else told from the
    rows' sign-flip p); ``argv``: the command's words, for the 6-seed command (default: this
    process's when it is the ``fedrift`` command); ``metric``: ``report.metric`` (None or
    ``accuracy``: validation accuracy, the gain in test accuracy at best validation;
    ``local_accuracy``, ``local_accuracy_worst10``: ranked and judged on that local key).

    Returns ``choice``, ``verdict`` (a key of :data:`VERDICTS`), ``tested`` (whether the seeds
    settle it: False below 6 paired seeds, so the recommendation is provisional),
    ``equivalent`` (FedAvg shown as good as any within ``margin``), ``text`` (the
    headline), ``lines`` (the headline, then the tuning, communication and what is missing:
    what to print), ``entries`` (per entry: its gain, seeds, per-seed words, tuning, bytes),
    ``command`` (the rerun with 6 seeds, or None), ``margin``, ``missing``, ``reference``,
    ``validation_order`` (the confirmed entries, best first, on the ranked column), ``metric``
    (``report.metric``, ``accuracy`` by default), ``ranked_on`` (the rows' column ranked by),
    ``judged_on`` (the summary key the gain is on) and ``worst10`` (the chosen entry's and
    FedAvg's mean ``final_local_accuracy_worst10`` and whether it is below, or None)."""
    if not 0 < margin < 1:
        raise ConfigError(f"margin: {margin!r}; allowed: a fraction of accuracy in (0, 1), e.g. 0.01 for 1 point")
    how = ranking_of(metric)
    by_entry = {str(r["algorithm"]): r for r in rows if r.get("algorithm") is not None}
    entries = [str(t["entry"]) for t in picked]
    ref_entry = next((e for e in entries if parse_algorithm(e)[0] == REFERENCE),
                     next((e for e in by_entry if parse_algorithm(e)[0] == REFERENCE), REFERENCE))
    values = {str(t["entry"]): dict(t.get("values") or {}) for t in picked}
    seeds = [int(x) for x in (getattr(plan, "seeds", None) or [])]
    per_seed = dict(diffs) if diffs is not None else _confirm_diffs(plan, how.key)
    info = {e: _entry_info(e, by_entry.get(e), per_seed.get(e), trials, plan, values.get(e, {}), how) for e in
            dict.fromkeys([*entries, *by_entry])}
    val = {e: r.get(how.rank) for e, r in by_entry.items()}
    ranked = sorted((e for e in by_entry if _finite(val.get(e))), key=lambda e: val[e], reverse=True)
    missing = _missing(entries, by_entry, seeds)
    ref_text = _named(ref_entry, values.get(ref_entry, {}), ref_entry)
    out: dict[str, Any] = {"validation_order": ranked, "reference": ref_entry, "margin": margin,
                           "entries": info, "missing": missing, "command": None, "metric": how.metric,
                           "ranked_on": how.rank.removesuffix("_mean"), "judged_on": how.key}
    most = max((i["n"] for e, i in info.items() if e != ref_entry), default=0)

    if not ranked:  # nothing confirmed: the search's validation scores, said as such
        best = _search_best(picked)
        choice = best or ref_entry
        out.update(choice=choice, verdict="search only", text=(
            "no confirmation run finished: from the search alone (validation accuracy, one seed, no test), "
            + (f"{_named(choice, values.get(choice, {}), ref_entry)} scored best at the most rounds reached"
               if best else "nothing was scored")
            + "; not confirmed, not tested"))
    elif ranked[0] == ref_entry:
        out.update(_reference_best(ranked, ref_entry, ref_text, info, margin, how))
    else:
        out.update(_candidate_best(ranked[0], ref_entry, ref_text, info, margin, values, how))
    verdict = out["verdict"]
    # FedAvg best by validation is the answer at any seeds; the words on the others are tested from 6
    out["tested"] = VERDICTS[verdict] and not (verdict == "fedavg" and most < SIGN_FLIP_SEEDS)
    out.setdefault("equivalent", False)
    text = out["text"]
    if metric is not None and verdict == "search only":
        text += f" (report.metric={how.metric} ranks the confirmation's runs: none finished, so it was not used)"
    elif metric is not None:  # a metric asked for is named at the head of the verdict
        text = f"ranked on report.metric={how.metric} ({how.about}): {text}"
    out["worst10"] = _worst10(by_entry.get(out["choice"]), by_entry.get(ref_entry)) if out["choice"] != ref_entry \
        else None
    if out["worst10"] and out["worst10"]["below"]:
        text += ". " + _worst10_sentence(out["worst10"], ref_entry)
    if verdict == "search only":
        if picked:
            out["command"] = rerun_command(plan, argv, extend=False)
            text += f". To confirm it, run the same fedrift select again with a larger --budget: {out['command']}"
    elif not out["tested"]:
        out["command"] = rerun_command(plan, argv, paired=most)
        text += (f". To test it, run the same fedrift select with seeds={_seed_list(plan, most)} ({SIGN_FLIP_SEEDS} "
                 "paired seeds; the search is kept and only the confirmation runs, outside the search's budget): "
                 + out["command"])
    out["text"] = text
    out["lines"] = [text, *_tuning_lines(info, ref_entry, ranked or entries), *_bytes_lines(info, ref_entry),
                    *(["partial confirmation: " + "; ".join(missing)] if missing else [])]
    return out


# ---------------------------------------------------------------------------------------
# The verdicts


def _reference_best(ranked: Sequence[str], ref: str, ref_text: str, info: Mapping[str, Any],
                    margin: float, how: Ranking = ranking_of(None)) -> dict[str, Any]:
    """FedAvg has the best validation accuracy (``how``: the ranked metric) of the confirmed
    entries: it is kept; how each candidate compares on test accuracy (on the metric) is said,
    and equivalence only where shown."""
    others = [e for e in ranked if e != ref]
    said = "; ".join(f"{e} {_seed_words(info[e], ref)}" for e in others)
    text = f"{ref_text} has the best {how.best} of the confirmed entries" + (
        f"; on {how.gain} {said}" if said else "")
    equivalent = bool(others) and all(_inside(info[e], margin) for e in others)
    if equivalent:
        text += (f"; and it is as good as any of them within +-{_points(margin)}: "
                 + _equivalence_words(others, info, margin, how))
    return {"choice": ref, "verdict": "fedavg", "text": text, "equivalent": equivalent}


def _candidate_best(best: str, ref: str, ref_text: str, info: Mapping[str, Any], margin: float,
                    values: Mapping[str, Mapping[str, Any]], how: Ranking = ranking_of(None)) -> dict[str, Any]:
    i = info[best]
    n, named = i["n"], _named(best, values.get(best, {}), ref)
    gain = i["gain"]
    if n == 0:
        return {"choice": best, "verdict": "not paired",
                "text": f"{named} has the best {how.best} of the confirmed entries, but it is not compared "
                        f"with {ref_text}: no seed where both finished; not tested"}
    if n < SIGN_FLIP_SEEDS:
        side = i["side"]
        if side == "ahead":
            return {"choice": best, "verdict": "ahead, not tested",
                    "text": f"{named} is ahead of {ref_text} on {_every(n)}: {gain} on {how.gain}{_listed(i)}; "
                            f"not tested: {n} {_seeds(n)} cannot pass the sign-flip test ({SIGN_FLIP_SEEDS} needed), so "
                            "this recommendation is provisional"}
        return {"choice": ref, "verdict": "fedavg, not tested",
                "text": f"{ref_text} is kept: the best by {how.by}, {best}, is "
                        f"{_seed_words(i, ref).removesuffix(', not tested')}; not tested: "
                        f"{n} {_seeds(n)} cannot pass the sign-flip test ({SIGN_FLIP_SEEDS} needed)"}
    p = "-" if i["p"] is None else f"{i['p']:.3g}"
    if i["significant"]:
        return {"choice": best, "verdict": "significant",
                "text": f"{named} beats {ref_text}: {gain} on {how.gain} (significant: sign-flip p = {p} < 0.05 "
                        "and the interval excludes 0)"}
    if i["low"] is not None and i["low"] > 0:
        return {"choice": best, "verdict": "ahead, not significant",
                "text": f"{named} is ahead of {ref_text}: {gain} on {how.gain}, the interval excludes 0, but the "
                        f"sign-flip test does not pass (p = {p} over {n} seeds; significant: p < 0.05): its gain is "
                        "not consistent across seeds"}
    candidates = [e for e in info if e != ref and info[e]["n"]]
    if candidates and all(_inside(info[e], margin) for e in candidates):
        return {"choice": ref, "verdict": "fedavg", "equivalent": True,
                "text": f"{ref_text} is as good as any confirmed entry within an equivalence margin of "
                        f"+-{_points(margin)}: " + _equivalence_words(candidates, info, margin, how)}
    return {"choice": ref, "verdict": "fedavg",
            "text": f"{ref_text} is kept: no candidate is shown better (the best by {how.by}, {best}, is {gain} on "
                    f"{how.gain}, sign-flip p = {p}; the interval holds 0). Nor is it shown as good: the interval "
                    f"reaches past +-{_points(margin)}, the equivalence margin"}


def _equivalence_words(entries: Sequence[str], info: Mapping[str, Any], margin: float,
                       how: Ranking = ranking_of(None)) -> str:
    worst = max(max(abs(info[e]["low"]), abs(info[e]["high"])) for e in entries)
    n = min(info[e]["n"] for e in entries)
    return (f"every candidate's 95% interval of its {how.diff} difference lies inside it (the farthest end at "
            f"{100 * worst:.1f} points; {n} or more seeds)")


def _worst10(row: Mapping[str, Any] | None, ref_row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The chosen entry's and FedAvg's mean worst 10% local accuracy over the confirmation's runs
    that report it (``final_local_accuracy_worst10``), and whether the chosen one's is lower;
    None when either has none."""
    mine, theirs = (r.get(f"{WORST10_KEY}_mean") if r else None for r in (row, ref_row))
    if not _finite(mine) or not _finite(theirs):
        return None
    count = [int(r.get(f"{WORST10_KEY}_n") or r.get("completed") or 0) for r in (row, ref_row)]  # type: ignore[union-attr]
    return {"choice": float(mine), "reference": float(theirs), "below": float(mine) < float(theirs),
            "runs": count[0], "reference_runs": count[1]}


def _worst10_sentence(w: Mapping[str, Any], ref: str) -> str:
    """``Its worst 10% of clients score 61.2% on their own test splits, below FedAvg's 64.0%
    (...)``: the sentence when the recommended entry's tail is lower than FedAvg's."""
    digits = 1 if round(100 * w["choice"], 1) != round(100 * w["reference"], 1) else 2
    runs = (f"{w['runs']} runs each" if w["runs"] == w["reference_runs"] else
            f"{w['runs']} and {w['reference_runs']} runs")
    return (f"Its worst 10% of clients score {100 * w['choice']:.{digits}f}% on their own test splits, below "
            f"{_ref_name(ref)}'s {100 * w['reference']:.{digits}f}% (final_local_accuracy_worst10, the mean over the "
            f"confirmation's {runs})")


def _inside(i: Mapping[str, Any], margin: float) -> bool:
    """Equivalence shown: 6+ paired seeds (fewer give t intervals that a step of the test set's
    accuracy can shrink to nothing) and the 95% interval inside +-margin."""
    return (i["n"] >= SIGN_FLIP_SEEDS and i["low"] is not None and i["high"] is not None
            and -margin < i["low"] and i["high"] < margin)


def _seed_words(i: Mapping[str, Any], ref: str) -> str:
    """``ahead on every seed (+3.0 +- ...)``, ``behind on every seed``, ``mixed (2 of 3 seeds
    ahead)`` below 6 seeds; from 6 the gain and whether it is significant."""
    n = i["n"]
    if n == 0:
        return "not paired with " + _ref_name(ref) + " (no seed where both finished)"
    if n < SIGN_FLIP_SEEDS:
        where = {"ahead": f"ahead on {_every(n)}", "behind": f"behind on {_every(n)}"}.get(
            i["side"], "mixed" + (f" ({i['ahead']} of {n} seeds ahead)" if i["ahead"] is not None else " (not on one side "
                                  "at every seed)") if i["side"] == "mixed" else "on a side not known by seed")
        return f"{where}: {i['gain']}{_listed(i)}, not tested"
    return f"{i['gain']}" + (" (significant)" if i["significant"] else " (not significant)")


# ---------------------------------------------------------------------------------------
# Per entry: its paired gain, per-seed sides, tuning, communication


def _entry_info(entry: str, row: Mapping[str, Any] | None, seed_diffs: Sequence[float] | None,
                trials: Sequence[Mapping[str, Any]] | None, plan: Any, values: Mapping[str, Any],
                how: Ranking = ranking_of(None)) -> dict[str, Any]:
    row = row or {}
    key = how.key  # the judged key: KEY unless report.metric says another
    n = int(row.get(f"{key}_diff_n") or 0)
    d = [float(x) for x in seed_diffs] if seed_diffs is not None and len(seed_diffs) == n else None
    ahead = behind = None
    if d is not None:
        ahead, behind = sum(x > 0 for x in d), sum(x < 0 for x in d)
    elif n and row.get(f"{key}_diff_p") is not None and row.get(f"{key}_diff_mean") is not None:
        # the exact sign-flip p is 2^(1-n) exactly when every seed's difference has one sign
        # (a mixed or tied seed adds patterns at least as extreme): the side, not the count
        if n <= 16:
            if math.isclose(float(row[f"{key}_diff_p"]), 2.0 ** (1 - n)):
                mean = float(row[f"{key}_diff_mean"])
                ahead, behind = (n, 0) if mean > 0 else (0, n)
            else:
                ahead, behind = -1, -1  # not every seed on one side; how many each way is not known
    side = None
    if ahead is not None:
        side = "ahead" if ahead == n else "behind" if behind == n else "mixed"
        ahead = None if ahead < 0 else ahead
    everyone = [t for t in (trials or []) if t.get("entry") == entry]
    mine = [t for t in everyone if t.get("status") != "budget"]  # a trial the budget stopped is not tuning
    rounds = getattr(plan, "rounds", None)
    return {
        "n": n, "gain": _gain(row, key) if n else "not paired", "diffs": d, "side": side, "ahead": ahead,
        "mean": row.get(f"{key}_diff_mean"), "ci95": row.get(f"{key}_diff_ci95"),
        "low": row.get(f"{key}_diff_low"), "high": row.get(f"{key}_diff_high"), "p": row.get(f"{key}_diff_p"),
        "significant": bool(row.get(f"{key}_diff_significant")),
        "val": row.get("best_val_accuracy_mean"), "ranked": row.get(how.rank), "runs": row.get("runs"),
        "completed": row.get("completed"),
        "values": dict(values),
        "trials": len(mine) if trials is not None else None,
        "furthest": max((int(t.get("rounds") or 0) for t in mine), default=0) if trials is not None else None,
        "full": sum(int(t.get("rounds") or 0) >= rounds for t in mine) if trials is not None and rounds else None,
        "cut": len(everyone) - len(mine),
        "down": row.get("bytes_down_per_round"), "up": row.get("bytes_up_per_round"),
    }


def _confirm_diffs(plan: Any, key: str = KEY) -> dict[str, list[float]]:
    """Per confirmed entry, its per-seed differences to FedAvg on ``key`` (the test accuracy at
    best validation unless ``report.metric`` says another) on the seeds where both finished,
    read from the confirmation's compare folder; {} when it is not there or cannot be read (the
    rows' p then tells the side)."""
    root = getattr(plan, "root", None)
    if root is None or not (Path(root) / "confirm" / "compare.json").is_file():
        return {}
    try:
        groups, _ = load_groups(Path(root) / "confirm")
    except Exception:  # a folder being written or damaged: the rows still speak
        return {}
    ref = next((g for g in groups if parse_algorithm(g.algorithm)[0] == REFERENCE), None)
    if ref is None:
        return {}
    theirs = {r.seed: r.summary.get(key) for r in ref.done()}
    out = {}
    for g in groups:
        if g is ref:
            continue
        out[g.algorithm] = [float(r.summary[key]) - float(theirs[r.seed]) for r in g.done()
                            if _finite(r.summary.get(key)) and _finite(theirs.get(r.seed))]
    return out


def _missing(entries: Sequence[str], by_entry: Mapping[str, Mapping[str, Any]], seeds: Sequence[int]) -> list[str]:
    """What the confirmation lacks: entries with no row, or fewer completed runs than seeds."""
    out = []
    for e in entries:
        r = by_entry.get(e)
        want = len(seeds) or (r or {}).get("runs") or 0
        done = int((r or {}).get("completed") or 0)
        if r is None or done == 0:
            out.append(f"{e}: no confirmation run finished" + (f" (of {want})" if want else ""))
        elif want and done < want:
            out.append(f"{e}: {done} of {want} confirmation runs finished")
    return out


def _tuning_lines(info: Mapping[str, Any], ref: str, order: Sequence[str]) -> list[str]:
    """``tuning: fedadc 15 trials (furthest 12 rounds), FedAvg 4 trials (...)``, trials the
    budget stopped apart (``1 more stopped by the budget``), and a reference tuned less than the
    median candidate said so."""
    shown = [e for e in dict.fromkeys([ref, *order]) if e in info and info[e]["trials"] is not None]
    if not shown:
        return []
    parts = [f"{_ref_name(e) if e == ref else e} {info[e]['trials']} {_plural(info[e]['trials'], 'trial')} (furthest "
             f"{info[e]['furthest']} {_plural(info[e]['furthest'], 'round')}"
             + (f"; {info[e]['cut']} more stopped by the budget, not counted)" if info[e].get("cut") else ")")
             for e in shown]
    line = "tuning in the search: " + ", ".join(parts)
    others = [info[e]["trials"] for e in shown if e != ref]
    mine = info.get(ref, {}).get("trials")
    if others and mine is not None and mine < statistics.median(others):
        line += (f"; {_ref_name(ref)} was tuned less than the median candidate ({mine} {_plural(mine, 'trial')} against "
                 f"{statistics.median(others):g})")
    return [line]


def _bytes_lines(info: Mapping[str, Any], ref: str) -> list[str]:
    """Communication a round (down / up) of each confirmed entry beside FedAvg's, with the ratio
    where an entry sends more."""
    have = [e for e in dict.fromkeys([ref, *info]) if e in info and (info[e]["down"] is not None or info[e]["up"] is not None)]
    if not have:
        return []
    r = info.get(ref, {})
    parts = []
    for e in have:
        i = info[e]
        part = f"{_ref_name(e) if e == ref else e} {fmt_bytes(i['down'])} down, {fmt_bytes(i['up'])} up"
        if e != ref:
            more = [f"{i[k] / r[k]:.1f}x {name}" for k, name in (("down", "the downlink"), ("up", "the uplink"))
                    if i[k] and r.get(k) and i[k] / r[k] >= 1.05]
            if more:
                part += f" ({' and '.join(more)} of {_ref_name(ref)})"
        parts.append(part)
    return ["communication a round: " + "; ".join(parts)]


# ---------------------------------------------------------------------------------------
# The rerun with 6 seeds


def six_seeds(plan: Any, paired: int | None = None) -> list[int]:
    """The confirmation's seeds extended to :data:`SIGN_FLIP_SEEDS` (the seeds already run kept,
    so their runs are reused; new ones skip the search's seed). Where 6 or more were asked and
    only ``paired`` of them paired (runs that diverged or did not finish), as many more as lack."""
    seeds = [int(s) for s in (getattr(plan, "seeds", None) or [])]
    want = SIGN_FLIP_SEEDS
    if paired is not None and len(seeds) >= SIGN_FLIP_SEEDS and paired < SIGN_FLIP_SEEDS:
        want = len(seeds) + SIGN_FLIP_SEEDS - paired
    taken = set(seeds) | {int(getattr(plan, "seed", -1))}
    nxt = max(seeds, default=int(getattr(plan, "seed", 0))) + 1
    while len(seeds) < want:
        if nxt not in taken:
            seeds.append(nxt)
            taken.add(nxt)
        nxt += 1
    return seeds


def _seed_list(plan: Any, paired: int | None = None) -> str:
    return ",".join(map(str, six_seeds(plan, paired)))


def rerun_command(plan: Any, argv: Sequence[str] | None = None, extend: bool = True, paired: int | None = None) -> str:
    """The same ``fedrift select`` with ``seeds=`` of 6 seeds (``extend``, :func:`six_seeds`; else
    as it was): from ``argv`` (the command's words), or this process's own when it is the
    ``fedrift`` command, else a sketch naming the folder."""
    words = list(argv) if argv is not None else _own_argv()
    seeds = f"seeds={_seed_list(plan, paired)}" if extend else None
    if words:
        words = [w for w in words if not (extend and w.startswith("seeds="))]
        return shlex.join(words + ([seeds] if seeds else []))
    root = getattr(plan, "root", None)
    return "fedrift select <the same arguments>" + (f" --out {shlex.quote(str(root))}" if root is not None else "") + (
        f" {seeds}" if seeds else "")


def _own_argv() -> list[str] | None:
    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if (prog.name == "fedrift" or prog.parent.name == "fedrift" and prog.name == "__main__.py") and \
            len(sys.argv) > 1 and sys.argv[1] == "select":
        return ["fedrift", *sys.argv[1:]]
    return None


# ---------------------------------------------------------------------------------------
# Small words


def values_text(values: Mapping[str, Any]) -> str:
    """``{"train.lr": 0.0124, "algorithm.mu": 0.1}`` -> ``lr 0.0124, mu 0.1``: values as typed
    (a space rounds what it draws; an older study's long float shows 4 significant digits)."""
    names = short_names(list(values))  # the table's rule: the last part unless two keys share it
    return ", ".join(f"{names[k]} {number_text(v)}" for k, v in values.items())


def number_text(v: Any) -> str:
    """A value as typed: ``0.05``, ``1e-05``, ``3``; a float with a long repr at 4 significant digits."""
    if isinstance(v, float) and not isinstance(v, bool):
        text = repr(v)
        return text if len(text) <= 8 else f"{v:.4g}"
    return str(v)


def _named(entry: str, values: Mapping[str, Any], ref: str) -> str:
    name = _ref_name(entry) if entry == ref else entry
    return f"{name} at {values_text(values) or 'its config values'}"


def _ref_name(entry: str) -> str:
    return "FedAvg" if entry == REFERENCE else entry


def _gain(row: Mapping[str, Any] | None, key: str = KEY) -> str:
    if not row or row.get(f"{key}_diff_mean") is None:
        return "not paired"
    mean, ci = row[f"{key}_diff_mean"], row.get(f"{key}_diff_ci95")
    n = int(row.get(f"{key}_diff_n") or 0)
    # the rows hold fractions; the tables (and this line) show percentage points
    if ci is not None and math.isfinite(ci):
        return f"{100 * mean:+.1f} +- {100 * ci:.1f} points ({n} {_seeds(n)})"
    return f"{100 * mean:+.1f} points ({n} {_seeds(n)})"


def _listed(i: Mapping[str, Any]) -> str:
    d = i.get("diffs")
    return f" (per seed: {', '.join(f'{100 * x:+.1f}' for x in d)})" if d else ""


def _search_best(picked: Sequence[Mapping[str, Any]]) -> str | None:
    scored = [t for t in picked if _finite(t.get("score"))]
    if not scored:
        return None
    return str(max(scored, key=lambda t: (int(t.get("rounds") or 0), float(t["score"])))["entry"])


def _every(n: int) -> str:
    return "its one seed" if n == 1 else "every seed" if n > 2 else "both seeds"


def _seeds(n: int) -> str:
    return "seed" if n == 1 else "seeds"


def _plural(n: Any, word: str) -> str:
    return word if n == 1 else word + "s"


def _points(margin: float) -> str:
    return f"{100 * margin:g} {_plural(100 * margin, 'point')}"


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def wrap(text: str, width: int = 96) -> list[str]:
    out, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return out + ([cur] if cur else [])


__all__ = ["KEY", "MARGIN", "RANK_METRICS", "REFERENCE", "SIGN_FLIP_SEEDS", "VERDICTS", "Ranking", "number_text",
           "ranking_of", "recommend", "rerun_command", "six_seeds", "values_text", "wrap"]
