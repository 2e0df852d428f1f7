"""The agreement page says what the suite found: docs/reference/agreement.json holds exactly the
rows the peer tests record (each test file lists its rows in ``PAIRS``), enough of them, and the
generated page and the algorithms reference show every row and every departure's reason."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from peer_work import RESULTS, committed

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fedrift_reference", ROOT / "docs" / "_ext" / "fedrift_reference.py")
ref = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fedrift_reference", ref)
_spec.loader.exec_module(ref)


def declared_pairs() -> set[tuple[str, str]]:
    """Every test file's ``PAIRS`` (read from its source: importing it would import its peer)."""
    pairs: set[tuple[str, str]] = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PAIRS" for t in node.targets):
                found = ast.literal_eval(node.value)
                assert not pairs & set(found), (path.name, pairs & set(found))
                pairs |= set(found)
    return pairs


def test_the_committed_rows_are_the_suites_rows():
    rows = committed()
    keys = [(r["algorithm"], r["peer"]) for r in rows]
    assert len(keys) == len(set(keys)), "a pair recorded twice"
    assert set(keys) == declared_pairs(), f"{RESULTS.name} and the tests' PAIRS differ: rewrite it"


def test_at_least_fifteen_algorithm_pairs_over_three_peers():
    rows = [r for r in committed() if "partition" not in r["algorithm"]]
    assert len(rows) >= 15 and len({r["peer"] for r in rows}) >= 3, [(r["algorithm"], r["peer"]) for r in rows]
    for r in committed():
        assert r["verdict"] in ("agrees", "departs") and (r["verdict"] == "departs") == bool(r["reason"]), r


def test_the_page_shows_every_row_and_every_reason():
    rows = committed()
    page = ref.agreement_page(rows, "the rule")
    for r in rows:
        assert f"({ref.agreement_anchor(r['algorithm'])})=" in page
        assert f"| {ref.cell(r['version'])} | {ref.cell(r['compared'])} |" in page
        if r["reason"]:
            assert ref.text(r["reason"]) in page


def test_the_algorithms_reference_links_each_checked_algorithm_to_its_row():
    from fedrift.algorithms import ALGORITHMS
    from fedrift.experiments.space import default_space

    parts = "\n".join(ref.algorithms_page(ALGORITHMS, default_space).values())
    checked = {r["algorithm"] for r in committed() if r["algorithm"] in ALGORITHMS}
    assert checked
    for name in checked:
        assert f"<{ref.agreement_anchor(name)}>`" in parts, name
