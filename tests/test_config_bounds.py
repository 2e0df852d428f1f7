"""Absurd numbers, duplicate YAML keys and the dependency lock (issue 68: F16, F15).

fedrift/config.py's ``check_numbers``: every float finite, every integer within its kind's
bounds (counts at most 10**9, seeds 0 to 2**63 - 1), refused in one line naming the key, the
value and what is allowed. fedrift/yamlio.py: a key twice in one mapping refused with the file
and the line. constraints.txt: every distribution fedrift's installed extras need, pinned at the
version installed (``make lock`` writes it).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from fedrift import yamlio
from fedrift.config import Config, load_config, validate_options
from fedrift.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
COUNT_MAX = 10**9  # the bounds the issue's fix states (fedrift.config.COUNT_MAX, SEED_MAX)
SEED_MAX = 2**63 - 1


def _refused(overrides: list[str], source=None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(source if source is not None else {}, overrides)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------
# Integers: counts and seeds


def test_a_count_past_10_to_the_9_is_refused_naming_key_value_and_bound():
    assert _refused(["train.rounds=99999999999999999999999"]) == (
        "train.rounds: 99999999999999999999999 is too large; allowed: at most 1000000000 (10**9)")
    assert load_config({}, [f"train.rounds={COUNT_MAX}"]).train.rounds == COUNT_MAX  # the bound itself is allowed
    assert _refused([f"train.rounds={COUNT_MAX + 1}"]).startswith(f"train.rounds: {COUNT_MAX + 1} is too large")
    for key in ("train.local_epochs", "train.batch_size", "train.clients_per_round", "eval.every", "engine.workers"):
        assert _refused([f"{key}=10000000000"]).startswith(f"{key}: 10000000000 is too large; allowed: at most")


def test_a_count_in_a_list_or_given_as_a_float_is_bounded_too():
    assert _refused(["eval.at_rounds=[1,20000000000]"]).startswith("eval.at_rounds: 20000000000 is too large")
    assert _refused(["train.rounds=1.0e+30"]) == "train.rounds: 1e+30 is too large; allowed: at most 1000000000 (10**9)"
    assert _refused(["train.rounds=1.0e+12"]).startswith("train.rounds: 1000000000000 is too large")


def test_a_whole_config_validated_directly_is_bounded():
    with pytest.raises(ConfigError, match=r"^engine\.checkpoint_every: 10000000000 is too large"):
        Config.model_validate({"engine": {"checkpoint_every": 10**10}})


def test_a_seed_is_refused_outside_0_to_2_to_the_63():
    assert load_config({}, [f"seed={SEED_MAX}"]).seed == SEED_MAX  # int64's largest: allowed
    assert _refused([f"seed={SEED_MAX + 1}"]) == (
        f"seed: {SEED_MAX + 1} is not a seed; allowed: a whole number from 0 to 9223372036854775807 (2**63 - 1)")


def _dataset_params(name: str):
    from fedrift.data import DATASETS

    return DATASETS.get(name).params


def _algorithm_params(name: str):
    from fedrift.algorithms import ALGORITHMS

    return ALGORITHMS.get(name).params


def test_a_negative_dataset_seed_is_refused_before_numpy_sees_it():
    """``data.split_seed`` had no lower bound: -1 reached numpy's default_rng (a traceback)."""
    with pytest.raises(ConfigError) as err:
        validate_options("data", _dataset_params("mnist5k"), {"split_seed": -1})
    assert str(err.value) == (
        "data.split_seed: -1 is not a seed; allowed: a whole number from 0 to 9223372036854775807 (2**63 - 1)")
    with pytest.raises(ConfigError, match=r"^data\.seed: -5 is not a seed"):
        validate_options("data", _dataset_params("synthetic"), {"seed": -5})
    assert validate_options("data", _dataset_params("mnist5k"), {"split_seed": 3}).split_seed == 3


def test_an_entry_option_count_is_bounded():
    with pytest.raises(ConfigError) as err:
        validate_options("algorithm", _algorithm_params("feddf"), {"steps": 10**12})
    assert str(err.value) == "algorithm.steps: 1000000000000 is too large; allowed: at most 1000000000 (10**9)"


# ---------------------------------------------------------------------------------------
# Floats: finite


FINITE = "is not a finite number; allowed: a finite number (no inf or nan)"


@pytest.mark.parametrize("given, shown", [("inf", "inf"), ("nan", "nan"), (".inf", "inf"), ("-.inf", "-inf"),
                                          (".nan", "nan"), ("1e999", "1e999"), ("9" * 400, "999999999999... (400 digits)")])
def test_an_inf_or_nan_learning_rate_is_refused_from_an_override(given, shown):
    assert _refused([f"train.lr={given}"]) == f"train.lr: {shown} {FINITE}"


def test_an_inf_or_nan_is_refused_from_a_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: .inf\n")
    assert _refused([], path) == f"train.lr: inf {FINITE}"
    path.write_text("privacy:\n  level: client\n  clip: .inf\n")  # "no clipping" is null, not inf
    assert _refused([], path) == f"privacy.clip: inf {FINITE}"
    path.write_text("eval:\n  at_rounds: [1, .nan]\n")
    assert _refused([], path) == f"eval.at_rounds: nan {FINITE}"
    path.write_text("train:\n  momentum: .nan\n")  # a nan fails the key's own bounds: named as a nan
    assert _refused([], path) == f"train.momentum: nan {FINITE}"


