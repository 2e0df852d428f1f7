"""select.html and select.md are written whatever the outcome (issue 51 item 3): the outcome
first, then the plan, what ran and what is missing; hand-built plain data, no training."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from fedrift.report.select_page import render_select_page, rounds_text, spent_text


def _order(text: str, *parts: str) -> list[int]:
    return [text.index(p) for p in parts]


@pytest.mark.parametrize("page", [
    {},  # nothing at all
    {"outcome": "refused", "reason": "--budget: 2 min cannot pay for one trial per entry and the confirmation",
     "plan": {"lines": ["search: 2 entries, rungs at 1, 3 rounds", "confirmation: 2 entries x 3 seeds x 3 rounds, "
                        "about 4 min"]},
     "missing": ["the search: no trial ran", "the confirmation: not started"], "recommendation": None,
     "trials": [], "picked": [], "budget": None, "confirm": None},
])
def test_a_page_with_nothing_run_still_says_the_outcome_plan_and_what_is_missing(tmp_path, page):
    html_path = render_select_page(tmp_path / "s", page, figures=True)
    html, md = html_path.read_text(), (tmp_path / "s" / "select.md").read_text()
    for text in (html, md):
        assert "Nothing ran" in text and "No trial ran" in text
        assert text.index("Outcome: ") < text.index("The plan") < text.index("What ran")
    if page:
        assert "Outcome: refused: nothing ran: --budget: 2 min cannot pay" in md
        assert _order(md, "Outcome", "search: 2 entries", "What ran", "What is missing", "the confirmation: not started")
        assert 'class="warn"' in html and "<li>the search: no trial ran</li>" in html
    else:
        assert "Outcome: no recommendation" in md and "(no plan)" in md
    assert not (tmp_path / "s" / "figures").exists()


def test_a_provisional_recommendation_shows_its_words_command_and_one_round(tmp_path):
    trials = [
        {"trial": 0, "entry": "fedavg", "status": "completed", "rounds": 9, "score": 0.7, "values": {"train.lr": 0.05},
         "curve": {1: 0.1, 3: 0.5, 9: 0.7}},
        {"trial": 1, "entry": "fedadc", "status": "completed", "rounds": 9, "score": 0.75, "values": {"train.lr": 0.0124},
         "curve": {1: 0.1, 3: 0.6, 9: 0.75}},
        {"trial": 2, "entry": "fedprox", "status": "pruned", "rounds": 1, "score": 0.08, "values": {"train.lr": 0.5},
         "curve": {1: 0.08}},
    ]
    trials = json.loads(json.dumps(trials))  # as read back from JSON: the curves' rounds are strings
    rec = {"choice": "fedadc", "verdict": "ahead, not tested", "tested": False,
           "text": "fedadc at lr 0.0124 is ahead of FedAvg at lr 0.05 on every seed: ...; not tested. To test it, run ...",
           "lines": ["fedadc at lr 0.0124 is ahead of FedAvg at lr 0.05 on every seed: ...; not tested. To test it, run ...",
                     "tuning in the search: FedAvg 1 trial (furthest 9 rounds), fedadc 1 trial (furthest 9 rounds)",
                     "partial confirmation: fedadc: 2 of 3 confirmation runs finished"],
           "command": "fedrift select --out s seeds=1,2,3,4,5,6", "missing": ["fedadc: 2 of 3 confirmation runs finished"]}
    page = {"outcome": "provisional", "reason": "3 seeds cannot test the gain", "recommendation": rec,
            "plan": {"lines": ["search share 10 min, confirmation share 5 min"]}, "missing": [],
            "trials": trials, "picked": trials[:2], "rungs": [1, 3, 9], "entries": ["fedavg", "fedadc", "fedprox"],
            "left_out": {"ccvr": "no validation model"}, "rounds": 9, "seeds": [1, 2, 3],
            "budget": {"seconds": 900, "rounds": None, "spent_seconds": 600, "spent_rounds": 1},
            "confirm": str(tmp_path / "s" / "confirm")}
    before = datetime.datetime.now().astimezone().replace(microsecond=0)
    html_path = render_select_page(tmp_path / "s", page, figures=True)
    after = datetime.datetime.now().astimezone()
    html, md = html_path.read_text(), (tmp_path / "s" / "select.md").read_text()
    for text in (html, md):
        assert _order(text, "Outcome: a provisional recommendation: 3 seeds cannot test the gain", "fedadc at lr 0.0124",
                      "The plan", "search share 10 min", "What ran", "What is missing",
                      "confirmation: fedadc: 2 of 3 confirmation runs finished", "Left out", "The confirmation")
        assert "fedrift select --out s seeds=1,2,3,4,5,6" in text and "tuning in the search: FedAvg 1 trial " in text
        assert "1 rounds" not in text and "val % at 1 round (trials)" in text
    assert "10 min of 15 min; 1 round (search and confirmation; the confirmation 2 entries x 3 seeds x 9 rounds)" in md
    # the figure from curves with string rounds; the page says when it was written, to the second
    assert (tmp_path / "s" / "figures" / "select_curves.png").is_file() and "data:image/png" in html
    stamp = re.search(r"generated (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", html).group(1)
    written = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=before.tzinfo)
    assert before <= written <= after


def test_round_words_and_budget_lines():
    assert (rounds_text(1), rounds_text(2), rounds_text(0)) == ("1 round", "2 rounds", "0 rounds")
    assert spent_text({}) is None
    assert spent_text({"budget": {"seconds": None, "rounds": 60, "spent_seconds": 30, "spent_rounds": 1}}) == \
        "30 s of no time limit; 1 round of 60"


def test_the_page_is_titled_by_the_base_configs_data_and_partition(tmp_path, monkeypatch):
    """Not the folder's name (``fedrift select: select``, issue 72): the data and partition
    of the base config, from the select itself (here one whose every trial fails: no
    recommendation, its page written; a budget refused writes nothing)."""
    from conftest import tiny_config

    import fedrift.api
    from fedrift.errors import ConfigError
    from fedrift.experiments.select import select

    def failing(*args, **kwargs):
        raise RuntimeError("not run here")

    monkeypatch.setattr(fedrift.api, "run", failing)
    base = tiny_config(tmp_path, train={"rounds": 6}, partition={"val_share": 0.2})
    base.pop("output")
    with pytest.raises(ConfigError, match="nothing to confirm"):
        select(base, out=tmp_path / "select", algorithms=["fedavg", "fedprox"], budget_rounds=28, seeds=[1, 2],
               top=1, min_rounds=2, verbose=False, report=False)
    title = "fedrift select on digits (dirichlet alpha=0.5, 6 clients)"
    html = (tmp_path / "select" / "select.html").read_text()
    assert f"<title>{title}</title>" in html and f"<h1>{title}</h1>" in html
    assert (tmp_path / "select" / "select.md").read_text().startswith(f"# {title}\n")
    old = render_select_page(tmp_path / "old", {})  # a page without the setting: the folder's name
    assert "<title>fedrift select: old</title>" in old.read_text()


def test_trials_the_budget_stopped_are_counted_apart_in_the_table():
    from fedrift.report.select_page import rung_rows

    trials = [{"trial": 0, "entry": "fedavg", "status": "completed", "rounds": 6, "curve": {2: 0.5, 6: 0.7}},
              {"trial": 1, "entry": "fedprox", "status": "pruned", "rounds": 2, "curve": {2: 0.4}},
              {"trial": 2, "entry": "fedprox", "status": "budget", "rounds": 2, "curve": {2: 0.45}}]
    _, rows = rung_rows({"trials": trials, "rungs": [2, 6], "entries": ["fedavg", "fedprox"]})
    assert [r[:3] for r in rows] == [["fedavg", "1", "50.0 (1)"], ["fedprox", "1 (+1 budget)", "45.0 (2)"]]
