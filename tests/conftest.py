"""Shared fixtures: tiny, fast configs on embedded data."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest
import torch
from agreement import Declaration


def tiny_config(tmp_path, **sections) -> dict:
    """A config that trains in well under a second: digits, MLP, 6 clients, 2 rounds."""
    cfg = {
        "seed": 0,
        "data": {"name": "digits"},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": 6, "min_size": 5},
        "model": {"name": "mlp", "hidden": [32]},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 2, "clients_per_round": 3, "local_epochs": 1, "batch_size": 16, "lr": 0.05},
        "output": {"dir": str(tmp_path / "run"), "progress": False},
    }
    for key, value in sections.items():
        merge = isinstance(value, dict) and "name" not in value  # a new name: new options
        cfg[key] = {**cfg.get(key, {}), **value} if merge else value
    return cfg


# Tests that start many processes and wait on them with timeouts: a Ray cluster, Flower
# federations (Flower's processes per message, forked ClientApps). Under `make test` they run
# one after another in one of the two test processes, never beside each other.
CLUSTER = ("tests/deploy/", "tests/engine/test_ray.py")
# the longest other files (`pytest --durations=0`, summed by file: 20-90 s each), handed out next,
# longest first, so that the two test processes do not end on a long file while the other waits
LONGEST = ("tests/engine/test_checkpoint.py", "tests/test_readme.py", "tests/docs/test_docs_commands.py",
           "tests/engine/test_processes.py", "tests/experiments/test_study.py", "tests/engine/test_stacked_runs.py",
           "tests/experiments/test_select.py", "tests/docs/test_docs_site.py", "tests/algorithms/test_learning.py",
           "tests/test_portable.py", "tests/experiments/test_compare.py", "tests/models/test_text_model.py",
           "tests/experiments/test_tune.py", "tests/engine/test_batchnorm.py", "tests/test_plugins.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown to a pytest without it
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n 2 --dist loadfile`` (make test): each test file whole in one test process
    (its module fixtures built once), the ``CLUSTER`` files as one file, handed out first, then
    the ``LONGEST`` files in that order, then the rest.
    (pytest-xdist's ``loadgroup`` cannot do this under pytest 9.2: it renames a test by
    ``item._nodeid``, which pytest 9.2 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ClusterFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "cluster" if path.startswith(CLUSTER) else path

        def _assign_work_unit(self, node) -> None:
            for unit in (*reversed(LONGEST), "cluster"):  # the longest unit ends first in the queue
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return ClusterFirst(config, log)


# Declared kinds of test (markers in pyproject.toml), each checked as the test runs:
# - ``agreement``: compares two computations of the same thing with ``agreement.agree``;
#   ``make test`` runs every one of them again under AVX2's kernels (Makefile).
# - ``process``: starts another process (a CLI run, a Ray cluster, a Flower federation, a
#   browser, a docs build, the processes executor's workers, a compare's pool, inductor's
#   compiler), or runs the README's and the docs' command lines as a user does; ``make check``,
#   the inner loop, leaves these out.
# A test that compares or starts a process without its mark fails, and so does a test marked
# ``agreement`` that never compares: the marks are the lists, and nobody keeps them by hand.
class _Started:
    """Processes started (``subprocess``, ``multiprocessing``) since the running test's set-up began."""

    count = 0


PROBES = {"lscpu"}  # programs a library starts to look at the machine (joblib's physical cores, once a process)


def _program(args: tuple, kwargs: dict) -> str:
    """The program a ``subprocess.Popen(...)`` call starts."""
    cmd = args[0] if args else kwargs.get("args", "")
    words = cmd.split() if isinstance(cmd, str) else list(cmd)
    return os.path.basename(str(words[0])) if words else ""


def _counting(start, program=lambda args, kwargs: ""):
    def counted(self, *args, **kwargs):
        if program(args, kwargs) not in PROBES:
            _Started.count += 1
        return start(self, *args, **kwargs)

    return counted


subprocess.Popen.__init__ = _counting(subprocess.Popen.__init__, _program)
multiprocessing.process.BaseProcess.start = _counting(multiprocessing.process.BaseProcess.start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _Started.count = 0
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    Declaration.declared, Declaration.used = item.get_closest_marker("agreement") is not None, False
    try:
        result = yield
    finally:
        declared, used = Declaration.declared, Declaration.used
        Declaration.declared = None
    if declared and not used:
        raise AssertionError("this test is marked @pytest.mark.agreement but compares nothing with agree(): "
                             "take the mark off, or compare with agree()")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    if _Started.count and item.get_closest_marker("process") is None:
        raise AssertionError(f"this test started {_Started.count} process(es) but is not marked "
                             "@pytest.mark.process: make check, which runs in the test process, would run it")
    return result


EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "fedrift-example-plugin"


def example_plugin_path(folder: Path) -> list[Path]:
    """What ``pip install -e examples/fedrift-example-plugin`` puts on the path, made in
    ``folder`` instead of the environment (``make setup`` does not install the example: a
    user's ``fedrift list`` would show its entries): a site folder holding the package's
    dist-info (name, version and ``fedrift.plugins`` entry points, read from its
    pyproject.toml) and the package's source folder. On ``sys.path`` or ``PYTHONPATH``, its
    entry point is found as an installed one is."""
    import tomllib

    project = tomllib.loads((EXAMPLE_PLUGIN / "pyproject.toml").read_text())["project"]
    info = folder / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in groups.items()))
    return [folder, EXAMPLE_PLUGIN / "src"]


