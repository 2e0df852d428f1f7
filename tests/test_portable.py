"""Exactness promises hold on every x86-64 CPU, not only on the one the suite last ran on.

torch picks its CPU kernels by the CPU's vector width (AVX-512, AVX2, none): the same sums in
another order, so float rounding differs between machines, and a tolerance that holds under
one width's rounding can fail under another's (CCVR's calibrated classifier, 1.1e-3 apart on
an AVX2-only EPYC against a bound that held under AVX-512, issue 52; a ResNet-8 bias, issue 67).
So every test that compares two computations of the same thing does it through one rule
(tests/agreement.py), is declared ``@pytest.mark.agreement`` (tests/conftest.py checks the
declaration as the test runs), and ``make test`` runs every declared test again under
``ATEN_CPU_CAPABILITY=avx2`` where the CPU's own kernels are AVX-512 (Makefile). These tests
check the pieces of that arrangement.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from agreement import BF16, BITS, ILL_CONDITIONED, ROUNDING, Declaration, agree, largest_difference, through_square_root

ROOT = Path(__file__).resolve().parents[1]


def test_torch_runs_the_kernels_it_is_asked_for():
    """Under ``ATEN_CPU_CAPABILITY`` torch runs that width's kernels (a CPU without it: a
    narrower one), so make test's second pass really runs AVX2's kernels on an AVX-512 CPU."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    widths = ["DEFAULT", "AVX2", "AVX512"]
    got = torch.backends.cpu.get_cpu_capability()
    if asked in widths:
        assert got in widths[: widths.index(asked) + 1], (asked, got)
    else:  # the machine's own
        assert got in widths, got


def test_make_test_runs_the_declared_agreement_tests_again_under_avx2():
    """The Makefile's test target: the whole suite, then ``-m agreement`` under avx2 when the
    CPU's own kernels are AVX-512; check leaves out the tests that start processes."""
    make = (ROOT / "Makefile").read_text()
    test = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "pytest tests -n 2" in test and "ATEN_CPU_CAPABILITY=avx2" in test and "-m agreement" in test
    assert '= AVX512 ]' in test and "get_cpu_capability" in test
    check = make.split("\ncheck:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not process"' in check


def test_no_test_keeps_its_own_tolerance_rule():
    """The executor-agreement files once each had a ``_close`` with its own rule, and a hand list
    of tests ran under AVX2: neither is back."""
    own = re.compile(r"^def _(close|same|equal|same_history)\(", re.M)
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if own.search(p.read_text())]
    assert not found, found


@pytest.mark.agreement
def test_the_rule_is_the_layers_scale():
    """A bias near zero is held to its layer's scale (its weight's), not its own: the error of a
    sum has the scale of its terms; a layer all near zero to FLOOR's; bits are bits."""
    a = {"conv.weight": torch.tensor([0.5, -0.25]), "conv.bias": torch.tensor([1e-2, 0.0])}
    near = {"conv.weight": a["conv.weight"] + 4e-5, "conv.bias": a["conv.bias"] + 4e-5}  # 4e-5 < 1e-4 x 0.5
    agree(a, near, ROUNDING)
    with pytest.raises(AssertionError, match=r"conv.bias.*apart where the promise \(rounding\) allows 5e-05"):
        agree(a, {**near, "conv.bias": a["conv.bias"] + 6e-5}, ROUNDING)
    agree(a, {**near, "conv.bias": a["conv.bias"] + 6e-5}, ILL_CONDITIONED)
    agree(a, {**near, "conv.bias": a["conv.bias"] + 4e-3}, BF16)
    with pytest.raises(AssertionError, match="not equal bit for bit"):
        agree(a, near, BITS)
    tiny = {"w": torch.tensor([1e-6, 0.0])}
    agree(tiny, {"w": torch.tensor([1e-6 + 5e-8, 0.0])}, ROUNDING)  # 5e-8 < 1e-4 x FLOOR
    assert largest_difference(a, near) == pytest.approx(4e-5 / 0.5, rel=1e-3)
    assert through_square_root(ROUNDING, 1e-4).rtol == pytest.approx(1e-2)
    with pytest.raises(AssertionError, match=r"\['a'\] in the first only, \['b'\] in the second only"):
        agree({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
    with pytest.raises(AssertionError, match="shape"):
        agree(torch.zeros(2), torch.zeros(3))
    with pytest.raises(AssertionError, match="non-finite"):
        agree(torch.tensor([float("nan")]), torch.tensor([0.0]))
    agree([{"round": 1, "test_accuracy": 0.5}], [{"round": 1, "test_accuracy": 0.5004}])  # a metric: 1e-3 relative
    with pytest.raises(AssertionError, match="round"):
        agree([{"round": 1}], [{"round": 2}])  # a count: exactly


def test_a_comparison_without_the_declaration_fails():
    """conftest marks each test's call: agree() in a test not marked ``agreement`` fails, so no
    agreement test can be left out of the AVX2 pass."""
    assert Declaration.declared is False
    with pytest.raises(AssertionError, match="not marked @pytest.mark.agreement"):
        agree(torch.zeros(1), torch.zeros(1))
    assert not Declaration.used
