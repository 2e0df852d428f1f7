"""Claims: is method A better than method B on these runs? (``report.claims``)

A claim is ``A>B`` (A better) or ``A>=B`` (A no worse); A and B are labels of the grid, or
algorithm names, which stand for every setting of that algorithm (``fedadc`` is both
``fedadc:variant=nesterov`` and ``fedadc:variant=heavy_ball``; two such lists pair the
settings most like each of A's: sharing the most options, then with the fewest others).
``papers`` adds the papers' orderings (:data:`PAPERS`: the seed papers' and the newer
remedies') among the algorithms the grid has, each name standing for all its settings. Each
claim is checked per swept values with the paired differences of :mod:`fedrift.report.paired`
(A - B on the seeds where both completed), on the test accuracy at best validation when the
runs have a validation split, else on the best accuracy (a paper's claim whose gain is another
model's names its two summary keys, shown and judged in the ``final`` column: CCVR's calibrated
model against FedAvg's final one, FedBN's clients' own models against FedAvg's global model on
the clients' own test splits; with ``report.metric=local_accuracy`` or
``local_accuracy_worst10``, on ``final_local_accuracy`` or ``final_local_accuracy_worst10``, the
clients' own test splits, shown in its own column), and judged by the tables' ``*``: significant when the exact
sign-flip test gives p < 0.05 and the 95% t interval excludes 0, which takes at least
``MIN_SEEDS`` (6) paired seeds (the rule and why: :mod:`fedrift.report.paired`):

- ``holds``: significant, A ahead (``>=``: ``holds (ahead)``; also ``holds (not behind)``,
  a mean >= 0 that is not significant, with enough seeds to have tested it);
- ``ahead, not significant`` (``>``): a mean > 0, not significant;
- ``behind, not significant``: a mean below 0 (or 0 for ``>``), not significant;
- ``reversed``: significant, A behind;
- ``N seeds: ahead`` / ``behind`` / ``tied, too few to test`` with 2 to 5 paired seeds (no
  difference of so few seeds can be significant, so none is called either way);
- ``one seed: ahead`` / ``behind`` / ``tied`` (no interval), ``no pairs``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fedrift.errors import ConfigError
from fedrift.report.paired import LOCAL_METRICS, METRICS, MIN_SEEDS, differences, fmt_diff, rule
from fedrift.report.table import check_metric, markdown_lines, metric_key, text_lines
from fedrift.report.table import to_csv as table_csv

# (better, op, worse, whose claim[, (A's summary key, B's)]): the orderings the papers report
PAPERS: tuple[tuple[Any, ...], ...] = (
    ("fedgkd", ">", "fedavg", "FedGKD"),
    ("fedgkd", ">", "fedprox", "FedGKD"),
    ("fedgkd_vote", ">=", "fedgkd", "FedGKD"),
    ("fedcsd", ">", "fedgkd", "FedCSD"),
    ("fedcsd", ">", "fedavg", "FedCSD"),
    ("fedadc", ">", "slowmo", "FedADC"),
    ("slowmo", ">", "fedavg", "FedADC"),
    ("fedadc_plus", ">", "fedadc", "FedADC"),
    # the newer remedies (issue 35), each paper's gain over FedAvg (FedDC's also over the
    # baselines of its tables); CCVR's is its calibrated model's, FedBN's each client's model on
    # its own domain against FedAvg's global model there
    ("fedadam", ">", "fedavg", "FedOpt"),
    ("fedyogi", ">", "fedavg", "FedOpt"),
    ("fedadagrad", ">", "fedavg", "FedOpt"),
    ("fedacg", ">", "fedavg", "FedACG"),
    ("fedexp", ">", "fedavg", "FedExP"),
    ("fedsam", ">", "fedavg", "FedSAM"),
    ("fedasam", ">", "fedavg", "FedASAM"),
    ("fedlc", ">", "fedavg", "FedLC"),
    ("feddecorr", ">", "fedavg", "FedDecorr"),
    ("feddc", ">", "fedavg", "FedDC"),
    ("feddc", ">", "fedprox", "FedDC"),
    ("feddc", ">", "scaffold", "FedDC"),
    ("feddc", ">", "feddyn", "FedDC"),
    ("elastic", ">", "fedavg", "Elastic"),
    ("ccvr", ">", "fedavg", "CCVR", ("calibrated_accuracy", "final_accuracy")),
    ("fedbn", ">", "fedavg", "FedBN", ("final_local_accuracy", "final_local_accuracy")),
)
NAMED_COLUMN = "final_accuracy"  # where a claim on named keys is shown and judged
ALLOWED = ("A>B or A>=B with A and B algorithms of the grid (e.g. fedgkd>fedavg), optionally followed by "
           "the summary keys compared, '(on KEY)' or '(KEY_A vs KEY_B)', or papers")
# a claim's named keys, as Claim.text writes them: "(on KEY)" or "(KEY_A vs KEY_B)"
_NAMED = re.compile(r"^(?P<b>.*?)\s*\((?:on\s+(?P<on>\w+)|(?P<ka>\w+)\s+vs\s+(?P<kb>\w+))\)$")


@dataclass(frozen=True)
class Claim:
    better: str  # a setting's algorithm label
    op: str  # ">" or ">="
    worse: str
    source: str = ""  # whose claim: a paper's name, "" for the user's
    keys: tuple[str, str] | None = None  # (A's summary key, B's); None: the table's metrics

    @property
    def text(self) -> str:
        base = f"{self.better} {self.op} {self.worse}"
        if self.keys is None:
            return base
        a, b = self.keys
        return f"{base} (on {a})" if a == b else f"{base} ({a} vs {b})"


def _parse(spec: str) -> tuple[str, str, str, tuple[str, str] | None]:
    op = ">=" if ">=" in spec else ">"
    a, sep, b = (part.strip() for part in spec.partition(op))
    named = _NAMED.match(b)
    keys = None
    if named:
        b, keys = named["b"], (named["on"], named["on"]) if named["on"] else (named["ka"], named["kb"])
    if not sep or not a or not b or ">" in b or "(" in b:
        raise ConfigError(f"report.claims: {spec!r} is not a claim; allowed: {ALLOWED}")
    return a, op, b, keys


def _settings(name: str, labels: Sequence[str]) -> list[str]:
    """A user's name: the label itself when the grid has it, else every setting of that algorithm."""
    return [name] if name in labels else _of_algorithm(name, labels)