def forget_example_plugin() -> None:
    """The example plugin's modules out of ``sys.modules``: its next import registers its
    entries again (a test that restored the registries leaves the modules imported)."""
    import sys

    for name in [m for m in sys.modules if m == "fedrift_example_plugin" or m.startswith("fedrift_example_plugin.")]:
        del sys.modules[name]


def use_example_plugin(folder: Path, monkeypatch) -> str:
    """The example plugin as if installed, until ``monkeypatch`` undoes it: on ``sys.path``
    and in ``PYTHONPATH`` (returned), entry points looked up afresh, the registries restored after."""
    import os

    from fedrift import plugins
    from fedrift.algorithms import ALGORITHMS
    from fedrift.data import DATASETS
    from fedrift.data.partition import PARTITIONS
    from fedrift.models import MODELS

    paths = example_plugin_path(folder)
    for path in reversed(paths):
        monkeypatch.syspath_prepend(str(path))
    for registry in (ALGORITHMS, MODELS, DATASETS, PARTITIONS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(plugins, "_entry_points_loaded", set())
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    forget_example_plugin()
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([*map(str, paths), *inherited])
    monkeypatch.setenv("PYTHONPATH", path)
    return path


@pytest.fixture
def installed_example_plugin(tmp_path, monkeypatch):
    """The example plugin as if installed, for this test only: found through its entry point
    here and, by the returned ``PYTHONPATH`` (also set in the environment), in subprocesses;
    what it registers here is gone after the test."""
    path = use_example_plugin(tmp_path / "example-site", monkeypatch)
    yield path
    forget_example_plugin()


def grid_config(tmp_path, **sections) -> dict:
    """The tiny config (digits, MLP, 6 clients) for a grid: compare sets output.* itself."""
    cfg = tiny_config(tmp_path, **sections)
    cfg.pop("output")
    return cfg


@pytest.fixture(autouse=True, scope="session")
def own_cache(tmp_path_factory):
    """fedrift's file cache (decoded images, text embeddings) in a folder of this session:
    tests never read a user's cache, and a first load really decodes. Set in the environment,
    so the CLI subprocesses the tests start use it too."""
    import os

    before = os.environ.get("FEDRIFT_CACHE")
    os.environ["FEDRIFT_CACHE"] = str(tmp_path_factory.mktemp("fedrift-cache"))
    yield
    if before is None:
        os.environ.pop("FEDRIFT_CACHE", None)
    else:
        os.environ["FEDRIFT_CACHE"] = before


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tests train tiny models: one torch thread is as fast, and immune to a busy machine
    (two OpenMP threads spin-wait badly when another job holds a core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny(tmp_path):
    return lambda **sections: tiny_config(tmp_path, **sections)


def ctrl_c_in_round(monkeypatch, k: int):
    """From now on, runs stop as at Ctrl-C (KeyboardInterrupt) in round ``k``'s evaluation,
    before its metrics line; returns the function that undoes it."""
    from fedrift.engine import outputs

    log = outputs.RunWriter.log

    def stop(self, row):
        if row["round"] == k:
            raise KeyboardInterrupt
        log(self, row)

    monkeypatch.setattr(outputs.RunWriter, "log", stop)
    return lambda: monkeypatch.setattr(outputs.RunWriter, "log", log)


def one_line_refusal(capsys, args: list[str], *expected: str) -> str:
    """Run the CLI with ``args``: exit 2 and one line on stderr holding each of ``expected``,
    no traceback; returns the line."""
    from fedrift.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def ctrl_c_cli(args: list[str], ready, terminal: bool = True, wait: float = 240.0):
    """Start ``fedrift ARGS`` as a terminal starts a foreground job, wait until ``ready()``,
    then send SIGINT: to its whole process group as a terminal's Ctrl-C does (``terminal``),
    else to the fedrift process alone (``kill -INT PID``). Returns ``code`` (exit status),
    ``err`` (stderr), ``line_s`` and ``exit_s`` (seconds from the signal to stderr's first
    line, to the exit) and ``pid`` (also the id of the session it led).

    A child inherits an ignored SIGINT (what a shell gives a background job; Python then
    leaves Ctrl-C off) and the spawning thread's signal mask; the suite's process is no
    terminal and a library it ran may have changed either, so both are set as a terminal's."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fedrift.cli", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, before)
    try:
        deadline = time.monotonic() + wait
        while not ready():
            if proc.poll() is not None:
                raise AssertionError(f"fedrift {args[0]} ended before the Ctrl-C: {proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"fedrift {args[0]} was not ready for the Ctrl-C in {wait:.0f} s")
            time.sleep(0.02)
        sent = time.monotonic()
        if terminal:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        first = proc.stderr.readline()
        line_s = time.monotonic() - sent
        rest = proc.stderr.read()
        proc.wait(timeout=120)
        return SimpleNamespace(code=proc.returncode, err=first + rest, line_s=line_s,
                               exit_s=time.monotonic() - sent, pid=proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
