"""The plan of a ``fedrift select``: what its budget buys, in which order, and what it costs
on this machine. Plain data and arithmetic, so that the search, ``--dry-run`` and the page
read one plan, and the tests can check it by hand.

Costs
    A run's cost is ``startup + rounds x per_round`` seconds. Both are measured per entry from
    the times its trials reported their rounds: ``per_round`` is the time between the first
    and the last reported round over the rounds between them, ``startup`` what the first round
    took beyond one round (data on the device, the model built, the first step's compile). A
    trial's whole wall time over its rounds would count the start-up once per round of a short
    trial: that made the estimate of a confirmation of 12-round runs from trials stopped at
    round 1 or 3 pessimistic by two thirds (issue 51: 17 min estimated, 10.3 min taken). An
    entry with no measured trial is assumed to cost what the median measured entry does (said
    as ``assumed``); ``--dry-run`` measures each entry with a timed probe (one start-up and
    two rounds at its space's centre, in a temporary folder). Under ``--budget-rounds`` a round
    costs one and a start-up nothing.

The split
    The confirmation is planned first: the ``top`` best entries and FedAvg over every seed,
    when the budget pays for that and for the least search that can pick a candidate
    (one trial of every entry to its first rung; FedAvg's first trial runs every round when
    the budget allows, and the budget stops it otherwise), and when it takes at most two thirds
    of the budget (``CONFIRM_SHARE``; else the largest confirmation that does, the search getting
    a third at least: on FEMNIST at 15 minutes the whole confirmation left the search 1 minute, FedAvg's
    first trial stopped at round 3). When none fits there, the largest confirmation that fits beside the least search:
    fewer candidates first (the best kept), then fewer seeds, never under two (a paired
    verdict needs two). A confirmation is kept back with its margin (:func:`kept_back`: its
    estimate plus ``MARGIN``, and the seconds of compare's tables and the pages). A budget
    that cannot pay for the least search and the least confirmation (FedAvg and one candidate
    over two seeds) so kept back, beside the seconds already spent (the probe that timed
    FedAvg), is refused, naming the budget that would do. The search gets the rest. The plan
    is made again after every trial with the costs measured so far, so the search stops on
    what the runs cost, not on a guess.

The order
    FedAvg first (its first trial sets the first rung's floor and is the reference of every
    gain), then the other entries, the cheapest measured first (unmeasured ones as if at the
    median cost: they keep the field's order), each entry's start-up points in turns: every
    entry gets a look before any gets a second."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

LEAST_SEEDS = 2  # a paired interval needs two seeds; select never recommends on one
CONFIRM_SHARE = 2 / 3  # the most of a budget the planned confirmation takes, where a smaller one fits in it
# a confirmation's time estimate is kept back with MARGIN more: its runs are of other seeds than the
# trials that measured the costs, and of a candidate that may only be assumed to cost what FedAvg
# does (its probe), when an entry with more work a round costs more. Issue 72's demo select at 5 min
# on a shared 2-core machine (load 3-4): the probe said 1.27 s a FedAvg round, the trials 1.37 (FedProx
# 1.73, SCAFFOLD 1.79), the confirmation's runs took 1.38x the trials' estimate: 26 s past the budget
MARGIN = 0.25
# seconds beside a confirmation's runs: compare's grid and tables and the select page (measured
# 0.3-0.4 s on the tests' digits federation), and with their reports and figures (3-4 s)
OVERHEAD_S = 1.0
REPORT_OVERHEAD_S = 5.0


def kept_back(seconds: float | None, overhead: float = OVERHEAD_S) -> float:
    """The seconds the search keeps back for a confirmation estimated at ``seconds``: the
    estimate, ``MARGIN`` of it more and ``overhead``; nothing for one whose runs are done."""
    return 0.0 if not seconds else seconds * (1 + MARGIN) + overhead


def estimate_room(seconds: float | None, overhead: float = OVERHEAD_S) -> float | None:
    """The largest confirmation estimate :func:`kept_back` fits in ``seconds`` (None: no limit)."""
    return None if seconds is None else (seconds - overhead) / (1 + MARGIN)


@dataclass(frozen=True)
class Cost:
    """One entry's measured (or assumed) cost on this machine, in seconds."""

    per_round: float
    startup: float
    source: str  # "trials", "probe" or "assumed"

    def run(self, rounds: int) -> float:
        return self.startup + rounds * self.per_round