def _pairs(xs: Sequence[str], ys: Sequence[str]) -> list[tuple[str, str]]:
    """Each x with the ys most like it: sharing the most options with it (FedADC+ Nesterov and
    FedADC Nesterov, whatever else their labels say; FedBN and FedAvg on the same BatchNorm
    model), then with the fewest others (FedACG with plain FedAvg, not FedAvg with BatchNorm)."""

    def likeness(x: str, y: str) -> tuple[int, int]:
        mine, theirs = set(x.split(":")[1:]), set(y.split(":")[1:])
        return len(mine & theirs), -len(theirs - mine)

    out = []
    for x in xs:
        ys_x = [y for y in ys if y != x]
        best = max((likeness(x, y) for y in ys_x), default=None)
        out += [(x, y) for y in ys_x if likeness(x, y) == best]
    return out


def _of_algorithm(name: str, labels: Sequence[str]) -> list[str]:
    """Every setting of algorithm ``name`` (the papers' claims name algorithms)."""
    return [label for label in labels if label.split(":", 1)[0] == name]


def resolve_claims(specs: Sequence[str] | None, labels: Sequence[str]) -> list[Claim]:
    """The claims ``specs`` make about the grid's settings (``labels``); refuses a claim that
    names an algorithm the grid lacks (``papers`` skips the orderings it cannot check)."""
    labels = list(dict.fromkeys(labels))
    out: list[Claim] = []
    for spec in specs or []:
        if spec.strip().lower() == "papers":
            out += [Claim(x, op, y, src, keys[0] if keys else None) for a, op, b, src, *keys in PAPERS
                    for x, y in _pairs(_of_algorithm(a, labels), _of_algorithm(b, labels))]
            continue
        a, op, b, keys = _parse(spec)
        sides = [_settings(a, labels), _settings(b, labels)]
        for name, found in zip((a, b), sides):
            if not found:
                raise ConfigError(f"report.claims: {name!r} in {spec!r} is not an algorithm of the grid; "
                                  f"allowed: {', '.join(labels)}")
        out += [Claim(x, op, y, keys=keys) for x, y in _pairs(*sides)]
    return list(dict.fromkeys(out))


def verdict(op: str, diff: Mapping[str, Any], key: str) -> str:
    """The verdict on one claim from its paired differences on ``key`` (module docstring)."""
    mean, n, sig = diff.get(f"{key}_diff_mean"), diff.get(f"{key}_diff_n") or 0, diff.get(f"{key}_diff_significant")
    if mean is None:
        return "no pairs"
    side = "ahead" if mean > 0 else "behind" if mean < 0 else "tied"
    if n < 2:
        return f"one seed: {side}"
    if sig:
        return "reversed" if mean < 0 else "holds (ahead)" if op == ">=" else "holds"
    if n < MIN_SEEDS:
        return f"{n} seeds: {side}, too few to test"
    if op == ">=":
        return "holds (not behind)" if mean >= 0 else "behind, not significant"
    return "ahead, not significant" if mean > 0 else "behind, not significant"