def test_an_inf_or_nan_in_an_entry_option_is_refused():
    """A named section's options: in the document (untyped) and once its entry's class reads them."""
    assert _refused(["algorithm.name=fedprox", "algorithm.mu=.inf"]) == f"algorithm.mu: inf {FINITE}"
    assert _refused(["engine.straggler_work=inf"]) == f"engine.straggler_work: inf {FINITE}"
    params = _algorithm_params("fedprox")
    for text, shown in (("inf", "inf"), ("nan", "nan"), (float("nan"), "nan")):
        with pytest.raises(ConfigError) as err:
            validate_options("algorithm", params, {"mu": text})
        assert str(err.value) == f"algorithm.mu: {shown} {FINITE}"
    assert validate_options("algorithm", params, {"mu": 10**10}).mu == 1e10  # a large float is a float's


# ---------------------------------------------------------------------------------------
# Duplicate YAML keys

TWICE = "appears twice in the same mapping; allowed: each key once"


def test_a_key_twice_in_a_config_file_is_refused_with_the_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\ntrain:\n  rounds: 2\nseed: 3\n")
    assert _refused([], path) == f"{path} line 4: key 'seed' {TWICE}"
    path.write_text("train:\n  lr: 0.1\n  rounds: 2\n  lr: 0.5\n")
    assert _refused([], path) == f"{path} line 4: key 'lr' {TWICE}"
    path.write_text("algorithm:\n  name: fedprox\n  mu: 0.1\n  'mu': 0.2\n")  # quoted or not: one key
    assert _refused([], path) == f"{path} line 4: key 'mu' {TWICE}"


def test_yamlio_refuses_a_key_twice_anywhere_and_stays_safe(tmp_path):
    with pytest.raises(yaml.YAMLError) as err:
        yamlio.load("a:\n  - {x: 1, y: 2, x: 3}\n")
    assert str(err.value) == f"line 2: key 'x' {TWICE}"
    assert isinstance(err.value, yamlio.DuplicateKeyError)
    path = tmp_path / "study.yaml"
    path.write_text("tune:\n  trials: 4\n  trials: 8\n")
    with pytest.raises(yaml.YAMLError) as err, path.open() as f:
        yamlio.load(f)
    assert str(err.value) == f"{path} line 3: key 'trials' {TWICE}"
    # a merge key's mapping may be overridden: that is what it is for
    assert yamlio.load("b: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n")["c"] == {"x": 3, "y": 2}
    with pytest.raises(yaml.YAMLError):  # still safe YAML: no python tags
        yamlio.load("a: !!python/object/apply:os.getcwd []\n")


def test_a_key_twice_in_an_override_value_is_refused_naming_the_override():
    from fedrift.config import apply_overrides

    with pytest.raises(ConfigError) as err:
        apply_overrides({}, ["model.hidden={a: 1, a: 2}"])
    assert str(err.value) == f"override 'model.hidden={{a: 1, a: 2}}': key 'a' {TWICE}"


# ---------------------------------------------------------------------------------------
# The lock (F15)


def _setup_extras() -> set[str]:
    """The extras ``make setup`` installs, read from the Makefile's install lines."""
    extras: set[str] = set()
    for group in re.findall(r"-e '\.\[([\w,-]+)\]'", (ROOT / "Makefile").read_text()):
        extras |= {e.strip() for e in group.split(",")}
    assert {"test", "flower"} <= extras, "the Makefile's set-up installs fedrift with its extras"
    return extras


def _needed(extras: set[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution fedrift with ``extras`` needs, transitively (markers and
    requirements' own extras evaluated), by canonical name; fedrift itself left out."""
    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, tuple[str, ...]]] = set()
    todo = [("fedrift", tuple(sorted(extras)))]
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in done:
            continue
        done.add((canonicalize_name(name), wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an extra this environment was set up without: nothing of it to pin
        if canonicalize_name(name) != "fedrift":
            found[canonicalize_name(name)] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted or ("",)):
                todo.append((req.name, tuple(sorted(req.extras))))
    return found


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_constraints_pin_every_distribution_the_setup_installs_at_its_installed_version():
    """A forgotten ``make lock`` (a package added or upgraded, the lock not rewritten) fails here."""
    pins = _pins()
    unlocked = set(re.search(r"^UNLOCKED := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split())
    assert unlocked == {"certifi"}  # the CA bundle alone: the Makefile says why
    needed = {n: d for n, d in _needed(_setup_extras()).items() if n not in unlocked}
    assert not unlocked & set(pins), "make lock leaves the Makefile's UNLOCKED out"
    assert len(needed) > 50  # the extras' whole tree, not a stub
    unpinned = sorted(n for n in needed if n not in pins)
    assert not unpinned, f"constraints.txt pins no version of {', '.join(unpinned)}: run make lock"
    stale = sorted(f"{n} (installed {d.version}, pinned {pins[n]})" for n, d in needed.items()
                   if d.version not in SpecifierSet(f"=={pins[n]}"))
    assert not stale, f"constraints.txt is not what is installed: {'; '.join(stale)}: run make lock"
    first = next(line for line in (ROOT / "constraints.txt").read_text().splitlines() if not line.startswith("#"))
    assert first == "torch==2.13.0"  # torch first, as make setup installs it


def test_a_study_files_own_numbers_are_bounded(tmp_path):
    """A study file's trials, rounds, seeds and jobs are held to a config's bounds (a typo's
    10**23 trials was taken as it was)."""
    from fedrift.experiments.study_file import load_study

    for body, said in (("tune: {trials: 100000000000000000000000}\n", "tune.trials: 100000000000000000000000 is too large"),
                       ("seeds: [0, 99999999999999999999]\n", "seeds: 99999999999999999999 is not a seed"),
                       ("jobs: 10000000000\n", "jobs: 10000000000 is too large")):
        path = tmp_path / "s.yaml"
        path.write_text("base: {data: {name: digits}}\nentries: [fedavg]\n" + body)
        with pytest.raises(ConfigError, match="study file") as err:
            load_study(path)
        assert said in str(err.value), err.value