def cost_of_trial(trial: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(per_round, startup)`` from one trial's reported times, or None when it has none.
    ``first_round``/``first_seconds``: the first reported round and the seconds from the trial's
    start to it; ``rounds``/``seconds``: the last's."""
    rounds, seconds = int(trial.get("rounds") or 0), float(trial.get("seconds") or 0.0)
    if rounds <= 0 or seconds <= 0:
        return None
    first, at_first = int(trial.get("first_round") or 0), float(trial.get("first_seconds") or 0.0)
    if first and rounds > first and seconds > at_first:
        per_round = (seconds - at_first) / (rounds - first)
        return per_round, max(0.0, at_first - first * per_round)
    return seconds / rounds, 0.0  # one round seen: its start-up counted as the round's (an upper bound)


def measured_costs(trials: Sequence[Mapping[str, Any]], entries: Sequence[str],
                   probed: Mapping[str, Cost] | None = None) -> dict[str, Cost]:
    """Per entry: the median per-round time and start-up of its trials that reported two rounds
    or more (those that reported one only when none did: their start-up counts as a round),
    else its probe's, else the median measured entry's (``assumed``). Empty when nothing is
    measured."""
    out: dict[str, Cost] = {}
    for entry in entries:
        own = [t for t in trials if t["entry"] == entry]
        # trials with two rounds or more tell the start-up apart; one-round ones only when no other did
        split = [t for t in own if t.get("first_round") and int(t.get("rounds") or 0) > int(t["first_round"])]
        seen = [c for c in (cost_of_trial(t) for t in (split or own)) if c is not None]
        if seen:
            out[entry] = Cost(_median([c[0] for c in seen]), _median([c[1] for c in seen]), "trials")
        elif probed and entry in probed:
            out[entry] = probed[entry]
    if out:
        typical = Cost(_median([c.per_round for c in out.values()]), _median([c.startup for c in out.values()]), "assumed")
        for entry in entries:
            out.setdefault(entry, typical)
    return out


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def order(entries: Sequence[str], reference: str, costs: Mapping[str, Cost]) -> list[str]:
    """FedAvg first, then the others by measured per-round cost (cheapest first); unmeasured
    entries sit at the median measured cost, keeping the field's order among equals."""
    rest = [e for e in entries if e != reference]
    known = [costs[e].per_round for e in rest if e in costs and costs[e].source != "assumed"]
    mid = _median(known) if known else 0.0
    key = {e: costs[e].per_round if e in costs and costs[e].source != "assumed" else mid for e in rest}
    return ([reference] if reference in entries else []) + sorted(rest, key=lambda e: key[e])


def trial_rounds(rungs: Sequence[int], eta: int) -> float:
    """The rounds a trial costs on average under successive halving that keeps 1/eta at each
    rung: ``r0 + (r1 - r0)/eta + (r2 - r1)/eta^2 + ...`` (rungs 3, 9, 27, 30: 7.1 rounds)."""
    total, prev = 0.0, 0
    for k, r in enumerate(rungs):
        total += (r - prev) / eta ** k
        prev = r
    return total


@dataclass(frozen=True)
class Confirmation:
    """What the confirmation runs: entries (FedAvg first) x seeds, its cost, whether it is all asked."""

    entries: list[str]
    seeds: list[int]
    seconds: float | None  # None: no time measured or asked
    rounds: int
    full: bool

    @property
    def runs(self) -> int:
        return len(self.entries) * len(self.seeds)


def confirmation_cost(entries: Sequence[str], seeds: Sequence[int], rounds: int, costs: Mapping[str, Cost],
                      jobs: int = 1, done: Callable[[str, int], bool] | None = None) -> tuple[float | None, int]:
    """(seconds, rounds) of confirming ``entries`` over ``seeds``: each run ``startup + rounds x
    per_round``, ``jobs`` at once (their sum over ``min(jobs, runs)``); runs ``done`` (finished in
    an earlier confirmation, which compare reuses) cost nothing. Seconds None: no cost measured."""
    todo = [(e, s) for e in entries for s in seeds if done is None or not done(e, s)]
    n_rounds = len(todo) * rounds
    if not todo:
        return 0.0, 0
    if any(e not in costs for e, _ in todo):
        return None, n_rounds
    return sum(costs[e].run(rounds) for e, _ in todo) / max(1, min(jobs, len(todo))), n_rounds


def confirmation_options(ranked: Sequence[str], seeds: Sequence[int]) -> list[tuple[list[str], list[int]]]:
    """What a confirmation may be, most first: FedAvg (``ranked[0]``) and every candidate over
    every seed; then fewer candidates (the best kept) over every seed; then the best candidate
    over fewer seeds, down to two."""
    out = [(list(ranked[:k + 1]), list(seeds)) for k in range(len(ranked) - 1, 0, -1)]
    out += [(list(ranked[:2]), list(seeds[:n])) for n in range(len(seeds) - 1, LEAST_SEEDS - 1, -1)]
    return out


def fit_confirmation(ranked: Sequence[str], seeds: Sequence[int], rounds: int, costs: Mapping[str, Cost],
                     room_seconds: float | None, room_rounds: int | None, jobs: int = 1,
                     done: Callable[[str, int], bool] | None = None) -> Confirmation | None:
    """The largest confirmation (:func:`confirmation_options`) that fits both rooms (None: no
    limit; unmeasured seconds fit), or None when even FedAvg and one candidate over two seeds
    do not. A room below zero (a budget overspent by a confirmation that ran longer than its
    estimate) still takes a confirmation whose runs are all ``done``: it costs nothing."""
    if len(ranked) < 2:
        return None
    for k, (entries, use) in enumerate(confirmation_options(ranked, seeds)):
        seconds, n_rounds = confirmation_cost(entries, use, rounds, costs, jobs, done)
        if (room_rounds is None or n_rounds <= max(room_rounds, 0)) and (
                room_seconds is None or seconds is None or seconds <= max(room_seconds, 0.0)):
            return Confirmation(entries, use, seconds, n_rounds, k == 0)
    return None


def least_search(entries: Sequence[str], first_rung: int, costs: Mapping[str, Cost]) -> tuple[float | None, int]:
    """(seconds, rounds) of the least search that can pick a candidate: one trial of every
    entry (FedAvg's included) to the first rung."""
    n_rounds = len(entries) * first_rung
    if not costs:
        return None, n_rounds
    return sum(costs[e].run(first_rung) for e in entries if e in costs), n_rounds


def make_plan(*, entries: Sequence[str], reference: str, rounds: int, rungs: Sequence[int], eta: int,
              seeds: Sequence[int], top: int, costs: Mapping[str, Cost], budget_seconds: float | None,
              budget_rounds: int | None, spent_seconds: float = 0.0, spent_rounds: int = 0,
              ranked: Sequence[str] | None = None, jobs: int = 1, floor: str | None = None,
              before_seconds: float = 0.0, overhead: float = OVERHEAD_S) -> dict[str, Any]:
    """The budget plan as plain data (module docstring): the confirmation planned, the search's
    share, about how many trials per entry it buys, the least search and confirmation
    (``least``), and ``lines`` saying so; ``refused`` is the one-line reason when the budget
    cannot pay for the least search and confirmation beside ``before_seconds`` (what the
    command spent before its search: the field built, the probe).
    ``overhead``: the seconds a confirmation takes beside its runs (:func:`kept_back`)."""
    ordered = order(entries, reference, costs)
    ranked = list(ranked) if ranked else ordered[:top + 1]
    time_left = None if budget_seconds is None else budget_seconds - spent_seconds
    rounds_left = None if budget_rounds is None else budget_rounds - spent_rounds
    least_s, least_r = least_search(entries, rungs[0], costs)
    least_conf_s, least_conf_r = confirmation_cost(ranked[:2], list(seeds)[:LEAST_SEEDS], rounds, costs, jobs)
    room_s = None if budget_seconds is None else budget_seconds - before_seconds - (least_s or 0.0)
    room_r = None if budget_rounds is None else budget_rounds - least_r
    # the confirmation takes at most CONFIRM_SHARE of the budget when a smaller one fits there:
    # a search left only its least (one look at each entry) tunes nothing, FedAvg included
    conf = fit_confirmation(ranked, seeds, rounds, costs, None if room_s is None else
                            estimate_room(min(room_s, CONFIRM_SHARE * budget_seconds), overhead),
                            None if room_r is None else min(room_r, int(CONFIRM_SHARE * budget_rounds)), jobs) \
        or fit_confirmation(ranked, seeds, rounds, costs, estimate_room(room_s, overhead), room_r, jobs)
    refused = None
    if conf is None and len(ranked) >= 2:
        refused = _refusal(budget_seconds, budget_rounds, (least_s, least_r), (least_conf_s, least_conf_r),
                           rungs[0], before_seconds, costs, overhead)
    search_s = None if time_left is None else time_left - (kept_back(conf.seconds, overhead) if conf else 0.0)
    search_r = None if rounds_left is None else rounds_left - (conf.rounds if conf else 0)
    per_trial_rounds = trial_rounds(rungs, eta)
    plan: dict[str, Any] = {
        "order": ordered, "rungs": list(rungs), "trial_rounds": round(per_trial_rounds, 2),
        "budget": {"seconds": budget_seconds, "rounds": budget_rounds},
        "search": {"seconds": search_s, "rounds": search_r,
                   "trials_per_entry": _trials_per_entry(entries, reference, rounds, per_trial_rounds, costs,
                                                         search_s, search_r)},
        "confirmation": None if conf is None else {
            "entries": conf.entries, "seeds": conf.seeds, "seconds": conf.seconds, "rounds": conf.rounds,
            "full": conf.full, "runs": conf.runs},
        "least": {"search_seconds": least_s, "search_rounds": least_r, "confirmation_seconds": least_conf_s,
                  "confirmation_rounds": least_conf_r},
        "costs": {e: {"per_round": c.per_round, "startup": c.startup, "source": c.source} for e, c in costs.items()},
        "refused": refused, "floor": floor, "overhead": overhead,
    }
    plan["lines"] = plan_lines(plan, entries, seeds, top, rounds)
    return plan


def _trials_per_entry(entries: Sequence[str], reference: str, rounds: int, per_trial_rounds: float,
                      costs: Mapping[str, Cost], search_s: float | None, search_r: int | None) -> float | None:
    """About how many trials per entry the search's share buys, if spread evenly (FedAvg's
    first trial runs every round); None when nothing limits it or nothing is measured."""
    if len(entries) < 2 or not (search_s is not None and costs or search_r is not None):
        return None
    buys = []
    if search_r is not None:
        buys.append((search_r - rounds) / per_trial_rounds)
    if search_s is not None and costs:
        typical = _median([c.per_round for c in costs.values()])
        start = _median([c.startup for c in costs.values()])
        buys.append((search_s - costs[reference].run(rounds) if reference in costs else search_s)
                    / (start + per_trial_rounds * typical))
    return max(0.0, min(buys)) / len(entries)


def _refusal(budget_seconds: float | None, budget_rounds: int | None, least: tuple[float | None, int],
             least_conf: tuple[float | None, int], first_rung: int, before_seconds: float,
             costs: Mapping[str, Cost], overhead: float) -> str | None:
    """The one line refusing a budget that cannot pay for the least search and the least
    confirmation, naming the budget given and the least that would do (rounded up)."""
    (least_s, least_r), (conf_s, conf_r) = least, least_conf
    if budget_rounds is not None and least_r + conf_r > budget_rounds:
        return (f"--budget-rounds: {budget_rounds} cannot pay for the least search ({least_r} rounds: one "
                f"trial of each entry to round {first_rung}) and the least confirmation (FedAvg and one candidate "
                f"over {LEAST_SEEDS} seeds: {conf_r} rounds); allowed: at least {least_r + conf_r}, or fewer "
                "algorithms= or train.rounds")
    if budget_seconds is None or least_s is None or conf_s is None:
        return None
    need = before_seconds + least_s + kept_back(conf_s, overhead)
    if need <= budget_seconds:
        return None
    return (f"--budget: {_dur(budget_seconds)} cannot pay for the least search (about {_dur(least_s)}: one trial of "
            f"each entry to round {first_rung}) and the least confirmation (FedAvg and one candidate over "
            f"{LEAST_SEEDS} seeds: about {_dur(conf_s)}, kept back with {MARGIN:.0%} more and {overhead:g} s for its "
            f"tables){_spent_before(before_seconds)} at {_basis(costs)}; allowed: at least about "
            f"{_dur(need, up=True)}, or fewer algorithms= or train.rounds")


def _spent_before(seconds: float) -> str:
    return f", beside the {_dur(seconds)} the command spent before its search (the field built, FedAvg timed)," \
        if seconds >= 0.5 else ""


def _basis(costs: Mapping[str, Cost]) -> str:
    """Where the costs come from, in words: a remedy only assumed to cost what FedAvg does may cost more."""
    sources = {c.source for c in costs.values()}
    if "probe" in sources and "trials" not in sources:
        return ("the costs of a timed probe on this machine (entries not probed assumed to cost as much as those "
                "probed: one with more work a round needs more)" if "assumed" in sources else
                "the costs of a timed probe of each entry on this machine")
    return "the costs measured on this machine" + (" (entries not yet run assumed at the median)"
                                                     if "assumed" in sources else "")


def confirmation_line(c: Mapping[str, Any], seeds: Sequence[int], top: int, rounds: int) -> str:
    """``confirmation: 1 candidate and FedAvg over 2 seeds (4 runs of 6 rounds, about 3 s)``,
    and ``less than asked`` when it is."""
    asked = f"{top} candidate{'s' if top > 1 else ''} and FedAvg over {len(seeds)} seeds"
    what = (f"confirmation: {len(c['entries']) - 1} candidate{'s' if len(c['entries']) > 2 else ''} and FedAvg over "
            f"{len(c['seeds'])} seeds ({c['runs']} runs of {_n(rounds, 'round')}"
            + (f", about {_dur(c['seconds'])}" if c.get("seconds") is not None else "") + ")")
    return what + ("" if c["full"] else f": less than asked ({asked}), what fits the budget")


def plan_lines(plan: Mapping[str, Any], entries: Sequence[str], seeds: Sequence[int], top: int, rounds: int) -> list[str]:
    """The plan in words, one line each (``--dry-run`` prints them, the page shows them)."""
    lines = [f"field: {len(entries)} entries, in this order: {', '.join(plan['order'])}",
             f"rung{'s' if len(plan['rungs']) > 1 else ''} at {', '.join(map(str, plan['rungs']))} "
             f"{_n(plan['rungs'][-1], 'round')[len(str(plan['rungs'][-1])) + 1:]} (a trial costs about "
             f"{_n(plan['trial_rounds'], 'round')} on average when each rung keeps the top third)" + (f"; first rung: {plan['floor']}" if plan.get("floor") else "")]
    s = plan["search"]
    if s["trials_per_entry"] is not None and plan["confirmation"] is not None:
        lines.append(f"search: about {s['trials_per_entry']:.1f} trials per entry if spread evenly (TPE gives more to "
                     "the entries that do well; FedAvg is owed a trial whenever it is behind the median entry, and its "
                     "first runs every round)"
                     + (f"; {_dur(s['seconds'])}" if s["seconds"] is not None else "")
                     + (f"; {s['rounds']} rounds" if s["rounds"] is not None else ""))
    c = plan["confirmation"]
    if c is None:
        lines.append("confirmation: none fits the budget" if plan["budget"]["seconds"] or plan["budget"]["rounds"]
                     else "confirmation: -")
    else:
        lines.append(confirmation_line(c, seeds, top, rounds))
        if plan["budget"]["seconds"] and c.get("seconds"):
            overhead = plan.get("overhead", OVERHEAD_S)
            lines.append(f"kept back for the confirmation: about {_dur(kept_back(c['seconds'], overhead))} (its "
                         f"estimate, {MARGIN:.0%} more for the estimate's error and {overhead:g} s for its tables); the "
                         "search stops starting trials when only that and the untried entries' first rungs are left")
    costs = plan["costs"]
    if costs:
        lines.append("costs on this machine: " + "; ".join(
            f"{e} {v['per_round']:.2f} s a round + {v['startup']:.1f} s start-up ({v['source']})" for e, v in costs.items()))
    else:
        lines.append("costs: not measured yet (FedAvg's first trial measures them; the plan is made again after each trial)")
    if plan["refused"]:
        lines.append(f"refused: {plan['refused']}")
    return lines


def _n(n: float, word: str) -> str:
    """``1 round``, ``6 rounds``, ``3.33 rounds``."""
    return f"{n:g} {word}" + ("" if n == 1 else "s")


def _dur(seconds: float | None, up: bool = False) -> str:
    """``43 s``, ``6 min``, ``1h05m``; ``up``: rounded up (a refusal's "at least" must do)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:  # a refusal's "at least" must not round 43 s up to a minute
        return f"{math.ceil(seconds) if up else round(seconds):.0f} s"
    m = math.ceil(seconds / 60) if up else round(seconds / 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m} min"


__all__ = ["Confirmation", "Cost", "MARGIN", "OVERHEAD_S", "REPORT_OVERHEAD_S", "confirmation_cost",
           "confirmation_line", "confirmation_options", "cost_of_trial", "estimate_room", "fit_confirmation",
           "kept_back", "least_search", "make_plan", "measured_costs", "order", "plan_lines", "trial_rounds"]