def check_claims(claims: Sequence[Claim], groups: Sequence[Any], metric: str | None = None) -> list[dict[str, Any]]:
    """One row per claim and swept values: the setting's swept keys, the paired-difference
    keys of every compared metric, ``metric`` (the one judged) and ``verdict``. ``metric``:
    ``report.metric`` (None or ``accuracy``: the test accuracy at best validation, else the best
    accuracy; ``local_accuracy``, ``local_accuracy_worst10``: that local summary key)."""
    keys = [k for k, _ in METRICS if any(k in r.summary for g in groups for r in g.runs)]
    judged = metric_key(check_metric(metric) or "accuracy", (r.summary for g in groups for r in g.runs))
    if judged not in keys:
        keys.append(judged)
    summaries = [r.summary for g in groups for r in g.runs]
    for key in {k for c in claims if c.keys and not c.source for k in c.keys}:  # a user's named key: recorded
        if not any(isinstance(s.get(key), (int, float)) for s in summaries):
            numeric = sorted({k for s in summaries for k, v in s.items() if isinstance(v, (int, float))
                              and not isinstance(v, bool)})
            raise ConfigError(f"report.claims: {key!r} is in no run's summary.json; allowed: {', '.join(numeric)}")
    sweeps = list({repr(sorted(g.sweep.items())): g.sweep for g in groups}.values())
    rows = []
    for sweep in sweeps:
        here = {g.algorithm: g for g in groups if g.sweep == sweep}
        for c in claims:
            if c.better in here and c.worse in here:
                if c.keys is None:
                    diff, metric = differences(here[c.better], here[c.worse], keys), judged
                else:  # named keys: under the final column's names
                    named = differences(here[c.better], here[c.worse], [c.keys[0]], [c.keys[1]])
                    diff = {NAMED_COLUMN + k[len(c.keys[0]):]: v for k, v in named.items()}
                    metric = NAMED_COLUMN
                rows.append({"claim": c.text, "source": c.source, **sweep, **diff, "metric": metric,
                             "named": c.keys is not None, "verdict": verdict(c.op, diff, metric)})
    return rows


def _columns(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[tuple[str, str]]]:
    sweep = list(dict.fromkeys(k for r in rows for k in r if "." in k))
    shown = [(key, name) for key, name in (*METRICS, *LOCAL_METRICS) if any(f"{key}_diff_n" in r for r in rows)]
    return sweep, shown


def display(rows: Sequence[Mapping[str, Any]], pm: str = "+-") -> tuple[list[str], list[list[str]]]:
    """Headers and cells: claim, swept values, A - B per metric (points), seeds, verdict, source."""
    sweep, shown = _columns(rows)
    headers = ["claim", *(k.split(".")[-1] for k in sweep), *(f"{name} (A - B)" for _, name in shown), "seeds",
               "p", "verdict", "source"]
    cells = []
    for r in rows:
        diffs = [fmt_diff(r.get(f"{k}_diff_mean"), r.get(f"{k}_diff_ci95"), r.get(f"{k}_diff_significant"), pm)
                 for k, _ in shown]
        n = r.get(f"{r['metric']}_diff_n", 0)
        p = r.get(f"{r['metric']}_diff_p")
        cells.append([r["claim"], *(str(r.get(k, "")) for k in sweep), *diffs, str(n), "-" if p is None else f"{p:.3g}",
                      r["verdict"], r["source"] or "-"])
    return headers, cells


JUDGED = {"test_accuracy_at_best_val": "the test accuracy at best validation", "best_accuracy": "the best accuracy",
          "final_local_accuracy": "the final local accuracy (the mean over clients on their own test splits; "
                                  "report.metric=local_accuracy)",
          "final_local_accuracy_worst10": "the worst 10% local accuracy (the mean of the worst 10% of clients on their "
                                          "own test splits; report.metric=local_accuracy_worst10)"}
NOTE = ("Claims: A - B in percentage points, paired per seed, {pm} the half-width of the 95% t interval; p: the exact "
        "sign-flip test's on {metric}, the metric the verdict is on. ")


def note(rows: Sequence[Mapping[str, Any]], pm: str = "+-") -> str:
    """The note under the claims table: its columns and the ``*`` rule the verdicts follow."""
    table = [r for r in rows if not r.get("named")]
    metric = table[0]["metric"] if table else "test_accuracy_at_best_val"
    judged = [r.get(f"{r['metric']}_diff_n") or 0 for r in rows]
    named = ("A claim that names its summary keys in brackets is on those, in the final column, and judged "
             "there. " if len(table) < len(rows) else "")
    return NOTE.format(pm=pm, metric=JUDGED.get(metric, metric)) + named + rule(max(judged, default=0))


def to_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(markdown_lines(*display(rows))) + "\n\n" + note(rows) + "\n"


def to_text(rows: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join([*text_lines(*display(rows)), note(rows)])


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    return table_csv([dict(r) for r in rows])


__all__ = ["PAPERS", "Claim", "check_claims", "display", "note", "resolve_claims", "to_csv", "to_markdown", "to_text",
           "verdict"]
