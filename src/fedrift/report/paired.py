"""Paired differences to a reference method: a t interval to read, and a mark that cannot over-claim.

Every method of a grid sees, for a given seed, the same partition, client samples and batch
order, so a seed's noise is shared: the difference of two methods on the *same* seed is far
less noisy than two independent means. Per setting, against the reference setting with the
same swept values (``report.reference``, default ``fedavg`` when the grid has it):

- the pairs are the seeds at which both runs completed;
- per pair, d = this setting's accuracy - the reference's (best, final and, with a
  validation split, at best validation; with the clients' own test splits, the mean of the
  worst 10% of clients' accuracies, ``final_local_accuracy_worst10``, and with
  ``report.metric=local_accuracy`` the mean over the clients, ``final_local_accuracy``; with
  ``eval.personalize``, each client's fine-tuned model, ``personalized_accuracy`` and its worst
  10%, against the reference's ``final_local_accuracy`` and its worst 10%);
- ``*_diff_mean`` is the mean of the d's; ``*_diff_ci95`` the half-width of the 95% Student t
  interval, ``t(0.975, n - 1) * sd(d, ddof=1) / sqrt(n)``; ``*_diff_low``/``*_diff_high`` its
  ends; ``*_diff_n`` the pairs. One pair gives a difference and no interval (None, shown
  ``-``); none gives nothing.
- ``*_diff_p`` is the two-sided p-value of the exact paired sign-flip (randomisation) test
  (:func:`sign_flip_p`), and ``*_diff_significant`` (the table's ``*``) is true when
  ``p < 0.05`` *and* the t interval excludes 0.

Why not the t interval alone. Accuracy on a finite test set moves in steps of ``1/n_test``
(0.1 points on 1,000 images), so a few seeds can easily differ by exactly the same amount:
two seeds both 0.3 points behind give sd 0 and a t interval of width 0, which "excludes 0"
although two coin flips agree half the time. The t interval also rests on normal
differences, which three to five seeds cannot show. The sign-flip test needs neither: if the
two methods are interchangeable, each seed's difference is as likely to be d as -d, so the
2^n sign patterns of the observed |d|'s are equally likely and p is the share of them whose
|sum| is at least the observed one. It is exact at any n, ties and steps included, and its
smallest p is ``2^(1-n)`` (every seed on the same side): below :data:`MIN_SEEDS` (6) seeds no
difference can reach 0.05, so none is marked, whatever the t interval says. Requiring the
interval too keeps a ``*`` from ever standing beside an interval that holds 0 (one seed far
out on the same side as the others). ``report.claims`` judges by the same mark.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError

# summary keys compared, and their names in the tables
METRICS = (("best_accuracy", "best"), ("final_accuracy", "final"), ("test_accuracy_at_best_val", "at best val"))
# on the clients' own test splits: the worst 10% of clients' mean accuracy always paired in the
# results table when runs report it, the mean over clients when ``report.metric`` ranks on it
LOCAL_METRICS = (("final_local_accuracy", "final local"), ("final_local_accuracy_worst10", "worst 10% local"))
WORST10 = "final_local_accuracy_worst10"
# each client's model fine-tuned after training (eval.personalize), paired with the reference's
# final local accuracy (its worst 10%): what a client gets from one method against the other
PERSONALIZED_METRICS = (("personalized_accuracy", "personalized"), ("personalized_accuracy_worst10", "personalized worst 10%"))
PERSONALIZED_AGAINST = dict(zip((k for k, _ in PERSONALIZED_METRICS), (k for k, _ in LOCAL_METRICS)))
LEVEL = 0.95
ALPHA = 1 - LEVEL  # the sign-flip test's level (two-sided)
EXACT_UP_TO = 16  # seeds enumerated exactly (2^16 sign patterns); more: a seeded random sample of patterns
SAMPLES = 1 << 16


def _min_seeds(alpha: float) -> int:
    n = 1
    while 2.0 ** (1 - n) >= alpha:
        n += 1
    return n


MIN_SEEDS = _min_seeds(ALPHA)  # 6: the fewest paired seeds whose smallest p (2^(1-n)) is below 0.05


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


def sign_flip_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the exact paired sign-flip test of "mean difference 0": the
    share of the 2^n sign patterns ``s`` with ``|sum(s_i |d_i|)| >= |sum(d_i)|`` (a pattern
    equal to the observed one up to float rounding counts as at least as extreme, so p never
    errs low). Exact up to :data:`EXACT_UP_TO` differences; beyond, ``(1 + hits) / (1 +
    SAMPLES)`` over seeded random patterns (valid, slightly conservative). None for none."""
    import numpy as np

    d = np.abs(np.asarray([float(x) for x in diffs], dtype=np.float64))
    if not len(d):
        return None
    observed = abs(math.fsum(float(x) for x in diffs))
    tol = 1e-9 * max(1.0, float(d.sum()))
    if len(d) <= EXACT_UP_TO:
        bits = (np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1
        hits = int((np.abs((1.0 - 2.0 * bits) @ d) >= observed - tol).sum())
        return hits / 2 ** len(d)
    signs = np.random.default_rng(0).choice((-1.0, 1.0), size=(SAMPLES, len(d)))
    hits = int((np.abs(signs @ d) >= observed - tol).sum())
    return (1 + hits) / (1 + SAMPLES)


def significant(diffs: Sequence[float]) -> bool | None:
    """The ``*`` (module docstring): p < ALPHA and the t interval excludes 0; None below two
    differences (no interval)."""
    mean, half = interval(diffs)
    if mean is None or half is None:
        return None
    p = sign_flip_p(diffs)
    return bool(p is not None and p < ALPHA and (mean - half > 0 or mean + half < 0))


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


def add_paired(groups: Sequence[Any], rows: Sequence[dict[str, Any]], reference: str | None,
               extra: Sequence[str] = ()) -> None:
    """Add the paired-difference keys (module docstring) to each row of a setting that has a
    reference at its swept values; ``rows[i]`` is ``groups[i]``'s. The reference's own row
    and rows with no reference get ``reference`` only (the differences stay absent). Besides
    :data:`METRICS`, the worst 10% of clients' local accuracy (:data:`WORST10`) and the summary
    keys in ``extra`` (``final_local_accuracy`` when ``report.metric`` ranks on it), each when
    some run reports it; and the fine-tuned models' accuracies (:data:`PERSONALIZED_METRICS`)
    against the reference's final local ones."""
    if reference is None:
        return
    wanted = [*(key for key, _ in METRICS), WORST10, *extra, *PERSONALIZED_AGAINST]
    present = [key for key in dict.fromkeys(wanted) if any(key in r.summary for g in groups for r in g.runs)]
    against = [PERSONALIZED_AGAINST.get(key, key) for key in present]
    for g, row in zip(groups, rows):
        row["reference"] = reference
        ref = next((h for h in groups if h.algorithm == reference and h.sweep == g.sweep), None)
        if ref is None or ref is g:
            continue
        row.update(differences(g, ref, present, against))


def differences(g: Any, ref: Any, keys: Sequence[str], ref_keys: Sequence[str] | None = None) -> dict[str, Any]:
    """Setting ``g`` against setting ``ref`` on the seeds at which both completed, per summary
    key: ``KEY_diff_mean``, ``_ci95``, ``_n``, ``_low``, ``_high``, ``_p`` and ``_significant``
    (module docstring). ``ref_keys``: ``ref``'s key for each of ``keys`` where it is another
    (CCVR's calibrated model against FedAvg's final one)."""
    theirs = {r.seed: r for r in ref.done() if r.seed is not None}
    pairs = [(r, theirs[r.seed]) for r in g.done() if r.seed in theirs]
    out: dict[str, Any] = {}
    for key, other in zip(keys, ref_keys or keys):
        diffs = [a.summary[key] - b.summary[other] for a, b in pairs
                 if _number(a.summary.get(key)) and _number(b.summary.get(other))]
        mean, half = interval(diffs)
        low, high = (mean - half, mean + half) if mean is not None and half is not None else (None, None)
        out[f"{key}_diff_mean"], out[f"{key}_diff_ci95"], out[f"{key}_diff_n"] = mean, half, len(diffs)
        out[f"{key}_diff_low"], out[f"{key}_diff_high"] = low, high
        out[f"{key}_diff_p"] = sign_flip_p(diffs)
        out[f"{key}_diff_significant"] = significant(diffs)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def headers(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(summary key, column header) of the paired columns the rows have."""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    if ref is None:
        return []
    return [(key, f"{name} vs {ref}") for key, name in (*METRICS, *LOCAL_METRICS, *PERSONALIZED_METRICS)
            if any(f"{key}_diff_n" in r for r in rows)]


def cell(row: Mapping[str, Any], key: str, pm: str = "+-") -> str:
    """``+2.0 +- 2.5*`` in percentage points (``*``: :func:`significant`), ``+2.0 +- -``
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


RULE = ("* when the exact two-sided sign-flip test over the paired seeds gives p < 0.05 and the interval excludes 0; "
        "with n seeds its smallest p is 2^(1-n), so * needs at least {min} paired seeds (p per metric in the csv: "
        "*_diff_p).")
NOTE = ("'vs {ref}': paired differences in percentage points, the mean over seeds of (setting - {ref}) on the same "
        "seed and swept values, {pm} the half-width of the 95% Student t interval (ddof=1); '{pm} -' with one seed "
        "(no interval). ")
PERSONALIZED_NOTE = ("'personalized (worst 10%) vs {ref}': each client's model fine-tuned after training against "
                     "{ref}'s final local accuracy (its worst 10%) on the same clients' own test splits. ")


def rule(most: int | None = None) -> str:
    """The ``*`` rule as the tables print it; ``most``: the most seeds any difference of the
    table pairs, which, below :data:`MIN_SEEDS`, the rule says no mark is possible with."""
    text = RULE.format(min=MIN_SEEDS)
    if most is not None and 0 < most < MIN_SEEDS:
        text += (f" These differences pair at most {most} seed{'s' if most > 1 else ''}: none can carry *; "
                 f"run {MIN_SEEDS} or more seeds to test them.")
    return text


def most_pairs(rows: Sequence[Mapping[str, Any]]) -> int:
    """The most seeds any paired difference of ``rows`` has."""
    return max((int(v) for r in rows for k, v in r.items() if k.endswith("_diff_n") and isinstance(v, int)), default=0)


def note(rows: Sequence[Mapping[str, Any]], pm: str = "+-") -> str | None:
    """The tables' footnote on the paired columns (what they are and the ``*`` rule), or None
    without them."""
    if not headers(rows):
        return None
    ref = next(r["reference"] for r in rows if r.get("reference"))
    personal = any(key in PERSONALIZED_AGAINST for key, _ in headers(rows))
    return NOTE.format(ref=ref, pm=pm) + (PERSONALIZED_NOTE.format(ref=ref) if personal else "") + rule(most_pairs(rows))


__all__ = ["ALPHA", "LOCAL_METRICS", "METRICS", "MIN_SEEDS", "PERSONALIZED_METRICS", "WORST10", "add_paired", "cell", "differences", "fmt_diff",
           "headers", "interval", "most_pairs", "note", "resolve_reference", "rule", "sign_flip_p", "significant"]
