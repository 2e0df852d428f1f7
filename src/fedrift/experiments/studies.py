"""Optuna's plumbing shared by ``tune`` and ``select``: the package loaded on use (an optional
extra), a sampler that suggests given values (a design point per trial, so that no point runs
twice, in parallel too), one trial run as ask, objective, tell with Ctrl-C recorded as an
interruption, and the trials a stopped command left running."""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path
from typing import Any, Callable

from fedrift.errors import ConfigError
from fedrift.experiments.pool import shielded
from fedrift.safe_files import refuse_link

STUDY_DB = "study.db"  # a tune's, a select's or a study's Optuna database, in its folder


SQLITE_WAIT_S = 60  # how long a connection waits for another process's write to end


def study_storage(folder: Path) -> str:
    """Optuna's storage URL of the study database in ``folder``: refused when a link stands at
    its name (sqlite would write through it); the folder's own path resolved, not the file's.
    A parallel tune's or select's trials (processes) share the file: on a loaded machine one
    held its lock past sqlite's default 5 s and another's read failed ("database is locked",
    in the suite beside a docs build), so a connection waits ``SQLITE_WAIT_S``."""
    refuse_link(folder / STUDY_DB)
    return f"sqlite:///{folder.resolve() / STUDY_DB}?timeout={SQLITE_WAIT_S}"


def load_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("fedrift tune and select need the optuna package; install it with pip install 'fedrift[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # select's sampler uses TPE's experimental ``group`` option on purpose: Optuna's notice that
    # it is experimental is its business, not the user's (exactly that category, nothing else)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


@functools.lru_cache(maxsize=None)
def fixed_sampler_class() -> type:
    optuna = load_optuna()

    class Fixed(optuna.samplers.BaseSampler):
        """Suggests given values: one point of a grid or of the start-up design per trial."""

        def __init__(self, values: dict[str, Any]) -> None:
            self.values = values

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict:
            return {}

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict:
            return {}

        def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
            return self.values[name]

    return Fixed


def one_trial(st: Any, objective: Callable[[Any], float]) -> None:
    """One trial, as ``Study.optimize`` runs it (ask, the objective, tell), except that a
    Ctrl-C (or the stop of the pool it runs in) records the trial as interrupted, with no
    "Trial failed" warning and traceback: state FAIL (the next tune runs its point again) and
    ``status: interrupted``. The database writes are shielded from the Ctrl-C; any other
    exception marks the trial failed and goes on (a bug keeps its traceback)."""
    with shielded():
        trial = st.ask()
    tell_outcome(st, trial, lambda: objective(trial))


def tell_outcome(st: Any, trial: Any, outcome: Callable[[], float]) -> None:
    """Tell ``st`` how ``trial`` ended: the value ``outcome()`` returns, or what it raises
    (:func:`one_trial`'s rules: pruned; interrupted, raised again; any other error, failed and
    raised again). Also for trials run elsewhere (a stack's, ``experiments.tune``), whose
    ``outcome`` returns or raises what their run ended with."""
    optuna = load_optuna()
    fail = optuna.trial.TrialState.FAIL
    try:
        value = outcome()
    except optuna.TrialPruned:
        with shielded():
            st.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    except KeyboardInterrupt:
        with shielded():
            trial.set_user_attr("status", "interrupted")
            st.tell(trial, state=fail)
        raise
    except BaseException:
        with shielded():
            st.tell(trial, state=fail)
        raise
    with shielded():
        if value is None or not math.isfinite(value):  # no round was scored: nothing to compare
            st.tell(trial, state=fail)
        else:
            st.tell(trial, value)


def finished_trials(st: Any) -> list[Any]:
    states = (load_optuna().trial.TrialState.COMPLETE, load_optuna().trial.TrialState.PRUNED)
    return st.get_trials(deepcopy=False, states=states)


def fail_stale(st: Any) -> int:
    """Trials a stopped tune left running (one tune runs a folder at a time): marked failed,
    so that their places are taken by new trials."""
    optuna = load_optuna()
    stale = st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in stale:
        st._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
    return len(stale)


__all__ = ["fail_stale", "finished_trials", "fixed_sampler_class", "load_optuna", "one_trial", "tell_outcome"]
