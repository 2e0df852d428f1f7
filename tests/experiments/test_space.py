"""Values as typed (issue 51 item 6): a float drawn from a space is rounded where it is drawn,
and Optuna stores the value that runs; no training."""

from __future__ import annotations

import pytest

from fedrift.errors import ConfigError
from fedrift.experiments.select_verdict import values_text
from fedrift.experiments.space import DIGITS, Dim, resolve_space, startup_points


def _typed(v: float) -> bool:
    return float(f"{v:.{DIGITS}g}") == v


def test_the_centre_and_the_design_are_values_as_typed():
    lr = Dim.parse("train.lr", "log:0.005:0.5")
    assert repr(lr.middle()) == "0.05" and repr(lr.at(0.5)) == "0.05"  # sqrt(0.005 * 0.5) = 0.05000000000000001
    dims = [*resolve_space("fedprox", {}), Dim.parse("algorithm.beta", "float:0:1")]
    for point in startup_points(dims, 8, seed=0):
        assert all(_typed(v) for v in point.values()), point
    assert lr.at(0.0) == 0.005 and lr.at(0.99999) == 0.5  # the ends stay the range's own
    assert Dim.parse("x", "log:0.00123456:1").typed(0.001234561) == 0.00123456  # rounded inside the range
    assert values_text({"train.lr": lr.middle(), "algorithm.mu": 0.010000000000000004}) == "lr 0.05, mu 0.01"


def test_a_step_gives_its_multiples_with_its_decimals():
    beta = Dim.parse("algorithm.beta", "float:0:1:0.1")
    assert beta.step == 0.1 and beta.describe() == "float:0:1:0.1"
    assert beta.typed(0.30000000000000004) == 0.3 and beta.typed(0.27) == 0.3 and beta.at(0.999) == 1.0
    assert Dim.parse("a", "float:0.01:1:0.05").high == 0.96  # the last multiple inside the range
    assert Dim.parse("train.lr", "0.0123456,0.1").typed(0.0123456) == 0.0123456  # a list's values as given
    for bad in ("log:0.001:1:0.1", "int:1:5:2", "float:0:1:0", "float:0:1:2", "float:0:1:x"):
        with pytest.raises(ConfigError, match=r"^space\.a: "):
            Dim.parse("a", bad)


@pytest.mark.parametrize("sampler", ["tpe", "tpe-multivariate", "random"])
def test_optuna_stores_the_rounded_value_that_runs(sampler):
    import optuna  # the tune extra, which make test installs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    make = {"tpe": lambda: optuna.samplers.TPESampler(seed=0, n_startup_trials=2),
            "tpe-multivariate": lambda: optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=2),
            "random": lambda: optuna.samplers.RandomSampler(seed=0)}[sampler]
    chosen = make()
    study = optuna.create_study(sampler=chosen, direction="maximize")
    dims = [*resolve_space("fedprox", {}), Dim.parse("algorithm.beta", "float:0:1:0.05")]
    for _ in range(6):
        trial = study.ask()
        values = {d.key: d.suggest(trial) for d in dims}
        assert study.sampler is chosen  # the rounding sampler is for one call only
        study.tell(trial, -abs(values["train.lr"] - 0.03))
        stored = study.trials[-1].params
        assert stored == values and all(_typed(v) for v in values.values()), (stored, values)
        assert round(values["algorithm.beta"] / 0.05, 9).is_integer()
